//! What the engine says about one request: the verdict and its parts.

use std::time::Duration;

use sluice_core::{Decision, OnStoreError};

use crate::leases::HeldLease;
use crate::reservation::Reserved;

/// A named limit's answer to one call.
///
/// ```
/// use sluice_core::{Decision, OnStoreError};
/// use sluice_engine::NamedDecision;
/// let admitted_blind = NamedDecision {
///     decision: Decision { allowed: true, capacity: 10.0, remaining: 0, retry_after: None, reset: 0.0 },
///     without_store: Some(OnStoreError::Open),
/// };
/// assert!(admitted_blind.decision.allowed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NamedDecision {
    /// What the limit decided.
    pub decision: Decision,
    /// `Some(Open)` when the store failed and the limit, failing open,
    /// admitted the call without it (with nothing remaining, as no state
    /// was read). A limit that fails closed answers with the store's error
    /// instead, so this is never `Some(Closed)`.
    pub without_store: Option<OnStoreError>,
}

/// One enforced rule's part in a verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleDecision {
    /// The rule's name.
    pub rule: String,
    /// The request's key under the rule: who the decision is about.
    pub key: String,
    /// What the request cost under the rule.
    pub cost: f64,
    /// What the rule decided.
    pub decision: Decision,
    /// The rule's quota window in seconds: the fixed window's period, or the
    /// time a token bucket takes to refill from empty. None (0) for a
    /// concurrency rule.
    pub window: f64,
    /// Whether the rule counts requests in flight (`algorithm:
    /// concurrency`): its quota is of concurrent requests, over no window.
    pub in_flight: bool,
}

/// What a shadow rule would have decided, had it been enforced on its own.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowDecision {
    /// The rule's name.
    pub rule: String,
    /// The request's key under the rule; empty when a key part was missing.
    pub key: String,
    /// What the request cost under the rule.
    pub cost: f64,
    /// Whether the rule would have let the request through. A missing key
    /// part under `on_missing: deny` and a cost the rule can never admit
    /// would deny; a failed store call answers as the rule's
    /// `on_store_error` says.
    pub allowed: bool,
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

impl std::fmt::Display for Refusal {
    /// The reason, as a client or a replay line is told it.
    ///
    /// ```
    /// use sluice_engine::Refusal;
    /// assert_eq!(Refusal::MissingKey.to_string(), "a part of the rule's key is missing");
    /// assert_eq!(Refusal::StoreFailed("timed out".into()).to_string(), "timed out");
    /// ```
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::MissingKey => f.write_str("a part of the rule's key is missing"),
            Refusal::Cost(why) | Refusal::StoreFailed(why) => f.write_str(why),
        }
    }
}

/// What the policy says about one request.
///
/// ```
/// use sluice_engine::Verdict;
/// let v = Verdict::default();
/// assert!(v.allowed && v.deciding().is_none() && v.retry_after.is_none());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Whether the request may proceed (shadow rules never stop it).
    pub allowed: bool,
    /// Every enforced rule that applied, in policy order.
    pub rules: Vec<RuleDecision>,
    /// Which of `rules` speaks for the verdict (see
    /// [`Outcome::deciding`](sluice_core::Outcome::deciding)).
    pub deciding: Option<usize>,
    /// The wait before the request could pass: the largest among the rules.
    pub retry_after: Option<f64>,
    /// The rule that refused the request outright, and why.
    pub refusal: Option<(String, Refusal)>,
    /// Every shadow rule that applied, in policy order.
    pub shadow: Vec<ShadowDecision>,
    /// The leases the request took on concurrency limits (enforced rules'
    /// when it was admitted, and shadow rules' that would have admitted
    /// it): give them back when its work ends, with
    /// [`Enforcer::hold`](crate::Enforcer::hold).
    pub leases: Vec<HeldLease>,
    /// How the enforced rules decided without the store, when its call
    /// failed: `Open` when they admitted the request all the same, `Closed`
    /// when one of them, failing closed, denied it. `None` when the store
    /// decided, or no store call was made.
    pub without_store: Option<OnStoreError>,
    /// How long to hold the admitted request before it goes on: its rules
    /// all delay (`on_limit: {delay}`), and it reserved tokens that are due
    /// this long from now. `None` for a request that may go on at once.
    /// Only [`Enforcer::enforce_shaped`](crate::Enforcer::enforce_shaped)
    /// and [`Enforcer::enforce_hits_shaped`](crate::Enforcer::enforce_hits_shaped) set
    /// it.
    pub delay: Option<Duration>,
    /// What the held request reserved: take it into a
    /// [`Reservation`](crate::Reservation) with
    /// [`Enforcer::reservation`](crate::Enforcer::reservation), which gives
    /// it back if the request is abandoned before it is due.
    pub reserved: Vec<Reserved>,
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
            shadow: Vec::new(),
            leases: Vec::new(),
            without_store: None,
            delay: None,
            reserved: Vec::new(),
        }
    }
}

impl Verdict {
    /// The rule decision that speaks for the verdict.
    ///
    /// ```
    /// use sluice_engine::Verdict;
    /// assert!(Verdict::default().deciding().is_none());
    /// ```
    pub fn deciding(&self) -> Option<&RuleDecision> {
        self.deciding.and_then(|i| self.rules.get(i))
    }

    /// The name of the rule that denied the request, if it was denied.
    ///
    /// ```
    /// use sluice_engine::Verdict;
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

    /// The shadow rules that would have denied the request, in policy order.
    ///
    /// ```
    /// use sluice_engine::{ShadowDecision, Verdict};
    /// let shadow = |rule: &str, allowed| ShadowDecision { rule: rule.into(), key: "k".into(), cost: 1.0, allowed };
    /// let v = Verdict { shadow: vec![shadow("a", true), shadow("b", false)], ..Verdict::default() };
    /// assert_eq!(v.shadow_denied().collect::<Vec<_>>(), ["b"]);
    /// ```
    pub fn shadow_denied(&self) -> impl Iterator<Item = &str> {
        self.shadow
            .iter()
            .filter(|s| !s.allowed)
            .map(|s| s.rule.as_str())
    }

    /// Whether any rule, enforced or shadow, applied to the request.
    ///
    /// ```
    /// use sluice_engine::Verdict;
    /// assert!(!Verdict::default().matched());
    /// ```
    pub fn matched(&self) -> bool {
        !(self.rules.is_empty() && self.shadow.is_empty() && self.refusal.is_none())
    }
}
