//! What a verdict tells the client: the IETF `RateLimit-Policy` and
//! `RateLimit` structured fields, the legacy `RateLimit-*` and
//! `X-RateLimit-*` fields, `Retry-After` with per-client jitter, and the
//! problem-details body of a refusal.

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, StatusCode};
use serde::Serialize;

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
    let mut digits = itoa::Buffer::new();
    push_sf_string(out, name);
    for (key, n) in [(a, x), (b, y)] {
        out.push(';');
        out.push_str(key);
        out.push('=');
        out.push_str(digits.format(n));
    }
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
    if !v.rules.is_empty() {
        // Only a limited request gets headers: the reservation is for them,
        // and a request no rule matched leaves the map untouched.
        h.reserve(8);
    }
    each_rate_limit_header(v, |name, value| {
        let value = match value {
            // Every list built here is ASCII without control characters;
            // it moves into the map without a copy.
            FieldValue::List(list) => match HeaderValue::try_from(list) {
                Ok(value) => value,
                Err(_) => return,
            },
            FieldValue::Number(n) => HeaderValue::from(n),
        };
        h.insert(name.clone(), value);
    });
}

/// The value of one RateLimit header, as [`each_rate_limit_header`] hands
/// it over: a structured-field list, built for it and owned, or a number,
/// to be written out however the answer writes numbers.
///
/// ```
/// use sluice_http::FieldValue;
/// assert_eq!(FieldValue::Number(7).to_string(), "7");
/// assert_eq!(String::from(FieldValue::List(r#""a";r=1;t=2"#.into())), r#""a";r=1;t=2"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    /// `RateLimit-Policy` or `RateLimit`: one item per rule.
    List(String),
    /// A count or a number of seconds.
    Number(u64),
}

impl std::fmt::Display for FieldValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FieldValue::List(list) => f.write_str(list),
            FieldValue::Number(n) => f.write_str(itoa::Buffer::new().format(*n)),
        }
    }
}

impl From<FieldValue> for String {
    fn from(value: FieldValue) -> String {
        match value {
            FieldValue::List(list) => list,
            FieldValue::Number(n) => itoa::Buffer::new().format(n).to_owned(),
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
pub fn each_rate_limit_header(v: &Verdict, mut put: impl FnMut(&HeaderName, FieldValue)) {
    // Every limited request gets these, so the lists are built without a
    // `String` per item.
    if !v.rules.is_empty() {
        let mut policy = String::with_capacity(32 * v.rules.len());
        let mut current = String::with_capacity(32 * v.rules.len());
        for (i, r) in v.rules.iter().enumerate() {
            if i > 0 {
                policy.push_str(", ");
                current.push_str(", ");
            }
            if r.in_flight {
                // A quota of requests at once, over no window.
                push_sf_string(&mut policy, &r.rule);
                policy.push_str(";q=");
                policy.push_str(itoa::Buffer::new().format(whole(r.decision.limit)));
                policy.push_str(";qu=\"concurrent-requests\"");
            } else {
                push_item(
                    &mut policy,
                    &r.rule,
                    ("q", whole(r.decision.limit)),
                    ("w", whole_secs(r.window).max(1)),
                );
            }
            push_item(
                &mut current,
                &r.rule,
                ("r", r.decision.remaining),
                ("t", whole_secs(r.decision.reset)),
            );
        }
        put(&RATELIMIT_POLICY, FieldValue::List(policy));
        put(&RATELIMIT, FieldValue::List(current));
    }
    if let Some(d) = v.deciding() {
        let limit = whole(d.decision.limit);
        put(&RATELIMIT_LIMIT, FieldValue::Number(limit));
        put(
            &RATELIMIT_REMAINING,
            FieldValue::Number(d.decision.remaining),
        );
        put(
            &RATELIMIT_RESET,
            FieldValue::Number(whole_secs(d.decision.reset)),
        );
        put(&X_RATELIMIT_LIMIT, FieldValue::Number(limit));
        put(
            &X_RATELIMIT_REMAINING,
            FieldValue::Number(d.decision.remaining),
        );
    }
    if !v.allowed
        && let Some(secs) = retry_after(v)
    {
        put(&RETRY_AFTER, FieldValue::Number(secs));
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

    /// The body as JSON.
    pub fn to_json(&self) -> Vec<u8> {
        // Room for a refusal's body at once, rather than growing to it.
        let mut body = Vec::with_capacity(256 + self.detail.len());
        // A struct of strings and numbers always serializes.
        match serde_json::to_writer(&mut body, self) {
            Ok(()) => body,
            Err(_) => Vec::new(),
        }
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
                Some(s) => format!("rate limit exceeded; retry in {s:.3} s"),
                None => "rate limit exceeded".to_owned(),
            },
        ),
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
