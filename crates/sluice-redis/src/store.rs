//! [`RedisStore`]: transactions queue to a dispatcher that sends them to
//! Redis in batches, one script call per batch (per hash slot on a Cluster),
//! with a deadline on every call and a local cache of certain denials, kept
//! true across servers by announcing every reset (see `resets`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo, SingleNodeRoutingInfo,
};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};
use sluice_core::algorithm;
use sluice_core::{
    Algorithm, Clock, Decision, Limit, Mode, Nanos, Op, Outcome, Settle, Store, StoreError,
    SystemClock,
};
use smallvec::SmallVec;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::cache::DenyCache;
use crate::config::{RedisConfig, RedisConfigError};
use crate::keys;
use crate::resets::{self, SyncedCache};
use crate::script::{self, TimeUnit, Txn, TxnReply};
use crate::seen::SeenState;

/// A connection to one node (reconnecting) or to a Cluster (routing).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

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
struct Counters {
    remote: AtomicU64,
    local_denials: AtomicU64,
    script_calls: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What the dispatcher and every caller share.
struct Shared {
    config: RedisConfig,
    conn: Conn,
    unit: TimeUnit,
    clock: Arc<dyn Clock>,
    client_time: bool,
    cache: Option<Arc<SyncedCache>>,
    /// Where resets are announced.
    reset_channel: String,
    counters: Counters,
    ready: AtomicBool,
    /// A call missed its deadline since the last health check.
    suspect: AtomicBool,
    /// A single Redis refused a connection, and nothing has answered since:
    /// calls fail at once rather than each waiting out its deadline while
    /// the connection is retried.
    refused: AtomicBool,
    /// When Redis last answered anything, in milliseconds since `born`: a
    /// connection silent for longer than [`KEEPALIVE`] is pinged, since
    /// only a write finds out that it died (with a Redis that restarted).
    answered_ms: AtomicU64,
    born: Instant,
}

/// How long the connection may stay silent before the health check pings
/// it. A connection to a Redis that was killed, or restarted, is only found
/// dead by writing to it, and a call cannot be retried after its write
/// failed (see [`send`]): the ping finds it instead, and the calls after it
/// meet a new connection. Idle, that is a few pings a second; busy, none.
const KEEPALIVE: Duration = Duration::from_millis(100);

impl Shared {
    fn classify(&self, e: &RedisError) -> StoreError {
        if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            self.ready.store(false, Ordering::Relaxed);
            // Only a refusal says Redis is down: a dropped connection is
            // replaced at once, and the calls after it wait for the new one.
            // A cluster can lose one node and still serve the others' slots.
            if e.is_connection_refusal() && matches!(self.conn, Conn::Single(_)) {
                self.refused.store(true, Ordering::Relaxed);
            }
        }
        if e.is_timeout() {
            self.timed_out()
        } else {
            StoreError::Unavailable(e.to_string())
        }
    }

    /// A call missed its deadline. A Redis that hangs (paused, swapping,
    /// stuck in a slow script) keeps its connections open and refuses
    /// nothing, so a miss is what says it may not be answering. One miss
    /// can also be a stall of this process, so it only makes the store
    /// suspect: the health check pings at once, and a ping that misses the
    /// deadline too makes the store not ready until one answers in time.
    fn timed_out(&self) -> StoreError {
        self.suspect.store(true, Ordering::Relaxed);
        StoreError::Timeout
    }

    /// Records whether Redis answered a health-check ping: only a ping
    /// ends a refusal, since a call's reply may have been sent before the
    /// connection was lost.
    fn pinged(&self, answered: bool) {
        self.ready.store(answered, Ordering::Relaxed);
        if answered {
            self.heard();
            self.refused.store(false, Ordering::Relaxed);
        }
    }

    /// Records that Redis answered a call.
    fn replied(&self) {
        self.heard();
        if !self.refused.load(Ordering::Relaxed) {
            self.ready.store(true, Ordering::Relaxed);
        }
    }

