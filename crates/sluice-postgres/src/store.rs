//! The store: a call locks its keys, reads their rows, lets the core decide
//! on them ([`States`]), and writes back what changed, in one database
//! transaction of its own or of the caller's.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use sluice_core::states::{States, Stored};
use sluice_core::{
    Clock, CostError, Decision, Limit, Mode, Nanos, Op, Outcome, Settle, Store, StoreError, Value,
};
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection as _, PgConnection, Row as _};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::config::PostgresConfig;
use crate::schema::{self, SchemaError, Statements};

/// A row's key: the limit's name, the key, the shard.
pub(crate) type Row = (String, String, u32);

/// The most rows one sweep drops in one statement: few enough that it
/// holds its row locks for a moment only.
const SWEEP_BATCH: i64 = 1_000;

/// How a batch's transaction begins.
const READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// The most calls queued for a batch, per store: a caller beyond it waits,
/// within its deadline, for room.
const MAX_QUEUED: usize = 4_096;

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
struct Counters {
    decided: AtomicU64,
    batches: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
    pool_acquires: AtomicU64,
    pool_wait_micros: AtomicU64,
    swept: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// A store made outside a Tokio runtime, which its tasks need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a PostgresStore must be created inside a Tokio runtime")]
pub struct NoRuntime;

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

impl Shared {
    async fn ping(&self) -> Result<(), StoreError> {
        if !self.ready.load(Ordering::Relaxed) {
            self.probe().await?;
        }
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
        match result {
            Ok(()) => self.answered(),
            Err(_) => {
                // Before readiness says so: a caller that sees the store
                // not ready finds calls failing at once if the database
                // refuses.
                let _ = self.probe().await;
                self.ready.store(false, Ordering::Relaxed);
            }
        }
        result
    }

    /// The database answered: ready, and no longer refusing.
    fn answered(&self) {
        self.refused.store(false, Ordering::Relaxed);
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Opens a connection of its own, and notes whether the database
    /// refused it: the pool's attempts hide why they failed, and a refusal
    /// (nothing listens on its port) is what lets calls fail at once.
    async fn probe(&self) -> Result<(), StoreError> {
        let opened = tokio::time::timeout(
            self.config.timeout(),
            PgConnection::connect_with(&self.config.options),
        )
        .await;
        let refused = matches!(
            &opened,
            Ok(Err(sqlx::Error::Io(e))) if e.kind() == std::io::ErrorKind::ConnectionRefused
        );
        self.refused.store(refused, Ordering::Relaxed);
        match opened {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                Ok(())
            }
            Ok(Err(e)) => {
                if refused {
                    self.ready.store(false, Ordering::Relaxed);
                }
                Err(unavailable(e))
            }
            Err(_) => Err(StoreError::Timeout),
        }
    }

