//! A fault proxy between the nodes of a cluster: one TCP relay in front of each
//! node, which the other nodes reach it through (their `--cluster` names the
//! relays; each node binds its own port, where the tests' clients talk to it).
//!
//! Every Raft message is an HTTP/1.1 POST carrying `kiln-from-node: <sender>`,
//! and a connection from a node's pool only carries that node's messages to one
//! destination: so the relay reads the first request's head of each connection
//! it accepts, learns the link (sender, destination) from it, and then splices
//! both directions. A link can be cut (new connections closed at once, open ones
//! shut down), held (nothing forwarded, nothing closed: the sender waits, as
//! behind a partition that drops packets), or delayed; healed, it forwards again.
//! A connection without the header (a client) is never faulted.
#![allow(dead_code)] // each test binary uses its own part of this module
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The header naming the sender of a Raft message (kiln-cluster's FROM_NODE_HEADER).
const FROM_NODE_HEADER: &str = "kiln-from-node";

/// What a link (sender, destination) does to its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// New connections are closed once their first request's head is read; the
    /// open ones are shut down.
    Cut,
    /// Nothing is forwarded either way, and nothing closed, until healed.
    Hold,
    /// Every chunk, either way, is forwarded after this long.
    Delay(Duration),
}

/// What went through one link, for a test to show its traffic took the relays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounts {
    /// Connections forwarded to the node.
    pub forwarded: u64,
    /// Connections closed because the link was cut.
    pub refused: u64,
}

/// One connection being spliced: its two sockets (clones, to shut them down).
struct Spliced {
    from: Option<u64>,
    to: u64,
    sockets: [TcpStream; 2],
}

