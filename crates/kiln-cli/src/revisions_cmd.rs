//! `kiln revisions list|revert|purge|config --url U --db DB`: document revisions on
//! a server (the routes under `/dbs/{db}/revisions/`, docs/http-api.md).

use crate::client::{path_escape, query_escape, Endpoint, ServerArgs};
use clap::Subcommand;
use serde_json::Value;

#[derive(Subcommand)]
pub enum RevisionsCommand {
    /// Print a document's revisions, newest first, one JSON object per line.
    List {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// The document's id.
        id: String,
        /// Print at most this many.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Write a revision back as the document's new version (prints the write's
    /// answer: its id and new etag).
    Revert {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// The document's id.
        id: String,
        /// The etag of the revision to write back.
        #[arg(long)]
        etag: String,
    },
    /// Remove every revision of a document.
    Purge {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// The document's id.
        id: String,
    },
    /// Print which collections keep revisions, or set it with --set.
    Config {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// The whole configuration to set, as JSON, e.g.
        /// '{"collections": {"orders": {"max_revisions": 50, "max_age_ms": null}}}'.
        #[arg(long)]
        set: Option<String>,
    },
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

pub fn run(cmd: RevisionsCommand) -> AnyResult<()> {
    let answer = match cmd {
        RevisionsCommand::List {
            server,
            db,
            id,
            limit,
        } => return list(&server.endpoint()?, &db, &id, limit),
        RevisionsCommand::Revert {
            server,
            db,
            id,
            etag,
        } => {
            let path = format!(
                "/dbs/{}/revisions/revert/{}?etag={}",
                path_escape(&db),
                path_escape(&id),
                query_escape(&etag)
            );
            server.endpoint()?.request("POST", &path, b"")?
        }
        RevisionsCommand::Purge { server, db, id } => {
            let path = docs_path(&db, &id);
            server.endpoint()?.request("DELETE", &path, b"")?
        }
        RevisionsCommand::Config { server, db, set } => {
            let path = format!("/dbs/{}/revisions/config", path_escape(&db));
            match set {
                Some(json) => server.endpoint()?.request("PUT", &path, json.as_bytes())?,
                None => server.endpoint()?.request("GET", &path, b"")?,
            }
        }
    };
    let answer: Value = serde_json::from_slice(&answer)?;
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}

fn docs_path(db: &str, id: &str) -> String {
    format!(
        "/dbs/{}/revisions/docs/{}",
        path_escape(db),
        path_escape(id)
    )
}

/// Follows the pages' continuations until `limit` revisions or the last page.
fn list(endpoint: &Endpoint, db: &str, id: &str, limit: Option<usize>) -> AnyResult<()> {
    let mut left = limit.unwrap_or(usize::MAX);
    let mut continuation: Option<String> = None;
    while left > 0 {
        let mut path = format!("{}?limit={}", docs_path(db, id), left.min(100));
        if let Some(etag) = &continuation {
            path.push_str(&format!("&continuation={}", query_escape(etag)));
        }
        let page: Value = serde_json::from_slice(&endpoint.request("GET", &path, b"")?)?;
        for revision in page["revisions"].as_array().into_iter().flatten() {
            println!("{revision}");
            left = left.saturating_sub(1);
        }
        match page["continuation"].as_str() {
            Some(next) => continuation = Some(next.to_string()),
            None => break,
        }
    }
    Ok(())
}
