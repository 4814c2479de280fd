//! The engines under test, behind one small trait. Every commit is durable by the
//! engine's own mechanism (see shared/BENCHMARKS.md, "Durable").

use anyhow::Result;
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
    /// Reads every entry in key order (or reverse); returns (entries, bytes read).
    fn scan(&self, reverse: bool) -> Result<(u64, u64)>;
    /// Point gets of `keys`, in one read transaction; returns how many were found.
    fn gets(&self, keys: &[[u8; 16]]) -> Result<u64>;
    /// Closes the engine (flushing what it flushes on close).
    fn close(self: Box<Self>) -> Result<()>;
}

/// Every engine the tool knows, in table order.
pub const ALL: &[&str] = &["kiln", "sqlite", "lmdb", "redb", "fjall", "rocksdb"];

/// Why an engine is not in this binary (None when it is).
pub fn missing_reason(name: &str) -> Option<String> {
    let built = match name {
        "kiln" => true,
        "sqlite" => cfg!(feature = "sqlite"),
        "lmdb" => cfg!(feature = "lmdb"),
        "redb" => cfg!(feature = "redb"),
        "fjall" => cfg!(feature = "fjall"),
        "rocksdb" => cfg!(feature = "rocksdb"),
        other => {
            return Some(format!(
                "unknown engine {other:?} (known: {})",
                ALL.join(", ")
            ))
        }
    };
    if built {
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

/// Opens (creating if needed) engine `name` in `dir`.
pub fn open(name: &str, dir: &Path) -> Result<Box<dyn Engine>> {
    if let Some(why) = missing_reason(name) {
        anyhow::bail!("{name}: {why}");
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
        other => anyhow::bail!("unknown engine {other:?}"),
    })
}

mod kiln {
    use super::*;
    use kiln_storage::{Env, Options};

    pub struct Kiln {
        env: Env,
    }

    const TREE: &str = "bench";

    impl Kiln {
        pub fn open(dir: &Path) -> Result<Self> {
            let env = Env::open(dir, Options::default())?;
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
            let keyspace = Config::new(dir).open()?;
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
            let mut opts = Options::default();
            opts.create_if_missing(true);
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
