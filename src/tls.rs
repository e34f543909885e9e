//! TLS for listeners: a PEM certificate chain and key become a rustls acceptor that offers
//! HTTP/2 and HTTP/1.1 by ALPN. And the trust for an https:// upstream behind a private CA
//! (`upstream.ca_file`).

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// rustls needs one process-wide crypto provider; tollgate uses ring everywhere.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// An acceptor for the PEM certificate chain at `cert` and the private key at `key`; the
/// error names the file and what is wrong with it.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    let certs = pem_certificates(cert, "certificate")?;
    let private_key =
        PrivateKeyDer::from_pem_file(key).map_err(|e| describe(key, "private key", e))?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(certs, private_key)
            .map_err(|e| {
                format!(
                    "{} / {}: the certificate and key do not form a usable pair: {e}",
                    cert.display(),
                    key.display()
                )
            })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The CA certificates of the PEM file at `path`, each one usable as a trust anchor; the error
/// names the file and what is wrong with it.
pub fn ca_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = pem_certificates(path, "CA certificates")?;
    trust_anchors(&certs).map_err(|(i, e)| {
        format!(
            "{}: certificate {} of {} cannot be a trust anchor: {e}",
            path.display(),
            i + 1,
            certs.len()
        )
    })?;
    Ok(certs)
}

/// A client configuration that trusts exactly `certs` (checked by [`ca_certificates`]).
pub fn client_config_trusting(certs: &[CertificateDer<'static>]) -> rustls::ClientConfig {
    let roots = trust_anchors(certs).expect("checked when the configuration was read");
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// `certs` as a root store, or the index of the first one that cannot be a trust anchor.
fn trust_anchors(
    certs: &[CertificateDer<'static>],
) -> Result<rustls::RootCertStore, (usize, rustls::Error)> {
    let mut roots = rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        roots.add(cert.clone()).map_err(|e| (i, e))?;
    }
    Ok(roots)
}

/// The certificates of the PEM file at `path` (`what` names them in the error): at least one.
fn pem_certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| describe(path, what, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| describe(path, what, e))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no PEM certificate found (expected -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

fn describe(path: &Path, what: &str, e: rustls_pki_types::pem::Error) -> String {
    format!("{}: cannot read the {what}: {e}", path.display())
}
