//! The YCSB core workloads (A-F) as a generator: keys, records, operation mixes and
//! the request distributions of YCSB's `CoreWorkload`, written after its Java source
//! (site.ycsb.workloads.CoreWorkload, site.ycsb.generator.ZipfianGenerator,
//! ScrambledZipfianGenerator, SkewedLatestGenerator, AcknowledgedCounterGenerator,
//! site.ycsb.Utils.fnvhash64) and its workload files (workloads/workloada..f).
//! docs/ycsb.md says what matches and what differs. The runners that drive a
//! system with it are bench/'s (`--workloads YA..YF`); this module has no I/O.
//!
//! Everything is deterministic for a seed: each client draws from its own
//! `SmallRng` seeded from the run's seed and its index.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// YCSB's defaults (CoreWorkload): 10 fields of 100 bytes, named field0..field9.
pub const FIELD_COUNT: usize = 10;
pub const FIELD_LENGTH: usize = 100;
/// The zipfian constant θ of every YCSB zipfian (ZipfianGenerator.ZIPFIAN_CONSTANT).
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// ScrambledZipfianGenerator draws from a zipfian over this many items, with its
/// zeta precomputed (ITEM_COUNT, ZETAN), then hashes the draw into the key range.
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// FNV-1a over the 8 little-endian bytes of `val`, made non-negative as Java's
/// `Math.abs` does (Utils.fnvhash64; `Math.abs(Long.MIN_VALUE)` stays negative
/// in Java, here it wraps to the same bits, a 1-in-2^64 case).
pub fn fnvhash64(val: u64) -> u64 {
    const OFFSET_BASIS: u64 = 0xCBF2_9CE4_8422_2325;
    const PRIME: u64 = 1_099_511_628_211;
    let mut h = OFFSET_BASIS;
    let mut v = val;
    for _ in 0..8 {
        h ^= v & 0xff;
        h = h.wrapping_mul(PRIME);
        v >>= 8;
    }
    (h as i64).wrapping_abs() as u64
}

/// The key of record `keynum` with YCSB's default `insertorder=hashed`:
/// `"user" + fnvhash64(keynum)` (CoreWorkload.buildKeyName, zeropadding 1).
pub fn key_name(keynum: u64) -> String {
    format!("user{}", fnvhash64(keynum))
}

/// ζ(n, θ) = Σ_{i=1..n} 1/i^θ, continued from ζ(start, θ) = `initial`.
fn zeta(start: u64, n: u64, theta: f64, initial: f64) -> f64 {
    let mut sum = initial;
    for i in start..n {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

/// YCSB's ZipfianGenerator (Gray et al., "Quickly Generating Billion-Record
/// Synthetic Databases", SIGMOD 1994): item 0 is the most popular. `next_long(n)`
/// may be asked for a growing item count (SkewedLatestGenerator does); ζ is then
/// extended incrementally, as YCSB does.
#[derive(Debug, Clone)]
pub struct Zipfian {
    base: u64,
    items: u64,
    theta: f64,
    zeta2theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    count_for_zeta: u64,
}

impl Zipfian {
    /// Items `min..=max`, ζ computed (O(items), once).
    pub fn new(min: u64, max: u64, theta: f64) -> Zipfian {
        let items = max - min + 1;
        Zipfian::with_zetan(min, max, theta, zeta(0, items, theta, 0.0))
    }

    /// Items `min..=max` with ζ(items) given (ScrambledZipfianGenerator's 10^10).
    pub fn with_zetan(min: u64, max: u64, theta: f64, zetan: f64) -> Zipfian {
        let items = max - min + 1;
        let zeta2theta = zeta(0, 2, theta, 0.0);
        Zipfian {
            base: min,
            items,
            theta,
            zeta2theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan),
            count_for_zeta: items,
        }
    }

    pub fn next(&mut self, rng: &mut SmallRng) -> u64 {
        self.next_long(self.items, rng)
    }

    /// A draw among `item_count` items (ZipfianGenerator.nextLong).
    pub fn next_long(&mut self, item_count: u64, rng: &mut SmallRng) -> u64 {
        if item_count > self.count_for_zeta {
            self.zetan = zeta(self.count_for_zeta, item_count, self.theta, self.zetan);
            self.count_for_zeta = item_count;
            // YCSB recomputes eta with the constructor's `items`, not the new
            // count; kept so that the draws are YCSB's.
            self.eta = (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta))
                / (1.0 - self.zeta2theta / self.zetan);
        }
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        self.base + (item_count as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
    }

    /// P(item `rank` from the base), by the formula (for tests and docs).
    pub fn probability(&self, rank: u64) -> f64 {
        1.0 / ((rank + 1) as f64).powf(self.theta) / self.zetan
    }
}

/// ScrambledZipfianGenerator: a zipfian draw over 10^10 items, hashed into
/// `min..=max`, so that the popular keys are spread over the key space.
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    min: u64,
    item_count: u64,
    gen: Zipfian,
}

