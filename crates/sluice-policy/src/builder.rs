//! A policy built in code rather than read from a file. The builders write
//! the same document a policy file holds and compile it the same way, so a
//! policy built in code is validated exactly as a file is.

use std::time::Duration;

use serde_json::{Map, Value, json};
use sluice_core::OnStoreError;

use crate::condition::Condition;
use crate::error::PolicyError;
use crate::identity::client_ip::ForwardingHeader;
use crate::keys::LimitKey;
use crate::policy::{Policy, Rule};
use crate::settings::{Enforcement, OnMissing};

/// What a built policy's errors name as their file.
const BUILT: &str = "Policy::builder()";

/// A policy under construction: see [`Policy::builder`].
#[derive(Debug, Clone, Default)]
pub struct PolicyBuilder {
    rules: Vec<RuleBuilder>,
    top: Map<String, Value>,
}

/// A request rule under construction: see [`Rule::builder`].
#[derive(Debug, Clone)]
pub struct RuleBuilder {
    name: String,
    doc: Map<String, Value>,
    keys: Vec<Value>,
    /// In the order given, as a file lists them.
    conditions: Vec<(String, String)>,
    config: Map<String, Value>,
}

impl Policy {
    /// A policy built in code: rules, trusted proxies and the store-error
    /// default, checked by [`PolicyBuilder::build`] as a file would be.
    ///
    /// ```
    /// use sluice_policy::{Condition, LimitKey, Policy, RequestParts, Rule};
    /// let policy = Policy::builder()
    ///     .rule(Rule::builder("per-ip").key(LimitKey::IpAddress).token_bucket(20.0, 50.0))
    ///     .rule(
    ///         Rule::builder("per-api-key")
    ///             .key(LimitKey::Header("x-api-key".into()))
    ///             .when(Condition::PathPrefix("/api/".into()))
    ///             .token_bucket(5.0, 10.0),
    ///     )
    ///     .build()
    ///     .unwrap();
    /// let req = RequestParts::new("GET", "/api/items")
    ///     .with_ip([192, 0, 2, 1].into())
    ///     .with_header("x-api-key", "k1");
    /// let hits: Vec<_> = policy.matching(&req).map(|h| h.rule.name()).collect();
    /// assert_eq!(hits, ["per-ip", "per-api-key"]);
    /// ```
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder::default()
    }
}

impl PolicyBuilder {
    /// Adds a request rule; rules apply in the order they are added.
    #[must_use]
    pub fn rule(mut self, rule: RuleBuilder) -> Self {
        self.rules.push(rule);
        self
    }

    /// Reads the client address from `header` when the socket peer is in
    /// one of `cidrs` (`trusted_proxies`).
    ///
    /// ```
    /// use sluice_policy::{ForwardingHeader, Policy};
    /// let p = Policy::builder().trusted_proxies(["10.0.0.0/8"], ForwardingHeader::XForwardedFor).build().unwrap();
    /// assert!(p.trusted_proxies().contains([10, 1, 2, 3].into()));
    /// let bad = Policy::builder().trusted_proxies(["10.0.0.0/33"], ForwardingHeader::Forwarded).build();
    /// assert!(bad.unwrap_err().to_string().starts_with("Policy::builder(): trusted_proxies: "));
    /// ```
    #[must_use]
    pub fn trusted_proxies<'a>(
        mut self,
        cidrs: impl IntoIterator<Item = &'a str>,
        header: ForwardingHeader,
    ) -> Self {
        let header = match header {
            ForwardingHeader::Forwarded => "forwarded",
            ForwardingHeader::XForwardedFor => "x-forwarded-for",
        };
        let cidrs: Vec<&str> = cidrs.into_iter().collect();
        self.top.insert(
            "trusted_proxies".into(),
            json!({"cidrs": cidrs, "header": header}),
        );
        self
    }

    /// What every rule does when the store fails, unless it says otherwise.
    #[must_use]
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.top
            .insert("on_store_error".into(), on_store_error(on_error));
        self
    }

    /// How many leading bits of an IPv6 client's address `ip:address` keys
    /// on (`ipv6_prefix`; 64 when not set, 128 for every address alone).
    ///
    /// ```
    /// use sluice_policy::{LimitKey, Policy, RequestParts, Rule};
    /// let p = Policy::builder()
    ///     .ipv6_prefix(56)
    ///     .rule(Rule::builder("per-ip").key(LimitKey::IpAddress).token_bucket(1.0, 1.0))
    ///     .build()
    ///     .unwrap();
    /// let req = RequestParts::new("GET", "/").with_ip("2001:db8:0:12ff::1".parse().unwrap());
    /// assert_eq!(p.rules()[0].key(&req).as_deref(), Some("20:2001:db8:0:1200::/56"));
    /// ```
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.top.insert("ipv6_prefix".into(), Value::from(bits));
        self
    }

    /// The policy, validated as a policy file is. An error names the rule
    /// (or the top-level setting) at fault.
    ///
    /// ```
    /// use sluice_policy::{LimitKey, Policy, Rule};
    /// let err = Policy::builder()
    ///     .rule(Rule::builder("tiny").key(LimitKey::IpAddress).token_bucket(1.0, 0.5))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "Policy::builder(): rule \"tiny\": `burst` 0.5 is less than the rule's fixed_cost 1: no request could ever pass"
    /// );
    /// ```
    pub fn build(self) -> Result<Policy, PolicyError> {
        // One line per rule and per setting, so that an error's line says
        // whose it is: rule i on line 2 + i, setting k on line 3 + n + k.
        let n = self.rules.len();
        let mut lines = vec!["{\"rules\": [".to_owned()];
        for (i, rule) in self.rules.iter().enumerate() {
            let comma = if i + 1 < n { "," } else { "" };
            lines.push(format!("{}{comma}", rule.document()));
        }
        lines.push("]".to_owned());
        for (name, value) in &self.top {
            lines.push(format!(", {}: {value}", Value::from(name.as_str())));
        }
        lines.push("}".to_owned());
        let text = lines.join("\n");
        Policy::from_str(&text, BUILT).map_err(|e| {
            let whose = if let Some(rule) = e.line.checked_sub(2).and_then(|i| self.rules.get(i)) {
                format!("rule {:?}", rule.name)
            } else {
                self.top
                    .keys()
                    .nth(e.line.saturating_sub(3 + n))
                    .cloned()
                    .unwrap_or_else(|| "policy".to_owned())
            };
            PolicyError {
                line: 0,
                column: 0,
                message: format!("{whose}: {}", e.message),
                ..e
            }
        })
    }
}