    async fn migrate(&self) -> Result<(), SchemaError> {
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

    async fn sweep(&self) -> Result<u64, StoreError> {
        let work = async {
            self.migrate().await.map_err(unavailable)?;
            let mut conn = self.pool.acquire().await.map_err(unavailable)?;
            let now = self.now(&mut conn).await.map_err(unavailable)?;
            // A second behind: a batch that read its time a moment before
            // this reads its rows, and must still find a row that was not
            // yet empty at its time.
            let before = now.0.saturating_sub(SWEEP_MARGIN.as_nanos() as i64);
            sqlx::query(&self.sql.sweep)
                .bind(before)
                .bind(SWEEP_BATCH)
                .execute(&mut *conn)
                .await
                .map(|done| done.rows_affected())
                .map_err(unavailable)
        };
        let swept = tokio::time::timeout(self.config.timeout(), work)
            .await
            .unwrap_or(Err(StoreError::Timeout))?;
        bump(&self.counters.swept, swept);
        Ok(swept)
    }

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
    /// (`statement_timeout`, `lock_timeout`). Nor is the call batched with
    /// others: it is the caller's transaction that commits it.
    pub async fn transact_in(
        &self,
        conn: &mut PgConnection,
        ops: &[Op<'_>],
        mode: Mode,
    ) -> Result<Outcome, InTransactionError> {
        for op in ops {
            op.validate(mode.reserve)?;
        }
        self.shared.migrate().await?;
        let keys = op_rows(ops);
        let outcome = self
            .shared
            .decide_in(conn, &keys, |states, now| {
                states.transact(ops, |i, s| row(ops[i].limit, ops[i].key, s), mode, now)
            })
            .await
            .inspect_err(|e| self.shared.noticed(e))?;
        Ok(outcome?)
    }

    /// Forgets `key` of `limit` inside the caller's transaction `conn`, as
    /// [`Store::reset`] does: committed, the key is full again; rolled
    /// back, it holds what it held. A login that succeeds can forget the
    /// failures before it in the transaction that records the success.
    pub async fn reset_in(
        &self,
        conn: &mut PgConnection,
        limit: &Limit,
        key: &str,
    ) -> Result<(), InTransactionError> {
        self.shared.migrate().await?;
        let keys = shard_rows(limit, key);
        let dropped: Vec<&Row> = keys.iter().collect();
        let cols = columns(keys.iter());
        let forget = async {
            self.shared.lock(&mut *conn, &cols).await?;
            self.shared.write(&mut *conn, &[], &dropped).await
        };
        forget.await.inspect_err(|e| self.shared.noticed(e))?;
        Ok(())
    }

    /// Queues a call that `decide` decides on the rows `keys`, and waits,
    /// within the deadline, for the batch it joins to commit.
    async fn run<R, F>(&self, keys: Vec<Row>, decide: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut States<Row>, Nanos) -> R + Send + 'static,
    {
        let deadline = Instant::now() + self.shared.config.timeout();
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Job {
            rows: keys,
            deadline,
            decide: Some(decide),
            decided: None,
            reply,
        });
        let wait = async {
            self.queue
                .send(job)
                .await
                .map_err(|_| StoreError::Unavailable("the store has stopped".into()))?;
            answer
                .await
                .unwrap_or_else(|_| Err(StoreError::Unavailable("the store has stopped".into())))
        };
        // A caller that gives up (its deadline, or its client gone) drops
        // its end of the reply; a batch not yet made leaves it out.
        tokio::time::timeout_at(deadline, wait)
            .await
            .unwrap_or(Err(StoreError::Timeout))
    }
}

impl Shared {
    /// Decides `jobs` as one database transaction, in the order they came,
    /// and answers each: with its decision once the transaction commits, or
    /// with why it failed. It gives up at the latest of the jobs' deadlines,
    /// when nobody waits for it any more.
    async fn batch(&self, mut jobs: Vec<Box<dyn Queued>>) {
        let mut rows: Vec<Row> = jobs.iter().flat_map(|j| j.rows().iter().cloned()).collect();
        rows.sort_unstable();
        rows.dedup();
        let Some(deadline) = jobs.iter().map(|j| j.deadline()).max() else {
            return;
        };
        let work = async {
            if self.refused.load(Ordering::Relaxed) {
                return Err(StoreError::Unavailable(
                    "the database refuses connections".into(),
                ));
            }
            self.migrate().await.map_err(unavailable)?;
            let asked = Instant::now();
            let mut conn = self.pool.acquire().await.map_err(unavailable)?;
            bump(&self.counters.pool_acquires, 1);
            let waited = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
            bump(&self.counters.pool_wait_micros, waited);
            // READ COMMITTED whatever the role's default: each statement
            // must see what the batch before it committed once its locks
            // are held, not a snapshot taken while it waited for them.
            let mut tx = conn.begin_with(READ_COMMITTED).await.map_err(unavailable)?;
            self.decide_in(&mut tx, &rows, |states, now| {
                for job in &mut jobs {
                    // A caller that gave up since the batch left is not
                    // charged for a call it was told failed.
                    if !job.is_abandoned() {
                        job.decide(states, now);
                    }
                }
            })
            .await
            .map_err(|e| {
                self.noticed(&e);
                unavailable(e)
            })?;
            tx.commit().await.map_err(unavailable)
        };
        let result = tokio::time::timeout_at(deadline, work)
            .await
            .unwrap_or(Err(StoreError::Timeout));
        match &result {
            Ok(()) => {
                bump(&self.counters.batches, 1);
                bump(&self.counters.decided, jobs.len() as u64);
                self.answered();
            }
            Err(StoreError::Timeout) => bump(&self.counters.timeouts, 1),
            Err(_) => bump(&self.counters.errors, 1),
        }
        for job in jobs {
            job.answer(result.as_ref().err());
        }
        if result.is_err() {
            // Whether the database is down, slow or only busy with this
            // batch's keys is the ping's to say: readiness follows pings.
            self.suspect.notify_one();
        }
    }

