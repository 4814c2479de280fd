//! The engines under test, behind one small trait. Every commit is durable by the
//! engine's own mechanism (see shared/BENCHMARKS.md, "Durable").

use anyhow::Result;
use serde_json::{Map, Value};
use std::path::Path;

/// A key and its value.
pub type Pair<'a> = (&'a [u8], &'a [u8]);

pub trait Engine: Send + Sync {
    /// One durable transaction holding all `pairs`.
    fn commit(&self, pairs: &[Pair]) -> Result<()>;
    /// One durable transaction of one put, as one of many concurrent clients commits it
    /// (W6). Engines with a single-writer lock simply contend for it.
    fn commit_one(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.commit(&[(key, value)])
    }
    /// What one W6 thread commits through, opened before the clock starts. For an
    /// embedded engine, the shared handle itself; a client/server engine (PostgreSQL)
    /// opens one connection per thread.
    fn client(&self) -> Result<Box<dyn Client + '_>> {
        Ok(Box::new(Shared(self)))
    }
    /// Reads every entry in key order (or reverse); returns (entries, bytes read).
    fn scan(&self, reverse: bool) -> Result<(u64, u64)>;
    /// Point gets of `keys`, in one read transaction; returns how many were found.
    fn gets(&self, keys: &[[u8; 16]]) -> Result<u64>;
    /// Engine facts for the results file (server version, settings), merged into the
    /// run's `extra`.
    fn info(&self) -> Map<String, Value> {
        Map::new()
    }
    /// Closes the engine (flushing what it flushes on close).
    fn close(self: Box<Self>) -> Result<()>;
}

/// One W6 committer, owned by one thread.
pub trait Client: Send {
    fn commit_one(&mut self, key: &[u8], value: &[u8]) -> Result<()>;
}

/// The default [`Client`]: every thread commits through the shared engine.
struct Shared<'a, E: ?Sized>(&'a E);

impl<E: Engine + ?Sized> Client for Shared<'_, E> {
    fn commit_one(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.0.commit_one(key, value)
    }
}

/// An engine that is built in but cannot run on this machine (PostgreSQL not installed,
/// or its server would not start). The child exits with [`UNAVAILABLE_EXIT`]; the parent
/// skips the engine for the rest of the suite instead of failing.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// The child's exit code for [`Unavailable`].
pub const UNAVAILABLE_EXIT: i32 = 3;

/// Every engine the tool knows, in table order.
pub const ALL: &[&str] = &[
    "kiln", "sqlite", "lmdb", "redb", "fjall", "rocksdb", "postgres", "redis",
];

/// The block cache given to the peers that keep one of their own (fjall, RocksDB):
/// their documentation's advice is to size it for the working set; every W5 key and
/// value fits. Kiln, LMDB and redb read through the OS page cache instead.
pub const PEER_CACHE_BYTES: u64 = 256 << 20;

/// Why an engine is not in this binary, or cannot run on this machine (None when it
/// can run). A reason starting with "not built" is a missing cargo feature; any other
/// means the engine is skipped.
pub fn missing_reason(name: &str) -> Option<String> {
    let built = match name {
        "kiln" => true,
        "sqlite" => cfg!(feature = "sqlite"),
        "lmdb" => cfg!(feature = "lmdb"),
        "redb" => cfg!(feature = "redb"),
        "fjall" => cfg!(feature = "fjall"),
        "rocksdb" => cfg!(feature = "rocksdb"),
        "postgres" => cfg!(feature = "postgres"),
        "redis" => return crate::server::redis_missing(),
        other => {
            return Some(format!(
                "unknown engine {other:?} (known: {})",
                ALL.join(", ")
            ))
        }
    };
    if built {
        #[cfg(feature = "postgres")]
        if name == "postgres" {
            return pg::preflight().err().map(|e| format!("skipped: {e}"));
        }
        None
    } else if name == "rocksdb" {
        Some(
            "not built: this binary was compiled without the `rocksdb` cargo feature \
             (it links Debian's librocksdb: apt-get install -y librocksdb-dev libclang-dev, \
             then build with ROCKSDB_LIB_DIR=/usr/lib/x86_64-linux-gnu)"
                .into(),
        )
    } else {
        Some(format!(
            "not built: this binary was compiled without the `{name}` cargo feature"
        ))
    }
}

/// Why `engine` does not run `workload` at all (None when it does).
pub fn not_applicable(engine: &str, workload: &str) -> Option<&'static str> {
    if crate::ycsb::WORKLOADS.contains(&workload) {
        return crate::ycsb::not_applicable(engine, workload);
    }
    if crate::docbench::WORKLOADS.contains(&workload) {
        return crate::docbench::not_applicable(engine, workload);
    }
    if crate::curve::WORKLOADS.contains(&workload) {
        return crate::curve::not_applicable(engine, workload);
    }
    if crate::soak::WORKLOADS.contains(&workload) {
        return crate::soak::not_applicable(engine, workload);
    }
    if crate::space::WORKLOADS.contains(&workload) {
        return crate::space::not_applicable(engine, workload);
    }
    match (engine, workload) {
        ("kiln", _) => None,
        ("redis", "W8" | "W9") => None,
        ("redis", _) => Some(
            "Redis is the peer of the server workloads (W8, W9: durable writes and reads \
             over the network) only",
        ),
        (_, "W8" | "W9") => Some(
            "W8 and W9 measure servers over the network (kiln serve, Redis); embedded \
             engines have no server",
        ),
        ("postgres", "W6") => None,
        ("postgres", _) => Some(
            "PostgreSQL is a peer for W6 (concurrent durable commits, one connection per \
             thread) only; W1-W5 measure embedded engines called in-process",
        ),
        _ => None,
    }
}

