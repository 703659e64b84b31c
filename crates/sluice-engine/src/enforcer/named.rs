//! Calls on named limits (a policy's `limits`, inline limits and
//! overrides): decide, acquire, settle, reset, wait until ready.

use std::sync::Arc;
use std::time::Duration;

use quanta::Instant;
use sluice_core::{Decision, Mode, OnStoreError, Op, Settle, Store, StoreError};
use sluice_policy::{Enforcement, NamedLimit, Policy};

use super::Enforcer;
use super::penalties::Owner;
use crate::inline::{InlineError, check_name};
use crate::leases::HeldLease;
use crate::meters::StoreOp;
use crate::reservation::{Reservation, Reserved};
use crate::store_errors;
use crate::verdict::NamedDecision;

impl<S: Store + 'static> Enforcer<S> {
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

    /// Takes `count` slots of `key` on the concurrency limit `named` under a
    /// new lease, as `/v1/acquire` does: decided, timed and counted as
    /// [`Enforcer::decide_named`] decides a call, and returning the lease
    /// when admitted. Release it with [`Enforcer::release`] when the work
    /// ends; if it never is, its slots come back when it expires.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::{Enforcer, HeldLease};
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
    ) -> Result<(NamedDecision, Option<HeldLease>), StoreError> {
        let op = self.op(named.limit(), key, count);
        // Released if the store call ends without an answer (an error, a
        // missed deadline, a dropped future): it may have taken the lease.
        let mut pending = self.pending([&op]);
        let d = self.decide_op(named, op, Mode::CONSUME).await?;
        let mut leases = pending.disarm();
        Ok((d, leases.pop().filter(|_| d.decision.allowed)))
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
