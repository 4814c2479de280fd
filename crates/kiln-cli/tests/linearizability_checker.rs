//! The register linearizability checker (tests/common/linearizability.rs) on
//! histories made by hand, linearizable or not, with and without unknown
//! outcomes; against a brute-force search on thousands of random small histories;
//! and on long histories, to show it stays fast where the cluster test needs it.
//!
//! Every "linearizable" answer comes with a witness order, which is checked here
//! independently of the search.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

#[path = "common/linearizability.rs"]
mod linearizability;

use linearizability::{check, check_from, validate_witness, Call, Operation, Outcome, Verdict};
use rand::{Rng, SeedableRng};
use std::time::Instant;

fn w(c: usize, t0: u64, t1: u64, v: u64) -> Operation {
    Operation::write(c, t0, t1, v)
}
fn wu(c: usize, t0: u64, v: u64) -> Operation {
    Operation::write_unknown(c, t0, v)
}
fn r(c: usize, t0: u64, t1: u64, v: Option<u64>) -> Operation {
    Operation::read(c, t0, t1, v)
}
fn cas(c: usize, t0: u64, t1: u64, e: u64, n: u64, applied: bool) -> Operation {
    Operation::cas(c, t0, t1, e, n, applied)
}

/// Linearizable, with a witness that passes the independent check.
fn assert_linearizable(name: &str, h: &[Operation]) {
    match check(h) {
        Verdict::Linearizable { order } => {
            if let Err(e) = validate_witness(None, h, &order) {
                panic!("{name}: the checker's witness {order:?} is wrong: {e}");
            }
        }
        other => panic!("{name}: linearizable, but the checker says {other:?}"),
    }
}

/// Not linearizable; `stuck`, when given, is the operation the report must name.
fn assert_not_linearizable(name: &str, h: &[Operation], stuck: Option<usize>) {
    match check(h) {
        Verdict::NotLinearizable(report) => {
            let text = report.to_string();
            assert!(text.starts_with("not linearizable"), "{name}: {text}");
            if let Some(s) = stuck {
                assert_eq!(
                    report.stuck, s,
                    "{name}: the report names #{}:\n{text}",
                    report.stuck
                );
            }
        }
        other => panic!("{name}: not linearizable, but the checker says {other:?}"),
    }
}

