//! Limit keys and costs: which parts of a request identify a bucket, how
//! several parts combine into one key, and how much a request costs.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use crate::request::Request;

/// One part of a rule's key (an entry of `limit_keys`).
///
/// ```
/// use sluice_policy::{DEFAULT_IPV6_PREFIX, LimitKey, Request, RequestParts};
/// let key = LimitKey::parse("header:X-Api-Key").unwrap();
/// assert_eq!(key, LimitKey::Header("x-api-key".into()));
/// let req = RequestParts::new("GET", "/").with_header("x-api-key", "k1");
/// assert_eq!(key.extract(&req, DEFAULT_IPV6_PREFIX).as_deref(), Some("k1"));
/// assert_eq!(LimitKey::parse("jwt:sub"), Ok(LimitKey::Jwt("sub".into())));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LimitKey {
    /// `ip:address`: the client address in canonical text form.
    IpAddress,
    /// `header:<name>`: a header value; the name is stored lowercased.
    Header(String),
    /// `query:<name>`: a decoded query parameter.
    Query(String),
    /// `path`: the request path.
    Path,
    /// `method`: the request method.
    Method,
    /// `jwt:<claim>`: a claim of the request's verified token.
    Jwt(String),
    /// `descriptor:<key>`: an Envoy descriptor entry's value.
    Descriptor(String),
}

impl LimitKey {
    /// Parses a `limit_keys` entry; the error says what is accepted instead.
    ///
    /// ```
    /// use sluice_policy::LimitKey;
    /// assert_eq!(LimitKey::parse("ip:address"), Ok(LimitKey::IpAddress));
    /// assert!(LimitKey::parse("cookie:session").is_err());
    /// ```
    pub fn parse(s: &str) -> Result<LimitKey, String> {
        let (kind, name) = match s.split_once(':') {
            Some((kind, name)) => (kind, Some(name)),
            None => (s, None),
        };
        match (kind, name) {
            ("ip", Some("address")) => Ok(LimitKey::IpAddress),
            ("ip", _) => Err(format!(
                "unknown limit key `{s}`; the client address is `ip:address`"
            )),
            ("header", Some(n)) => header_name(n).map(LimitKey::Header),
            ("query", Some(n)) => query_name(n).map(LimitKey::Query),
            ("path", None) => Ok(LimitKey::Path),
            ("method", None) => Ok(LimitKey::Method),
            ("jwt", Some(n)) => name_after("jwt", n).map(LimitKey::Jwt),
            ("descriptor", Some(n)) => name_after("descriptor", n).map(LimitKey::Descriptor),
            _ => Err(format!(
                "unknown limit key `{s}`; expected ip:address, header:<name>, query:<name>, \
                 jwt:<claim>, descriptor:<key>, path or method"
            )),
        }
    }

    /// This part of `req`, or `None` when the request lacks it (the rule then
    /// does not apply). An IPv6 client is keyed by the network of its first
    /// `ipv6_prefix` bits (the policy's `ipv6_prefix`, 64 unless it says
    /// otherwise), since one client is usually given a whole /64.
    ///
    /// ```
    /// use sluice_policy::{LimitKey, RequestParts};
    /// let ip = |a: &str| RequestParts::new("GET", "/").with_ip(a.parse().unwrap());
    /// let key = |a: &str, bits| LimitKey::IpAddress.extract(&ip(a), bits).unwrap().into_owned();
    /// // IPv4-mapped IPv6 addresses count as the IPv4 client they are.
    /// assert_eq!(key("::ffff:192.0.2.1", 64), "192.0.2.1");
    /// assert_eq!(key("2001:db8:1:2:aaaa::1", 64), "2001:db8:1:2::/64");
    /// assert_eq!(key("2001:db8:1:2:bbbb::9", 64), "2001:db8:1:2::/64");
    /// assert_eq!(key("2001:db8:1:2:bbbb::9", 128), "2001:db8:1:2:bbbb::9");
    /// assert_eq!(LimitKey::Query("page".into()).extract(&ip("192.0.2.1"), 64), None);
    /// ```
    pub fn extract<'r, R: Request + ?Sized>(
        &self,
        req: &'r R,
        ipv6_prefix: u8,
    ) -> Option<Cow<'r, str>> {
        match self {
            LimitKey::IpAddress => req.ip().map(|ip| Cow::Owned(ip_text(ip, ipv6_prefix))),
            LimitKey::Header(n) => req.header(n).map(Cow::Borrowed),
            LimitKey::Query(n) => req.query(n),
            LimitKey::Path => Some(Cow::Borrowed(req.path())),
            LimitKey::Method => Some(Cow::Borrowed(req.method())),
            LimitKey::Jwt(n) => req.claim(n),
            LimitKey::Descriptor(n) => req.descriptor(n).map(Cow::Borrowed),
        }
    }

    /// Appends this part of `req` to a store key, as [`push_part`] writes
    /// it, or returns `false` when the request lacks it. The address, which
    /// every request has, is written in place rather than built apart.
    pub(crate) fn push_to<R: Request + ?Sized>(
        &self,
        key: &mut String,
        req: &R,
        ipv6_prefix: u8,
    ) -> bool {
        if let LimitKey::IpAddress = self {
            let Some(ip) = req.ip() else { return false };
            let at = key.len();
            push_ip(key, ip, ipv6_prefix);
            let len = key.len() - at;
            key.insert(at, ':');
            key.insert_str(at, itoa::Buffer::new().format(len));
            return true;
        }
        match self.extract(req, ipv6_prefix) {
            Some(v) => {
                push_part(key, &v);
                true
            }
            None => false,
        }
    }
}

