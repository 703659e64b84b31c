//! A Cluster store follows a slot that moves (MOVED) or is moving (ASK)
//! to another node, as the Cluster client does; the store sends the call
//! again itself, since a node that redirects it has not run it, and the
//! client sends nothing again on its own (it would after a lost reply too).

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::time::Duration;

use sluice_core::{Limit, Mode, Op, Store, TokenBucket};
use sluice_redis::{RedisConfig, RedisStore};
use support::{RedisCluster, command};

/// The key every test here calls, and the name Redis keeps its state under.
const KEY: &str = "user-1";
const STATE: &str = "sluice:{user-1}:moving";

fn limit() -> Limit {
    // Ten tokens, the next one an hour away: each call takes one for good.
    Limit::new("moving", TokenBucket::new(1.0 / 3600.0, 10.0).unwrap())
}

/// The cluster, a store on it that has read its slot map, and the ports
/// of the node holding [`KEY`]'s slot and of another one.
async fn connected() -> (RedisCluster, RedisStore, u16, u16) {
    let cluster = RedisCluster::start(RedisCluster::DEFAULT_MASTERS);
    let config = RedisConfig::from_url(&cluster.url())
        .unwrap()
        .with_timeout(Duration::from_secs(2))
        .with_deny_cache(0);
    let store = RedisStore::new(config).unwrap();
    store
        .decide(Op::new(&limit(), "warm-up", 1.0), Mode::CONSUME)
        .await
        .unwrap();
    let ports = cluster.ports();
    // Only the owner of a slot answers for its keys; the others redirect.
    let owner = *ports
        .iter()
        .find(|&&p| command(p, &["EXISTS", STATE]).unwrap().starts_with(':'))
        .unwrap();
    let other = *ports.iter().find(|&&p| p != owner).unwrap();
    (cluster, store, owner, other)
}

/// The second line of a reply: a bulk string's text, or a number's.
fn text(reply: &str) -> String {
    let mut lines = reply.lines();
    let first = lines.next().unwrap();
    match first.strip_prefix(':') {
        Some(n) => n.to_owned(),
        None => lines.next().unwrap_or_default().to_owned(),
    }
}

fn node_id(port: u16) -> String {
    text(&command(port, &["CLUSTER", "MYID"]).unwrap())
}

/// Starts moving [`STATE`]'s slot from `from` to `to`, as `redis-cli
/// --cluster reshard` does; returns the slot.
fn start_moving(from: u16, to: u16) -> String {
    let slot = text(&command(from, &["CLUSTER", "KEYSLOT", STATE]).unwrap());
    let ok = "+OK\r\n";
    let importing = command(
        to,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &node_id(from)],
    );
    assert_eq!(importing.unwrap(), ok);
    let migrating = command(
        from,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &node_id(to)],
    );
    assert_eq!(migrating.unwrap(), ok);
    slot
}

async fn decide(store: &RedisStore) -> sluice_core::Decision {
    store
        .decide(Op::new(&limit(), KEY, 1.0), Mode::CONSUME)
        .await
        .unwrap_or_else(|e| panic!("the call was not followed to the slot's new node: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_follows_its_slot_to_the_node_it_moved_to() {
    let (cluster, store, from, to) = connected().await;
    assert_eq!(decide(&store).await.remaining, 9);

    let slot = start_moving(from, to);
    let migrated = command(
        from,
        &[
            "MIGRATE",
            "127.0.0.1",
            &to.to_string(),
            "",
            "0",
            "5000",
            "KEYS",
            STATE,
        ],
    );
    assert_eq!(migrated.unwrap(), "+OK\r\n");
    let owner = node_id(to);
    for port in cluster.ports() {
        let set = command(port, &["CLUSTER", "SETSLOT", &slot, "NODE", &owner]);
        assert_eq!(set.unwrap(), "+OK\r\n");
    }

    // The old owner answers MOVED; the call is made once, on the new one.
    assert_eq!(decide(&store).await.remaining, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_a_key_not_yet_moved_follows_ask_to_the_importing_node() {
    let (_cluster, store, from, to) = connected().await;
    start_moving(from, to);

    // The key is on neither node yet: the owner answers ASK, and the
    // importing node decides the call after ASKING, as it would in full.
    assert_eq!(decide(&store).await.remaining, 9);
    assert_eq!(decide(&store).await.remaining, 8);
}