#[test]
fn linearizable_histories_are_accepted() {
    let cases: Vec<(&str, Vec<Operation>)> = vec![
        ("empty", vec![]),
        (
            "sequential writes and reads",
            vec![
                w(0, 0, 1, 1),
                r(1, 2, 3, Some(1)),
                w(0, 4, 5, 2),
                r(1, 6, 7, Some(2)),
            ],
        ),
        (
            "a read before any write sees nothing",
            vec![r(0, 0, 1, None), w(1, 2, 3, 1), r(0, 4, 5, Some(1))],
        ),
        (
            "a read concurrent with a write sees the old value",
            vec![
                w(0, 0, 1, 1),
                w(0, 2, 10, 2),
                r(1, 3, 4, Some(1)),
                r(1, 11, 12, Some(2)),
            ],
        ),
        (
            "a read concurrent with a write sees the new value before it is answered",
            vec![
                w(0, 0, 1, 1),
                w(0, 2, 10, 2),
                r(1, 3, 4, Some(2)),
                r(2, 5, 6, Some(2)),
            ],
        ),
        (
            // Linearizable only in the order opposite to the invocations.
            "concurrent writes ordered by a later read",
            vec![w(0, 0, 10, 1), w(1, 1, 9, 2), r(2, 11, 12, Some(1))],
        ),
        (
            "three concurrent writes, reads during them fix one order",
            vec![
                w(0, 0, 20, 1),
                w(1, 0, 20, 2),
                w(2, 0, 20, 3),
                r(3, 1, 2, Some(3)),
                r(3, 3, 4, Some(1)),
                r(3, 21, 22, Some(2)),
            ],
        ),
        (
            "answered at the same instant another is invoked: concurrent",
            vec![w(0, 0, 5, 1), r(1, 5, 6, None)],
        ),
        (
            "compare-and-set applied",
            vec![w(0, 0, 1, 1), cas(1, 2, 3, 1, 2, true), r(0, 4, 5, Some(2))],
        ),
        (
            "compare-and-set refused because a concurrent write came first",
            vec![
                w(0, 0, 1, 1),
                w(0, 2, 10, 2),
                cas(1, 3, 9, 1, 3, false),
                r(2, 11, 12, Some(2)),
            ],
        ),
        (
            "two compare-and-sets race, one wins",
            vec![
                w(0, 0, 1, 1),
                cas(1, 2, 10, 1, 2, false),
                cas(2, 2, 10, 1, 3, true),
                r(0, 11, 12, Some(3)),
            ],
        ),
        (
            "an unknown write that took effect",
            vec![
                w(0, 0, 1, 1),
                wu(1, 2, 2),
                r(0, 5, 6, Some(2)),
                r(0, 7, 8, Some(2)),
            ],
        ),
        (
            "an unknown write that never took effect",
            vec![
                w(0, 0, 1, 1),
                wu(1, 2, 2),
                r(0, 5, 6, Some(1)),
                r(0, 100, 101, Some(1)),
            ],
        ),
        (
            "an unknown write that took effect long after it was sent",
            vec![
                w(0, 0, 1, 1),
                wu(1, 2, 2),
                r(0, 5, 6, Some(1)),
                r(0, 50, 51, Some(2)),
            ],
        ),
        (
            "an unknown write overwritten before anyone saw it",
            vec![
                w(0, 0, 1, 1),
                wu(1, 2, 9),
                w(0, 5, 6, 3),
                r(0, 7, 8, Some(3)),
            ],
        ),
        (
            // Only the unseen write explains the refusal: dropping unknown writes
            // nobody saw would call this a violation.
            "an unknown write nobody saw explains a refused compare-and-set",
            vec![
                w(0, 0, 1, 1),
                wu(1, 2, 9),
                cas(0, 5, 6, 1, 3, false),
                w(0, 7, 8, 4),
                r(0, 9, 10, Some(4)),
            ],
        ),
        (
            "an unknown compare-and-set that applied",
            vec![
                w(0, 0, 1, 1),
                Operation::cas_unknown(1, 2, 1, 2),
                r(0, 5, 6, Some(2)),
            ],
        ),
        (
            "an unknown compare-and-set that did not apply",
            vec![
                w(0, 0, 1, 1),
                Operation::cas_unknown(1, 2, 1, 2),
                r(0, 5, 6, Some(1)),
            ],
        ),
        (
            "a read with an unknown outcome says nothing",
            vec![
                w(0, 0, 1, 1),
                Operation::new(1, 2, Call::Read, Outcome::Unknown),
                r(0, 5, 6, Some(1)),
            ],
        ),
        (
            "many unknown writes, some seen, some not",
            vec![
                w(0, 0, 1, 1),
                wu(1, 2, 10),
                wu(2, 3, 11),
                wu(3, 4, 12),
                wu(4, 5, 13),
                r(0, 6, 7, Some(12)),
                r(0, 8, 9, Some(10)),
                cas(0, 10, 11, 10, 20, false),
                r(0, 12, 13, Some(11)),
            ],
        ),
    ];
    for (name, h) in &cases {
        assert_linearizable(name, h);
    }
}

