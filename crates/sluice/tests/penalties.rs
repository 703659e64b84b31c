//! Penalties, through the one engine every front end decides with, on the
//! in-memory store, a real redis-server and a real 3-master Cluster, all on
//! one fake clock: a key denied by a rule or limit with a `penalty` is
//! denied outright for exactly that long, to the nanosecond.

#![allow(clippy::unwrap_used, clippy::panic)]

#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis;

use std::time::Duration;

use sluice_core::{Decision, FakeClock, MemoryStore, Mode, Nanos, Store};
use sluice_engine::Enforcer;
use sluice_policy::{Policy, RequestParts};
use sluice_redis::{RedisConfig, RedisStore};

const S: u64 = 1_000_000_000;

const POLICY: &str = "
limits:
  login:
    algorithm: token_bucket
    algorithm_config: {rate: 60, period: 1m, burst: 3}
    penalty: 10s
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: fixed_window
    algorithm_config: {rate: 2, period: 1s, start: 0}
    penalty: 10s
";

fn at(clock: &FakeClock, ns: u64) {
    clock.set(Nanos(i64::try_from(ns).unwrap()));
}

/// Every check, on `store` reading `clock`.
async fn penalties_hold_exactly<S: Store + 'static>(store: S, clock: &FakeClock) {
    let enforcer = Enforcer::new(Policy::from_str(POLICY, "policy.yaml").unwrap(), store);
    let policy = enforcer.policy();
    let login = policy.named_limit("login").unwrap();
    let call = |key: &'static str, mode: Mode| {
        let enforcer = &enforcer;
        async move {
            enforcer
                .decide_named(login, key, 1.0, mode)
                .await
                .unwrap()
                .decision
        }
    };
    let t0 = 1_000 * S;
    at(clock, t0);
    for _ in 0..3 {
        assert!(call("mallory", Mode::CONSUME).await.allowed);
    }
    // The limit alone would admit the next call in a second; the penalty
    // holds it for ten.
    let d = call("mallory", Mode::CONSUME).await;
    assert_eq!(
        (d.allowed, d.retry_after, d.remaining),
        (false, Some(10.0), 0)
    );
    // A denial while serving it does not lengthen it.
    at(clock, t0 + 5 * S);
    assert_eq!(call("mallory", Mode::CONSUME).await.retry_after, Some(5.0));
    at(clock, t0 + 10 * S - S / 1000);
    let d: Decision = call("mallory", Mode::CONSUME).await;
    let left = d.retry_after.unwrap();
    assert!(!d.allowed && (left - 0.001).abs() < 1e-9, "{d:?}");
    at(clock, t0 + 10 * S - 1);
    assert!(!call("mallory", Mode::CONSUME).await.allowed);
    at(clock, t0 + 10 * S);
    let d = call("mallory", Mode::CONSUME).await;
    assert!(d.allowed, "the penalty is over at exactly 10 s: {d:?}");
    assert_eq!(d.remaining, 2, "the bucket refilled meanwhile");

    // A check that would be denied starts no penalty.
    for _ in 0..3 {
        assert!(call("alice", Mode::CONSUME).await.allowed);
    }
    let d = call("alice", Mode::CHECK).await;
    assert_eq!((d.allowed, d.retry_after), (false, Some(1.0)));
    at(clock, t0 + 11 * S);
    assert!(call("alice", Mode::CONSUME).await.allowed);

    // A rule's penalty, through a request.
    let req = RequestParts::new("GET", "/").with_ip([192, 0, 2, 7].into());
    let t1 = 2_000 * S;
    at(clock, t1);
    assert!(enforcer.enforce_with(&policy, &req).await.allowed);
    assert!(enforcer.enforce_with(&policy, &req).await.allowed);
    let v = enforcer.enforce_with(&policy, &req).await;
    assert_eq!((v.allowed, v.retry_after), (false, Some(10.0)));
    // The window opened again at t1 + 1 s, but the penalty holds.
    at(clock, t1 + 3 * S);
    let v = enforcer.enforce_with(&policy, &req).await;
    assert_eq!((v.allowed, v.retry_after), (false, Some(7.0)));
    at(clock, t1 + 10 * S);
    assert!(enforcer.enforce_with(&policy, &req).await.allowed);

    // Denials that land together start one penalty, not one each.
    at(clock, t1 + 40 * S);
    for _ in 0..3 {
        call("eve", Mode::CONSUME).await;
    }
    let (a, b, c) = tokio::join!(
        call("eve", Mode::CONSUME),
        call("eve", Mode::CONSUME),
        call("eve", Mode::CONSUME)
    );
    for d in [a, b, c] {
        assert_eq!((d.allowed, d.retry_after), (false, Some(10.0)), "{d:?}");
    }
    at(clock, t1 + 50 * S);
    assert!(call("eve", Mode::CONSUME).await.allowed);

    // A reset lets a key off its penalty.
    at(clock, t1 + 20 * S);
    for _ in 0..3 {
        call("bob", Mode::CONSUME).await;
    }
    assert!(!call("bob", Mode::CONSUME).await.allowed);
    enforcer.reset_named(login, "bob").await.unwrap();
    assert!(call("bob", Mode::CONSUME).await.allowed);
}

#[tokio::test]
async fn a_penalty_holds_for_exactly_its_length_in_memory() {
    let clock = FakeClock::new(Nanos::ZERO);
    penalties_hold_exactly(MemoryStore::with_clock(clock.clone()), &clock).await;
}

fn config(url: &str) -> RedisConfig {
    RedisConfig::from_url(url)
        .unwrap()
        .with_timeout(Duration::from_secs(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_holds_for_exactly_its_length_on_redis() {
    let server = redis::RedisServer::start();
    let clock = FakeClock::new(Nanos::ZERO);
    let store = RedisStore::with_clock(config(&server.url()), clock.clone()).unwrap();
    penalties_hold_exactly(store, &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_holds_for_exactly_its_length_on_a_redis_cluster() {
    let cluster = redis::RedisCluster::start(redis::RedisCluster::DEFAULT_MASTERS);
    let seeds: Vec<String> = cluster
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let clock = FakeClock::new(Nanos::ZERO);
    let url = format!("redis+cluster://{}", seeds.join(","));
    let store = RedisStore::with_clock(config(&url), clock.clone()).unwrap();
    penalties_hold_exactly(store, &clock).await;
}
