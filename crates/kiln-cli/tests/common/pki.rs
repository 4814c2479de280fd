//! A test PKI: a CA, a server certificate for `localhost` and `127.0.0.1` signed by
//! it (every node of a test cluster can use the same), and a client certificate.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// A new self-signed CA certificate and its key.
pub fn new_ca() -> (Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, "Kiln CLI Test CA");
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (p.self_signed(&key).unwrap(), key)
}

/// Writes the PEM files into `dir`.
pub fn pki(dir: &Path) -> Pki {
    let (ca, ca_key) = new_ca();
    let server_key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server = p.signed_by(&server_key, &ca, &ca_key).unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, "cli");
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client = p.signed_by(&client_key, &ca, &ca_key).unwrap();
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    Pki {
        ca: write("ca.pem", ca.pem()),
        cert: write("server.pem", format!("{}{}", server.pem(), ca.pem())),
        key: write("server.key", server_key.serialize_pem()),
        client_cert: write("client.pem", client.pem()),
        client_key: write("client.key", client_key.serialize_pem()),
    }
}