    fn heard(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.answered_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Whether Redis has been silent for longer than [`KEEPALIVE`].
    fn silent(&self) -> bool {
        let since = Duration::from_millis(self.answered_ms.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(since) > KEEPALIVE
    }

    /// Awaits `call` within the deadline, mapping a miss and Redis errors.
    async fn within<T>(
        &self,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.config.timeout(), call).await {
            Err(_) => Err(self.timed_out()),
            Ok(Err(e)) => Err(self.classify(&e)),
            Ok(Ok(v)) => Ok(v),
        }
    }

    fn count(&self, e: &StoreError) {
        match e {
            StoreError::Timeout => bump(&self.counters.timeouts),
            StoreError::Cost(_) => {}
            _ => bump(&self.counters.errors),
        }
    }

    /// Keys written under virtual time live at least this long in real time,
    /// since virtual and real time need not run at the same speed.
    fn min_ttl_ms(&self) -> u64 {
        if self.client_time { 600_000 } else { 0 }
    }
}

/// Where a transaction's answer goes: it hands the transaction back with
/// Redis's answer, so the caller needn't keep a copy.
type Reply = oneshot::Sender<Result<(Txn, TxnReply), StoreError>>;

/// A queued transaction.
struct Job {
    txn: Txn,
    reply: Reply,
    /// When the caller's time is up. The dispatcher enforces it, with one
    /// timer per script call rather than one per decision.
    deadline: Instant,
}

/// A [`Store`] on Redis or Redis Cluster: every server that shares it shares
/// one exact limit.
///
/// Each transaction runs atomically in Redis as one Lua script (EVALSHA,
/// reloaded on NOSCRIPT), on Redis's own clock. Concurrent transactions
/// travel together in one script call. Keys expire when their bucket would be
/// full again. Denials that the last reply already proves are answered
/// locally, from a deny cache that every reset, by any store sharing the
/// Redis, invalidates: resets are announced on the pub/sub channel
/// `<prefix>resets`, which each store with a deny cache listens to on a
/// connection of its own, and the cache denies nothing while that
/// subscription is down. Every call has a deadline (50 ms by default), after
/// which it fails with [`StoreError::Timeout`]; the caller decides whether
/// that fails open or closed.
///
/// The store is created at once, even while Redis is down; it connects in the
/// background and [`RedisStore::is_ready`] says when it answers.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use sluice_core::{Limit, Mode, Op, Store, TokenBucket};
/// use sluice_redis::{RedisConfig, RedisStore};
/// let store = RedisStore::new(RedisConfig::from_url("redis://127.0.0.1:6379")?)?;
/// let limit = Limit::new("api", TokenBucket::new(10.0, 20.0)?);
/// let d = store.decide(Op::new(&limit, "user-1", 1.0), Mode::CONSUME).await?;
/// assert!(d.allowed);
/// # Ok(()) }
/// ```
pub struct RedisStore {
    shared: Arc<Shared>,
    jobs: mpsc::Sender<Job>,
}

/// Why a store could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NewError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] RedisConfigError),
    /// The Redis client rejected the configuration.
    #[error("cannot set up the Redis client: {0}")]
    Client(String),
    /// The store was created outside a Tokio runtime.
    #[error("a RedisStore must be created inside a Tokio runtime")]
    NoRuntime,
}

impl RedisStore {
    /// A store on Redis time. Must be called inside a Tokio runtime; it
    /// returns at once and connects in the background.
    pub fn new(config: RedisConfig) -> Result<RedisStore, NewError> {
        Self::build(config, Arc::new(SystemClock::new()), false)
    }

    /// A store on the caller's clock instead of Redis's, for virtual time
    /// (replay) and tests with a fake clock. Every server sharing the keys
    /// must then share the clock too.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use sluice_core::FakeClock;
    /// use sluice_redis::{RedisConfig, RedisStore};
    /// let clock = FakeClock::default();
    /// let store = RedisStore::with_clock(RedisConfig::from_url("redis://127.0.0.1")?, clock)?;
    /// # Ok(()) }
    /// ```
    pub fn with_clock(
        config: RedisConfig,
        clock: impl Clock + 'static,
    ) -> Result<RedisStore, NewError> {
        Self::build(config, Arc::new(clock), true)
    }

