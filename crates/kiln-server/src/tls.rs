//! TLS with rustls: a certificate chain and key from PEM files, and optionally a CA
//! whose client certificates authenticate a connection (clients without one may
//! still connect and present an API key).

use crate::config::TlsConfig;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What can go wrong setting up TLS, on either side (the server here, the CLI's
/// client through `load_certs` / `load_private_key`): always with the file it was
/// about.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("{}: not a PEM certificate file: {source}", path.display())]
    NotPemCertificates {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("{}: no certificate found", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: no private key found", path.display())]
    NoPrivateKey { path: PathBuf },
    #[error("{}: not a PEM key file: {source}", path.display())]
    NotPemKey {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("{}: unusable CA certificate: {source}", path.display())]
    UnusableCa {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("no trusted root certificates on this system: give --ca-cert")]
    NoTrustedRoots,
    #[error("TLS setup: {0}")]
    Setup(#[source] rustls::Error),
    #[error("client certificate verifier: {0}")]
    ClientVerifier(#[source] rustls::server::VerifierBuilderError),
    #[error("certificate and key do not fit together: {0}")]
    KeyMismatch(#[source] rustls::Error),
}

/// The certificates of a PEM file (a chain, or CA certificates), at least one.
/// Shared with the CLI's client (`--ca-cert`, `--client-cert`).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let path_buf = || path.to_path_buf();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|source| TlsError::Read {
            path: path_buf(),
            source,
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::NotPemCertificates {
            path: path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path_buf() });
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let path = path.to_path_buf();
    PrivateKeyDer::from_pem_file(&path).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey { path },
        source => TlsError::NotPemKey { path, source },
    })
}

/// Adds every certificate of a CA file to `roots`.
pub fn add_ca_certs(roots: &mut rustls::RootCertStore, ca: &Path) -> Result<(), TlsError> {
    for c in load_certs(ca)? {
        roots.add(c).map_err(|source| TlsError::UnusableCa {
            path: ca.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

pub fn server_config(tls: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?;
    let builder = match &tls.client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            add_ca_certs(&mut roots, ca)?;
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(TlsError::ClientVerifier)?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(
            load_certs(&tls.cert_chain_pem)?,
            load_private_key(&tls.private_key_pem)?,
        )
        .map_err(TlsError::KeyMismatch)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
