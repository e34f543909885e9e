//! TLS for listeners: a PEM certificate chain and key become a rustls acceptor that offers
//! HTTP/2 and HTTP/1.1 by ALPN.

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsFiles;

/// rustls needs one process-wide crypto provider; tollgate uses ring everywhere.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| describe(&files.cert, "certificate", e))?
        .collect::<Result<_, _>>()
        .map_err(|e| describe(&files.cert, "certificate", e))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no PEM certificate found (expected -----BEGIN CERTIFICATE-----)",
            files.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| describe(&files.key, "private key", e))?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| {
                format!(
                    "{} / {}: the certificate and key do not form a usable pair: {e}",
                    files.cert.display(),
                    files.key.display()
                )
            })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn describe(path: &Path, what: &str, e: rustls_pki_types::pem::Error) -> String {
    format!("{}: cannot read the {what}: {e}", path.display())
}
