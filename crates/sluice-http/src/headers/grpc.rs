//! A refused gRPC call: its status code and message, in the headers of a
//! Trailers-Only response.

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};

use sluice_engine::Verdict;

use super::insert;
use super::problem::explain;

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
