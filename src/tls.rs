//! TLS for listeners: a PEM certificate chain and key become a rustls acceptor that offers
//! HTTP/2 and HTTP/1.1 by ALPN.

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
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| describe(cert, "certificate", e))?
        .collect::<Result<_, _>>()
        .map_err(|e| describe(cert, "certificate", e))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no PEM certificate found (expected -----BEGIN CERTIFICATE-----)",
            cert.display()
        ));
    }
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

fn describe(path: &Path, what: &str, e: rustls_pki_types::pem::Error) -> String {
    format!("{}: cannot read the {what}: {e}", path.display())
}