    fn build(
        config: RedisConfig,
        clock: Arc<dyn Clock>,
        client_time: bool,
    ) -> Result<RedisStore, NewError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| NewError::NoRuntime)?;
        let conn = connect(&config).map_err(|e| NewError::Client(e.to_string()))?;
        let cache = if config.deny_cache() > 0 {
            let cache = DenyCache::new(config.deny_cache());
            Some(
                SyncedCache::start(cache, &config, clock.clone(), &runtime)
                    .map_err(|e| NewError::Client(e.to_string()))?,
            )
        } else {
            None
        };
        let in_flight = config.max_in_flight();
        let shared = Arc::new(Shared {
            conn,
            unit: if client_time {
                TimeUnit::ClientNanos
            } else {
                TimeUnit::RedisMicros
            },
            clock,
            client_time,
            cache,
            reset_channel: resets::channel(config.prefix()),
            counters: Counters::default(),
            ready: AtomicBool::new(false),
            suspect: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            answered_ms: AtomicU64::new(0),
            born: Instant::now(),
            config,
        });
        let (jobs, rx) = mpsc::channel(1 << 16);
        runtime.spawn(dispatch(shared.clone(), rx, in_flight));
        runtime.spawn(watch(Arc::downgrade(&shared)));
        Ok(RedisStore { shared, jobs })
    }

    /// Whether Redis answered the last call (or health check).
    pub fn is_ready(&self) -> bool {
        self.shared.ready.load(Ordering::Relaxed)
    }

    /// Pings Redis within the deadline, updating [`RedisStore::is_ready`].
    pub async fn ping(&self) -> Result<(), StoreError> {
        ping(&self.shared).await
    }

    /// What the store has done so far.
    pub fn stats(&self) -> RedisStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let synced = |f: fn(&SyncedCache) -> &AtomicU64| {
            self.shared.cache.as_deref().map_or(0, |s| get(f(s)))
        };
        RedisStats {
            remote: get(&c.remote),
            local_denials: get(&c.local_denials),
            script_calls: get(&c.script_calls),
            errors: get(&c.errors),
            timeouts: get(&c.timeouts),
            invalidations: synced(|s| &s.invalidations),
            subscribes: synced(|s| &s.subscribes),
            subscription_losses: synced(|s| &s.losses),
        }
    }

    /// Forgets what this store's deny cache knows of `key`.
    fn forget_cached(&self, limit: &Limit, key: &str) {
        if let Some(synced) = &self.shared.cache {
            let cache = synced.cache();
            // Only shard 0 of an unsharded limit is ever cached.
            cache.forget(
                cache.fingerprint(limit.name(), key, 0),
                self.shared.clock.now(),
            );
        }
    }

    /// Tells every store sharing the Redis that `key` gained tokens faster
    /// than time gives them, on the channel resets are announced on, so
    /// that their deny caches forget it. The key has changed whether or not
    /// this succeeds, so a failure is logged, not returned.
    async fn announce(&self, limit: &Limit, key: &str) {
        let shared = &self.shared;
        let mut conn = shared.conn.clone();
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(&shared.reset_channel)
            .arg(resets::message(limit.name(), key));
        if let Err(e) = shared.within(send(&mut conn, &cmd, Resend::IfUnsent)).await {
            shared.count(&e);
            tracing::warn!(
                limit = limit.name(),
                channel = shared.reset_channel,
                error = %e,
                "refunded, but could not announce it to other servers' deny caches"
            );
        }
    }

    /// Sends one transaction to the dispatcher and waits for its reply.
    async fn remote(&self, txn: Txn) -> Result<(Txn, TxnReply), StoreError> {
        let shared = &self.shared;
        if shared.refused.load(Ordering::Relaxed) {
            // Answered without waiting on anything, so a caller retrying in
            // a loop would never give the runtime back: spend cooperative
            // budget as a channel receive would. The health check pings
            // every 10 ms and ends the refusal as soon as Redis answers.
            tokio::task::consume_budget().await;
            let e = StoreError::Unavailable(
                "Redis refused the connection; failing at once until it answers again".into(),
            );
            shared.count(&e);
            return Err(e);
        }
        let (tx, rx) = oneshot::channel();
        let job = Job {
            txn,
            reply: tx,
            deadline: Instant::now() + shared.config.timeout(),
        };
        // The dispatcher answers every job by its deadline: a job still
        // queued then is answered as soon as a call slot frees, which the
        // calls in flight (sent earlier, so with earlier deadlines) do by
        // theirs.
        let result = match self.jobs.try_send(job) {
            Err(_) => Err(StoreError::Unavailable("too many decisions queued".into())),
            Ok(()) => match rx.await {
                Err(_) => Err(StoreError::Unavailable("the dispatcher stopped".into())),
                Ok(r) => r,
            },
        };
        if let Err(e) = &result {
            shared.count(e);
        }
        result
    }

    /// The deny-cache fingerprint of every operation (`None` for one outside
    /// the cache: only unsharded token buckets have a bound that only grows
    /// with time), or nothing when the cache is off or not to be trusted (not
    /// subscribed to reset announcements).
    fn cache_fps(&self, ops: &[Op<'_>]) -> Option<(&DenyCache, SmallVec<[Option<u64>; 2]>)> {
        let cache = self.shared.cache.as_ref()?.trusted()?;
        let fps = ops
            .iter()
            .map(|op| {
                let bounded = op.limit.shards() == 1
                    && matches!(op.limit.shard_algorithm(), Algorithm::TokenBucket(_));
                bounded.then(|| cache.fingerprint(op.limit.name(), op.key, 0))
            })
            .collect();
        Some((cache, fps))
    }

    /// A certain denial from the deny cache, if every operation is in the
    /// cache and one's bound proves it. Runs before anything is encoded:
    /// under abuse this is the whole call.
    fn local_denial(
        cache: &DenyCache,
        fps: &[Option<u64>],
        ops: &[Op<'_>],
        mode: Mode,
        now: Nanos,
    ) -> Option<Outcome> {
        if let [op] = ops {
            let d = cache.deny(
                fps[0]?,
                op.limit.shard_algorithm(),
                now,
                op.cost,
                mode.reserve,
            )?;
            return Some(Outcome::from_decisions([d].into_iter().collect()));
        }
        let mut decisions: SmallVec<[Decision; 2]> = SmallVec::new();
        for (op, &fp) in ops.iter().zip(fps) {
            let alg = op.limit.shard_algorithm();
            // The bound's answer for an op it does not deny is only an upper
            // bound; the others' denial alone still decides the transaction,
            // and the op reports what it would hold, as nothing is spent. An
            // op the cache knows nothing of is reported full.
            let bound = cache.bound(fp?, alg);
            let ev = algorithm::evaluate(alg, bound, 0, now, op.cost, mode.reserve);
            decisions.push(if ev.decision.allowed {
                algorithm::unspent(alg, bound, 0, now, ev.decision)
            } else {
                ev.decision
            });
        }
        let outcome = Outcome::from_decisions(decisions);
        (!outcome.allowed).then_some(outcome)
    }

    /// Updates the deny cache from a reply to a request sent at `sent`.
    fn learn(
        cache: &DenyCache,
        fps: &[Option<u64>],
        ops: &[Op<'_>],
        reply: &TxnReply,
        mode: Mode,
        sent: Nanos,
    ) {
        let committed = reply.allowed && mode.consume;
        for (i, (op, seen)) in ops.iter().zip(&reply.ops).enumerate() {
            let Some(fp) = fps[i] else { continue };
            let alg = op.limit.shard_algorithm();
            // A key named again in one transaction saw the earlier ops'
            // pending writes: real if committed (then the last one is the
            // final state, and it is learned last), fictional if not (then
            // only the first occurrence saw what Redis holds).
            if !committed && fps[..i].contains(&Some(fp)) {
                continue;
            }
            let mut tokens = algorithm::current(alg, seen.state.flat(), 0, reply.now).tokens;
            if committed {
                tokens -= op.cost;
            }
            // For one op, a bound that would not deny this same call again is
            // unlikely to deny the next one, and learning costs a write to a
            // shared slot on every allowed call. Skipping it is safe: an older
            // entry is still an upper bound, just a weaker one.
            // Several ops: a later local denial of the transaction reports
            // every op's bound, so each one is worth learning.
            if tokens < op.cost || ops.len() > 1 {
                cache.learn(fp, alg, tokens, sent);
            }
        }
    }
}

/// Connects lazily: nothing here waits for Redis.
fn connect(config: &RedisConfig) -> Result<Conn, RedisError> {
    let timeout = config.timeout();
    if config.is_cluster() {
        // No retries by the client: it sends a command again after its
        // connection was lost too, when a script may have run already.
        // `send` retries what never ran, redirections included.
        let client =
            redis::cluster::ClusterClient::builder(config.nodes().iter().map(String::as_str))
                .connection_timeout(timeout.max(Duration::from_millis(100)))
                .response_timeout(timeout.max(Duration::from_millis(100)))
                .retries(0)
                .build()?;
        let conn =
            client.get_pending_async_connection_with_config(redis::cluster::ClusterConfig::new());
        Ok(Conn::Cluster(conn))
    } else {
        let node = config.nodes().first().map_or("", String::as_str);
        let client = redis::Client::open(node)?;
        // One connection attempt per reconnection, without backoff: the
        // health check paces the attempts while Redis is down, and a call
        // made once Redis is back never waits out a backoff sleep started
        // while it was down.
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(100))))
            .set_response_timeout(None)
            .set_number_of_retries(0);
        Ok(Conn::Single(ConnectionManager::new_lazy_with_config(
            client, manager,
        )?))
    }
}

