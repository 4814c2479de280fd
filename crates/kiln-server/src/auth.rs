//! API keys: `kiln_<id>_<secret>`. Only the SHA-256 of the secret is kept, in
//! `<data_dir>/api-keys.json` (written whole to a temporary file, synced, renamed).
//! The secrets are 256 random bits, so a fast hash is enough: there is nothing to
//! brute-force. The server re-reads the file when it changes, so keys created or
//! revoked with the CLI take effect without a restart.
//!
//! A record is a key (the hash of its secret) or a client certificate (the SHA-256
//! of its DER encoding, its thumbprint), with the clearance it carries
//! (`access.rs`). Names need not be unique: during a rotation two keys or two
//! certificates hold the same name while one replaces the other.

use crate::access::Clearance;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

pub const API_KEYS_FILE: &str = "api-keys.json";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub id: String,
    pub name: String,
    /// Hex SHA-256 of the secret part (a key's record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_sha256: Option<String>,
    /// Hex SHA-256 of the certificate's DER encoding (a client certificate's record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_sha256: Option<String>,
    pub created_ms: u64,
    /// What the key may do; records written before permissions existed have none
    /// and keep opening everything (operator).
    #[serde(default)]
    pub clearance: Clearance,
}

/// Who a request comes from: the record that let it in.
pub type Caller = Arc<ApiKeyRecord>;

#[derive(Debug, Default, Serialize, Deserialize)]
struct KeyFile {
    keys: Vec<ApiKeyRecord>,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid key file: {why}")]
    Malformed { path: PathBuf, why: String },
    #[error("no API key with id {0:?}")]
    NoSuchKey(String),
    #[error("invalid key name {0:?}: 1 to 64 printable characters")]
    InvalidName(String),
    /// The certificate file could not be read (the TLS error names the file).
    #[error("{source}")]
    Certificate {
        path: PathBuf,
        #[source]
        source: crate::tls::TlsError,
    },
    #[error("the certificate {thumbprint} is already registered (id {id}); revoke it first")]
    CertificateExists { thumbprint: String, id: String },
}

fn key_file(data_dir: &Path) -> PathBuf {
    data_dir.join(API_KEYS_FILE)
}