#[test]
fn non_linearizable_histories_are_refused() {
    let cases: Vec<(&str, Vec<Operation>, Option<usize>)> = vec![
        (
            "a stale read after a completed write",
            vec![w(0, 0, 1, 1), w(0, 2, 3, 2), r(1, 4, 5, Some(1))],
            Some(2),
        ),
        (
            "a read of nothing after a completed write",
            vec![w(0, 0, 1, 1), r(1, 2, 3, None)],
            Some(1),
        ),
        (
            "a read of a value never written",
            vec![w(0, 0, 1, 1), r(1, 2, 3, Some(7))],
            Some(1),
        ),
        (
            "a read of a value before its write was invoked",
            vec![r(1, 0, 1, Some(1)), w(0, 2, 3, 1)],
            Some(0),
        ),
        (
            "a lost write: seen, then the older value again",
            vec![
                w(0, 0, 1, 1),
                w(0, 2, 3, 2),
                r(1, 4, 5, Some(2)),
                r(1, 6, 7, Some(1)),
            ],
            Some(3),
        ),
        (
            "a lost update: two compare-and-sets both applied on the same value",
            vec![
                w(0, 0, 1, 1),
                cas(1, 2, 3, 1, 2, true),
                cas(2, 4, 5, 1, 3, true),
            ],
            Some(2),
        ),
        (
            "new then old during a concurrent write",
            vec![
                w(0, 0, 1, 1),
                w(0, 2, 20, 2),
                r(1, 3, 4, Some(2)),
                r(2, 5, 6, Some(1)),
            ],
            None,
        ),
        (
            "two readers disagree on the order of concurrent writes",
            vec![
                w(0, 0, 10, 1),
                w(1, 0, 10, 2),
                r(2, 11, 12, Some(1)),
                r(3, 13, 14, Some(2)),
            ],
            None,
        ),
        (
            "a compare-and-set refused while the register held its value",
            vec![w(0, 0, 1, 1), cas(1, 2, 3, 1, 2, false)],
            Some(1),
        ),
        (
            "a compare-and-set applied on a value overwritten before",
            vec![w(0, 0, 1, 1), w(0, 2, 3, 2), cas(1, 4, 5, 1, 3, true)],
            Some(2),
        ),
        (
            "an unknown write seen before it was sent",
            vec![w(0, 0, 1, 1), r(1, 2, 3, Some(2)), wu(2, 4, 2)],
            Some(1),
        ),
        (
            "an unknown write, once seen, cannot be undone",
            vec![
                w(0, 0, 1, 1),
                wu(1, 2, 2),
                r(0, 3, 4, Some(2)),
                r(0, 5, 6, Some(1)),
            ],
            None,
        ),
        (
            "an unknown compare-and-set cannot apply on a value overwritten",
            vec![
                w(0, 0, 1, 1),
                w(0, 2, 3, 2),
                Operation::cas_unknown(1, 4, 1, 5),
                r(0, 6, 7, Some(5)),
            ],
            None,
        ),
        (
            "an unknown write nobody saw does not excuse a stale read",
            vec![
                w(0, 0, 1, 1),
                wu(1, 2, 9),
                w(0, 3, 4, 2),
                r(1, 5, 6, Some(1)),
            ],
            Some(3),
        ),
    ];
    for (name, h, stuck) in &cases {
        assert_not_linearizable(name, h, *stuck);
    }
}

#[test]
fn a_report_names_the_operations() {
    let h = vec![
        w(0, 0, 1, 1).with_note("node 1"),
        w(0, 2, 3, 2).with_note("node 1"),
        r(1, 4, 5, Some(1)).with_note("node 2"),
    ];
    let Verdict::NotLinearizable(report) = check(&h) else {
        panic!("a stale read accepted");
    };
    let text = report.to_string();
    assert_eq!(report.prefix, vec![0, 1], "{text}");
    assert_eq!(report.state, Some(2), "{text}");
    assert!(
        text.contains("#2 client 1") && text.contains("read -> 1 (node 2)"),
        "{text}"
    );
}

#[test]
fn the_initial_state_counts() {
    let h = vec![r(0, 0, 1, Some(5))];
    assert!(matches!(
        check_from(Some(5), &h, 1000),
        Verdict::Linearizable { .. }
    ));
    assert!(matches!(check(&h), Verdict::NotLinearizable(_)));
}

/// The register's answer to each operation in `order`, with unknown outcomes
/// optionally dropped (never happened): true if every answer fits.
fn fits(state: Option<u64>, op: &Operation) -> Option<Option<u64>> {
    match (op.call, op.outcome) {
        (Call::Write(v), _) => Some(Some(v)),
        (Call::Read, Outcome::Read { value, .. }) => (value == state).then_some(state),
        (Call::Read, _) => Some(state),
        (Call::Cas { expected, new }, Outcome::Ok { .. }) => {
            (state == Some(expected)).then_some(Some(new))
        }
        (Call::Cas { expected, .. }, Outcome::CasFailed { .. }) => {
            (state != Some(expected)).then_some(state)
        }
        (Call::Cas { expected, new }, _) => Some(if state == Some(expected) {
            Some(new)
        } else {
            state
        }),
    }
}

