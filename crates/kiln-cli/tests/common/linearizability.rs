//! A linearizability checker for the history of one register (one document):
//! writes, reads and compare-and-set, each with the time it was invoked and the
//! time it was answered, or an unknown outcome.
//!
//! The search is Wing & Gong's, as Lowe and Porcupine improved it:
//!
//! - the history is a doubly linked list of call and return entries in time
//!   order; an operation may be linearized next when its call comes before the
//!   first return still in the list (nothing still pending was answered before it
//!   was invoked);
//! - linearizing an operation takes its call and return out of the list (in
//!   constant time, and back in on backtracking); reaching a return entry means
//!   that operation had to take effect by then and could not: backtrack;
//! - a cache of (set of linearized operations as a bitset, register state) skips
//!   any configuration already explored, which turns the exponential search into
//!   one bounded by the configurations actually reachable.
//!
//! An operation whose outcome was not seen (the connection died, the server
//! answered it could not tell) may have taken effect at any point after its
//! invocation, or never: it is given a return at infinity, so it can be
//! linearized anywhere after its call, and linearizing it after everything else is
//! the same as its never having happened. A read with an unknown outcome says
//! nothing and is left out.
//!
//! Three refinements keep histories with many unknown outcomes tractable; none
//! changes the verdict (the tests compare the checker with a brute-force search
//! on thousands of random histories):
//!
//! - once only operations with unknown outcomes remain, the history is
//!   linearizable (they all take effect at the end, in any order, or never);
//! - a value no read returned and no compare-and-set expected cannot be told
//!   apart from any other such value: they are all one state;
//! - a write of such a value with an unknown outcome (a "ghost") can only matter
//!   just before a refused compare-and-set that expected the value the register
//!   held: ghosts are linearized only there, together with that refusal, and
//!   always the earliest invoked one still available (a ghost invoked earlier can
//!   go wherever a later one can). Otherwise every subset of the ghosts, at every
//!   point of the history, would be searched.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer
#![allow(dead_code)] // each test binary uses its own part of this module

use std::collections::{HashMap, HashSet};
use std::fmt;

pub type Value = u64;

/// What a client asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Write(Value),
    Read,
    /// Sets `new` if the register holds `expected` (an `If-Match`).
    Cas {
        expected: Value,
        new: Value,
    },
}

/// What the client was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A write or a compare-and-set that was applied, answered at `at`.
    Ok { at: u64 },
    /// A read answered at `at` with the value it saw (`None`: no document).
    Read { at: u64, value: Option<Value> },
    /// A compare-and-set refused (the register did not hold `expected`).
    CasFailed { at: u64 },
    /// Not seen: it may have taken effect at any time after its invocation, or never.
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    pub client: usize,
    /// When it was invoked (any monotonic unit; reports show it as nanoseconds).
    pub invoke: u64,
    pub call: Call,
    pub outcome: Outcome,
    /// Free text for reports (which node served it, ...).
    pub note: String,
}

impl Operation {
    pub fn new(client: usize, invoke: u64, call: Call, outcome: Outcome) -> Operation {
        if let Some(at) = outcome.at() {
            assert!(at >= invoke, "an operation answered before it was invoked");
        }
        match (call, outcome) {
            (Call::Write(_), Outcome::Ok { .. } | Outcome::Unknown)
            | (Call::Read, Outcome::Read { .. } | Outcome::Unknown)
            | (Call::Cas { .. }, Outcome::Ok { .. } | Outcome::CasFailed { .. })
            | (Call::Cas { .. }, Outcome::Unknown) => {}
            _ => panic!("{call:?} cannot be answered {outcome:?}"),
        }
        Operation {
            client,
            invoke,
            call,
            outcome,
            note: String::new(),
        }
    }

    pub fn write(client: usize, invoke: u64, at: u64, value: Value) -> Operation {
        Operation::new(client, invoke, Call::Write(value), Outcome::Ok { at })
    }

    pub fn write_unknown(client: usize, invoke: u64, value: Value) -> Operation {
        Operation::new(client, invoke, Call::Write(value), Outcome::Unknown)
    }

    pub fn read(client: usize, invoke: u64, at: u64, value: Option<Value>) -> Operation {
        Operation::new(client, invoke, Call::Read, Outcome::Read { at, value })
    }

    pub fn cas(
        client: usize,
        invoke: u64,
        at: u64,
        expected: Value,
        new: Value,
        applied: bool,
    ) -> Operation {
        let outcome = if applied {
            Outcome::Ok { at }
        } else {
            Outcome::CasFailed { at }
        };
        Operation::new(client, invoke, Call::Cas { expected, new }, outcome)
    }

