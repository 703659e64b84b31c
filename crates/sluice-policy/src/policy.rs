//! The compiled policy: validated named limits and request rules, ready to
//! hand to a store, and the entry points that load a policy file.

use std::collections::HashMap;
use std::time::Duration;

use sluice_core::{Limit, OnStoreError};

use crate::condition::Condition;
use crate::error::PolicyWarning;
use crate::identity::client_ip::TrustedProxies;
use crate::identity::jwt::JwtVerifier;
use crate::keys::{Cost, DEFAULT_IPV6_PREFIX, LimitKey, push_missing};
use crate::penalty::Penalty;
use crate::request::Request;
use crate::settings::{Enforcement, OnMissing};

/// Where limit state lives (`store` in the policy file).
///
/// ```
/// use sluice_policy::{Policy, StoreConfig};
/// let p = Policy::from_str("store: {kind: memory, max_keys: 100000}", "p.yaml").unwrap();
/// assert_eq!(p.store(), &StoreConfig::Memory { max_keys: Some(100_000) });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreConfig {
    /// The in-process store.
    Memory {
        /// The most keys kept before evicting; `None` leaves it to the store.
        max_keys: Option<usize>,
    },
    /// A Redis server or cluster.
    Redis {
        /// `redis://` or `rediss://` URL.
        url: String,
        /// Per-call timeout; `None` leaves it to the store.
        timeout: Option<Duration>,
    },
    /// A PostgreSQL database.
    Postgres {
        /// `postgres://` or `postgresql://` URL.
        url: String,
        /// Per-call timeout; `None` leaves it to the store.
        timeout: Option<Duration>,
        /// The schema of the store's tables; `None` leaves it to the store
        /// (`sluice`).
        schema: Option<String>,
        /// Whether the keys' table survives a crash of the database
        /// (`true` by default); `false` makes it unlogged.
        durable: bool,
    },
}

impl Default for StoreConfig {
    /// The in-memory store with its default key cap.
    fn default() -> Self {
        StoreConfig::Memory { max_keys: None }
    }
}

/// An entry of `limits`: a limit that applications call by name.
///
/// ```
/// use sluice_policy::{Enforcement, Policy};
/// let p = Policy::from_str(
///     "limits:\n  sendMessage:\n    algorithm: token_bucket\n    \
///      algorithm_config: {rate: 10, period: 60, burst: 20}\n",
///     "p.yaml",
/// ).unwrap();
/// let named = &p.named_limits()[0];
/// assert_eq!((named.name(), named.enforcement()), ("sendMessage", Enforcement::Enforce));
/// assert_eq!(named.limit().algorithm().capacity(), 20.0);
/// ```
#[derive(Debug, Clone)]
pub struct NamedLimit {
    pub(crate) limit: Limit,
    pub(crate) enforcement: Enforcement,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) penalty: Option<Penalty>,
}

impl NamedLimit {
    /// The limit's name, also its namespace in the store.
    ///
    /// ```
    /// # use sluice_policy::Policy;
    /// # let p = Policy::from_str("limits: {a: {algorithm: token_bucket, algorithm_config: {rps: 1}}}", "p").unwrap();
    /// assert_eq!(p.named_limits()[0].name(), "a");
    /// ```
    pub fn name(&self) -> &str {
        self.limit.name()
    }

    /// The configured limit, shards applied.
    ///
    /// ```
    /// # use sluice_policy::Policy;
    /// # let p = Policy::from_str("limits: {a: {algorithm: token_bucket, algorithm_config: {rps: 4, shards: 2}}}", "p").unwrap();
    /// assert_eq!(p.named_limits()[0].limit().shards(), 2);
    /// ```
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// Whether calls are enforced or only reported.
    ///
    /// ```
    /// # use sluice_policy::{Enforcement, Policy};
    /// # let p = Policy::from_str("limits: {a: {algorithm: token_bucket, algorithm_config: {rps: 1}, mode: shadow}}", "p").unwrap();
    /// assert_eq!(p.named_limits()[0].enforcement(), Enforcement::Shadow);
    /// ```
    pub fn enforcement(&self) -> Enforcement {
        self.enforcement
    }