/// How many leading bits of an IPv6 address `ip:address` keys on unless the
/// policy says otherwise: a /64 is what one client (a home, a VM) is given.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// An address as its key part: IPv4-mapped IPv6 addresses as IPv4, so that
/// a dual-stack listener keys a client as an IPv4 one does; other IPv6
/// addresses as their network of `ipv6_prefix` bits (the address alone at
/// 128). IPv4, the common case on every request, is written without the
/// formatting machinery.
fn ip_text(ip: IpAddr, ipv6_prefix: u8) -> String {
    let mut out = String::with_capacity(15);
    push_ip(&mut out, ip, ipv6_prefix);
    out
}

/// Appends [`ip_text`] to `out`.
fn push_ip(out: &mut String, ip: IpAddr, ipv6_prefix: u8) {
    // Writing to a `String` cannot fail.
    use std::fmt::Write;
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                out.push_str(digits.format(octet));
            }
        }
        IpAddr::V6(v6) if ipv6_prefix < 128 => {
            let mask = u128::MAX
                .checked_shl(u32::from(128 - ipv6_prefix))
                .unwrap_or(0);
            let network = Ipv6Addr::from(u128::from(v6) & mask);
            let _ = write!(out, "{network}/{ipv6_prefix}");
        }
        v6 => {
            let _ = write!(out, "{v6}");
        }
    }
}

impl fmt::Display for LimitKey {
    /// Writes the key as a policy file spells it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitKey::IpAddress => f.write_str("ip:address"),
            LimitKey::Header(n) => write!(f, "header:{n}"),
            LimitKey::Query(n) => write!(f, "query:{n}"),
            LimitKey::Path => f.write_str("path"),
            LimitKey::Method => f.write_str("method"),
            LimitKey::Jwt(n) => write!(f, "jwt:{n}"),
            LimitKey::Descriptor(n) => write!(f, "descriptor:{n}"),
        }
    }
}

/// Checks a header name and lowercases it, since header names ignore case.
pub(crate) fn header_name(name: &str) -> Result<String, String> {
    let is_token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() {
        Err("a header name is missing after `header:`".into())
    } else if !name.chars().all(is_token) {
        Err(format!("`{name}` is not a valid header name"))
    } else {
        Ok(name.to_ascii_lowercase())
    }
}

pub(crate) fn query_name(name: &str) -> Result<String, String> {
    name_after("query", name)
}

/// Checks that a `kind:<name>` entry has a name.
pub(crate) fn name_after(kind: &str, name: &str) -> Result<String, String> {
    if name.is_empty() {
        Err(format!("a name is missing after `{kind}:`"))
    } else {
        Ok(name.to_owned())
    }
}

