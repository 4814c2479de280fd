//! Encryption at rest: the master key, the environment's own data key wrapped by
//! it, and the cipher that seals pages and journal records.
//!
//! ## Keys
//! The operator holds one **master key** (32 random bytes, a file of 64 hex digits:
//! `kiln encryption new-key`). Each environment (each database, each cluster node's
//! log) has a **data key** of its own, 32 random bytes made when the environment is
//! created, kept in `data-key.wrapped` beside the data file, encrypted ("wrapped")
//! under a key derived from the master key (HKDF-SHA256). Changing the master key
//! rewrites only that small file ([`rotate_master_key`]); the pages stay as they are.
//!
//! ## What is sealed
//! Every page of the data file but its two header pages (which hold page numbers and
//! journal positions, no data) and every journal record's body are encrypted with
//! XChaCha20-Poly1305 under the data key. A page's nonce and tag live in the seal
//! file (`data.kiln.seals`, 64 bytes per page: see `store.rs`), so a page keeps its
//! 8 KiB layout; the page number and run length are the associated data, so a page
//! moved elsewhere in the file, or a seal moved to another page, fails to open.
//! Nonces are 24 bytes: 16 random bytes drawn when the environment opens, then a
//! counter, so no two seals under one key share a nonce.
//!
//! ## Wrapped key file (100 bytes, integers little-endian)
//! ```text
//!  0  8  magic "KILNKEY1"
//!  8  4  version (1)
//! 12  4  reserved (0)
//! 16  8  fingerprint of the master key that wraps it (names it in errors)
//! 24 24  nonce
//! 48 32  data key, encrypted
//! 80 16  tag (associated data: bytes 0..24)
//! 96  4  crc32c of bytes 0..96 (a damaged file is told from a wrong key)
//! ```

use crate::io::{OpenMode, Vfs};
use crate::{Error, Result};
use chacha20poly1305::aead::inout::InOutBuf;
use chacha20poly1305::{AeadInOut, Key, KeyInit, Tag, XChaCha20Poly1305, XNonce};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use zeroize::Zeroizing;

/// The file beside the data file that holds the environment's wrapped data key.
pub const WRAPPED_KEY_FILE: &str = "data-key.wrapped";
const WRAPPED_MAGIC: &[u8; 8] = b"KILNKEY1";
const WRAPPED_VERSION: u32 = 1;
const WRAPPED_LEN: usize = 100;
const KEY_BYTES: usize = 32;
pub(crate) const NONCE_BYTES: usize = 24;
pub(crate) const TAG_BYTES: usize = 16;

/// The operator's master key. Cloning shares the bytes; they are wiped when the
/// last clone is dropped. Its `Debug` shows the fingerprint, never the key.
#[derive(Clone)]
pub struct MasterKey(Arc<Zeroizing<[u8; KEY_BYTES]>>);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MasterKey(fingerprint {})", self.fingerprint())
    }
}

/// Why a master key file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("cannot read encryption key file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("encryption key file {path} must hold 64 hexadecimal digits (32 bytes; `kiln encryption new-key` makes one), found {found}")]
    Malformed { path: PathBuf, found: String },
}

