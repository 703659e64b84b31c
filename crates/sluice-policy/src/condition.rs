//! The `match` conditions of a rule: one entry of its `match` map, parsed
//! and tested against a request.

use crate::keys::{header_name, name_after, query_name};
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

    /// The condition as a `match` entry: its key and value, as
    /// [`Condition::parse`] reads them.
    ///
    /// ```
    /// use sluice_policy::Condition;
    /// let c = Condition::Header("x-tier".into(), "free".into());
    /// assert_eq!(c.entry(), ("header:x-tier".to_owned(), "free"));
    /// assert_eq!(Condition::parse("header:x-tier", "free".into()), Ok(c));
    /// ```
    pub fn entry(&self) -> (String, &str) {
        match self {
            Condition::Path(p) => ("path".into(), p),
            Condition::PathPrefix(p) => ("path_prefix".into(), p),
            Condition::Method(m) => ("method".into(), m),
            Condition::Host(h) => ("host".into(), h),
            Condition::Header(n, v) => (format!("header:{n}"), v),
            Condition::Query(n, v) => (format!("query:{n}"), v),
            Condition::Jwt(n, v) => (format!("jwt:{n}"), v),
            Condition::Descriptor(n, v) => (format!("descriptor:{n}"), v),
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
