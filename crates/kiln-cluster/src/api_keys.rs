//! API keys in a cluster: created and revoked once, through the log, so that every
//! node lets in the same keys. The records (and what they look like) are the
//! server's; the cluster only carries them: `Command::PutApiKey` holds a record as
//! the server's JSON (with the hash of the key's secret: the secret itself never
//! enters the log), `Command::RevokeApiKey` an id. Both are idempotent (a record
//! saved again replaces itself, a key revoked again is gone already), so an entry
//! applied again after a crash, or after a snapshot taken past it, changes
//! nothing. A snapshot carries the whole set (a section `@api-keys`), so a node
//! that catches up from one has the keys of the cluster, not its own.

/// Where a node keeps the cluster's API keys: the server's key file.
pub trait ApiKeyStore: Send + Sync {
    /// Saves `record_json` (the server's record), replacing one of its id.
    fn put(&self, record_json: &str) -> Result<(), String>;
    /// Removes the key `id`; false if there was none.
    fn revoke(&self, id: &str) -> Result<bool, String>;
    /// Every record, as a snapshot carries them.
    fn export(&self) -> Result<Vec<u8>, String>;
    /// Replaces every record with those `export` gave (a snapshot installed).
    fn import(&self, exported: &[u8]) -> Result<(), String>;
}

/// The name of a snapshot's section of API keys (a database name cannot start
/// with `@`).
pub(crate) const SECTION: &str = "@api-keys";

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_docs::{DocStore, DocsOptions};
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// Keys in memory: id -> record.
    #[derive(Default)]
    struct MemoryKeys(Mutex<BTreeMap<String, String>>);

    fn id_of(record: &str) -> String {
        let v: serde_json::Value = serde_json::from_str(record).unwrap();
        v["id"].as_str().unwrap().to_string()
    }

    impl ApiKeyStore for MemoryKeys {
        fn put(&self, record_json: &str) -> Result<(), String> {
            let mut keys = self.0.lock().unwrap();
            keys.insert(id_of(record_json), record_json.to_string());
            Ok(())
        }
        fn revoke(&self, id: &str) -> Result<bool, String> {
            Ok(self.0.lock().unwrap().remove(id).is_some())
        }
        fn export(&self) -> Result<Vec<u8>, String> {
            serde_json::to_vec(&*self.0.lock().unwrap()).map_err(|e| e.to_string())
        }
        fn import(&self, exported: &[u8]) -> Result<(), String> {
            *self.0.lock().unwrap() =
                serde_json::from_slice(exported).map_err(|e| e.to_string())?;
            Ok(())
        }
    }

    fn store(dir: &std::path::Path) -> DocStore {
        let mut docs = DocsOptions::default();
        docs.storage.journal_file_size_bytes = 1 << 20;
        docs.storage.data_grow_step_bytes = 1 << 20;
        DocStore::open(dir, docs).unwrap()
    }

    /// A node that installs a snapshot has the cluster's keys, not its own; one
    /// from a build without keys leaves a node's keys alone.
    #[test]
    fn a_snapshot_carries_the_clusters_keys() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (store(&root.path().join("a")), store(&root.path().join("b")));
        a.create_database("d").unwrap();
        let (keys_a, keys_b) = (MemoryKeys::default(), MemoryKeys::default());
        keys_a.put(r#"{"id":"k1","name":"one"}"#).unwrap();
        keys_a.put(r#"{"id":"k2","name":"two"}"#).unwrap();
        keys_b.put(r#"{"id":"k9","name":"only on b"}"#).unwrap();
        let snapshots = crate::snapshot::SnapshotDir::open(&root.path().join("snap")).unwrap();
        let (built, _) = snapshots.build(&a, Some(&keys_a)).unwrap();
        crate::snapshot::install(&b, &built, Some(&keys_b)).unwrap();
        assert_eq!(keys_b.export().unwrap(), keys_a.export().unwrap());
        assert!(b.database("d").is_ok());

        let (plain, _) = snapshots.build(&a, None).unwrap();
        let keys_c = MemoryKeys::default();
        keys_c.put(r#"{"id":"k7","name":"c's"}"#).unwrap();
        let c = store(&root.path().join("c"));
        crate::snapshot::install(&c, &plain, Some(&keys_c)).unwrap();
        assert_eq!(keys_c.0.lock().unwrap().len(), 1);
        assert!(c.database("d").is_ok());
    }
}
