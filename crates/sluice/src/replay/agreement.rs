//! Replay and the middleware decide through the same engine, so the same
//! events on the same stopped clock get the same verdicts from both: every
//! field, shadow rules and failed store calls included.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};

use sluice_core::{
    Decision, FakeClock, Limit, MemoryStore, Mode, Nanos, Op, Outcome, Settle, Store, StoreError,
    Value,
};
use sluice_engine::{Enforcer, Refusal, Verdict};
use sluice_http::{PeerAddr, RateLimitLayer, rate_limit_headers};
use sluice_policy::{Policy, RequestParts};
use tower::{Layer, ServiceExt};

use super::line::Line;
use super::replayer::Replayer;

/// Every kind of decision the engine makes: a plain limit, one split into
/// hot-key shards, a shadow rule, a key part that must be present, a cost
/// that can exceed the burst, and rules that fail open and closed when the
/// store does; clients behind a trusted proxy.
const POLICY: &str = r#"
trusted_proxies: {cidrs: [10.0.0.0/8], header: x-forwarded-for}
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 3}
  - name: per-path-sharded
    limit_keys: [path]
    match: {path_prefix: /hot/}
    algorithm: token_bucket
    algorithm_config: {rps: 2, burst: 8, shards: 4}
  - name: trial
    mode: shadow
    limit_keys: [ip:address]
    algorithm: fixed_window
    algorithm_config: {rate: 2, period: 10}
  - name: trial-zone
    mode: shadow
    on_store_error: closed
    limit_keys: ["header:x-zone"]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
  - name: needs-tenant
    limit_keys: ["header:x-tenant"]
    match: {path_prefix: /tenant/}
    on_missing: deny
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 2}
  - name: by-cost
    limit_keys: [ip:address]
    match: {path_prefix: /bulk/}
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 5, cost_source: "header:x-cost", default_cost: 1}
  - name: region-open
    limit_keys: ["header:x-region"]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 2}
  - name: account-closed
    on_store_error: closed
    limit_keys: ["header:x-account"]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 2}
"#;

/// The in-memory store, except that a call with a key holding `down`
/// fails, as a store that has gone away does.
struct Flaky(MemoryStore<FakeClock>);

fn down(key: &str) -> bool {
    key.contains("down")
}