    /// What a call gets when the store fails: the limit's own
    /// `on_store_error`, else the policy's.
    ///
    /// ```
    /// # use sluice_policy::{OnStoreError, Policy};
    /// # let p = Policy::from_str("on_store_error: closed\nlimits: {a: {algorithm: token_bucket, algorithm_config: {rps: 1, max_reserved: 1}, on_store_error: open}, b: {algorithm: token_bucket, algorithm_config: {rps: 1, max_reserved: 1}}}", "p").unwrap();
    /// assert_eq!(p.named_limits()[0].on_store_error(), OnStoreError::Open);
    /// assert_eq!(p.named_limits()[1].on_store_error(), OnStoreError::Closed);
    /// ```
    pub fn on_store_error(&self) -> OnStoreError {
        self.on_store_error
    }

    /// How long a key this limit denies stays denied, if it says.
    ///
    /// ```
    /// # use sluice_core::Nanos;
    /// # use sluice_policy::Policy;
    /// # let p = Policy::from_str("limits: {login: {algorithm: token_bucket, algorithm_config: {rate: 5, period: 1m}, penalty: 10m}}", "p").unwrap();
    /// assert_eq!(p.named_limits()[0].penalty().unwrap().duration(), Nanos(600 * Nanos::PER_SEC));
    /// ```
    pub fn penalty(&self) -> Option<&Penalty> {
        self.penalty.as_ref()
    }
}

/// A request rule: conditions, key parts, a limit and a cost.
///
/// ```
/// use sluice_policy::{LimitKey, Enforcement, OnStoreError, Policy};
/// let p = Policy::from_str(r#"
/// on_store_error: closed
/// rules:
///   - name: per-ip
///     limit_keys: [ip:address]
///     match: {path_prefix: /api/}
///     algorithm: token_bucket
///     algorithm_config: {rps: 10, burst: 20}
///     mode: shadow
/// "#, "p.yaml").unwrap();
/// let rule = &p.rules()[0];
/// assert_eq!(rule.name(), "per-ip");
/// assert_eq!(rule.limit().name(), "per-ip");
/// assert_eq!(rule.limit_keys(), &[LimitKey::IpAddress]);
/// assert_eq!((rule.enforcement(), rule.on_store_error()), (Enforcement::Shadow, OnStoreError::Closed));
/// ```
#[derive(Debug, Clone)]
pub struct Rule {
    pub(crate) limit: Limit,
    pub(crate) keys: Vec<LimitKey>,
    pub(crate) conditions: Vec<Condition>,
    pub(crate) cost: Cost,
    pub(crate) enforcement: Enforcement,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) on_missing: OnMissing,
    /// The policy's `ipv6_prefix`: how `ip:address` groups IPv6 clients.
    pub(crate) ipv6_prefix: u8,
    pub(crate) domain: Option<String>,
    pub(crate) group: Option<String>,
    pub(crate) penalty: Option<Penalty>,
    /// `on_limit: {delay: {max}}`: the longest the rule holds a request.
    pub(crate) delay: Option<Duration>,
}

impl Rule {
    /// The rule's name, also its limit's name.
    ///
    /// ```
    /// # use sluice_policy::Policy;
    /// # let p = Policy::from_str("rules: [{name: r, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// assert_eq!(p.rules()[0].name(), "r");
    /// ```
    pub fn name(&self) -> &str {
        self.limit.name()
    }

    /// The rule's limit, named after the rule, shards applied.
    ///
    /// ```
    /// # use sluice_policy::Policy;
    /// # let p = Policy::from_str("rules: [{name: r, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 2}}]", "p").unwrap();
    /// assert_eq!(p.rules()[0].limit().algorithm().capacity(), 2.0);
    /// ```
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// The key parts, in order; empty means one bucket shared by all requests.
    ///
    /// ```
    /// # use sluice_policy::Policy;
    /// # let p = Policy::from_str("rules: [{name: r, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// assert!(p.rules()[0].limit_keys().is_empty());
    /// ```
    pub fn limit_keys(&self) -> &[LimitKey] {
        &self.keys
    }

    /// The `match` conditions, all of which must hold.
    ///
    /// ```
    /// # use sluice_policy::{Condition, Policy};
    /// # let p = Policy::from_str("rules: [{name: r, limit_keys: [], match: {method: GET}, algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// assert_eq!(p.rules()[0].conditions(), &[Condition::Method("GET".into())]);
    /// ```
    pub fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    /// How the rule prices a request.
    ///
    /// ```
    /// # use sluice_policy::{CostSource, Policy};
    /// # let p = Policy::from_str("rules: [{name: r, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 9, cost_source: 'query:n', default_cost: 2}}]", "p").unwrap();
    /// assert_eq!(p.rules()[0].cost().source(), &CostSource::Query("n".into()));
    /// assert_eq!(p.rules()[0].cost().default_cost(), 2.0);
    /// ```
    pub fn cost(&self) -> &Cost {
        &self.cost
    }

