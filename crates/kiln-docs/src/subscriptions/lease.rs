//! Who holds a subscription: at most one worker at a time, per database, in memory.
//!
//! A worker takes a `Lease` before it is sent anything and keeps it for its
//! connection's life; dropping the lease frees the subscription. A second worker
//! either waits (tries again until it is free), or takes it over: the first lease
//! is then revoked, and its acknowledgments are refused from that moment (checked
//! inside the acknowledgment's own transaction, `Database::acknowledge_subscription`),
//! so a worker that was taken over can never move the cursor over a batch the new
//! holder has not acknowledged. Holders are not stored: after a restart nobody
//! holds anything, which is right since every connection died with the process.

use crate::SubscriptionError;
use crate::{DocError, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

struct Holder {
    generation: u64,
    revoked: Arc<AtomicBool>,
}

#[derive(Default)]
pub(crate) struct LeaseTable {
    holders: Mutex<HashMap<String, Holder>>,
    next_generation: AtomicU64,
}

/// How a worker asks for a subscription that another worker may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStrategy {
    /// Fail with `SubscriptionBusy` if another worker holds it (the caller may
    /// try again later: that is how a waiting worker waits).
    IfFree,
    /// Revoke the current holder's lease and take the subscription.
    TakeOver,
}

/// The exclusive right to be sent a subscription's batches and to acknowledge them.
pub struct SubscriptionLease {
    check: LeaseCheck,
}

/// What checks a lease is still current, without owning it (an acknowledgment's
/// unit takes one onto the commit path).
#[derive(Clone)]
pub(crate) struct LeaseCheck {
    table: Arc<LeaseTable>,
    name: String,
    generation: u64,
    revoked: Arc<AtomicBool>,
}

impl LeaseCheck {
    /// Calls `f` with whether the lease is the subscription's current one, under
    /// the table's lock: a take-over cannot complete while `f` runs, so what `f`
    /// does for a current lease happens before the new holder exists.
    pub fn with_current<T>(&self, f: impl FnOnce(bool) -> T) -> T {
        let holders = self.table.holders.lock();
        let current = holders
            .get(&self.name)
            .is_some_and(|h| h.generation == self.generation)
            && !self.revoked.load(Ordering::SeqCst);
        f(current)
    }
}

impl std::fmt::Debug for SubscriptionLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionLease")
            .field("name", &self.check.name)
            .field("generation", &self.check.generation)
            .field("revoked", &self.is_revoked())
            .finish()
    }
}

impl SubscriptionLease {
    pub fn name(&self) -> &str {
        &self.check.name
    }

    /// True once another worker took the subscription over or it was deleted: the
    /// holder should stop (its acknowledgments are refused).
    pub fn is_revoked(&self) -> bool {
        self.check.revoked.load(Ordering::SeqCst)
    }

    /// True while this is the subscription's current lease (not revoked, not
    /// replaced): a cluster's worker proposes an acknowledgment only then.
    pub fn is_current(&self) -> bool {
        self.check.with_current(|current| current)
    }

    pub(crate) fn check(&self) -> LeaseCheck {
        self.check.clone()
    }
}

impl Drop for SubscriptionLease {
    fn drop(&mut self) {
        let c = &self.check;
        let mut holders = c.table.holders.lock();
        if holders
            .get(&c.name)
            .is_some_and(|h| h.generation == c.generation)
        {
            holders.remove(&c.name);
        }
    }
}

impl LeaseTable {
    pub fn acquire(
        self: &Arc<Self>,
        name: &str,
        strategy: LeaseStrategy,
    ) -> Result<SubscriptionLease> {
        let mut holders = self.holders.lock();
        if let Some(current) = holders.get(name) {
            match strategy {
                LeaseStrategy::IfFree => {
                    return Err(DocError::Subscription(SubscriptionError::Busy(
                        name.to_string(),
                    )));
                }
                LeaseStrategy::TakeOver => current.revoked.store(true, Ordering::SeqCst),
            }
        }
        let generation = self.next_generation.fetch_add(1, Ordering::SeqCst) + 1;
        let revoked = Arc::new(AtomicBool::new(false));
        holders.insert(
            name.to_string(),
            Holder {
                generation,
                revoked: revoked.clone(),
            },
        );
        Ok(SubscriptionLease {
            check: LeaseCheck {
                table: self.clone(),
                name: name.to_string(),
                generation,
                revoked,
            },
        })
    }

    /// Revokes and forgets the holder of `name` (the subscription was deleted).
    pub fn revoke(&self, name: &str) {
        if let Some(h) = self.holders.lock().remove(name) {
            h.revoked.store(true, Ordering::SeqCst);
        }
    }

    pub fn is_held(&self, name: &str) -> bool {
        self.holders.lock().contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_take_over_revokes() {
        let t = Arc::new(LeaseTable::default());
        let a = t.acquire("s", LeaseStrategy::IfFree).unwrap();
        assert!(matches!(
            t.acquire("s", LeaseStrategy::IfFree),
            Err(DocError::Subscription(SubscriptionError::Busy(_)))
        ));
        // Another subscription is independent.
        let other = t.acquire("t", LeaseStrategy::IfFree).unwrap();
        assert!(a.check().with_current(|c| c));
        let b = t.acquire("s", LeaseStrategy::TakeOver).unwrap();
        assert!(a.is_revoked() && !a.check().with_current(|c| c));
        assert!(b.check().with_current(|c| c));
        // The revoked lease's drop must not free the new holder's subscription.
        drop(a);
        assert!(t.is_held("s"));
        drop(b);
        assert!(!t.is_held("s"));
        let c = t.acquire("s", LeaseStrategy::IfFree).unwrap();
        t.revoke("s");
        assert!(c.is_revoked() && !t.is_held("s"));
        drop(other);
    }
}
