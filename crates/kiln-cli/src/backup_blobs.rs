//! Attachments' bytes of backups taken by older Kilns: those copied the blobs into
//! a directory beside the backup file, `<file>.attachments/<sha256>`, listed after
//! the snapshot. Backups now carry the blobs inside the container (its extra
//! files, `kiln_docs::backup`), consistent with the snapshot and written by the
//! restore itself; `kiln restore` still puts the blobs of an old backup's
//! directory back, hash-checked, after the restore (a blob freed between that
//! backup's snapshot and its copy is missing: `kiln check` reports it).

use crate::client::{path_escape, Endpoint};
use crate::AnyResult;
use serde_json::Value;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// `<file>.attachments`: the directory of a backup file's blobs.
pub fn sidecar(file: &Path) -> PathBuf {
    let mut p = file.as_os_str().to_owned();
    p.push(".attachments");
    PathBuf::from(p)
}

/// Writes `from` into `dir/<hash>` through a `.partial` file, synced (an export's
/// attachments: `export_cmd.rs`).
pub fn save(dir: &Path, hash: &str, from: &mut dyn Read) -> AnyResult<u64> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let partial = dir.join(format!("{hash}.partial"));
    let file = File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    let n = std::io::copy(from, &mut w).map_err(|e| format!("{}: {e}", partial.display()))?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    std::fs::rename(&partial, dir.join(hash))?;
    Ok(n)
}

/// Every blob file of the backups' directories: `(hash, path)`.
fn backed_up(files: &[PathBuf]) -> AnyResult<Vec<(String, PathBuf)>> {
    let dirs: Vec<PathBuf> = files.iter().map(|f| sidecar(f)).collect();
    blobs_in(&dirs)
}

/// Every blob file (named by its SHA-256) of the directories that exist.
pub fn blobs_in(dirs: &[PathBuf]) -> AnyResult<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for dir in dirs {
        if !dir.is_dir() {
            continue;
        }
        for e in std::fs::read_dir(dir)? {
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
    upload_blobs(ep, db, backed_up(files)?)
}

/// The hashes the database `db` on `ep` holds named by a document or revision
/// (`GET /dbs/{db}/attachments`, `refs` > 0). Empty when the server cannot say
/// (an older server, a cluster): then every blob is sent.
fn named_on_server(ep: &Endpoint, db: &str) -> std::collections::HashSet<String> {
    let path = format!("/dbs/{}/attachments", path_escape(db));
    let Ok((200, body)) = ep.request_any("GET", &path, b"") else {
        return Default::default();
    };
    let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(blobs) = answer["blobs"].as_array() else {
        return Default::default();
    };
    blobs
        .iter()
        .filter(|b| b["refs"].as_u64().is_some_and(|n| n > 0))
        .filter_map(|b| b["hash"].as_str().map(str::to_string))
        .collect()
}

/// Stages blob files `(hash, path)` in the database `db` on the server `ep`
/// (`POST /dbs/{db}/attachments`, which checks each against its hash and keeps it
/// an hour for the documents that name it). Blobs the database already has named
/// by a document are not sent again (an import resumed, a restore over the same
/// bytes); staged-only ones are (sending renews their hour). Returns how many
/// were sent.
pub fn upload_blobs(ep: &Endpoint, db: &str, blobs: Vec<(String, PathBuf)>) -> AnyResult<u64> {
    let mut sent = 0;
    let held = match blobs.is_empty() {
        true => Default::default(),
        false => named_on_server(ep, db),
    };
    for (hash, path) in blobs {
        if held.contains(&hash) {
            continue;
        }
        let (mut w, upload) = ep.start_upload_with(
            "POST",
            &format!("/dbs/{}/attachments", path_escape(db)),
            &[("content-type", "application/octet-stream")],
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
        if !(200..300).contains(&resp.status) {
            return Err(crate::client::ClientError::status(resp.status, &body)
                .during(format!(
                    "uploading attachment {hash} from {}",
                    path.display()
                ))
                .into());
        }
        if answer["hash"] != hash.as_str() {
            return Err(format!(
                "uploading attachment {hash} from {}: the server kept it as {}",
                path.display(),
                answer["hash"]
            )
            .into());
        }
        sent += 1;
    }
    Ok(sent)
}

/// Puts the backups' blobs into the restored database `db` of the (offline)
/// data directory `data_dir`, each checked against its hash.
pub fn restore_offline(
    data_dir: &Path,
    db: &str,
    files: &[PathBuf],
    options: kiln_docs::DocsOptions,
) -> AnyResult<u64> {
    let blobs = backed_up(files)?;
    if blobs.is_empty() {
        return Ok(0);
    }
    let store = kiln_docs::DocStore::open(data_dir, options)?;
    let database = store.database(db)?;
    for (hash, path) in &blobs {
        let staged = database.attachment_from_file(path, Some(hash))?;
        database.stage_attachment(staged)?;
    }
    drop(database);
    store.close()?;
    Ok(blobs.len() as u64)
}
