//! The decision behind every front end: a policy's rules applied to one
//! request against one store, with shadow rules, missing keys and store
//! failures handled the same way for the middleware, the proxy, the
//! decision API and Envoy.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use arc_swap::ArcSwap;
use metrics::{Counter, Histogram};
use sluice_core::{Decision, Mode, OnError, Op, Outcome, Store, StoreError};
use sluice_policy::{Mode as RuleMode, NamedLimit, OnStoreError, Policy, Request, Rule, RuleHit};

/// One enforced rule's part in a verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleDecision {
    /// The rule's name.
    pub rule: String,
    /// The request's key under the rule: who the decision is about.
    pub key: String,
    /// What the rule decided.
    pub decision: Decision,
    /// The rule's quota window in seconds: the fixed window's period, or the
    /// time a token bucket takes to refill from empty.
    pub window: f64,
}

/// Why a request was denied without the store having a say.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// A key part was missing under `on_missing: deny`.
    MissingKey,
    /// The request's cost can never be admitted by the rule.
    Cost(String),
    /// The store failed and a rule fails closed.
    StoreFailed(String),
}

/// What the policy says about one request.
///
/// ```
/// use sluice_http::Verdict;
/// let v = Verdict::default();
/// assert!(v.allowed && v.deciding().is_none() && v.retry_after.is_none());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Whether the request may proceed (shadow rules never stop it).
    pub allowed: bool,
    /// Every enforced rule that applied, in policy order.
    pub rules: Vec<RuleDecision>,
    /// Which of `rules` speaks for the verdict (see [`Outcome::deciding`]).
    pub deciding: Option<usize>,
    /// The wait before the request could pass: the largest among the rules.
    pub retry_after: Option<f64>,
    /// The rule that refused the request outright, and why.
    pub refusal: Option<(String, Refusal)>,
    /// Shadow rules that would have denied the request.
    pub shadow_denied: Vec<String>,
}

impl Default for Verdict {
    /// No rule applied: allowed.
    fn default() -> Self {
        Verdict {
            allowed: true,
            rules: Vec::new(),
            deciding: None,
            retry_after: None,
            refusal: None,
            shadow_denied: Vec::new(),
        }
    }
}

impl Verdict {
    /// The rule decision that speaks for the verdict.
    ///
    /// ```
    /// use sluice_http::Verdict;
    /// assert!(Verdict::default().deciding().is_none());
    /// ```
    pub fn deciding(&self) -> Option<&RuleDecision> {
        self.deciding.and_then(|i| self.rules.get(i))
    }

    /// The name of the rule that denied the request, if it was denied.
    ///
    /// ```
    /// use sluice_http::Verdict;
    /// assert_eq!(Verdict::default().denied_by(), None);
    /// ```
    pub fn denied_by(&self) -> Option<&str> {
        if self.allowed {
            return None;
        }
        match &self.refusal {
            Some((rule, _)) => Some(rule),
            None => self.deciding().map(|d| d.rule.as_str()),
        }
    }
}

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
/// use sluice_http::Enforcer;
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
/// assert!(rt.block_on(enforcer.check(&req)).allowed);
/// let second = rt.block_on(enforcer.check(&req));
/// assert_eq!(second.denied_by(), Some("per-ip"));
/// ```
pub struct Enforcer<S> {
    policy: ArcSwap<Policy>,
    store: S,
    meters: Meters,
}

/// The metric handles decisions record into, made on first use and then
/// kept: making a labelled handle costs an allocation and a registry lookup,
/// a large share of a decision on the memory store. So a metrics recorder
/// must be installed before the first decision, as it is at start-up.
#[derive(Default)]
struct Meters {
    /// `sluice_decisions_total` by rule: allowed and denied when enforced,
    /// then allowed and denied in shadow mode. Each is registered when first
    /// counted, since an exporter lists every registered series, at 0 too,
    /// and an enforced rule has no business in the shadow series.
    decisions: RwLock<HashMap<Box<str>, [OnceLock<Counter>; 4]>>,
    /// `sluice_store_seconds` of rules' transactions.
    transact: OnceLock<Histogram>,
    /// `sluice_store_seconds` of named limits' decisions.
    decide: OnceLock<Histogram>,
    /// Failed store calls, logged a line per interval.
    errors: crate::store_errors::StoreErrorLog,
}

/// The `sluice_decisions_total` series of `rule` at index `i` of
/// [`Meters::decisions`].
fn decision_counter(rule: &str, i: usize) -> Counter {
    let outcome = if i.is_multiple_of(2) {
        "allowed"
    } else {
        "denied"
    };
    let mode = if i < 2 { "enforce" } else { "shadow" };
    metrics::counter!("sluice_decisions_total", "rule" => rule.to_owned(), "outcome" => outcome, "mode" => mode)
}

