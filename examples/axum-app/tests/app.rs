//! The example app through `oneshot`, on a stopped clock: what its clients
//! see as they run into each rule.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use sluice_core::{FakeClock, MemoryStore, Nanos};
use sluice_http::{Enforcer, PeerAddr};
use tower::ServiceExt;

fn app(clock: &FakeClock) -> axum::Router {
    let store = MemoryStore::with_clock(clock.clone());
    axum_app::app(Arc::new(Enforcer::new(axum_app::policy().unwrap(), store)))
}

fn get(uri: &str, from: &str) -> Request<Body> {
    let mut req = Request::get(uri).body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(PeerAddr(format!("{from}:50000").parse().unwrap()));
    req
}

#[tokio::test]
async fn each_address_gets_its_burst_then_429_with_retry_after() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    for left in (0..10).rev() {
        let res = app.clone().oneshot(get("/", "192.0.2.1")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["ratelimit-remaining"], left.to_string());
    }
    let res = app.clone().oneshot(get("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // 0.2 s to the next token, rounded up to 1 s; jitter adds at most 50%.
    assert_eq!(res.headers()["retry-after"], "1");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["rule"], "per-ip");
    // Another address is untouched, and time refills the first.
    let res = app.clone().oneshot(get("/", "192.0.2.2")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    clock.advance(Duration::from_millis(200));
    let res = app.clone().oneshot(get("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn searches_pay_their_declared_cost_per_key() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    let search = |cost: &str| {
        let mut req = get("/search", "192.0.2.9");
        req.headers_mut().insert("x-api-key", "k1".parse().unwrap());
        req.headers_mut()
            .insert("x-search-cost", cost.parse().unwrap());
        req
    };
    let res = app.clone().oneshot(search("50")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = app.clone().oneshot(search("20")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["rule"], "search-per-key");
    // A cost that is not a positive number falls back to 1.
    let res = app.clone().oneshot(search("-5")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // No key: refused, as the rule says.
    let res = app
        .clone()
        .oneshot(get("/search", "192.0.2.9"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_policy_built_in_code_limits_each_address_and_each_api_key() {
    let clock = FakeClock::new(Nanos::ZERO);
    let store = MemoryStore::with_clock(clock.clone());
    let enforcer = Arc::new(Enforcer::new(axum_app::policy_in_code().unwrap(), store));
    let app = axum_app::api().layer(sluice_http::RateLimitLayer::new(enforcer));
    let with_key = |key: &str, from: &str| {
        let mut req = get("/api/items", from);
        req.headers_mut().insert("x-api-key", key.parse().unwrap());
        req
    };
    // One API key from many addresses: 20 calls, then the key's rule denies.
    for i in 0..20 {
        let res = app
            .clone()
            .oneshot(with_key("k1", &format!("192.0.2.{i}")))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "call {i}");
    }
    let res = app
        .clone()
        .oneshot(with_key("k1", "192.0.2.99"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["rule"], "per-api-key");
    // Another key is untouched; outside /api/ no key is needed.
    let res = app
        .clone()
        .oneshot(with_key("k2", "192.0.2.99"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // One address: a burst of 50 (one already spent), then 429 from per-ip.
    for i in 1..50 {
        let res = app.clone().oneshot(get("/", "192.0.2.99")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
    }
    let res = app.clone().oneshot(get("/", "192.0.2.99")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["rule"], "per-ip");
    // At 20 a second, 50 ms brings one token back.
    clock.advance(Duration::from_millis(50));
    let res = app.clone().oneshot(get("/", "192.0.2.99")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}