/// Brute force: try every order that respects real time; an unknown outcome may
/// also be dropped (never happened).
fn brute_force(h: &[Operation], remaining: &mut Vec<usize>, state: Option<u64>) -> bool {
    if remaining.is_empty() {
        return true;
    }
    let end = |i: usize| h[i].response().unwrap_or(u64::MAX);
    for pos in 0..remaining.len() {
        let i = remaining[pos];
        // Nothing still remaining was answered before `i` was invoked.
        if remaining.iter().any(|&q| end(q) < h[i].invoke) {
            continue;
        }
        remaining.remove(pos);
        let ok = fits(state, &h[i]).is_some_and(|s| brute_force(h, remaining, s))
            || (h[i].outcome == Outcome::Unknown && brute_force(h, remaining, state));
        remaining.insert(pos, i);
        if ok {
            return true;
        }
    }
    false
}

/// A small history from a simulated register (each operation takes effect at a
/// random point of its interval; an unknown one at any time after its invocation,
/// or never), then, half the time, one answer or time changed at random.
fn random_history(rng: &mut rand::rngs::StdRng, ghostly: bool) -> (Option<u64>, Vec<Operation>) {
    let n = rng.gen_range(1..=if ghostly { 8 } else { 7 });
    let initial = if rng.gen_bool(0.2) { Some(100) } else { None };
    let mut planned = Vec::new();
    for k in 0..n {
        let invoke = rng.gen_range(0..30u64);
        let response = invoke + rng.gen_range(0..8u64);
        // 0 write, 1 read, 2 compare-and-set; `ghostly`: many writes with an
        // unknown outcome, compare-and-sets, few reads.
        let kind = if ghostly {
            [0, 0, 0, 1, 2, 2, 2][rng.gen_range(0..7)]
        } else {
            rng.gen_range(0..3)
        };
        let unknown = kind != 1 && rng.gen_bool(if ghostly { 0.5 } else { 0.25 });
        let point = if unknown {
            // Any time later, or (u64::MAX) never.
            if rng.gen_bool(0.3) {
                u64::MAX
            } else {
                invoke + rng.gen_range(0..40u64)
            }
        } else {
            rng.gen_range(invoke..=response)
        };
        planned.push((point, k, invoke, response, unknown, kind));
    }
    planned.sort();
    let mut state = initial;
    let mut written = vec![100u64];
    // Values of writes whose outcome was seen (`ghostly` expects only those).
    let mut seen_written = vec![100u64];
    let mut ops = Vec::new();
    for (point, k, invoke, response, unknown, kind) in planned {
        let happens = point != u64::MAX;
        let value = 1 + k as u64;
        let op = match kind {
            0 => {
                if happens {
                    state = Some(value);
                    written.push(value);
                }
                if !unknown {
                    seen_written.push(value);
                }
                if unknown {
                    wu(k, invoke, value)
                } else {
                    w(k, invoke, response, value)
                }
            }
            1 => r(k, invoke, response, state),
            _ => {
                let expected = if ghostly {
                    // Never the value of a write nobody saw complete (such writes
                    // stay unseen unless a read sees them); mostly the latest
                    // seen, refused only if an unseen write came after it.
                    if rng.gen_bool(0.6) {
                        *seen_written.last().unwrap()
                    } else {
                        seen_written[rng.gen_range(0..seen_written.len())]
                    }
                } else if rng.gen_bool(0.7) {
                    written[rng.gen_range(0..written.len())]
                } else {
                    state.unwrap_or(7)
                };
                let applied = happens && state == Some(expected);
                if applied {
                    state = Some(value);
                    written.push(value);
                }
                if unknown {
                    Operation::cas_unknown(k, invoke, expected, value)
                } else {
                    cas(k, invoke, response, expected, value, applied)
                }
            }
        };
        ops.push(op);
    }
    // Unknown reads do not exist in the simulation (a read always answers here).
    if rng.gen_bool(0.5) && !ops.is_empty() {
        let i = rng.gen_range(0..ops.len());
        let op = &mut ops[i];
        match (op.call, op.outcome) {
            (Call::Read, Outcome::Read { at, .. }) => {
                let candidates = [None, Some(1), Some(2), Some(3), Some(100)];
                op.outcome = Outcome::Read {
                    at,
                    value: candidates[rng.gen_range(0..candidates.len())],
                };
            }
            (Call::Cas { .. }, Outcome::Ok { at }) => op.outcome = Outcome::CasFailed { at },
            (Call::Cas { .. }, Outcome::CasFailed { at }) => op.outcome = Outcome::Ok { at },
            (_, Outcome::Unknown) => {
                // An unknown write becomes one that was seen to complete, early.
                if let Call::Write(_) = op.call {
                    op.outcome = Outcome::Ok { at: op.invoke };
                }
            }
            (_, outcome) => {
                // Shift it in time (invoked later, answered later).
                let shift = rng.gen_range(1..20);
                op.invoke += shift;
                if let Outcome::Ok { at } = outcome {
                    op.outcome = Outcome::Ok { at: at + shift };
                }
            }
        }
    }
    (initial, ops)
}

