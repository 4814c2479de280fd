//! `kiln put/get/list`: documents in a data directory without a server (the server
//! must not be running on the same directory: each database is locked by one
//! process at a time).

use crate::storage_args::{EncryptionArgs, StorageArgs};
use kiln_docs::DatabaseError;
use kiln_docs::{Condition, DocError, DocId, DocStore};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Opens an existing data directory for a command that only reads it (`get`,
/// `list`, an offline `backup` and `backup chain-stop`): one that does not exist,
/// or is no data directory (no `databases/`), is refused before anything is
/// created in it (opening a store makes its directories and lock file).
pub(crate) fn open_existing(
    data_dir: &Path,
    encryption: &EncryptionArgs,
) -> crate::AnyResult<DocStore> {
    if !data_dir.is_dir() {
        return Err(crate::exit::NotFound(format!(
            "the data directory {} does not exist (give --data-dir as given to kiln serve)",
            data_dir.display()
        ))
        .into());
    }
    if !data_dir.join("databases").is_dir() {
        return Err(crate::exit::NotFound(format!(
            "{} is not a kiln data directory (it has no databases/)",
            data_dir.display()
        ))
        .into());
    }
    Ok(DocStore::open(data_dir, encryption.docs_options()?)?)
}

pub fn put(
    data_dir: &Path,
    database: &str,
    id: &str,
    json: &str,
    storage: &StorageArgs,
) -> crate::AnyResult<ExitCode> {
    let json = document_text(json)?;
    let store = DocStore::open(data_dir, storage.docs_options()?)?;
    let db = match store.database(database) {
        Ok(db) => db,
        Err(DocError::Database(DatabaseError::NotFound(_))) => store.create_database(database)?,
        Err(e) => return Err(e.into()),
    };
    let target = if id.ends_with('/') {
        DocId::Generate {
            prefix: id.to_string(),
        }
    } else {
        DocId::Given(id.to_string())
    };
    let out = db.put_to(target, json.as_bytes(), Condition::None)?;
    drop(db);
    store.close()?;
    println!(
        "{}",
        serde_json::json!({"id": out.id, "etag": out.etag.to_string(), "created": out.created})
    );
    Ok(ExitCode::SUCCESS)
}

/// The document argument of `kiln put`: the JSON itself, `-` for standard input,
/// or `@FILE`.
fn document_text(arg: &str) -> crate::AnyResult<String> {
    use std::io::Read;
    if arg == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("reading the document from standard input: {e}"))?;
        return Ok(text);
    }
    match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("reading the document from {path}: {e}").into()),
        None => Ok(arg.to_string()),
    }
}

pub fn get(
    data_dir: &Path,
    database: &str,
    id: &str,
    encryption: &EncryptionArgs,
) -> crate::AnyResult<ExitCode> {
    let store = open_existing(data_dir, encryption)?;
    match store.database(database)?.get(id)? {
        Some(doc) => {
            println!("{}", String::from_utf8_lossy(&doc.json));
            Ok(ExitCode::SUCCESS)
        }
        None => {
            eprintln!("not found: document {id:?} in database {database:?}");
            Ok(ExitCode::from(crate::exit::NOT_FOUND))
        }
    }
}

/// Which documents `kiln list` prints.
pub struct Page<'a> {
    pub prefix: &'a str,
    pub start_after: Option<&'a str>,
    pub limit: usize,
}

pub fn list(
    data_dir: &Path,
    database: &str,
    page: Page<'_>,
    encryption: &EncryptionArgs,
) -> crate::AnyResult<ExitCode> {
    let store = open_existing(data_dir, encryption)?;
    let page =
        store
            .database(database)?
            .list_by_prefix(page.prefix, page.start_after, page.limit)?;
    for doc in &page.items {
        println!("{}", String::from_utf8_lossy(&doc.json));
    }
    if let Some(next) = page.next {
        eprintln!("(more: continue with --start-after {next:?})");
    }
    Ok(ExitCode::SUCCESS)
}

/// The database directories of a document data directory, or `None` if `dir` is
/// not one (then it may be a single storage environment).
pub fn database_dirs(dir: &Path) -> crate::AnyResult<Option<Vec<PathBuf>>> {
    let dbs = dir.join("databases");
    if !dbs.is_dir() || dir.join(kiln_storage::DATA_FILE).exists() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dbs).map_err(|e| format!("{}: {e}", dbs.display()))? {
        let path = entry.map_err(|e| format!("{}: {e}", dbs.display()))?.path();
        if path.join(kiln_storage::DATA_FILE).exists() {
            out.push(path);
        }
    }
    out.sort();
    Ok(Some(out))
}