impl Rule {
    /// A request rule named `name`, to add with [`PolicyBuilder::rule`]. It
    /// needs a limit ([`RuleBuilder::token_bucket`],
    /// [`RuleBuilder::fixed_window`], [`RuleBuilder::sliding_window`] or
    /// [`RuleBuilder::sliding_log`]); without a key part every request
    /// shares one bucket.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_policy::{Enforcement, LimitKey, OnMissing, Policy, Rule};
    /// let p = Policy::builder()
    ///     .rule(
    ///         Rule::builder("per-tenant")
    ///             .key(LimitKey::Header("x-tenant".into()))
    ///             .fixed_window(1000.0, Duration::from_secs(60))
    ///             .on_missing(OnMissing::Deny)
    ///             .enforcement(Enforcement::Shadow),
    ///     )
    ///     .build()
    ///     .unwrap();
    /// let rule = &p.rules()[0];
    /// assert_eq!((rule.enforcement(), rule.on_missing()), (Enforcement::Shadow, OnMissing::Deny));
    /// assert_eq!(rule.limit().algorithm().capacity(), 1000.0);
    /// ```
    pub fn builder(name: impl Into<String>) -> RuleBuilder {
        RuleBuilder {
            name: name.into(),
            doc: Map::new(),
            keys: Vec::new(),
            conditions: Vec::new(),
            config: Map::new(),
        }
    }
}

impl RuleBuilder {
    /// Adds a part of the rule's key; a request's key under the rule is
    /// made of every part, in order.
    #[must_use]
    pub fn key(mut self, key: LimitKey) -> Self {
        self.keys.push(Value::from(key.to_string()));
        self
    }

    /// Adds a condition a request must meet for the rule to apply.
    #[must_use]
    pub fn when(mut self, condition: Condition) -> Self {
        let (key, value) = condition.entry();
        self.conditions.push((key, value.to_owned()));
        self
    }

    /// A token bucket: `rps` tokens a second, holding at most `burst`.
    #[must_use]
    pub fn token_bucket(self, rps: f64, burst: f64) -> Self {
        self.algorithm("token_bucket", [("rps", rps), ("burst", burst)])
    }

    /// A fixed window: `limit` per `period`, counted from the epoch.
    #[must_use]
    pub fn fixed_window(self, limit: f64, period: Duration) -> Self {
        self.per_period("fixed_window", limit, period)
    }

    /// A sliding window: `limit` per `period`, estimated from the counts of
    /// the current and the previous fixed window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_core::{Algorithm, Nanos, SlidingWindow};
    /// use sluice_policy::{Policy, Rule};
    /// let rule = Rule::builder("r").sliding_window(50.0, Duration::from_secs(60));
    /// let p = Policy::builder().rule(rule).build().unwrap();
    /// let want = SlidingWindow::per_period(50.0, Nanos(60 * Nanos::PER_SEC)).unwrap();
    /// assert_eq!(p.rules()[0].limit().algorithm(), &Algorithm::from(want));
    /// ```
    #[must_use]
    pub fn sliding_window(self, limit: f64, period: Duration) -> Self {
        self.per_period("sliding_window", limit, period)
    }

