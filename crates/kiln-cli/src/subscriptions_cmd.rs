//! `kiln subscriptions list|get|create|delete --url U --db DB`: a server's data
//! subscriptions (the routes under `/dbs/{db}/subscriptions`, docs/http-api.md).
//! Workers connect over WebSocket (the Python client's `subscription.run`), not
//! through this command. In a cluster, a creation or deletion sent to a follower
//! is sent again to the leader it names (it goes through the log to every node).

use crate::client::{path_escape, ServerArgs};
use clap::Subcommand;
use serde_json::{json, Map, Value};

#[derive(Subcommand)]
pub enum SubscriptionsCommand {
    /// List the subscriptions: name, position (the etag acknowledged up to),
    /// whether a worker is connected, the query.
    List {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// Print the server's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Print one subscription (JSON).
    Get {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// The subscription's name.
        name: String,
    },
    /// Create a subscription: `kiln subscriptions create --url U --db DB big-orders
    /// "from orders where total > 100"`.
    Create {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// The new subscription's name (unique in the database).
        name: String,
        /// `from <collection> [where ...]` in the query language.
        query: String,
        /// Parameters of the query as a JSON object, e.g. '{"min": 100}'.
        #[arg(long)]
        params: Option<String>,
        /// Where it starts: beginning (every document), now (only later writes),
        /// or an etag (the writes after it).
        #[arg(long, default_value = "beginning")]
        start: String,
        /// Print the server's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Delete a subscription (its connected worker is closed).
    Delete {
        #[command(flatten)]
        server: ServerArgs,
        /// The database.
        #[arg(long)]
        db: String,
        /// The subscription's name.
        name: String,
        /// Print the server's JSON answer.
        #[arg(long)]
        json: bool,
    },
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn base(db: &str) -> String {
    format!("/dbs/{}/subscriptions", path_escape(db))
}

fn subscription_path(db: &str, name: &str) -> String {
    format!("{}/{}", base(db), path_escape(name))
}

/// The server's JSON answer to `method path` with `body`.
fn request_json(server: &ServerArgs, method: &str, path: &str, body: &[u8]) -> AnyResult<Value> {
    Ok(serde_json::from_slice(
        &server.endpoint()?.request(method, path, body)?,
    )?)
}

pub fn run(cmd: SubscriptionsCommand) -> AnyResult<()> {
    match cmd {
        SubscriptionsCommand::List { server, db, json } => list(&server, &db, json),
        SubscriptionsCommand::Get { server, db, name } => get(&server, &db, &name),
        SubscriptionsCommand::Create {
            server,
            db,
            name,
            query,
            params,
            start,
            json,
        } => {
            let body = create_body(name, query, params.as_deref(), start)?;
            create(&server, &db, &body, json)
        }
        SubscriptionsCommand::Delete {
            server,
            db,
            name,
            json,
        } => delete(&server, &db, &name, json),
    }
}

/// `list`: one subscription a line, or the server's JSON answer.
fn list(server: &ServerArgs, db: &str, json: bool) -> AnyResult<()> {
    let answer = request_json(server, "GET", &base(db), b"")?;
    if json {
        println!("{answer}");
        return Ok(());
    }
    let subs = answer["subscriptions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if subs.is_empty() {
        println!("no subscriptions");
    }
    for s in subs {
        println!(
            "{}  position {}  {}  {}",
            s["name"].as_str().unwrap_or("?"),
            s["position"].as_str().unwrap_or("(beginning)"),
            if s["connected"] == true {
                "connected"
            } else {
                "idle"
            },
            s["query"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

/// `get`: the subscription `name`, as pretty JSON.
fn get(server: &ServerArgs, db: &str, name: &str) -> AnyResult<()> {
    let answer = request_json(server, "GET", &subscription_path(db, name), b"")?;
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}

/// The body of a `create`: `params` (a JSON object) checked here.
fn create_body(
    name: String,
    query: String,
    params: Option<&str>,
    start: String,
) -> AnyResult<Value> {
    let parameters: Map<String, Value> = match params {
        Some(p) => {
            serde_json::from_str(p).map_err(|e| crate::UsageError(format!("--params: {e}")))?
        }
        None => Map::new(),
    };
    Ok(json!({"name": name, "query": query, "parameters": parameters, "start": start}))
}

/// `create`: the subscription `body` describes, with a line on what it is, or
/// the server's JSON answer.
fn create(server: &ServerArgs, db: &str, body: &Value, json: bool) -> AnyResult<()> {
    let answer = crate::cluster_cmd::write_following_leader(
        server,
        "POST",
        &base(db),
        body.to_string().as_bytes(),
    )?;
    if json {
        println!("{answer}");
    } else {
        println!(
            "created subscription {} on collection {} (position {})",
            answer["name"].as_str().unwrap_or("?"),
            answer["collection"].as_str().unwrap_or("?"),
            answer["position"].as_str().unwrap_or("(beginning)")
        );
    }
    Ok(())
}

/// `delete`: the subscription `name`, with a line saying so, or the server's JSON
/// answer.
fn delete(server: &ServerArgs, db: &str, name: &str, json: bool) -> AnyResult<()> {
    let answer = crate::cluster_cmd::write_following_leader(
        server,
        "DELETE",
        &subscription_path(db, name),
        b"",
    )?;
    if json {
        println!("{answer}");
    } else {
        println!("deleted subscription {name}");
    }
    Ok(())
}