    pub fn cas_unknown(client: usize, invoke: u64, expected: Value, new: Value) -> Operation {
        Operation::new(
            client,
            invoke,
            Call::Cas { expected, new },
            Outcome::Unknown,
        )
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Operation {
        self.note = note.into();
        self
    }

    /// When it was answered; `None` for an unknown outcome.
    pub fn response(&self) -> Option<u64> {
        self.outcome.at()
    }

    /// Whether it takes part in the search (a read nobody saw the answer of does not).
    pub fn is_checked(&self) -> bool {
        !(self.call == Call::Read && self.outcome == Outcome::Unknown)
    }
}

impl Outcome {
    pub fn at(&self) -> Option<u64> {
        match *self {
            Outcome::Ok { at } | Outcome::Read { at, .. } | Outcome::CasFailed { at } => Some(at),
            Outcome::Unknown => None,
        }
    }
}

fn seconds(ns: u64) -> String {
    format!("{:.6} s", ns as f64 / 1e9)
}

fn show(v: Option<Value>) -> String {
    v.map_or_else(|| "nothing".to_string(), |v| v.to_string())
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = self.response().map_or_else(|| "?".to_string(), seconds);
        write!(
            f,
            "client {} [{} .. {}] ",
            self.client,
            seconds(self.invoke),
            end
        )?;
        match (self.call, self.outcome) {
            (Call::Write(v), Outcome::Unknown) => write!(f, "write {v} (outcome unknown)")?,
            (Call::Write(v), _) => write!(f, "write {v} -> ok")?,
            (Call::Read, Outcome::Read { value, .. }) => write!(f, "read -> {}", show(value))?,
            (Call::Read, _) => write!(f, "read (outcome unknown)")?,
            (Call::Cas { expected, new }, o) => {
                let answer = match o {
                    Outcome::Ok { .. } => "applied",
                    Outcome::CasFailed { .. } => "refused",
                    _ => "outcome unknown",
                };
                write!(f, "cas {expected} -> {new}: {answer}")?
            }
        }
        if !self.note.is_empty() {
            write!(f, " ({})", self.note)?;
        }
        Ok(())
    }
}

/// The checker's answer.
#[derive(Debug)]
pub enum Verdict {
    /// A witness: the indices of every checked operation in an order that respects
    /// real time and the register's semantics (unknown outcomes at the end never
    /// happened).
    Linearizable {
        order: Vec<usize>,
    },
    NotLinearizable(Box<Report>),
    /// The search took more than its budget of steps.
    GaveUp {
        steps: u64,
    },
}

/// Where the search got furthest before it had to give up on every order.
#[derive(Debug)]
pub struct Report {
    pub initial: Option<Value>,
    /// The longest prefix of operations that could be linearized (indices).
    pub prefix: Vec<usize>,
    /// The register after that prefix.
    pub state: Option<Value>,
    /// The operation that was answered before it (or anything else still pending)
    /// could take effect.
    pub stuck: usize,
    /// The operations that could have gone next (invoked before `stuck` was
    /// answered), none of which leads to a linearization.
    pub candidates: Vec<usize>,
    /// Copies of the operations (for display).
    pub ops: Vec<Operation>,
    pub steps: u64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let checked = self.ops.iter().filter(|o| o.is_checked()).count();
        writeln!(
            f,
            "not linearizable: the longest prefix that linearizes has {} of the {} operations \
             ({} search steps); the register then holds {}",
            self.prefix.len(),
            checked,
            self.steps,
            show(self.state)
        )?;
        writeln!(
            f,
            "  operation #{} had to take effect by {} and cannot: {}",
            self.stuck,
            self.ops[self.stuck]
                .response()
                .map_or_else(|| "?".to_string(), seconds),
            self.ops[self.stuck]
        )?;
        writeln!(
            f,
            "  what could take effect next (none leads to a linearization):"
        )?;
        for &i in &self.candidates {
            writeln!(f, "    #{i} {}", self.ops[i])?;
        }
        let start = self.prefix.len().saturating_sub(12);
        writeln!(
            f,
            "  the end of the longest linearized prefix (from {}):",
            show(self.initial)
        )?;
        for &i in &self.prefix[start..] {
            writeln!(f, "    #{i} {}", self.ops[i])?;
        }
        Ok(())
    }
}

/// The register's state in the search: an index into the values some read or
/// compare-and-set looks at, `UNOBSERVED` for any other value, `ABSENT` for none.
type State = u32;
const ABSENT: State = u32::MAX;
const UNOBSERVED: State = u32::MAX - 1;