impl Meters {
    fn count(&self, rule: &str, mode: RuleMode, allowed: bool) {
        let i = usize::from(!allowed) + 2 * usize::from(mode == RuleMode::Shadow);
        let bump = |counters: &[OnceLock<Counter>; 4]| {
            counters[i]
                .get_or_init(|| decision_counter(rule, i))
                .increment(1);
        };
        if let Ok(m) = self.decisions.read()
            && let Some(counters) = m.get(rule)
        {
            return bump(counters);
        }
        match self.decisions.write() {
            Ok(mut m) => bump(m.entry(rule.into()).or_default()),
            // Poisoned: count without keeping the handle.
            Err(_) => decision_counter(rule, i).increment(1),
        }
    }

    fn transact(&self) -> &Histogram {
        self.transact
            .get_or_init(|| metrics::histogram!("sluice_store_seconds", "op" => "transact"))
    }

    fn decide(&self) -> &Histogram {
        self.decide
            .get_or_init(|| metrics::histogram!("sluice_store_seconds", "op" => "decide"))
    }
}

impl<S: Store> Enforcer<S> {
    /// An enforcer of `policy` on `store`.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_http::Enforcer;
    /// # use sluice_policy::Policy;
    /// let e = Enforcer::new(Policy::default(), MemoryStore::new());
    /// assert!(e.policy().rules().is_empty());
    /// ```
    pub fn new(policy: Policy, store: S) -> Self {
        Enforcer {
            policy: ArcSwap::from_pointee(policy),
            store,
            meters: Meters::default(),
        }
    }

    /// The policy in force.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_http::Enforcer;
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
    /// # use sluice_http::Enforcer;
    /// # use sluice_policy::Policy;
    /// let e = Enforcer::new(Policy::default(), MemoryStore::new());
    /// e.replace(Policy::from_str("rules: [{name: r, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap());
    /// assert_eq!(e.policy().rules().len(), 1);
    /// ```
    pub fn replace(&self, policy: Policy) {
        self.policy.store(Arc::new(policy));
    }

    /// The store.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_http::Enforcer;
    /// # use sluice_policy::Policy;
    /// let e = Enforcer::new(Policy::default(), MemoryStore::new());
    /// assert!(e.store().is_empty());
    /// ```
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Decides a call of `cost` on `key` of the named limit `named` in
    /// `mode`, as the decision API does: timed like the rules' store calls,
    /// and counted in `sluice_decisions_total` under the limit's name, as
    /// enforced (the caller asked for this limit's answer and gets it,
    /// whatever the limit's `mode` in the policy).
    ///
    /// When the store fails, the limit's `on_store_error` decides: `open`
    /// allows (with nothing remaining, as no state was read), `closed`
    /// returns the error. Either way the failure is counted in
    /// `sluice_store_errors_total`. An impossible cost is always an error.
    ///
    /// ```
    /// # use sluice_core::{MemoryStore, Mode, Op};
    /// # use sluice_http::Enforcer;
    /// # use sluice_policy::Policy;
    /// let policy = Policy::from_str("limits: {send: {algorithm: token_bucket, algorithm_config: {rps: 1, burst: 1}}}", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::new());
    /// let policy = e.policy();
    /// let send = policy.named_limit("send").unwrap();
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let call = || e.decide_named(send, "alice", 1.0, Mode::CONSUME);
    /// assert!(rt.block_on(call()).unwrap().allowed);
    /// assert!(!rt.block_on(call()).unwrap().allowed);
    /// ```
    pub async fn decide_named(
        &self,
        named: &NamedLimit,
        key: &str,
        cost: f64,
        mode: Mode,
    ) -> Result<Decision, StoreError> {
        let op = Op::new(named.limit(), key, cost);
        let started = Instant::now();
        let result = self.store.decide(op, mode).await;
        self.meters.decide().record(started.elapsed().as_secs_f64());
        let decision = match result {
            Ok(d) => d,
            Err(StoreError::Cost(e)) => return Err(StoreError::Cost(e)),
            Err(e) => {
                self.store_failed(&e, [(named.name(), named.on_store_error())]);
                let on_error = match named.on_store_error() {
                    OnStoreError::Open => OnError::Open,
                    OnStoreError::Closed => return Err(e),
                };
                on_error.outcome(&[op]).decisions[0]
            }
        };
        self.meters
            .count(named.name(), RuleMode::Enforce, decision.allowed);
        Ok(decision)
    }

    /// Applies the policy's HTTP rules (those without a `domain`) to `req`,
    /// consuming from every rule that applies.
    pub async fn check<R: Request + ?Sized>(&self, req: &R) -> Verdict {
        let policy = self.policy();
        let hits: Vec<RuleHit<'_>> = policy.matching(req).collect();
        self.decide(&hits).await
    }