    /// Locks `keys`, reads their rows, lets `decide` decide on them, and
    /// writes back what changed, in the transaction `conn` is in.
    async fn decide_in<R>(
        &self,
        conn: &mut PgConnection,
        keys: &[Row],
        decide: impl FnOnce(&mut States<Row>, Nanos) -> R,
    ) -> Result<R, sqlx::Error> {
        let cols = columns(keys.iter());
        self.lock(&mut *conn, &cols).await?;
        let (limits, names, shards) = &cols;
        // Read once the locks are held, so that no call on these keys that
        // came before this one can have read a later time.
        let rows: Vec<PgRow> = sqlx::query(&self.sql.read)
            .bind(limits)
            .bind(slices(names))
            .bind(shards)
            .fetch_all(&mut *conn)
            .await?;
        let mut states = States::new();
        for k in keys {
            states.read(k.clone(), None, Nanos(i64::MIN));
        }
        // A row names its key by the bytes it keeps, a digest for a long
        // one: back to the key the call named.
        let asked: HashMap<(&str, &[u8], i32), &Row> = keys
            .iter()
            .zip(limits.iter().zip(names).zip(shards))
            .map(|(row, ((l, k), s))| ((*l, k.as_ref(), *s), row))
            .collect();
        let mut db_now = None;
        for r in rows {
            db_now = Some(r.try_get::<i64, _>(0)?);
            let Some(limit) = r.try_get::<Option<&str>, _>(1)? else {
                // The one row of a read that found none.
                continue;
            };
            let shard: i32 = r.try_get(3)?;
            let stored: &[u8] = r.try_get(2)?;
            let Some(&key) = asked.get(&(limit, stored, shard)) else {
                continue;
            };
            let key = key.clone();
            let bytes: Vec<u8> = r.try_get(4)?;
            let empty_at = Nanos(r.try_get(5)?);
            match Stored::from_bytes(&bytes) {
                Some(state) => states.read(key, Some(state), empty_at),
                None => states.read_unknown(key, empty_at),
            }
        }
        let now = match &self.clock {
            Some(clock) => clock.now(),
            None => {
                let micros = db_now.ok_or_else(|| {
                    sqlx::Error::Protocol("the read returned no row and no time".into())
                })?;
                Nanos(micros.saturating_mul(1_000))
            }
        };
        let out = decide(&mut states, now);
        let (mut written, mut dropped) = (Vec::new(), Vec::new());
        for (k, write) in states.writes() {
            match write {
                Some((state, empty_at)) => written.push((k, state.to_bytes(), empty_at.0)),
                None => dropped.push(k),
            }
        }
        if !(written.is_empty() && dropped.is_empty()) {
            self.write(&mut *conn, &written, &dropped).await?;
        }
        Ok(out)
    }