    /// Whether the rule enforces or only reports.
    ///
    /// ```
    /// # use sluice_policy::{Enforcement, Policy};
    /// # let p = Policy::from_str("rules: [{name: r, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// assert_eq!(p.rules()[0].enforcement(), Enforcement::Enforce);
    /// ```
    pub fn enforcement(&self) -> Enforcement {
        self.enforcement
    }

    /// How long a key this rule denies stays denied, if it says.
    ///
    /// ```
    /// # use sluice_core::Nanos;
    /// # use sluice_policy::Policy;
    /// # let p = Policy::from_str("rules: [{name: r, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1}, penalty: 30s}]", "p").unwrap();
    /// assert_eq!(p.rules()[0].penalty().unwrap().duration(), Nanos(30 * Nanos::PER_SEC));
    /// assert_eq!(p.rules()[0].penalty().unwrap().gate().name(), "r:penalty");
    /// ```
    pub fn penalty(&self) -> Option<&Penalty> {
        self.penalty.as_ref()
    }

    /// How long the rule may hold a request over its limit before it
    /// forwards it (`on_limit: {delay: {max}}`), or `None` when it refuses
    /// it at once. A front end that can hold a request (the middleware and
    /// the proxy) reserves for it and forwards it when it is due, if that
    /// is within this; beyond, and on Envoy, the request is refused.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use sluice_policy::Policy;
    /// let p = Policy::from_str("rules: [{name: r, limit_keys: [ip:address], algorithm: token_bucket, \
    ///     algorithm_config: {rps: 10, burst: 1, max_reserved: 20}, on_limit: {delay: {max: 2s}}}]", "p").unwrap();
    /// assert_eq!(p.rules()[0].delay(), Some(Duration::from_secs(2)));
    /// assert!(p.warnings().is_empty());
    /// ```
    pub fn delay(&self) -> Option<Duration> {
        self.delay
    }

    /// What to do when the store fails: the rule's own setting, else the
    /// policy's.
    ///
    /// ```
    /// # use sluice_policy::{OnStoreError, Policy};
    /// # let p = Policy::from_str("rules: [{name: r, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1}, on_store_error: closed}]", "p").unwrap();
    /// assert_eq!(p.rules()[0].on_store_error(), OnStoreError::Closed);
    /// ```
    pub fn on_store_error(&self) -> OnStoreError {
        self.on_store_error
    }

    /// What the rule does when a key part is missing.
    ///
    /// ```
    /// # use sluice_policy::{OnMissing, Policy};
    /// # let p = Policy::from_str("rules: [{name: r, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// assert_eq!(p.rules()[0].on_missing(), OnMissing::Skip);
    /// ```
    pub fn on_missing(&self) -> OnMissing {
        self.on_missing
    }

    /// The Envoy rate-limit domain the rule belongs to. Rules with a domain
    /// apply only to Envoy requests of that domain; rules without one apply
    /// only to HTTP requests.
    ///
    /// ```
    /// # use sluice_policy::Policy;
    /// # let p = Policy::from_str("rules: [{name: r, domain: edge, limit_keys: ['descriptor:remote_address'], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// assert_eq!(p.rules()[0].domain(), Some("edge"));
    /// ```
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// The group the rule belongs to: of a group's rules, only the first in
    /// file order whose `match` holds applies to a request (tiers).
    ///
    /// ```
    /// use sluice_policy::{Policy, RequestParts};
    /// let p = Policy::from_str(r#"
    /// rules:
    ///   - {name: gold, group: tier, limit_keys: [], match: {"header:x-plan": gold}, algorithm: token_bucket, algorithm_config: {rps: 100}}
    ///   - {name: free, group: tier, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1}}
    /// "#, "p").unwrap();
    /// assert_eq!(p.rules()[0].group(), Some("tier"));
    /// let gold = RequestParts::new("GET", "/").with_header("x-plan", "gold");
    /// let applied: Vec<_> = p.matching(&gold).map(|h| h.rule.name()).collect();
    /// assert_eq!(applied, ["gold"]);
    /// let other = RequestParts::new("GET", "/");
    /// assert_eq!(p.matching(&other).map(|h| h.rule.name()).collect::<Vec<_>>(), ["free"]);
    /// ```
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// Whether all of the rule's conditions hold for `req`.
    ///
    /// ```
    /// # use sluice_policy::{Policy, RequestParts};
    /// # let p = Policy::from_str("rules: [{name: r, limit_keys: [], match: {method: GET}, algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// assert!(p.rules()[0].matches(&RequestParts::new("GET", "/")));
    /// assert!(!p.rules()[0].matches(&RequestParts::new("PUT", "/")));
    /// ```
    pub fn matches<R: Request + ?Sized>(&self, req: &R) -> bool {
        self.conditions.iter().all(|c| c.holds(req))
    }

