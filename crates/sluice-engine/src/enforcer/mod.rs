//! The [`Enforcer`]: a policy and a store, deciding requests and calls.
//!
//! Two verbs, each with one meaning: to *enforce* is to apply a policy's
//! rules to a request (`enforce`, `enforce_hits`, shaped or not); to
//! *decide* is to answer one call on one limit (`decide_named`, as a
//! store's `decide` does).
//!
//! The enforcer's methods are grouped by what they serve, a file each:
//! - this one: making it, the policy in force, what it has observed;
//! - [`request`]: deciding a request by its policy's rules, as one
//!   transaction, shadow rules apart, shaped or not;
//! - [`named`]: calls on named and inline limits (decide, acquire, settle,
//!   reset, wait until ready);
//! - [`held`]: what a request holds once decided (leases, reservations)
//!   and giving it back;
//! - [`penalties`]: the gates that keep a key that went over a limit with a
//!   `penalty` denied until it is served.

mod held;
mod named;
mod penalties;
mod request;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use quanta::Instant;
use sluice_core::{Decision, LEASE_IDS, Limit, OnStoreError, Op, Settle, Store, StoreError};
use sluice_policy::Policy;

use crate::activity::Activity;
use crate::give_back::giver;
use crate::inline::{DEFAULT_MAX_INLINE_LIMITS, InlineLimits};
use crate::leases::Releaser;
use crate::meters::{Meters, StoreOp};
use crate::reservation::Refunder;
use crate::store_errors;
use crate::top_keys::TopKeys;

pub use self::named::NotReady;

/// A policy and a store: decides requests, and takes a new policy at any
/// time without a pause (a reload swaps it atomically).
///
/// Decisions are counted in `sluice_decisions_total` (by rule, outcome and
/// mode) and store calls timed in `sluice_store_seconds`, through the
/// [`metrics`] recorder in place when a rule first decides: install yours
/// before the first request.
///
/// ```
/// use sluice_core::MemoryStore;
/// use sluice_engine::Enforcer;
/// use sluice_policy::{Policy, RequestParts};
/// let policy = Policy::from_str(r#"
/// rules:
///   - name: per-ip
///     limit_keys: [ip:address]
///     algorithm: token_bucket
///     algorithm_config: {rps: 1, burst: 1}
/// "#, "policy.yaml").unwrap();
/// let enforcer = Enforcer::new(policy, MemoryStore::new());
/// let req = RequestParts::new("GET", "/").with_ip([192, 0, 2, 1].into());
/// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// assert!(rt.block_on(enforcer.enforce(&req)).allowed);
/// let second = rt.block_on(enforcer.enforce(&req));
/// assert_eq!(second.denied_by(), Some("per-ip"));
/// ```
pub struct Enforcer<S> {
    policy: ArcSwap<Policy>,
    /// When the policy in force was put in force, in milliseconds since the
    /// Unix epoch.
    since: AtomicU64,
    store: Arc<S>,
    /// Gives leases back in the background (see [`HeldLeases`]).
    releaser: Releaser,
    /// Gives abandoned reservations back in the background (see
    /// [`Reservation`]).
    refunder: Refunder,
    meters: Meters,
    /// Where hot-key shard choices come from when they must repeat (replay);
    /// `None` draws them at random.
    picks: Option<Mutex<fastrand::Rng>>,
    /// The limits calls have supplied with themselves.
    inline: InlineLimits,
    /// The limits that requests' overrides put in place of a rule's, kept
    /// apart so that neither kind can use up the other's room.
    overrides: InlineLimits,
}

