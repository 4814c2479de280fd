//! The randomized crash driver: a random workload against an environment on a
//! simulated disk, power cuts and faults at random operations, then reopen and
//! compare with a model. Deterministic from a seed: the flusher only does I/O when
//! the workload calls `Env::sync` (no timers, no size triggers), so every operation
//! happens in the same order on every run of a seed.

use crate::{CutMode, Fault, OpKind, SimDisk};
use kiln_storage::{Env, Error, MergeAhead, Options};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

type Tree = BTreeMap<Vec<u8>, Vec<u8>>;
pub type Model = BTreeMap<String, Tree>;
/// A planned operation: tree, key, value (`None` deletes the key) and what it does
/// (0 a put or delete, 1 creates the tree, 2 drops it).
type PlannedOp = (String, Vec<u8>, Option<Vec<u8>>, u8);

/// Figures of a driver run.
#[derive(Debug, Default, Clone)]
pub struct DriverStats {
    pub power_cuts: u64,
    pub process_restarts: u64,
    pub faults_injected: u64,
    pub bit_flips: u64,
    pub commits_acknowledged: u64,
    pub commits_verified: u64,
    /// Entries (keys of every tree) compared with the model after reopens.
    pub keys_verified: u64,
    pub acknowledged_commits_lost: u64,
    pub corruptions_returned_as_data: u64,
    pub corruptions_detected: u64,
    /// Injected faults by operation and error, and what the simulated disk did to
    /// pending writes at power cuts.
    pub faults_by_kind: BTreeMap<String, u64>,
    pub writes_torn: u64,
    pub writes_garbled: u64,
    pub pending_writes_dropped: u64,
    pub files_vanished: u64,
    /// Keys the merge thread merged ahead for committing transactions.
    pub keys_merged_ahead: u64,
    /// Journal files made after the (small) first one of each environment.
    pub journal_files_created: u64,
    /// Bytes of merged values that records named by buffer key (patched images).
    pub referenced_value_bytes: u64,
}

impl DriverStats {
    pub fn add(&mut self, o: &DriverStats) {
        self.power_cuts += o.power_cuts;
        self.process_restarts += o.process_restarts;
        self.faults_injected += o.faults_injected;
        self.bit_flips += o.bit_flips;
        self.commits_acknowledged += o.commits_acknowledged;
        self.commits_verified += o.commits_verified;
        self.keys_verified += o.keys_verified;
        self.acknowledged_commits_lost += o.acknowledged_commits_lost;
        self.corruptions_returned_as_data += o.corruptions_returned_as_data;
        self.corruptions_detected += o.corruptions_detected;
        for (k, v) in &o.faults_by_kind {
            *self.faults_by_kind.entry(k.clone()).or_insert(0) += v;
        }
        self.writes_torn += o.writes_torn;
        self.writes_garbled += o.writes_garbled;
        self.pending_writes_dropped += o.pending_writes_dropped;
        self.files_vanished += o.files_vanished;
        self.keys_merged_ahead += o.keys_merged_ahead;
        self.journal_files_created += o.journal_files_created;
        self.referenced_value_bytes += o.referenced_value_bytes;
    }

    fn absorb_disk(&mut self, disk: &SimDisk) {
        let s = disk.stats();
        self.faults_by_kind = s.faults_injected;
        self.faults_injected = self.faults_by_kind.values().sum();
        self.writes_torn = s.writes_torn;
        self.writes_garbled = s.writes_garbled;
        self.pending_writes_dropped = s.pending_writes_dropped;
        self.files_vanished = s.files_vanished;
    }
}

pub fn env_dir() -> PathBuf {
    PathBuf::from("/sim/env")
}