#[derive(Default)]
struct State {
    /// The node each relay forwards to (its real port), once known.
    upstreams: BTreeMap<u64, u16>,
    faults: HashMap<(u64, u64), Fault>,
    open: HashMap<u64, Spliced>,
    next_connection: u64,
    counts: HashMap<(u64, u64), LinkCounts>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled whenever a fault changes (held connections look again).
    changed: Condvar,
    stopping: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits while the link is held; then its fault (`None`: open).
    fn pass(&self, from: Option<u64>, to: u64) -> Option<Fault> {
        let from = from?;
        let mut state = self.lock();
        loop {
            if self.stopping.load(Ordering::Relaxed) {
                return Some(Fault::Cut);
            }
            match state.faults.get(&(from, to)).copied() {
                Some(Fault::Hold) => {
                    state = self
                        .changed
                        .wait_timeout(state, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                other => return other,
            }
        }
    }
}

/// The relays in front of a cluster's nodes, and the faults of their links.
pub struct Relays {
    shared: Arc<Shared>,
    ports: BTreeMap<u64, u16>,
}

impl Relays {
    /// A relay for each node of `ids`, each on a port of its own (loopback); they
    /// forward once `forward_to` has named the node's port.
    pub fn bind(ids: impl IntoIterator<Item = u64>) -> Relays {
        let shared = Arc::new(Shared::default());
        let mut ports = BTreeMap::new();
        for to in ids {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            ports.insert(to, listener.local_addr().unwrap().port());
            let shared = shared.clone();
            std::thread::spawn(move || {
                for inbound in listener.incoming() {
                    if shared.stopping.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(inbound) = inbound else { continue };
                    let shared = shared.clone();
                    std::thread::spawn(move || relay(&shared, to, inbound));
                }
            });
        }
        Relays { shared, ports }
    }

    /// Node `id` listens on `port`: its relay forwards there.
    pub fn forward_to(&self, id: u64, port: u16) {
        self.shared.lock().upstreams.insert(id, port);
    }

    /// The port of node `id`'s relay.
    pub fn port(&self, id: u64) -> u16 {
        self.ports[&id]
    }

    /// `ID=127.0.0.1:PORT,...`: the nodes as the others reach them, through the relays.
    pub fn members(&self) -> String {
        super::cluster::members(&self.ports)
    }

    /// Sets (or, with `None`, heals) the link from `from` to `to`. A cut shuts
    /// down the link's open connections before this returns.
    pub fn set(&self, from: u64, to: u64, fault: Option<Fault>) {
        let mut state = self.shared.lock();
        match fault {
            Some(f) => state.faults.insert((from, to), f),
            None => state.faults.remove(&(from, to)),
        };
        if fault == Some(Fault::Cut) {
            for s in state
                .open
                .values()
                .filter(|s| (s.from, s.to) == (Some(from), to))
            {
                for socket in &s.sockets {
                    let _ = socket.shutdown(Shutdown::Both);
                }
            }
        }
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Cuts the link from `from` to `to`.
    pub fn cut(&self, from: u64, to: u64) {
        self.set(from, to, Some(Fault::Cut));
    }

    /// `fault` on every link between `node` and the other nodes, both ways.
    pub fn isolate(&self, node: u64, fault: Fault) {
        for &other in self.ports.keys().filter(|id| **id != node) {
            self.set(node, other, Some(fault));
            self.set(other, node, Some(fault));
        }
    }

    /// Every link forwards again.
    pub fn heal_all(&self) {
        self.shared.lock().faults.clear();
        self.shared.changed.notify_all();
    }

    /// What went through the link from `from` to `to` so far.
    pub fn counts(&self, from: u64, to: u64) -> LinkCounts {
        self.shared
            .lock()
            .counts
            .get(&(from, to))
            .copied()
            .unwrap_or_default()
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        for port in self.ports.values() {
            let _ = TcpStream::connect(("127.0.0.1", *port)); // wakes its accept loop
        }
        for s in self.shared.lock().open.values() {
            for socket in &s.sockets {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
        self.shared.changed.notify_all();
    }
}

/// One accepted connection into `to`'s relay, until either side closes it (or a
/// cut shuts it down).
fn relay(shared: &Shared, to: u64, mut inbound: TcpStream) {
    let _ = inbound.set_nodelay(true);
    let Some(head) = read_head(&mut inbound) else {
        return;
    };
    let from = sender(&head);
    if shared.pass(from, to) == Some(Fault::Cut) {
        if let Some(from) = from {
            shared.lock().counts.entry((from, to)).or_default().refused += 1;
        }
        return; // closed at once
    }
    let Some(upstream) = shared.lock().upstreams.get(&to).copied() else {
        return;
    };
    let Ok(outbound) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    // Registered under the lock that `set` cuts under: a cut that came in since
    // `pass` closes this one now, and a later one finds it.
    let id = {
        let mut state = shared.lock();
        if let Some(from) = from {
            if state.faults.get(&(from, to)) == Some(&Fault::Cut) {
                state.counts.entry((from, to)).or_default().refused += 1;
                return;
            }
            state.counts.entry((from, to)).or_default().forwarded += 1;
        }
        let (Ok(a), Ok(b)) = (inbound.try_clone(), outbound.try_clone()) else {
            return;
        };
        state.next_connection += 1;
        let id = state.next_connection;
        state.open.insert(
            id,
            Spliced {
                from,
                to,
                sockets: [a, b],
            },
        );
        id
    };
    let (Ok(inbound_reader), Ok(outbound_writer)) = (inbound.try_clone(), outbound.try_clone())
    else {
        shared.lock().open.remove(&id);
        return;
    };
    std::thread::scope(|scope| {
        // The requests, starting with the head already read.
        scope.spawn(|| splice(shared, from, to, &head, inbound_reader, outbound_writer));
        // The answers.
        splice(shared, from, to, &[], outbound, inbound);
    });
    shared.lock().open.remove(&id);
}

/// Reads up to the end of the first request's head (the bytes read so far, which
/// may go past it); `None` when the connection ends first.
fn read_head(s: &mut TcpStream) -> Option<Vec<u8>> {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 64 * 1024 {
            return None;
        }
    }
    let _ = s.set_read_timeout(None);
    Some(head)
}

/// The `kiln-from-node` of a request's head.
fn sender(head: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(head);
    let end = text.find("\r\n\r\n")?;
    text[..end].split("\r\n").skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case(FROM_NODE_HEADER)
            .then(|| value.trim().parse().ok())?
    })
}

/// Copies `first` and then what `reader` reads into `writer`, through the link's
/// faults, until `reader` ends or the link is cut; then ends both directions of
/// the connection on a cut, else half-closes `writer`.
fn splice(
    shared: &Shared,
    from: Option<u64>,
    to: u64,
    first: &[u8],
    mut reader: TcpStream,
    mut writer: TcpStream,
) {
    let mut chunk = first.to_vec();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if !chunk.is_empty() {
            match shared.pass(from, to) {
                Some(Fault::Cut) => break,
                Some(Fault::Delay(d)) => std::thread::sleep(d),
                _ => {}
            }
            if writer.write_all(&chunk).is_err() {
                break;
            }
        }
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = writer.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => chunk = buf[..n].to_vec(),
        }
    }
    for s in [&reader, &writer] {
        let _ = s.shutdown(Shutdown::Both);
    }
}
