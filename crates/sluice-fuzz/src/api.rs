use axum::body::Body;
use http::{Method, Request, header};
use tower::ServiceExt;

use crate::service::{ADMIN_TOKEN, block_on, state};

/// The endpoints, chosen by the input's first byte: `'0'` is the first.
pub(crate) const ENDPOINTS: [(Method, &str); 8] = [
    (Method::POST, "/v1/limit"),
    (Method::POST, "/v1/check"),
    (Method::POST, "/v1/reset"),
    (Method::POST, "/v1/enforce"),
    (Method::GET, "/v1/value"),
    (Method::POST, "/v1/refund"),
    (Method::POST, "/v1/acquire"),
    (Method::POST, "/v1/release"),
];

/// Sends one request to the decision API of `sluice serve` ([`sluice_server::serve::app`]),
/// in process, over the fuzzing policy and an empty in-memory store, then the
/// same request again, which meets the state the first one left. The request
/// is a service's: JSON, with the admin token (which does whatever the API
/// token does); [`api_calls`](crate::api_calls) varies who calls.
///
/// The first byte picks the endpoint: `0` `/v1/limit`, `1` `/v1/check`, `2`
/// `/v1/reset` (with the admin token), `3` `/v1/enforce`, `4` `/v1/value`,
/// `5` `/v1/refund`, `6` `/v1/acquire`, `7` `/v1/release`; other bytes wrap
/// around. The rest is the JSON body, or for `/v1/value`
/// the query string (bytes a URI cannot hold are percent-encoded).
///
/// Checks that no request panics and that none is answered with a 5xx
/// status: every fault of a request must be a 4xx problem.
pub fn api(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (method, path) = &ENDPOINTS[usize::from(selector.wrapping_sub(b'0')) % ENDPOINTS.len()];
    let request = || {
        let builder = Request::builder().method(method.clone());
        let builder = if method == Method::GET {
            builder.uri(format!("{path}?{}", query(rest)))
        } else {
            builder
                .uri(*path)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}"))
        };
        let body = if method == Method::GET {
            Body::empty()
        } else {
            Body::from(rest.to_vec())
        };
        builder.body(body).expect("the request is well formed")
    };
    let app = sluice_server::serve::app(state());
    block_on(async {
        for _ in 0..2 {
            let Ok(response) = app.clone().oneshot(request()).await;
            let status = response.status();
            assert!(
                !status.is_server_error(),
                "{method} {path} answered {status} to {:?}",
                String::from_utf8_lossy(rest)
            );
        }
    });
}

/// `bytes` as a URI query: what RFC 3986 allows there is kept as it is,
/// `%` included so that malformed escapes reach the parser, and every other
/// byte is percent-encoded.
pub(crate) fn query(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        let allowed = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b);
        if allowed {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