/// What may be sent again after its first try failed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// A command that changes what Redis holds: only if it never left.
    IfUnsent,
    /// A command that changes nothing (PING): after any lost connection too.
    AfterAnyLoss,
}

/// How many times [`send`] tries a command at most.
const TRIES: usize = 3;

/// Sends `cmd`, and again, up to [`TRIES`] times in all, while it failed in
/// a way `resend` allows; every caller bounds the whole with its deadline.
///
/// Why a script call sent again cannot spend twice: it is sent again only
/// when it never ran. A refusal comes only from opening a connection (a TCP
/// reset answering the connection request, or a missing Unix socket),
/// never from one that carried a command: an established connection that
/// breaks reports a reset or a broken pipe. A Cluster node that answers
/// MOVED, ASK, TRYAGAIN or CLUSTERDOWN has turned the call away before
/// running it, and a Cluster with no connection to any node has sent
/// nothing. A script call that failed any other way (a broken pipe, a
/// reset, a missed deadline) may have run before it failed, so it is never
/// sent again, by this or by the Cluster client (see [`connect`]); its
/// caller fails open or closed instead.
///
/// A refusal is tried again once: the first can be stale, kept by the
/// connection manager from an attempt made while Redis was down until
/// something used the connection; using it started a fresh attempt, which
/// the second try waits for, and a refusal then says that Redis refuses
/// now. A redirection is followed as a Cluster client follows it: ASK with
/// ASKING to the node named, MOVED once the client has read the new slot
/// map, which it does on seeing MOVED.
async fn send(conn: &mut Conn, cmd: &Cmd, resend: Resend) -> Result<Value, RedisError> {
    let mut result = cmd.query_async::<Value>(conn).await;
    let mut refused = false;
    for _ in 1..TRIES {
        let Err(e) = &result else { break };
        let again = if e.is_connection_refusal() {
            // Once only, as said above.
            let first = !refused;
            refused = true;
            first
        } else {
            turned_away(e) || (resend == Resend::AfterAnyLoss && e.is_connection_dropped())
        };
        if !again {
            break;
        }
        result = match (e.redirect_node(), &mut *conn) {
            (Some((node, _)), Conn::Cluster(c))
                if e.kind() == ErrorKind::Server(ServerErrorKind::Ask) =>
            {
                asking(c, cmd, node).await
            }
            _ => cmd.query_async::<Value>(conn).await,
        };
    }
    result
}