    /// The store key of `req` under this rule, or `None` when a part is
    /// missing from the request (with `on_missing: shared`, a missing part
    /// is written as a marker no value produces, so it is never `None`).
    ///
    /// ```
    /// # use sluice_policy::{Policy, RequestParts};
    /// # let p = Policy::from_str("rules: [{name: r, limit_keys: [method, path], algorithm: token_bucket, algorithm_config: {rps: 1}}]", "p").unwrap();
    /// let key = p.rules()[0].key(&RequestParts::new("GET", "/a"));
    /// assert_eq!(key.as_deref(), Some("3:GET2:/a"));
    /// ```
    pub fn key<R: Request + ?Sized>(&self, req: &R) -> Option<String> {
        let mut key = String::with_capacity(24);
        for part in &self.keys {
            if !part.push_to(&mut key, req, self.ipv6_prefix) {
                if self.on_missing != OnMissing::Shared {
                    return None;
                }
                push_missing(&mut key);
            }
        }
        Some(key)
    }
}

/// A validated policy file.
///
/// ```
/// use sluice_policy::Policy;
/// let policy = Policy::from_str(r#"
/// limits:
///   llmTokens:
///     algorithm: token_bucket
///     algorithm_config: {tokens_per_second: 1000, burst: 40000, max_reserved: 100000}
/// rules:
///   - name: per-ip
///     limit_keys: [ip:address]
///     algorithm: fixed_window
///     algorithm_config: {rate: 100, period: 1m}
/// "#, "policy.yaml").unwrap();
/// assert_eq!(policy.named_limit("llmTokens").unwrap().limit().algorithm().max_cost(true), 140_000.0);
/// assert_eq!(policy.rules().len(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct Policy {
    pub(crate) store: StoreConfig,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) limits: Vec<NamedLimit>,
    pub(crate) limit_index: HashMap<String, usize>,
    pub(crate) rules: Vec<Rule>,
    pub(crate) trusted_proxies: TrustedProxies,
    /// How many leading bits of an IPv6 client's address `ip:address` keys
    /// on: one client is usually given a whole /64 and could otherwise take
    /// a fresh bucket with each of its addresses.
    pub(crate) ipv6_prefix: u8,
    pub(crate) jwt: Option<JwtVerifier>,
    pub(crate) warnings: Vec<PolicyWarning>,
    /// Whether the file lists its rules or limits as explicitly empty
    /// (`rules: []`), rather than leaving them out.
    pub(crate) empty_on_purpose: bool,
    /// Whether a rule delays (`on_limit: {delay}`), worked out once: the
    /// middleware asks with every request.
    pub(crate) delays: bool,
}

impl Default for Policy {
    /// An empty policy: no rules, no limits, the memory store.
    fn default() -> Policy {
        Policy {
            store: StoreConfig::default(),
            on_store_error: OnStoreError::default(),
            limits: Vec::new(),
            limit_index: HashMap::new(),
            rules: Vec::new(),
            trusted_proxies: TrustedProxies::default(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            jwt: None,
            warnings: Vec::new(),
            empty_on_purpose: false,
            delays: false,
        }
    }
}

impl Policy {
    /// What in the file is legal but almost surely a mistake, in file order.
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// let p = Policy::from_str("limits: {a: {algorithm: token_bucket, algorithm_config: {rate: 5}}}", "p").unwrap();
    /// assert!(p.warnings().iter().any(|w| w.message.contains("per second")));
    /// ```
    pub fn warnings(&self) -> &[PolicyWarning] {
        &self.warnings
    }