impl MasterKey {
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        MasterKey(Arc::new(Zeroizing::new(bytes)))
    }

    /// 32 bytes from the operating system's random source.
    pub fn generate() -> Self {
        let mut bytes = Zeroizing::new([0u8; KEY_BYTES]);
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, bytes.as_mut());
        MasterKey(Arc::new(bytes))
    }

    /// Reads a key file: 64 hexadecimal digits, surrounding whitespace allowed.
    pub fn read_file(path: &Path) -> std::result::Result<Self, KeyFileError> {
        let text = Zeroizing::new(std::fs::read(path).map_err(|source| KeyFileError::Read {
            path: path.to_path_buf(),
            source,
        })?);
        let malformed = |found: String| KeyFileError::Malformed {
            path: path.to_path_buf(),
            found,
        };
        let trimmed = text.trim_ascii();
        if trimmed.len() != 2 * KEY_BYTES {
            return Err(malformed(format!("{} bytes", trimmed.len())));
        }
        let mut bytes = Zeroizing::new([0u8; KEY_BYTES]);
        for (i, pair) in trimmed.chunks_exact(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16);
            let (hi, lo) = match pair {
                &[hi, lo] => (digit(hi), digit(lo)),
                _ => (None, None),
            };
            match (hi, lo, bytes.get_mut(i)) {
                (Some(hi), Some(lo), Some(b)) => *b = (hi * 16 + lo) as u8,
                _ => {
                    return Err(malformed(format!(
                        "a non-hexadecimal character near byte {}",
                        2 * i
                    )))
                }
            }
        }
        Ok(MasterKey(Arc::new(bytes)))
    }

    /// The key as 64 lowercase hexadecimal digits (what a key file holds).
    pub fn to_hex(&self) -> Zeroizing<String> {
        let mut s = Zeroizing::new(String::with_capacity(2 * KEY_BYTES));
        for b in self.0.iter() {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// 16 hex digits that name this key without revealing it (HKDF of the key).
    pub fn fingerprint(&self) -> String {
        self.fingerprint_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn fingerprint_bytes(&self) -> [u8; 8] {
        let mut out = [0u8; 8];
        self.derive(b"kiln/v1/fingerprint", &mut out);
        out
    }

    fn derive(&self, info: &[u8], out: &mut [u8]) {
        let hk = hkdf::Hkdf::<sha2::Sha256>::new(None, &self.0[..]);
        // Only fails for outputs longer than 255 hashes; ours are 8 or 32 bytes.
        let _ = hk.expand(info, out);
    }

    fn wrapping_cipher(&self) -> XChaCha20Poly1305 {
        let mut kek = Zeroizing::new([0u8; KEY_BYTES]);
        self.derive(b"kiln/v1/key-wrapping", kek.as_mut());
        XChaCha20Poly1305::new(&Key::from(*kek))
    }
}

/// The cipher of one open environment: its data key, and where the next nonce
/// comes from.
///
/// XChaCha20-Poly1305, built as its definition says (draft-irtf-cfrg-xchacha):
/// HChaCha20 of the key and the nonce's first 16 bytes gives a subkey, and the
/// IETF ChaCha20-Poly1305 under that subkey seals with the nonce's last 8 bytes.
/// The subkey comes from RustCrypto's `chacha20`, the sealing from `ring` (its
/// assembly, the one rustls uses): 3.3 us per 8 KiB page here against 7.8 us for
/// RustCrypto's `chacha20poly1305`, and every read of a page not in the cache
/// waits for it. A test checks that both give the same bytes.
pub(crate) struct Cipher {
    /// Kept to derive subkeys, keys for the layers above (`derive`), and to wrap it.
    key: Zeroizing<[u8; KEY_BYTES]>,
    nonce_prefix: [u8; 16],
    counter: AtomicU64,
}

/// A nonce and the tag it produced: what opening the sealed bytes again needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sealed {
    pub nonce: [u8; NONCE_BYTES],
    pub tag: [u8; TAG_BYTES],
}

impl Cipher {
    fn new(data_key: &[u8; KEY_BYTES]) -> Self {
        let mut nonce_prefix = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut nonce_prefix);
        Cipher {
            key: Zeroizing::new(*data_key),
            nonce_prefix,
            counter: AtomicU64::new(0),
        }
    }

    /// A cipher under a key of the caller's (tests, fuzzers).
    #[cfg(test)]
    pub(crate) fn for_tests(key: [u8; KEY_BYTES]) -> Self {
        Cipher::new(&key)
    }

    fn next_nonce(&self) -> [u8; NONCE_BYTES] {
        let mut nonce = [0u8; NONCE_BYTES];
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        nonce[..16].copy_from_slice(&self.nonce_prefix);
        nonce[16..].copy_from_slice(&n.to_le_bytes());
        nonce
    }

    /// A key of its own for `purpose`, derived from this one (HKDF-SHA256): it
    /// changes with the data key, never with the master key.
    fn derive(&self, purpose: &str) -> Cipher {
        let hk = hkdf::Hkdf::<sha2::Sha256>::new(None, &self.key[..]);
        let mut key = Zeroizing::new([0u8; KEY_BYTES]);
        let info = format!("kiln/v1/derived/{purpose}");
        let _ = hk.expand(info.as_bytes(), key.as_mut());
        Cipher::new(&key)
    }

    /// The ChaCha20-Poly1305 key and nonce that XChaCha20-Poly1305 with `nonce`
    /// comes down to.
    fn subkey(&self, nonce: &[u8; NONCE_BYTES]) -> (ring::aead::LessSafeKey, ring::aead::Nonce) {
        let mut head = [0u8; 16];
        head.copy_from_slice(&nonce[..16]);
        let mut sub = chacha20::hchacha::<chacha20::R20>(
            &chacha20::Key::from(*self.key),
            &chacha20::cipher::array::Array::from(head),
        );
        let key = ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, &sub)
            .expect("a 32-byte ChaCha20-Poly1305 key");
        zeroize::Zeroize::zeroize(sub.as_mut_slice());
        let mut ietf = [0u8; 12];
        ietf[4..].copy_from_slice(&nonce[16..]);
        (
            ring::aead::LessSafeKey::new(key),
            ring::aead::Nonce::assume_unique_for_key(ietf),
        )
    }

    /// Encrypts `plain` into `out` (same length) under a fresh nonce.
    pub(crate) fn seal_into(&self, aad: &[u8], plain: &[u8], out: &mut [u8]) -> Sealed {
        out.copy_from_slice(plain);
        self.seal_in_place(aad, out)
    }

    /// Encrypts `buf` in place under a fresh nonce.
    pub(crate) fn seal_in_place(&self, aad: &[u8], buf: &mut [u8]) -> Sealed {
        let nonce = self.next_nonce();
        let (key, ietf) = self.subkey(&nonce);
        let tag = key
            .seal_in_place_separate_tag(ietf, ring::aead::Aad::from(aad), buf)
            .expect("ChaCha20-Poly1305 seals messages up to 256 GiB");
        let mut sealed = Sealed {
            nonce,
            tag: [0; TAG_BYTES],
        };
        sealed.tag.copy_from_slice(tag.as_ref());
        sealed
    }

    /// Decrypts `sealed_bytes` into `out` (same length); false if they, the
    /// associated data or the seal were changed, or another key sealed them.
    pub(crate) fn open_into(
        &self,
        aad: &[u8],
        sealed_bytes: &[u8],
        out: &mut [u8],
        seal: &Sealed,
    ) -> bool {
        if sealed_bytes.len() != out.len() {
            return false;
        }
        out.copy_from_slice(sealed_bytes);
        self.open_in_place(aad, out, seal)
    }

    /// Decrypts `buf` in place; false as `open_into`.
    pub(crate) fn open_in_place(&self, aad: &[u8], buf: &mut [u8], seal: &Sealed) -> bool {
        let (key, ietf) = self.subkey(&seal.nonce);
        key.open_in_place_separate_tag(
            ietf,
            ring::aead::Aad::from(aad),
            ring::aead::Tag::from(seal.tag),
            buf,
            0..,
        )
        .is_ok()
    }
}

