//! The store: a call locks its keys, reads their rows, lets the core decide
//! on them ([`States`]), and writes back what changed, in one database
//! transaction of its own or of the caller's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_core::states::{States, Stored};
use sluice_core::{
    Clock, CostError, Decision, Limit, Mode, Nanos, Op, Outcome, Settle, Store, StoreError, Value,
};
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Acquire, PgConnection, Row as _};

use crate::config::PostgresConfig;
use crate::schema::{self, SchemaError, Statements};

/// A row's key: the limit's name, the key, the shard.
pub(crate) type Row = (String, String, u32);

/// The most rows one sweep drops in one statement: few enough that it
/// holds its row locks for a moment only.
const SWEEP_BATCH: i64 = 1_000;

/// Limits kept in PostgreSQL, shared by every server that uses the same
/// database, and decided, if the caller likes, inside its own transaction
/// ([`PostgresStore::transact_in`]).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use sluice_core::{Limit, Mode, Op, Store, TokenBucket};
/// use sluice_postgres::{PostgresConfig, PostgresStore};
/// let store = PostgresStore::new(PostgresConfig::from_url("postgres://app@localhost/app")?);
/// let limit = Limit::new("login", TokenBucket::new(1.0, 5.0)?);
/// let out = store.transact(&[Op::new(&limit, "alice", 1.0)], Mode::CONSUME).await?;
/// println!("allowed: {}", out.allowed);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    config: PostgresConfig,
    sql: Arc<Statements>,
    /// The time calls are decided at, when not the database's (tests).
    clock: Option<Arc<dyn Clock>>,
    /// Whether the tables are known to be there: set by a migration, and
    /// cleared by a call that finds them gone (a database restored from an
    /// older backup, a crash that lost their making).
    migrated: Arc<AtomicBool>,
    /// Whether the database answered the last call or health check.
    ready: Arc<AtomicBool>,
    /// Held while any handle of the store is: its upkeep stops when the
    /// last one goes.
    alive: Arc<()>,
}

/// What went wrong deciding inside a caller's transaction.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InTransactionError {
    /// The call itself was bad (a cost no limit can take); retrying will
    /// not help.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// The database failed, or refused the transaction: see
    /// [`InTransactionError::is_retryable`].
    #[error("the database: {0}")]
    Database(#[from] sqlx::Error),
    /// The store's tables are missing or of another version.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// The transaction cannot be decided as it is (one limit named under
    /// two kinds of state).
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for InTransactionError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Cost(c) => InTransactionError::Cost(c),
            other => InTransactionError::Store(other),
        }
    }
}

impl InTransactionError {
    /// Whether the caller should roll back and run its transaction again:
    /// a serialization failure (SERIALIZABLE, or REPEATABLE READ over a row
    /// another transaction changed since it began) or a deadlock with the
    /// caller's own locks. Nothing was decided wrongly; nothing was spent
    /// once the transaction is rolled back.
    pub fn is_retryable(&self) -> bool {
        match self {
            InTransactionError::Database(sqlx::Error::Database(e)) => {
                matches!(e.code().as_deref(), Some("40001" | "40P01"))
            }
            _ => false,
        }
    }
}

// ---- Making a store ----

impl PostgresStore {
    /// A store on the database `config` names. No connection is made until
    /// the first call, which also makes the tables if they are missing.
    /// Call it within a Tokio runtime: the pool's upkeep runs on it.
    pub fn new(config: PostgresConfig) -> PostgresStore {
        Self::with_time(config, None)
    }

    /// A store that decides at the times `clock` reads instead of on the
    /// database's clock: for tests on a fake clock, and for a single
    /// server whose clock is the one that counts.
    pub fn with_clock(config: PostgresConfig, clock: impl Clock + 'static) -> PostgresStore {
        Self::with_time(config, Some(Arc::new(clock)))
    }

