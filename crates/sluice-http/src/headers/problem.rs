//! The problem-details body (RFC 9457) of a refused request.

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, StatusCode};
use serde::Serialize;

use sluice_engine::{Refusal, Verdict};

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
    /// type and title included: about 3,500 instructions of a denied RLS
    /// call's 67,700, measured with callgrind (docs/performance.md, the
    /// RLS instruction counts). So the fixed parts are written as they are,
    /// and a string goes through serde_json only when it holds something
    /// to escape. A property test holds the two equal.
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
///         decision: Decision { allowed: false, capacity: 1.0, remaining: 0, retry_after: Some(2.5), reset: 2.5 },
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
pub(super) fn explain(v: &Verdict) -> (StatusCode, String) {
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

/// Adds the content type of [`denial`]'s body.
pub(crate) fn set_problem_type(h: &mut HeaderMap) {
    h.insert(CONTENT_TYPE, PROBLEM_JSON);
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