    /// Whether the policy has neither rules nor limits.
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// assert!(Policy::from_str("", "p").unwrap().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.limits.is_empty()
    }

    /// Whether the file says on purpose that it has no rules or no limits
    /// (`rules: []`, `limits: {}`), as a file cut short or emptied by an
    /// editor does not.
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// assert!(Policy::from_str("rules: []", "p").unwrap().is_empty_on_purpose());
    /// assert!(!Policy::from_str("limits:", "p").unwrap().is_empty_on_purpose());
    /// ```
    pub fn is_empty_on_purpose(&self) -> bool {
        self.empty_on_purpose
    }

    /// Whether any rule delays requests over its limit rather than refuse
    /// them (`on_limit: {delay}`).
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// let rule = "rules: [{name: r, limit_keys: [path], algorithm: token_bucket, algorithm_config: {rps: 1, max_reserved: 1}";
    /// assert!(Policy::from_str(&format!("{rule}, on_limit: {{delay: {{max: 1s}}}}}}]"), "p").unwrap().delays());
    /// assert!(!Policy::from_str(&format!("{rule}}}]"), "p").unwrap().delays());
    /// ```
    pub fn delays(&self) -> bool {
        self.delays
    }

    /// The `store` section, or the in-memory default.
    ///
    /// ```
    /// use sluice_policy::{Policy, StoreConfig};
    /// assert_eq!(Policy::from_str("", "p").unwrap().store(), &StoreConfig::default());
    /// ```
    pub fn store(&self) -> &StoreConfig {
        &self.store
    }

    /// The policy-wide `on_store_error` (rules may override it).
    ///
    /// ```
    /// use sluice_policy::{OnStoreError, Policy};
    /// assert_eq!(Policy::from_str("", "p").unwrap().on_store_error(), OnStoreError::Open);
    /// ```
    pub fn on_store_error(&self) -> OnStoreError {
        self.on_store_error
    }

    /// The named limits, in file order.
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// let p = Policy::from_str("limits: {b: {algorithm: token_bucket, algorithm_config: {rps: 1}}, \
    ///                           a: {algorithm: token_bucket, algorithm_config: {rps: 1}}}", "p").unwrap();
    /// let names: Vec<_> = p.named_limits().iter().map(|l| l.name()).collect();
    /// assert_eq!(names, ["b", "a"]);
    /// ```
    pub fn named_limits(&self) -> &[NamedLimit] {
        &self.limits
    }

    /// The named limit called `name`.
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// let p = Policy::from_str("limits: {a: {algorithm: token_bucket, algorithm_config: {rps: 1}}}", "p").unwrap();
    /// assert!(p.named_limit("a").is_some() && p.named_limit("b").is_none());
    /// ```
    pub fn named_limit(&self, name: &str) -> Option<&NamedLimit> {
        self.limit_index.get(name).and_then(|&i| self.limits.get(i))
    }

    /// The proxies whose forwarding headers are believed (`trusted_proxies`).
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// let p = Policy::from_str("trusted_proxies: [10.0.0.0/8]", "p").unwrap();
    /// assert!(p.trusted_proxies().contains("10.1.2.3".parse().unwrap()));
    /// assert!(Policy::default().trusted_proxies().is_empty());
    /// ```
    pub fn trusted_proxies(&self) -> &TrustedProxies {
        &self.trusted_proxies
    }

    /// How many leading bits of an IPv6 client's address `ip:address` keys
    /// on (`ipv6_prefix`).
    ///
    /// ```
    /// use sluice_policy::{DEFAULT_IPV6_PREFIX, Policy};
    /// assert_eq!(Policy::from_str("ipv6_prefix: 48", "p").unwrap().ipv6_prefix(), 48);
    /// assert_eq!(Policy::default().ipv6_prefix(), DEFAULT_IPV6_PREFIX);
    /// ```
    pub fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
    }

    /// The keys that verify request tokens (`jwt`), if any: without them no
    /// request has claims.
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// assert!(Policy::default().jwt().is_none());
    /// ```
    pub fn jwt(&self) -> Option<&JwtVerifier> {
        self.jwt.as_ref()
    }

    /// The request rules, in file order.
    ///
    /// ```
    /// use sluice_policy::Policy;
    /// assert!(Policy::from_str("rules: []", "p").unwrap().rules().is_empty());
    /// ```
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }
}