    fn with_time(config: PostgresConfig, clock: Option<Arc<dyn Clock>>) -> PostgresStore {
        let pool = PgPoolOptions::new()
            .max_connections(config.pool_size())
            // The wait for a connection is inside each call's deadline.
            .acquire_timeout(config.timeout())
            .connect_lazy_with(config.options.clone());
        let store = PostgresStore {
            pool,
            sql: Arc::new(Statements::for_schema(config.schema())),
            config,
            clock,
            migrated: Arc::new(AtomicBool::new(false)),
            ready: Arc::new(AtomicBool::new(false)),
            alive: Arc::new(()),
        };
        tokio::spawn(upkeep(
            store.clone_for_upkeep(),
            Arc::downgrade(&store.alive),
        ));
        store
    }

    /// A handle for the upkeep task, which must not keep the store alive.
    fn clone_for_upkeep(&self) -> PostgresStore {
        PostgresStore {
            alive: Arc::new(()),
            ..self.clone()
        }
    }

    /// Whether the database answered the last call or health check.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Asks the database for `SELECT 1` within the deadline, updating
    /// [`PostgresStore::is_ready`].
    pub async fn ping(&self) -> Result<(), StoreError> {
        let work = async {
            sqlx::query("SELECT 1")
                .execute(&self.pool)
                .await
                .map_err(unavailable)
        };
        let result = tokio::time::timeout(self.config.timeout(), work)
            .await
            .unwrap_or(Err(StoreError::Timeout))
            .map(|_| ());
        self.ready.store(result.is_ok(), Ordering::Relaxed);
        result
    }

    /// Its configuration.
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    /// Makes the tables if they are missing, and checks the version of
    /// those already there: what the first call does, and `sluice migrate`.
    pub async fn migrate(&self) -> Result<(), SchemaError> {
        if self.migrated.load(Ordering::Acquire) {
            return Ok(());
        }
        // Calls that find the tables unknown at once each run this; the
        // migration's advisory lock makes one make them and the others
        // find them made.
        let mut conn = self.pool.acquire().await?;
        schema::migrate(&mut conn, self.config.schema(), self.config.durable()).await?;
        self.migrated.store(true, Ordering::Release);
        Ok(())
    }

    /// Notes a database error that says the tables are gone, so that the
    /// next call makes them again.
    fn noticed(&self, e: &sqlx::Error) {
        if let sqlx::Error::Database(db) = e
            && matches!(db.code().as_deref(), Some("42P01" | "3F000"))
        {
            self.migrated.store(false, Ordering::Release);
        }
    }
}

// ---- Deciding ----