/// Whether a Cluster turned a command away before it ran.
fn turned_away(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
        ) | ErrorKind::ClusterConnectionNotFound
    )
}

/// `cmd` sent to the Cluster node `node` (`host:port`) after ASKING, as an
/// ASK redirection asks: the node is importing the slot of `cmd`'s keys.
async fn asking(conn: &mut ClusterConnection, cmd: &Cmd, node: &str) -> Result<Value, RedisError> {
    let (host, port) = node
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
        .ok_or_else(|| {
            RedisError::from((ErrorKind::Client, "an ASK to no node", node.to_owned()))
        })?;
    let mut pipeline = redis::pipe();
    pipeline.cmd("ASKING").add_command(cmd.clone());
    let route = SingleNodeRoutingInfo::ByAddress { host, port };
    // Only the command's reply, not ASKING's.
    let mut replies = conn.route_pipeline(pipeline, 1, 1, route).await?;
    replies
        .pop()
        .ok_or_else(|| RedisError::from((ErrorKind::Client, "no reply after ASKING")))?
        .extract_error()
}

/// Sends PING within the deadline.
async fn send_ping(shared: &Shared) -> Result<(), StoreError> {
    let mut conn = shared.conn.clone();
    let cmd = redis::cmd("PING");
    shared
        .within(send(&mut conn, &cmd, Resend::AfterAnyLoss))
        .await
        .map(drop)
}

/// Pings a connection silent for [`KEEPALIVE`], and says whether it
/// answered. On a Cluster every master is pinged, each on its own
/// connection; one that does not answer leaves readiness alone, as the
/// others' slots still serve, and the client reconnects to it.
async fn keepalive(shared: &Shared) -> bool {
    match &shared.conn {
        Conn::Single(_) => send_ping(shared).await.is_ok(),
        Conn::Cluster(c) => {
            let mut conn = c.clone();
            let masters = RoutingInfo::MultiNode((
                MultipleNodeRoutingInfo::AllMasters,
                Some(ResponsePolicy::AllSucceeded),
            ));
            let pinged = conn.route_command(redis::cmd("PING"), masters);
            matches!(
                tokio::time::timeout(shared.config.timeout(), pinged).await,
                Ok(Ok(_))
            )
        }
    }
}

async fn ping(shared: &Shared) -> Result<(), StoreError> {
    let answered = send_ping(shared).await;
    shared.pinged(answered.is_ok());
    answered
}

/// Pings while Redis is not answering, so readiness (and the connection)
/// comes back without waiting for traffic; after a call missed its
/// deadline, to tell a hung Redis from a passing stall; and when the
/// connection has been silent for [`KEEPALIVE`], so that a connection that
/// died while the store was idle is replaced before a call needs it.
async fn watch(shared: Weak<Shared>) {
    loop {
        let Some(s) = shared.upgrade() else { return };
        if !s.ready.load(Ordering::Relaxed) || s.suspect.swap(false, Ordering::Relaxed) {
            let _ = ping(&s).await;
        } else if s.silent() && keepalive(&s).await {
            // A keepalive that failed has said so already: a refused or
            // lost connection made the store not ready, and a missed
            // deadline made it suspect, to be pinged again at once.
            s.pinged(true);
        }
        // While Redis refuses, calls fail at once until a ping is answered:
        // ping often then (each ping one connection attempt, refused at
        // once), so that they resume soon after Redis does.
        let pause = if s.ready.load(Ordering::Relaxed) {
            KEEPALIVE
        } else {
            Duration::from_millis(10)
        };
        drop(s);
        tokio::time::sleep(pause).await;
    }
}

/// Collects queued transactions into batches. A batch leaves as soon as a
/// call slot is free, so under load the queue fills while calls are in
/// flight and batches grow by themselves; when idle, a call leaves alone.
async fn dispatch(shared: Arc<Shared>, mut rx: mpsc::Receiver<Job>, in_flight: usize) {
    let slots = Arc::new(Semaphore::new(in_flight));
    let max = shared.config.max_batch();
    let mut held = None;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        if slots.available_permits() + 1 < in_flight {
            // Another call is in flight, so Redis is busy: let the callers
            // that are ready to run queue their transactions first, and
            // send them together. Fewer, larger calls cost Redis and this
            // process less per decision; when idle, a call leaves at once.
            tokio::task::yield_now().await;
        }
        let (batch, next) = take_batch(first, &mut rx, max, Instant::now(), || shared.timed_out());
        held = next;
        if batch.is_empty() {
            continue;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            if shared.config.is_cluster() {
                let mut by_slot: HashMap<u16, Vec<Job>> = HashMap::new();
                for job in batch {
                    match job.txn.slot() {
                        Some(slot) => by_slot.entry(slot).or_default().push(job),
                        None => {
                            let _ = job.reply.send(Err(StoreError::Unavailable(
                                "a transaction over keys in different Cluster slots is not \
                                 atomic; use one key per transaction"
                                    .into(),
                            )));
                        }
                    }
                }
                let mut calls = tokio::task::JoinSet::new();
                for (_, jobs) in by_slot {
                    calls.spawn(call(shared.clone(), jobs));
                }
                while calls.join_next().await.is_some() {}
            } else {
                call(shared, batch).await;
            }
            drop(permit);
        });
    }
}

