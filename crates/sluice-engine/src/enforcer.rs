//! The [`Enforcer`]: a policy and a store, deciding requests and calls.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use quanta::Instant;
use sluice_core::{
    Decision, LEASE_IDS, Limit, Mode, OnStoreError, Op, Outcome, Settle, Store, StoreError,
};
use sluice_policy::{Enforcement, NamedLimit, Penalty, Policy, Request, Rule, RuleHit};
use smallvec::SmallVec;

use crate::activity::Activity;
use crate::inline::{DEFAULT_MAX_INLINE_LIMITS, InlineError, InlineLimits, check_name};
use crate::meters::{Meters, StoreOp};
use crate::reservation::{Refunder, Reservation, Reserved, refunder};
use crate::slots::{Held, HeldLeases, Releaser, failed_release, releaser};
use crate::store_errors;
use crate::top_keys::TopKeys;
use crate::verdict::{NamedDecision, Refusal, RuleDecision, ShadowDecision, Verdict};
use crate::verified::Verified;

/// The rule hits of one request that [`Enforcer::decide`] applies in one way.
type Hits<'h, 'r> = SmallVec<[&'h RuleHit<'r>; 2]>;

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
/// let policy = enforcer.policy();
/// assert!(rt.block_on(enforcer.enforce(&policy, &req)).allowed);
/// let second = rt.block_on(enforcer.enforce(&policy, &req));
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
            releaser: releaser(Arc::clone(&store), Arc::clone(&meters.errors)),
            refunder: refunder(Arc::clone(&store), Arc::clone(&meters.errors)),
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

    /// A limit that a call supplies with itself rather than naming one of
    /// `policy`'s: `name` (its state's name), `algorithm` and
    /// `algorithm_config` as a policy file's `limits` entry writes them,
    /// checked as that entry would be. Decide with it as with a named
    /// limit ([`Enforcer::decide_named`]).
    ///
    /// The enforcer keeps each name's configuration, so that a name given
    /// again with the same configuration is not checked again, and keeps
    /// at most a bounded number of names: each is a table in the memory
    /// store and a label in the metrics. A name given with a new
    /// configuration takes it, and its keys keep their state. A name is
    /// 1 to 128 ASCII letters, digits, `_`, `.` and `-`, and none of the
    /// policy's: it cannot spell another limit's state.
    ///
    /// ```
    /// # use sluice_core::{MemoryStore, Mode};
    /// # use sluice_engine::{Enforcer, InlineError};
    /// # use sluice_policy::Policy;
    /// use serde_json::json;
    /// let e = Enforcer::new(Policy::default(), MemoryStore::new()).with_max_inline_limits(1);
    /// let policy = e.policy();
    /// let quota = e.inline_limit(&policy, "quota", &json!("fixed_window"), &json!({"rate": 2, "period": "1h"}))?;
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let d = rt.block_on(e.decide_named(&quota, "org-7", 2.0, Mode::CONSUME)).unwrap().decision;
    /// assert_eq!((d.allowed, d.remaining), (true, 0));
    /// // One name is all this enforcer keeps.
    /// let other = e.inline_limit(&policy, "other", &json!("token_bucket"), &json!({"rps": 1}));
    /// assert_eq!(other.unwrap_err(), InlineError::Full(1));
    /// # Ok::<_, InlineError>(())
    /// ```
    pub fn inline_limit(
        &self,
        policy: &Policy,
        name: &str,
        algorithm: &serde_json::Value,
        algorithm_config: &serde_json::Value,
    ) -> Result<Arc<NamedLimit>, InlineError> {
        check_name(name)?;
        self.inline.get(policy, name, algorithm, algorithm_config)
    }

    /// A limit that a request's override puts in place of one of
    /// `policy`'s rules for that request (an Envoy descriptor's `limit`):
    /// as [`Enforcer::inline_limit`], under a name the caller makes from
    /// the rule and the override, and bounded apart from the inline limits.
    pub fn override_limit(
        &self,
        policy: &Policy,
        name: &str,
        algorithm: &serde_json::Value,
        algorithm_config: &serde_json::Value,
    ) -> Result<Arc<NamedLimit>, InlineError> {
        self.overrides
            .get(policy, name, algorithm, algorithm_config)
    }

    /// The limit named `name`: `policy`'s, or else the inline limit last
    /// given that name, for the calls that read or reset a key by name.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::Policy;
    /// use serde_json::json;
    /// let e = Enforcer::new(Policy::default(), MemoryStore::new());
    /// let policy = e.policy();
    /// assert!(e.limit_named(&policy, "quota").is_none());
    /// e.inline_limit(&policy, "quota", &json!("token_bucket"), &json!({"rps": 1})).unwrap();
    /// assert_eq!(e.limit_named(&policy, "quota").unwrap().name(), "quota");
    /// ```
    pub fn limit_named(&self, policy: &Policy, name: &str) -> Option<Arc<NamedLimit>> {
        if let Some(named) = policy.named_limit(name) {
            return Some(Arc::new(named.clone()));
        }
        // A rule that a reload named as an inline limit was: the inline
        // configuration no longer describes that state.
        if policy.rules().iter().any(|r| r.name() == name) {
            return None;
        }
        self.inline.named(name)
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
    ///     let policy = e.policy();
    ///     (0..6).map(|_| rt.block_on(e.enforce(&policy, &req)).rules[0].decision.remaining).collect::<Vec<_>>()
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
    /// assert!(e.policy().limits().is_empty());
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
    /// let policy = e.policy();
    /// for _ in 0..3 {
    ///     rt.block_on(e.enforce(&policy, &req));
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
    /// assert_eq!((send.rule.as_str(), send.mode, send.allowed, send.denied), ("send", Enforcement::Enforce, 1, 1));
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

    /// Takes `count` slots of `key` on the concurrency limit `named` under a
    /// new lease, as `/v1/acquire` does: decided, timed and counted as
    /// [`Enforcer::decide_named`] decides a call, and returning the lease
    /// when admitted. Release it with [`Enforcer::release`] when the work
    /// ends; if it never is, its slots come back when it expires.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::{Enforcer, Held};
    /// # use sluice_policy::Policy;
    /// let policy = Policy::from_str("limits: {uploads: {algorithm: concurrency, algorithm_config: {max: 1, lease: 30s}}}", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::new());
    /// let policy = e.policy();
    /// let uploads = policy.named_limit("uploads").unwrap();
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let (d, held) = rt.block_on(e.acquire_named(uploads, "alice", 1.0)).unwrap();
    /// assert!(d.decision.allowed);
    /// let held = held.unwrap();
    /// let (d, none) = rt.block_on(e.acquire_named(uploads, "alice", 1.0)).unwrap();
    /// assert!(!d.decision.allowed && none.is_none());
    /// // Unless it is released, the lease lasts 30 s from when it was taken.
    /// assert!(d.decision.retry_after.is_some_and(|wait| wait > 29.0 && wait <= 30.0));
    /// assert!(rt.block_on(e.release(&held)).unwrap());
    /// assert!(rt.block_on(e.acquire_named(uploads, "alice", 1.0)).unwrap().0.decision.allowed);
    /// ```
    pub async fn acquire_named(
        &self,
        named: &NamedLimit,
        key: &str,
        count: f64,
    ) -> Result<(NamedDecision, Option<Held>), StoreError> {
        let op = self.op(named.limit(), key, count);
        // Released if the store call ends without an answer (an error, a
        // missed deadline, a dropped future): it may have taken the lease.
        let mut pending = self.pending([&op]);
        let d = self.decide_op(named, op, Mode::CONSUME).await?;
        let mut leases = pending.disarm();
        Ok((d, leases.pop().filter(|_| d.decision.allowed)))
    }

    /// The leases `ops` would take, held until the store answers: see
    /// [`HeldLeases::disarm`].
    fn pending<'o>(&self, ops: impl IntoIterator<Item = &'o Op<'o>>) -> HeldLeases {
        let leases = ops
            .into_iter()
            .filter(|op| op.limit.takes_leases() && op.cost > 0.0)
            .map(|op| Held {
                limit: op.limit.clone(),
                key: op.key.to_owned(),
                lease: op.lease,
            })
            .collect();
        HeldLeases::new(leases, &self.releaser)
    }

    /// Takes the leases `verdict` took (see [`Verdict::leases`]) into
    /// [`HeldLeases`] that release them when dropped: hold it for as long as the
    /// request's work goes on.
    ///
    /// [`Verdict::leases`]: crate::Verdict::leases
    pub fn hold(&self, verdict: &mut Verdict) -> HeldLeases {
        HeldLeases::new(std::mem::take(&mut verdict.leases), &self.releaser)
    }

    /// Takes what `verdict` reserved for a held request (see
    /// [`Verdict::delay`]) into a [`Reservation`] that gives it back when
    /// dropped before it is kept: hold it while the request waits, and
    /// keep it when the request goes on ([`Reservation::until_due`] does
    /// both). A verdict with no delay gives [`Reservation::none`].
    pub fn reservation(&self, verdict: &mut Verdict) -> Reservation {
        match verdict.delay {
            Some(wait) if !verdict.reserved.is_empty() => Reservation::new(
                std::mem::take(&mut verdict.reserved),
                wait,
                &self.refunder,
                &self.meters.held,
            ),
            _ => Reservation::none(),
        }
    }

    /// Reserves `cost` of `key` on the named limit `named` and waits until
    /// the reservation is due, as governor's `until_ready` does, on any
    /// store: `Ok` once the call may go on (its tokens spent). A wait
    /// longer than `max` is not waited: the reservation is given back and
    /// the error says how long it would have been; so is a call the limit
    /// refuses outright (beyond its `max_reserved`, or serving a penalty),
    /// with its `retry_after`. `jitter` adds a random wait of up to that
    /// much to a call that has to wait, so that callers held together do
    /// not all go on at the same instant. A future dropped before the call
    /// is due gives the reservation back. While waiting, the call counts in
    /// [`Activity::held`](crate::Activity::held).
    ///
    /// When the store fails, the limit's `on_store_error` decides as in
    /// [`Enforcer::decide_named`]: `open` lets the call go on at once.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::{Enforcer, NotReady};
    /// # use sluice_policy::Policy;
    /// let policy = Policy::from_str("limits: {send: {algorithm: token_bucket, algorithm_config: {rps: 10, burst: 1, max_reserved: 10}}}", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::new());
    /// let policy = e.policy();
    /// let send = policy.named_limit("send").unwrap();
    /// let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    /// rt.block_on(async {
    ///     let max = Duration::from_millis(150);
    ///     e.until_ready_named(send, "alice", 1.0, max, None).await.unwrap();
    ///     // The second waits about 100 ms; the third would wait 200 ms.
    ///     e.until_ready_named(send, "alice", 1.0, max, None).await.unwrap();
    ///     let Err(NotReady::Wait(wait)) = e.until_ready_named(send, "alice", 2.0, max, None).await else { panic!() };
    ///     assert!(wait > max);
    /// });
    /// ```
    pub async fn until_ready_named(
        &self,
        named: &NamedLimit,
        key: &str,
        cost: f64,
        max: Duration,
        jitter: Option<Duration>,
    ) -> Result<NamedDecision, NotReady> {
        let op = self.op(named.limit(), key, cost);
        let d = self
            .decide_op(named, op, Mode::RESERVE)
            .await
            .map_err(NotReady::Store)?;
        let wait = d.decision.retry_after.map(Duration::from_secs_f64);
        if !d.decision.allowed {
            return Err(NotReady::Wait(wait.unwrap_or(max)));
        }
        let Some(wait) = wait.filter(|w| !w.is_zero()) else {
            return Ok(d);
        };
        let part = Reserved {
            limit: named.limit().clone(),
            key: key.to_owned(),
            cost,
        };
        if wait > max {
            self.refund(&[part], named.on_store_error()).await;
            return Err(NotReady::Wait(wait));
        }
        let extra = jitter.map_or(Duration::ZERO, |j| {
            Duration::from_nanos(fastrand::u64(
                ..=u64::try_from(j.as_nanos()).unwrap_or(u64::MAX),
            ))
        });
        Reservation::new(vec![part], wait + extra, &self.refunder, &self.meters.held)
            .until_due()
            .await;
        Ok(d)
    }

    /// Gives back what `parts` reserved, now, each counted under its
    /// limit's name.
    async fn refund(&self, parts: &[Reserved], on_error: OnStoreError) {
        for part in parts {
            // A failure is counted; the tokens then stay spent.
            let _ = self
                .settle(
                    &part.limit,
                    part.limit.name(),
                    on_error,
                    &part.key,
                    Settle::Refund(part.cost),
                )
                .await;
        }
    }

    /// Releases a lease taken by [`Enforcer::acquire_named`] or by a
    /// request (see [`crate::Verdict::leases`]): its slots come back at
    /// once. Returns whether it was still held; releasing one that is
    /// unknown, expired or already released changes nothing. A failed
    /// store call is counted in `sluice_store_errors_total`, and the lease
    /// then expires on its own.
    pub async fn release(&self, held: &Held) -> Result<bool, StoreError> {
        let started = Instant::now();
        let result = self.store.release(&held.limit, &held.key, held.lease).await;
        self.meters.timed(StoreOp::Release, started);
        if let Err(e) = &result {
            failed_release(&self.meters.errors, e, held);
        }
        result
    }

    /// Decides a call of `cost` on `key` of the named limit `named` in
    /// `mode`, as the decision API does: timed like the rules' store calls,
    /// and counted in `sluice_decisions_total` under the limit's name, as
    /// enforced (the caller asked for this limit's answer and gets it,
    /// whatever the limit's `mode` in the policy).
    ///
    /// When the store fails, the limit's `on_store_error` decides: `open`
    /// allows (with nothing remaining, as no state was read) and says so in
    /// [`NamedDecision::without_store`], `closed` returns the error. Either
    /// way the failure is counted in `sluice_store_errors_total`, and the
    /// decision in `sluice_decisions_without_store_total`. An impossible
    /// cost is always an error.
    ///
    /// ```
    /// # use sluice_core::{MemoryStore, Mode};
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::Policy;
    /// let policy = Policy::from_str("limits: {send: {algorithm: token_bucket, algorithm_config: {rps: 1, burst: 1}}}", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::new());
    /// let policy = e.policy();
    /// let send = policy.named_limit("send").unwrap();
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let call = || e.decide_named(send, "alice", 1.0, Mode::CONSUME);
    /// let first = rt.block_on(call()).unwrap();
    /// assert!(first.decision.allowed && first.without_store.is_none());
    /// assert!(!rt.block_on(call()).unwrap().decision.allowed);
    /// ```
    pub async fn decide_named(
        &self,
        named: &NamedLimit,
        key: &str,
        cost: f64,
        mode: Mode,
    ) -> Result<NamedDecision, StoreError> {
        let op = self.op(named.limit(), key, cost);
        self.decide_op(named, op, mode).await
    }

    /// [`Enforcer::decide_named`] of `op`, built for `named`.
    async fn decide_op(
        &self,
        named: &NamedLimit,
        op: Op<'_>,
        mode: Mode,
    ) -> Result<NamedDecision, StoreError> {
        let started = Instant::now();
        let result = match named.penalty() {
            None => self.store.decide(op, mode).await,
            Some(_) => self
                .gated(&[op], &[Owner::of_limit(named)], mode)
                .await
                .map(|out| out.decisions[0]),
        };
        self.meters.timed(StoreOp::Decide, started);
        let (decision, without_store) = match result {
            Ok(d) => (d, None),
            Err(StoreError::Cost(e)) => return Err(StoreError::Cost(e)),
            Err(e) => {
                let how = named.on_store_error();
                self.store_failed(&e, [(named.name(), how)]);
                store_errors::decided_without_store(named.name(), how);
                if how == OnStoreError::Closed {
                    return Err(e);
                }
                (how.outcome(&[op]).decisions[0], Some(how))
            }
        };
        self.meters
            .count(named.name(), Enforcement::Enforce, decision.allowed, op.key);
        Ok(NamedDecision {
            decision,
            without_store,
        })
    }

    /// Settles a call's real cost on `key` of the named limit `named`, once
    /// it is known: gives tokens back, or takes them even below zero (see
    /// [`Settle`]). Timed in `sluice_store_seconds{op="settle"}` and
    /// counted in `sluice_settlements_total` by limit and kind.
    ///
    /// A settlement the store could not make is always an error, whatever
    /// the limit's `on_store_error`: reporting a refund that did not happen
    /// would be a lie, not a way of failing open. The failure is counted in
    /// `sluice_store_errors_total` all the same.
    ///
    /// ```
    /// # use sluice_core::{MemoryStore, Mode, Settle};
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::Policy;
    /// let policy = Policy::from_str("limits: {llm: {algorithm: token_bucket, algorithm_config: {rate: 1000, period: 1m}}}", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::new());
    /// let policy = e.policy();
    /// let llm = policy.named_limit("llm").unwrap();
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// assert!(rt.block_on(e.decide_named(llm, "team", 1000.0, Mode::CONSUME)).unwrap().decision.allowed);
    /// let d = rt.block_on(e.settle_named(llm, "team", Settle::Refund(600.0))).unwrap();
    /// assert_eq!(d.remaining, 600);
    /// ```
    pub async fn settle_named(
        &self,
        named: &NamedLimit,
        key: &str,
        change: Settle,
    ) -> Result<Decision, StoreError> {
        self.settle(
            named.limit(),
            named.name(),
            named.on_store_error(),
            key,
            change,
        )
        .await
    }

    /// Makes `key` of the named limit `named` full again, and lets it off
    /// any penalty it is serving.
    ///
    /// ```
    /// # use sluice_core::{MemoryStore, Mode};
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::Policy;
    /// let policy = Policy::from_str("limits: {login: {algorithm: token_bucket, algorithm_config: {rate: 1, period: 1m}, penalty: 1h}}", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::new());
    /// let policy = e.policy();
    /// let login = policy.named_limit("login").unwrap();
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let call = || async { e.decide_named(login, "mallory", 1.0, Mode::CONSUME).await.unwrap().decision };
    /// assert!(rt.block_on(call()).allowed);
    /// assert_eq!(rt.block_on(call()).retry_after, Some(3600.0));
    /// rt.block_on(e.reset_named(login, "mallory")).unwrap();
    /// assert!(rt.block_on(call()).allowed);
    /// ```
    pub async fn reset_named(&self, named: &NamedLimit, key: &str) -> Result<(), StoreError> {
        if let Some(p) = named.penalty() {
            self.store.reset(p.gate(), key).await?;
        }
        self.store.reset(named.limit(), key).await
    }

    /// Settles on the state a rule's hit names, as
    /// [`Enforcer::settle_named`] does on a named limit's: what an Envoy
    /// descriptor with negative hits asks for.
    pub async fn settle_hit(
        &self,
        hit: &RuleHit<'_>,
        change: Settle,
    ) -> Result<Decision, StoreError> {
        let rule = hit.rule;
        self.settle(
            hit.limit(),
            rule.name(),
            rule.on_store_error(),
            &hit.key,
            change,
        )
        .await
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

    /// Applies `policy`'s HTTP rules (those without a `domain`) to `req`,
    /// consuming from every enforced rule that applies when all of them
    /// admit it. Rules see JWT claims only from a token that `policy`'s keys
    /// verify (see [`Verified`]). `policy` is the snapshot `req` was viewed
    /// through (its trusted proxies), so that a reload in between cannot mix
    /// two policies in one decision.
    ///
    /// A rule with `on_limit: {delay}` refuses here as if it had none: the
    /// caller cannot hold the request (see [`Enforcer::enforce_shaped`]).
    pub async fn enforce<R: Request + ?Sized>(&self, policy: &Policy, req: &R) -> Verdict {
        let req = Verified::new(req, policy);
        let hits: SmallVec<[RuleHit<'_>; 2]> = policy.matching(&req).collect();
        self.decide_in(&hits, false).await
    }

    /// [`Enforcer::enforce`], for a caller that can hold a request: when
    /// every enforced rule that applies delays (`on_limit: {delay}`), the
    /// request reserves rather than consumes, all its rules as one
    /// transaction, and a request over the limit is admitted with
    /// [`Verdict::delay`], the time until its tokens are due. A rule whose
    /// wait is longer than its own `max` refuses the request as it would
    /// without a delay (the reservation given back at once, the
    /// `retry_after` the wait). When any enforced rule that applies has no
    /// delay, the request is decided as [`Enforcer::enforce`] decides it,
    /// refused over any limit: one rule cannot hold a request that another
    /// would refuse. Shadow rules never delay.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use sluice_core::{FakeClock, MemoryStore, Nanos};
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::{Policy, RequestParts};
    /// let policy = Policy::from_str("rules: [{name: r, limit_keys: [ip:address], algorithm: token_bucket, \
    ///     algorithm_config: {rps: 10, burst: 1, max_reserved: 2}, on_limit: {delay: {max: 1s}}}]", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::with_clock(FakeClock::new(Nanos::ZERO)));
    /// let req = RequestParts::new("GET", "/").with_ip([192, 0, 2, 1].into());
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let policy = e.policy();
    /// let delays: Vec<_> = (0..4).map(|_| {
    ///     let v = rt.block_on(e.enforce_shaped(&policy, &req));
    ///     v.allowed.then_some(v.delay)
    /// }).collect();
    /// let ms = Duration::from_millis;
    /// assert_eq!(delays, [Some(None), Some(Some(ms(100))), Some(Some(ms(200))), None]);
    /// ```
    pub async fn enforce_shaped<R: Request + ?Sized>(&self, policy: &Policy, req: &R) -> Verdict {
        let req = Verified::new(req, policy);
        let hits: SmallVec<[RuleHit<'_>; 2]> = policy.matching(&req).collect();
        self.decide_in(&hits, true).await
    }

    /// [`Enforcer::decide`], for a caller that can hold a request, as
    /// [`Enforcer::enforce_shaped`] is for [`Enforcer::enforce`].
    pub fn decide_shaped<'a>(
        &'a self,
        hits: &'a [RuleHit<'a>],
    ) -> impl Future<Output = Verdict> + Send + 'a {
        self.decide_in(hits, true)
    }

    /// Applies the rules that `hits` found: all enforced ones as one
    /// transaction, each shadow one on its own.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::{Policy, RequestParts};
    /// let policy = Policy::from_str("rules: [{name: r, domain: edge, limit_keys: ['descriptor:k'], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::new());
    /// let d = RequestParts::default().with_descriptor("k", "v");
    /// let policy = e.policy();
    /// let hits: Vec<_> = policy.matching_domain("edge", &d).collect();
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// assert_eq!(rt.block_on(e.decide(&hits)).rules.len(), 1);
    /// ```
    // Not an `async fn`: one that only awaits another holds that one's
    // future and more, and a decision's future is moved into a box with
    // each request.
    pub fn decide<'a>(
        &'a self,
        hits: &'a [RuleHit<'a>],
    ) -> impl Future<Output = Verdict> + Send + 'a {
        self.decide_in(hits, false)
    }

    /// [`Enforcer::decide`], reserving for rules that delay when `shaped`
    /// (see [`Enforcer::enforce_shaped`]).
    async fn decide_in(&self, hits: &[RuleHit<'_>], shaped: bool) -> Verdict {
        let (verdict, give_back) = self.decide_hits(hits, shaped).await;
        if let Some((parts, on_error)) = give_back {
            // Boxed, as `gated` is: only a request refused for waiting too
            // long gets here.
            Box::pin(self.refund(&parts, on_error)).await;
        }
        verdict
    }

    /// [`Enforcer::decide_in`] but for giving back the reservation of a
    /// request refused for waiting too long, which it returns: awaited here,
    /// with all that a decision holds still alive, a refund would enlarge
    /// every decision's future by a third.
    async fn decide_hits(
        &self,
        hits: &[RuleHit<'_>],
        shaped: bool,
    ) -> (Verdict, Option<(Vec<Reserved>, OnStoreError)>) {
        let mut verdict = Verdict::default();
        // Requests meet a rule or two: these lists stay off the heap.
        let (enforce, shadow): (Hits<'_, '_>, Hits<'_, '_>) = hits
            .iter()
            .partition(|h| h.rule.mode() == Enforcement::Enforce);

        for hit in shadow {
            let allowed = !hit.missing && self.shadow(hit, &mut verdict.leases).await;
            self.count(hit, allowed);
            verdict.shadow.push(ShadowDecision {
                rule: hit.rule.name().to_owned(),
                key: hit.key.clone(),
                cost: hit.cost,
                allowed,
            });
        }

        if let Some(hit) = enforce.iter().find(|h| h.missing) {
            verdict.allowed = false;
            verdict.refusal = Some((hit.rule.name().to_owned(), Refusal::MissingKey));
            self.count(hit, false);
            return (verdict, None);
        }
        if enforce.is_empty() {
            return (verdict, None);
        }
        let ops: SmallVec<[Op<'_>; 2]> = enforce
            .iter()
            .map(|h| self.op(h.limit(), &h.key, h.cost))
            .collect();
        let rules: SmallVec<[&Rule; 2]> = enforce.iter().map(|h| h.rule).collect();
        let mode = if shaped && rules.iter().all(|r| r.delay().is_some()) {
            Mode::RESERVE
        } else {
            Mode::CONSUME
        };
        // The leases the transaction may take, released unless the store
        // says whether it took them.
        let mut pending = self.pending(ops.as_slice());
        let result = self.transact(&ops, &rules, mode).await;
        if let Ok(out) = &result {
            let taken = pending.disarm();
            if out.allowed {
                verdict.leases.extend(taken);
            }
        }
        let outcome = match result {
            Ok(out) => out,
            Err(StoreError::Cost(e)) => {
                let at = ops.iter().position(|op| op.validate(mode.reserve).is_err());
                let rule = at.map_or(rules[0], |i| rules[i]);
                verdict.allowed = false;
                verdict.refusal = Some((rule.name().to_owned(), Refusal::Cost(e.to_string())));
                return (verdict, None);
            }
            Err(e) => {
                // One failed transaction fails every rule in it; a single
                // rule that fails closed is enough to deny.
                let closed = rules
                    .iter()
                    .find(|r| r.on_store_error() == OnStoreError::Closed);
                let how = match closed {
                    Some(rule) => {
                        verdict.refusal =
                            Some((rule.name().to_owned(), Refusal::StoreFailed(e.to_string())));
                        OnStoreError::Closed
                    }
                    None => OnStoreError::Open,
                };
                verdict.without_store = Some(how);
                how.outcome(&ops)
            }
        };
        let (outcome, give_back) =
            if mode.reserve && outcome.allowed && verdict.without_store.is_none() {
                hold_or_refuse(outcome, &ops, &rules, &mut verdict)
            } else {
                (outcome, Vec::new())
            };
        verdict.rules.reserve_exact(enforce.len());
        for (hit, d) in enforce.iter().zip(&outcome.decisions) {
            self.count(hit, d.allowed);
            if let Some(how) = verdict.without_store {
                store_errors::decided_without_store(hit.rule.name(), how);
            }
            verdict.rules.push(RuleDecision {
                rule: hit.rule.name().to_owned(),
                key: hit.key.clone(),
                cost: hit.cost,
                decision: *d,
                window: quota_window(hit.limit()),
                in_flight: hit.limit().takes_leases(),
            });
        }
        verdict.allowed = outcome.allowed;
        verdict.deciding = outcome.deciding();
        verdict.retry_after = outcome.retry_after();
        let on_error = rules[0].on_store_error();
        (
            verdict,
            (!give_back.is_empty()).then_some((give_back, on_error)),
        )
    }

    /// Whether a shadow rule would have admitted its hit, enforced alone: a
    /// cost it can never admit would deny, and a failed store call answers
    /// as the rule's `on_store_error` says.
    /// A lease it took, as if enforced, joins `leases`, to be released with
    /// the request's.
    async fn shadow(&self, hit: &RuleHit<'_>, leases: &mut Vec<Held>) -> bool {
        let op = self.op(hit.limit(), &hit.key, hit.cost);
        let mut pending = self.pending([&op]);
        match self.transact(&[op], &[hit.rule], Mode::CONSUME).await {
            Ok(out) => {
                let taken = pending.disarm();
                if out.allowed {
                    leases.extend(taken);
                }
                out.allowed
            }
            Err(StoreError::Cost(_)) => false,
            Err(_) => hit.rule.on_store_error() == OnStoreError::Open,
        }
    }

    fn count(&self, hit: &RuleHit<'_>, allowed: bool) {
        self.meters
            .count(hit.rule.name(), hit.rule.mode(), allowed, &hit.key);
    }

    /// One rules' transaction, timed and counted; failures are counted by
    /// how the rules in it treat them.
    async fn transact(
        &self,
        ops: &[Op<'_>],
        rules: &[&Rule],
        mode: Mode,
    ) -> Result<Outcome, StoreError> {
        let started = Instant::now();
        let result = if rules.iter().all(|r| r.penalty().is_none()) {
            self.store.transact(ops, mode).await
        } else {
            let owners: Vec<Owner<'_>> = rules.iter().map(|r| Owner::of_rule(r)).collect();
            self.gated(ops, &owners, mode).await
        };
        self.meters.timed(StoreOp::Transact, started);
        if let Err(e) = &result
            && !matches!(e, StoreError::Cost(_))
        {
            self.store_failed(e, rules.iter().map(|r| (r.name(), r.on_store_error())));
        }
        result
    }

    /// Decides `ops` (the `i`th for `owners[i]`) in `mode` together with the
    /// gates of their owners' penalties (see [`Penalty`]), in one
    /// transaction: a key serving a penalty is denied outright until it
    /// ends, with the rest of it as `retry_after`; a key that an owner with
    /// a penalty denies by its own limit starts serving one (a check starts
    /// none), counted in `sluice_penalties_total`.
    ///
    /// The penalty starts with a second store call, made only on such a
    /// denial, that closes the gate from the time the store makes it. A
    /// call that the same key makes in between is decided by the limit
    /// alone, which has just denied it: it is all but sure to be denied
    /// too, and is never admitted beyond the limit.
    ///
    /// Boxed: a rule with a penalty is the rare one, and what the gate holds
    /// across its two store calls would otherwise make every decision's
    /// future that much larger, to be moved into a box with each request.
    fn gated<'a>(
        &'a self,
        ops: &'a [Op<'a>],
        owners: &'a [Owner<'a>],
        mode: Mode,
    ) -> Pin<Box<impl Future<Output = Result<Outcome, StoreError>> + 'a>> {
        Box::pin(self.gated_calls(ops, owners, mode))
    }

    /// [`Enforcer::gated`], unboxed.
    async fn gated_calls(
        &self,
        ops: &[Op<'_>],
        owners: &[Owner<'_>],
        mode: Mode,
    ) -> Result<Outcome, StoreError> {
        let mut all: Vec<Op<'_>> = ops.to_vec();
        let gates: SmallVec<[Option<(usize, &Penalty)>; 2]> = ops
            .iter()
            .zip(owners)
            .map(|(op, owner)| {
                owner.penalty.map(|p| {
                    all.push(Op::new(p.gate(), op.key, 0.0));
                    (all.len() - 1, p)
                })
            })
            .collect();
        let out = if mode.reserve {
            // A closed gate is a debt that a reservation would wait out,
            // admitting the call once the penalty ends, its tokens taken
            // meanwhile. So the gates are checked on their own first, and a
            // call that one of them shuts reserves nothing.
            let shut = self.store.transact(&all[ops.len()..], Mode::CHECK).await?;
            let mode = if shut.allowed { mode } else { Mode::CHECK };
            let mut out = self.store.transact(ops, mode).await?;
            out.decisions.extend(shut.decisions);
            out
        } else {
            self.store.transact(&all, mode).await?
        };
        let mut decisions: SmallVec<[Decision; 2]> =
            out.decisions.iter().take(ops.len()).copied().collect();
        for (i, gate) in gates.iter().enumerate() {
            let Some((g, penalty)) = *gate else { continue };
            let (d, shut) = (decisions[i], out.decisions[g]);
            if !shut.allowed {
                decisions[i] = penalized(d, shut.retry_after.unwrap_or(0.0));
            } else if !d.allowed && mode.consume {
                // Charged once however many denials land together, so that
                // the penalty runs from the first.
                match self
                    .store
                    .settle(penalty.gate(), ops[i].key, Settle::ChargeOnce(1.0))
                    .await
                {
                    Ok(closed) => {
                        decisions[i] = penalized(d, closed.reset);
                        metrics::counter!("sluice_penalties_total", "rule" => owners[i].name.to_owned())
                            .increment(1);
                    }
                    // The call is denied all the same; only its penalty
                    // could not be recorded.
                    Err(e) => self.store_failed(&e, [(owners[i].name, owners[i].on_error)]),
                }
            }
        }
        Ok(Outcome::from_decisions(decisions))
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

/// Whose operation one is: a rule's or a named limit's, with what decides
/// for it beside its limit.
#[derive(Clone, Copy)]
struct Owner<'p> {
    name: &'p str,
    on_error: OnStoreError,
    penalty: Option<&'p Penalty>,
}

impl<'p> Owner<'p> {
    fn of_rule(rule: &'p Rule) -> Owner<'p> {
        Owner {
            name: rule.name(),
            on_error: rule.on_store_error(),
            penalty: rule.penalty(),
        }
    }

    fn of_limit(named: &'p NamedLimit) -> Owner<'p> {
        Owner {
            name: named.name(),
            on_error: named.on_store_error(),
            penalty: named.penalty(),
        }
    }
}

/// A reservation's outcome for the rules that delay: held for the longest
/// wait among them when each rule's wait is within its `max` (what to give
/// back if it is abandoned goes into `verdict`), else refused by the rules
/// whose wait is too long, as a consuming transaction would have been,
/// with what the reservation took, to give back at once.
fn hold_or_refuse(
    mut outcome: Outcome,
    ops: &[Op<'_>],
    rules: &[&Rule],
    verdict: &mut Verdict,
) -> (Outcome, Vec<Reserved>) {
    let Some(wait) = outcome.retry_after().filter(|w| *w > 0.0) else {
        return (outcome, Vec::new());
    };
    let parts: Vec<Reserved> = ops
        .iter()
        .filter(|op| op.cost > 0.0)
        .map(|op| Reserved {
            limit: op.limit.clone(),
            key: op.key.to_owned(),
            cost: op.cost,
        })
        .collect();
    let mut too_long = false;
    for (d, rule) in outcome.decisions.iter_mut().zip(rules) {
        let max = rule.delay().map_or(0.0, |m| m.as_secs_f64());
        if d.retry_after.is_some_and(|w| w > max) {
            d.allowed = false;
            too_long = true;
        }
    }
    if !too_long {
        verdict.delay = Some(Duration::from_secs_f64(wait));
        verdict.reserved = parts;
        return (outcome, Vec::new());
    }
    (Outcome::from_decisions(outcome.decisions), parts)
}

/// `d` for a key serving a penalty that has `wait` seconds left: denied
/// outright, with nothing to spend, until then (or until `d`'s own wait, if
/// that is longer).
fn penalized(d: Decision, wait: f64) -> Decision {
    Decision {
        allowed: false,
        remaining: 0,
        retry_after: Some(d.retry_after.map_or(wait, |r| r.max(wait))),
        ..d
    }
}

/// A limit's quota window in seconds, as the `w` of `RateLimit-Policy`.
/// The window that a limit's quota is stated over, in seconds: the
/// `w` of the RateLimit-Policy header. A token bucket's is the time it
/// takes to refill from empty; a window's, its period. A concurrency
/// limit counts calls in flight over no window: 0.
///
/// ```
/// use sluice_core::{FixedWindow, Limit, Nanos, TokenBucket};
/// let tb = Limit::new("a", TokenBucket::new(10.0, 50.0).unwrap());
/// assert_eq!(sluice_engine::quota_window(&tb), 5.0);
/// let fw = Limit::new("b", FixedWindow::new(100.0, Nanos::from_secs_f64(60.0).unwrap()).unwrap());
/// assert_eq!(sluice_engine::quota_window(&fw), 60.0);
/// ```
pub fn quota_window(limit: &Limit) -> f64 {
    match limit.algorithm() {
        // The time to refill from empty; `rate` is per second.
        sluice_core::Algorithm::TokenBucket(tb) => tb.burst() / tb.rate(),
        // A fixed window's period, and the period a sliding one counts over.
        windowed => windowed
            .window()
            .map_or(0.0, sluice_core::Nanos::as_secs_f64),
    }
}

/// `t` in whole milliseconds since the Unix epoch (0 before it).
fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Why [`Enforcer::until_ready_named`] did not wait for a call.
#[derive(Debug)]
pub enum NotReady {
    /// The call would have had to wait this long, longer than allowed, or
    /// the limit refused it outright (beyond its `max_reserved`, or
    /// serving a penalty) and this is its `retry_after`. Nothing is spent.
    Wait(Duration),
    /// The store failed, and the limit fails closed; or the cost is one the
    /// limit can never admit.
    Store(StoreError),
}

impl std::fmt::Display for NotReady {
    /// What a caller is told.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_engine::NotReady;
    /// assert_eq!(NotReady::Wait(Duration::from_millis(1500)).to_string(), "not ready for 1.5 s");
    /// ```
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::Wait(w) => write!(f, "not ready for {} s", w.as_secs_f64()),
            NotReady::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for NotReady {}