/// Writes nobody saw against refused compare-and-sets: 1 `a` is written and
/// seen; some writes with an unknown outcome, some compare-and-sets expecting 1
/// refused (or applied), a later write of 2, reads; all at random times. Whether
/// each refusal has an unseen write invoked in time decides the verdict.
fn ghost_scenario(rng: &mut rand::rngs::StdRng) -> Vec<Operation> {
    let mut h = vec![w(0, 0, 1, 1)];
    let mut value = 10;
    for c in 1..rng.gen_range(3..=7) {
        let invoke = rng.gen_range(2..30u64);
        let at = invoke + rng.gen_range(0..6u64);
        value += 1;
        h.push(match rng.gen_range(0..10) {
            0..=3 => wu(c, invoke, value),
            4..=6 => cas(c, invoke, at, 1, value, rng.gen_bool(0.2)),
            7 => w(c, invoke, at, 2),
            8 => Operation::cas_unknown(c, invoke, 1, value),
            _ => r(c, invoke, at, [Some(1), Some(2)][rng.gen_range(0..2)]),
        });
    }
    h
}

#[test]
fn agrees_with_brute_force_on_random_small_histories() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(20_261_203);
    let (mut yes, mut no, mut ghosts_needed) = (0, 0, 0);
    for case in 0..8000 {
        let (initial, h) = match case % 4 {
            3 => (None, ghost_scenario(&mut rng)),
            c => random_history(&mut rng, c == 2),
        };
        let mut all: Vec<usize> = (0..h.len()).collect();
        let expected = brute_force(&h, &mut all, initial);
        let verdict = check_from(initial, &h, 1_000_000);
        let dump = || {
            h.iter()
                .enumerate()
                .map(|(i, o)| format!("  #{i} {o}\n"))
                .collect::<String>()
        };
        match verdict {
            Verdict::Linearizable { order } => {
                assert!(
                    expected,
                    "case {case}: checker says linearizable ({order:?}), brute force says not; from {initial:?}:\n{}",
                    dump()
                );
                validate_witness(initial, &h, &order).unwrap_or_else(|e| {
                    panic!("case {case}: bad witness {order:?}: {e}\n{}", dump())
                });
                yes += 1;
                // Linearizable only thanks to a write nobody saw (whose outcome
                // is unknown): the case the checker's ghosts are for.
                let seen = |v: u64| {
                    h.iter().any(|o| match (o.call, o.outcome) {
                        (Call::Read, Outcome::Read { value, .. }) => value == Some(v),
                        (Call::Cas { expected, .. }, _) => expected == v,
                        _ => false,
                    })
                };
                let without: Vec<Operation> = h
                    .iter()
                    .filter(|o| {
                        !matches!((o.call, o.outcome), (Call::Write(v), Outcome::Unknown) if !seen(v))
                    })
                    .cloned()
                    .collect();
                let mut all: Vec<usize> = (0..without.len()).collect();
                if !brute_force(&without, &mut all, initial) {
                    ghosts_needed += 1;
                }
            }
            Verdict::NotLinearizable(report) => {
                assert!(
                    !expected,
                    "case {case}: checker says not linearizable, brute force found an order; from {initial:?}:\n{}{report}",
                    dump()
                );
                no += 1;
            }
            Verdict::GaveUp { steps } => panic!("case {case}: gave up after {steps} steps"),
        }
    }
    println!(
        "{yes} linearizable ({ghosts_needed} only thanks to a write nobody saw), {no} not, \
         all as brute force says"
    );
    // Both answers must occur often, or this test tells little.
    assert!(yes > 1000 && no > 1000, "{yes} linearizable, {no} not");
    assert!(
        ghosts_needed > 150,
        "{ghosts_needed} histories need a ghost"
    );
}

