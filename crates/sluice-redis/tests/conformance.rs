//! The store conformance suite (the same one the in-memory store passes) on a
//! real redis-server and on a real 3-master Redis Cluster, through the
//! `Store` trait, on a fake clock: every algorithm, the sliding ones
//! included.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use sluice_core::{FakeClock, Nanos, conformance};
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
    conformance::run_all(&store, &clock).await;
    assert_eq!(store.stats().errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_conforms() {
    let cluster = support::RedisCluster::start(3);
    let url = cluster.url();
    let clock = FakeClock::new(Nanos(1_000 * Nanos::PER_SEC));
    // A cluster's first calls also discover its slots.
    let config = RedisConfig::from_url(&url)
        .unwrap()
        .with_timeout(std::time::Duration::from_secs(2));
    let store = RedisStore::with_clock(config, clock.clone()).unwrap();
    conformance::run_all(&store, &clock).await;
    assert_eq!(store.stats().errors, 0);
}