impl PostgresStore {
    /// Decides `ops` inside the caller's transaction `conn` (a
    /// `sqlx::Transaction<'_, Postgres>` dereferences to one): rolled back,
    /// nothing was spent; committed, it was spent as durably as the
    /// caller's own rows.
    ///
    /// The keys' rows stay locked until the caller's transaction ends, so
    /// on one hot key the callers' transactions run one after another: keep
    /// the ones that decide short. Under REPEATABLE READ or SERIALIZABLE,
    /// a key another transaction changed since this one began is a
    /// serialization failure ([`InTransactionError::is_retryable`]), never
    /// a decision made on what it held before.
    ///
    /// There is no deadline here: the caller's transaction has its own
    /// (`statement_timeout`, `lock_timeout`).
    pub async fn transact_in(
        &self,
        conn: &mut PgConnection,
        ops: &[Op<'_>],
        mode: Mode,
    ) -> Result<Outcome, InTransactionError> {
        for op in ops {
            op.validate(mode.reserve)?;
        }
        self.migrate().await?;
        let keys = op_rows(ops);
        let outcome = self
            .decide_in(conn, &keys, |states, now| {
                states.transact(ops, |i, s| row(ops[i].limit, ops[i].key, s), mode, now)
            })
            .await
            .inspect_err(|e| self.noticed(e))?;
        Ok(outcome?)
    }

    /// Runs `decide` on `keys` in a transaction of the store's own, within
    /// the deadline.
    async fn run<R>(
        &self,
        keys: &[Row],
        decide: impl FnOnce(&mut States<Row>, Nanos) -> R,
    ) -> Result<R, StoreError> {
        let work = async {
            self.migrate().await.map_err(unavailable)?;
            let mut conn = self.pool.acquire().await.map_err(unavailable)?;
            let mut tx = conn.begin().await.map_err(unavailable)?;
            let out = self.decide_in(&mut tx, keys, decide).await.map_err(|e| {
                self.noticed(&e);
                unavailable(e)
            })?;
            tx.commit().await.map_err(unavailable)?;
            Ok(out)
        };
        let result = match tokio::time::timeout(self.config.timeout(), work).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout),
        };
        self.ready.store(result.is_ok(), Ordering::Relaxed);
        result
    }

    /// Locks `keys`, reads their rows, lets `decide` decide on them, and
    /// writes back what changed, in the transaction `conn` is in.
    async fn decide_in<R>(
        &self,
        conn: &mut PgConnection,
        keys: &[Row],
        decide: impl FnOnce(&mut States<Row>, Nanos) -> R,
    ) -> Result<R, sqlx::Error> {
        let (limits, names, shards) = columns(keys.iter());
        sqlx::query(&self.sql.lock)
            .bind(&limits)
            .bind(&names)
            .bind(&shards)
            .execute(&mut *conn)
            .await?;
        // Read once the locks are held, so that no call on these keys that
        // came before this one can have read a later time.
        let now = self.now(&mut *conn).await?;
        let rows: Vec<PgRow> = sqlx::query(&self.sql.read)
            .bind(&limits)
            .bind(&names)
            .bind(&shards)
            .fetch_all(&mut *conn)
            .await?;
        let mut states = States::new();
        for k in keys {
            if !states.has(k) {
                states.read(k.clone(), None, Nanos(i64::MIN));
            }
        }
        for r in rows {
            let shard: i32 = r.try_get(2)?;
            let key: Row = (r.try_get(0)?, r.try_get(1)?, shard as u32);
            let bytes: Vec<u8> = r.try_get(3)?;
            let empty_at = Nanos(r.try_get(4)?);
            match Stored::from_bytes(&bytes) {
                Some(state) => states.read(key, Some(state), empty_at),
                None => states.read_unknown(key, empty_at),
            }
        }
        let out = decide(&mut states, now);
        let (mut written, mut dropped) = (Vec::new(), Vec::new());
        for (k, write) in states.writes() {
            match write {
                Some((state, empty_at)) => written.push((k, state.to_bytes(), empty_at.0)),
                None => dropped.push(k),
            }
        }
        if !written.is_empty() {
            let (limits, names, shards) = columns(written.iter().map(|w| w.0));
            let bytes: Vec<&[u8]> = written.iter().map(|w| w.1.as_slice()).collect();
            let times: Vec<i64> = written.iter().map(|w| w.2).collect();
            sqlx::query(&self.sql.write)
                .bind(&limits)
                .bind(&names)
                .bind(&shards)
                .bind(&bytes)
                .bind(&times)
                .execute(&mut *conn)
                .await?;
        }
        if !dropped.is_empty() {
            let (limits, names, shards) = columns(dropped.into_iter());
            sqlx::query(&self.sql.drop)
                .bind(&limits)
                .bind(&names)
                .bind(&shards)
                .execute(&mut *conn)
                .await?;
        }
        Ok(out)
    }

    /// Drops up to a thousand rows that hold nothing any more, skipping any
    /// a call holds; returns how many it dropped. A row past its time is
    /// read as no row, so this only gives the room back.
    pub async fn sweep(&self) -> Result<u64, StoreError> {
        let work = async {
            self.migrate().await.map_err(unavailable)?;
            let mut conn = self.pool.acquire().await.map_err(unavailable)?;
            let now = self.now(&mut conn).await.map_err(unavailable)?;
            sqlx::query(&self.sql.sweep)
                .bind(now.0)
                .bind(SWEEP_BATCH)
                .execute(&mut *conn)
                .await
                .map(|done| done.rows_affected())
                .map_err(unavailable)
        };
        tokio::time::timeout(self.config.timeout(), work)
            .await
            .unwrap_or(Err(StoreError::Timeout))
    }
}

