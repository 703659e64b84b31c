//! The store: a call locks its keys, reads their rows, lets the core decide
//! on them ([`States`]), and writes back what changed, in one database
//! transaction of its own or of the caller's.
//!
//! A file a part of it: the calls queued and decided in batches
//! (`dispatch`), a call's rows and the keys they keep (`rows`), locking,
//! reading, deciding on and writing them (`decide`), deciding inside the
//! caller's transaction (`in_transaction`), pings, the tables and sweeps
//! (`upkeep`), and what the store counts (`stats`).
//!
//! [`States`]: sluice_core::states::States

mod decide;
mod dispatch;
mod in_transaction;
mod rows;
mod stats;
mod upkeep;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice_core::{Clock, Decision, Limit, Mode, Op, Outcome, Settle, Store, StoreError, Value};
use sqlx::Connection as _;
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::mpsc;

use crate::config::PostgresConfig;
use crate::schema::{SchemaError, Statements};

use dispatch::{MAX_QUEUED, Queued, READ_COMMITTED, dispatch};
pub use in_transaction::InTransactionError;
use rows::{op_rows, row, shard_rows};
use stats::Counters;
pub use stats::PostgresStats;
use upkeep::upkeep;

/// Limits kept in PostgreSQL, shared by every server that uses the same
/// database, and decided, if the caller likes, inside its own transaction
/// ([`PostgresStore::transact_in`]).
///
/// Calls of the [`Store`] trait are queued and decided in batches: one
/// database transaction locks the rows of every call in a batch, the core
/// decides the calls in the order they came, and one commit writes them
/// back. When the database is idle a call leaves at once, alone; under
/// load, calls queue while batches are in flight, and batches grow.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use sluice_core::{Limit, Mode, Op, Store, TokenBucket};
/// use sluice_postgres::{PostgresConfig, PostgresStore};
/// let store = PostgresStore::new(PostgresConfig::from_url("postgres://app@localhost/app")?)?;
/// let limit = Limit::new("login", TokenBucket::new(1.0, 5.0)?);
/// let out = store.transact(&[Op::new(&limit, "alice", 1.0)], Mode::CONSUME).await?;
/// println!("allowed: {}", out.allowed);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    shared: Arc<Shared>,
    /// Calls waiting for a batch. The store's tasks hold it weakly, so they
    /// end when the last handle goes.
    queue: mpsc::Sender<Box<dyn Queued>>,
}

/// What the store's handles and its tasks share.
struct Shared {
    pool: PgPool,
    config: PostgresConfig,
    sql: Statements,
    /// The time calls are decided at, when not the database's (tests).
    clock: Option<Arc<dyn Clock>>,
    /// Whether the tables are known to be there: set by a migration, and
    /// cleared by a call that finds them gone (a database restored from an
    /// older backup, a crash that lost their making).
    migrated: AtomicBool,
    /// Whether the database answered the last call or health check.
    ready: AtomicBool,
    /// Whether the database refused the last connection the upkeep tried to
    /// open: until it accepts one, calls fail at once instead of waiting
    /// out their deadline on a pool that retries in vain.
    refused: AtomicBool,
    /// Wakes the upkeep to ping at once: a batch failed.
    suspect: tokio::sync::Notify,
    counters: Counters,
}

/// A store made outside a Tokio runtime, which its tasks need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a PostgresStore must be created inside a Tokio runtime")]
pub struct NoRuntime;

// ---- Making a store ----

impl PostgresStore {
    /// A store on the database `config` names. No connection is made until
    /// the upkeep's first ping, which also makes the tables if they are
    /// missing. Call it within a Tokio runtime: the upkeep and the batches
    /// run on it.
    pub fn new(config: PostgresConfig) -> Result<PostgresStore, NoRuntime> {
        Self::with_time(config, None)
    }

    /// A store that decides at the times `clock` reads instead of on the
    /// database's clock: for tests on a fake clock, and for a single
    /// server whose clock is the one that counts.
    pub fn with_clock(
        config: PostgresConfig,
        clock: impl Clock + 'static,
    ) -> Result<PostgresStore, NoRuntime> {
        Self::with_time(config, Some(Arc::new(clock)))
    }