/// Opens (creating if needed) engine `name` in `dir`.
pub fn open(name: &str, dir: &Path) -> Result<Box<dyn Engine>> {
    if let Some(why) = missing_reason(name) {
        if why.starts_with("not built") {
            anyhow::bail!("{name}: {why}");
        }
        return Err(Unavailable(format!("{name}: {why}")).into());
    }
    std::fs::create_dir_all(dir)?;
    Ok(match name {
        "kiln" => Box::new(kiln::Kiln::open(dir)?),
        #[cfg(feature = "sqlite")]
        "sqlite" => Box::new(sqlite::Sqlite::open(dir)?),
        #[cfg(feature = "lmdb")]
        "lmdb" => Box::new(lmdb::Lmdb::open(dir)?),
        #[cfg(feature = "redb")]
        "redb" => Box::new(redb_engine::Redb::open(dir)?),
        #[cfg(feature = "fjall")]
        "fjall" => Box::new(fjall_engine::Fjall::open(dir)?),
        #[cfg(feature = "rocksdb")]
        "rocksdb" => Box::new(rocks::Rocks::open(dir)?),
        #[cfg(feature = "postgres")]
        "postgres" => Box::new(pg::Postgres::open(dir)?),
        other => anyhow::bail!("unknown engine {other:?}"),
    })
}

#[cfg(feature = "postgres")]
pub use pg::{PgTcpServer, REPORTED as PG_REPORTED_SETTINGS};

mod kiln {
    use super::*;
    use kiln_storage::{Env, Options};

    pub struct Kiln {
        env: Env,
    }

    const TREE: &str = "bench";

    impl Kiln {
        pub fn open(dir: &Path) -> Result<Self> {
            // KILN_ENCRYPTION_KEY_FILE (as `kiln serve` reads it, for YCSB): the cost
            // of encryption at rest, measured against a run without it.
            let encryption = match std::env::var_os("KILN_ENCRYPTION_KEY_FILE") {
                Some(path) => Some(kiln_storage::MasterKey::read_file(Path::new(&path))?),
                None => None,
            };
            // KILN_DECRYPTED_CACHE_MIB: the encrypted engine's cache of decrypted
            // pages (`Options::decrypted_cache_bytes`), to measure within and past it.
            let mut options = Options {
                encryption,
                ..Options::default()
            };
            if let Some(mib) = std::env::var("KILN_DECRYPTED_CACHE_MIB")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
            {
                options.decrypted_cache_bytes = mib << 20;
            }
            let env = Env::open(dir, options)?;
            let mut w = env.begin_write()?;
            w.ensure_tree(TREE)?;
            w.commit()?;
            Ok(Kiln { env })
        }
    }