    /// Applies the rules that `hits` found: all enforced ones as one
    /// transaction, each shadow one on its own.
    ///
    /// ```
    /// # use sluice_core::MemoryStore;
    /// # use sluice_http::Enforcer;
    /// # use sluice_policy::{Policy, RequestParts};
    /// let policy = Policy::from_str("rules: [{name: r, domain: edge, limit_keys: ['descriptor:k'], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// let e = Enforcer::new(policy, MemoryStore::new());
    /// let d = RequestParts::default().with_descriptor("k", "v");
    /// let policy = e.policy();
    /// let hits: Vec<_> = policy.matching_domain("edge", &d).collect();
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// assert_eq!(rt.block_on(e.decide(&hits)).rules.len(), 1);
    /// ```
    pub async fn decide(&self, hits: &[RuleHit<'_>]) -> Verdict {
        let mut verdict = Verdict::default();
        let (enforce, shadow): (Vec<&RuleHit<'_>>, Vec<&RuleHit<'_>>) = hits
            .iter()
            .partition(|h| h.rule.mode() == RuleMode::Enforce);

        for hit in shadow {
            let allowed = if hit.missing {
                false
            } else {
                let op = Op::new(hit.rule.limit(), &hit.key, hit.cost);
                match self.transact(&[op], &[hit.rule]).await {
                    Ok(out) => out.allowed,
                    Err(_) => true,
                }
            };
            self.count(hit.rule, allowed);
            if !allowed {
                verdict.shadow_denied.push(hit.rule.name().to_owned());
            }
        }

        if let Some(hit) = enforce.iter().find(|h| h.missing) {
            verdict.allowed = false;
            verdict.refusal = Some((hit.rule.name().to_owned(), Refusal::MissingKey));
            self.count(hit.rule, false);
            return verdict;
        }
        if enforce.is_empty() {
            return verdict;
        }
        let ops: Vec<Op<'_>> = enforce
            .iter()
            .map(|h| Op::new(h.rule.limit(), &h.key, h.cost))
            .collect();
        let rules: Vec<&Rule> = enforce.iter().map(|h| h.rule).collect();
        let outcome = match self.transact(&ops, &rules).await {
            Ok(out) => out,
            Err(StoreError::Cost(e)) => {
                let at = ops.iter().position(|op| op.validate(false).is_err());
                let rule = at.map_or(rules[0], |i| rules[i]);
                verdict.allowed = false;
                verdict.refusal = Some((rule.name().to_owned(), Refusal::Cost(e.to_string())));
                return verdict;
            }
            Err(e) => {
                // One failed transaction fails every rule in it; a single
                // rule that fails closed is enough to deny.
                let closed = rules
                    .iter()
                    .find(|r| r.on_store_error() == OnStoreError::Closed);
                let on_error = if closed.is_some() {
                    OnError::Closed
                } else {
                    OnError::Open
                };
                if let Some(rule) = closed {
                    verdict.refusal =
                        Some((rule.name().to_owned(), Refusal::StoreFailed(e.to_string())));
                }
                on_error.outcome(&ops)
            }
        };
        for (hit, d) in enforce.iter().zip(&outcome.decisions) {
            self.count(hit.rule, d.allowed);
            verdict.rules.push(RuleDecision {
                rule: hit.rule.name().to_owned(),
                key: hit.key.clone(),
                decision: *d,
                window: window(hit.rule),
            });
        }
        verdict.allowed = outcome.allowed;
        verdict.deciding = outcome.deciding();
        verdict.retry_after = outcome.retry_after();
        verdict
    }

    fn count(&self, rule: &Rule, allowed: bool) {
        self.meters.count(rule.name(), rule.mode(), allowed);
    }

    /// One store call, timed and counted; failures are counted by how the
    /// rules in the call treat them.
    async fn transact(&self, ops: &[Op<'_>], rules: &[&Rule]) -> Result<Outcome, StoreError> {
        let started = Instant::now();
        let result = self.store.transact(ops, Mode::CONSUME).await;
        self.meters
            .transact()
            .record(started.elapsed().as_secs_f64());
        if let Err(e) = &result
            && !matches!(e, StoreError::Cost(_))
        {
            self.store_failed(e, rules.iter().map(|r| (r.name(), r.on_store_error())));
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
        let kind = match e {
            StoreError::Timeout => "timeout",
            _ => "unavailable",
        };
        for (name, on_error) in deciding {
            let fail = match on_error {
                OnStoreError::Open => "open",
                OnStoreError::Closed => "closed",
            };
            metrics::counter!("sluice_store_errors_total", "kind" => kind, "fail" => fail, "rule" => name.to_owned())
                .increment(1);
        }
        self.meters.errors.failed(e);
    }
}

/// The rule's quota window in seconds, as the `w` of `RateLimit-Policy`.
fn window(rule: &Rule) -> f64 {
    match rule.limit().algorithm() {
        // The time to refill from empty; `rate` is per second.
        sluice_core::Algorithm::TokenBucket(tb) => tb.burst() / tb.rate(),
        sluice_core::Algorithm::FixedWindow(fw) => fw.period().as_secs_f64(),
    }
}