#[derive(Clone, Copy)]
enum Step {
    Write(State),
    Read(State),
    CasApplied(State, State),
    CasRefused(State),
    CasUnknown(State, State),
}

impl Step {
    fn apply(self, s: State) -> Option<State> {
        match self {
            Step::Write(v) => Some(v),
            Step::Read(v) => (s == v).then_some(s),
            Step::CasApplied(e, n) => (s == e).then_some(n),
            Step::CasRefused(e) => (s != e).then_some(s),
            Step::CasUnknown(e, n) => Some(if s == e { n } else { s }),
        }
    }
}

const NIL: usize = usize::MAX;

struct Node {
    call: bool,
    /// The operation (index into the checked operations).
    op: usize,
    prev: usize,
    next: usize,
    /// A call's return entry.
    ret: usize,
}

/// Checks a register that starts with no document, within a default budget.
pub fn check(history: &[Operation]) -> Verdict {
    check_from(None, history, 50_000_000)
}

/// Checks a register that starts as `initial`, giving up after `max_steps`.
pub fn check_from(initial: Option<Value>, history: &[Operation], max_steps: u64) -> Verdict {
    // The operations that take part, as indices into `history`.
    let ops: Vec<usize> = (0..history.len())
        .filter(|&i| history[i].is_checked())
        .collect();
    let n = ops.len();

    // Values some read returns or some compare-and-set expects get their own state.
    let mut observed: HashMap<Value, State> = HashMap::new();
    let observe = |v: Value, observed: &mut HashMap<Value, State>| {
        let next = observed.len() as State;
        *observed.entry(v).or_insert(next)
    };
    if let Some(v) = initial {
        observe(v, &mut observed);
    }
    for &i in &ops {
        match (history[i].call, history[i].outcome) {
            (Call::Read, Outcome::Read { value: Some(v), .. }) => {
                observe(v, &mut observed);
            }
            (Call::Cas { expected, .. }, _) => {
                observe(expected, &mut observed);
            }
            _ => {}
        }
    }
    assert!(observed.len() < UNOBSERVED as usize, "too many values");
    let state_of = |v: Option<Value>| match v {
        None => ABSENT,
        Some(v) => observed.get(&v).copied().unwrap_or(UNOBSERVED),
    };
    let steps: Vec<Step> = ops
        .iter()
        .map(|&i| match (history[i].call, history[i].outcome) {
            (Call::Write(v), _) => Step::Write(state_of(Some(v))),
            (Call::Read, Outcome::Read { value, .. }) => Step::Read(state_of(value)),
            (Call::Cas { expected, new }, Outcome::Ok { .. }) => {
                Step::CasApplied(state_of(Some(expected)), state_of(Some(new)))
            }
            (Call::Cas { expected, .. }, Outcome::CasFailed { .. }) => {
                Step::CasRefused(state_of(Some(expected)))
            }
            (Call::Cas { expected, new }, _) => {
                Step::CasUnknown(state_of(Some(expected)), state_of(Some(new)))
            }
            (Call::Read, _) => unreachable!("unknown reads are not checked"),
        })
        .collect();

    // Ghost writes, ranked by invocation. A ghost is only ever linearized just
    // before a refused compare-and-set that needs it (the register held the
    // expected value), and always the earliest one available.
    let end: Vec<u64> = ops
        .iter()
        .map(|&i| history[i].response().unwrap_or(u64::MAX))
        .collect();
    let mut ghosts: Vec<usize> = (0..n)
        .filter(|&k| end[k] == u64::MAX && matches!(steps[k], Step::Write(UNOBSERVED)))
        .collect();
    ghosts.sort_by_key(|&k| (history[ops[k]].invoke, k));
    let is_ghost = {
        let mut g = vec![false; n];
        for &k in &ghosts {
            g[k] = true;
        }
        g
    };

    // The entry list: calls and returns in time order, a call before a return at
    // the same time (operations that touch at an instant are concurrent).
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (k, &i) in ops.iter().enumerate() {
        events.push((history[i].invoke, true, k));
        events.push((end[k], false, k));
    }
    events.sort_by_key(|&(t, call, k)| (t, !call, k));
    // Node 0 is the head.
    let mut nodes: Vec<Node> = Vec::with_capacity(2 * n + 1);
    nodes.push(Node {
        call: false,
        op: NIL,
        prev: NIL,
        next: NIL,
        ret: NIL,
    });
    let mut call_node = vec![NIL; n];
    let mut ret_node = vec![NIL; n];
    for (pos, &(_, call, k)) in events.iter().enumerate() {
        let idx = pos + 1;
        nodes.push(Node {
            call,
            op: k,
            prev: idx - 1,
            next: if pos + 1 < events.len() { idx + 1 } else { NIL },
            ret: NIL,
        });
        if call {
            call_node[k] = idx;
        } else {
            ret_node[k] = idx;
        }
    }
    if !events.is_empty() {
        nodes[0].next = 1;
    }
    for node in nodes.iter_mut().skip(1) {
        if node.call {
            node.ret = ret_node[node.op];
        }
    }

    fn lift(nodes: &mut [Node], c: usize) {
        let (p, nx) = (nodes[c].prev, nodes[c].next);
        nodes[p].next = nx;
        nodes[nx].prev = p; // a call is always followed by its return
        let r = nodes[c].ret;
        let (p, nx) = (nodes[r].prev, nodes[r].next);
        nodes[p].next = nx;
        if nx != NIL {
            nodes[nx].prev = p;
        }
    }
    fn unlift(nodes: &mut [Node], c: usize) {
        let r = nodes[c].ret;
        let (p, nx) = (nodes[r].prev, nodes[r].next);
        nodes[p].next = r;
        if nx != NIL {
            nodes[nx].prev = r;
        }
        let (p, nx) = (nodes[c].prev, nodes[c].next);
        nodes[p].next = c;
        nodes[nx].prev = c;
    }
    // Whether `target` (a call in the list) comes before every return still there:
    // nothing pending was answered before it was invoked.
    let available = |nodes: &[Node], target: usize| {
        let mut e = nodes[0].next;
        while e != target {
            if !nodes[e].call {
                return false;
            }
            e = nodes[e].next;
        }
        true
    };
    let set = |bits: &mut [u64], k: usize| bits[k / 64] |= 1 << (k % 64);
    let clear = |bits: &mut [u64], k: usize| bits[k / 64] &= !(1 << (k % 64));

    let mut linearized = vec![0u64; n.div_ceil(64)];
    let mut cache: HashSet<(Vec<u64>, State)> = HashSet::new();
    let mut state = state_of(initial);
    let mut next_ghost = 0usize;
    // (call node, the state before it, whether a ghost went just before it)
    let mut stack: Vec<(usize, State, bool)> = Vec::new();
    // (stack depth, linearized prefix, the stuck operation, its alternatives)
    let mut best: Option<(usize, Vec<usize>, usize, Vec<usize>)> = None;
    let mut entry = nodes[0].next;
    let mut steps_taken = 0u64;
    // In linearization order (indices into `ops`).
    let order_of = |stack: &[(usize, State, bool)], nodes: &[Node], ghosts_used: usize| {
        let mut order = Vec::new();
        let mut g = ghosts_used;
        for &(c, _, ghost) in stack.iter().rev() {
            order.push(nodes[c].op);
            if ghost {
                g -= 1;
                order.push(ghosts[g]);
            }
        }
        order.reverse();
        order
    };

    loop {
        // Everything answered is linearized when the list is empty or only
        // operations with unknown outcomes remain (their returns, at infinity,
        // come last): those take effect at the end in any order, or never.
        if entry == NIL || (!nodes[entry].call && end[nodes[entry].op] == u64::MAX) {
            let mut order = order_of(&stack, &nodes, next_ghost);
            let mut e = nodes[0].next;
            while e != NIL {
                if nodes[e].call {
                    order.push(nodes[e].op);
                }
                e = nodes[e].next;
            }
            return Verdict::Linearizable {
                order: order.into_iter().map(|k| ops[k]).collect(),
            };
        }
        steps_taken += 1;
        if steps_taken > max_steps {
            return Verdict::GaveUp { steps: steps_taken };
        }
        let node = &nodes[entry];
        if node.call {
            let k = node.op;
            if is_ghost[k] {
                entry = node.next;
                continue;
            }
            let mut after = steps[k].apply(state).map(|s| (s, false));
            if after.is_none() && matches!(steps[k], Step::CasRefused(_)) {
                // Refused although the register held the value: only if a write
                // nobody saw took effect just before.
                if let Some(&g) = ghosts.get(next_ghost) {
                    if available(&nodes, call_node[g]) {
                        after = Some((UNOBSERVED, true));
                    }
                }
            }
            if let Some((s, ghost)) = after {
                set(&mut linearized, k);
                if ghost {
                    set(&mut linearized, ghosts[next_ghost]);
                }
                if cache.insert((linearized.clone(), s)) {
                    stack.push((entry, state, ghost));
                    state = s;
                    if ghost {
                        let g = ghosts[next_ghost];
                        lift(&mut nodes, call_node[g]);
                        next_ghost += 1;
                    }
                    lift(&mut nodes, entry);
                    entry = nodes[0].next;
                    continue;
                }
                clear(&mut linearized, k);
                if ghost {
                    clear(&mut linearized, ghosts[next_ghost]);
                }
            }
            entry = nodes[entry].next;
        } else {
            // A return: its operation had to be linearized by now.
            // The deepest dead end so far is what a report shows.
            if best.as_ref().is_none_or(|b| stack.len() > b.0) {
                let prefix = order_of(&stack, &nodes, next_ghost);
                let mut candidates = Vec::new();
                let mut e = nodes[0].next;
                while e != entry {
                    if nodes[e].call && !is_ghost[nodes[e].op] {
                        candidates.push(nodes[e].op);
                    }
                    e = nodes[e].next;
                }
                best = Some((stack.len(), prefix, node.op, candidates));
            }
            let Some((c, before, ghost)) = stack.pop() else {
                let (_, prefix, stuck, candidates) = best.unwrap_or_default();
                let to_history = |v: Vec<usize>| v.into_iter().map(|k| ops[k]).collect::<Vec<_>>();
                let prefix = to_history(prefix);
                let state = replay(initial, history, &prefix);
                return Verdict::NotLinearizable(Box::new(Report {
                    initial,
                    prefix,
                    state,
                    stuck: ops[stuck],
                    candidates: to_history(candidates),
                    ops: history.to_vec(),
                    steps: steps_taken,
                }));
            };
            let k = nodes[c].op;
            state = before;
            clear(&mut linearized, k);
            unlift(&mut nodes, c);
            if ghost {
                next_ghost -= 1;
                let g = ghosts[next_ghost];
                clear(&mut linearized, g);
                unlift(&mut nodes, call_node[g]);
            }
            entry = nodes[c].next;
        }
    }
}

