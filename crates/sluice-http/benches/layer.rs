//! What [`RateLimitLayer`] adds to a request, next to the same service
//! without it, in the same run.
//!
//! Every benchmark is named `layer/{case}`:
//!
//! - `bare`: a `service_fn` that answers `200 ok`, called through
//!   `ServiceExt::oneshot` with a request as a server would hand it over
//!   (method, path, a few headers, the peer address);
//! - `allowed`: the same service behind the layer with one per-IP token
//!   bucket that admits everything, on the in-memory store: the key is
//!   read, decided, and the `RateLimit` headers are set;
//! - `denied`: the same, with a bucket that is empty after the warm-up: the
//!   layer answers the 429 problem itself;
//! - `unmatched`: the layer, with a rule whose `match` the request fails, so
//!   only the matching runs.
//!
//! Each call runs to completion on a current-thread Tokio runtime; the
//! futures involved never wait, so that costs the same on every side.

// A benchmark: setup failures should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response, StatusCode};
use sluice_core::MemoryStore;
use sluice_http::{Enforcer, PeerAddr, RateLimitLayer};
use sluice_policy::Policy;
use tower::{Layer, ServiceExt, service_fn};

fn request() -> Request<String> {
    let mut req = Request::builder()
        .method("GET")
        .uri("/api/items?page=2")
        .header("host", "api.example.test")
        .header("user-agent", "bench/1.0")
        .header("accept", "application/json")
        .body(String::new())
        .unwrap();
    let peer: SocketAddr = "203.0.113.7:50000".parse().unwrap();
    req.extensions_mut().insert(PeerAddr(peer));
    req
}

fn policy(rule: &str) -> Arc<Enforcer<MemoryStore>> {
    let policy = Policy::from_str(&format!("rules:\n{rule}"), "bench.yaml").unwrap();
    Arc::new(Enforcer::new(policy, MemoryStore::new()))
}

fn layer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let inner = service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    });
    let allowed = policy(
        "  - {name: per-ip, limit_keys: [ip:address], algorithm: token_bucket, \
         algorithm_config: {rps: 1000000000, burst: 1000000000}}",
    );
    let denied = policy(
        "  - {name: per-ip, limit_keys: [ip:address], algorithm: token_bucket, \
         algorithm_config: {rate: 1, period: 3600, burst: 1}}",
    );
    let unmatched = policy(
        "  - {name: admin, limit_keys: [ip:address], match: {path_prefix: /admin/}, \
         algorithm: token_bucket, algorithm_config: {rps: 1, burst: 1}}",
    );

    let mut group = c.benchmark_group("layer");
    group.bench_function("bare", |b| {
        b.iter(|| {
            let res = rt.block_on(inner.oneshot(black_box(request()))).unwrap();
            assert_eq!(res.status(), StatusCode::OK);
        });
    });
    for (name, enforcer, status) in [
        ("allowed", &allowed, StatusCode::OK),
        ("denied", &denied, StatusCode::TOO_MANY_REQUESTS),
        ("unmatched", &unmatched, StatusCode::OK),
    ] {
        let svc = RateLimitLayer::new(Arc::clone(enforcer)).layer(inner);
        // The warm-up call spends the denied case's only token.
        let _ = rt.block_on(svc.clone().oneshot(request())).unwrap();
        group.bench_function(name, |b| {
            b.iter(|| {
                let res = rt
                    .block_on(svc.clone().oneshot(black_box(request())))
                    .unwrap();
                assert_eq!(res.status(), status);
            });
        });
    }
    group.finish();
}

criterion_group!(benches, layer);
criterion_main!(benches);
