//! [`RedisStore`]: transactions queue to a dispatcher that sends them to
//! Redis in batches, one script call per batch (per hash slot on a Cluster),
//! with a deadline on every call and a local cache of certain denials, kept
//! true across servers by announcing every reset (see `resets`).
//!
//! This file is the store's face: [`RedisStore`], what it shares with its
//! background tasks, its use of the deny cache and the [`Store`]
//! implementation. The connection and how a command is sent on it are in
//! `connection`, the batching dispatcher in `dispatch`, readiness and the
//! health check in `health`, and the counters in `stats`.

mod connection;
mod dispatch;
mod health;
mod stats;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice_core::algorithm;
use sluice_core::{
    Algorithm, Clock, Decision, Limit, Mode, Nanos, Op, Outcome, Settle, Store, StoreError,
    SystemClock,
};
use smallvec::SmallVec;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::cache::DenyCache;
use crate::config::{RedisConfig, RedisConfigError};
use crate::keys;
use crate::resets::{self, SyncedCache};
use crate::script::{TimeUnit, Txn, TxnReply};
use crate::seen::SeenState;
use connection::{Conn, Resend, connect, send};
use dispatch::{Job, dispatch};
use health::{ping, watch};
use stats::{Counters, bump};

pub use stats::RedisStats;

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
    /// connection silent for longer than [`health::KEEPALIVE`] is pinged,
    /// since only a write finds out that it died (with a Redis that
    /// restarted).
    answered_ms: AtomicU64,
    born: Instant,
}

impl Shared {
    /// Keys written under virtual time live at least this long in real time,
    /// since virtual and real time need not run at the same speed.
    fn min_ttl_ms(&self) -> u64 {
        if self.client_time { 600_000 } else { 0 }
    }
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
