//! Raft's messages between nodes: HTTP/1.1 POSTs to
//! `http://<node address>/cluster/raft/{append,vote,snapshot,elect}`. The receiving
//! side is [`handle_rpc`], which the server mounts on those routes; its body is
//! the JSON of `Result<response, RaftError>`, so that a refusal by the remote
//! Raft (a higher term, ...) comes back as Raft's own error.
//!
//! With TLS, the nodes reach each other over `https://` and check each other's
//! certificate against the cluster's CA; with a cluster key, every message carries
//! it ([`CLUSTER_KEY_HEADER`]) and the receiving server refuses one without it.
//!
//! Appends and votes are JSON. A snapshot chunk (megabytes) is binary, see
//! [`encode_snapshot_chunk`]: JSON would spell each byte as a number.

use crate::codec::CodecError;
use crate::{NodeId, Raft, TypeConfig};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The path prefix of Raft's routes on every node.
pub const RAFT_PATH: &str = "/cluster/raft";

/// The header naming the sending node on every Raft message: for the receiver's
/// logs, and for a fault proxy in front of a node that cuts one link of several.
pub const FROM_NODE_HEADER: &str = "kiln-from-node";

/// The header carrying the cluster's key on every Raft message.
pub const CLUSTER_KEY_HEADER: &str = "kiln-cluster-key";

/// How a node reaches the others.
#[derive(Clone, Default)]
pub struct PeerSecurity {
    /// TLS to the other nodes, with the roots their certificates chain to; plain
    /// HTTP when `None`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The cluster's shared secret, sent with every message.
    pub cluster_key: Option<Arc<str>>,
}

impl std::fmt::Debug for PeerSecurity {
    // Never the key itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerSecurity")
            .field("tls", &self.tls.is_some())
            .field("cluster_key", &self.cluster_key.is_some())
            .finish()
    }
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Whether this node may send to a node (`from`, `to`): a fault-injection seam
/// for tests of partitions. Cutting both directions of a link at the senders cuts
/// it (every exchange starts at its sender).
pub type LinkFilter = Arc<dyn Fn(NodeId, NodeId) -> bool + Send + Sync>;

/// Makes a client per peer; all share one connection pool.
#[derive(Clone)]
pub struct Network {
    client: HttpClient,
    from: NodeId,
    links: Option<LinkFilter>,
    security: PeerSecurity,
    health: Arc<PeerHealth>,
}

/// Whether each peer answered this node's last message. Raft retries an unreachable
/// peer every few hundred milliseconds (and openraft says so at ERROR each time): a
/// peer going away or coming back is one line here instead, at WARN and INFO.
struct PeerHealth {
    from: NodeId,
    links: parking_lot::Mutex<BTreeMap<NodeId, Link>>,
    /// Peers that refused a binary message as malformed: a build from before the
    /// binary form (`codec`), during a rolling upgrade. They are sent JSON, which
    /// every build reads, until they stop answering (a restart, likely onto a
    /// newer build: tried in binary again).
    json_only: parking_lot::Mutex<std::collections::BTreeSet<NodeId>>,
}

enum Link {
    Answering,
    Silent {
        since: Instant,
        failed_messages: u64,
        /// False while a peer was never reached: at a cluster's start, the nodes
        /// not started yet (normal, so INFO rather than WARN).
        ever_answered: bool,
    },
}

impl PeerHealth {
    fn answered(&self, peer: NodeId, address: &str) {
        let before = self.links.lock().insert(peer, Link::Answering);
        if let Some(Link::Silent {
            since,
            failed_messages,
            ever_answered,
        }) = before
        {
            let silent_ms = since.elapsed().as_millis() as u64;
            if ever_answered {
                tracing::info!(
                    node = self.from,
                    peer,
                    address,
                    silent_ms,
                    failed_messages,
                    "peer answers again"
                );
            } else {
                tracing::info!(node = self.from, peer, address, silent_ms, "peer reached");
            }
        }
    }

    fn failed(&self, peer: NodeId, address: &str, error: &dyn std::fmt::Display) {
        let mut links = self.links.lock();
        match links.get_mut(&peer) {
            Some(Link::Silent {
                failed_messages, ..
            }) => *failed_messages += 1,
            known => {
                let ever_answered = known.is_some();
                if ever_answered {
                    tracing::warn!(node = self.from, peer, address, error = %error, "peer unreachable; Raft keeps retrying, and a line follows when it answers");
                } else {
                    tracing::info!(node = self.from, peer, address, error = %error, "peer not reachable yet (not started?); Raft keeps retrying");
                }
                links.insert(
                    peer,
                    Link::Silent {
                        since: Instant::now(),
                        failed_messages: 1,
                        ever_answered,
                    },
                );
            }
        }
    }
}

