//! The request path: a request's rules, decided as one transaction.

use std::time::Duration;

use quanta::Instant;
use sluice_core::{Decision, Mode, OnStoreError, Op, Outcome, Settle, Store, StoreError};
use sluice_policy::{Enforcement, Policy, Request, Rule, RuleHit};
use smallvec::SmallVec;

use super::Enforcer;
use super::penalties::Owner;
use crate::leases::HeldLease;
use crate::meters::StoreOp;
use crate::reservation::Reserved;
use crate::store_errors;
use crate::verdict::{Refusal, RuleDecision, ShadowDecision, Verdict};
use crate::verified::Verified;

/// The rule hits of one request that [`Enforcer::enforce_hits`] applies in one way.
type Hits<'h, 'r> = SmallVec<[&'h RuleHit<'r>; 2]>;

impl<S: Store + 'static> Enforcer<S> {
    /// Applies the policy in force to `req`: its HTTP rules (those
    /// without a `domain`), consuming from every enforced rule that applies
    /// when all of them admit it. Rules see JWT claims only from a token
    /// that the policy's keys verify (see [`Verified`]). The common call; a
    /// caller that viewed `req` through a snapshot of the policy (its
    /// trusted proxies) decides with that one: [`Enforcer::enforce_with`].
    ///
    /// A rule with `on_limit: {delay}` refuses here as if it had none: the
    /// caller cannot hold the request (see [`Enforcer::enforce_shaped`]).
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_engine::Enforcer;
    /// # use sluice_policy::{Policy, RequestParts};
    /// let policy = Policy::from_str("rules: [{name: r, limit_keys: [ip:address], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::new());
    /// let req = RequestParts::new("GET", "/").with_ip([192, 0, 2, 1].into());
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// assert!(rt.block_on(e.enforce(&req)).allowed);
    /// assert_eq!(rt.block_on(e.enforce(&req)).denied_by(), Some("r"));
    /// ```
    pub async fn enforce<R: Request + ?Sized>(&self, req: &R) -> Verdict {
        let policy = self.policy();
        self.enforce_with(&policy, req).await
    }

    /// [`Enforcer::enforce`] under `policy`, the snapshot `req` was viewed
    /// through (its trusted proxies), so that a reload in between cannot
    /// mix two policies in one decision.
    pub async fn enforce_with<R: Request + ?Sized>(&self, policy: &Policy, req: &R) -> Verdict {
        let req = Verified::new(req, policy);
        let hits: SmallVec<[RuleHit<'_>; 2]> = policy.matching(&req).collect();
        self.enforce_in(&hits, false).await
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
    /// let delays: Vec<_> = (0..4).map(|_| {
    ///     let v = rt.block_on(e.enforce_shaped(&req));
    ///     v.allowed.then_some(v.delay)
    /// }).collect();
    /// let ms = Duration::from_millis;
    /// assert_eq!(delays, [Some(None), Some(Some(ms(100))), Some(Some(ms(200))), None]);
    /// ```
    pub async fn enforce_shaped<R: Request + ?Sized>(&self, req: &R) -> Verdict {
        let policy = self.policy();
        self.enforce_shaped_with(&policy, req).await
    }

    /// [`Enforcer::enforce_shaped`] under `policy`, the snapshot `req` was
    /// viewed through, as [`Enforcer::enforce_with`] is for
    /// [`Enforcer::enforce`].
    pub async fn enforce_shaped_with<R: Request + ?Sized>(
        &self,
        policy: &Policy,
        req: &R,
    ) -> Verdict {
        let req = Verified::new(req, policy);
        let hits: SmallVec<[RuleHit<'_>; 2]> = policy.matching(&req).collect();
        self.enforce_in(&hits, true).await
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
    /// assert_eq!(rt.block_on(e.enforce_hits(&hits)).rules.len(), 1);
    /// ```
    // Not an `async fn`: one that only awaits another holds that one's
    // future and more, and a decision's future is moved into a box with
    // each request.
    pub fn enforce_hits<'a>(
        &'a self,
        hits: &'a [RuleHit<'a>],
    ) -> impl Future<Output = Verdict> + Send + 'a {
        self.enforce_in(hits, false)
    }

    /// [`Enforcer::enforce_hits`], for a caller that can hold a request, as
    /// [`Enforcer::enforce_shaped`] is for [`Enforcer::enforce`].
    pub fn enforce_hits_shaped<'a>(
        &'a self,
        hits: &'a [RuleHit<'a>],
    ) -> impl Future<Output = Verdict> + Send + 'a {
        self.enforce_in(hits, true)
    }

    /// [`Enforcer::enforce_hits`], reserving for rules that delay when `shaped`
    /// (see [`Enforcer::enforce_shaped`]).
    async fn enforce_in(&self, hits: &[RuleHit<'_>], shaped: bool) -> Verdict {
        let (verdict, give_back) = self.verdict_of(hits, shaped).await;
        if let Some((parts, on_error)) = give_back {
            // Boxed, as `gated` is: only a request refused for waiting too
            // long gets here.
            Box::pin(self.refund(&parts, on_error)).await;
        }
        verdict
    }

    /// [`Enforcer::enforce_in`] but for giving back the reservation of a
    /// request refused for waiting too long, which it returns: awaited here,
    /// with all that a decision holds still alive, a refund would enlarge
    /// every decision's future by a third.
    async fn verdict_of(
        &self,
        hits: &[RuleHit<'_>],
        shaped: bool,
    ) -> (Verdict, Option<(Vec<Reserved>, OnStoreError)>) {
        let mut verdict = Verdict::default();
        // Requests meet a rule or two: these lists stay off the heap.
        let (enforce, shadow): (Hits<'_, '_>, Hits<'_, '_>) = hits
            .iter()
            .partition(|h| h.rule.enforcement() == Enforcement::Enforce);

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
                window: hit.limit().algorithm().quota_window(),
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
    async fn shadow(&self, hit: &RuleHit<'_>, leases: &mut Vec<HeldLease>) -> bool {
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
            .count(hit.rule.name(), hit.rule.enforcement(), allowed, &hit.key);
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
