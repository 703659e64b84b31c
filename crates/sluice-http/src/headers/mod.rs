//! What a verdict tells the client: the IETF `RateLimit-Policy` and
//! `RateLimit` structured fields, the legacy `RateLimit-*` and
//! `X-RateLimit-*` fields, `Retry-After` with per-client jitter, and
//! `Sluice-Degraded` on a decision made without the store. A refusal's
//! body is HTTP's problem details ([`problem`]) or gRPC's status
//! ([`grpc`]).

mod grpc;
mod problem;

pub use self::grpc::grpc_denial;
pub(crate) use self::grpc::{grpc_denial_headers, is_grpc};
pub(crate) use self::problem::set_problem_type;
pub use self::problem::{PROBLEM_JSON, Problem, QUOTA_EXCEEDED, denial};

use bytes::Bytes;
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use smallvec::SmallVec;

use sluice_core::OnStoreError;
use sluice_engine::{Refusal, Verdict};

/// `RateLimit-Policy`: each rule's quota and window, or, for a concurrency
/// rule, its quota of concurrent requests (`qu="concurrent-requests"`).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: each rule's remaining quota and reset time.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `RateLimit-Limit` (the deciding rule's quota).
pub const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
/// Legacy `RateLimit-Remaining`.
pub const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
/// Legacy `RateLimit-Reset` (seconds).
pub const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `Sluice-Degraded`: on a decision made without the store, because its
/// call failed, how it was made (see [`degraded`]). Absent when the store
/// decided.
pub const SLUICE_DEGRADED: HeaderName = HeaderName::from_static("sluice-degraded");

/// How an answer made without the store says so, in [`SLUICE_DEGRADED`],
/// the decision API's `degraded` field and Envoy's dynamic metadata:
/// `fail_open` when the rules admitted the call all the same, `fail_closed`
/// when they denied it.
///
/// ```
/// use sluice_core::OnStoreError;
/// assert_eq!(sluice_http::degraded(OnStoreError::Open), "fail_open");
/// assert_eq!(sluice_http::degraded(OnStoreError::Closed), "fail_closed");
/// ```
pub fn degraded(how: OnStoreError) -> &'static str {
    match how {
        OnStoreError::Open => "fail_open",
        OnStoreError::Closed => "fail_closed",
    }
}

/// Whole seconds for a header: rounded up, so that a client that waits that
/// long is never early, and never negative.
fn whole_secs(secs: f64) -> u64 {
    if secs.is_finite() && secs > 0.0 {
        // Saturates for absurd values, which is what a header wants.
        secs.ceil() as u64
    } else {
        0
    }
}

/// A count for a header: whole tokens, rounded down.
fn whole(count: f64) -> u64 {
    if count.is_finite() && count > 0.0 {
        count as u64
    } else {
        0
    }
}

