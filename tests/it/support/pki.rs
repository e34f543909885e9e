//! A private CA and certificates it signs, made at test time with rcgen and written as PEM.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// Writes `dir/ca.pem` (a fresh CA) and, for each `(stem, names, common_name)`, a certificate
/// the CA signed for `names` as `dir/<stem>.pem` with its key as `dir/<stem>.key`.
pub fn write_private_ca(dir: &Path, leaves: &[(&str, &[&str], &str)]) {
    // Distinct subject names: a certificate whose subject equals its issuer's looks
    // self-signed to OpenSSL (redis-server), which then refuses it.
    let params = |names: Vec<String>, cn: &str| {
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = params(vec![], "tollgate test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    for (stem, names, common_name) in leaves {
        let key = KeyPair::generate().unwrap();
        let names = names.iter().map(|n| n.to_string()).collect();
        let cert = params(names, common_name)
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        std::fs::write(dir.join(format!("{stem}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{stem}.key")), key.serialize_pem()).unwrap();
    }
}