// Making one, and the policy in force.
impl<S: Store + 'static> Enforcer<S> {
    /// An enforcer of `policy` on `store`.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::Policy;
    /// let e = Enforcer::new(Policy::default(), MemoryStore::new());
    /// assert!(e.policy().rules().is_empty());
    /// ```
    pub fn new(policy: Policy, store: S) -> Self {
        let store = Arc::new(store);
        let meters = Meters::default();
        Enforcer {
            policy: ArcSwap::from_pointee(policy),
            since: AtomicU64::new(unix_millis(SystemTime::now())),
            releaser: giver(Arc::clone(&store), Arc::clone(&meters.errors)),
            refunder: giver(Arc::clone(&store), Arc::clone(&meters.errors)),
            store,
            meters,
            picks: None,
            inline: InlineLimits::new(DEFAULT_MAX_INLINE_LIMITS),
            overrides: InlineLimits::new(DEFAULT_MAX_INLINE_LIMITS),
        }
    }

    /// The same enforcer, keeping at most `max` inline limit names, and as
    /// many overrides (256 each unless told otherwise): see
    /// [`Enforcer::inline_limit`] and [`Enforcer::override_limit`].
    #[must_use]
    pub fn with_max_inline_limits(self, max: usize) -> Self {
        Enforcer {
            inline: InlineLimits::new(max),
            overrides: InlineLimits::new(max),
            ..self
        }
    }

    /// The same enforcer, choosing hot-key shards from a generator seeded
    /// with `seed`, so that a run repeats exactly (`replay --seed`).
    ///
    /// ```
    /// # use sluice_core::{FakeClock, MemoryStore, Nanos};
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::{Policy, RequestParts};
    /// let yaml = "rules: [{name: r, limit_keys: [header:k], algorithm: token_bucket, algorithm_config: {rps: 1, burst: 8, shards: 4}}]";
    /// let run = || {
    ///     let store = MemoryStore::with_clock(FakeClock::new(Nanos::ZERO));
    ///     let e = Enforcer::new(Policy::from_str(yaml, "p").unwrap(), store).with_seed(7);
    ///     let req = RequestParts::new("GET", "/").with_header("k", "v");
    ///     let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    ///     (0..6).map(|_| rt.block_on(e.enforce(&req)).rules[0].decision.remaining).collect::<Vec<_>>()
    /// };
    /// assert_eq!(run(), run());
    /// ```
    #[must_use]
    pub fn with_seed(self, seed: u64) -> Self {
        Enforcer {
            picks: Some(Mutex::new(fastrand::Rng::with_seed(seed))),
            ..self
        }
    }

    /// The policy in force: a snapshot that a reload does not change. Decide
    /// a request with the same snapshot its view was built with.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::Policy;
    /// let e = Enforcer::new(Policy::default(), MemoryStore::new());
    /// assert!(e.policy().named_limits().is_empty());
    /// ```
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Puts `policy` in force for every later request.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::Policy;
    /// let e = Enforcer::new(Policy::default(), MemoryStore::new());
    /// e.replace(Policy::from_str("rules: [{name: r, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap());
    /// assert_eq!(e.policy().rules().len(), 1);
    /// ```
    pub fn replace(&self, policy: Policy) {
        self.policy.store(Arc::new(policy));
        self.since
            .store(unix_millis(SystemTime::now()), Ordering::Relaxed);
    }

    /// When the policy in force was put in force: when the enforcer was
    /// made, or last [`replace`](Enforcer::replace)d it. To the millisecond.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::Policy;
    /// let e = Enforcer::new(Policy::default(), MemoryStore::new());
    /// let made = e.policy_since();
    /// std::thread::sleep(std::time::Duration::from_millis(2));
    /// e.replace(Policy::default());
    /// assert!(e.policy_since() > made);
    /// ```
    pub fn policy_since(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.since.load(Ordering::Relaxed))
    }

    /// Starts keeping a bounded summary of the keys denied most (see
    /// [`TopKeys`]), if it is not kept yet, and returns it. Once kept, each
    /// denial takes one of the summary's locks, so it is left off until
    /// something wants to read it.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::{Policy, RequestParts, readable_key};
    /// let policy = Policy::from_str("rules: [{name: r, limit_keys: [ip:address], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::new());
    /// let top = e.keep_top_keys();
    /// let req = RequestParts::new("GET", "/").with_ip([192, 0, 2, 1].into());
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// for _ in 0..3 {
    ///     rt.block_on(e.enforce(&req));
    /// }
    /// let first = &top.top(1)[0];
    /// assert_eq!((readable_key(&first.key).as_str(), first.denied), ("192.0.2.1", 2));
    /// ```
    pub fn keep_top_keys(&self) -> &TopKeys {
        self.meters.top_keys.get_or_init(TopKeys::default)
    }

    /// Running totals of the decisions made and the store calls, which a
    /// later reading can be compared with.
    ///
    /// ```
    /// # use sluice_core::{MemoryStore, Mode};
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::{Enforcement, Policy};
    /// let policy = Policy::from_str("limits: {send: {algorithm: token_bucket, algorithm_config: {rps: 1}}}", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::new());
    /// let policy = e.policy();
    /// let send = policy.named_limit("send").unwrap();
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let before = e.activity();
    /// rt.block_on(e.decide_named(send, "alice", 1.0, Mode::CONSUME)).unwrap();
    /// rt.block_on(e.decide_named(send, "alice", 1.0, Mode::CONSUME)).unwrap();
    /// let after = e.activity();
    /// let send = &after.rules[0];
    /// assert_eq!((send.rule.as_str(), send.enforcement, send.allowed, send.denied), ("send", Enforcement::Enforce, 1, 1));
    /// assert_eq!(after.store.since(&before.store).calls(), 2);
    /// ```
    pub fn activity(&self) -> Activity {
        self.meters.activity()
    }

    /// The store.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::Policy;
    /// let e = Enforcer::new(Policy::default(), MemoryStore::new());
    /// assert!(e.store().is_empty());
    /// ```
    pub fn store(&self) -> &S {
        &self.store
    }

    /// An operation on `limit`, its shard choice drawn from the seeded
    /// generator when there is one.
    fn op<'k>(&self, limit: &'k Limit, key: &'k str, cost: f64) -> Op<'k> {
        let op = Op::new(limit, key, cost);
        match &self.picks {
            Some(rng) => {
                let mut rng = rng.lock();
                let op = op.with_pick(rng.u64(..));
                if limit.takes_leases() {
                    op.with_lease(rng.u64(LEASE_IDS))
                } else {
                    op
                }
            }
            None => op,
        }
    }

    async fn settle(
        &self,
        limit: &Limit,
        name: &str,
        on_error: OnStoreError,
        key: &str,
        change: Settle,
    ) -> Result<Decision, StoreError> {
        let started = Instant::now();
        let result = self.store.settle(limit, key, change).await;
        self.meters.timed(StoreOp::Settle, started);
        match &result {
            Ok(_) => {
                let kind = match change {
                    Settle::Refund(_) => "refund",
                    Settle::Charge(_) | Settle::ChargeOnce(_) => "charge",
                };
                metrics::counter!("sluice_settlements_total", "limit" => name.to_owned(), "kind" => kind)
                    .increment(1);
            }
            Err(StoreError::Cost(_)) => {}
            Err(e) => self.store_failed(e, [(name, on_error)]),
        }
        result
    }

    /// Counts a failed store call in `sluice_store_errors_total` for each
    /// rule or named limit it decided, by how that one fails, and logs it.
    fn store_failed<'r>(
        &self,
        e: &StoreError,
        deciding: impl IntoIterator<Item = (&'r str, OnStoreError)>,
    ) {
        store_errors::store_failed(&self.meters.errors, e, deciding);
    }
}

/// `t` in whole milliseconds since the Unix epoch (0 before it).
fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
