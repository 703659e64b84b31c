//! Resets and refunds reach every server's deny cache, on a real
//! redis-server and a real 3-master Cluster: a store that denies a key
//! locally admits it again soon after another store resets it or refunds
//! tokens to it; a store that is not subscribed to reset
//! announcements (Redis down, or no permission on the channel) never denies
//! locally; and the subscriber goes away with its store.
//!
//! Every limit here refills one token in over 15 minutes, so a bound learned
//! before a reset cannot refill during a test: only the announcement can
//! make a store admit again.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::future::Future;
use std::time::{Duration, Instant};

use sluice_core::{Limit, Mode, Op, Settle, Store, TokenBucket};
use sluice_redis::{RedisConfig, RedisStats, RedisStore};
use support::{RedisCluster, RedisServer, command};

/// How long anything awaited here may take: generous, since the machine may
/// be busy, but every wait ends as soon as its condition holds.
const PATIENCE: Duration = Duration::from_secs(10);

fn slow_limit(name: &str) -> Limit {
    Limit::new(name, TokenBucket::new(0.001, 3.0).unwrap())
}

fn config(url: &str) -> RedisConfig {
    // A cluster's first calls also discover its slots; the machine is shared.
    RedisConfig::from_url(url)
        .unwrap()
        .with_timeout(Duration::from_secs(2))
}

/// Polls `cond` every few milliseconds until it holds, failing after
/// [`PATIENCE`] with `what`.
async fn eventually<F: Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let start = Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < PATIENCE,
            "not within {PATIENCE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Consumes from `key` until the store denies it locally (it must first
