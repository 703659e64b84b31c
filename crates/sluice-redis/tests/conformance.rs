//! The store conformance suite (the same one the in-memory store passes) on a
//! real redis-server and on a real 3-master Redis Cluster, through the
//! `Store` trait, on a fake clock.
//!
//! The Redis store does not run the sliding window and the sliding log yet,
//! so the suite's sliding checks (`conformance::run_sliding`) are skipped
//! here on purpose; `sliding_limits_get_a_clear_error` checks what it says
//! instead.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use sluice_core::{
    FakeClock, Limit, Mode, Nanos, Op, SlidingLog, SlidingWindow, Store, StoreError, TokenBucket,
    conformance,
};
use sluice_redis::{RedisConfig, RedisStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_redis_conforms() {
    let server = support::RedisServer::start();
    let clock = FakeClock::new(Nanos(1_000 * Nanos::PER_SEC));
    // The suite checks what is decided, not how fast (the fault tests in
    // redis_behaviour.rs do): a stall of a shared machine must not turn a
    // call into a timeout here.
    let config = RedisConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(std::time::Duration::from_secs(2));
    let store = RedisStore::with_clock(config, clock.clone()).unwrap();
    // Not `run_all`: the sliding checks are skipped (see the top of the file).
    conformance::run_token_bucket_and_fixed_window(&store, &clock).await;
    assert_eq!(store.stats().errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_limits_get_a_clear_error() {
    let server = support::RedisServer::start();
    let store = RedisStore::new(RedisConfig::from_url(&server.url()).unwrap()).unwrap();
    let bucket = Limit::new("bucket", TokenBucket::new(1.0, 5.0).unwrap());
    let period = Nanos(Nanos::PER_SEC);
    let log = Limit::new("log", SlidingLog::per_period(5.0, period).unwrap());
    let window = Limit::new("window", SlidingWindow::per_period(5.0, period).unwrap());
    let unsupported = |e: StoreError, alg: &str| match e {
        StoreError::Unavailable(m) => {
            assert!(m.contains(alg) && m.contains("does not support"), "{m}");
        }
        other => panic!("expected a clear error, got {other:?}"),
    };
    for (l, alg) in [(&log, "sliding_log"), (&window, "sliding_window")] {
        let mixed = [Op::new(&bucket, "k", 1.0), Op::new(l, "k", 1.0)];
        unsupported(
            store.transact(&mixed, Mode::CONSUME).await.unwrap_err(),
            alg,
        );
        unsupported(store.value(l, "k").await.unwrap_err(), alg);
        unsupported(store.reset(l, "k").await.unwrap_err(), alg);
    }
    // Nothing of the refused transactions was spent.
    assert_eq!(store.value(&bucket, "k").await.unwrap().tokens, 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_conforms() {
    let cluster = support::RedisCluster::start(3);
    let seeds: Vec<String> = cluster
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!("redis+cluster://{}", seeds.join(","));
    let clock = FakeClock::new(Nanos(1_000 * Nanos::PER_SEC));
    // A cluster's first calls also discover its slots.
    let config = RedisConfig::from_url(&url)
        .unwrap()
        .with_timeout(std::time::Duration::from_secs(2));
    let store = RedisStore::with_clock(config, clock.clone()).unwrap();
    // Not `run_all`: the sliding checks are skipped (see the top of the file).
    conformance::run_token_bucket_and_fixed_window(&store, &clock).await;
    assert_eq!(store.stats().errors, 0);
}