/// A key that seals byte strings for the layers above the engine (backups,
/// attachment blobs): XChaCha20-Poly1305, a fresh nonce per seal. A seal is the
/// nonce and tag ([`SealingKey::SEAL_BYTES`]), kept beside the ciphertext.
pub struct SealingKey(Cipher);

impl std::fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealingKey(..)")
    }
}

impl SealingKey {
    pub const SEAL_BYTES: usize = NONCE_BYTES + TAG_BYTES;

    /// 32 random bytes (a backup's own key, wrapped by the master key).
    pub fn generate() -> Self {
        let mut key = Zeroizing::new([0u8; KEY_BYTES]);
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, key.as_mut());
        SealingKey(Cipher::new(&key))
    }

    /// Encrypts `buf` in place; returns the seal (nonce, then tag). `aad` is
    /// authenticated, not encrypted: what the bytes are and where they belong.
    pub fn seal_in_place(&self, aad: &[u8], buf: &mut [u8]) -> [u8; Self::SEAL_BYTES] {
        let sealed = self.0.seal_in_place(aad, buf);
        let mut seal = [0u8; Self::SEAL_BYTES];
        seal[..NONCE_BYTES].copy_from_slice(&sealed.nonce);
        seal[NONCE_BYTES..].copy_from_slice(&sealed.tag);
        seal
    }

    /// Decrypts `buf` in place; false (and `buf` unspecified) if the bytes, `aad` or
    /// the seal were changed, or another key sealed them.
    pub fn open_in_place(&self, aad: &[u8], buf: &mut [u8], seal: &[u8; Self::SEAL_BYTES]) -> bool {
        let mut sealed = Sealed {
            nonce: [0; NONCE_BYTES],
            tag: [0; TAG_BYTES],
        };
        sealed.nonce.copy_from_slice(&seal[..NONCE_BYTES]);
        sealed.tag.copy_from_slice(&seal[NONCE_BYTES..]);
        self.0.open_in_place(aad, buf, &sealed)
    }

    /// Nonce bytes of [`SealingKey::apply_keystream_at`].
    pub const STREAM_NONCE_BYTES: usize = NONCE_BYTES;

    /// XORs `buf` with the XChaCha20 keystream of `nonce` from byte `offset` on.
    /// Not authenticated: for bytes written in place at any offset whose integrity
    /// something else checks (a cluster upload's SHA-256, checked before use).
    /// The same `nonce` must never encrypt other bytes at the same offset.
    pub fn apply_keystream_at(&self, nonce: &[u8; NONCE_BYTES], offset: u64, buf: &mut [u8]) {
        use chacha20::cipher::{StreamCipher, StreamCipherSeek};
        use chacha20::KeyIvInit;
        let mut stream = chacha20::XChaCha20::new(
            &chacha20::Key::from(*self.0.key),
            &chacha20::XNonce::from(*nonce),
        );
        stream.seek(offset);
        stream.apply_keystream(buf);
    }

    /// A fresh random nonce for [`SealingKey::apply_keystream_at`].
    pub fn random_stream_nonce() -> [u8; NONCE_BYTES] {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut nonce);
        nonce
    }
}

