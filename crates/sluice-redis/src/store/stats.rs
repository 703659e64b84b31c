//! What the store has done, counted for metrics.

use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::StoreError;

use super::Shared;

/// Counters of what the store did, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Transactions decided by Redis.
    pub remote: u64,
    /// Transactions denied from the local deny cache, without Redis.
    pub local_denials: u64,
    /// Script calls made (each carries one batch).
    pub script_calls: u64,
    /// Calls that failed with an error other than a timeout.
    pub errors: u64,
    /// Calls that missed their deadline.
    pub timeouts: u64,
    /// Resets announced by any store sharing the Redis (this one included)
    /// that the deny cache applied.
    pub invalidations: u64,
    /// Subscriptions to reset announcements made, each of which cleared the
    /// deny cache (resets may have been missed before it).
    pub subscribes: u64,
    /// Subscriptions lost (a dropped connection, an unanswered keepalive):
    /// until the next one, the deny cache denies nothing.
    pub subscription_losses: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) remote: AtomicU64,
    pub(super) local_denials: AtomicU64,
    pub(super) script_calls: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) timeouts: AtomicU64,
}

pub(super) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Shared {
    pub(super) fn count(&self, e: &StoreError) {
        match e {
            StoreError::Timeout => bump(&self.counters.timeouts),
            StoreError::Cost(_) => {}
            _ => bump(&self.counters.errors),
        }
    }
}