thread_local! {
    /// Whether the seed being run encrypts its environment (`run_seed`: odd seeds).
    static ENCRYPTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The master key of the seeds that run encrypted.
const SIM_MASTER_KEY: [u8; 32] = [0x33; 32];

pub fn options(disk: &Arc<SimDisk>) -> Options {
    Options {
        vfs: disk.vfs(),
        // Odd seeds run on an encrypted environment: pages and records sealed, the
        // seal file and the wrapped key under the same cuts, faults and flips.
        encryption: ENCRYPTED
            .get()
            .then(|| kiln_storage::MasterKey::from_bytes(SIM_MASTER_KEY)),
        journal_file_size_bytes: 1 << 20,
        // A first file of 64 KiB: cuts land on switches between files of both
        // sizes, and the small one is recycled among full-size ones.
        journal_first_file_bytes: Some(64 << 10),
        data_grow_step_bytes: 256 << 10,
        sync_interval_ms: u64::MAX / 4,
        sync_after_bytes: u64::MAX / 4,
        // All background I/O happens inside `Env::sync`, at points the workload picks.
        prepare_journal_files_ahead: false,
        // A small write buffer, so that power cuts land during freezes and merges.
        write_buffer_bytes: 32 << 10,
        // The same bytes on every run of a seed, whatever the timing.
        journal_compression_adaptive: false,
        // Merging ahead on its thread, but a fixed number of keys per transaction,
        // so that the records do not depend on timing either.
        merge_ahead: MergeAhead::ExactKeys(40),
        // Merges take the path they take past RAM (leaves asked for ahead, a
        // sibling already held preferred when a leaf overflows).
        read_ahead: kiln_storage::ReadAhead::Always,
        ..Options::default()
    }
}

/// `KILN_SIM_TRACE=1` prints what each cycle does (for debugging a failing seed).
fn trace(msg: impl FnOnce() -> String) {
    if std::env::var_os("KILN_SIM_TRACE").is_some() {
        eprintln!("[sim] {}", msg());
    }
}

/// What a workload step did.
enum Step {
    Committed,
    /// The commit failed: it may or may not have become durable.
    InDoubt(Model),
    Failed,
}

fn random_key(rng: &mut StdRng) -> Vec<u8> {
    let len = if rng.gen_bool(0.05) {
        rng.gen_range(200..=1024)
    } else {
        rng.gen_range(1..24)
    };
    // A small alphabet so that keys repeat (overwrites, deletes of present keys).
    (0..len).map(|_| b"abcdef"[rng.gen_range(0..6)]).collect()
}

fn random_value(rng: &mut StdRng) -> Vec<u8> {
    let len = match rng.gen_range(0..20) {
        0 => rng.gen_range(3000..60_000), // overflow runs
        1..=3 => rng.gen_range(0..2000),
        _ => rng.gen_range(0..120),
    };
    (0..len).map(|_| rng.gen()).collect()
}

/// One transaction's operations, applied to `next` (a copy of the model).
fn plan_txn(rng: &mut StdRng, next: &mut Model) -> Vec<PlannedOp> {
    let mut ops = Vec::new();
    if next.is_empty() || rng.gen_bool(0.05) {
        let name = format!("tree{}", rng.gen_range(0..3));
        next.entry(name.clone()).or_default();
        ops.push((name, Vec::new(), None, 1)); // create
    }
    if next.len() > 1 && rng.gen_bool(0.03) {
        let name = next
            .keys()
            .nth(rng.gen_range(0..next.len()))
            .cloned()
            .unwrap_or_default();
        next.remove(&name);
        ops.push((name, Vec::new(), None, 2)); // drop
    }
    let names: Vec<String> = next.keys().cloned().collect();
    if names.is_empty() {
        return ops;
    }
    for _ in 0..rng.gen_range(1..12) {
        let name = names[rng.gen_range(0..names.len())].clone();
        let key = random_key(rng);
        let tree = next.get_mut(&name).expect("tree in model");
        if rng.gen_bool(0.25) {
            tree.remove(&key);
            ops.push((name, key, None, 0));
        } else {
            let v = random_value(rng);
            tree.insert(key.clone(), v.clone());
            ops.push((name, key, Some(v), 0));
        }
    }
    ops
}

fn apply_ops(txn: &mut kiln_storage::WriteTxn, ops: &[PlannedOp]) -> kiln_storage::Result<()> {
    for (tree, key, value, kind) in ops {
        match kind {
            1 => txn.ensure_tree(tree)?,
            2 => {
                txn.drop_tree(tree)?;
            }
            _ => match value {
                Some(v) => txn.put(tree, key, v)?,
                None => {
                    txn.delete(tree, key)?;
                }
            },
        }
    }
    Ok(())
}

fn run_txn(env: &Env, rng: &mut StdRng, model: &Model) -> Step {
    let mut next = model.clone();
    let ops = plan_txn(rng, &mut next);
    let result = if rng.gen_bool(0.3) {
        let ops = ops.clone();
        env.submit(move |txn| apply_ops(txn, &ops))
    } else {
        env.begin_write().and_then(|mut w| {
            apply_ops(&mut w, &ops)?;
            w.commit().map(|_| ())
        })
    };
    match result {
        Ok(()) => {
            // Stash the new model in the caller through InDoubt's sibling.
            NEXT.with(|n| *n.borrow_mut() = Some(next));
            Step::Committed
        }
        Err(Error::Io { .. } | Error::Poisoned(_) | Error::GroupFailed(_)) => Step::InDoubt(next),
        Err(_) => Step::Failed,
    }
}

thread_local!(static NEXT: std::cell::RefCell<Option<Model>> = const { std::cell::RefCell::new(None) });

/// Reads the whole environment into a model. Errors are corruption detected.
/// Every tree and entry of the last commit of `env`.
pub fn read_state(env: &Env) -> Result<Model, Error> {
    let r = env.begin_read()?;
    let mut m = Model::new();
    for name in r.tree_names()? {
        let mut t = Tree::new();
        let mut c = r.cursor(&name)?;
        let mut e = c.first()?;
        while let Some((k, v)) = e {
            t.insert(k.to_vec(), v.to_vec());
            e = c.next()?;
        }
        if t.len() as u64 != r.tree_len(&name)? {
            return Err(Error::Poisoned(kiln_storage::Failure::internal(
                "reading the state back",
                format!("tree {name}: length disagrees with its entries"),
            )));
        }
        m.insert(name, t);
    }
    Ok(m)
}

fn describe_difference(want: &Model, got: &Model) -> String {
    for (name, t) in want {
        match got.get(name) {
            None => return format!("tree {name:?} missing"),
            Some(g) if g != t => {
                let missing = t.keys().find(|k| g.get(*k) != t.get(*k));
                return format!(
                    "tree {name:?}: {} entries, expected {}; first differing key {:?}",
                    g.len(),
                    t.len(),
                    missing.map(|k| String::from_utf8_lossy(k).into_owned())
                );
            }
            _ => {}
        }
    }
    format!(
        "unexpected trees {:?}",
        got.keys()
            .filter(|k| !want.contains_key(*k))
            .collect::<Vec<_>>()
    )
}

/// Opens after a cut or restart and checks the state is `model`, or `in_doubt` if a
/// commit was in flight. Returns the state now (which becomes the model).
fn reopen_and_verify(
    disk: &Arc<SimDisk>,
    model: &Model,
    in_doubt: Option<&Model>,
    stats: &mut DriverStats,
    commits: u64,
) -> Result<(Env, Model), String> {
    let (env, report) = Env::open_with_report(env_dir(), options(disk))
        .map_err(|e| format!("reopen failed: {e}"))?;
    trace(|| format!("reopened: {report:?}"));
    let state = read_state(&env).map_err(|e| format!("reading after reopen failed: {e}"))?;
    let ok = &state == model || in_doubt.is_some_and(|d| &state == d);
    if !ok {
        stats.acknowledged_commits_lost += 1;
        return Err(format!(
            "state after reopen differs from every acknowledged state: {}",
            describe_difference(model, &state)
        ));
    }
    let report = env.check().map_err(|e| format!("check failed: {e}"))?;
    if !report.is_clean() {
        return Err(format!("check after reopen: {:?}", report.problems));
    }
    stats.commits_verified += commits;
    stats.keys_verified += state.values().map(|t| t.len() as u64).sum::<u64>();
    Ok((env, state))
}

/// What a seed's history has acknowledged so far.
#[derive(Default)]
struct History {
    model: Model,
    /// The state a transaction whose commit answered an error would have made.
    in_doubt: Option<Model>,
    commits: u64,
}

/// Runs `cycles` power cuts (and sometimes faults and bit flips) for one seed.
pub fn run_seed(seed: u64, cycles: u32, canary: bool) -> Result<DriverStats, String> {
    ENCRYPTED.set(seed % 2 == 1);
    let mut rng = StdRng::seed_from_u64(seed);
    let disk = SimDisk::new(seed ^ 0x5EED);
    let mut stats = DriverStats::default();
    let mut history = History::default();
    for cycle in 0..cycles {
        let (env, state) = reopen_and_verify(
            &disk,
            &history.model,
            history.in_doubt.as_ref(),
            &mut stats,
            history.commits,
        )
        .map_err(|e| format!("cycle {cycle}: {e}"))?;
        history.model = state;
        history.in_doubt = None;
        if canary {
            env.unsafe_disable_journal_durability_for_tests()
                .map_err(|e| e.to_string())?;
        }
        let fault_cycle = arm_fault_or_cut(&disk, &mut rng, cycle);
        run_transactions(&env, &disk, &mut rng, &mut history, &mut stats);
        let env_stats = env.stats();
        stats.keys_merged_ahead += env_stats.write_buffer_keys_merged_ahead;
        stats.journal_files_created += env_stats.journal_files_created;
        stats.referenced_value_bytes += env_stats.journal_referenced_value_bytes;
        if fault_cycle && !disk.is_dead() {
            // A process restart after the fault: the OS keeps every write.
            drop(env);
            disk.clear_faults();
            stats.process_restarts += 1;
            continue;
        }
        if !disk.is_dead() {
            disk.cut_power(CutMode::Random);
        }
        drop(env);
        disk.restart();
        stats.power_cuts += 1;
        if rng.gen_bool(0.1) {
            let in_doubt = history.in_doubt.as_ref();
            flip_and_check(&disk, &mut rng, &history.model, in_doubt, &mut stats)?;
            // Damage is permanent: start this seed's history over on a new disk.
            stats.absorb_disk(&disk);
            return Ok(stats);
        }
    }
    // The last cycle's cut (or restart) is verified too, not only those followed by
    // another cycle.
    reopen_and_verify(
        &disk,
        &history.model,
        history.in_doubt.as_ref(),
        &mut stats,
        history.commits,
    )
    .map_err(|e| format!("after the last cycle: {e}"))?;
    stats.absorb_disk(&disk);
    Ok(stats)
}

/// Arms this cycle's disaster: one in five cycles an I/O fault (EIO or ENOSPC on
/// the n-th read, write, sync or allocation), otherwise a power cut up to 150
/// operations ahead. True for a fault cycle.
fn arm_fault_or_cut(disk: &Arc<SimDisk>, rng: &mut StdRng, cycle: u32) -> bool {
    if rng.gen_bool(0.2) {
        let kind =
            [OpKind::Write, OpKind::Sync, OpKind::Allocate, OpKind::Read][rng.gen_range(0..4)];
        let fault = if rng.gen_bool(0.5) {
            Fault::Eio
        } else {
            Fault::Enospc
        };
        let nth = rng.gen_range(0..30);
        trace(|| format!("cycle {cycle}: fault {fault:?} on {kind:?} #{nth}"));
        disk.inject_fault(kind, nth, fault);
        return true;
    }
    let mode = [
        CutMode::DropAll,
        CutMode::KeepAll,
        CutMode::Random,
        CutMode::Random,
    ][rng.gen_range(0..4)];
    let at = disk.ops() + rng.gen_range(1..150);
    trace(|| {
        format!(
            "cycle {cycle}: power cut at op {at} ({mode:?}), now at op {}",
            disk.ops()
        )
    });
    disk.cut_power_at(at, mode);
    false
}

/// Up to 40 transactions and syncs, until the armed fault or cut stops them;
/// each acknowledged commit becomes the model.
fn run_transactions(
    env: &Env,
    disk: &Arc<SimDisk>,
    rng: &mut StdRng,
    history: &mut History,
    stats: &mut DriverStats,
) {
    for _ in 0..rng.gen_range(1..40) {
        if rng.gen_bool(0.15) {
            let r = env.sync();
            trace(|| format!("  sync -> {r:?} (op {})", disk.ops()));
            if r.is_err() {
                break;
            }
            continue;
        }
        let step = run_txn(env, rng, &history.model);
        trace(|| {
            format!(
                "  txn -> {} (op {}, dead {})",
                match &step {
                    Step::Committed => "committed",
                    Step::InDoubt(_) => "in doubt",
                    Step::Failed => "failed",
                },
                disk.ops(),
                disk.is_dead()
            )
        });
        match step {
            Step::Committed => {
                history.model = NEXT
                    .with(|n| n.borrow_mut().take())
                    .expect("committed model");
                history.commits += 1;
                stats.commits_acknowledged += 1;
            }
            Step::InDoubt(next) => {
                history.in_doubt = Some(next);
                break;
            }
            Step::Failed => break,
        }
        if disk.is_dead() {
            break;
        }
    }
}

/// Flips a bit at rest and checks the damage is reported, never returned as data:
/// either in a used page of the data file (after a checkpoint, so the data lives
/// there), or in the journal (before any checkpoint, so recovery must read it).
fn flip_and_check(
    disk: &Arc<SimDisk>,
    rng: &mut StdRng,
    model: &Model,
    in_doubt: Option<&Model>,
    stats: &mut DriverStats,
) -> Result<(), String> {
    let in_journal = rng.gen_bool(0.5);
    if !in_journal {
        let Ok(env) = Env::open(env_dir(), options(disk)) else {
            return Ok(());
        };
        let _ = env.sync();
    }
    let Some((path, offset)) = pick_flip_target(disk, rng, in_journal) else {
        // Nothing to flip: still check the cut, as the next cycle would have.
        return reopen_and_verify(disk, model, in_doubt, stats, 0).map(|_| ());
    };
    disk.flip_bit(&path, offset, rng.gen_range(0..8));
    stats.bit_flips += 1;
    trace(|| format!("bit flip at {path:?} offset {offset}"));
    let (env, report) = match Env::open_with_report(env_dir(), options(disk)) {
        Ok(e) => e,
        Err(_) => {
            stats.corruptions_detected += 1;
            return Ok(());
        }
    };
    // Recovery may drop a damaged journal record and what follows it: allowed only
    // if it says so.
    let loss_reported = report.tail != kiln_storage::JournalTail::Clean;
    match read_state(&env) {
        Err(_) => stats.corruptions_detected += 1,
        Ok(state) if &state == model || in_doubt.is_some_and(|d| &state == d) => {
            // The flip hit bytes no read depends on (free space, padding, an old
            // record); `check` walks only reachable pages.
            stats.keys_verified += state.values().map(|t| t.len() as u64).sum::<u64>();
        }
        Ok(_) if loss_reported => stats.corruptions_detected += 1,
        Ok(state) => {
            stats.corruptions_returned_as_data += 1;
            return Err(format!(
                "bit flip at {path:?} offset {offset} was returned as data: {}",
                describe_difference(model, &state)
            ));
        }
    }
    Ok(())
}

/// A byte to damage: in a used data page, a file-header copy, a free-page snapshot,
/// or the journal's records.
fn pick_flip_target(
    disk: &Arc<SimDisk>,
    rng: &mut StdRng,
    in_journal: bool,
) -> Option<(PathBuf, u64)> {
    if in_journal {
        let files: Vec<PathBuf> = disk
            .files()
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        // The newest file holding records (the last one may be preallocated zeros),
        // and only where records are (non-zero blocks).
        let (path, used) = files.iter().rev().find_map(|path| {
            let bytes = disk.read_file(path)?;
            let used: Vec<usize> = (0..bytes.len() / 4096)
                .filter(|b| bytes[b * 4096..(b + 1) * 4096].iter().any(|x| *x != 0))
                .collect();
            (!used.is_empty()).then(|| (path.clone(), used))
        })?;
        let block = used[rng.gen_range(0..used.len())];
        return Some((path, (block * 4096 + rng.gen_range(0..4096)) as u64));
    }
    let data = env_dir().join(kiln_storage::DATA_FILE);
    let bytes = disk.read_file(&data)?;
    // Sometimes the metadata instead: a byte of either file-header copy (its first
    // 116 bytes are the header; the newer copy damaged, open must fall back to the
    // older one and still lose nothing acknowledged), or a free-page snapshot.
    match rng.gen_range(0..10) {
        0 | 1 => {
            let copy = rng.gen_range(0..2u64);
            return Some((
                data,
                copy * kiln_storage::PAGE_SIZE as u64 + rng.gen_range(0..116),
            ));
        }
        2 => {
            // Non-empty snapshots, with their lengths.
            let snapshots: Vec<(PathBuf, u64)> = disk
                .files()
                .into_iter()
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("freelist-"))
                })
                .filter_map(|p| {
                    let len = disk.read_file(&p)?.len() as u64;
                    (len > 0).then_some((p, len))
                })
                .collect();
            if let Some((path, len)) = snapshots.get(rng.gen_range(0..snapshots.len().max(1))) {
                return Some((path.clone(), rng.gen_range(0..*len)));
            }
        }
        _ => {}
    }
    let pages = bytes.len() / kiln_storage::PAGE_SIZE;
    let used: Vec<usize> = (2..pages)
        .filter(|p| bytes[p * kiln_storage::PAGE_SIZE + 4] != 0)
        .collect();
    let page = *used.get(rng.gen_range(0..used.len().max(1)))?;
    Some((
        data,
        (page * kiln_storage::PAGE_SIZE + rng.gen_range(0..kiln_storage::PAGE_SIZE)) as u64,
    ))
}

