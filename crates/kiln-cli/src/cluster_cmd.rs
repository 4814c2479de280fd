//! `kiln cluster status|add|promote|remove --url U`: a cluster's members. The
//! changes go to the leader, wherever `--url` points: the command asks the node
//! at `--url` which node leads and sends the change there.

use crate::client::{Endpoint, ServerArgs};
use clap::Subcommand;
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Print the cluster as the node at --url sees it (JSON).
    Status {
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Add a node as a learner (start it first with the same --cluster list plus
    /// itself); returns once it has caught up.
    Add {
        #[command(flatten)]
        server: ServerArgs,
        /// The new node's id.
        #[arg(long)]
        id: u64,
        /// Its address as the other nodes reach it (HOST:PORT).
        #[arg(long)]
        address: String,
    },
    /// Make a learner a voter.
    Promote {
        #[command(flatten)]
        server: ServerArgs,
        /// The learner's node id.
        #[arg(long)]
        id: u64,
    },
    /// Remove a node (voter or learner) from the cluster.
    Remove {
        #[command(flatten)]
        server: ServerArgs,
        /// The node's id.
        #[arg(long)]
        id: u64,
    },
    /// Hand leadership to another voter (before restarting the leader's machine):
    /// waits until it has caught up, has it elected, returns once it leads.
    TransferLeader {
        #[command(flatten)]
        server: ServerArgs,
        /// The voter to lead.
        #[arg(long)]
        to: u64,
    },
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

pub fn run(cmd: ClusterCommand) -> AnyResult<()> {
    let answer = match cmd {
        ClusterCommand::Status { server } => {
            let body = server.endpoint()?.request("GET", "/cluster", b"")?;
            serde_json::from_slice::<Value>(&body)?
        }
        ClusterCommand::Add {
            server,
            id,
            address,
        } => {
            let body = json!({"id": id, "address": address}).to_string();
            on_leader(&server, "POST", "/cluster/members", body.as_bytes())?
        }
        ClusterCommand::Promote { server, id } => on_leader(
            &server,
            "POST",
            &format!("/cluster/members/{id}/promote"),
            b"",
        )?,
        ClusterCommand::Remove { server, id } => {
            on_leader(&server, "DELETE", &format!("/cluster/members/{id}"), b"")?
        }
        ClusterCommand::TransferLeader { server, to } => on_leader(
            &server,
            "POST",
            "/cluster/leader",
            serde_json::json!({ "id": to }).to_string().as_bytes(),
        )?,
    };
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}

/// Sends a change to the node at `--url`, or, if it is a follower (307
/// `not_leader`), to the leader it names; the answer's JSON.
pub(crate) fn write_following_leader(
    server: &ServerArgs,
    method: &str,
    path: &str,
    body: &[u8],
) -> AnyResult<Value> {
    let (status, answer) = server.endpoint()?.request_any(method, path, body)?;
    if status == 307 {
        return on_leader(server, method, path, body);
    }
    if !(200..300).contains(&status) {
        return Err(crate::client::ClientError::status(status, &answer).into());
    }
    Ok(serde_json::from_slice(&answer)?)
}

/// Sends a membership change to the leader the node at `--url` names.
fn on_leader(server: &ServerArgs, method: &str, path: &str, body: &[u8]) -> AnyResult<Value> {
    let leader_endpoint = leader_of(server)?;
    Ok(serde_json::from_slice(
        &leader_endpoint.request(method, path, body)?,
    )?)
}

/// Where to send a write that streams a body (`kiln restore --url`): the leader
/// the node at `--url` names, or that node itself when it is not in a cluster.
pub(crate) fn leader_or_self(server: &ServerArgs) -> AnyResult<Endpoint> {
    let here = server.endpoint()?;
    let (status, body) = here.request_any("GET", "/cluster", b"")?;
    match status {
        404 => Ok(here), // not_clustered: a single server
        200..=299 => leader_in(server, &serde_json::from_slice(&body)?),
        _ => Err(crate::client::ClientError::status(status, &body).into()),
    }
}

/// The leader's endpoint, as the node at `--url` names it.
fn leader_of(server: &ServerArgs) -> AnyResult<Endpoint> {
    let here = server.endpoint()?;
    let status: Value = serde_json::from_slice(&here.request("GET", "/cluster", b"")?)?;
    leader_in(server, &status)
}

/// The leader's endpoint in `status` (a node's `GET /cluster`).
fn leader_in(server: &ServerArgs, status: &Value) -> AnyResult<Endpoint> {
    let leader = status["leader"]
        .as_u64()
        .ok_or("the cluster has no leader at the moment; retry")?;
    let address = status["members"]
        .as_array()
        .and_then(|members| {
            members
                .iter()
                .find(|m| m["id"].as_u64() == Some(leader))
                .and_then(|m| m["address"].as_str())
        })
        .ok_or("the leader is not among the members the node lists")?;
    let scheme = server.url.split_once("://").map_or("http", |(s, _)| s);
    Ok(Endpoint::parse(
        &format!("{scheme}://{address}"),
        server.api_key.clone(),
        &server.tls,
    )?)
}
