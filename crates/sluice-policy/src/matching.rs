//! Which rules apply to a request: [`Policy::matching`] yields each
//! applicable rule with the request's key and cost.

use std::sync::Arc;

use sluice_core::Limit;

use crate::policy::{NamedLimit, Policy, Rule};
use crate::request::Request;
use crate::settings::OnMissing;

/// A rule that applies to a request, with the request's key and cost.
///
/// ```
/// use sluice_policy::{Policy, RequestParts};
/// let policy = Policy::from_str(
///     "rules:\n  - name: per-ip\n    limit_keys: [ip:address]\n    \
///      algorithm: token_bucket\n    algorithm_config: {rps: 10}\n",
///     "policy.yaml",
/// ).unwrap();
/// let req = RequestParts::new("GET", "/").with_ip([192, 0, 2, 7].into());
/// let hit = policy.matching(&req).next().unwrap();
/// assert_eq!((hit.rule.name(), hit.key.as_str(), hit.cost), ("per-ip", "9:192.0.2.7", 1.0));
/// ```
#[derive(Debug, Clone)]
pub struct RuleHit<'p> {
    /// The rule.
    pub rule: &'p Rule,
    /// The rule's position in [`Policy::rules`].
    pub index: usize,
    /// The store key within the rule's limit (see [`crate::encode_key`]);
    /// empty when `missing` is set.
    pub key: String,
    /// What the request costs under this rule.
    pub cost: f64,
    /// A key part is missing and the rule says `on_missing: deny`: the
    /// request is denied without asking the store.
    pub missing: bool,
    /// The limit this hit is decided under in place of the rule's, when the
    /// request brings one (an Envoy descriptor's `limit` override).
    pub limit: Option<Arc<NamedLimit>>,
}

impl RuleHit<'_> {
    /// The limit the hit is decided under: the one the request brought, or
    /// the rule's.
    ///
    /// ```
    /// use sluice_policy::{Policy, RequestParts};
    /// let p = Policy::from_str("rules: [{name: r, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 3}}]", "p").unwrap();
    /// let req = RequestParts::new("GET", "/");
    /// let hit = p.matching(&req).next().unwrap();
    /// assert_eq!(hit.limit().name(), "r");
    /// ```
    pub fn limit(&self) -> &Limit {
        match &self.limit {
            Some(brought) => brought.limit(),
            None => self.rule.limit(),
        }
    }
}

impl Policy {
    /// Every rule whose conditions hold and whose key parts are all present in
    /// `req`, in file order; of the rules of one `group`, only the first
    /// whose conditions hold (see [`Rule::group`]).
    ///
    /// ```
    /// use sluice_policy::{Policy, RequestParts};
    /// let policy = Policy::from_str(r#"
    /// rules:
    ///   - name: per-key
    ///     limit_keys: ["header:x-api-key"]
    ///     algorithm: token_bucket
    ///     algorithm_config: {rps: 5}
    /// "#, "policy.yaml").unwrap();
    /// // Without the header the rule has no key, so it does not apply.
    /// assert_eq!(policy.matching(&RequestParts::new("GET", "/")).count(), 0);
    /// let req = RequestParts::new("GET", "/").with_header("X-Api-Key", "k1");
    /// assert_eq!(policy.matching(&req).count(), 1);
    /// ```
    pub fn matching<'a, R: Request + ?Sized>(
        &'a self,
        req: &'a R,
    ) -> impl Iterator<Item = RuleHit<'a>> + 'a {
        self.hits(None, req)
    }

    /// Every rule of the Envoy rate-limit `domain` that applies to `req` (one
    /// descriptor), in file order.
    ///
    /// ```
    /// use sluice_policy::{Policy, RequestParts};
    /// let policy = Policy::from_str(r#"
    /// rules:
    ///   - name: per-client
    ///     domain: edge
    ///     limit_keys: ["descriptor:remote_address"]
    ///     algorithm: token_bucket
    ///     algorithm_config: {rps: 5}
    /// "#, "policy.yaml").unwrap();
    /// let d = RequestParts::default().with_descriptor("remote_address", "10.0.0.1");
    /// assert_eq!(policy.matching_domain("edge", &d).count(), 1);
    /// assert_eq!(policy.matching_domain("other", &d).count(), 0);
    /// assert_eq!(policy.matching(&d).count(), 0);
    /// ```
    pub fn matching_domain<'a, R: Request + ?Sized>(
        &'a self,
        domain: &'a str,
        req: &'a R,
    ) -> impl Iterator<Item = RuleHit<'a>> + 'a {
        self.hits(Some(domain), req)
    }

    fn hits<'a, R: Request + ?Sized>(
        &'a self,
        domain: Option<&'a str>,
        req: &'a R,
    ) -> impl Iterator<Item = RuleHit<'a>> + 'a {
        // The groups whose rule for this request has been found.
        let mut taken: Vec<&'a str> = Vec::new();
        self.rules()
            .iter()
            .enumerate()
            .filter(move |(_, rule)| rule.domain() == domain)
            .filter(move |(_, rule)| {
                let group = rule.group();
                if group.is_some_and(|g| taken.contains(&g)) {
                    return false;
                }
                let holds = rule.matches(req);
                if let (true, Some(g)) = (holds, group) {
                    taken.push(g);
                }
                holds
            })
            .filter_map(|(index, rule)| {
                let (key, missing) = match rule.key(req) {
                    Some(key) => (key, false),
                    None if rule.on_missing() == OnMissing::Deny => (String::new(), true),
                    None => return None,
                };
                Some(RuleHit {
                    rule,
                    index,
                    key,
                    cost: rule.cost().of(req),
                    missing,
                    limit: None,
                })
            })
    }
}
