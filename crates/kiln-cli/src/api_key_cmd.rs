//! `kiln api-key create|list|revoke`: offline in a data directory (`--data-dir`,
//! the server need not run: it re-reads its key file), or through a running
//! server (`--url`, an operator's key), which is how a cluster's keys are made:
//! the change goes through the log to every node. A change sent to a follower is
//! sent again to the leader.

use crate::client::{ServerArgs, TlsArgs};
use clap::{Args, Subcommand};
use kiln_server::access::{Clearance, DbGrant};
use kiln_server::auth;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Where the keys are: a data directory, or a server.
#[derive(Args)]
pub struct KeysAt {
    /// The server's data directory (the keys live in its api-keys.json).
    #[arg(long, default_value = "./kiln-data")]
    data_dir: PathBuf,
    /// A running server instead (an operator's key in --api-key): in a cluster,
    /// the change reaches every node.
    #[arg(long, conflicts_with = "data_dir")]
    url: Option<String>,
    /// API key for --url (sent as `Authorization: Bearer`).
    #[arg(long, env = "KILN_API_KEY", hide_env_values = true, requires = "url")]
    api_key: Option<String>,
    #[command(flatten)]
    tls: TlsArgs,
}

impl KeysAt {
    fn server(&self) -> Option<ServerArgs> {
        self.url.as_ref().map(|url| ServerArgs {
            url: url.clone(),
            api_key: self.api_key.clone(),
            tls: self.tls.clone(),
        })
    }
}

#[derive(Subcommand)]
pub enum ApiKeyCommand {
    /// Create a key and print it (the only time it is shown), or register a
    /// client certificate (--certificate); either with --operator or --db grants.
    Create {
        #[command(flatten)]
        at: KeysAt,
        /// A name to recognise the key by (two may share one during a rotation).
        #[arg(long)]
        name: String,
        /// Everything: every database, server statistics and metrics, the cluster.
        #[arg(long, conflicts_with = "db", required_unless_present = "db")]
        operator: bool,
        /// DATABASE:ACCESS, repeated: a name or a prefix pattern (`shop-*`, `*`),
        /// and read, read_write or admin (admin: indexes, backups, restores,
        /// revisions' config and purges, subscriptions, create/delete the database).
        #[arg(long, value_parser = parse_grant)]
        db: Vec<DbGrant>,
        /// Register this PEM client certificate (its first certificate) instead of
        /// making a key: a connection presenting it (signed by --tls-client-ca)
        /// gets these permissions.
        #[arg(long)]
        certificate: Option<PathBuf>,
    },
    /// List keys (ids and names; never secrets).
    List {
        #[command(flatten)]
        at: KeysAt,
    },
    /// Revoke a key by id; a running server notices within a request (every node
    /// of a cluster, with --url).
    Revoke {
        #[command(flatten)]
        at: KeysAt,
        /// The key's id (the part after `kiln_`, as `kiln api-key list` shows it).
        id: String,
    },
}

fn parse_grant(text: &str) -> Result<DbGrant, String> {
    DbGrant::parse(text).map_err(|e| e.to_string())
}

pub fn api_key(cmd: ApiKeyCommand) -> crate::AnyResult<()> {
    match cmd {
        ApiKeyCommand::Create {
            at,
            name,
            operator,
            db,
            certificate,
        } => {
            let clearance = if operator {
                Clearance::Operator
            } else {
                Clearance::Databases(db)
            };
            match at.server() {
                Some(server) => create_remote(&server, &name, &clearance, certificate.as_deref()),
                None => create_offline(&at.data_dir, &name, clearance, certificate.as_deref()),
            }
        }
        ApiKeyCommand::List { at } => {
            let keys = match at.server() {
                Some(server) => list_remote(&server)?,
                None => list_offline(&at.data_dir)?,
            };
            for k in keys {
                println!("{}", list_line(&k));
            }
            Ok(())
        }
        ApiKeyCommand::Revoke { at, id } => {
            match at.server() {
                Some(server) => {
                    let path = format!("/admin/api-keys/{}", crate::client::path_escape(&id));
                    crate::cluster_cmd::write_following_leader(&server, "DELETE", &path, b"")?;
                }
                None => auth::revoke_api_key(&at.data_dir, &id)?,
            }
            println!("revoked {id}");
            Ok(())
        }
    }
}