impl MasterKey {
    /// A key for `purpose` derived from the master key itself (HKDF-SHA256): the
    /// same wherever this master key is (every node of a cluster), so what it
    /// seals travels between them as it is. Unlike an environment's data key, it
    /// changes with the master key: only for short-lived files.
    pub fn derived_key(&self, purpose: &str) -> SealingKey {
        let mut key = Zeroizing::new([0u8; KEY_BYTES]);
        let info = format!("kiln/v1/master-derived/{purpose}");
        self.derive(info.as_bytes(), key.as_mut());
        SealingKey(Cipher::new(&key))
    }

    /// `key` wrapped by this master key: [`WRAPPED_KEY_BYTES`] bytes, in the wrapped
    /// key file's layout (module comment), to store beside what `key` seals.
    pub fn wrap(&self, key: &SealingKey) -> [u8; WRAPPED_KEY_BYTES] {
        wrap_data_key(&key.0.key, self)
    }

    /// The key `wrapped` holds; `what` names where it came from in errors. A wrong
    /// master key is `Error::Encryption` naming both keys' fingerprints.
    pub fn unwrap(&self, wrapped: &[u8], what: &Path) -> Result<SealingKey> {
        let bytes: &[u8; WRAPPED_LEN] = wrapped.try_into().map_err(|_| {
            Error::corrupted(
                what,
                "wrapped key",
                format!(
                    "{} bytes where a wrapped key has {WRAPPED_LEN}",
                    wrapped.len()
                ),
            )
        })?;
        let key = unwrap_data_key(bytes, self, what)?;
        Ok(SealingKey(Cipher::new(&key)))
    }
}

/// The length of a wrapped key ([`MasterKey::wrap`]).
pub const WRAPPED_KEY_BYTES: usize = WRAPPED_LEN;