fn read_keys(path: &Path) -> Result<KeyFile, AuthError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| AuthError::Malformed {
            path: path.to_path_buf(),
            why: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(KeyFile::default()),
        Err(source) => Err(AuthError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn write_keys(data_dir: &Path, file: &KeyFile) -> Result<(), AuthError> {
    use std::io::Write;
    let path = key_file(data_dir);
    let tmp = data_dir.join(format!("{API_KEYS_FILE}.tmp"));
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| AuthError::Io { path: p, source }
    };
    std::fs::create_dir_all(data_dir).map_err(io(data_dir))?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp).map_err(io(&tmp))?;
    f.write_all(&serde_json::to_vec_pretty(file).expect("serializable"))
        .and_then(|_| f.sync_all())
        .map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    std::fs::File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(io(data_dir))?;
    Ok(())
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A record with a fresh id, its credential not yet set.
fn new_record(name: &str, clearance: Clearance) -> Result<ApiKeyRecord, AuthError> {
    if name.is_empty() || name.len() > 64 || name.chars().any(|c| c.is_control()) {
        return Err(AuthError::InvalidName(name.to_string()));
    }
    Ok(ApiKeyRecord {
        id: hex::encode(rand::random::<[u8; 4]>()),
        name: name.to_string(),
        secret_sha256: None,
        certificate_sha256: None,
        created_ms: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        clearance,
    })
}

/// A new key's record and the key in full, not yet saved anywhere (a cluster
/// saves it on every node through its log: `save_record`).
pub fn new_api_key(name: &str, clearance: Clearance) -> Result<(ApiKeyRecord, String), AuthError> {
    let mut record = new_record(name, clearance)?;
    let secret = hex::encode(rand::random::<[u8; 32]>());
    record.secret_sha256 = Some(sha256_hex(secret.as_bytes()));
    let key = format!("kiln_{}_{secret}", record.id);
    Ok((record, key))
}

/// Creates a key and returns it in full; this is the only time the secret is seen.
pub fn create_api_key(
    data_dir: &Path,
    name: &str,
    clearance: Clearance,
) -> Result<(ApiKeyRecord, String), AuthError> {
    let (record, key) = new_api_key(name, clearance)?;
    save_record(data_dir, &record)?;
    Ok((record, key))
}

/// Saves `record`, replacing the one of its id (saving it again changes nothing).
pub fn save_record(data_dir: &Path, record: &ApiKeyRecord) -> Result<(), AuthError> {
    let mut file = read_keys(&key_file(data_dir))?;
    match file.keys.iter_mut().find(|k| k.id == record.id) {
        Some(existing) => *existing = record.clone(),
        None => file.keys.push(record.clone()),
    }
    write_keys(data_dir, &file)
}

/// Removes the key `id`; false if there is none.
pub fn remove_record(data_dir: &Path, id: &str) -> Result<bool, AuthError> {
    let mut file = read_keys(&key_file(data_dir))?;
    let before = file.keys.len();
    file.keys.retain(|k| k.id != id);
    if file.keys.len() == before {
        return Ok(false);
    }
    write_keys(data_dir, &file)?;
    Ok(true)
}

/// The keys of a data directory as a cluster node keeps them: its key file, the
/// log's key changes applied to it, a snapshot's set put in its place.
pub struct KeyFileStore {
    pub data_dir: PathBuf,
}

impl kiln_cluster::ApiKeyStore for KeyFileStore {
    fn put(&self, record_json: &str) -> Result<(), String> {
        let record: ApiKeyRecord =
            serde_json::from_str(record_json).map_err(|e| format!("a key record: {e}"))?;
        save_record(&self.data_dir, &record).map_err(|e| e.to_string())
    }

    fn revoke(&self, id: &str) -> Result<bool, String> {
        remove_record(&self.data_dir, id).map_err(|e| e.to_string())
    }

    fn export(&self) -> Result<Vec<u8>, String> {
        let file = read_keys(&key_file(&self.data_dir)).map_err(|e| e.to_string())?;
        serde_json::to_vec(&file).map_err(|e| e.to_string())
    }

    fn import(&self, exported: &[u8]) -> Result<(), String> {
        let file: KeyFile =
            serde_json::from_slice(exported).map_err(|e| format!("a snapshot's keys: {e}"))?;
        write_keys(&self.data_dir, &file).map_err(|e| e.to_string())
    }
}

/// The thumbprint a certificate is registered by: the hex SHA-256 of its DER bytes.
pub fn certificate_thumbprint(der: &[u8]) -> String {
    sha256_hex(der)
}

/// Registers the client certificate of a PEM file (its first certificate: the
/// client's own, ahead of any chain) with a clearance. The server must also trust
/// its issuer (`--tls-client-ca`) for the certificate to be presented at all.
pub fn register_certificate(
    data_dir: &Path,
    name: &str,
    clearance: Clearance,
    certificate_pem: &Path,
) -> Result<ApiKeyRecord, AuthError> {
    let certs =
        crate::tls::load_certs(certificate_pem).map_err(|source| AuthError::Certificate {
            path: certificate_pem.to_path_buf(),
            source,
        })?;
    // load_certs never returns an empty list.
    let thumbprint = certs
        .first()
        .map(|c| certificate_thumbprint(c))
        .unwrap_or_default();
    let record = certificate_record(data_dir, name, clearance, thumbprint)?;
    save_record(data_dir, &record)?;
    Ok(record)
}

/// A new record for the certificate of `thumbprint`, not yet saved; refused if
/// the keys of `data_dir` hold it already.
pub fn certificate_record(
    data_dir: &Path,
    name: &str,
    clearance: Clearance,
    thumbprint: String,
) -> Result<ApiKeyRecord, AuthError> {
    let mut record = new_record(name, clearance)?;
    let file = read_keys(&key_file(data_dir))?;
    if let Some(existing) = file
        .keys
        .iter()
        .find(|k| k.certificate_sha256.as_deref() == Some(thumbprint.as_str()))
    {
        return Err(AuthError::CertificateExists {
            thumbprint,
            id: existing.id.clone(),
        });
    }
    record.certificate_sha256 = Some(thumbprint);
    Ok(record)
}

pub fn list_api_keys(data_dir: &Path) -> Result<Vec<ApiKeyRecord>, AuthError> {
    Ok(read_keys(&key_file(data_dir))?.keys)
}

pub fn revoke_api_key(data_dir: &Path, id: &str) -> Result<(), AuthError> {
    if remove_record(data_dir, id)? {
        Ok(())
    } else {
        Err(AuthError::NoSuchKey(id.to_string()))
    }
}

/// What tells one version of the key file from another. The mtime alone does not:
/// timestamps are coarse (a kernel tick), so a revocation written right after the
/// last read could keep the same mtime. The file is replaced by a rename, so a new
/// version also has a new inode (the old one still exists while it is written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileVersion {
    modified: Option<SystemTime>,
    len: u64,
    #[cfg(unix)]
    inode: (u64, u64),
}