    impl Engine for Kiln {
        fn commit(&self, pairs: &[Pair]) -> Result<()> {
            let mut w = self.env.begin_write()?;
            for (k, v) in pairs {
                w.put(TREE, k, v)?;
            }
            w.commit()?;
            Ok(())
        }
        fn commit_one(&self, key: &[u8], value: &[u8]) -> Result<()> {
            // Through the commit queue, as `kiln bench` W6 does: concurrent units are
            // merged into one journal write.
            let (key, value) = (key.to_vec(), value.to_vec());
            self.env.submit(move |txn| txn.put(TREE, &key, &value))?;
            Ok(())
        }
        fn scan(&self, reverse: bool) -> Result<(u64, u64)> {
            let r = self.env.begin_read()?;
            let mut c = r.cursor(TREE)?;
            let (mut n, mut bytes) = (0u64, 0u64);
            let mut e = if reverse { c.last()? } else { c.first()? };
            while let Some((k, v)) = e {
                n += 1;
                bytes += (k.len() + v.len()) as u64;
                e = if reverse { c.prev()? } else { c.next()? };
            }
            Ok((n, bytes))
        }
        fn gets(&self, keys: &[[u8; 16]]) -> Result<u64> {
            let r = self.env.begin_read()?;
            let mut found = 0;
            for k in keys {
                if r.get(TREE, k)?.is_some() {
                    found += 1;
                }
            }
            Ok(found)
        }
        fn close(self: Box<Self>) -> Result<()> {
            self.env.close()?;
            Ok(())
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use rusqlite::{params, Connection, OptionalExtension};
    use std::sync::Mutex;

    /// One connection behind a mutex: SQLite has one writer at a time anyway.
    pub struct Sqlite {
        conn: Mutex<Connection>,
    }

    impl Sqlite {
        pub fn open(dir: &Path) -> Result<Self> {
            let conn = Connection::open(dir.join("bench.sqlite"))?;
            let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
            anyhow::ensure!(mode.eq_ignore_ascii_case("wal"), "journal_mode is {mode}");
            conn.pragma_update(None, "synchronous", "FULL")?;
            conn.execute(
                "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB)",
                [],
            )?;
            Ok(Sqlite {
                conn: Mutex::new(conn),
            })
        }
    }

    impl Engine for Sqlite {
        fn commit(&self, pairs: &[Pair]) -> Result<()> {
            let mut conn = self.conn.lock().unwrap();
            let tx = conn.transaction()?;
            {
                let mut st =
                    tx.prepare_cached("INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)")?;
                for (k, v) in pairs {
                    st.execute(params![k, v])?;
                }
            }
            tx.commit()?;
            Ok(())
        }
        fn scan(&self, reverse: bool) -> Result<(u64, u64)> {
            let conn = self.conn.lock().unwrap();
            let sql = if reverse {
                "SELECT key, value FROM kv ORDER BY key DESC"
            } else {
                "SELECT key, value FROM kv ORDER BY key"
            };
            let mut st = conn.prepare(sql)?;
            let mut rows = st.query([])?;
            let (mut n, mut bytes) = (0u64, 0u64);
            while let Some(row) = rows.next()? {
                let k = row.get_ref(0)?.as_blob()?;
                let v = row.get_ref(1)?.as_blob()?;
                n += 1;
                bytes += (k.len() + v.len()) as u64;
            }
            Ok((n, bytes))
        }
        fn gets(&self, keys: &[[u8; 16]]) -> Result<u64> {
            let mut conn = self.conn.lock().unwrap();
            let tx = conn.transaction()?;
            let mut found = 0;
            {
                let mut st = tx.prepare_cached("SELECT length(value) FROM kv WHERE key = ?1")?;
                for k in keys {
                    let len: Option<i64> =
                        st.query_row(params![&k[..]], |r| r.get(0)).optional()?;
                    if len.is_some() {
                        found += 1;
                    }
                }
            }
            tx.commit()?;
            Ok(found)
        }
        fn close(self: Box<Self>) -> Result<()> {
            let conn = self.conn.into_inner().unwrap();
            conn.close().map_err(|(_, e)| e)?;
            Ok(())
        }
    }
}

#[cfg(feature = "lmdb")]
mod lmdb {
    use super::*;
    use heed::types::Bytes;
    use heed::{Database, EnvOpenOptions};

    pub struct Lmdb {
        env: heed::Env,
        db: Database<Bytes, Bytes>,
    }

    impl Lmdb {
        pub fn open(dir: &Path) -> Result<Self> {
            // Default flags: every commit is synced (no NOSYNC / NOMETASYNC).
            let env = unsafe {
                EnvOpenOptions::new()
                    .map_size(16 << 30)
                    .max_dbs(1)
                    .open(dir)?
            };
            let mut w = env.write_txn()?;
            let db: Database<Bytes, Bytes> = env.create_database(&mut w, None)?;
            w.commit()?;
            Ok(Lmdb { env, db })
        }
    }

    impl Engine for Lmdb {
        fn commit(&self, pairs: &[Pair]) -> Result<()> {
            let mut w = self.env.write_txn()?;
            for (k, v) in pairs {
                self.db.put(&mut w, k, v)?;
            }
            w.commit()?;
            Ok(())
        }
        fn scan(&self, reverse: bool) -> Result<(u64, u64)> {
            let r = self.env.read_txn()?;
            let (mut n, mut bytes) = (0u64, 0u64);
            let mut count = |e: heed::Result<(&[u8], &[u8])>| -> Result<()> {
                let (k, v) = e?;
                n += 1;
                bytes += (k.len() + v.len()) as u64;
                Ok(())
            };
            if reverse {
                for e in self.db.rev_iter(&r)? {
                    count(e)?;
                }
            } else {
                for e in self.db.iter(&r)? {
                    count(e)?;
                }
            }
            Ok((n, bytes))
        }
        fn gets(&self, keys: &[[u8; 16]]) -> Result<u64> {
            let r = self.env.read_txn()?;
            let mut found = 0;
            for k in keys {
                if self.db.get(&r, &k[..])?.is_some() {
                    found += 1;
                }
            }
            Ok(found)
        }
        fn close(self: Box<Self>) -> Result<()> {
            let Lmdb { env, .. } = *self;
            env.force_sync()?;
            env.prepare_for_closing().wait();
            Ok(())
        }
    }
}

#[cfg(feature = "redb")]
mod redb_engine {
    use super::*;
    use redb::{Database, Durability, ReadableTable, TableDefinition};

    const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("bench");

    pub struct Redb {
        db: Database,
    }

    impl Redb {
        pub fn open(dir: &Path) -> Result<Self> {
            let db = Database::create(dir.join("bench.redb"))?;
            let mut w = db.begin_write()?;
            w.set_durability(Durability::Immediate);
            w.open_table(TABLE)?;
            w.commit()?;
            Ok(Redb { db })
        }
    }