/// A long history of one register from 8 simulated clients, each operation
/// taking effect at a random point of its interval; some writes end unknown
/// (seen later or not at all), some never take effect.
fn long_history(seed: u64, ops_count: usize, unknown_writes: usize) -> Vec<Operation> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let clients = 8;
    let mut free_at = vec![0u64; clients];
    let mut planned = Vec::new();
    for k in 0..ops_count {
        let c = k % clients;
        let invoke = free_at[c] + rng.gen_range(0..50);
        let response = invoke + rng.gen_range(1..400);
        free_at[c] = response + 1;
        let unknown = k < ops_count - 50 && k % (ops_count / unknown_writes.max(1)) == 7;
        let point = if unknown && rng.gen_bool(0.5) {
            u64::MAX
        } else {
            rng.gen_range(invoke..=response)
        };
        planned.push((point, k, c, invoke, response, unknown, rng.gen_range(0..10)));
    }
    planned.sort();
    let mut state: Option<u64> = None;
    let mut ops: Vec<(usize, Operation)> = Vec::new();
    for (point, k, c, invoke, response, unknown, kind) in planned {
        let value = 1000 + k as u64;
        let op = if unknown {
            if point != u64::MAX {
                state = Some(value);
            }
            wu(c, invoke, value)
        } else if kind < 4 {
            state = Some(value);
            w(c, invoke, response, value)
        } else if kind < 7 || state.is_none() {
            r(c, invoke, response, state)
        } else {
            let expected = state.unwrap();
            state = Some(value);
            cas(c, invoke, response, expected, value, true)
        };
        ops.push((k, op));
    }
    ops.sort_by_key(|(k, _)| *k);
    ops.into_iter().map(|(_, op)| op).collect()
}

#[test]
fn long_histories_are_checked_quickly() {
    for (seed, n, unknown) in [(1, 2000, 0), (2, 2000, 20), (3, 3000, 40)] {
        let h = long_history(seed, n, unknown);
        let started = Instant::now();
        let verdict = check(&h);
        let took = started.elapsed();
        match verdict {
            Verdict::Linearizable { order } => validate_witness(None, &h, &order).unwrap(),
            other => panic!("seed {seed}: {other:?}"),
        }
        println!("{n} operations, {unknown} unknown writes: linearizable in {took:?}");

        // The same with one stale read near the end: an exhaustive search.
        let mut bad = h.clone();
        let last_write = (0..bad.len() - 100)
            .rev()
            .find(|&i| matches!(bad[i].outcome, Outcome::Ok { .. }))
            .unwrap();
        let after = bad[last_write].response().unwrap() + 1_000_000;
        let (Call::Write(v) | Call::Cas { new: v, .. }) = bad[last_write].call else {
            unreachable!()
        };
        // Far after everything: only the latest value can be read then.
        let end = bad.iter().filter_map(|o| o.response()).max().unwrap() + after;
        bad.push(w(9, end, end + 1, 1));
        bad.push(r(9, end + 2, end + 3, Some(v)).with_note("stale"));
        let started = Instant::now();
        match check(&bad) {
            Verdict::NotLinearizable(report) => {
                assert_eq!(report.stuck, bad.len() - 1, "{report}");
            }
            other => panic!("seed {seed}, a stale read at the end: {other:?}"),
        }
        println!(
            "  and with a stale read at the end: refused in {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_budget_stops_the_search() {
    let h = long_history(4, 2000, 0);
    assert!(matches!(check_from(None, &h, 100), Verdict::GaveUp { .. }));
}