/// `first` and what else is queued, up to `max` transactions, as one
/// batch, leaving out (and answering) those whose time is up. A transaction
/// that uses a key an earlier one of the batch uses under another kind of
/// state (a limit changed kind, and a call under each handle is in flight)
/// is held back for the next batch, which it returns: in one script call
/// each kind would rebuild the key from what it held before the call, and
/// the second would not see what the first spent.
fn take_batch(
    first: Job,
    rx: &mut mpsc::Receiver<Job>,
    max: usize,
    now: Instant,
    timed_out: impl Fn() -> StoreError,
) -> (Vec<Job>, Option<Job>) {
    let mut batch: Vec<Job> = Vec::with_capacity(max.min(rx.len() + 1));
    // Keys by their hashes: two keys that share one only split a batch
    // that need not have been.
    let hasher = std::hash::RandomState::new();
    let hash = |k: &str| std::hash::BuildHasher::hash_one(&hasher, k);
    let mut kinds: HashMap<u64, Algorithm> = HashMap::new();
    let mut job = Some(first);
    while let Some(j) = job.take() {
        if j.deadline <= now {
            let _ = j.reply.send(Err(timed_out()));
        } else {
            let clash = j.txn.keys().any(|(k, alg)| {
                kinds
                    .get(&hash(k))
                    .is_some_and(|a| !a.keeps_states_like(alg))
            });
            if clash {
                return (batch, Some(j));
            }
            for (k, alg) in j.txn.keys() {
                kinds.entry(hash(k)).or_insert(*alg);
            }
            batch.push(j);
        }
        if batch.len() < max {
            job = rx.try_recv().ok();
        }
    }
    (batch, None)
}

/// Runs the script, loading it first if Redis does not have it (a restart,
/// `SCRIPT FLUSH`, a new Cluster node).
async fn eval(shared: &Shared, cmd: &Cmd) -> Result<Value, RedisError> {
    let mut conn = shared.conn.clone();
    match send(&mut conn, cmd, Resend::IfUnsent).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script::script().load_async(&mut conn).await?;
            send(&mut conn, cmd, Resend::IfUnsent).await
        }
        r => r,
    }
}

/// One script call for `jobs`, answering each by its own deadline: a job
/// whose time is up fails alone, and the call goes on for the others, so a
/// backlog of old jobs never cuts short the time of fresh ones.
async fn call(shared: Arc<Shared>, jobs: Vec<Job>) {
    let now = shared.client_time.then(|| shared.clock.now());
    let cmd = script::invocation(
        jobs.iter().map(|j| &j.txn),
        shared.unit,
        now,
        now.unwrap_or_else(|| shared.clock.now()),
        shared.min_ttl_ms(),
    );
    // The transactions stay to read the reply by; the callers still
    // waiting for it are those whose deadline has not passed.
    let (txns, mut waiting): (Vec<Txn>, Vec<Option<(Reply, Instant)>>) = jobs
        .into_iter()
        .map(|j| (j.txn, Some((j.reply, j.deadline))))
        .unzip();
    bump(&shared.counters.script_calls);
    let result = {
        let mut reply = std::pin::pin!(eval(&shared, &cmd));
        loop {
            let Some(deadline) = waiting.iter().flatten().map(|w| w.1).min() else {
                // Every caller has been answered: nobody waits for the reply.
                return;
            };
            tokio::select! {
                biased;
                r = &mut reply => break r.map_err(|e| shared.classify(&e)),
                () = tokio::time::sleep_until(deadline) => {
                    let now = Instant::now();
                    for slot in &mut waiting {
                        if let Some((tx, _)) = slot.take_if(|w| w.1 <= now) {
                            let _ = tx.send(Err(shared.timed_out()));
                        }
                    }
                }
            }
        }
    };
    drop(cmd);
    let replies = result.and_then(|v| {
        shared.replied();
        let mut replies = script::parse_reply(v, shared.unit)?;
        // Every reply is read before any is sent, so a malformed one fails
        // the whole batch rather than answering part of it.
        let parsed = txns
            .iter()
            .map(|txn| replies.next_txn(txn))
            .collect::<Result<Vec<TxnReply>, StoreError>>()?;
        if replies.finished() {
            Ok(parsed)
        } else {
            Err(StoreError::Unavailable(
                "unexpected reply from the Redis script: too long".into(),
            ))
        }
    });
    match replies {
        Ok(parsed) => {
            for ((txn, waiter), reply) in txns.into_iter().zip(waiting).zip(parsed) {
                if let Some((tx, _)) = waiter {
                    let _ = tx.send(Ok((txn, reply)));
                }
            }
        }
        Err(e) => {
            for (tx, _) in waiting.into_iter().flatten() {
                let _ = tx.send(Err(e.clone()));
            }
        }
    }
}