    impl Engine for Redb {
        fn commit(&self, pairs: &[Pair]) -> Result<()> {
            let mut w = self.db.begin_write()?;
            w.set_durability(Durability::Immediate);
            {
                let mut t = w.open_table(TABLE)?;
                for (k, v) in pairs {
                    t.insert(*k, *v)?;
                }
            }
            w.commit()?;
            Ok(())
        }
        fn scan(&self, reverse: bool) -> Result<(u64, u64)> {
            let r = self.db.begin_read()?;
            let t = r.open_table(TABLE)?;
            let (mut n, mut bytes) = (0u64, 0u64);
            let mut count = |e: std::result::Result<
                (redb::AccessGuard<&[u8]>, redb::AccessGuard<&[u8]>),
                redb::StorageError,
            >|
             -> Result<()> {
                let (k, v) = e?;
                n += 1;
                bytes += (k.value().len() + v.value().len()) as u64;
                Ok(())
            };
            if reverse {
                for e in t.iter()?.rev() {
                    count(e)?;
                }
            } else {
                for e in t.iter()? {
                    count(e)?;
                }
            }
            Ok((n, bytes))
        }
        fn gets(&self, keys: &[[u8; 16]]) -> Result<u64> {
            let r = self.db.begin_read()?;
            let t = r.open_table(TABLE)?;
            let mut found = 0;
            for k in keys {
                if t.get(&k[..])?.is_some() {
                    found += 1;
                }
            }
            Ok(found)
        }
        fn close(self: Box<Self>) -> Result<()> {
            drop(self);
            Ok(())
        }
    }
}

#[cfg(feature = "fjall")]
mod fjall_engine {
    use super::*;
    use fjall::{Config, Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};

    pub struct Fjall {
        keyspace: Keyspace,
        part: PartitionHandle,
    }

    impl Fjall {
        pub fn open(dir: &Path) -> Result<Self> {
            // The block cache its documentation says to size for the working set
            // (default 16 MiB), given the peers' common memory budget.
            let keyspace = Config::new(dir)
                .cache_size(super::PEER_CACHE_BYTES)
                .open()?;
            let part = keyspace.open_partition("bench", PartitionCreateOptions::default())?;
            keyspace.persist(PersistMode::SyncAll)?;
            Ok(Fjall { keyspace, part })
        }
    }

    impl Engine for Fjall {
        fn commit(&self, pairs: &[Pair]) -> Result<()> {
            let mut b = self.keyspace.batch();
            for (k, v) in pairs {
                b.insert(&self.part, *k, *v);
            }
            b.commit()?;
            // Durable: the journal is fsynced before the commit is acknowledged.
            self.keyspace.persist(PersistMode::SyncAll)?;
            Ok(())
        }
        fn commit_one(&self, key: &[u8], value: &[u8]) -> Result<()> {
            self.part.insert(key, value)?;
            self.keyspace.persist(PersistMode::SyncAll)?;
            Ok(())
        }
        fn scan(&self, reverse: bool) -> Result<(u64, u64)> {
            let (mut n, mut bytes) = (0u64, 0u64);
            let mut count = |e: fjall::Result<(fjall::Slice, fjall::Slice)>| -> Result<()> {
                let (k, v) = e?;
                n += 1;
                bytes += (k.len() + v.len()) as u64;
                Ok(())
            };
            if reverse {
                for e in self.part.iter().rev() {
                    count(e)?;
                }
            } else {
                for e in self.part.iter() {
                    count(e)?;
                }
            }
            Ok((n, bytes))
        }
        fn gets(&self, keys: &[[u8; 16]]) -> Result<u64> {
            let snap = self.part.snapshot();
            let mut found = 0;
            for k in keys {
                if snap.get(k)?.is_some() {
                    found += 1;
                }
            }
            Ok(found)
        }
        fn close(self: Box<Self>) -> Result<()> {
            self.keyspace.persist(PersistMode::SyncAll)?;
            drop(self);
            Ok(())
        }
    }
}

#[cfg(feature = "rocksdb")]
mod rocks {
    use super::*;
    use rocksdb::{IteratorMode, Options, WriteBatch, WriteOptions, DB};

    pub struct Rocks {
        db: DB,
        sync: WriteOptions,
    }

    // WriteOptions holds a raw pointer that RocksDB only reads.
    unsafe impl Sync for Rocks {}
    unsafe impl Send for Rocks {}

    impl Rocks {
        pub fn open(dir: &Path) -> Result<Self> {
            // The tuning guide's settings for point lookups and scans on a small
            // machine: an LRU block cache of the peers' common memory budget (the
            // default is 8 MiB), a 10-bit Bloom filter, index and filter blocks in
            // the cache, dynamic level sizes, background threads for both cores.
            let mut table = rocksdb::BlockBasedOptions::default();
            let cache = rocksdb::Cache::new_lru_cache(super::PEER_CACHE_BYTES as usize)?;
            table.set_block_cache(&cache);
            table.set_bloom_filter(10.0, false);
            table.set_cache_index_and_filter_blocks(true);
            let mut opts = Options::default();
            opts.create_if_missing(true);
            opts.set_block_based_table_factory(&table);
            opts.set_level_compaction_dynamic_level_bytes(true);
            opts.increase_parallelism(2);
            let db = DB::open(&opts, dir)?;
            let mut sync = WriteOptions::default();
            sync.set_sync(true);
            Ok(Rocks { db, sync })
        }
    }