/// Joins key parts into one store key that no other list of parts produces.
///
/// Each part is written as `<byte length>:<bytes>`, so `("a:b", "c")` and
/// `("a", "b:c")` stay apart. No parts give the empty key: one shared bucket.
///
/// ```
/// use sluice_policy::encode_key;
/// assert_eq!(encode_key(["a:b", "c"]), "3:a:b1:c");
/// assert_ne!(encode_key(["a:b", "c"]), encode_key(["a", "b:c"]));
/// assert_eq!(encode_key([] as [&str; 0]), "");
/// ```
pub fn encode_key<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    let mut key = String::new();
    for part in parts {
        push_part(&mut key, part);
    }
    key
}

/// Splits a key made by [`encode_key`] back into its parts; `None` if `key`
/// is not such a key.
///
/// ```
/// use sluice_policy::{decode_key, encode_key};
/// let key = encode_key(["192.0.2.1", "/a:b"]);
/// assert_eq!(decode_key(&key), Some(vec!["192.0.2.1", "/a:b"]));
/// assert_eq!(decode_key("7:short"), None);
/// ```
pub fn decode_key(mut key: &str) -> Option<Vec<&str>> {
    let mut parts = Vec::new();
    while !key.is_empty() {
        let (len, rest) = key.split_once(':')?;
        let len: usize = len.parse().ok()?;
        parts.push(rest.get(..len)?);
        key = rest.get(len..)?;
    }
    Some(parts)
}

/// A key made by [`encode_key`] as people read it: its parts separated by
/// spaces, and `(shared)` for a key of no parts. Any other string is
/// returned as it is.
///
/// ```
/// use sluice_policy::{encode_key, readable_key};
/// assert_eq!(readable_key(&encode_key(["192.0.2.1", "/login"])), "192.0.2.1 /login");
/// assert_eq!(readable_key(""), "(shared)");
/// assert_eq!(readable_key("alice"), "alice");
/// ```
pub fn readable_key(key: &str) -> String {
    match decode_key(key) {
        Some(parts) if parts.is_empty() => "(shared)".to_owned(),
        Some(parts) => parts.join(" "),
        None => key.to_owned(),
    }
}

/// Writes a part that the request lacks, for rules with `on_missing:
/// shared`. It starts with `-`, where every present part starts with its
/// length, so it never collides with a value.
pub(crate) fn push_missing(key: &mut String) {
    key.push_str("-:");
}

/// Writes a part the request has: its length in bytes, `:`, and the part, so
/// that no two lists of parts write the same key.
pub(crate) fn push_part(key: &mut String, part: &str) {
    key.push_str(itoa::Buffer::new().format(part.len()));
    key.push(':');
    key.push_str(part);
}

/// Where a rule takes each request's cost from (`cost_source`).
///
/// ```
/// use sluice_policy::CostSource;
/// assert_eq!(CostSource::parse("fixed"), Ok(CostSource::Fixed));
/// assert_eq!(CostSource::parse("header:X-Tokens"), Ok(CostSource::Header("x-tokens".into())));
/// assert!(CostSource::parse("body:tokens").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum CostSource {
    /// Every request costs `fixed_cost`.
    #[default]
    Fixed,
    /// The cost is a number in this header (lowercase name).
    Header(String),
    /// The cost is a number in this query parameter.
    Query(String),
}

impl CostSource {
    /// Parses `fixed`, `header:<name>` or `query:<name>`.
    ///
    /// ```
    /// use sluice_policy::CostSource;
    /// assert_eq!(CostSource::parse("query:n"), Ok(CostSource::Query("n".into())));
    /// ```
    pub fn parse(s: &str) -> Result<CostSource, String> {
        match s.split_once(':') {
            None if s == "fixed" => Ok(CostSource::Fixed),
            Some(("header", n)) => header_name(n).map(CostSource::Header),
            Some(("query", n)) => query_name(n).map(CostSource::Query),
            _ => Err(format!(
                "unknown cost_source `{s}`; expected fixed, header:<name> or query:<name>"
            )),
        }
    }
}

/// How a rule prices a request: its [`CostSource`] and the two fallbacks.
///
/// ```
/// use sluice_policy::{Cost, CostSource, RequestParts};
/// let cost = Cost::new(CostSource::Header("x-tokens".into()), 1.0, 3.0);
/// let req = RequestParts::new("POST", "/llm").with_header("X-Tokens", "120");
/// assert_eq!(cost.of(&req), 120.0);
/// let bad = RequestParts::new("POST", "/llm").with_header("X-Tokens", "-5");
/// assert_eq!(cost.of(&bad), 3.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Cost {
    source: CostSource,
    fixed_cost: f64,
    default_cost: f64,
}

