//! Subscriptions changed by a cluster's replicated log: every node applies the
//! same entries in the same order, with the leader's time, so every node holds
//! the same definitions and the same positions, and a worker moved to another
//! node (a failover) resumes after the last acknowledgment the cluster committed.
//! Each entry's log index is claimed in its own transaction, as document writes do
//! (`database/logged.rs`): an entry applied before a crash is not applied twice.
//!
//! Leases stay in memory, on the node that serves the worker (the leader): an
//! acknowledgment is proposed only by the holder of the current lease, and moves
//! the position forward only (the same `max` as a local one).

use super::{acknowledge_in, delete_in, SubscriptionInfo, SubscriptionStart};
use crate::database::claim_log_index;
use crate::{Database, Result};
use serde_json::{Map, Value};

impl Database {
    /// Checks what `create_subscription_logged` would check, without writing: the
    /// leader refuses a bad name, query or start before it proposes the entry.
    pub fn check_new_subscription(
        &self,
        name: &str,
        query: &str,
        parameters: &Map<String, Value>,
        start: &SubscriptionStart,
    ) -> Result<()> {
        self.live()?;
        self.new_subscription(name, query, parameters.clone(), start.clone())
            .map(|_| ())
    }

    /// `create_subscription` from log entry `log_index`, created at the leader's
    /// time `at_ms`; `None` when the entry was applied before.
    pub fn create_subscription_logged(
        &self,
        log_index: u64,
        at_ms: u64,
        name: &str,
        query: &str,
        parameters: Map<String, Value>,
        start: SubscriptionStart,
    ) -> Result<Option<SubscriptionInfo>> {
        let env = self.live()?;
        let (new, collection) = self.new_subscription(name, query, parameters, start)?;
        let stored = env.submit_with(move |txn| {
            if !claim_log_index(txn, log_index)? {
                return Ok(None);
            }
            new.create_in(txn, at_ms).map(Some)
        })?;
        Ok(stored.map(|s| self.info(name, s, collection)))
    }

    /// `delete_subscription` from log entry `log_index`; false when the entry was
    /// applied before. This node's worker of it, if any, loses its lease.
    pub fn delete_subscription_logged(&self, log_index: u64, name: &str) -> Result<bool> {
        let env = self.live()?;
        super::validate_subscription_name(name)?;
        let key = name.to_string();
        let deleted = env.submit_with(move |txn| {
            if !claim_log_index(txn, log_index)? {
                return Ok(false);
            }
            delete_in(txn, key).map(|()| true)
        })?;
        self.subscription_leases.revoke(name);
        Ok(deleted)
    }

    /// Moves the position of `name` to `up_to` (never back) from log entry
    /// `log_index`, at the leader's time `at_ms`; the position after it, `None`
    /// when the entry was applied before.
    pub fn acknowledge_subscription_logged(
        &self,
        log_index: u64,
        at_ms: u64,
        name: &str,
        up_to: u64,
    ) -> Result<Option<u64>> {
        let env = self.live()?;
        super::validate_subscription_name(name)?;
        let key = name.to_string();
        env.submit_with(move |txn| {
            if !claim_log_index(txn, log_index)? {
                return Ok(None);
            }
            acknowledge_in(txn, &key, up_to, at_ms, |txn, value| {
                txn.put(crate::model::schema::SUBSCRIPTIONS, key.as_bytes(), value)?;
                Ok(())
            })
            .map(Some)
        })
    }
}
