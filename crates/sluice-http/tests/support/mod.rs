//! The middleware tests' setup: an axum app behind the layer on a fake
//! clock, with a policy of IP, JWT, shadow and overlapping rules; requests
//! from a given peer; and signed tokens.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, Response, StatusCode};
use jsonwebtoken::{EncodingKey, Header, encode};
use sluice_core::{FakeClock, MemoryStore};
use sluice_http::{Enforcer, PeerAddr, RateLimitLayer};
use sluice_policy::Policy;
use tower::ServiceExt;

/// The HS256 secret of the policy's `jwt` key.
pub(crate) const SECRET: &str = "0123456789abcdef0123456789abcdef-test";

/// Rules for each thing the tests try: per address, per verified user, on a
/// claim, in shadow mode, and two on one path.
const POLICY: &str = r#"
trusted_proxies: [10.0.0.0/8]
jwt:
  keys:
    - {alg: HS256, secret: "0123456789abcdef0123456789abcdef-test"}
rules:
  - name: per-ip
    limit_keys: [ip:address]
    match: {path_prefix: /ip}
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 2}
  - name: per-user
    limit_keys: ["jwt:sub"]
    match: {path: /user}
    on_missing: deny
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
  - name: enterprise
    limit_keys: ["jwt:sub"]
    match: {path: /plan, "jwt:plan": enterprise}
    algorithm: fixed_window
    algorithm_config: {rate: 1, period: 60, start: 0}
  - name: shadow
    limit_keys: [ip:address]
    match: {path: /shadow}
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
    mode: shadow
  - name: tight
    limit_keys: [ip:address]
    match: {path: /both}
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 10, burst: 1}
  - name: loose
    limit_keys: [ip:address]
    match: {path: /both}
    algorithm: token_bucket
    algorithm_config: {rps: 5, burst: 5}
  - name: sliding
    limit_keys: [ip:address]
    match: {path: /sliding}
    algorithm: sliding_log
    algorithm_config: {rate: 2, period: 1m}
"#;

/// The app: `ok` to every GET that the policy lets through.
pub(crate) fn app(clock: &FakeClock) -> Router {
    let policy = Policy::from_str(POLICY, "policy.yaml").unwrap();
    let store = MemoryStore::with_clock(clock.clone());
    let enforcer = Arc::new(Enforcer::new(policy, store));
    Router::new()
        .fallback(get(|| async { "ok" }))
        .layer(RateLimitLayer::new(enforcer))
}

/// A GET of `path` from `peer`, port 5000, as the server would see it.
pub(crate) fn req(path: &str, peer: &str) -> http::request::Builder {
    let peer: SocketAddr = format!("{peer}:5000").parse().unwrap();
    let mut b = Request::builder().uri(path);
    if let Some(ext) = b.extensions_mut() {
        ext.insert(PeerAddr(peer));
    }
    b
}

/// Sends `r` with an empty body through `app`.
pub(crate) async fn send(app: &Router, r: http::request::Builder) -> Response<Body> {
    app.clone()
        .oneshot(r.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

/// The value of the header `name`, which the response must have.
pub(crate) fn header<'a>(res: &'a Response<Body>, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

/// A token of `claims`, signed with HS256 and `secret`.
pub(crate) fn token(claims: serde_json::Value, secret: &str) -> String {
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// An `exp` that no test reaches.
pub(crate) fn far() -> u64 {
    4_000_000_000
}

/// The statuses of three requests, the `i`th made by `make(i)`.
pub(crate) async fn three(
    app: &Router,
    make: impl Fn(usize) -> http::request::Builder,
) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for i in 0..3 {
        statuses.push(send(app, make(i)).await.status());
    }
    statuses
}
