//! Which rules apply to a request: `match` conditions, and [`Policy::matching`],
//! which yields each applicable rule with the request's key and cost.

use crate::keys::{header_name, name_after, query_name};
use crate::policy::{OnMissing, Policy, Rule};
use crate::request::Request;

/// One entry of a rule's `match` map. Values must be equal exactly.
///
/// ```
/// use sluice_policy::{Condition, RequestParts};
/// let c = Condition::parse("path_prefix", "/api/".into()).unwrap();
/// assert!(c.holds(&RequestParts::new("GET", "/api/items")));
/// assert!(!c.holds(&RequestParts::new("GET", "/health")));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Condition {
    /// `path`: the whole path.
    Path(String),
    /// `path_prefix`: the path starts with this string.
    PathPrefix(String),
    /// `method`: the method, case-sensitively.
    Method(String),
    /// `host`: the host.
    Host(String),
    /// `header:<name>`: a header (name lowercased) has this value.
    Header(String, String),
    /// `query:<name>`: a query parameter has this decoded value.
    Query(String, String),
    /// `jwt:<claim>`: a claim of the verified token has this value.
    Jwt(String, String),
    /// `descriptor:<key>`: an Envoy descriptor entry has this value.
    Descriptor(String, String),
}

impl Condition {
    /// Parses a `match` entry.
    ///
    /// ```
    /// use sluice_policy::Condition;
    /// assert_eq!(
    ///     Condition::parse("header:X-Tier", "free".into()),
    ///     Ok(Condition::Header("x-tier".into(), "free".into()))
    /// );
    /// assert!(Condition::parse("cookie:a", "b".into()).is_err());
    /// ```
    pub fn parse(key: &str, value: String) -> Result<Condition, String> {
        match key.split_once(':') {
            None => match key {
                "path" => Ok(Condition::Path(path(key, value)?)),
                "path_prefix" => Ok(Condition::PathPrefix(path(key, value)?)),
                "method" => Ok(Condition::Method(method(value)?)),
                "host" => Ok(Condition::Host(value)),
                _ => Err(unknown(key)),
            },
            Some(("header", n)) => Ok(Condition::Header(header_name(n)?, value)),
            Some(("query", n)) => Ok(Condition::Query(query_name(n)?, value)),
            Some(("jwt", n)) => Ok(Condition::Jwt(name_after("jwt", n)?, value)),
            Some(("descriptor", n)) => {
                Ok(Condition::Descriptor(name_after("descriptor", n)?, value))
            }
            Some(_) => Err(unknown(key)),
        }
    }

    /// Whether `req` satisfies the condition.
    ///
    /// ```
    /// use sluice_policy::{Condition, RequestParts};
    /// let c = Condition::Method("POST".into());
    /// assert!(c.holds(&RequestParts::new("POST", "/")));
    /// assert!(!c.holds(&RequestParts::new("post", "/")));
    ///
    /// // Host names, unlike the rest, ignore case and a final dot.
    /// let h = Condition::Host("api.example.com".into());
    /// let on = |host: &str| RequestParts::new("GET", "/").with_host(host);
    /// assert!(h.holds(&on("API.Example.com")));
    /// assert!(h.holds(&on("api.example.com.")));
    /// assert!(!h.holds(&on("api.example.com.evil")));
    /// assert!(!h.holds(&RequestParts::new("GET", "/")));
    /// ```
    pub fn holds<R: Request + ?Sized>(&self, req: &R) -> bool {
        match self {
            Condition::Path(p) => req.path() == p,
            Condition::PathPrefix(p) => req.path().starts_with(p.as_str()),
            Condition::Method(m) => req.method() == m,
            Condition::Host(h) => req.host().is_some_and(|r| same_host(r, h)),
            Condition::Header(n, v) => req.header(n) == Some(v.as_str()),
            Condition::Query(n, v) => req.query(n).is_some_and(|q| q == v.as_str()),
            Condition::Jwt(n, v) => req.claim(n).is_some_and(|c| c == v.as_str()),
            Condition::Descriptor(n, v) => req.descriptor(n) == Some(v.as_str()),
        }
    }
}

/// Host names compare without regard to case (RFC 9110 §4.2.3), and a
/// fully qualified name's final dot changes nothing, so that neither
/// `API.example.com` nor `api.example.com.` slips past a rule for
/// `api.example.com`.
fn same_host(a: &str, b: &str) -> bool {
    fn bare(h: &str) -> &str {
        h.strip_suffix('.').unwrap_or(h)
    }
    bare(a).eq_ignore_ascii_case(bare(b))
}

/// A path as requests carry it: from the root.
fn path(key: &str, value: String) -> Result<String, String> {
    if value.starts_with('/') {
        Ok(value)
    } else {
        Err(format!(
            "`{key}` {value:?} must start with `/`, as every request path does"
        ))
    }
}

/// A method is an HTTP token (RFC 9110 §9.1); anything else matches nothing.
fn method(value: String) -> Result<String, String> {
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if !value.is_empty() && value.chars().all(tchar) {
        Ok(value)
    } else {
        Err(format!(
            "method {:?} is not an HTTP method name, which is letters with no spaces",
            value.escape_debug().to_string()
        ))
    }
}

fn unknown(key: &str) -> String {
    format!(
        "unknown match condition `{key}`; expected path, path_prefix, method, host, \
         header:<name>, query:<name>, jwt:<claim> or descriptor:<key>"
    )
}

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
}

impl Policy {
    /// Every rule whose conditions hold and whose key parts are all present in
    /// `req`, in file order.
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
        self.rules()
            .iter()
            .enumerate()
            .filter(move |(_, rule)| rule.domain() == domain && rule.matches(req))
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
                })
            })
    }
}