impl Store for Flaky {
    async fn transact(&self, ops: &[Op<'_>], mode: Mode) -> Result<Outcome, StoreError> {
        for op in ops {
            op.validate(mode.reserve)?;
        }
        if ops.iter().any(|op| down(op.key)) {
            return Err(StoreError::Unavailable("the store is down".into()));
        }
        self.0.transact(ops, mode).await
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        self.0.reset(limit, key).await
    }

    async fn value(&self, limit: &Limit, key: &str) -> Result<Value, StoreError> {
        self.0.value(limit, key).await
    }

    async fn settle(
        &self,
        limit: &Limit,
        key: &str,
        change: Settle,
    ) -> Result<Decision, StoreError> {
        if down(key) {
            return Err(StoreError::Unavailable("the store is down".into()));
        }
        self.0.settle(limit, key, change).await
    }

    async fn release(&self, limit: &Limit, key: &str, id: u64) -> Result<bool, StoreError> {
        if down(key) {
            return Err(StoreError::Unavailable("the store is down".into()));
        }
        self.0.release(limit, key, id).await
    }
}

/// An enforcer of the policy on a flaky store of its own, on a stopped
/// clock, its shard choices seeded alike.
fn enforcer() -> (Enforcer<Flaky>, FakeClock) {
    let clock = FakeClock::new(Nanos::ZERO);
    let store = Flaky(MemoryStore::with_clock(clock.clone()));
    let policy = Policy::from_str(POLICY, "policy.yaml").unwrap();
    (Enforcer::new(policy, store).with_seed(11), clock)
}

/// An event: time, peer, method, path and headers.
type Event = (
    f64,
    IpAddr,
    &'static str,
    &'static str,
    Vec<(&'static str, &'static str)>,
);

/// The events, in time order.
fn events() -> Vec<Event> {
    let client: IpAddr = [192, 0, 2, 1].into();
    let other: IpAddr = [192, 0, 2, 2].into();
    let proxy: IpAddr = [10, 0, 0, 5].into();
    let mut events = Vec::new();
    // A burst from one client: admitted, then denied; the shadow window
    // fills sooner and reports.
    for i in 0..5 {
        events.push((0.1 * f64::from(i), client, "GET", "/", vec![]));
    }
    // The same client behind the trusted proxy, and one who spoofs it.
    events.push((
        0.6,
        proxy,
        "GET",
        "/",
        vec![("x-forwarded-for", "192.0.2.1")],
    ));
    events.push((
        0.7,
        other,
        "GET",
        "/",
        vec![("x-forwarded-for", "192.0.2.9")],
    ));
    // A hot path split into shards.
    for i in 0..10 {
        events.push((
            1.0 + 0.01 * f64::from(i),
            other,
            "POST",
            "/hot/feed",
            vec![],
        ));
    }
    // A key part that must be there, there and not.
    events.push((2.0, other, "GET", "/tenant/a", vec![("x-tenant", "acme")]));
    events.push((2.1, other, "GET", "/tenant/a", vec![]));
    // Costs: within the burst, above it, and not a number.
    events.push((12.0, other, "PUT", "/bulk/x", vec![("x-cost", "4")]));
    events.push((12.1, other, "PUT", "/bulk/x", vec![("x-cost", "9")]));
    events.push((12.2, other, "PUT", "/bulk/x", vec![("x-cost", "lots")]));
    // The store fails: for a rule that fails open, one that fails closed,
    // and a shadow rule that fails closed.
    events.push((20.0, other, "GET", "/", vec![("x-region", "down-south")]));
    events.push((20.1, other, "GET", "/", vec![("x-account", "down-7")]));
    events.push((20.2, other, "GET", "/", vec![("x-zone", "down-a")]));
    events.push((20.3, other, "GET", "/", vec![("x-zone", "up-a")]));
    events.push((20.4, other, "GET", "/", vec![("x-zone", "up-a")]));
    // Time passes: tokens come back.
    events.push((30.0, client, "GET", "/", vec![("x-region", "north")]));
    events
}

fn parts(peer: IpAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> RequestParts {
    let mut req = RequestParts::new(method, path).with_ip(peer);
    for (n, v) in headers {
        req = req.with_header(*n, *v);
    }
    req
}

fn http_request(
    peer: IpAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> http::Request<()> {
    let mut req = http::Request::builder().method(method).uri(path);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let mut req = req.body(()).unwrap();
    req.extensions_mut()
        .insert(PeerAddr(SocketAddr::new(peer, 40_000)));
    req
}

#[tokio::test]
async fn replay_and_the_middleware_agree_on_every_field_of_every_decision() {
    let (replay_enforcer, replay_clock) = enforcer();
    let mut replayer = Replayer::with_enforcer(replay_enforcer, replay_clock);
    let (layer_enforcer, layer_clock) = enforcer();
    let service =
        RateLimitLayer::new(std::sync::Arc::new(layer_enforcer)).layer(tower::service_fn(
            |_: http::Request<()>| async { Ok::<_, Infallible>(http::Response::new(())) },
        ));

    let mut verdicts = Vec::new();
    for (i, (t, peer, method, path, headers)) in events().into_iter().enumerate() {
        replayer.set_time(t).await.unwrap();
        layer_clock.set(Nanos::from_secs_f64(t).unwrap());

        let req =
            parts(peer, method, path, &headers).with_client_behind(replayer.trusted_proxies());
        let replayed = replayer.request(&req, 0.0).await;

        let res = service
            .clone()
            .oneshot(http_request(peer, method, path, &headers))
            .await
            .unwrap();
        let served = res
            .extensions()
            .get::<Verdict>()
            .expect("the middleware hands on its verdict");
        assert_eq!(&replayed, served, "event {i} at t = {t}");
        // The headers a client sees follow from the verdict alone.
        for (name, value) in rate_limit_headers(&replayed).iter() {
            assert_eq!(res.headers().get(name), Some(value), "event {i}: {name}");
        }
        // And replay's line is told from the same verdict.
        let number = serde_json::Number::from_f64(t).unwrap();
        let line = Line::request(&number, &replayed, replayer.policy());
        assert_eq!(line.allowed, served.allowed, "event {i}");
        verdicts.push(replayed);
    }

    // Every kind of decision happened, so the agreement covers them all.
    let refused = |what: fn(&Refusal) -> bool| {
        verdicts
            .iter()
            .filter(|v| v.refusal.as_ref().is_some_and(|(_, r)| what(r)))
            .count()
    };
    assert!(verdicts.iter().any(|v| v.allowed && !v.rules.is_empty()));
    assert!(verdicts.iter().any(|v| !v.allowed && v.refusal.is_none()));
    assert!(
        verdicts
            .iter()
            .any(|v| v.shadow_denied().any(|r| r == "trial"))
    );
    assert!(
        verdicts
            .iter()
            .any(|v| v.rules.iter().any(|d| d.rule == "per-path-sharded"))
    );
    assert_eq!(refused(|r| matches!(r, Refusal::MissingKey)), 1);
    assert_eq!(refused(|r| matches!(r, Refusal::Cost(_))), 1);
    assert_eq!(refused(|r| matches!(r, Refusal::StoreFailed(_))), 1);
    // The rule that fails open admitted with nothing known remaining.
    assert!(verdicts.iter().any(|v| {
        v.allowed
            && v.rules
                .iter()
                .any(|d| d.rule == "region-open" && d.decision.remaining == 0)
    }));
    // The shadow rule that fails closed would have denied; up, it admits.
    let zone: Vec<bool> = verdicts
        .iter()
        .flat_map(|v| v.shadow.iter().filter(|s| s.rule == "trial-zone"))
        .map(|s| s.allowed)
        .collect();
    assert_eq!(zone, [false, true, false]);
}
