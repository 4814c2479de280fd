//! `kiln attachments put|get|list|delete --url U --db DB ID [NAME]`: a document's
//! attachments on a server (the routes under `/dbs/{db}/docs/{id}/attachments/`,
//! docs/http-api.md). Bytes stream from a file or standard input and to a file or
//! standard output: a large file is never held in memory.

use crate::client::{path_escape, ServerArgs};
use clap::Subcommand;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum AttachmentsCommand {
    /// Attach a file (or standard input, `-`) to a document under NAME: `kiln
    /// attachments put --url U --db DB users/ada photo.jpg ./photo.jpg`.
    Put {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// The document's id, e.g. users/ada.
        id: String,
        /// The attachment's name, e.g. photo.jpg (an existing one is replaced).
        name: String,
        /// The file to send; `-` for standard input.
        file: PathBuf,
        /// The attachment's content type, kept with it and sent back by `get`.
        #[arg(long, default_value = "application/octet-stream")]
        content_type: String,
        /// Only if the document has this etag.
        #[arg(long)]
        if_match: Option<String>,
    },
    /// Write an attachment's bytes to a file (default: standard output).
    Get {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// The document's id.
        id: String,
        /// The attachment's name.
        name: String,
        /// The file to write (replaced if it exists); default: standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// List a document's attachments: name, size, content type, hash.
    List {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// The document's id.
        id: String,
        /// Print the `@attachments` list as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove an attachment (a new version of the document).
    Delete {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// The document's id.
        id: String,
        /// The attachment's name.
        name: String,
    },
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn doc_path(db: &str, id: &str) -> String {
    format!("/dbs/{}/docs/{}", path_escape(db), path_escape(id))
}

fn attachment_path(db: &str, id: &str, name: &str) -> String {
    format!("{}/attachments/{}", doc_path(db, id), path_escape(name))
}

pub fn run(cmd: AttachmentsCommand) -> AnyResult<()> {
    match cmd {
        AttachmentsCommand::Put {
            server,
            db,
            id,
            name,
            file,
            content_type,
            if_match,
        } => {
            let path = attachment_path(&db, &id, &name);
            put(&server, &path, &file, &content_type, if_match)
        }
        AttachmentsCommand::Get {
            server,
            db,
            id,
            name,
            out,
        } => get(&server, &attachment_path(&db, &id, &name), out.as_deref()),
        AttachmentsCommand::List {
            server,
            db,
            id,
            json,
        } => list(&server, &doc_path(&db, &id), json),
        AttachmentsCommand::Delete {
            server,
            db,
            id,
            name,
        } => delete(&server, &attachment_path(&db, &id, &name)),
    }
}

/// `put`: streams `file` to the attachment at `path`, printing the answer.
fn put(
    server: &ServerArgs,
    path: &str,
    file: &Path,
    content_type: &str,
    if_match: Option<String>,
) -> AnyResult<()> {
    let mut input = open_input(file)?;
    let if_match = if_match.map(|etag| format!("\"{}\"", etag.trim_matches('"')));
    let mut headers = vec![("content-type", content_type)];
    if let Some(etag) = &if_match {
        headers.push(("if-match", etag));
    }
    let ep = server.endpoint()?;
    let (mut body, upload) = ep.start_upload_with("PUT", path, &headers)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = input.read(&mut buf)?;
        if n == 0 {
            break;
        }
        body.chunk(&buf[..n])?;
    }
    body.finish()?;
    let mut resp = upload.response()?;
    let mut answer = Vec::new();
    resp.body.read_to_end(&mut answer)?;
    if !(200..300).contains(&resp.status) {
        return Err(crate::client::ClientError::status(resp.status, &answer)
            .during(format!("PUT {path}"))
            .into());
    }
    println!("{}", String::from_utf8_lossy(&answer));
    Ok(())
}

/// The file to read an attachment from; `-` for standard input.
fn open_input(file: &Path) -> AnyResult<Box<dyn Read>> {
    Ok(if file.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(file).map_err(|e| format!("opening {}: {e}", file.display()))?)
    })
}

/// `get`: the attachment at `path` to the file `out` (default: standard output).
fn get(server: &ServerArgs, path: &str, out: Option<&Path>) -> AnyResult<()> {
    let mut resp = server.endpoint()?.get_stream(path)?;
    let mut sink: Box<dyn Write> = match out {
        Some(p) => Box::new(std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(p).map_err(|e| format!("creating {}: {e}", p.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    std::io::copy(&mut resp.body, &mut sink)?;
    sink.flush()?;
    Ok(())
}

/// `list`: the attachments of the document at `doc_path`, one a line or as JSON.
fn list(server: &ServerArgs, doc_path: &str, json: bool) -> AnyResult<()> {
    let doc: Value = serde_json::from_slice(&server.endpoint()?.request("GET", doc_path, b"")?)?;
    let list = doc["@metadata"]["@attachments"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if json {
        println!("{}", Value::Array(list));
        return Ok(());
    }
    if list.is_empty() {
        println!("no attachments");
    }
    for a in list {
        println!(
            "{}  {} bytes  {}  {}",
            a["name"].as_str().unwrap_or("?"),
            a["size"],
            a["content_type"].as_str().unwrap_or("?"),
            a["hash"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

/// `delete`: removes the attachment at `path`, printing the answer.
fn delete(server: &ServerArgs, path: &str) -> AnyResult<()> {
    let answer = server.endpoint()?.request("DELETE", path, b"")?;
    println!("{}", String::from_utf8_lossy(&answer));
    Ok(())
}