fn create_offline(
    data_dir: &Path,
    name: &str,
    clearance: Clearance,
    certificate: Option<&Path>,
) -> crate::AnyResult<()> {
    match certificate {
        Some(pem) => {
            let rec = auth::register_certificate(data_dir, name, clearance, pem)?;
            println!(
                "registered certificate {} as {} ({}): {}",
                rec.certificate_sha256.as_deref().unwrap_or_default(),
                rec.id,
                rec.name,
                rec.clearance
            );
        }
        None => {
            let (rec, key) = auth::create_api_key(data_dir, name, clearance)?;
            eprintln!(
                "created key {} ({}: {}); store it now, it is not kept:",
                rec.id, rec.name, rec.clearance
            );
            println!("{key}");
        }
    }
    Ok(())
}

fn create_remote(
    server: &ServerArgs,
    name: &str,
    clearance: &Clearance,
    certificate: Option<&Path>,
) -> crate::AnyResult<()> {
    let mut body = json!({"name": name});
    match clearance {
        Clearance::Operator => body["operator"] = true.into(),
        Clearance::Databases(grants) => {
            let grants: Vec<String> = grants
                .iter()
                .map(|g| format!("{}:{}", g.database, g.access.as_str()))
                .collect();
            body["grants"] = grants.into();
        }
    }
    if let Some(pem) = certificate {
        let text = std::fs::read_to_string(pem)
            .map_err(|e| format!("reading the certificate {}: {e}", pem.display()))?;
        body["certificate_pem"] = text.into();
    }
    let answer = crate::cluster_cmd::write_following_leader(
        server,
        "POST",
        "/admin/api-keys",
        body.to_string().as_bytes(),
    )?;
    let (id, clearance) = (text_of(&answer, "id"), clearance_of(&answer));
    match answer["key"].as_str() {
        Some(key) => {
            eprintln!("created key {id} ({name}: {clearance}); store it now, it is not kept:");
            println!("{key}");
        }
        None => println!(
            "registered certificate {} as {id} ({name}): {clearance}",
            text_of(&answer, "certificate_sha256")
        ),
    }
    Ok(())
}

fn text_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field].as_str().unwrap_or_default()
}

/// A record's clearance as `kiln api-key list` prints it.
fn clearance_of(record: &Value) -> String {
    serde_json::from_value::<Clearance>(record["clearance"].clone())
        .map_or_else(|_| record["clearance"].to_string(), |c| c.to_string())
}

/// The keys of a data directory, as the server lists them.
fn list_offline(data_dir: &Path) -> crate::AnyResult<Vec<Value>> {
    if !data_dir.is_dir() {
        return Err(crate::exit::NotFound(format!(
            "{} is not a data directory (give --data-dir of the server, or --url)",
            data_dir.display()
        ))
        .into());
    }
    let keys = auth::list_api_keys(data_dir)?;
    if keys.is_empty() {
        eprintln!(
            "no API keys in {} (create one with `kiln api-key create`)",
            data_dir.display()
        );
    }
    Ok(keys
        .iter()
        .map(|k| {
            json!({"id": k.id, "name": k.name, "certificate_sha256": k.certificate_sha256,
                   "clearance": k.clearance, "created_ms": k.created_ms})
        })
        .collect())
}

fn list_remote(server: &ServerArgs) -> crate::AnyResult<Vec<Value>> {
    let answer: Value =
        serde_json::from_slice(&server.endpoint()?.request("GET", "/admin/api-keys", b"")?)?;
    Ok(answer["keys"].as_array().cloned().unwrap_or_default())
}

/// `id  name  key|certificate <thumbprint>  clearance  created <time>`.
fn list_line(k: &Value) -> String {
    let created = kiln_docs::format_rfc3339_ms(k["created_ms"].as_u64().unwrap_or(0));
    let kind = match k["certificate_sha256"].as_str() {
        Some(thumbprint) => format!("certificate {thumbprint}"),
        None => "key".to_string(),
    };
    format!(
        "{}\t{}\t{kind}\t{}\tcreated {created}",
        text_of(k, "id"),
        text_of(k, "name"),
        clearance_of(k)
    )
}