/// The register after `order` (indices into `history`), applying each operation
/// as it was answered (an unknown compare-and-set applies when it can).
fn replay(initial: Option<Value>, history: &[Operation], order: &[usize]) -> Option<Value> {
    let mut s = initial;
    for &i in order {
        match (history[i].call, history[i].outcome) {
            (Call::Write(v), _) => s = Some(v),
            (Call::Cas { expected, new }, Outcome::Ok { .. } | Outcome::Unknown)
                if s == Some(expected) =>
            {
                s = Some(new)
            }
            _ => {}
        }
    }
    s
}

/// Checks a witness independently of the search: every checked operation exactly
/// once, real-time order respected (nothing placed before an operation that was
/// answered before it was invoked), and every answer what the register held.
pub fn validate_witness(
    initial: Option<Value>,
    history: &[Operation],
    order: &[usize],
) -> Result<(), String> {
    let mut seen = vec![false; history.len()];
    for &i in order {
        if i >= history.len() || seen[i] {
            return Err(format!("operation #{i} missing from the history or twice"));
        }
        seen[i] = true;
    }
    if let Some(i) = (0..history.len()).find(|&i| history[i].is_checked() != seen[i]) {
        return Err(format!(
            "operation #{i} is not where it should be in the witness"
        ));
    }
    // Real time: each operation was invoked no later than every later one's answer.
    let mut min_later_response = u64::MAX;
    for &i in order.iter().rev() {
        if history[i].invoke > min_later_response {
            return Err(format!(
                "#{i} is placed before an operation answered before it was invoked"
            ));
        }
        min_later_response = min_later_response.min(history[i].response().unwrap_or(u64::MAX));
    }
    let mut s = initial;
    for &i in order {
        let op = &history[i];
        match (op.call, op.outcome) {
            (Call::Write(v), _) => s = Some(v),
            (Call::Read, Outcome::Read { value, .. }) if value != s => {
                return Err(format!(
                    "#{i} read {} where the register held {}",
                    show(value),
                    show(s)
                ))
            }
            (Call::Read, _) => {}
            (Call::Cas { expected, new }, outcome) => match (s == Some(expected), outcome) {
                (true, Outcome::Ok { .. } | Outcome::Unknown) => s = Some(new),
                (false, Outcome::CasFailed { .. } | Outcome::Unknown) => {}
                _ => {
                    return Err(format!(
                        "#{i} cas answered {outcome:?} with the register at {}",
                        show(s)
                    ))
                }
            },
        }
    }
    Ok(())
}