impl Cost {
    /// A cost; callers (the policy loader) ensure both amounts are positive.
    ///
    /// ```
    /// use sluice_policy::{Cost, CostSource, RequestParts};
    /// let cost = Cost::new(CostSource::Fixed, 2.0, 1.0);
    /// assert_eq!(cost.of(&RequestParts::new("GET", "/")), 2.0);
    /// ```
    pub fn new(source: CostSource, fixed_cost: f64, default_cost: f64) -> Cost {
        Cost {
            source,
            fixed_cost,
            default_cost,
        }
    }

    /// Where the cost comes from.
    ///
    /// ```
    /// use sluice_policy::{Cost, CostSource};
    /// assert_eq!(Cost::new(CostSource::Fixed, 1.0, 1.0).source(), &CostSource::Fixed);
    /// ```
    pub fn source(&self) -> &CostSource {
        &self.source
    }

    /// The cost of every request when the source is `fixed`.
    ///
    /// ```
    /// use sluice_policy::{Cost, CostSource};
    /// assert_eq!(Cost::new(CostSource::Fixed, 4.0, 1.0).fixed_cost(), 4.0);
    /// ```
    pub fn fixed_cost(&self) -> f64 {
        self.fixed_cost
    }

    /// The cost used when the header or parameter is missing or not a
    /// positive finite number.
    ///
    /// ```
    /// use sluice_policy::{Cost, CostSource};
    /// assert_eq!(Cost::new(CostSource::Query("n".into()), 1.0, 5.0).default_cost(), 5.0);
    /// ```
    pub fn default_cost(&self) -> f64 {
        self.default_cost
    }

    /// The cost every request has if its own value is never used: what
    /// validation compares with the bucket's capacity.
    pub(crate) fn baseline(&self) -> (f64, &'static str) {
        match self.source {
            CostSource::Fixed => (self.fixed_cost, "fixed_cost"),
            _ => (self.default_cost, "default_cost"),
        }
    }

    /// The cost of `req`. A cost above the limit's capacity is returned as is:
    /// the store reports it.
    ///
    /// ```
    /// use sluice_policy::{Cost, CostSource, RequestParts};
    /// let cost = Cost::new(CostSource::Query("n".into()), 1.0, 1.0);
    /// assert_eq!(cost.of(&RequestParts::new("GET", "/").with_query("n=2.5")), 2.5);
    /// assert_eq!(cost.of(&RequestParts::new("GET", "/").with_query("n=NaN")), 1.0);
    /// ```
    pub fn of<R: Request + ?Sized>(&self, req: &R) -> f64 {
        let given = match &self.source {
            CostSource::Fixed => return self.fixed_cost,
            CostSource::Header(n) => req.header(n).map(Cow::Borrowed),
            CostSource::Query(n) => req.query(n),
        };
        given
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|c| c.is_finite() && *c > 0.0)
            .unwrap_or(self.default_cost)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::RequestParts;

    #[test]
    fn an_address_written_in_place_is_the_part_extract_gives() {
        for (ip, prefix) in [
            ("192.0.2.1", 64),
            ("0.0.0.0", 64),
            ("255.255.255.255", 64),
            ("::ffff:192.0.2.1", 64),
            ("2001:db8:1:2:aaaa::1", 64),
            ("2001:db8:1:2:aaaa::1", 0),
            ("2001:db8:1:2:aaaa::1", 128),
            ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 127),
        ] {
            let req = RequestParts::new("GET", "/").with_ip(ip.parse().unwrap());
            let part = LimitKey::IpAddress.extract(&req, prefix).unwrap();
            let mut key = String::from("3:GET");
            assert!(LimitKey::IpAddress.push_to(&mut key, &req, prefix));
            assert_eq!(
                key,
                format!("3:GET{}", encode_key([&*part])),
                "{ip}/{prefix}"
            );
        }
        let mut key = String::new();
        let no_ip = RequestParts::new("GET", "/");
        assert!(!LimitKey::IpAddress.push_to(&mut key, &no_ip, 64));
        assert!(LimitKey::Method.push_to(&mut key, &no_ip, 64));
        assert_eq!(key, "3:GET");
    }
}