/// The decisions of `txn` from what the script saw, as sluice-core makes
/// them. A denied transaction spent nothing: its allowing operations report
/// their keys as they were before it. An operation saw its own
/// transaction's earlier writes to the same key, so "before" is what the
/// first operation on that key saw.
fn decide(ops: &[Op<'_>], txn: &Txn, reply: &TxnReply, mode: Mode) -> Outcome {
    let offsets: SmallVec<[i64; 2]> = txn.offsets().collect();
    let key = |j: usize| txn.key(j, reply.ops[j].pick);
    let mut decisions: SmallVec<[Decision; 2]> = SmallVec::with_capacity(ops.len());
    for (i, (op, seen)) in ops.iter().zip(&reply.ops).enumerate() {
        // What the earlier operations admitted on the same sliding log, in
        // their order, as the memory store adds it up.
        let pending = match seen.state {
            SeenState::Log(..) => (0..i)
                .filter(|&j| decisions[j].allowed && key(j) == key(i))
                .fold(0.0, |sum, j| sum + ops[j].cost),
            SeenState::Flat(..) | SeenState::Window(..) => 0.0,
        };
        decisions.push(
            seen.state
                .decide(offsets[i], reply.now, op.cost, mode.reserve, pending),
        );
    }
    let mut outcome = Outcome::from_decisions(decisions);
    if !outcome.allowed {
        for i in 0..outcome.decisions.len() {
            if outcome.decisions[i].allowed {
                let first = (0..i).find(|&j| key(j) == key(i)).unwrap_or(i);
                outcome.decisions[i] =
                    reply.ops[first]
                        .state
                        .unspent(offsets[i], reply.now, outcome.decisions[i]);
            }
        }
    }
    outcome
}

impl Store for RedisStore {
    async fn transact(&self, ops: &[Op<'_>], mode: Mode) -> Result<Outcome, StoreError> {
        for op in ops {
            op.validate(mode.reserve)?;
        }
        if ops.is_empty() {
            // Nothing to decide: allowed, as by every store.
            return Ok(Outcome::from_decisions(SmallVec::new()));
        }
        let shared = &self.shared;
        let sent = shared.clock.now();
        let cached = self.cache_fps(ops);
        if let Some((cache, fps)) = &cached
            && let Some(outcome) = Self::local_denial(cache, fps, ops, mode, sent)
        {
            bump(&shared.counters.local_denials);
            return Ok(outcome);
        }
        let txn = Txn::encode(shared.config.prefix(), ops, mode, shared.unit)?;
        let (txn, reply_txn) = self.remote(txn).await?;
        bump(&shared.counters.remote);
        let mut outcome = decide(ops, &txn, &reply_txn, mode);
        if outcome.allowed != reply_txn.allowed {
            // Redis's verdict is what was committed; report it.
            tracing::error!(
                script = reply_txn.allowed,
                local = outcome.allowed,
                "the Redis script and sluice-core disagree on a decision"
            );
            outcome.allowed = reply_txn.allowed;
        }
        if let Some((cache, fps)) = &cached {
            Self::learn(cache, fps, ops, &reply_txn, mode, sent);
        }
        Ok(outcome)
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        let shared = &self.shared;
        self.forget_cached(limit, key);
        let mut conn = shared.conn.clone();
        let names: Vec<String> = (0..limit.shards())
            .map(|s| keys::shard_key(shared.config.prefix(), limit, key, s))
            .collect();
        // Announced whether or not this store has a deny cache: others
        // sharing the Redis may.
        let cmd = resets::reset_command(
            &names,
            &shared.reset_channel,
            &resets::message(limit.name(), key),
        );
        let r = shared
            .within(send(&mut conn, &cmd, Resend::IfUnsent))
            .await
            .map(|reply| {
                if let Err(why) = resets::announced(&reply) {
                    // The key is reset; only the announcement failed (most
                    // likely an ACL without the channel, which then keeps
                    // every store on that user from subscribing, and so from
                    // trusting its deny cache).
                    tracing::warn!(
                        limit = limit.name(),
                        channel = shared.reset_channel,
                        error = why,
                        "reset, but could not announce it to other servers' deny caches"
                    );
                }
            });
        // Replies to requests sent before the reset finished may describe the
        // state before it; from now on none are learned.
        self.forget_cached(limit, key);
        if let Err(e) = &r {
            shared.count(e);
        }
        r
    }

    async fn settle(
        &self,
        limit: &Limit,
        key: &str,
        change: Settle,
    ) -> Result<Decision, StoreError> {
        change.validate(limit)?;
        let shared = &self.shared;
        // A charge only takes tokens: every cached bound still holds.
        let refund = matches!(change, Settle::Refund(_));
        if refund {
            self.forget_cached(limit, key);
        }
        let txn = Txn::settle(shared.config.prefix(), limit, key, change, shared.unit)?;
        let result = self.remote(txn).await;
        if refund {
            // Announced even when the call failed: a reply can miss its
            // deadline after the script ran, and a needless announcement
            // only costs the caches one bound each.
            self.announce(limit, key).await;
            // As after a reset: replies to requests sent meanwhile may
            // describe the key before the refund.
            self.forget_cached(limit, key);
        }
        let (txn, reply) = result?;
        bump(&shared.counters.remote);
        let parts = reply
            .ops
            .iter()
            .zip(txn.offsets())
            .map(|(seen, offset)| seen.state.decide(offset, reply.now, 0.0, false, 0.0));
        Ok(Decision::settled(parts))
    }

    async fn release(&self, limit: &Limit, key: &str, id: u64) -> Result<bool, StoreError> {
        // No call takes lease 0: a forgotten key brought back holds its
        // slots under it, for no one to release.
        if !limit.takes_leases() || id == 0 {
            return Ok(false);
        }
        let shared = &self.shared;
        let txn = Txn::release(shared.config.prefix(), limit, key, id, shared.unit)?;
        let (_, reply) = self.remote(txn).await?;
        bump(&shared.counters.remote);
        Ok(reply.ops.iter().any(|seen| seen.released))
    }

    async fn value(&self, limit: &Limit, key: &str) -> Result<sluice_core::Value, StoreError> {
        let shared = &self.shared;
        let txn = Txn::value(shared.config.prefix(), limit, key, shared.unit)?;
        let (txn, reply) = self.remote(txn).await?;
        let parts: Vec<sluice_core::Value> = reply
            .ops
            .iter()
            .zip(txn.offsets())
            .map(|(seen, offset)| seen.state.current(offset, reply.now))
            .collect();
        Ok(sluice_core::Value {
            tokens: parts.iter().map(|v| v.tokens).sum(),
            ts: parts.iter().map(|v| v.ts).max().unwrap_or(reply.now),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sluice_core::{SlidingLog, TokenBucket};

    fn job(limit: &Limit, key: &str) -> Job {
        let ops = [Op::new(limit, key, 1.0)];
        let (reply, _) = oneshot::channel();
        Job {
            txn: Txn::encode("p:", &ops, Mode::CONSUME, TimeUnit::ClientNanos).unwrap(),
            reply,
            deadline: Instant::now() + Duration::from_secs(60),
        }
    }

    /// A limit that changed kind, with a call under each handle queued at
    /// once: the second would rebuild the key from what it held before the
    /// script call and not see what the first spent (a sliding log of one
    /// an hour and a token bucket of one an hour both admitted, 50 times in
    /// 50, when they shared a call).
    #[tokio::test]
    async fn a_key_under_two_kinds_of_state_never_shares_a_script_call() {
        let hour = Nanos(3_600 * Nanos::PER_SEC);
        let log = Limit::new("chat", SlidingLog::per_period(1.0, hour).unwrap());
        let bucket = Limit::new("chat", TokenBucket::per_period(1.0, hour).unwrap());
        let (tx, mut rx) = mpsc::channel(16);
        for j in [
            job(&bucket, "other"),
            job(&bucket, "k"),
            job(&log, "other2"),
        ] {
            tx.send(j).await.unwrap();
        }
        let queued = job(&log, "k");
        tx.send(queued).await.unwrap();
        let now = Instant::now();
        let first = job(&log, "k");
        let (batch, held) = take_batch(first, &mut rx, 256, now, || StoreError::Timeout);
        // The log on k, then the bucket on another key; the bucket on k waits.
        assert_eq!(batch.len(), 2);
        let held = held.expect("the bucket on k is held back");
        assert!(held.txn.keys().all(|(k, _)| k.contains("{k}")));
        // The next batch starts with it, and takes the log on another key;
        // the log on k, queued behind, clashes with the bucket on k.
        let (batch, held) = take_batch(held, &mut rx, 256, now, || StoreError::Timeout);
        assert_eq!(batch.len(), 2);
        let (batch, rest) = take_batch(held.unwrap(), &mut rx, 256, now, || StoreError::Timeout);
        assert_eq!((batch.len(), rest.is_none()), (1, true));
        // One kind on one key, or a token bucket beside a fixed window,
        // shares a call as before.
        let (tx, mut rx) = mpsc::channel(16);
        tx.send(job(&log, "k")).await.unwrap();
        let (batch, held) = take_batch(job(&log, "k"), &mut rx, 256, now, || StoreError::Timeout);
        assert_eq!((batch.len(), held.is_none()), (2, true));
    }
}