/// subscribe, then learn the bound from a denial by Redis). Returns the
/// stats from just before the first local denial and just after.
async fn drain_until_local_denial(
    store: &RedisStore,
    limit: &Limit,
    key: &str,
) -> (RedisStats, RedisStats) {
    let start = Instant::now();
    loop {
        let before = store.stats();
        let d = store
            .decide(Op::new(limit, key, 1.0), Mode::CONSUME)
            .await
            .unwrap();
        let after = store.stats();
        if after.local_denials > before.local_denials {
            assert!(!d.allowed);
            return (before, after);
        }
        assert!(
            start.elapsed() < PATIENCE,
            "no local denial within {PATIENCE:?}: {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Decides on `key` until it is allowed, which only a reset can bring about.
async fn admitted_again(store: &RedisStore, limit: &Limit, key: &str) {
    eventually("the key is admitted again after a reset", || async {
        store
            .decide(Op::new(limit, key, 1.0), Mode::CONSUME)
            .await
            .unwrap()
            .allowed
    })
    .await;
}

/// How another store gives a key its tokens back.
#[derive(Debug, Clone, Copy)]
enum Refill {
    Reset,
    Refund,
}

/// `store` denies `key` locally; `other` resets it or refunds a token to
/// it; `store` admits it again, having applied the announcement.
async fn refill_elsewhere_reaches(
    store: &RedisStore,
    other: &RedisStore,
    limit: &Limit,
    key: &str,
    how: Refill,
) {
    drain_until_local_denial(store, limit, key).await;
    let invalidations = store.stats().invalidations;
    // Without the announcement the store would deny locally for 15 minutes.
    assert!(
        !store
            .decide(Op::new(limit, key, 1.0), Mode::CONSUME)
            .await
            .unwrap()
            .allowed
    );
    match how {
        Refill::Reset => other.reset(limit, key).await.unwrap(),
        Refill::Refund => {
            let d = other.settle(limit, key, Settle::Refund(1.0)).await.unwrap();
            assert_eq!(d.remaining, 1, "{d:?}");
        }
    }
    admitted_again(store, limit, key).await;
    assert!(store.stats().invalidations > invalidations, "{how:?}");
}

async fn reset_elsewhere_reaches(
    store: &RedisStore,
    resetter: &RedisStore,
    limit: &Limit,
    key: &str,
) {
    refill_elsewhere_reaches(store, resetter, limit, key, Refill::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_by_another_store_reaches_the_deny_cache() {
    let server = RedisServer::start();
    let a = RedisStore::new(config(&server.url())).unwrap();
    let b = RedisStore::new(config(&server.url())).unwrap();
    // Another process resetting keys need not have a deny cache itself.
    let c = RedisStore::new(config(&server.url()).with_deny_cache(0)).unwrap();
    let limit = slow_limit("slow");

    reset_elsewhere_reaches(&a, &b, &limit, "user-1").await;
    reset_elsewhere_reaches(&a, &c, &limit, "user-1").await;
    // A reset of another key (or another limit) leaves this one's bound.
    drain_until_local_denial(&a, &limit, "user-1").await;
    b.reset(&limit, "user-2").await.unwrap();
    b.reset(&slow_limit("other"), "user-1").await.unwrap();
    eventually("both announcements applied", || async {
        a.stats().invalidations >= 4
    })
    .await;
    let before = a.stats().local_denials;
    let d = a
        .decide(Op::new(&limit, "user-1", 1.0), Mode::CONSUME)
        .await
        .unwrap();
    assert!(!d.allowed);
    assert_eq!(a.stats().local_denials, before + 1);
    let stats = a.stats();
    assert_eq!(stats.subscribes, 1, "{stats:?}");
    assert_eq!(stats.subscription_losses, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_reaches_stores_subscribed_to_other_cluster_nodes() {
    let cluster = RedisCluster::start(RedisCluster::DEFAULT_MASTERS);
    let url = cluster.url();
    let a = RedisStore::new(config(&url)).unwrap();
    let b = RedisStore::new(config(&url)).unwrap();
    let limit = slow_limit("slow");
    eventually("both stores subscribed", || async {
        a.stats().subscribes == 1 && b.stats().subscribes == 1
    })
    .await;

    // A key that lives on a node neither store subscribes to, so the
    // announcement must cross the cluster bus (PUBSUB NUMSUB is per node).
    let ports = cluster.ports();
    let numsub = |port: u16| {
        let reply = command(port, &["PUBSUB", "NUMSUB", "sluice:resets"]).unwrap();
        reply
            .trim_end()
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<u32>()
            .unwrap()
    };
    let subscribed_to: Vec<u16> = ports.iter().copied().filter(|&p| numsub(p) > 0).collect();
    assert!(
        !subscribed_to.is_empty() && subscribed_to.len() < ports.len(),
        "{subscribed_to:?}"
    );
    // Only the owner of a key's slot answers for it; the others redirect.
    let on_subscribed_node = |k: &str| {
        let name = format!("sluice:{{{k}}}:slow");
        let owner = ports
            .iter()
            .copied()
            .find(|&p| command(p, &["EXISTS", &name]).unwrap().starts_with(':'))
            .unwrap();
        subscribed_to.contains(&owner)
    };
    let key = (0..)
        .map(|i| format!("user-{i}"))
        .find(|k| !on_subscribed_node(k))
        .unwrap();
    reset_elsewhere_reaches(&a, &b, &limit, &key).await;
    // And a key on a subscribed node.
    let local_key = (0..)
        .map(|i| format!("user-{i}"))
        .find(|k| on_subscribed_node(k))
        .unwrap();
    reset_elsewhere_reaches(&a, &b, &limit, &local_key).await;
    // A refund is announced the same way, across the bus too.
    refill_elsewhere_reaches(&a, &b, &limit, &key, Refill::Refund).await;
    assert_eq!(a.stats().errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_by_another_store_reaches_the_deny_cache() {
    let server = RedisServer::start();
    let a = RedisStore::new(config(&server.url())).unwrap();
    let b = RedisStore::new(config(&server.url())).unwrap();
    let limit = slow_limit("slow");
    refill_elsewhere_reaches(&a, &b, &limit, "user-1", Refill::Refund).await;
    // A forced charge takes tokens, so it leaves every bound true, and the
    // store goes on denying locally without being told anything.
    let before = a.stats();
    b.settle(&limit, "user-1", Settle::Charge(1.0))
        .await
        .unwrap();
    let (_, after) = drain_until_local_denial(&a, &limit, "user-1").await;
    assert_eq!(after.invalidations, before.invalidations, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_local_denials_while_not_subscribed_and_a_clear_cache_after() {
    let mut server = RedisServer::start();
    let a = RedisStore::new(config(&server.url())).unwrap();
    let limit = slow_limit("slow");
    drain_until_local_denial(&a, &limit, "user-1").await;

    // Redis dies, taking the subscription with it: from the moment the store
    // knows, it no longer trusts its bounds, so it asks (the dead) Redis.
    server.kill();
    eventually("the subscription is seen lost", || async {
        a.stats().subscription_losses == 1
    })
    .await;
    let before = a.stats();
    let r = a
        .decide(Op::new(&limit, "user-1", 1.0), Mode::CONSUME)
        .await;
    assert!(r.is_err(), "{r:?}");
    assert_eq!(a.stats().local_denials, before.local_denials);

    // Redis comes back empty: as if the key had been reset while nobody
    // listened. Whether or not the store has re-subscribed yet, it must ask
    // Redis, which admits.
    server.restart();
    eventually("the key is admitted by the restarted Redis", || async {
        match a
            .decide(Op::new(&limit, "user-1", 1.0), Mode::CONSUME)
            .await
        {
            Ok(d) => {
                assert!(d.allowed, "denied by a bound from before the outage");
                true
            }
            Err(_) => false,
        }
    })
    .await;
    assert_eq!(a.stats().local_denials, before.local_denials);
    eventually("re-subscribed", || async { a.stats().subscribes == 2 }).await;
    // Subscribed again, the cache works again.
    drain_until_local_denial(&a, &limit, "user-1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_subscribe_never_denies_locally() {
    let server = RedisServer::start();
    // A user with every command but no pub/sub channel.
    let reply = command(
        server.port(),
        &[
            "ACL",
            "SETUSER",
            "nosub",
            "on",
            ">secret",
            "~*",
            "+@all",
            "resetchannels",
        ],
    )
    .unwrap();
    assert_eq!(reply, "+OK\r\n");
    let url = format!("redis://nosub:secret@127.0.0.1:{}/", server.port());
    let a = RedisStore::new(config(&url)).unwrap();
    let limit = slow_limit("slow");
    for _ in 0..20 {
        a.decide(Op::new(&limit, "user-1", 1.0), Mode::CONSUME)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = a.stats();
    assert_eq!(stats.local_denials, 0, "{stats:?}");
    assert_eq!(stats.remote, 20, "{stats:?}");
    assert_eq!(stats.subscribes, 0, "{stats:?}");

    // It can still reset (the key is gone), though it cannot announce it.
    a.reset(&limit, "user-1").await.unwrap();
    let exists = command(server.port(), &["EXISTS", "sluice:{user-1}:slow"]).unwrap();
    assert_eq!(exists, ":0\r\n");
}

#[test]
fn the_subscriber_goes_away_with_its_store() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let metrics = rt.metrics();
    rt.block_on(async {
        let numsub = || command(server.port(), &["PUBSUB", "NUMSUB", "sluice:resets"]).unwrap();
        let a = RedisStore::new(config(&server.url())).unwrap();
        eventually("subscribed", || async { a.stats().subscribes == 1 }).await;
        assert!(numsub().ends_with(":1\r\n"), "{}", numsub());
        drop(a);
        eventually("the subscription is closed", || async {
            numsub().ends_with(":0\r\n")
        })
        .await;

        // Also while Redis is unreachable (the subscriber waiting to retry).
        let dead = format!("redis://127.0.0.1:{}/", support::free_port());
        let b = RedisStore::new(config(&dead)).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(b);
    });
    // Every task the stores started ends: nothing is left running.
    let start = Instant::now();
    while metrics.num_alive_tasks() > 0 {
        assert!(
            start.elapsed() < PATIENCE,
            "{} tasks still alive",
            metrics.num_alive_tasks()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