impl FileVersion {
    fn of(path: &Path) -> Option<FileVersion> {
        let m = std::fs::metadata(path).ok()?;
        Some(FileVersion {
            modified: m.modified().ok(),
            len: m.len(),
            #[cfg(unix)]
            inode: {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino())
            },
        })
    }
}

/// Checks presented keys against the key file, re-reading it when it changed.
pub struct KeyVerifier {
    path: PathBuf,
    cache: Mutex<(Option<FileVersion>, Vec<Caller>)>,
    /// Where a change of the file is recorded (`--audit-log`).
    audit: Option<Arc<crate::audit::AuditLog>>,
}

impl KeyVerifier {
    pub fn new(data_dir: &Path) -> Result<KeyVerifier, AuthError> {
        let v = KeyVerifier {
            path: key_file(data_dir),
            cache: Mutex::new((None, Vec::new())),
            audit: None,
        };
        v.refresh()?;
        Ok(v)
    }

    /// The data directory whose key file this checks against.
    pub fn data_dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Records every later change of the key file in `audit`.
    pub fn with_audit(mut self, audit: Option<Arc<crate::audit::AuditLog>>) -> KeyVerifier {
        self.audit = audit;
        self
    }

    /// Re-reads the file if it changed (and records what changed).
    pub fn refresh(&self) -> Result<(), AuthError> {
        let version = FileVersion::of(&self.path);
        let mut cache = self.cache.lock();
        if cache.0 != version || version.is_none_or(|v| v.modified.is_none()) {
            let keys: Vec<Caller> = read_keys(&self.path)?
                .keys
                .into_iter()
                .map(Arc::new)
                .collect();
            if let Some(log) = &self.audit {
                if let Some(detail) = crate::audit::key_changes(&cache.1, &keys) {
                    log.record(&crate::audit::Event {
                        event: "keys.changed",
                        outcome: crate::audit::Outcome::Done,
                        who: None,
                        database: None,
                        request: None,
                        status: None,
                        detail: Some(detail),
                    });
                }
            }
            *cache = (version, keys);
        }
        Ok(())
    }

    /// The key's record, if `presented` is a valid key.
    pub fn verify(&self, presented: &str) -> Option<Caller> {
        let rest = presented.strip_prefix("kiln_")?;
        let (id, secret) = rest.split_once('_')?;
        let digest = sha256_hex(secret.as_bytes());
        self.find(|k| {
            k.id == id
                && k.secret_sha256
                    .as_deref()
                    .is_some_and(|s| constant_time_eq(s.as_bytes(), digest.as_bytes()))
        })
    }

    /// The record a client certificate (by its thumbprint) is registered with.
    pub fn verify_certificate(&self, thumbprint: &str) -> Option<Caller> {
        self.find(|k| k.certificate_sha256.as_deref() == Some(thumbprint))
    }

    fn find(&self, wanted: impl Fn(&ApiKeyRecord) -> bool) -> Option<Caller> {
        if let Err(e) = self.refresh() {
            // Keep the keys last read rather than locking everybody out.
            tracing::error!(error = %e, "could not re-read the API key file");
        }
        self.cache.lock().1.iter().find(|k| wanted(k)).cloned()
    }
}

/// Compares digests in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_hashed_at_rest_verified_and_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let (rec, key) = create_api_key(dir.path(), "ci", Clearance::Operator).unwrap();
        let on_disk = std::fs::read_to_string(dir.path().join(API_KEYS_FILE)).unwrap();
        let secret = key.rsplit('_').next().unwrap();
        assert!(!on_disk.contains(secret), "the secret must not be stored");
        let v = KeyVerifier::new(dir.path()).unwrap();
        assert_eq!(v.verify(&key).map(|k| k.id.clone()), Some(rec.id.clone()));
        assert_eq!(v.verify(&format!("{key}x")), None);
        assert_eq!(v.verify("kiln_nope_nope"), None);
        assert_eq!(v.verify(""), None);
        revoke_api_key(dir.path(), &rec.id).unwrap();
        // The verifier notices the file changed (mtime granularity permitting).
        std::thread::sleep(std::time::Duration::from_millis(20));
        let v2 = KeyVerifier::new(dir.path()).unwrap();
        assert_eq!(v2.verify(&key), None);
        assert!(matches!(
            revoke_api_key(dir.path(), &rec.id),
            Err(AuthError::NoSuchKey(_))
        ));
        assert!(create_api_key(dir.path(), "", Clearance::Operator).is_err());
    }
}