impl Network {
    pub fn new(from: NodeId, links: Option<LinkFilter>, security: PeerSecurity) -> Network {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_millis(500)));
        // `enforce_http(false)`: the https connector wraps it and decides.
        connector.enforce_http(false);
        let tls = match &security.tls {
            Some(config) => config.as_ref().clone(),
            // Never used (the URLs are http://), but the connector wants one.
            None => rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        Network {
            client: Client::builder(TokioExecutor::new()).build(connector),
            from,
            links,
            security,
            health: Arc::new(PeerHealth {
                from,
                links: parking_lot::Mutex::new(BTreeMap::new()),
                json_only: parking_lot::Mutex::default(),
            }),
        }
    }
}

impl Network {
    fn peer(&self, target: NodeId, address: &str) -> Peer {
        Peer {
            target,
            address: address.to_string(),
            client: self.client.clone(),
            from: self.from,
            links: self.links.clone(),
            security: self.security.clone(),
            health: self.health.clone(),
        }
    }

    /// Asks node `target` (at `address`) whether it would vote for this node
    /// (`prevote`); an error (it is down, cut off, of an older build) is a no.
    pub async fn pre_vote(
        &self,
        target: NodeId,
        address: &str,
        req: &crate::prevote::PreVoteRequest,
        timeout: Duration,
    ) -> Result<crate::prevote::PreVoteResponse, String> {
        self.peer(target, address)
            .call::<_, crate::prevote::PreVoteResponse, openraft::error::Infallible>(
                "prevote",
                req,
                RPCOption::new(timeout),
            )
            .await
            .map_err(|e| e.to_string())
    }

    /// Asks node `target` (at `address`) to stand for election at once: how the
    /// leader hands leadership to a node whose log has caught up with its own.
    pub async fn ask_to_elect(
        &self,
        target: NodeId,
        address: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        self.peer(target, address)
            .call_raw::<(), openraft::error::Infallible>(
                "elect",
                Ok(b"null".to_vec()),
                RPCOption::new(timeout),
            )
            .await
            .map_err(|e| e.to_string())
    }
}

pub struct Peer {
    target: NodeId,
    address: String,
    client: HttpClient,
    from: NodeId,
    links: Option<LinkFilter>,
    security: PeerSecurity,
    health: Arc<PeerHealth>,
}

/// A link a test has cut.
#[derive(Debug, thiserror::Error)]
#[error("the link from node {from} to node {to} is cut")]
struct LinkCut {
    from: NodeId,
    to: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        self.peer(target, &node.addr)
    }
}

/// Why a message did not get an answer from the remote Raft.
#[derive(Debug, thiserror::Error)]
enum Transport {
    #[error("POST {url}: {source}")]
    Send {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("POST {url}: no answer within {ttl_ms} ms")]
    Timeout { url: String, ttl_ms: u128 },
    #[error("POST {url}: the answer was cut off: {source}")]
    Body {
        url: String,
        #[source]
        source: hyper::Error,
    },
    #[error("POST {url}: answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("POST {url}: unreadable answer: {source}")]
    Decode {
        url: String,
        #[source]
        source: CodecError,
    },
    #[error("encoding the request: {0}")]
    Encode(#[source] CodecError),
}

impl Peer {
    /// Sends one message; `Ok` holds what the remote Raft answered.
    async fn post<Resp: DeserializeOwned>(
        &self,
        kind: &str,
        body: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, Transport> {
        let scheme = if self.security.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let url = format!("{scheme}://{}{RAFT_PATH}/{kind}", self.address);
        let content_type = if kind == "snapshot" {
            "application/octet-stream"
        } else {
            crate::codec::content_type(&body)
        };
        let mut http = hyper::Request::post(&url)
            .header("content-type", content_type)
            .header(FROM_NODE_HEADER, self.from);
        if let Some(key) = &self.security.cluster_key {
            http = http.header(CLUSTER_KEY_HEADER, key.as_ref());
        }
        let http = http
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| Transport::Status {
                url: url.clone(),
                status: 0,
                body: e.to_string(),
            })?;
        let ttl = option.hard_ttl();
        let exchange = async {
            let answer = self
                .client
                .request(http)
                .await
                .map_err(|source| Transport::Send {
                    url: url.clone(),
                    source,
                })?;
            let status = answer.status().as_u16();
            let bytes = answer
                .into_body()
                .collect()
                .await
                .map_err(|source| Transport::Body {
                    url: url.clone(),
                    source,
                })?
                .to_bytes();
            if status != 200 {
                return Err(Transport::Status {
                    url: url.clone(),
                    status,
                    body: String::from_utf8_lossy(&bytes).into_owned(),
                });
            }
            crate::codec::decode(&bytes).map_err(|source| Transport::Decode {
                url: url.clone(),
                source,
            })
        };
        match tokio::time::timeout(ttl, exchange).await {
            Ok(result) => result,
            Err(_) => Err(Transport::Timeout {
                url,
                ttl_ms: ttl.as_millis(),
            }),
        }
    }