/// A key of the environment's own for `purpose` (attachment blobs beside its data
/// file...), derived from its data key: it survives a change of master key.
pub(crate) fn derived_key(cipher: &Cipher, purpose: &str) -> SealingKey {
    SealingKey(cipher.derive(purpose))
}

/// Whether the environment at `dir` is encrypted (it has a wrapped data key).
pub fn is_encrypted(dir: &Path) -> bool {
    dir.join(WRAPPED_KEY_FILE).exists()
}

/// Step 1½ of opening (`recovery/open.rs`): the environment's cipher, if it is
/// encrypted. A new environment (no data file yet) given a master key gets a new
/// data key; an existing one must be opened with a key exactly when it has one.
pub(crate) fn open_data_key(
    vfs: &dyn Vfs,
    dir: &Path,
    data_file_exists: bool,
    master: Option<&MasterKey>,
) -> Result<Option<Arc<Cipher>>> {
    let path = dir.join(WRAPPED_KEY_FILE);
    let wrapped_exists = vfs.exists(&path);
    match (master, data_file_exists, wrapped_exists) {
        (None, _, false) => Ok(None),
        (None, _, true) => Err(Error::Encryption {
            path,
            what: "the environment is encrypted: open it with its master key (--encryption-key-file)".into(),
        }),
        (Some(_), true, false) => Err(Error::Encryption {
            path: dir.to_path_buf(),
            what: format!(
                "an encryption key was given, but this environment was created without one (it has no {WRAPPED_KEY_FILE}); \
                 its data stays readable without the key. To encrypt it, copy it into an encrypted data directory \
                 (kiln backup, then kiln restore --encryption-key-file)"
            ),
        }),
        (Some(master), true, true) => {
            let key = unwrap_data_key(&read_wrapped(vfs, &path)?, master, &path)?;
            Ok(Some(Arc::new(Cipher::new(&key))))
        }
        // A new environment; a wrapped key left by a creation that crashed before
        // its data file existed protects nothing yet and is replaced.
        (Some(master), false, _) => {
            let mut key = Zeroizing::new([0u8; KEY_BYTES]);
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, key.as_mut());
            write_wrapped(vfs, dir, &wrap_data_key(&key, master))?;
            Ok(Some(Arc::new(Cipher::new(&key))))
        }
    }
}

/// Rewraps the data key of the environment at `dir` under `new` (it must be
/// closed: the caller holds its lock or knows no process has it open). The file is
/// replaced by a rename, so a crash leaves either key in force, never neither.
pub fn rotate_master_key(dir: &Path, old: &MasterKey, new: &MasterKey) -> Result<()> {
    let vfs = crate::io::OsVfs;
    // The environment's own lock: an open environment refuses (Error::Locked).
    let lock_path = dir.join(crate::recovery::LOCK_FILE);
    let _lock = vfs
        .lock_exclusive(&lock_path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Error::Locked {
                path: dir.to_path_buf(),
            },
            _ => Error::io(&lock_path, None, "lock environment", e),
        })?;
    let path = dir.join(WRAPPED_KEY_FILE);
    if !vfs.exists(&path) {
        return Err(Error::Encryption {
            path,
            what: "this environment is not encrypted: there is no key to rewrap".into(),
        });
    }
    let key = unwrap_data_key(&read_wrapped(&vfs, &path)?, old, &path)?;
    write_wrapped(&vfs, dir, &wrap_data_key(&key, new))
}

/// The fingerprint of the master key that wraps the data key of the environment at
/// `dir` (as [`MasterKey::fingerprint`]), or `None` if it is not encrypted.
pub fn wrapped_by(dir: &Path) -> Result<Option<String>> {
    let vfs = crate::io::OsVfs;
    let path = dir.join(WRAPPED_KEY_FILE);
    if !vfs.exists(&path) {
        return Ok(None);
    }
    let b = read_wrapped(&vfs, &path)?;
    Ok(Some(b[16..24].iter().map(|x| format!("{x:02x}")).collect()))
}