    impl Engine for Rocks {
        fn commit(&self, pairs: &[Pair]) -> Result<()> {
            let mut b = WriteBatch::default();
            for (k, v) in pairs {
                b.put(k, v);
            }
            self.db.write_opt(b, &self.sync)?;
            Ok(())
        }
        fn scan(&self, reverse: bool) -> Result<(u64, u64)> {
            let mode = if reverse {
                IteratorMode::End
            } else {
                IteratorMode::Start
            };
            let (mut n, mut bytes) = (0u64, 0u64);
            for e in self.db.iterator(mode) {
                let (k, v) = e?;
                n += 1;
                bytes += (k.len() + v.len()) as u64;
            }
            Ok((n, bytes))
        }
        fn gets(&self, keys: &[[u8; 16]]) -> Result<u64> {
            let mut found = 0;
            for k in keys {
                if self.db.get_pinned(k)?.is_some() {
                    found += 1;
                }
            }
            Ok(found)
        }
        fn close(self: Box<Self>) -> Result<()> {
            self.db.flush_wal(true)?;
            drop(self);
            Ok(())
        }
    }
}

/// PostgreSQL, for W6 only: a throwaway server of its own (initdb in a directory inside
/// the run's directory, so on the same disk as the other engines; listening only on a
/// Unix socket there), one connection per W6 thread, each commit an autocommit upsert.
#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use anyhow::{bail, Context};
    use postgres::{Config, NoTls, Statement};
    use serde_json::json;
    use std::ffi::CString;
    use std::os::unix::process::CommandExt;
    use std::path::PathBuf;
    use std::process::{Command, Stdio};
    use std::sync::Mutex;
    use std::time::Instant;

    const PORT: u16 = 5432;
    /// Server settings beyond initdb's defaults. fsync, synchronous_commit and
    /// full_page_writes stay at their (durable) defaults and are checked after start.
    const SETTINGS: &[(&str, &str)] = &[
        ("listen_addresses", "''"),
        ("shared_buffers", "'256MB'"),
        ("max_connections", "200"),
        ("fsync", "on"),
        ("synchronous_commit", "on"),
        ("full_page_writes", "on"),
    ];
    /// Settings recorded in the results file.
    pub const REPORTED: &[&str] = &[
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "wal_sync_method",
        "wal_level",
        "wal_buffers",
        "commit_delay",
        "commit_siblings",
        "shared_buffers",
        "max_connections",
        "listen_addresses",
    ];
    const UPSERT: &str = "INSERT INTO kv (key, value) VALUES ($1, $2) \
                          ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value";

