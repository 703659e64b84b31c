//! The Redis store on a real redis-server, on Redis's own clock: keys expire
//! when their bucket is full again, every key has a TTL, a killed Redis
//! gives prompt fail-open or fail-closed answers, and decisions resume soon
//! after it returns.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::{Limit, Mode, OnError, Op, Store, TokenBucket};
use sluice_redis::{RedisConfig, RedisStore};
use support::{RedisServer, command};

/// The tests here time answers against a deadline, so they run one at a
/// time: on a small machine the others' load would be what they measure.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn store(server: &RedisServer) -> RedisStore {
    RedisStore::new(RedisConfig::from_url(&server.url()).unwrap()).unwrap()
}

fn int_reply(reply: &str) -> i64 {
    reply.trim().trim_start_matches(':').parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_when_full_again_and_always_have_a_ttl() {
    let _alone = ALONE.lock().await;
    let server = RedisServer::start();
    let store = store(&server);
    // 2 tokens a second, burst 10: 4 taken refill in 2 s.
    let limit = Limit::new("ttl", TokenBucket::new(2.0, 10.0).unwrap());
    let d = store
        .decide(Op::new(&limit, "u1", 4.0), Mode::CONSUME)
        .await
        .unwrap();
    assert!(d.allowed);
    let pttl = int_reply(&command(server.port(), &["PTTL", "sluice:{u1}:ttl"]).unwrap());
    assert!(
        (1_900..=2_002).contains(&pttl),
        "PTTL {pttl} ms, refill takes 2000 ms"
    );

    // A reservation deep below zero lives until it is paid back and refilled.
    let deep = Limit::new("deep", TokenBucket::new(1.0, 5.0).unwrap());
    let d = store
        .decide(Op::new(&deep, "u1", 15.0), Mode::RESERVE)
        .await
        .unwrap();
    assert!(d.allowed);
    let pttl = int_reply(&command(server.port(), &["PTTL", "sluice:{u1}:deep"]).unwrap());
    assert!(
        (14_900..=15_002).contains(&pttl),
        "PTTL {pttl} ms, refill takes 15 s"
    );

    // A check writes nothing; a bucket that is full again is not held.
    let d = store
        .decide(Op::new(&limit, "u2", 1.0), Mode::CHECK)
        .await
        .unwrap();
    assert!(d.allowed);
    let exists = command(server.port(), &["EXISTS", "sluice:{u2}:ttl"]).unwrap();
    assert_eq!(int_reply(&exists), 0);

    // Many keys, several limits and a transaction: none without a TTL.
    let other = Limit::new("other", TokenBucket::new(0.1, 3.0).unwrap());
    for i in 0..50 {
        let key = format!("k{i}");
        let ops = [Op::new(&limit, &key, 1.0), Op::new(&other, &key, 2.0)];
        assert!(store.transact(&ops, Mode::CONSUME).await.unwrap().allowed);
    }
    let keys = command(server.port(), &["KEYS", "sluice:*"]).unwrap();
    let names: Vec<&str> = keys.lines().filter(|l| l.starts_with("sluice:")).collect();
    assert!(names.len() >= 100, "{} keys", names.len());
    for name in names {
        let pttl = int_reply(&command(server.port(), &["PTTL", name]).unwrap());
        assert!(pttl > 0, "{name} has PTTL {pttl}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_that_refills_over_millennia_still_gets_a_ttl() {
    let _alone = ALONE.lock().await;
    let server = RedisServer::start();
    let store = store(&server);
    // A token every 10^14 s: the one taken refills in about 3 million
    // years, a TTL in milliseconds too large for Redis's clock.
    let limit = Limit::new("glacial", TokenBucket::new(1e-14, 2.0).unwrap());
    for expected in [true, true, false] {
        let d = store
            .decide(Op::new(&limit, "u", 1.0), Mode::CONSUME)
            .await
            .unwrap();
        assert_eq!(d.allowed, expected);
    }
    let pttl = int_reply(&command(server.port(), &["PTTL", "sluice:{u}:glacial"]).unwrap());
    // Capped at 10^15 ms, some 31,700 years.
    assert!(
        (999_999_999_000_000..=1_000_000_000_000_000).contains(&pttl),
        "PTTL {pttl}"
    );
}

/// What the callers have done so far, and when to stop.
#[derive(Default)]
struct Progress {
    answers: AtomicU64,
    failures: AtomicU64,
    stop: AtomicBool,
}

impl Progress {
    /// Waits (polling) until `counter` reaches `n`.
    async fn reach(counter: &AtomicU64, n: u64) {
        while counter.load(Ordering::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// One caller in a loop until told to stop, answering failures with
/// `on_error`. Returns (answers, failures, allowed answers, slowest answer).
async fn load(
    store: &RedisStore,
    limit: &Limit,
    on_error: OnError,
    progress: &Progress,
) -> (u64, u64, u64, Duration) {
    let mut answers = 0;
    let mut failures = 0;
    let mut allowed = 0;
    let mut slowest = Duration::ZERO;
    while !progress.stop.load(Ordering::Relaxed) {
        let key = format!("k{}", answers % 64);
        let ops = [Op::new(limit, &key, 1.0)];
        let started = Instant::now();
        let outcome = match store.transact(&ops, Mode::CONSUME).await {
            Ok(o) => o,
            Err(_) => {
                failures += 1;
                progress.failures.fetch_add(1, Ordering::Relaxed);
                on_error.outcome(&ops)
            }
        };
        slowest = slowest.max(started.elapsed());
        answers += 1;
        progress.answers.fetch_add(1, Ordering::Relaxed);
        allowed += u64::from(outcome.allowed);
    }
    (answers, failures, allowed, slowest)
}

/// Wakes every millisecond until told to stop, and returns the longest it
/// was kept waiting past that: how late this process was being run at all.
/// An answer can be late by as much without the store being at fault.
async fn stalls(progress: &Progress) -> Duration {
    let tick = Duration::from_millis(1);
    let mut worst = Duration::ZERO;
    while !progress.stop.load(Ordering::Relaxed) {
        let before = Instant::now();
        tokio::time::sleep(tick).await;
        worst = worst.max(before.elapsed().saturating_sub(tick));
    }
    worst
}

/// What one outage showed: the callers' answers, and the worst stall of the
/// process meanwhile.
struct Outage {
    answers: u64,
    failures: u64,
    allowed: u64,
    slowest: Duration,
    stall: Duration,
    /// Whether the store still said it was ready once the outage was seen.
    ready: bool,
}

/// Kills Redis under eight busy callers, lets every one of them likely meet
/// the outage, then stops them and brings Redis back.
async fn outage(
    server: &mut RedisServer,
    store: &Arc<RedisStore>,
    limit: &Limit,
    on_error: OnError,
) -> Outage {
    let progress = Arc::new(Progress::default());
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (store, limit, progress) = (store.clone(), limit.clone(), progress.clone());
            tokio::spawn(async move { load(&store, &limit, on_error, &progress).await })
        })
        .collect();
    let watcher = {
        let progress = progress.clone();
        tokio::spawn(async move { stalls(&progress).await })
    };
    Progress::reach(&progress.answers, 200).await;
    server.kill();
    Progress::reach(&progress.failures, 64).await;
    progress.stop.store(true, Ordering::Relaxed);
    let mut seen = Outage {
        answers: 0,
        failures: 0,
        allowed: 0,
        slowest: Duration::ZERO,
        stall: Duration::ZERO,
        ready: true,
    };
    for c in callers {
        let (n, failed, ok, slowest) = c.await.unwrap();
        seen.answers += n;
        seen.failures += failed;
        seen.allowed += ok;
        seen.slowest = seen.slowest.max(slowest);
    }
    seen.stall = watcher.await.unwrap();
    seen.ready = store.is_ready();
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_fails_open_or_closed_in_time_and_decisions_resume() {
    let _alone = ALONE.lock().await;
    let mut server = RedisServer::start();
    let store = Arc::new(store(&server));
    let limit = Limit::new("fault", TokenBucket::new(1_000.0, 1_000.0).unwrap());
    store.ping().await.unwrap();
    assert!(store.is_ready());
    let timeout = RedisConfig::from_url(&server.url()).unwrap().timeout();
    let bound = timeout + Duration::from_millis(10);

    for on_error in [OnError::Open, OnError::Closed] {
        // A shared machine can stop running this process for longer than
        // the 10 ms of slack (VM steal). A late answer then says nothing of
        // the store, so that outage is run again; a late answer while the
        // process ran on time fails the test.
        let mut attempts = 0;
        let (seen, back) = loop {
            attempts += 1;
            let seen = outage(&mut server, &store, &limit, on_error).await;
            server.restart();
            let back = Instant::now();
            let stalled = seen.stall > Duration::from_millis(10);
            if seen.slowest <= bound || !stalled || attempts == 3 {
                break (seen, back);
            }
            eprintln!(
                "{on_error:?}: an answer took {:?} while the process stalled for {:?}; again",
                seen.slowest, seen.stall
            );
        };
        assert!(
            seen.slowest <= bound,
            "{on_error:?}: an answer took {:?}, deadline {timeout:?} (worst stall {:?})",
            seen.slowest,
            seen.stall
        );
        assert!(seen.failures > 0, "{on_error:?}: no call saw Redis down");
        // The limit is far above the load, so only the failure mode denies.
        match on_error {
            OnError::Open => assert_eq!(seen.allowed, seen.answers),
            OnError::Closed => assert_eq!(seen.allowed, seen.answers - seen.failures),
        }
        assert!(!seen.ready, "{on_error:?}: still ready with Redis down");

        // Redis is back (restarted above): decisions resume within a second.
        loop {
            let ops = [Op::new(&limit, "after", 1.0)];
            if store.transact(&ops, Mode::CONSUME).await.is_ok() {
                break;
            }
            assert!(
                back.elapsed() < Duration::from_secs(1),
                "decisions did not resume within 1 s of Redis returning"
            );
            tokio::task::yield_now().await;
        }
        assert!(store.is_ready());
    }
    let stats = store.stats();
    assert!(stats.errors + stats.timeouts > 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_starts_while_redis_is_down_and_becomes_ready() {
    let _alone = ALONE.lock().await;
    let mut server = RedisServer::start();
    server.kill();
    let store = store(&server);
    let limit = Limit::new("late", TokenBucket::new(1.0, 1.0).unwrap());
    let started = Instant::now();
    let r = store.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME).await;
    assert!(r.is_err());
    assert!(started.elapsed() <= Duration::from_millis(60));
    assert!(!store.is_ready());
    server.restart();
    let back = Instant::now();
    while !store.is_ready() {
        assert!(
            back.elapsed() < Duration::from_secs(1),
            "not ready 1 s after Redis returned"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Decisions resume within the same second (a stalled machine can time
    // out a first one; a lasting error cannot pass).
    let d = loop {
        match store.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME).await {
            Ok(d) => break d,
            Err(e) => {
                assert!(
                    back.elapsed() < Duration::from_secs(1),
                    "no decision 1 s after Redis returned: {e}"
                );
                tokio::task::yield_now().await;
            }
        }
    };
    assert!(d.allowed);
}
