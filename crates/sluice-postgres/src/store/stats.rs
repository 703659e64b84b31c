//! What the store counts, for metrics.

use std::sync::atomic::{AtomicU64, Ordering};

use super::PostgresStore;

/// Counters of what the store did, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresStats {
    /// Calls decided in a batch that committed.
    pub decided: u64,
    /// Batches committed, each one database transaction.
    pub batches: u64,
    /// Batches that failed with an error other than a timeout; each
    /// failed every call in it.
    pub errors: u64,
    /// Batches that missed the deadline of every call in them.
    pub timeouts: u64,
    /// Connections taken from the pool for a batch.
    pub pool_acquires: u64,
    /// The time those took, in microseconds: time spent waiting for a
    /// connection when the pool is busy, or for one to be opened.
    pub pool_wait_micros: u64,
    /// Rows swept, holding nothing any more.
    pub swept: u64,
    /// Calls waiting in the queue now (a gauge, not a count).
    pub queued: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) decided: AtomicU64,
    pub(super) batches: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) pool_acquires: AtomicU64,
    pub(super) pool_wait_micros: AtomicU64,
    pub(super) swept: AtomicU64,
}

pub(super) fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

impl PostgresStore {
    /// What the store has done so far.
    pub fn stats(&self) -> PostgresStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PostgresStats {
            decided: get(&c.decided),
            batches: get(&c.batches),
            errors: get(&c.errors),
            timeouts: get(&c.timeouts),
            pool_acquires: get(&c.pool_acquires),
            pool_wait_micros: get(&c.pool_wait_micros),
            swept: get(&c.swept),
            queued: (self.queue.max_capacity() - self.queue.capacity()) as u64,
        }
    }
}