impl ScrambledZipfian {
    pub fn new(min: u64, max: u64) -> ScrambledZipfian {
        ScrambledZipfian {
            min,
            item_count: max - min + 1,
            gen: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
        }
    }

    pub fn next(&mut self, rng: &mut SmallRng) -> u64 {
        self.min + fnvhash64(self.gen.next(rng)) % self.item_count
    }
}

/// The run phase's insert key sequence shared by all clients
/// (AcknowledgedCounterGenerator): `next` hands out key numbers, `last_value` is
/// the highest number below which every insert was acknowledged, so a read never
/// asks for a record whose insert has not finished.
#[derive(Debug)]
pub struct InsertSequence {
    counter: AtomicU64,
    acked: Mutex<(u64, BTreeSet<u64>)>,
}

impl InsertSequence {
    /// The next insert gets `start` (the record count after the load phase).
    pub fn new(start: u64) -> InsertSequence {
        InsertSequence {
            counter: AtomicU64::new(start),
            acked: Mutex::new((start.saturating_sub(1), BTreeSet::new())),
        }
    }

    pub fn next(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::SeqCst)
    }

    /// Marks `keynum`'s insert done.
    pub fn acknowledge(&self, keynum: u64) {
        let mut g = self.acked.lock().unwrap_or_else(|p| p.into_inner());
        let (limit, pending) = &mut *g;
        pending.insert(keynum);
        while pending.remove(&(*limit + 1)) {
            *limit += 1;
        }
    }

    pub fn last_value(&self) -> u64 {
        self.acked.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

/// The request distributions of the core workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distribution {
    Zipfian,
    Latest,
}

/// A workload file's proportions and distributions (workloads/workloada..f).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// `A`..`F`.
    pub letter: char,
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub scan: f64,
    pub read_modify_write: f64,
    pub distribution: Distribution,
    pub max_scan_length: u64,
}

const fn workload(letter: char, mix: [f64; 5], distribution: Distribution) -> Workload {
    Workload {
        letter,
        read: mix[0],
        update: mix[1],
        insert: mix[2],
        scan: mix[3],
        read_modify_write: mix[4],
        distribution,
        // workloade sets maxscanlength=100 (CoreWorkload's default is 1000, but
        // only E scans).
        max_scan_length: 100,
    }
}

/// The six core workloads, as their files set them ([read, update, insert, scan,
/// read-modify-write]).
pub const WORKLOADS: [Workload; 6] = [
    workload('A', [0.5, 0.5, 0.0, 0.0, 0.0], Distribution::Zipfian),
    workload('B', [0.95, 0.05, 0.0, 0.0, 0.0], Distribution::Zipfian),
    workload('C', [1.0, 0.0, 0.0, 0.0, 0.0], Distribution::Zipfian),
    workload('D', [0.95, 0.0, 0.05, 0.0, 0.0], Distribution::Latest),
    workload('E', [0.0, 0.0, 0.05, 0.95, 0.0], Distribution::Zipfian),
    workload('F', [0.5, 0.0, 0.0, 0.0, 0.5], Distribution::Zipfian),
];

/// The workload of a letter (`a`/`A`, or a bench label `YA`).
pub fn by_name(name: &str) -> Option<Workload> {
    let n = name.trim().to_ascii_uppercase();
    let letter = n.strip_prefix('Y').unwrap_or(&n);
    let mut chars = letter.chars();
    let (Some(c), None) = (chars.next(), chars.next()) else {
        return None;
    };
    WORKLOADS.iter().copied().find(|w| w.letter == c)
}

/// One operation of the run phase, with what it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Read {
        key: String,
    },
    /// One field rewritten (`writeallfields=false`, YCSB's default).
    Update {
        key: String,
        field: usize,
        value: String,
    },
    /// A new record: `keynum` is acknowledged to the sequence once written.
    Insert {
        keynum: u64,
        key: String,
    },
    Scan {
        start: String,
        count: u64,
    },
    /// A read, then an update of one field (YCSB: not atomic, two requests).
    ReadModifyWrite {
        key: String,
        field: usize,
        value: String,
    },
}