    /// The directory holding initdb and pg_ctl: $KILN_BENCH_PG_BINDIR if set, else
    /// `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin, else PATH.
    fn bindir() -> Result<PathBuf> {
        let has = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
        if let Some(d) = std::env::var_os("KILN_BENCH_PG_BINDIR") {
            let d = PathBuf::from(d);
            if has(&d) {
                return Ok(d);
            }
            bail!(
                "no initdb and pg_ctl in KILN_BENCH_PG_BINDIR={}",
                d.display()
            );
        }
        if let Ok(out) = Command::new("pg_config")
            .arg("--bindir")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
        {
            let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && has(&d) {
                return Ok(d);
            }
        }
        let mut versioned: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                Some((v, e.path().join("bin")))
            })
            .filter(|(_, d)| has(d))
            .collect();
        versioned.sort();
        if let Some((_, d)) = versioned.pop() {
            return Ok(d);
        }
        if let Some(path) = std::env::var_os("PATH") {
            if let Some(d) = std::env::split_paths(&path).find(|d| has(d)) {
                return Ok(d);
            }
        }
        bail!(
            "PostgreSQL is not installed (no initdb and pg_ctl in `pg_config --bindir`, \
             /usr/lib/postgresql/*/bin or PATH; apt-get install -y postgresql)"
        )
    }

    /// The unprivileged user that runs initdb and the server when we are root (initdb
    /// refuses to run as root).
    #[derive(Clone)]
    struct User {
        name: String,
        uid: u32,
        gid: u32,
    }

    fn lookup(name: &str) -> Option<User> {
        let c = CString::new(name).ok()?;
        // SAFETY: getpwnam returns null or a pointer to a static record, read at once
        // (no other thread calls it meanwhile: this runs before the workload's threads).
        unsafe {
            let pw = libc::getpwnam(c.as_ptr());
            (!pw.is_null()).then(|| User {
                name: name.to_string(),
                uid: (*pw).pw_uid,
                gid: (*pw).pw_gid,
            })
        }
    }

    fn run_as() -> Result<Option<User>> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(None);
        }
        match ["postgres", "nobody"].iter().find_map(|u| lookup(u)) {
            Some(u) => Ok(Some(u)),
            None => bail!(
                "running as root, and there is no unprivileged user (postgres or nobody) \
                 to run initdb and the server as"
            ),
        }
    }

    /// What the parent checks before the suite: the binaries and, as root, the user.
    pub fn preflight() -> Result<()> {
        bindir()?;
        run_as()?;
        Ok(())
    }

    /// Runs `cmd` to completion; on failure, says which step failed and its last line.
    fn run(cmd: &mut Command, what: &str) -> Result<()> {
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {what}"))?;
        if !out.status.success() {
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let last = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
                .to_string();
            bail!("{what} failed ({}): {last}", out.status);
        }
        Ok(())
    }

    fn chown(path: &Path, user: &User) -> Result<()> {
        std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid))
            .with_context(|| format!("chown {} to {}", path.display(), user.name))
    }

    /// The throwaway server; stopping it and removing its directory on drop, so also
    /// when the run fails.
    struct Server {
        bin: PathBuf,
        user: Option<User>,
        /// `postgres/` inside the run's directory: data/, server.log and the socket.
        root: PathBuf,
        data: PathBuf,
        socket_dir: PathBuf,
        /// A short directory of our own under /tmp, when `root` is too long a path for
        /// a Unix socket (108 bytes).
        own_socket_dir: bool,
        started: bool,
        version: String,
        start_seconds: f64,
        /// The port (also the socket's name: `.s.PGSQL.<port>`).
        port: u16,
    }

    impl Server {
        fn cmd(&self, program: &str) -> Command {
            let mut c = Command::new(self.bin.join(program));
            c.current_dir(&self.root)
                .env_remove("PGDATA")
                .env_remove("PGHOST")
                .env_remove("PGPORT")
                .env_remove("PGOPTIONS");
            if let Some(u) = &self.user {
                // The child sets its groups, gid and uid before exec (std drops the
                // supplementary groups when root changes uid).
                c.uid(u.uid).gid(u.gid).env("USER", &u.name);
            }
            c
        }

        fn start(dir: &Path) -> Result<Server> {
            Server::start_with(dir, PORT, &[])
        }

        /// `start` on `port`, with `extra` settings after [`SETTINGS`] (later lines
        /// of postgresql.conf win).
        fn start_with(dir: &Path, port: u16, extra: &[(&str, &str)]) -> Result<Server> {
            let t = Instant::now();
            let mut server = Server::in_fresh_root(dir)?;
            server.port = port;
            if let Some(u) = &server.user {
                chown(&server.root, u)?;
            }
            let socket = server.root.join(format!(".s.PGSQL.{port}"));
            if socket.as_os_str().len() > 100 {
                server.use_short_socket_dir()?;
            }
            server.check_user_can_write_root()?;
            server.initdb()?;
            server.append_settings(extra)?;
            server.version = server.postgres_version();
            // Set before pg_ctl starts it: a start that fails half-way still gets a
            // stop on drop.
            server.started = true;
            server.pg_ctl_start()?;
            server.start_seconds = t.elapsed().as_secs_f64();
            Ok(server)
        }

        /// A not yet initialised server in `postgres/` under `dir`, emptied first;
        /// from here on, dropping it removes that directory.
        fn in_fresh_root(dir: &Path) -> Result<Server> {
            let bin = bindir()?;
            let user = run_as()?;
            let root = std::fs::canonicalize(dir)
                .with_context(|| format!("resolving {}", dir.display()))?
                .join("postgres");
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir(&root).with_context(|| format!("creating {}", root.display()))?;
            Ok(Server {
                bin,
                user,
                data: root.join("data"),
                socket_dir: root.clone(),
                root,
                own_socket_dir: false,
                started: false,
                version: String::new(),
                start_seconds: 0.0,
                port: PORT,
            })
        }

        /// The socket in a short directory of our own under /tmp, for a root too
        /// long a path for a Unix socket.
        fn use_short_socket_dir(&mut self) -> Result<()> {
            let mut template = *b"/tmp/kiln-pg-XXXXXX\0";
            // SAFETY: a writable NUL-terminated template, as mkdtemp wants.
            let p = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
            if p.is_null() {
                bail!(
                    "mkdtemp for the socket: {}",
                    std::io::Error::last_os_error()
                );
            }
            self.socket_dir =
                PathBuf::from(std::str::from_utf8(&template[..template.len() - 1]).expect("ascii"));
            self.own_socket_dir = true;
            if let Some(u) = &self.user {
                chown(&self.socket_dir, u)?;
            }
            Ok(())
        }

        /// Reachable by the server's user at all? (A parent directory of --dir that
        /// only root may enter makes initdb fail with a less obvious message.)
        fn check_user_can_write_root(&self) -> Result<()> {
            let Some(u) = &self.user else {
                return Ok(());
            };
            let mut probe = Command::new("test");
            probe.arg("-w").arg(&self.root).uid(u.uid).gid(u.gid);
            if !probe
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                bail!(
                    "user {} cannot write {} (a parent directory of --dir is not \
                     searchable by it: chmod o+x it, or use another --dir)",
                    u.name,
                    self.root.display()
                );
            }
            Ok(())
        }

        fn initdb(&self) -> Result<()> {
            let mut initdb = self.cmd("initdb");
            initdb.arg("-D").arg(&self.data).args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
            ]);
            run(&mut initdb, "initdb")
        }

        /// [`SETTINGS`], the socket's directory and the port, appended to
        /// postgresql.conf (later lines win over initdb's).
        fn append_settings(&self, extra: &[(&str, &str)]) -> Result<()> {
            let mut conf = String::from("\n# kiln-bench\n");
            for (k, v) in SETTINGS.iter().chain(extra) {
                conf.push_str(&format!("{k} = {v}\n"));
            }
            let sock = self
                .socket_dir
                .to_str()
                .context("socket path is not UTF-8")?;
            conf.push_str(&format!(
                "unix_socket_directories = '{}'\nport = {}\n",
                sock.replace('\'', "''"),
                self.port
            ));
            use std::io::Write as _;
            std::fs::OpenOptions::new()
                .append(true)
                .open(self.data.join("postgresql.conf"))
                .and_then(|mut f| f.write_all(conf.as_bytes()))
                .context("writing postgresql.conf")
        }

        /// `postgres --version`, empty if it cannot be run.
        fn postgres_version(&self) -> String {
            self.cmd("postgres")
                .arg("--version")
                .stdin(Stdio::null())
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default()
        }

        /// pg_ctl start, waiting up to 60 s; on failure, the server log's last line
        /// says why better than pg_ctl does.
        fn pg_ctl_start(&self) -> Result<()> {
            self.pg_ctl_start_in(None)
        }

        /// pg_ctl start, its process first moved into the memory cgroup `cgroup`
        /// (v1: `cgroup.procs`), so that the postmaster and every process it forks
        /// are charged there from their first page on.
        fn pg_ctl_start_in(&self, cgroup: Option<&Path>) -> Result<()> {
            let log = self.root.join("server.log");
            let mut pg_ctl = self.cmd("pg_ctl");
            if let Some(cg) = cgroup {
                let procs = cg.join("cgroup.procs");
                if let Some(u) = &self.user {
                    // The child writes its own pid after it has become that user.
                    chown(&procs, u)?;
                }
                let procs = std::ffi::CString::new(procs.as_os_str().as_encoded_bytes())?;
                use std::os::unix::process::CommandExt;
                // SAFETY: between fork and exec the closure only makes system calls
                // (open, write, close) on memory prepared before the fork.
                unsafe {
                    pg_ctl.pre_exec(move || {
                        let mut digits = [0u8; 24];
                        let mut n = libc::getpid() as u64;
                        let mut at = digits.len();
                        loop {
                            at -= 1;
                            digits[at] = b'0' + (n % 10) as u8;
                            n /= 10;
                            if n == 0 {
                                break;
                            }
                        }
                        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                        if fd < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        let len = digits.len() - at;
                        let written = libc::write(fd, digits[at..].as_ptr().cast(), len);
                        libc::close(fd);
                        if written != len as isize {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            pg_ctl
                .arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", "60", "start"]);
            if let Err(e) = run(&mut pg_ctl, "pg_ctl start") {
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let last = tail
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim()
                    .to_string();
                bail!("{e:#}; server.log: {last}");
            }
            Ok(())
        }

        /// pg_ctl stop -m fast (immediate if that fails); the data stays.
        fn pg_ctl_stop(&mut self) -> Result<()> {
            if !self.started {
                return Ok(());
            }
            self.started = false;
            let mut fast = self.cmd("pg_ctl");
            fast.arg("-D")
                .arg(&self.data)
                .args(["-m", "fast", "-w", "-t", "60", "stop"]);
            let res = run(&mut fast, "pg_ctl stop -m fast");
            if res.is_err() {
                let mut immediate = self.cmd("pg_ctl");
                immediate
                    .arg("-D")
                    .arg(&self.data)
                    .args(["-m", "immediate", "-w", "stop"]);
                let _ = run(&mut immediate, "pg_ctl stop -m immediate");
            }
            res
        }

        /// Stops the server, then removes the directory.
        fn stop(&mut self) -> Result<()> {
            let res = self.pg_ctl_stop();
            let _ = std::fs::remove_dir_all(&self.root);
            if self.own_socket_dir {
                self.own_socket_dir = false;
                let _ = std::fs::remove_dir_all(&self.socket_dir);
            }
            res
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.stop();
        }
    }

    /// A throwaway server that also listens on loopback TCP (YCSB: its clients
    /// connect over TCP, as Kiln's and Redis's do), stopped when dropped.
    pub struct PgTcpServer {
        server: Server,
        pub port: u16,
    }

    impl PgTcpServer {
        pub fn start(dir: &Path) -> Result<PgTcpServer> {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let server = Server::start_with(dir, port, &[("listen_addresses", "'127.0.0.1'")])?;
            Ok(PgTcpServer { server, port })
        }

        pub fn version(&self) -> &str {
            &self.server.version
        }

        /// The cluster's data directory (SPACE measures it).
        pub fn data_dir(&self) -> &Path {
            &self.server.data
        }

        /// Stops the server (its data kept), runs `between` (the caller drops the
        /// files from the page cache), and starts it again inside `cgroup`.
        pub fn restart_in(
            &mut self,
            cgroup: Option<&Path>,
            between: impl FnOnce(&Path) -> Result<()>,
        ) -> Result<()> {
            self.server.pg_ctl_stop()?;
            between(&self.server.data)?;
            self.server.started = true;
            self.server.pg_ctl_start_in(cgroup)
        }

        /// The postmaster's pid (its first line of postmaster.pid).
        pub fn postmaster_pid(&self) -> Option<u32> {
            std::fs::read_to_string(self.server.data.join("postmaster.pid"))
                .ok()?
                .lines()
                .next()?
                .trim()
                .parse()
                .ok()
        }
    }

    pub struct Postgres {
        /// The setup connection (table, settings; `commit` for completeness).
        conn: Mutex<postgres::Client>,
        config: Config,
        info: Map<String, Value>,
        /// Last, so that it is dropped (stopped) after the connection.
        server: Server,
    }

    impl Postgres {
        pub fn open(dir: &Path) -> Result<Self> {
            let unavailable =
                |e: anyhow::Error| Unavailable(format!("PostgreSQL could not start: {e:#}"));
            let server = Server::start(dir).map_err(unavailable)?;
            let mut config = Config::new();
            config
                .host_path(&server.socket_dir)
                .port(PORT)
                .user("postgres")
                .dbname("postgres")
                .application_name("kiln-bench");
            let mut conn = config
                .connect(NoTls)
                .context("connecting over the Unix socket")
                .map_err(unavailable)?;
            conn.batch_execute("CREATE TABLE kv (key bytea PRIMARY KEY, value bytea)")?;
            let mut settings = Map::new();
            for name in REPORTED {
                let v: String = conn
                    .query_one("SELECT current_setting($1)", &[name])?
                    .get(0);
                settings.insert(name.to_string(), json!(v));
            }
            for name in ["fsync", "synchronous_commit", "full_page_writes"] {
                if settings[name] != "on" {
                    bail!("PostgreSQL {name} is {}, not on", settings[name]);
                }
            }
            let server_version: String = conn.query_one("SHOW server_version", &[])?.get(0);
            let version: String = conn.query_one("SELECT version()", &[])?.get(0);
            let mut info = Map::new();
            info.insert("server_version".into(), json!(server_version));
            info.insert("server_version_full".into(), json!(version));
            info.insert("server_binary".into(), json!(server.version));
            info.insert("server_bindir".into(), json!(server.bin));
            info.insert(
                "server_user".into(),
                json!(server.user.as_ref().map(|u| u.name.clone())),
            );
            info.insert("settings".into(), Value::Object(settings));
            info.insert(
                "table".into(),
                json!("kv(key bytea PRIMARY KEY, value bytea)"),
            );
            info.insert("statement".into(), json!(UPSERT));
            info.insert(
                "connection".into(),
                json!(format!(
                    "Unix socket in {} (listen_addresses=''), one connection per W6 thread, autocommit",
                    server.socket_dir.display()
                )),
            );
            info.insert(
                "initdb_and_start_seconds".into(),
                json!(server.start_seconds),
            );
            Ok(Postgres {
                conn: Mutex::new(conn),
                config,
                info,
                server,
            })
        }
    }

    /// One W6 thread's connection, with the upsert prepared.
    struct PgClient {
        client: postgres::Client,
        upsert: Statement,
    }

    impl Client for PgClient {
        fn commit_one(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
            // Outside a transaction block: autocommit, durable when it returns.
            self.client.execute(&self.upsert, &[&key, &value])?;
            Ok(())
        }
    }

    impl Engine for Postgres {
        fn commit(&self, pairs: &[Pair]) -> Result<()> {
            let mut conn = self.conn.lock().unwrap();
            let mut tx = conn.transaction()?;
            let st = tx.prepare(UPSERT)?;
            for (k, v) in pairs {
                tx.execute(&st, &[k, v])?;
            }
            tx.commit()?;
            Ok(())
        }
        fn client(&self) -> Result<Box<dyn Client + '_>> {
            let mut client = self.config.connect(NoTls)?;
            let upsert = client.prepare(UPSERT)?;
            Ok(Box::new(PgClient { client, upsert }))
        }
        fn scan(&self, _reverse: bool) -> Result<(u64, u64)> {
            bail!("postgres runs W6 only")
        }
        fn gets(&self, _keys: &[[u8; 16]]) -> Result<u64> {
            bail!("postgres runs W6 only")
        }
        fn info(&self) -> Map<String, Value> {
            let mut info = self.info.clone();
            if let Ok(mut conn) = self.conn.lock() {
                if let Ok(row) = conn.query_one("SELECT count(*) FROM kv", &[]) {
                    info.insert("rows_in_table".into(), json!(row.get::<_, i64>(0)));
                }
            }
            info
        }
        fn close(self: Box<Self>) -> Result<()> {
            let Postgres {
                conn, mut server, ..
            } = *self;
            drop(conn);
            server.stop()
        }
    }
}