impl PostgresStore {
    /// The time calls are decided at: the database's clock, read on `conn`,
    /// unless the store was given a clock of its own.
    async fn now(&self, conn: &mut PgConnection) -> Result<Nanos, sqlx::Error> {
        match &self.clock {
            Some(clock) => Ok(clock.now()),
            None => {
                let micros: i64 = sqlx::query_scalar(self.sql.now).fetch_one(conn).await?;
                Ok(Nanos(micros.saturating_mul(1_000)))
            }
        }
    }
}

/// How often the store asks the database whether it answers.
const PING_EVERY: Duration = Duration::from_millis(250);

/// How often the upkeep drops rows that hold nothing any more.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The store's upkeep, for as long as a handle of it lives: a ping every
/// [`PING_EVERY`], which keeps readiness current while no call comes (and
/// finds out, before any call, whether the database answers at start),
/// and a sweep every [`SWEEP_EVERY`].
async fn upkeep(store: PostgresStore, alive: Weak<()>) {
    let mut last_sweep = tokio::time::Instant::now();
    while alive.strong_count() > 0 {
        let _ = store.ping().await;
        if store.is_ready() && last_sweep.elapsed() >= SWEEP_EVERY {
            last_sweep = tokio::time::Instant::now();
            // A sweep that fails leaves the rows for the next.
            while let Ok(n) = store.sweep().await {
                if n < SWEEP_BATCH as u64 || alive.strong_count() == 0 {
                    break;
                }
            }
        }
        tokio::time::sleep(PING_EVERY).await;
    }
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// The row of `limit`'s shard `shard` of `key`.
fn row(limit: &Limit, key: &str, shard: u32) -> Row {
    (limit.name().to_owned(), key.to_owned(), shard)
}

/// The rows every shard of `key` of `limit` keeps.
fn shard_rows(limit: &Limit, key: &str) -> Vec<Row> {
    (0..limit.shards()).map(|s| row(limit, key, s)).collect()
}

/// The rows `ops` may use: both candidate shards of each.
fn op_rows(ops: &[Op<'_>]) -> Vec<Row> {
    let mut rows: Vec<Row> = ops
        .iter()
        .flat_map(|op| {
            let (a, b) = op.shards();
            [row(op.limit, op.key, a), row(op.limit, op.key, b)]
        })
        .collect();
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// Rows as the three arrays a statement takes.
fn columns<'a>(rows: impl Iterator<Item = &'a Row>) -> (Vec<&'a str>, Vec<&'a str>, Vec<i32>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for (l, k, s) in rows {
        out.0.push(l.as_str());
        out.1.push(k.as_str());
        // Shards are at most 1,024.
        out.2.push(*s as i32);
    }
    out
}

// ---- The Store trait ----

impl Store for PostgresStore {
    async fn transact(&self, ops: &[Op<'_>], mode: Mode) -> Result<Outcome, StoreError> {
        for op in ops {
            op.validate(mode.reserve)?;
        }
        let keys = op_rows(ops);
        self.run(&keys, |states, now| {
            states.transact(ops, |i, s| row(ops[i].limit, ops[i].key, s), mode, now)
        })
        .await?
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        let keys = shard_rows(limit, key);
        let (limits, names, shards) = columns(keys.iter());
        let work = async {
            self.migrate().await.map_err(unavailable)?;
            sqlx::query(&self.sql.drop)
                .bind(&limits)
                .bind(&names)
                .bind(&shards)
                .execute(&self.pool)
                .await
                .map_err(unavailable)?;
            Ok(())
        };
        tokio::time::timeout(self.config.timeout(), work)
            .await
            .unwrap_or(Err(StoreError::Timeout))
    }

    async fn value(&self, limit: &Limit, key: &str) -> Result<Value, StoreError> {
        let keys = shard_rows(limit, key);
        self.run(&keys, |states, now| states.value(limit, key, &keys, now))
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
        self.run(&keys, |states, now| {
            states.settle(limit, key, &keys, change, now)
        })
        .await?
    }

    async fn release(&self, limit: &Limit, key: &str, id: u64) -> Result<bool, StoreError> {
        if !limit.takes_leases() || id == 0 {
            return Ok(false);
        }
        let keys = shard_rows(limit, key);
        self.run(&keys, |states, now| states.release(limit, &keys, id, now))
            .await
    }
}