    /// A sliding log: exactly `limit` per any `period`, every admission
    /// logged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_policy::{Policy, Rule};
    /// let rule = Rule::builder("r").sliding_log(5.0, Duration::from_secs(1));
    /// let p = Policy::builder().rule(rule).build().unwrap();
    /// assert_eq!(p.rules()[0].limit().algorithm().name(), "sliding_log");
    /// ```
    #[must_use]
    pub fn sliding_log(self, limit: f64, period: Duration) -> Self {
        self.per_period("sliding_log", limit, period)
    }

    /// Splits each key into `shards` hot-key shards, for keys hotter than
    /// one lock can take.
    #[must_use]
    pub fn shards(mut self, shards: u32) -> Self {
        self.config.insert("shards".into(), Value::from(shards));
        self
    }

    /// Puts the rule in `group`: of a group's rules, only the first whose
    /// conditions hold applies to a request (tiers).
    #[must_use]
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.doc.insert("group".into(), Value::from(group.into()));
        self
    }

    /// Whether the rule denies or only reports (`mode`).
    #[must_use]
    pub fn enforcement(mut self, enforcement: Enforcement) -> Self {
        self.doc
            .insert("mode".into(), Value::from(enforcement.as_str()));
        self
    }

    /// What the rule does with a request that lacks a key part.
    #[must_use]
    pub fn on_missing(mut self, on_missing: OnMissing) -> Self {
        let on_missing = match on_missing {
            OnMissing::Skip => "skip",
            OnMissing::Shared => "shared",
            OnMissing::Deny => "deny",
        };
        self.doc
            .insert("on_missing".into(), Value::from(on_missing));
        self
    }

    /// What the rule does when the store fails.
    #[must_use]
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.doc
            .insert("on_store_error".into(), on_store_error(on_error));
        self
    }

    /// Denies a key the rule has denied outright for `penalty` (see
    /// [`Penalty`](crate::Penalty)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_core::Nanos;
    /// use sluice_policy::{Policy, Rule};
    /// let rule = Rule::builder("login").token_bucket(1.0, 5.0).penalty(Duration::from_secs(600));
    /// let p = Policy::builder().rule(rule).build().unwrap();
    /// assert_eq!(p.rules()[0].penalty().unwrap().duration(), Nanos(600 * Nanos::PER_SEC));
    /// ```
    #[must_use]
    pub fn penalty(mut self, penalty: Duration) -> Self {
        self.doc
            .insert("penalty".into(), Value::from(penalty.as_secs_f64()));
        self
    }

    /// Lets a reservation take a key up to `max_reserved` tokens below
    /// zero (`algorithm_config.max_reserved`): how many requests a key may
    /// have held at once under [`RuleBuilder::delay`].
    #[must_use]
    pub fn max_reserved(mut self, max_reserved: f64) -> Self {
        self.config
            .insert("max_reserved".into(), Value::from(max_reserved));
        self
    }

    /// Holds a request over the limit for up to `max` rather than refusing
    /// it (`on_limit: {delay: {max}}`; see [`Rule::delay`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_policy::{Policy, Rule};
    /// let rule = Rule::builder("shaped").token_bucket(10.0, 1.0).max_reserved(5.0).delay(Duration::from_millis(500));
    /// let p = Policy::builder().rule(rule).build().unwrap();
    /// assert_eq!(p.rules()[0].delay(), Some(Duration::from_millis(500)));
    /// ```
    #[must_use]
    pub fn delay(mut self, max: Duration) -> Self {
        self.doc.insert(
            "on_limit".into(),
            json!({"delay": {"max": max.as_secs_f64()}}),
        );
        self
    }

    /// A windowed algorithm of `limit` per `period`.
    fn per_period(self, name: &str, limit: f64, period: Duration) -> Self {
        self.algorithm(name, [("rate", limit), ("period", period.as_secs_f64())])
    }

    fn algorithm<const N: usize>(mut self, name: &str, settings: [(&str, f64); N]) -> Self {
        self.doc.insert("algorithm".into(), Value::from(name));
        for (k, v) in settings {
            self.config.insert(k.into(), Value::from(v));
        }
        self
    }

    /// The rule as a policy file writes it, on one line.
    fn document(&self) -> String {
        let mut doc = self.doc.clone();
        doc.insert("name".into(), Value::from(self.name.as_str()));
        doc.insert("limit_keys".into(), Value::Array(self.keys.clone()));
        if !self.config.is_empty() {
            doc.insert(
                "algorithm_config".into(),
                Value::Object(self.config.clone()),
            );
        }
        let mut text = Value::Object(doc).to_string();
        if !self.conditions.is_empty() {
            // Written by hand to keep their order (a JSON map sorts its keys).
            let entries: Vec<String> = self
                .conditions
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), Value::from(v.as_str())))
                .collect();
            text.pop();
            text.push_str(&format!(", \"match\": {{{}}}}}", entries.join(", ")));
        }
        text
    }
}

pub(crate) fn on_store_error(on_error: OnStoreError) -> Value {
    Value::from(match on_error {
        OnStoreError::Open => "open",
        OnStoreError::Closed => "closed",
    })
}
