//! Keys as fat as a policy allows, on a real redis-server. Redis runs one
//! script at a time, and a script pays for every byte of a value it reads
//! or writes, so what one key may hold bounds what a call on it makes every
//! other caller of that Redis wait (docs/bounds.md, "One key never slows
//! the others").

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::time::Duration;

use sluice_core::sliding::MAX_LOG_ENTRIES;
use sluice_core::{
    Clock, Concurrency, FakeClock, Limit, MAX_SLOTS, Mode, Nanos, Op, SlidingLog, Store,
};
use sluice_redis::{RedisConfig, RedisStore};
use support::{RedisServer, command};

/// The most bytes a sliding log's or a concurrency key's value may take in
/// Redis: a concurrency key's 10-byte head and its leases of 24 bytes, one
/// a slot at most. docs/bounds.md states it.
const MOST_BYTES: usize = 10 + 24 * 1024;

fn strlen(server: &RedisServer, key: &str) -> usize {
    let reply = command(server.port(), &["STRLEN", key]).unwrap();
    reply.trim().trim_start_matches(':').parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_as_fat_as_a_policy_allows_stay_within_their_byte_bound() {
    let server = RedisServer::start();
    let clock = FakeClock::new(Nanos(1_000 * Nanos::PER_SEC));
    let config = RedisConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(Duration::from_secs(5));
    let store = RedisStore::with_clock(config, clock.clone()).unwrap();
    let hour = Nanos(3_600 * Nanos::PER_SEC);
    // Every slot the limit allows, each under a lease of its own; a log
    // whose rate lets each call be logged at a moment of its own, past the
    // entries a key keeps.
    let leases = Limit::new("fat-leases", Concurrency::new(MAX_SLOTS, hour).unwrap());
    let log = Limit::new("fat-log", SlidingLog::per_period(1e9, hour).unwrap());
    let ops = |limit| (0..MAX_SLOTS as usize + 100).map(move |_| Op::new(limit, "k", 1.0));
    for (lease, entry) in ops(&leases).zip(ops(&log)) {
        store.decide(lease, Mode::CONSUME).await.unwrap();
        assert!(store.decide(entry, Mode::CONSUME).await.unwrap().allowed);
        clock.advance(Duration::from_micros(1));
    }
    let value = store.value(&leases, "k").await.unwrap();
    assert_eq!(value.tokens, 0.0, "every slot is held");
    let value = store.value(&log, "k").await.unwrap();
    assert_eq!(value.tokens, 1e9 - (MAX_SLOTS + 100.0));
    let held = strlen(&server, "sluice:{k}:fat-leases");
    let logged = strlen(&server, "sluice:{k}:fat-log");
    assert_eq!(held, MOST_BYTES, "the concurrency key's value");
    assert_eq!(logged, 9 + 16 * MAX_LOG_ENTRIES, "the log's value");
    assert!(logged <= MOST_BYTES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_key_written_before_its_sum_was_kept_is_read_as_it_was() {
    let server = RedisServer::start();
    let clock = FakeClock::new(Nanos(1_000 * Nanos::PER_SEC));
    let store =
        RedisStore::with_clock(RedisConfig::from_url(&server.url()).unwrap(), clock.clone())
            .unwrap();
    let limit = Limit::new(
        "old-leases",
        Concurrency::new(5.0, Nanos(60 * Nanos::PER_SEC)).unwrap(),
    );
    // As earlier versions wrote it: a mark and the leases (taken at, in
    // the caller's nanoseconds; slots; id), without the slots' sum.
    let now = clock.now().0 as f64;
    let mut old = vec![5u8, 5];
    for (slots, id) in [(1.0f64, 11.0f64), (2.0, 22.0)] {
        for x in [now, slots, id] {
            old.extend(x.to_le_bytes());
        }
    }
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg("sluice:{k}:old-leases")
        .arg(old)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(store.value(&limit, "k").await.unwrap().tokens, 2.0);
    assert!(store.release(&limit, "k", 22).await.unwrap());
    assert_eq!(store.value(&limit, "k").await.unwrap().tokens, 4.0);
    let d = store
        .decide(Op::new(&limit, "k", 4.0), Mode::CONSUME)
        .await
        .unwrap();
    assert!(d.allowed);
    let d = store
        .decide(Op::new(&limit, "k", 1.0), Mode::CHECK)
        .await
        .unwrap();
    assert!(!d.allowed, "lease 11 and the new one hold every slot");
    // Written back with the sum: a 10-byte head and two leases.
    assert_eq!(strlen(&server, "sluice:{k}:old-leases"), 10 + 2 * 24);
}