    fn with_time(
        config: PostgresConfig,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<PostgresStore, NoRuntime> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| NoRuntime)?;
        let pool = PgPoolOptions::new()
            .max_connections(config.pool_size())
            // The wait for a connection is inside each call's deadline.
            .acquire_timeout(config.timeout())
            .connect_lazy_with(config.options.clone().options([
                // The database gives up on a statement when its caller has:
                // a connection dropped mid-statement at a deadline would
                // otherwise wait, out of the pool, for a lock held by a
                // caller's long transaction. The migration lifts them.
                ("statement_timeout", millis(config.timeout())),
                ("lock_timeout", millis(config.timeout())),
            ]));
        let shared = Arc::new(Shared {
            pool,
            sql: Statements::for_schema(config.schema()),
            config,
            clock,
            migrated: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            suspect: tokio::sync::Notify::new(),
            counters: Counters::default(),
        });
        let (queue, calls) = mpsc::channel(MAX_QUEUED);
        runtime.spawn(dispatch(shared.clone(), calls));
        runtime.spawn(upkeep(shared.clone(), queue.downgrade()));
        Ok(PostgresStore { shared, queue })
    }

    /// Whether the database answered the last call or health check.
    pub fn is_ready(&self) -> bool {
        self.shared.ready.load(Ordering::Relaxed)
    }

    /// Asks the database for `SELECT 1` within the deadline, updating
    /// [`PostgresStore::is_ready`].
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.shared.ping().await
    }

    /// Its configuration.
    pub fn config(&self) -> &PostgresConfig {
        &self.shared.config
    }

    /// Makes the tables if they are missing, and checks the version of
    /// those already there: what the first call does, and `sluice migrate`.
    pub async fn migrate(&self) -> Result<(), SchemaError> {
        self.shared.migrate().await
    }

    /// Drops up to a thousand rows that hold nothing any more, skipping any
    /// a call holds; returns how many it dropped. A row past its time is
    /// read as no row, so this only gives the room back.
    pub async fn sweep(&self) -> Result<u64, StoreError> {
        self.shared.sweep().await
    }
}

/// `d` as PostgreSQL's settings write a duration, at least 1 ms (0 would
/// turn the timeout off).
fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// An operation that owns what it names, to wait in the queue.
struct OwnedOp {
    limit: Limit,
    key: String,
    cost: f64,
    pick: u64,
    lease: u64,
}

impl OwnedOp {
    fn of(op: &Op<'_>) -> OwnedOp {
        OwnedOp {
            limit: op.limit.clone(),
            key: op.key.to_owned(),
            cost: op.cost,
            pick: op.pick,
            lease: op.lease,
        }
    }

    fn as_op(&self) -> Op<'_> {
        Op {
            limit: &self.limit,
            key: &self.key,
            cost: self.cost,
            pick: self.pick,
            lease: self.lease,
        }
    }
}

// ---- The Store trait ----

impl Store for PostgresStore {
    async fn transact(&self, ops: &[Op<'_>], mode: Mode) -> Result<Outcome, StoreError> {
        for op in ops {
            op.validate(mode.reserve)?;
        }
        let keys = op_rows(ops);
        let owned: Vec<OwnedOp> = ops.iter().map(OwnedOp::of).collect();
        self.run(keys, move |states, now| {
            let ops: Vec<Op<'_>> = owned.iter().map(OwnedOp::as_op).collect();
            states.transact(&ops, |i, s| row(ops[i].limit, ops[i].key, s), mode, now)
        })
        .await?
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        let shared = &self.shared;
        let work = async {
            if shared.refused.load(Ordering::Relaxed) {
                return Err(StoreError::Unavailable(
                    "the database refuses connections".into(),
                ));
            }
            let mut conn = shared.pool.acquire().await.map_err(unavailable)?;
            let mut tx = conn.begin_with(READ_COMMITTED).await.map_err(unavailable)?;
            self.reset_in(&mut tx, limit, key)
                .await
                .map_err(|e| match e {
                    InTransactionError::Cost(c) => StoreError::Cost(c),
                    other => unavailable(other),
                })?;
            tx.commit().await.map_err(unavailable)
        };
        tokio::time::timeout(shared.config.timeout(), work)
            .await
            .unwrap_or(Err(StoreError::Timeout))
    }

    async fn value(&self, limit: &Limit, key: &str) -> Result<Value, StoreError> {
        let keys = shard_rows(limit, key);
        let (limit, key, shards) = (limit.clone(), key.to_owned(), keys.clone());
        self.run(keys, move |states, now| {
            states.value(&limit, &key, &shards, now)
        })
        .await
    }

    async fn settle(
        &self,
        limit: &Limit,
        key: &str,
        change: Settle,
    ) -> Result<Decision, StoreError> {
        change.validate(limit)?;
        let keys = shard_rows(limit, key);
        let (limit, key, shards) = (limit.clone(), key.to_owned(), keys.clone());
        self.run(keys, move |states, now| {
            states.settle(&limit, &key, &shards, change, now)
        })
        .await?
    }

    async fn release(&self, limit: &Limit, key: &str, id: u64) -> Result<bool, StoreError> {
        if !limit.takes_leases() || id == 0 {
            return Ok(false);
        }
        let keys = shard_rows(limit, key);
        let (limit, shards) = (limit.clone(), keys.clone());
        self.run(keys, move |states, now| {
            states.release(&limit, &shards, id, now)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_store_made_outside_a_runtime_says_so_instead_of_panicking() {
        let config = PostgresConfig::from_url("postgres://app@localhost/app").unwrap();
        assert!(matches!(PostgresStore::new(config), Err(NoRuntime)));
    }
}