/// Exhaustive mode: a fixed workload of up to 3 transactions; the power is cut at
/// every mutating operation in turn, with every cut mode.
pub fn exhaustive(txns: u32, seed: u64) -> Result<DriverStats, String> {
    // First a clean run to count the operations.
    let total_ops = {
        let disk = SimDisk::new(seed);
        let mut rng = StdRng::seed_from_u64(seed);
        let env = Env::open(env_dir(), options(&disk)).map_err(|e| e.to_string())?;
        let mut model = Model::new();
        for i in 0..txns {
            if let Step::Committed = run_txn(&env, &mut rng, &model) {
                model = NEXT.with(|n| n.borrow_mut().take()).expect("model");
            }
            if i == 1 {
                env.sync().map_err(|e| e.to_string())?;
            }
        }
        drop(env);
        disk.ops()
    };
    let mut stats = DriverStats::default();
    for cut in 0..total_ops {
        let modes = [
            CutMode::DropAll,
            CutMode::KeepAll,
            CutMode::Random,
            CutMode::Random,
        ];
        for (m, mode) in modes.into_iter().enumerate() {
            // Each mode (and each of the two random ones) gets its own disk seed.
            let disk = SimDisk::new(seed ^ (cut << 8) ^ m as u64);
            let mut rng = StdRng::seed_from_u64(seed);
            disk.cut_power_at(cut, mode);
            let mut model = Model::new();
            let mut in_doubt = None;
            let mut commits = 0;
            if let Ok(env) = Env::open(env_dir(), options(&disk)) {
                for i in 0..txns {
                    match run_txn(&env, &mut rng, &model) {
                        Step::Committed => {
                            model = NEXT.with(|n| n.borrow_mut().take()).expect("model");
                            commits += 1;
                        }
                        Step::InDoubt(next) => {
                            in_doubt = Some(next);
                            break;
                        }
                        Step::Failed => break,
                    }
                    if i == 1 && env.sync().is_err() {
                        break;
                    }
                }
            }
            if !disk.is_dead() {
                disk.cut_power(mode);
            }
            disk.restart();
            stats.power_cuts += 1;
            stats.commits_acknowledged += commits;
            let mut this = DriverStats::default();
            this.absorb_disk(&disk);
            this.power_cuts = 0;
            stats.add(&this);
            // A cut during environment creation may leave no environment, or parts
            // of one: opening again must create it (empty) or recover it.
            reopen_and_verify(&disk, &model, in_doubt.as_ref(), &mut stats, commits)
                .map_err(|e| format!("cut at op {cut} of {total_ops}, {mode:?}: {e}"))?;
        }
    }
    Ok(stats)
}