    /// Sends `message` in the binary form, or in JSON to a peer known to read
    /// only JSON (`PeerHealth::json_only`); a peer that refuses the binary form
    /// as malformed is marked so and sent the message again in JSON at once.
    async fn call<Req: Serialize + Sync, Resp: DeserializeOwned, E>(
        &self,
        kind: &str,
        message: &Req,
        option: RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        E: std::error::Error + DeserializeOwned,
    {
        let json_only = self.health.json_only.lock().contains(&self.target);
        let encode = |json: bool| {
            let encoded = if json {
                crate::codec::encode_like(b"{", message)
            } else {
                crate::codec::encode(message)
            };
            encoded.map_err(|e| RPCError::Network(NetworkError::new(&Transport::Encode(e))))
        };
        let answer = self.exchange(kind, encode(json_only)?, &option).await?;
        let answer = match answer {
            Err(Transport::Status {
                status: 400, body, ..
            }) if !json_only && body.contains("malformed Raft message") => {
                tracing::info!(
                    node = self.from,
                    peer = self.target,
                    address = %self.address,
                    "peer refuses the binary form (an older build): speaking JSON to it"
                );
                self.health.json_only.lock().insert(self.target);
                self.exchange(kind, encode(true)?, &option).await?
            }
            other => other,
        };
        self.settle(answer)
    }

    /// Sends a body already encoded (a snapshot chunk, the same in every build).
    async fn call_raw<Resp: DeserializeOwned, E>(
        &self,
        kind: &str,
        body: Result<Vec<u8>, CodecError>,
        option: RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        E: std::error::Error + DeserializeOwned,
    {
        let body = body.map_err(|e| RPCError::Network(NetworkError::new(&Transport::Encode(e))))?;
        let answer = self.exchange(kind, body, &option).await?;
        self.settle(answer)
    }

    /// One exchange, unless a test cut the link (then the peer is unreachable).
    async fn exchange<Resp: DeserializeOwned, E>(
        &self,
        kind: &str,
        body: Vec<u8>,
        option: &RPCOption,
    ) -> Result<
        Result<Result<Resp, RaftError<NodeId, E>>, Transport>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, E>>,
    >
    where
        E: std::error::Error + DeserializeOwned,
    {
        if let Some(links) = &self.links {
            if !links(self.from, self.target) {
                let cut = LinkCut {
                    from: self.from,
                    to: self.target,
                };
                self.health.failed(self.target, &self.address, &cut);
                return Err(RPCError::Unreachable(Unreachable::new(&cut)));
            }
        }
        Ok(self.post(kind, body, option).await)
    }

    /// A message's result as Raft wants it: the remote's answer or refusal, or
    /// the node unreachable (Raft backs off) or the exchange failed (it retries).
    fn settle<Resp, E>(
        &self,
        answer: Result<Result<Resp, RaftError<NodeId, E>>, Transport>,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        E: std::error::Error,
    {
        match &answer {
            Ok(_) => self.health.answered(self.target, &self.address),
            Err(e) => {
                if matches!(e, Transport::Send { .. }) {
                    // Not answering: when it answers again it may run another build.
                    self.health.json_only.lock().remove(&self.target);
                }
                self.health.failed(self.target, &self.address, e)
            }
        }
        match answer {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(refused)) => Err(RPCError::RemoteError(RemoteError::new(
                self.target,
                refused,
            ))),
            Err(e @ Transport::Send { .. }) => Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call("append", &rpc, option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call_raw(
            "snapshot",
            encode_snapshot_chunk(rpc).map_err(CodecError::EncodeJson),
            option,
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call("vote", &rpc, option).await
    }
}

/// An RPC the server could not hand to Raft.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("no Raft message kind {0:?} (append, vote, snapshot, prevote, elect)")]
    UnknownKind(String),
    #[error("malformed Raft message: {0}")]
    Malformed(#[from] CodecError),
    #[error("a JSON part of a Raft message (snapshot chunk header, answer): {0}")]
    Json(#[from] serde_json::Error),
    #[error("malformed snapshot chunk: {0}")]
    MalformedChunk(&'static str),
}

/// A snapshot chunk's wire form: `header length u32 (big-endian) | header | data`,
/// the header being the request's JSON without its data.
pub fn encode_snapshot_chunk(
    mut rpc: InstallSnapshotRequest<TypeConfig>,
) -> Result<Vec<u8>, serde_json::Error> {
    let data = std::mem::take(&mut rpc.data);
    let header = serde_json::to_vec(&rpc)?;
    let mut body = Vec::with_capacity(4 + header.len() + data.len());
    body.extend_from_slice(&(header.len() as u32).to_be_bytes());
    body.extend_from_slice(&header);
    body.extend_from_slice(&data);
    Ok(body)
}

fn decode_snapshot_chunk(body: &[u8]) -> Result<InstallSnapshotRequest<TypeConfig>, RpcError> {
    let (len, rest) = body
        .split_first_chunk::<4>()
        .ok_or(RpcError::MalformedChunk("shorter than its header length"))?;
    let header_len = u32::from_be_bytes(*len) as usize;
    if rest.len() < header_len {
        return Err(RpcError::MalformedChunk("shorter than its header"));
    }
    let (header, data) = rest.split_at(header_len);
    let mut rpc: InstallSnapshotRequest<TypeConfig> = serde_json::from_slice(header)?;
    rpc.data = data.to_vec();
    Ok(rpc)
}

/// Hands one received message (`kind` = the last path segment) to the local Raft
/// and returns the body to answer with, in the form the message came in
/// (`codec::encode_like`: an older peer's JSON is answered in JSON; its media type
/// is `codec::content_type` of it).
pub async fn handle_rpc(raft: &Raft, kind: &str, body: &[u8]) -> Result<Vec<u8>, RpcError> {
    handle_rpc_with(raft, None, kind, body).await
}

/// [`handle_rpc`] for a node with its elections (`prevote`): the messages that
/// show a leader (an append or a snapshot chunk taken, a vote granted) restart
/// its election timer, and `prevote` is answered.
pub async fn handle_rpc_with(
    raft: &Raft,
    elections: Option<&crate::prevote::Elections>,
    kind: &str,
    body: &[u8],
) -> Result<Vec<u8>, RpcError> {
    use crate::codec::{decode, encode_like};
    let heard = |yes: bool| {
        if let (true, Some(e)) = (yes, elections) {
            e.heard_from_leader();
        }
    };
    Ok(match kind {
        "append" => {
            let rpc: AppendEntriesRequest<TypeConfig> = decode(body)?;
            let answer = raft.append_entries(rpc).await;
            heard(matches!(
                &answer,
                Ok(r) if !matches!(r, openraft::raft::AppendEntriesResponse::HigherVote(_))
            ));
            encode_like(body, &answer)?
        }
        "vote" => {
            let rpc: VoteRequest<NodeId> = decode(body)?;
            let answer = raft.vote(rpc).await;
            heard(matches!(&answer, Ok(r) if r.vote_granted));
            encode_like(body, &answer)?
        }
        "snapshot" => {
            // The chunk's own framing (a JSON header); answered in JSON, which
            // every build reads.
            let rpc = decode_snapshot_chunk(body)?;
            let sender = rpc.vote;
            let answer = raft.install_snapshot(rpc).await;
            // A chunk of a deposed leader is answered with this node's newer vote.
            heard(matches!(&answer, Ok(r) if r.vote == sender));
            serde_json::to_vec(&answer)?
        }
        "prevote" => {
            let Some(elections) = elections else {
                return Err(RpcError::UnknownKind(kind.to_string()));
            };
            let rpc: crate::prevote::PreVoteRequest = decode(body)?;
            let answer: Result<_, RaftError<NodeId>> = Ok(elections.answer(raft, &rpc));
            serde_json::to_vec(&answer)?
        }
        // The leader hands leadership over ([`Network::ask_to_elect`]): this node
        // stands for election now instead of at its election timeout.
        "elect" => {
            let called: Result<(), RaftError<NodeId>> =
                raft.trigger().elect().await.map_err(RaftError::Fatal);
            serde_json::to_vec(&called)?
        }
        other => return Err(RpcError::UnknownKind(other.to_string())),
    })
}