impl Op {
    /// YCSB's name of the operation, as its reports measure it.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Read { .. } => "READ",
            Op::Update { .. } => "UPDATE",
            Op::Insert { .. } => "INSERT",
            Op::Scan { .. } => "SCAN",
            Op::ReadModifyWrite { .. } => "READ-MODIFY-WRITE",
        }
    }
}

/// The name of field `i` (`field0`..`field9`).
pub fn field_name(i: usize) -> String {
    format!("field{i}")
}

/// A field value of `FIELD_LENGTH` printable ASCII characters. YCSB's
/// RandomByteIterator makes printable bytes too; `"` and `\` are left out here so
/// that every system stores exactly 100 bytes per field (JSON would escape them).
pub fn field_value(rng: &mut SmallRng) -> String {
    const ALPHABET: &[u8] =
        b" !#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]^_`abcdefghijklmnopqrstuvwxyz{|}~";
    (0..FIELD_LENGTH)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A whole record: `FIELD_COUNT` fields in order.
pub fn record(rng: &mut SmallRng) -> Vec<(String, String)> {
    (0..FIELD_COUNT)
        .map(|i| (field_name(i), field_value(rng)))
        .collect()
}

/// One client's operation stream for a workload's run phase.
#[derive(Debug)]
pub struct Client<'a> {
    workload: Workload,
    rng: SmallRng,
    inserts: &'a InsertSequence,
    chooser: KeyChooser,
    cumulative: [f64; 5],
}

#[derive(Debug)]
enum KeyChooser {
    Zipfian(ScrambledZipfian),
    /// SkewedLatestGenerator: the newest acknowledged record is the most popular.
    Latest(Zipfian),
}

impl<'a> Client<'a> {
    /// Client `index` of a run over `record_count` loaded records, expecting about
    /// `operation_count` operations in all (the zipfian's range is widened by
    /// twice the expected inserts, as CoreWorkload does).
    pub fn new(
        workload: Workload,
        record_count: u64,
        operation_count: u64,
        inserts: &'a InsertSequence,
        seed: u64,
        index: u64,
    ) -> Client<'a> {
        let expected_new_keys = (operation_count as f64 * workload.insert * 2.0) as u64;
        let chooser = match workload.distribution {
            Distribution::Zipfian => KeyChooser::Zipfian(ScrambledZipfian::new(
                0,
                record_count.max(1) - 1 + expected_new_keys,
            )),
            // SkewedLatestGenerator: a ZipfianGenerator of `lastValue()` items
            // (the newest key number at the start).
            Distribution::Latest => {
                KeyChooser::Latest(Zipfian::new(0, record_count.max(3) - 2, ZIPFIAN_CONSTANT))
            }
        };
        let w = workload;
        let mut cumulative = [w.read, w.update, w.insert, w.scan, w.read_modify_write];
        for i in 1..cumulative.len() {
            cumulative[i] += cumulative[i - 1];
        }
        Client {
            workload,
            rng: SmallRng::seed_from_u64(
                seed ^ (index + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ w.letter as u64,
            ),
            inserts,
            chooser,
            cumulative,
        }
    }

    /// A key number of an acknowledged record (CoreWorkload.nextKeynum).
    fn next_keynum(&mut self) -> u64 {
        let last = self.inserts.last_value();
        match &mut self.chooser {
            KeyChooser::Zipfian(z) => loop {
                let k = z.next(&mut self.rng);
                if k <= last {
                    return k;
                }
            },
            KeyChooser::Latest(z) => last - z.next_long(last, &mut self.rng).min(last),
        }
    }

    pub fn next_op(&mut self) -> Op {
        let total = self.cumulative[4];
        let pick = self.rng.gen::<f64>() * total;
        let which = self.cumulative.iter().position(|&c| pick < c).unwrap_or(0);
        match which {
            0 => Op::Read {
                key: key_name(self.next_keynum()),
            },
            1 => {
                let key = key_name(self.next_keynum());
                let field = self.rng.gen_range(0..FIELD_COUNT);
                Op::Update {
                    key,
                    field,
                    value: field_value(&mut self.rng),
                }
            }
            2 => {
                let keynum = self.inserts.next();
                Op::Insert {
                    keynum,
                    key: key_name(keynum),
                }
            }
            3 => {
                let start = key_name(self.next_keynum());
                let count = self.rng.gen_range(1..=self.workload.max_scan_length);
                Op::Scan { start, count }
            }
            _ => {
                let key = key_name(self.next_keynum());
                let field = self.rng.gen_range(0..FIELD_COUNT);
                Op::ReadModifyWrite {
                    key,
                    field,
                    value: field_value(&mut self.rng),
                }
            }
        }
    }