/// Appends `s` as a structured-field string: printable ASCII, with `"` and
/// `\` escaped. Rule names are the operator's, but a header must stay
/// well-formed whatever they contain, so anything else becomes `_`.
fn push_sf_string(out: &mut String, s: &str) {
    // Rule names are almost always plain: those go in whole, rather than a
    // character at a time.
    if s.bytes()
        .all(|b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\')
    {
        out.reserve(s.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
        return;
    }
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
}

/// Appends `{name};{a}={x};{b}={y}`, one item of a `RateLimit-Policy` or
/// `RateLimit` list.
fn push_item(out: &mut String, name: &str, (a, x): (&str, u64), (b, y): (&str, u64)) {
    push_sf_string(out, name);
    push_param(out, a, x);
    push_param(out, b, y);
}

/// Appends `;{key}={n}`, a parameter of a list item.
fn push_param(out: &mut String, key: &str, n: u64) {
    let mut digits = itoa::Buffer::new();
    let n = digits.format(n);
    out.reserve(key.len() + n.len() + 2);
    out.push(';');
    out.push_str(key);
    out.push('=');
    out.push_str(n);
}

/// `Retry-After` in whole seconds: the exact wait rounded up, plus a jitter
/// of up to 50% that depends only on `identity`, so that the clients a
/// denial stops all at once do not all come back at once, while any one
/// client always hears the same answer.
///
/// ```
/// use sluice_http::retry_after_secs;
/// let a = retry_after_secs(9.2, "per-ip/203.0.113.9");
/// assert!((10..=15).contains(&a));
/// assert_eq!(a, retry_after_secs(9.2, "per-ip/203.0.113.9"));
/// assert_eq!(retry_after_secs(0.0, "x"), 0);
/// assert_eq!(retry_after_secs(f64::NAN, "x"), 0);
/// // Identities that differ only at the end spread over the whole range.
/// let waits: std::collections::HashSet<u64> =
///     (0..200).map(|i| retry_after_secs(12.0, &format!("client-{i}"))).collect();
/// assert_eq!(waits.len(), 6, "12 to 17 s: {waits:?}");
/// ```
pub fn retry_after_secs(exact: f64, identity: &str) -> u64 {
    jittered(exact, [identity.as_bytes()])
}

/// [`retry_after_secs`] for the identity that is the concatenation of
/// `parts`, read in place.
fn jittered<'a>(exact: f64, parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let base = whole_secs(exact);
    // FNV-1a: stable across builds and processes, unlike std's hasher, so
    // every replica jitters a client the same way.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.into_iter().flatten() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // FNV-1a's high bits barely move when only the last bytes differ
    // (`client-1`, `client-2`…), and those are the bits the fraction is
    // made of: without this finalizer (MurmurHash3's), half of 200 such
    // clients came back in the same second (`sluice simulate
    // thundering-herd`).
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    let fraction = (h >> 11) as f64 / (1u64 << 53) as f64;
    base.saturating_add((base as f64 * 0.5 * fraction) as u64)
}

/// The headers a verdict puts on a response, allowed or denied.
///
/// ```
/// use sluice_core::Decision;
/// use sluice_http::{RuleDecision, Verdict, rate_limit_headers};
/// let v = Verdict {
///     rules: vec![RuleDecision {
///         rule: "per-ip".into(),
///         key: "9:192.0.2.1".into(),
///         cost: 1.0,
///         decision: Decision { allowed: true, capacity: 10.0, remaining: 7, retry_after: None, reset: 0.6 },
///         window: 1.0,
///         in_flight: false,
///     }],
///     deciding: Some(0),
///     ..Verdict::default()
/// };
/// let h = rate_limit_headers(&v);
/// assert_eq!(h["ratelimit-policy"], r#""per-ip";q=10;w=1"#);
/// assert_eq!(h["ratelimit"], r#""per-ip";r=7;t=1"#);
/// assert_eq!(h["ratelimit-remaining"], "7");
/// assert!(h.get("retry-after").is_none());
/// ```
pub fn rate_limit_headers(v: &Verdict) -> HeaderMap {
    let mut h = HeaderMap::new();
    set_rate_limit_headers(v, &mut h);
    h
}

/// Sets the headers of [`rate_limit_headers`] on an existing map, such as a
/// response's, replacing any of the same names.
///
/// ```
/// use http::HeaderMap;
/// use sluice_core::Decision;
/// use sluice_http::{RuleDecision, Verdict, set_rate_limit_headers};
/// let v = Verdict {
///     rules: vec![RuleDecision {
///         rule: "per-ip".into(),
///         key: "9:192.0.2.1".into(),
///         cost: 1.0,
///         decision: Decision { allowed: true, capacity: 10.0, remaining: 7, retry_after: None, reset: 0.6 },
///         window: 1.0,
///         in_flight: false,
///     }],
///     deciding: Some(0),
///     ..Verdict::default()
/// };
/// let mut h = HeaderMap::new();
/// h.insert("ratelimit", "stale".parse().unwrap());
/// h.insert("content-type", "text/plain".parse().unwrap());
/// set_rate_limit_headers(&v, &mut h);
/// assert_eq!(h["ratelimit"], r#""per-ip";r=7;t=1"#);
/// assert_eq!(h["content-type"], "text/plain");
/// ```
pub fn set_rate_limit_headers(v: &Verdict, h: &mut HeaderMap) {
    if v.rules.is_empty() && v.allowed {
        // A request no rule matched leaves the map untouched.
        return;
    }
    // Every value goes into one buffer, which the header values then share:
    // two allocations for the whole set, where a buffer per value took two
    // each.
    let mut sink = SharedValues {
        text: String::with_capacity(64 * v.rules.len() + 48),
        fields: SmallVec::new(),
    };
    write_rate_limit_headers(v, &mut sink);
    let SharedValues { text, fields } = sink;
    let text = Bytes::from(text.into_bytes());
    h.reserve(fields.len());
    let mut start = 0;
    for (name, end) in fields {
        // Every value written here is ASCII without control characters.
        if let Ok(value) = HeaderValue::from_maybe_shared(text.slice(start..end)) {
            h.insert(name, value);
        }
        start = end;
    }
}

/// The names of the headers, as statics: a map takes a name by `'static`
/// reference for less than an owned copy when, as here, the name is not
/// one of the standard ones `http` knows.
mod fields {
    use http::HeaderName;

    pub(super) static POLICY: HeaderName = super::RATELIMIT_POLICY;
    pub(super) static RATELIMIT: HeaderName = super::RATELIMIT;
    pub(super) static LIMIT: HeaderName = super::RATELIMIT_LIMIT;
    pub(super) static REMAINING: HeaderName = super::RATELIMIT_REMAINING;
    pub(super) static RESET: HeaderName = super::RATELIMIT_RESET;
    pub(super) static X_LIMIT: HeaderName = super::X_RATELIMIT_LIMIT;
    pub(super) static X_REMAINING: HeaderName = super::X_RATELIMIT_REMAINING;
    pub(super) static RETRY_AFTER: HeaderName = super::RETRY_AFTER;
    pub(super) static DEGRADED: HeaderName = super::SLUICE_DEGRADED;
}

/// Where [`write_rate_limit_headers`] puts each header: the one place that
/// says which headers a verdict gets, and the writers that differ in where
/// the values go.
trait FieldSink {
    /// A structured-field list, which `build` writes into the string given.
    /// `hint` is how long it is likely to be.
    fn list(&mut self, name: &'static HeaderName, hint: usize, build: impl FnOnce(&mut String));
    /// A count or a number of seconds.
    fn number(&mut self, name: &'static HeaderName, n: u64);
    /// A word of the answer's own, such as [`degraded`]'s.
    fn token(&mut self, name: &'static HeaderName, token: &'static str);
}

/// The values of [`set_rate_limit_headers`], one after another in `text`;
/// `fields` says where each one ends.
struct SharedValues {
    text: String,
    fields: SmallVec<[(&'static HeaderName, usize); 8]>,
}

impl FieldSink for SharedValues {
    fn list(&mut self, name: &'static HeaderName, _: usize, build: impl FnOnce(&mut String)) {
        build(&mut self.text);
        self.fields.push((name, self.text.len()));
    }

    fn number(&mut self, name: &'static HeaderName, n: u64) {
        self.text.push_str(itoa::Buffer::new().format(n));
        self.fields.push((name, self.text.len()));
    }

    fn token(&mut self, name: &'static HeaderName, token: &'static str) {
        self.text.push_str(token);
        self.fields.push((name, self.text.len()));
    }
}

/// Hands each value to a callback as an owned [`FieldValue`].
struct Owned<F>(F);

impl<F: FnMut(&HeaderName, FieldValue)> FieldSink for Owned<F> {
    fn list(&mut self, name: &'static HeaderName, hint: usize, build: impl FnOnce(&mut String)) {
        let mut list = String::with_capacity(hint);
        build(&mut list);
        (self.0)(name, FieldValue::List(list));
    }

    fn number(&mut self, name: &'static HeaderName, n: u64) {
        (self.0)(name, FieldValue::Number(n));
    }

    fn token(&mut self, name: &'static HeaderName, token: &'static str) {
        (self.0)(name, FieldValue::Token(token));
    }
}

/// The value of one RateLimit header, as [`each_rate_limit_header`] hands
/// it over: a structured-field list, built for it and owned, or a number,
/// to be written out however the answer writes numbers.
///
/// ```
/// use sluice_http::FieldValue;
/// assert_eq!(FieldValue::Number(7).to_string(), "7");
/// assert_eq!(String::from(FieldValue::List(r#""a";r=1;t=2"#.into())), r#""a";r=1;t=2"#);
/// assert_eq!(FieldValue::Token("fail_open").to_string(), "fail_open");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    /// `RateLimit-Policy` or `RateLimit`: one item per rule.
    List(String),
    /// A count or a number of seconds.
    Number(u64),
    /// A word of the answer's own: `Sluice-Degraded`'s.
    Token(&'static str),
}

impl std::fmt::Display for FieldValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FieldValue::List(list) => f.write_str(list),
            FieldValue::Number(n) => f.write_str(itoa::Buffer::new().format(*n)),
            FieldValue::Token(token) => f.write_str(token),
        }
    }
}

impl From<FieldValue> for String {
    fn from(value: FieldValue) -> String {
        match value {
            FieldValue::List(list) => list,
            FieldValue::Number(n) => itoa::Buffer::new().format(n).to_owned(),
            FieldValue::Token(token) => token.to_owned(),
        }
    }
}

/// Hands each header of [`rate_limit_headers`] to `put`, as its name and
/// its value, for answers that are not an HTTP response's map: Envoy's
/// list of headers to add, the decision API's JSON. Each name comes once.
///
/// ```
/// use sluice_core::Decision;
/// use sluice_http::{RuleDecision, Verdict, each_rate_limit_header};
/// let v = Verdict {
///     allowed: false,
///     rules: vec![RuleDecision {
///         rule: "per-ip".into(),
///         key: "9:192.0.2.1".into(),
///         cost: 1.0,
///         decision: Decision { allowed: false, capacity: 10.0, remaining: 0, retry_after: Some(0.5), reset: 0.6 },
///         window: 1.0,
///         in_flight: false,
///     }],
///     deciding: Some(0),
///     retry_after: Some(0.5),
///     ..Verdict::default()
/// };
/// let mut fields = Vec::new();
/// each_rate_limit_header(&v, |name, value| fields.push(format!("{name}: {value}")));
/// assert_eq!(fields[0], r#"ratelimit-policy: "per-ip";q=10;w=1"#);
/// assert_eq!(fields[1], r#"ratelimit: "per-ip";r=0;t=1"#);
/// assert_eq!(fields.last().unwrap(), "retry-after: 1");
/// assert_eq!(fields.len(), 8);
/// ```
pub fn each_rate_limit_header(v: &Verdict, put: impl FnMut(&HeaderName, FieldValue)) {
    write_rate_limit_headers(v, &mut Owned(put));
}

/// The headers a verdict gets, each written to `out` once.
fn write_rate_limit_headers(v: &Verdict, out: &mut impl FieldSink) {
    if !v.rules.is_empty() {
        let hint = 32 * v.rules.len();
        out.list(&fields::POLICY, hint, |policy| {
            for (i, r) in v.rules.iter().enumerate() {
                if i > 0 {
                    policy.push_str(", ");
                }
                if r.in_flight {
                    // A quota of requests at once, over no window.
                    push_sf_string(policy, &r.rule);
                    push_param(policy, "q", whole(r.decision.capacity));
                    policy.push_str(";qu=\"concurrent-requests\"");
                } else {
                    push_item(
                        policy,
                        &r.rule,
                        ("q", whole(r.decision.capacity)),
                        ("w", whole_secs(r.window).max(1)),
                    );
                }
            }
        });
        out.list(&fields::RATELIMIT, hint, |current| {
            for (i, r) in v.rules.iter().enumerate() {
                if i > 0 {
                    current.push_str(", ");
                }
                push_item(
                    current,
                    &r.rule,
                    ("r", r.decision.remaining),
                    ("t", whole_secs(r.decision.reset)),
                );
            }
        });
    }
    if let Some(d) = v.deciding() {
        let limit = whole(d.decision.capacity);
        out.number(&fields::LIMIT, limit);
        out.number(&fields::REMAINING, d.decision.remaining);
        out.number(&fields::RESET, whole_secs(d.decision.reset));
        out.number(&fields::X_LIMIT, limit);
        out.number(&fields::X_REMAINING, d.decision.remaining);
    }
    if !v.allowed
        && let Some(secs) = retry_after(v)
    {
        out.number(&fields::RETRY_AFTER, secs);
    }
    if let Some(how) = v.without_store {
        out.token(&fields::DEGRADED, degraded(how));
    }
}

/// The `Retry-After` of a denial, if waiting can help.
fn retry_after(v: &Verdict) -> Option<u64> {
    match &v.refusal {
        // The limiter itself is unavailable: come back shortly.
        Some((_, Refusal::StoreFailed(_))) => Some(1),
        // Waiting never makes these pass.
        Some(_) => None,
        None => {
            let d = v.deciding()?;
            // The identity is `{rule}/{key}`.
            let identity = [d.rule.as_bytes(), b"/", d.key.as_bytes()];
            Some(jittered(v.retry_after?, identity))
        }
    }
}

pub(super) fn insert(h: &mut HeaderMap, name: HeaderName, value: String) {
    // Every value built here is ASCII without control characters.
    if let Ok(v) = HeaderValue::try_from(value) {
        h.insert(name, v);
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::Decision;

    use super::*;
    use sluice_engine::RuleDecision;

    fn rule(name: &str, remaining: u64, reset: f64) -> RuleDecision {
        RuleDecision {
            rule: name.into(),
            key: "k".into(),
            cost: 1.0,
            decision: Decision {
                allowed: remaining > 0,
                capacity: 10.0,
                remaining,
                retry_after: None,
                reset,
            },
            window: 2.5,
            in_flight: false,
        }
    }

    #[test]
    fn every_value_is_its_own_and_names_stay_well_formed_strings() {
        let v = Verdict {
            allowed: false,
            rules: vec![rule("a\"b\\c é\n", 4, 0.2), rule("second", 0, 7.5)],
            deciding: Some(1),
            retry_after: Some(7.5),
            ..Verdict::default()
        };
        let h = rate_limit_headers(&v);
        assert_eq!(
            h[RATELIMIT_POLICY],
            r#""a\"b\\c __";q=10;w=3, "second";q=10;w=3"#
        );
        assert_eq!(h[RATELIMIT], r#""a\"b\\c __";r=4;t=1, "second";r=0;t=8"#);
        assert_eq!(h[RATELIMIT_LIMIT], "10");
        assert_eq!(h[RATELIMIT_REMAINING], "0");
        assert_eq!(h[RATELIMIT_RESET], "8");
        assert_eq!(h[X_RATELIMIT_LIMIT], "10");
        assert_eq!(h[X_RATELIMIT_REMAINING], "0");
        let retry: u64 = h[RETRY_AFTER].to_str().unwrap().parse().unwrap();
        assert_eq!(retry, retry_after_secs(7.5, "second/k"));
        assert_eq!(h.len(), 8);
    }

    #[test]
    fn a_response_map_and_a_header_list_carry_the_same_fields() {
        let denied = Verdict {
            allowed: false,
            rules: vec![rule("a", 4, 0.2), rule("b", 0, 7.5)],
            deciding: Some(1),
            retry_after: Some(7.5),
            ..Verdict::default()
        };
        let store_failed = Verdict {
            allowed: false,
            refusal: Some(("a".into(), Refusal::StoreFailed("down".into()))),
            without_store: Some(OnStoreError::Closed),
            ..Verdict::default()
        };
        let allowed = Verdict {
            rules: vec![rule("a", 4, 0.2)],
            deciding: Some(0),
            ..Verdict::default()
        };
        let admitted_blind = Verdict {
            without_store: Some(OnStoreError::Open),
            ..allowed.clone()
        };
        for (v, fields) in [
            (denied, 8),
            (store_failed, 2),
            (allowed, 7),
            (admitted_blind, 8),
            (Verdict::default(), 0),
        ] {
            let mut listed = Vec::new();
            each_rate_limit_header(&v, |name, value| {
                listed.push((name.as_str().to_owned(), String::from(value)));
            });
            let mut mapped: Vec<(String, String)> = rate_limit_headers(&v)
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap().to_owned()))
                .collect();
            listed.sort();
            mapped.sort();
            assert_eq!(mapped, listed, "{v:?}");
            assert_eq!(listed.len(), fields, "{listed:?}");
        }
    }

    #[test]
    fn a_concurrency_rule_states_a_quota_of_concurrent_requests() {
        let uploads = RuleDecision {
            window: 0.0,
            in_flight: true,
            ..rule("uploads", 1, 30.0)
        };
        let v = Verdict {
            rules: vec![uploads, rule("per-ip", 9, 0.1)],
            deciding: Some(0),
            ..Verdict::default()
        };
        let h = rate_limit_headers(&v);
        assert_eq!(
            h[RATELIMIT_POLICY],
            r#""uploads";q=10;qu="concurrent-requests", "per-ip";q=10;w=3"#
        );
        assert_eq!(h[RATELIMIT], r#""uploads";r=1;t=30, "per-ip";r=9;t=1"#);
    }
}