/// Whether `master` unwraps the data key of the environment at `dir` (true), or the
/// environment is not encrypted (false); an error names what is wrong.
pub fn check_master_key(dir: &Path, master: &MasterKey) -> Result<bool> {
    let vfs = crate::io::OsVfs;
    let path = dir.join(WRAPPED_KEY_FILE);
    if !vfs.exists(&path) {
        return Ok(false);
    }
    unwrap_data_key(&read_wrapped(&vfs, &path)?, master, &path).map(|_| true)
}

fn wrap_data_key(key: &[u8; KEY_BYTES], master: &MasterKey) -> [u8; WRAPPED_LEN] {
    let mut b = [0u8; WRAPPED_LEN];
    b[..8].copy_from_slice(WRAPPED_MAGIC);
    b[8..12].copy_from_slice(&WRAPPED_VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&master.fingerprint_bytes());
    let mut nonce = [0u8; NONCE_BYTES];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut nonce);
    b[24..48].copy_from_slice(&nonce);
    let (head, rest) = b.split_at_mut(48);
    let wrapped = rest.get_mut(..KEY_BYTES).expect("100-byte layout");
    let tag = master
        .wrapping_cipher()
        .encrypt_inout_detached(
            &XNonce::from(nonce),
            head.get(..24).expect("100-byte layout"),
            InOutBuf::new(key, wrapped).expect("32-byte buffers"),
        )
        .expect("a 32-byte message seals");
    b[80..96].copy_from_slice(&tag);
    let sum = crc32c::crc32c(&b[..96]);
    b[96..100].copy_from_slice(&sum.to_le_bytes());
    b
}

fn unwrap_data_key(
    b: &[u8; WRAPPED_LEN],
    master: &MasterKey,
    path: &Path,
) -> Result<Zeroizing<[u8; KEY_BYTES]>> {
    let damaged = |what: String| Error::corrupted(path, "wrapped data key", what);
    if &b[..8] != WRAPPED_MAGIC {
        return Err(damaged("not a Kiln wrapped key file (bad magic)".into()));
    }
    let stored_sum = u32::from_le_bytes([b[96], b[97], b[98], b[99]]);
    if crc32c::crc32c(&b[..96]) != stored_sum {
        return Err(damaged("checksum mismatch: the file is damaged".into()));
    }
    let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if version != WRAPPED_VERSION {
        return Err(Error::Incompatible {
            path: path.to_path_buf(),
            found: format!("wrapped key format {version}"),
            expected: format!("wrapped key format {WRAPPED_VERSION}"),
        });
    }
    let mut key = Zeroizing::new([0u8; KEY_BYTES]);
    let mut nonce = [0u8; NONCE_BYTES];
    nonce.copy_from_slice(&b[24..48]);
    let mut tag = [0u8; TAG_BYTES];
    tag.copy_from_slice(&b[80..96]);
    let opened = master.wrapping_cipher().decrypt_inout_detached(
        &XNonce::from(nonce),
        &b[..24],
        InOutBuf::new(&b[48..80], key.as_mut()).expect("32-byte buffers"),
        &Tag::from(tag),
    );
    if opened.is_err() {
        let wrapped_by: String = b[16..24].iter().map(|x| format!("{x:02x}")).collect();
        return Err(Error::Encryption {
            path: path.to_path_buf(),
            what: format!(
                "wrong encryption key: the data key is wrapped by master key {wrapped_by}, the key given is {}",
                master.fingerprint()
            ),
        });
    }
    Ok(key)
}

fn read_wrapped(vfs: &dyn Vfs, path: &Path) -> Result<[u8; WRAPPED_LEN]> {
    let file = vfs
        .open(path, OpenMode::default())
        .map_err(|e| Error::io(path, None, "open wrapped data key", e))?;
    let len = file
        .len()
        .map_err(|e| Error::io(path, None, "stat wrapped data key", e))?;
    if len != WRAPPED_LEN as u64 {
        return Err(Error::corrupted(
            path,
            "wrapped data key",
            format!("{len} bytes where a wrapped key file has {WRAPPED_LEN}"),
        ));
    }
    let mut b = [0u8; WRAPPED_LEN];
    file.read_exact_at(&mut b, 0)
        .map_err(|e| Error::io(path, Some(0), "read wrapped data key", e))?;
    Ok(b)
}

