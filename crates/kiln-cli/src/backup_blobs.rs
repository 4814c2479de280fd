//! The attachments' bytes of a backup: `kiln backup` copies the blobs a database
//! holds into a directory beside the backup file, `<file>.attachments/<sha256>`
//! (an increment only those its base's directory lacks); `kiln restore` puts the
//! blobs of every file's directory back, hash-checked, where the restored
//! reference counts expect them. The backup container itself holds the documents
//! and the counts, not the bytes.
//!
//! The blobs are listed after the backup's snapshot: one freed between the two
//! (its last document changed meanwhile) is not copied, and `kiln check` of a
//! restore to that point reports it missing.

use crate::client::{path_escape, Endpoint};
use crate::AnyResult;
use serde_json::Value;
use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};

/// `<file>.attachments`: the directory of a backup file's blobs.
pub fn sidecar(file: &Path) -> PathBuf {
    let mut p = file.as_os_str().to_owned();
    p.push(".attachments");
    PathBuf::from(p)
}

/// Blobs `(hash, size)` that `base`'s directory (an increment's base) lacks.
fn wanted(blobs: Vec<(String, u64)>, base: Option<&Path>) -> Vec<(String, u64)> {
    let base_dir = base.map(sidecar);
    blobs
        .into_iter()
        .filter(|(h, _)| base_dir.as_ref().is_none_or(|d| !d.join(h).exists()))
        .collect()
}

/// Writes `from` into `dir/<hash>` through a `.partial` file, synced.
fn save(dir: &Path, hash: &str, from: &mut dyn Read) -> AnyResult<()> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let partial = dir.join(format!("{hash}.partial"));
    let file = File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    std::io::copy(from, &mut w).map_err(|e| format!("{}: {e}", partial.display()))?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    std::fs::rename(&partial, dir.join(hash))?;
    Ok(())
}

/// Copies the blobs of the database `db` on the server `ep` beside `out`.
pub fn save_from_server(
    ep: &Endpoint,
    db: &str,
    out: &Path,
    base: Option<&Path>,
) -> AnyResult<u64> {
    let list: Value = serde_json::from_slice(&ep.request(
        "GET",
        &format!("/dbs/{}/attachments", path_escape(db)),
        b"",
    )?)?;
    let blobs = list["blobs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|b| Some((b["hash"].as_str()?.to_string(), b["size"].as_u64()?)))
        .collect();
    let dir = sidecar(out);
    let mut copied = 0;
    for (hash, _) in wanted(blobs, base) {
        let path = format!("/dbs/{}/attachments/{hash}", path_escape(db));
        let mut resp = ep.get_stream(&path)?;
        save(&dir, &hash, &mut resp.body)?;
        copied += 1;
    }
    Ok(copied)
}

/// Copies the blobs of `database` (offline) beside `out`.
pub fn save_offline(
    database: &kiln_docs::Database,
    out: &Path,
    base: Option<&Path>,
) -> AnyResult<u64> {
    let dir = sidecar(out);
    let mut copied = 0;
    for (hash, _) in wanted(database.attachment_blobs()?, base) {
        let from = database.attachment_blob_path(&hash)?;
        let mut f = File::open(&from).map_err(|e| format!("{}: {e}", from.display()))?;
        save(&dir, &hash, &mut f)?;
        copied += 1;
    }
    Ok(copied)
}

/// Every blob file of the backups' directories: `(hash, path)`.
fn backed_up(files: &[PathBuf]) -> AnyResult<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for f in files {
        let dir = sidecar(f);
        if !dir.is_dir() {
            continue;
        }
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
                out.push((name.to_string(), p.clone()));
            }
        }
    }
    Ok(out)
}

/// Sends the backups' blobs to the restored database `db` on the server `ep`
/// (`POST /dbs/{db}/attachments`, which checks them by their hash).
pub fn restore_to_server(ep: &Endpoint, db: &str, files: &[PathBuf]) -> AnyResult<u64> {
    let mut sent = 0;
    for (hash, path) in backed_up(files)? {
        let (mut w, upload) = ep.start_upload_with(
            "POST",
            &format!("/dbs/{}/attachments", path_escape(db)),
            "content-type: application/octet-stream\r\n",
        )?;
        let mut f = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            w.chunk(&buf[..n])?;
        }
        w.finish()?;
        let mut resp = upload.response()?;
        let mut body = Vec::new();
        resp.body.read_to_end(&mut body)?;
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if !(200..300).contains(&resp.status) || answer["hash"] != hash.as_str() {
            return Err(format!(
                "restoring attachment {hash} from {}: {} {}",
                path.display(),
                resp.status,
                String::from_utf8_lossy(&body)
            )
            .into());
        }
        sent += 1;
    }
    Ok(sent)
}

/// Puts the backups' blobs into the restored database `db` of the (offline)
/// data directory `data_dir`, each checked against its hash.
pub fn restore_offline(data_dir: &Path, db: &str, files: &[PathBuf]) -> AnyResult<u64> {
    let blobs = backed_up(files)?;
    if blobs.is_empty() {
        return Ok(0);
    }
    let store = kiln_docs::DocStore::open(data_dir, kiln_docs::DocsOptions::default())?;
    let database = store.database(db)?;
    for (hash, path) in &blobs {
        let staged = database.attachment_from_file(path, Some(hash))?;
        database.stage_attachment(staged)?;
    }
    drop(database);
    store.close()?;
    Ok(blobs.len() as u64)
}