    /// A record for an insert (the same generator, so the stream stays
    /// deterministic).
    pub fn record(&mut self) -> Vec<(String, String)> {
        record(&mut self.rng)
    }
}

/// The record the load phase writes for `keynum`: deterministic per key number,
/// so every system is loaded with the same bytes whatever the client order.
pub fn load_record(seed: u64, keynum: u64) -> Vec<(String, String)> {
    record(&mut SmallRng::seed_from_u64(seed ^ fnvhash64(keynum)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// YCSB's first key with the default hashed insert order is the well-known
    /// "user6284781860667377211" (fnvhash64(0)).
    #[test]
    fn keys_are_ycsbs() {
        assert_eq!(key_name(0), "user6284781860667377211");
        assert_eq!(fnvhash64(1), 8_517_097_267_634_966_620);
        assert_eq!(fnvhash64(2), 1_820_151_046_732_198_393);
    }

    /// The two head items are drawn exactly with the formula's probability
    /// (Gray's algorithm is exact there), and the ranks below follow 1/i^θ
    /// within a few percent.
    #[test]
    fn zipfian_head_frequencies_match_the_formula() {
        let n = 1000;
        let mut z = Zipfian::new(0, n - 1, ZIPFIAN_CONSTANT);
        let mut rng = SmallRng::seed_from_u64(7);
        let draws = 400_000u64;
        let mut counts = vec![0u64; n as usize];
        for _ in 0..draws {
            let v = z.next(&mut rng);
            assert!(v < n, "{v} out of range");
            counts[v as usize] += 1;
        }
        for rank in 0..2 {
            let want = z.probability(rank) * draws as f64;
            let got = counts[rank as usize] as f64;
            assert!(
                (got - want).abs() < 0.03 * want,
                "rank {rank}: {got} draws, the formula says {want:.0}"
            );
        }
        // Ranks 2..10 as a group (the approximation is looser per item).
        let want: f64 = (2..10).map(|r| z.probability(r)).sum::<f64>() * draws as f64;
        let got: u64 = counts[2..10].iter().sum();
        assert!(
            (got as f64 - want).abs() < 0.10 * want,
            "ranks 2..10: {got} draws, the formula says {want:.0}"
        );
        // Monotone head.
        assert!(counts[0] > counts[1] && counts[1] > counts[5] && counts[5] > counts[500]);
    }

    /// The scrambled zipfian keeps the zipfian's skew but spreads its hot items:
    /// the hottest key is fnvhash64(0) mod n, then fnvhash64(1) mod n.
    #[test]
    fn scrambled_zipfian_puts_the_hot_items_where_the_hash_says() {
        let n = 100_000;
        let mut z = ScrambledZipfian::new(0, n - 1);
        let mut rng = SmallRng::seed_from_u64(11);
        let mut counts = std::collections::HashMap::new();
        let draws = 200_000;
        for _ in 0..draws {
            let v = z.next(&mut rng);
            assert!(v < n);
            *counts.entry(v).or_insert(0u64) += 1;
        }
        let mut by_count: Vec<(u64, u64)> = counts.into_iter().collect();
        by_count.sort_by_key(|c| std::cmp::Reverse(c.1));
        assert_eq!(by_count[0].0, fnvhash64(0) % n);
        assert_eq!(by_count[1].0, fnvhash64(1) % n);
        // P(item 0) = 1/ζ(10^10) ≈ 3.8 %.
        let share = by_count[0].1 as f64 / draws as f64;
        assert!((share - 1.0 / SCRAMBLED_ZETAN).abs() < 0.004, "{share}");
    }

    #[test]
    fn the_zeta_of_10_to_the_10_is_the_precomputed_one_in_its_first_digits() {
        // ζ grows slowly: the first 10^6 terms, plus the integral of the tail,
        // come within 0.01 of YCSB's constant.
        let head = zeta(0, 1_000_000, ZIPFIAN_CONSTANT, 0.0);
        let (a, b, t): (f64, f64, f64) = (1_000_000.5, 1e10 + 0.5, ZIPFIAN_CONSTANT);
        let tail = (b.powf(1.0 - t) - a.powf(1.0 - t)) / (1.0 - t);
        assert!(
            (head + tail - SCRAMBLED_ZETAN).abs() < 0.01,
            "{}",
            head + tail
        );
    }

    #[test]
    fn streams_are_deterministic_and_follow_the_mix() {
        let seq = InsertSequence::new(1000);
        let ops = |w: Workload| {
            let mut c = Client::new(w, 1000, 10_000, &seq, 42, 3);
            (0..10_000).map(|_| c.next_op()).collect::<Vec<_>>()
        };
        let a = by_name("YA").unwrap();
        assert_eq!(ops(a), ops(a));
        let count = |ops: &[Op], kind: &str| ops.iter().filter(|o| o.kind() == kind).count();
        let a_ops = ops(a);
        let reads = count(&a_ops, "READ");
        assert!((4700..5300).contains(&reads), "{reads} reads in A");
        assert_eq!(reads + count(&a_ops, "UPDATE"), 10_000);
        let c_ops = ops(by_name("c").unwrap());
        assert_eq!(count(&c_ops, "READ"), 10_000);
        let f_ops = ops(by_name("F").unwrap());
        assert!((4700..5300).contains(&count(&f_ops, "READ-MODIFY-WRITE")));
        // Every key read is a loaded record's.
        let loaded: std::collections::HashSet<String> = (0..1000).map(key_name).collect();
        assert!(a_ops.iter().all(|o| match o {
            Op::Read { key } | Op::Update { key, .. } => loaded.contains(key),
            _ => false,
        }));
    }

    #[test]
    fn scans_are_uniform_up_to_100_and_inserts_take_new_keys() {
        let seq = InsertSequence::new(500);
        let mut c = Client::new(by_name("E").unwrap(), 500, 2000, &seq, 1, 0);
        let (mut lengths, mut inserts) = (Vec::new(), Vec::new());
        for _ in 0..4000 {
            match c.next_op() {
                Op::Scan { count, .. } => lengths.push(count),
                Op::Insert { keynum, key } => {
                    assert_eq!(key, key_name(keynum));
                    inserts.push(keynum)
                }
                other => panic!("E made {other:?}"),
            }
        }
        assert_eq!(*lengths.iter().min().unwrap(), 1);
        assert_eq!(*lengths.iter().max().unwrap(), 100);
        let mean = lengths.iter().sum::<u64>() as f64 / lengths.len() as f64;
        assert!((mean - 50.5).abs() < 3.0, "{mean}");
        assert!((150..250).contains(&inserts.len()), "{}", inserts.len());
        assert_eq!(inserts[0], 500);
        assert!(inserts.windows(2).all(|w| w[1] == w[0] + 1));
    }

    /// Workload D reads the newest records most: with inserts acknowledged, the
    /// latest key is the most frequent; an unacknowledged insert is never read.
    #[test]
    fn latest_reads_the_newest_acknowledged_records_most() {
        let seq = InsertSequence::new(1000);
        let mut c = Client::new(by_name("D").unwrap(), 1000, 10_000, &seq, 5, 0);
        let newest = key_name(999);
        let mut hits = std::collections::HashMap::new();
        let mut pending = Vec::new();
        for _ in 0..20_000 {
            match c.next_op() {
                Op::Read { key } => *hits.entry(key).or_insert(0u32) += 1,
                Op::Insert { keynum, .. } => pending.push(keynum),
                other => panic!("D made {other:?}"),
            }
        }
        assert_eq!(seq.last_value(), 999, "nothing acknowledged yet");
        let top = hits.iter().max_by_key(|(_, n)| **n).unwrap().0;
        assert_eq!(top, &newest);
        assert!(!hits.contains_key(&key_name(1000)));
        // Acknowledged out of order: the limit moves once the gap is filled.
        seq.acknowledge(pending[1]);
        assert_eq!(seq.last_value(), 999);
        seq.acknowledge(pending[0]);
        assert_eq!(seq.last_value(), pending[1]);
    }

    #[test]
    fn records_are_ten_fields_of_100_bytes_and_json_safe() {
        let r = load_record(9, 123);
        assert_eq!(r, load_record(9, 123));
        assert_eq!(r.len(), FIELD_COUNT);
        for (i, (name, value)) in r.iter().enumerate() {
            assert_eq!(name, &format!("field{i}"));
            assert_eq!(value.len(), FIELD_LENGTH);
            assert!(!value.contains('"') && !value.contains('\\'));
        }
        assert!(by_name("YG").is_none() && by_name("").is_none());
    }
}