/// Writes the wrapped key under a temporary name, syncs it, renames it into place
/// and syncs the directory.
fn write_wrapped(vfs: &dyn Vfs, dir: &Path, bytes: &[u8; WRAPPED_LEN]) -> Result<()> {
    let tmp = dir.join(format!("{WRAPPED_KEY_FILE}.tmp"));
    let path = dir.join(WRAPPED_KEY_FILE);
    let file = vfs
        .open(
            &tmp,
            OpenMode {
                create: true,
                write: true,
                ..Default::default()
            },
        )
        .map_err(|e| Error::io(&tmp, None, "create wrapped data key", e))?;
    file.set_len(0)
        .and_then(|()| file.write_all_at(bytes, 0))
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(&tmp, Some(0), "write wrapped data key", e))?;
    drop(file);
    vfs.rename(&tmp, &path)
        .map_err(|e| Error::io(&path, None, "rename wrapped data key into place", e))?;
    vfs.sync_dir(dir)
        .map_err(|e| Error::io(dir, None, "fsync directory of wrapped data key", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keystream_applied_in_pieces_at_their_offsets_is_the_whole_ones() {
        let master = MasterKey::from_bytes([3u8; KEY_BYTES]);
        let key = master.derived_key("uploads");
        let nonce = SealingKey::random_stream_nonce();
        let plain: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        let mut whole = plain.clone();
        key.apply_keystream_at(&nonce, 0, &mut whole);
        assert_ne!(whole, plain);
        let mut pieces = plain.clone();
        // Pieces in any order, at offsets that cross the 64-byte blocks.
        for (from, to) in [(4000, 10_000), (0, 63), (63, 129), (129, 4000)] {
            key.apply_keystream_at(&nonce, from as u64, &mut pieces[from..to]);
        }
        assert_eq!(pieces, whole);
        // Applied again: the plaintext; the same master key derives the same key
        // (another node), another purpose or master key does not.
        let again = master.derived_key("uploads");
        again.apply_keystream_at(&nonce, 0, &mut whole);
        assert_eq!(whole, plain);
        for other in [
            master.derived_key("other"),
            MasterKey::from_bytes([4u8; KEY_BYTES]).derived_key("uploads"),
        ] {
            let mut b = plain.clone();
            other.apply_keystream_at(&nonce, 0, &mut b);
            key.apply_keystream_at(&nonce, 0, &mut b);
            assert_ne!(b, plain);
        }
    }

    #[test]
    fn a_wrapped_key_opens_with_its_master_key_only() {
        let (a, b) = (MasterKey::generate(), MasterKey::generate());
        let key = [7u8; KEY_BYTES];
        let wrapped = wrap_data_key(&key, &a);
        assert_eq!(*unwrap_data_key(&wrapped, &a, Path::new("k")).unwrap(), key);
        let wrong = unwrap_data_key(&wrapped, &b, Path::new("k")).unwrap_err();
        assert!(
            wrong.to_string().contains("wrong encryption key"),
            "{wrong}"
        );
        assert!(wrong.to_string().contains(&a.fingerprint()), "{wrong}");
        // Any changed byte is damage (checksum) or, with the checksum fixed, a
        // failed authentication: never another key.
        for at in [0, 20, 30, 60, 90] {
            let mut bad = wrapped;
            bad[at] ^= 1;
            assert!(
                unwrap_data_key(&bad, &a, Path::new("k")).is_err(),
                "byte {at}"
            );
            let sum = crc32c::crc32c(&bad[..96]);
            bad[96..100].copy_from_slice(&sum.to_le_bytes());
            assert!(
                unwrap_data_key(&bad, &a, Path::new("k")).is_err(),
                "byte {at}"
            );
        }
    }

    #[test]
    fn sealing_keys_wrap_under_the_master_key_and_seal_byte_strings() {
        let (master, other) = (MasterKey::generate(), MasterKey::generate());
        let key = SealingKey::generate();
        let wrapped = master.wrap(&key);
        let back = master.unwrap(&wrapped, Path::new("backup")).unwrap();
        assert!(other.unwrap(&wrapped, Path::new("backup")).is_err());
        assert!(master.unwrap(&wrapped[..50], Path::new("backup")).is_err());
        let mut buf = b"attachment bytes".to_vec();
        let seal = key.seal_in_place(b"blob 1", &mut buf);
        assert_ne!(&buf[..], b"attachment bytes");
        let mut copy = buf.clone();
        assert!(back.open_in_place(b"blob 1", &mut copy, &seal));
        assert_eq!(&copy[..], b"attachment bytes");
        assert!(!back.open_in_place(b"blob 2", &mut buf, &seal));
        // Derived keys: the same purpose gives the same key, another purpose another.
        let data = Cipher::for_tests([3; KEY_BYTES]);
        let (a, b) = (derived_key(&data, "blobs"), derived_key(&data, "blobs"));
        let mut x = b"x".to_vec();
        let seal = a.seal_in_place(b"", &mut x);
        assert!(b.open_in_place(b"", &mut x.clone(), &seal));
        assert!(!derived_key(&data, "other").open_in_place(b"", &mut x, &seal));
    }

    /// The construction from `chacha20::hchacha` and ring gives exactly the bytes
    /// of RustCrypto's XChaCha20-Poly1305, both ways.
    #[test]
    fn sealing_is_xchacha20_poly1305() {
        let c = Cipher::for_tests([0x42; KEY_BYTES]);
        let reference = XChaCha20Poly1305::new(&Key::from([0x42; KEY_BYTES]));
        for len in [0usize, 1, 63, 64, 65, 8192, 3 * 8192 + 17] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let mut ours = plain.clone();
            let seal = c.seal_in_place(b"aad", &mut ours);
            let mut theirs = plain.clone();
            let tag = reference
                .encrypt_inout_detached(&XNonce::from(seal.nonce), b"aad", (&mut theirs[..]).into())
                .unwrap();
            assert_eq!(ours, theirs, "ciphertext of {len} bytes");
            assert_eq!(seal.tag[..], tag[..], "tag of {len} bytes");
            let mut back = ours.clone();
            assert!(c.open_in_place(b"aad", &mut back, &seal));
            assert_eq!(back, plain);
        }
    }

    #[test]
    fn key_files_are_64_hex_digits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = MasterKey::generate();
        std::fs::write(&path, format!("{}\n", key.to_hex().as_str())).unwrap();
        let read = MasterKey::read_file(&path).unwrap();
        assert_eq!(read.fingerprint(), key.fingerprint());
        for bad in ["", "abc", &"g".repeat(64), &"0".repeat(66)] {
            std::fs::write(&path, bad).unwrap();
            let e = MasterKey::read_file(&path).unwrap_err();
            assert!(e.to_string().contains("64 hexadecimal digits"), "{e}");
        }
        assert!(!format!("{key:?}").contains(key.to_hex().as_str()));
    }

    #[test]
    fn sealed_bytes_open_only_unchanged_and_with_their_associated_data() {
        let c = Cipher::for_tests([1; KEY_BYTES]);
        let plain = vec![42u8; 8192];
        let mut sealed = vec![0u8; 8192];
        let seal = c.seal_into(b"page 5", &plain, &mut sealed);
        assert_ne!(sealed, plain);
        let mut out = vec![0u8; 8192];
        assert!(c.open_into(b"page 5", &sealed, &mut out, &seal));
        assert_eq!(out, plain);
        assert!(!c.open_into(b"page 6", &sealed, &mut out, &seal));
        sealed[100] ^= 4;
        assert!(!c.open_into(b"page 5", &sealed, &mut out, &seal));
        // Two seals of the same bytes never share a nonce.
        assert_ne!(
            c.seal_in_place(b"x", &mut [0; 16]).nonce,
            c.seal_in_place(b"x", &mut [0; 16]).nonce
        );
    }
}