    /// Takes the transaction-scoped locks of the keys given as
    /// [`columns`], in the one order every call takes them in.
    async fn lock(
        &self,
        conn: &mut PgConnection,
        (limits, names, shards): &Columns<'_>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&self.sql.lock)
            .bind(limits)
            .bind(slices(names))
            .bind(shards)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Writes `written` (each a key, its state's bytes and when it holds
    /// nothing any more) and drops the rows of `dropped`, in one statement.
    async fn write(
        &self,
        conn: &mut PgConnection,
        written: &[(&Row, Vec<u8>, i64)],
        dropped: &[&Row],
    ) -> Result<(), sqlx::Error> {
        let (limits, names, shards) = columns(written.iter().map(|w| w.0));
        let bytes: Vec<&[u8]> = written.iter().map(|w| w.1.as_slice()).collect();
        let times: Vec<i64> = written.iter().map(|w| w.2).collect();
        let (d_limits, d_names, d_shards) = columns(dropped.iter().copied());
        sqlx::query(&self.sql.write)
            .bind(&limits)
            .bind(slices(&names))
            .bind(&shards)
            .bind(&bytes)
            .bind(&times)
            .bind(&d_limits)
            .bind(slices(&d_names))
            .bind(&d_shards)
            .execute(conn)
            .await?;
        Ok(())
    }
}

// ---- Batches ----

/// A call waiting for a batch, whatever it decides and answers: one queue
/// carries every kind of call.
trait Queued: Send {
    /// The rows the call may use.
    fn rows(&self) -> &[Row];
    /// When its caller stops waiting.
    fn deadline(&self) -> Instant;
    /// Whether its caller has stopped waiting already.
    fn is_abandoned(&self) -> bool;
    /// Decides the call on `states`, keeping the answer until the batch
    /// commits.
    fn decide(&mut self, states: &mut States<Row>, now: Nanos);
    /// Sends the answer, or `failed` when the batch did not commit.
    fn answer(self: Box<Self>, failed: Option<&StoreError>);
}

struct Job<R, F> {
    rows: Vec<Row>,
    deadline: Instant,
    decide: Option<F>,
    decided: Option<R>,
    reply: oneshot::Sender<Result<R, StoreError>>,
}

impl<R, F> Queued for Job<R, F>
where
    R: Send,
    F: FnOnce(&mut States<Row>, Nanos) -> R + Send,
{
    fn rows(&self) -> &[Row] {
        &self.rows
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }

    fn is_abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    fn decide(&mut self, states: &mut States<Row>, now: Nanos) {
        if let Some(decide) = self.decide.take() {
            self.decided = Some(decide(states, now));
        }
    }

    fn answer(self: Box<Self>, failed: Option<&StoreError>) {
        let answer = match (failed, self.decided) {
            (None, Some(decided)) => Ok(decided),
            (Some(e), _) => Err(e.clone()),
            (None, None) => Err(StoreError::Unavailable("the call was not decided".into())),
        };
        // A caller that stopped waiting has its answer from its deadline.
        let _ = self.reply.send(answer);
    }
}

/// Collects queued calls into batches. A batch leaves as soon as one of
/// the [`PostgresConfig::max_in_flight`] slots is free, so under load the
/// queue fills while batches are in flight and batches grow by themselves;
/// when idle, a call leaves alone at once.
async fn dispatch(shared: Arc<Shared>, mut calls: mpsc::Receiver<Box<dyn Queued>>) {
    let in_flight = shared.config.max_in_flight();
    let max = shared.config.max_batch();
    let slots = Arc::new(Semaphore::new(in_flight));
    while let Some(first) = calls.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        if slots.available_permits() + 1 < in_flight {
            // Another batch is in flight, so the database is busy: let the
            // callers that are ready to run queue their calls first.
            tokio::task::yield_now().await;
        }
        let mut batch = Vec::with_capacity(max.min(calls.len() + 1));
        let mut next = Some(first);
        while let Some(job) = next.take() {
            if !job.is_abandoned() {
                batch.push(job);
            }
            if batch.len() < max {
                next = calls.try_recv().ok();
            }
        }
        if batch.is_empty() {
            continue;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            shared.batch(batch).await;
            drop(slot);
        });
    }
}

/// How often the store asks the database whether it answers.
const PING_EVERY: Duration = Duration::from_millis(250);

/// How often it asks while the database refuses connections.
const PING_WHILE_DOWN: Duration = Duration::from_millis(25);

/// How far behind the database's clock a sweep looks.
const SWEEP_MARGIN: Duration = Duration::from_secs(1);

/// How often the upkeep drops rows that hold nothing any more.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The store's upkeep, for as long as a handle of it lives: a ping every
/// [`PING_EVERY`], which keeps readiness current while no call comes (and
/// finds out, before any call, whether the database answers at start),
/// the tables made once it answers, and a sweep every [`SWEEP_EVERY`].
async fn upkeep(shared: Arc<Shared>, alive: mpsc::WeakSender<Box<dyn Queued>>) {
    let mut last_sweep = Instant::now();
    while alive.strong_count() > 0 {
        let _ = shared.ping().await;
        if shared.ready.load(Ordering::Relaxed) && !shared.migrated.load(Ordering::Acquire) {
            // Made before the first call needs them, so that it does not
            // spend its deadline on them; a failure is the first call's to
            // report.
            let _ = tokio::time::timeout(shared.config.timeout() * 10, shared.migrate()).await;
        }
        if shared.ready.load(Ordering::Relaxed) && last_sweep.elapsed() >= SWEEP_EVERY {
            last_sweep = Instant::now();
            // A sweep that fails leaves the rows for the next.
            while let Ok(n) = shared.sweep().await {
                if n < SWEEP_BATCH as u64 || alive.strong_count() == 0 {
                    break;
                }
            }
        }
        // While the database refuses, ping often (each time one
        // connection attempt, refused at once), so that calls resume soon
        // after it is back; a failed batch asks for a ping at once.
        let pause = if shared.refused.load(Ordering::Relaxed) {
            PING_WHILE_DOWN
        } else {
            PING_EVERY
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shared.suspect.notified() => {}
        }
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

/// The longest key kept as it is; a longer one is kept as its digest.
const MAX_KEY_IN_ROW: usize = 1_024;

/// The bytes a row keeps for `key`: the key itself, or, beyond
/// [`MAX_KEY_IN_ROW`] bytes (an index row holds some 2,700), `0xFF` and
/// the key's SHA-256, which no key's own bytes can be (no UTF-8 string has
/// a byte `0xFF`). Bytes, not text, because a key may hold a NUL, which
/// PostgreSQL's text cannot.
fn stored_key(key: &str) -> Cow<'_, [u8]> {
    if key.len() <= MAX_KEY_IN_ROW {
        return Cow::Borrowed(key.as_bytes());
    }
    let mut digest = Vec::with_capacity(33);
    digest.push(0xFF);
    digest.extend_from_slice(&Sha256::digest(key.as_bytes()));
    Cow::Owned(digest)
}

/// Keys' bytes as sqlx binds an array of `bytea`.
fn slices<'a>(keys: &'a [Cow<'_, [u8]>]) -> Vec<&'a [u8]> {
    keys.iter().map(AsRef::as_ref).collect()
}

/// Rows as the three arrays a statement takes: limits, keys, shards.
type Columns<'a> = (Vec<&'a str>, Vec<Cow<'a, [u8]>>, Vec<i32>);

/// Rows as the three arrays a statement takes.
fn columns<'a>(rows: impl Iterator<Item = &'a Row>) -> Columns<'a> {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for (l, k, s) in rows {
        out.0.push(l.as_str());
        out.1.push(stored_key(k));
        // Shards are at most 1,024.
        out.2.push(*s as i32);
    }
    out
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

    #[test]
    fn a_long_key_is_kept_as_a_digest_no_key_can_be() {
        let long = "k".repeat(MAX_KEY_IN_ROW + 1);
        let kept = stored_key(&long);
        assert_eq!((kept.len(), kept[0]), (33, 0xFF));
        assert_ne!(stored_key(&format!("{long}x")), kept);
        assert_eq!(stored_key("a\0b").as_ref(), b"a\0b");
        assert_eq!(stored_key(&long[1..]).len(), MAX_KEY_IN_ROW);
    }
}
