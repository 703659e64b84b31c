//! What a verdict tells the client: the IETF `RateLimit-Policy` and
//! `RateLimit` structured fields, the legacy `RateLimit-*` and
//! `X-RateLimit-*` fields, `Retry-After` with per-client jitter,
//! `Sluice-Degraded` on a decision made without the store, and the
//! problem-details body of a refusal.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, StatusCode};
use serde::Serialize;
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
///         decision: Decision { allowed: true, limit: 10.0, remaining: 7, retry_after: None, reset: 0.6 },
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
///         decision: Decision { allowed: true, limit: 10.0, remaining: 7, retry_after: None, reset: 0.6 },
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
///         decision: Decision { allowed: false, limit: 10.0, remaining: 0, retry_after: Some(0.5), reset: 0.6 },
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
                    push_param(policy, "q", whole(r.decision.limit));
                    policy.push_str(";qu=\"concurrent-requests\"");
                } else {
                    push_item(
                        policy,
                        &r.rule,
                        ("q", whole(r.decision.limit)),
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
        let limit = whole(d.decision.limit);
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

fn insert(h: &mut HeaderMap, name: HeaderName, value: String) {
    // Every value built here is ASCII without control characters.
    if let Ok(v) = HeaderValue::try_from(value) {
        h.insert(name, v);
    }
}

/// The problem type of a request refused for exceeding a quota, as the
/// IETF ratelimit-headers draft registers it.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// An RFC 9457 problem-details body: what every refusal of Sluice's carries,
/// whether a rate limit's, the decision API's or the proxy's.
///
/// ```
/// use http::StatusCode;
/// use sluice_http::Problem;
/// let body = Problem::new(StatusCode::NOT_FOUND, "no such endpoint").to_json();
/// let j: serde_json::Value = serde_json::from_slice(&body).unwrap();
/// assert_eq!((j["type"].as_str(), j["status"].as_u64()), (Some("about:blank"), Some(404)));
/// assert_eq!(j["title"], "Not Found");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(rename = "violated-policies", skip_serializing_if = "Vec::is_empty")]
    violated_policies: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<f64>,
}

impl Problem {
    /// A problem of no particular type (`about:blank`), titled by `status`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Problem {
        Problem {
            kind: "about:blank",
            title: status.canonical_reason().unwrap_or("Error"),
            status: status.as_u16(),
            detail: detail.into(),
            violated_policies: Vec::new(),
            rule: None,
            retry_after: None,
        }
    }

    /// The body as JSON: the bytes serde_json writes for the problem's
    /// `Serialize`.
    ///
    /// Every denial is answered with one. serde_json checks each byte of
    /// each string it writes for escapes, the field names and the constant
    /// type and title included, and that check was a noticeable share of a
    /// denied RLS call. So the fixed parts are written as they are, and a
    /// string goes through serde_json only when it holds something to
    /// escape. A property test holds the two equal.
    pub fn to_json(&self) -> Vec<u8> {
        // Room for a refusal's body at once, rather than growing to it.
        let mut out = Vec::with_capacity(256 + self.detail.len());
        out.extend_from_slice(b"{\"type\":");
        push_json_str(&mut out, self.kind);
        out.extend_from_slice(b",\"title\":");
        push_json_str(&mut out, self.title);
        out.extend_from_slice(b",\"status\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.status).as_bytes());
        out.extend_from_slice(b",\"detail\":");
        push_json_str(&mut out, &self.detail);
        if !self.violated_policies.is_empty() {
            out.extend_from_slice(b",\"violated-policies\":[");
            for (i, rule) in self.violated_policies.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                push_json_str(&mut out, rule);
            }
            out.push(b']');
        }
        if let Some(rule) = &self.rule {
            out.extend_from_slice(b",\"rule\":");
            push_json_str(&mut out, rule);
        }
        if let Some(secs) = self.retry_after {
            out.extend_from_slice(b",\"retry_after\":");
            // serde_json's own number format, `null` for NaN and infinities;
            // writing to a `Vec` cannot fail.
            let _ = serde_json::to_writer(&mut out, &secs);
        }
        out.push(b'}');
        out
    }

    /// The problem a denied request is answered with: [`denial`]'s body,
    /// before it is written out.
    ///
    /// ```
    /// use sluice_http::{Problem, Verdict};
    /// let v = Verdict { allowed: false, retry_after: Some(1.5), ..Verdict::default() };
    /// let p = Problem::denial(&v);
    /// assert_eq!(p.status(), 429);
    /// assert_eq!(p.detail(), "rate limit exceeded; retry in 1.500 s");
    /// ```
    pub fn denial(v: &Verdict) -> Problem {
        let (status, detail) = explain(v);
        let mut problem = Problem::new(status, detail);
        problem.rule = v.denied_by().map(str::to_owned);
        if v.refusal.is_none() {
            // Over quota: the draft's problem type, naming every rule that
            // denied.
            problem.kind = QUOTA_EXCEEDED;
            problem.violated_policies = v
                .rules
                .iter()
                .filter(|r| !r.decision.allowed)
                .map(|r| r.rule.clone())
                .collect();
            problem.retry_after = v.retry_after;
        }
        problem
    }

    /// Its HTTP status.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The sentence that says what happened.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

/// Appends `s` as a JSON string. One with no quote, backslash or control
/// character is copied as it is, which is how serde_json writes it too; any
/// other is written by serde_json, escapes and all.
fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // An OR over every byte, with no early exit and no branch, so that the
    // check runs over whole vectors of bytes at a time.
    let escapes = s.bytes().fold(0u8, |seen, b| {
        seen | u8::from(b < 0x20) | u8::from(b == b'"') | u8::from(b == b'\\')
    });
    if escapes == 0 {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing to a `Vec` cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// `application/problem+json`.
pub const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// The status and problem-details body of a denied request, with the
/// content type to send it under.
///
/// ```
/// use sluice_core::Decision;
/// use sluice_http::{RuleDecision, Verdict, denial};
/// let v = Verdict {
///     allowed: false,
///     rules: vec![RuleDecision {
///         rule: "per-ip".into(),
///         key: "k".into(),
///         cost: 1.0,
///         decision: Decision { allowed: false, limit: 1.0, remaining: 0, retry_after: Some(2.5), reset: 2.5 },
///         window: 1.0,
///         in_flight: false,
///     }],
///     deciding: Some(0),
///     retry_after: Some(2.5),
///     ..Verdict::default()
/// };
/// let (status, body) = denial(&v);
/// assert_eq!(status, 429);
/// let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
/// assert_eq!(body["rule"], "per-ip");
/// assert_eq!(body["retry_after"], 2.5);
/// assert_eq!(body["type"], "https://iana.org/assignments/http-problem-types#quota-exceeded");
/// assert_eq!(body["violated-policies"], serde_json::json!(["per-ip"]));
/// ```
pub fn denial(v: &Verdict) -> (StatusCode, Vec<u8>) {
    let problem = Problem::denial(v);
    (problem.status(), problem.to_json())
}

/// The HTTP status of a denial and a sentence on why.
fn explain(v: &Verdict) -> (StatusCode, String) {
    match &v.refusal {
        Some((_, Refusal::StoreFailed(e))) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the rate limiter could not decide ({e}) and the rule fails closed"),
        ),
        Some((_, Refusal::Cost(e))) => (
            StatusCode::BAD_REQUEST,
            format!("the request can never be admitted: {e}"),
        ),
        Some((_, Refusal::MissingKey)) => (
            StatusCode::TOO_MANY_REQUESTS,
            "the request lacks a part of the rule's key, and the rule denies such requests"
                .to_owned(),
        ),
        None => (
            StatusCode::TOO_MANY_REQUESTS,
            match v.retry_after {
                Some(s) => {
                    let mut detail = String::with_capacity(48);
                    detail.push_str("rate limit exceeded; retry in ");
                    push_secs(&mut detail, s);
                    detail.push_str(" s");
                    detail
                }
                None => "rate limit exceeded".to_owned(),
            },
        ),
    }
}

/// Appends `secs` with three decimals, exactly as `{secs:.3}` writes it.
/// Every denial says how long to wait, and the formatter's exact rounding
/// costs more than the rest of the sentence; a wait that is not within a
/// rounding error of a tie is rounded in integers instead.
fn push_secs(out: &mut String, secs: f64) {
    let millis = secs * 1000.0;
    // Below 1e9 ms the product is off the exact one by less than 1e-6 ms,
    // so a fraction further than 1e-3 from one half rounds the same way
    // whichever of the two is rounded. The sign test keeps `-0.000`, and
    // NaN fails every comparison.
    let fraction = millis - millis.floor();
    if secs.is_sign_positive() && millis < 1e9 && (fraction - 0.5).abs() > 1e-3 {
        let millis = millis.round() as u64;
        out.push_str(itoa::Buffer::new().format(millis / 1000));
        out.push('.');
        let rest = millis % 1000;
        for digit in [rest / 100, rest / 10 % 10, rest % 10] {
            out.push(char::from(b'0' + digit as u8));
        }
    } else {
        use std::fmt::Write;
        // Writing to a `String` cannot fail.
        let _ = write!(out, "{secs:.3}");
    }
}

/// The characters `grpc-message` must percent-encode: controls, `%` and
/// (always, in this crate) everything beyond ASCII.
const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

/// A denial as gRPC clients understand it: the status code and the
/// `grpc-message`. Rate limiting is `RESOURCE_EXHAUSTED` (8); a cost that
/// can never pass is `INVALID_ARGUMENT` (3); a store failure under a rule
/// that fails closed is `UNAVAILABLE` (14).
///
/// ```
/// use sluice_http::{Verdict, grpc_denial};
/// let v = Verdict { allowed: false, retry_after: Some(1.5), ..Verdict::default() };
/// let (code, message) = grpc_denial(&v);
/// assert_eq!(code, 8);
/// assert_eq!(message, "rate limit exceeded; retry in 1.500 s");
/// ```
pub fn grpc_denial(v: &Verdict) -> (u8, String) {
    let (status, detail) = explain(v);
    let code = match status {
        StatusCode::SERVICE_UNAVAILABLE => 14,
        StatusCode::BAD_REQUEST => 3,
        _ => 8,
    };
    let detail = match v.denied_by() {
        Some(rule) => format!("{detail} (rule {rule})"),
        None => detail,
    };
    (code, detail)
}

/// The response that answers a denied gRPC call: HTTP 200 with the status
/// in the headers (a "Trailers-Only" response), which every gRPC client
/// reads as the call's status.
pub(crate) fn grpc_denial_headers(v: &Verdict, h: &mut HeaderMap) {
    let (code, message) = grpc_denial(v);
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    let message = percent_encoding::utf8_percent_encode(&message, GRPC_MESSAGE).to_string();
    insert(h, GRPC_MESSAGE_HEADER, message);
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE_HEADER: HeaderName = HeaderName::from_static("grpc-message");

/// Whether `h` belongs to a gRPC call, which must be answered in gRPC's
/// terms rather than with an HTTP status and a JSON body.
pub(crate) fn is_grpc(h: &HeaderMap) -> bool {
    h.get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// Adds the content type of [`denial`]'s body.
pub(crate) fn set_problem_type(h: &mut HeaderMap) {
    h.insert(CONTENT_TYPE, PROBLEM_JSON);
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
                limit: 10.0,
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

    fn secs(s: f64) -> String {
        let mut out = String::new();
        push_secs(&mut out, s);
        out
    }

    #[test]
    fn waits_are_written_as_the_formatter_writes_them_even_at_ties() {
        for s in [
            0.0,
            -0.0,
            0.0005,
            0.0015,
            0.0025,
            1.0005,
            2.5e-4,
            0.1235,
            4.1234999,
            0.9995,
            0.99949999,
            999_999.999_5,
            1e6,
            1e12,
            123_456_789.012_5,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::INFINITY,
            f64::NAN,
            -1.5,
            5e-324,
        ] {
            assert_eq!(secs(s), format!("{s:.3}"), "{s:e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_wait_is_written_as_the_formatter_writes_it(
            s in proptest::prop_oneof![0.0..10.0f64, 0.0..1e7f64, proptest::num::f64::ANY],
        ) {
            proptest::prop_assert_eq!(secs(s), format!("{s:.3}"));
        }

        #[test]
        fn waits_next_to_a_tie_are_written_as_the_formatter_writes_them(
            millis in 0u64..10_000_000, ulps in -4i64..=4,
        ) {
            // The doubles closest to n + 0.5 ms, where rounding is decided
            // by the last bits.
            let tie = (millis as f64 + 0.5) / 1000.0;
            let s = f64::from_bits(tie.to_bits().wrapping_add_signed(ulps));
            proptest::prop_assert_eq!(secs(s), format!("{s:.3}"));
        }

        #[test]
        fn a_problem_writes_the_json_that_serde_writes_for_it(
            kind in proptest::sample::select(vec![
                "about:blank", QUOTA_EXCEEDED, "a \"quoted\" type\n",
            ]),
            title in proptest::sample::select(vec!["Too Many Requests", "tab\there", "é"]),
            status in proptest::num::u16::ANY,
            detail in ".*",
            violated_policies in proptest::collection::vec(
                proptest::prop_oneof!["[a-z-]{1,12}", ".*"], 0..3,
            ),
            rule in proptest::option::of(".*"),
            retry_after in proptest::option::of(proptest::prop_oneof![
                0.0..1e4f64, proptest::num::f64::ANY,
            ]),
        ) {
            let problem = Problem {
                kind, title, status, detail, violated_policies, rule, retry_after,
            };
            let serde = serde_json::to_vec(&problem).unwrap();
            proptest::prop_assert_eq!(
                String::from_utf8(problem.to_json()).unwrap(),
                String::from_utf8(serde).unwrap()
            );
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
