//! A store reconnects to a Redis that was killed (SIGKILL) and restarted on
//! its port while the store sat idle: the store's next calls are all
//! decided, none fails on the connection that died with the old process.
//! A call that was on that connection may have run, so it fails rather
//! than run twice; the calls after it wait for the new connection.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::time::Duration;

use std::time::Instant;

use sluice_core::{Limit, Mode, Op, Store, StoreError, TokenBucket};
use sluice_redis::{RedisConfig, RedisStore};
use support::{RedisCluster, RedisServer, ReplyDropper, one_node_cluster_announcing};

/// How long the store sits idle after Redis is back before it is called
/// again. The idleness is the condition under test (nothing has told the
/// store that its connection died), so this is a real wait, not a way to
/// let something finish; it outlasts the client's reconnect backoff and a
/// few health checks.
const IDLE: Duration = Duration::from_secs(1);

/// Calls after the restart, one after another, as the attack made them.
const CALLS: usize = 20;

/// The deadline of every call: far above the default 50 ms, so that a
/// stall of a loaded machine, or the first call's reload of the script into
/// the fresh Redis in a debug build, cannot fail a call (the property is
/// that no call fails, not how fast), and below the seconds a caller would
/// wait on a store that had to be noticed down first.
const DEADLINE: Duration = Duration::from_secs(1);

fn store(server: &RedisServer) -> RedisStore {
    let config = RedisConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(DEADLINE);
    RedisStore::new(config).unwrap()
}

fn limit() -> Limit {
    Limit::new("restart", TokenBucket::new(1_000.0, 1_000.0).unwrap())
}

/// Decides `keys` once each (a connection to every node they live on), and
/// panics if any call fails.
async fn decide_all(store: &RedisStore, limit: &Limit, keys: &[String]) {
    for key in keys {
        store
            .decide(Op::new(limit, key, 1.0), Mode::CONSUME)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
    }
}

/// Makes [`CALLS`] calls over `keys` in turn and returns every failure.
async fn failures(store: &RedisStore, limit: &Limit, keys: &[String]) -> Vec<String> {
    let mut failed = Vec::new();
    for i in 0..CALLS {
        let key = &keys[i % keys.len()];
        if let Err(e) = store.decide(Op::new(limit, key, 1.0), Mode::CONSUME).await {
            failed.push(format!("call {i} ({key}): {e}"));
        }
    }
    failed
}

/// Leaves `store` idle for [`IDLE`], then makes [`CALLS`] calls, every one
/// of which must be decided.
async fn idle_then_every_call_is_decided(store: &RedisStore, limit: &Limit, keys: &[String]) {
    tokio::time::sleep(IDLE).await;
    let failed = failures(store, limit, keys).await;
    assert!(
        failed.is_empty(),
        "{} of {CALLS} calls failed: {failed:#?}",
        failed.len()
    );
}

/// A server, and a store that has decided a call on it (so is connected),
/// with the limit and the keys to call.
async fn connected() -> (RedisServer, RedisStore, Limit, Vec<String>) {
    let server = RedisServer::start();
    let store = store(&server);
    let limit = limit();
    let keys = vec!["k".to_owned()];
    decide_all(&store, &limit, &keys).await;
    (server, store, limit, keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_store_decides_every_call_after_redis_restarts() {
    let (mut server, store, limit, keys) = connected().await;

    server.kill();
    server.restart();
    idle_then_every_call_is_decided(&store, &limit, &keys).await;
    assert!(store.is_ready());
}

/// Redis comes back before the store has noticed it was gone, so the first
/// call may be written to the dead connection: it fails (it cannot be told
/// from a call that ran), and every call after it is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_call_on_a_connection_lost_to_a_restart_fails() {
    let (mut server, store, limit, keys) = connected().await;

    server.restart();

    let failed = failures(&store, &limit, &keys).await;
    assert!(
        failed.is_empty() || (failed.len() == 1 && failed[0].starts_with("call 0 ")),
        "{} of {CALLS} calls failed: {failed:#?}",
        failed.len()
    );
}

/// Nothing calls the store, yet it finds out that Redis died, and that it
/// came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_store_stops_being_ready_when_redis_dies_and_is_ready_again_after() {
    let mut server = RedisServer::start();
    let store = store(&server);
    store.ping().await.unwrap();
    assert!(store.is_ready());

    server.kill();
    let killed = Instant::now();
    while store.is_ready() {
        assert!(
            killed.elapsed() < Duration::from_secs(2),
            "still ready 2 s after Redis died"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.restart();
    let back = Instant::now();
    while !store.is_ready() {
        assert!(
            back.elapsed() < Duration::from_secs(2),
            "not ready 2 s after Redis returned"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = store
        .decide(Op::new(&limit(), "k", 1.0), Mode::CONSUME)
        .await;
    assert!(r.is_ok(), "{:?}", r.map_err(|e: StoreError| e.to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_cluster_store_decides_every_call_after_a_node_restarts() {
    let mut cluster = RedisCluster::start(RedisCluster::DEFAULT_MASTERS);
    let config = RedisConfig::from_url(&cluster.url())
        .unwrap()
        .with_timeout(DEADLINE);
    let store = RedisStore::new(config).unwrap();
    let limit = limit();
    // Enough keys to land on every node, the restarted one included.
    let keys: Vec<String> = (0..CALLS).map(|i| format!("user-{i}")).collect();
    decide_all(&store, &limit, &keys).await;

    for node in cluster.nodes_mut() {
        node.kill();
        node.restart();
    }
    cluster.wait_healthy();
    idle_then_every_call_is_decided(&store, &limit, &keys).await;
}

/// A script call whose reply was lost with its connection may have run, so
/// it is never sent again: on a Cluster too, where the client would resend
/// it by itself. Each call spends a key's tokens at most once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_call_whose_reply_was_lost_is_not_run_again() {
    let (proxy, listener) = ReplyDropper::listen();
    let node = one_node_cluster_announcing(proxy.port());
    proxy.forward(listener, node.port());
    let url = format!("redis+cluster://127.0.0.1:{}", proxy.port());
    // A patient deadline: the call's fate here is the connection's, not
    // the clock's.
    let config = RedisConfig::from_url(&url)
        .unwrap()
        .with_timeout(Duration::from_secs(2))
        .with_deny_cache(0);
    let store = RedisStore::new(config).unwrap();
    // Two tokens, the next one an hour away.
    let limit = Limit::new("once", TokenBucket::new(1.0 / 3600.0, 2.0).unwrap());
    let call = || store.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME);
    // Loads the script, so that the call below is one EVALSHA.
    store
        .decide(Op::new(&limit, "warm-up", 1.0), Mode::CONSUME)
        .await
        .unwrap();

    proxy.arm();
    let lost = call().await;
    assert_eq!(proxy.dropped(), 1, "{lost:?}");
    assert!(
        lost.is_err(),
        "a call whose reply was lost was answered: {lost:?}"
    );
    // The script ran once: one token is left.
    let next = call().await.unwrap();
    assert!(next.allowed, "the lost call was run again");
    assert_eq!(next.remaining, 0);
}
