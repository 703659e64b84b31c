//! The Redis store on a real redis-server, on Redis's own clock: keys expire
//! when their bucket is full again, every key has a TTL, a killed Redis
//! gives prompt fail-open or fail-closed answers, and decisions resume soon
//! after it returns.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_core::{Limit, Mode, OnStoreError, Op, Store, StoreError, TokenBucket};
use sluice_redis::{RedisConfig, RedisStore};
use support::{RedisServer, command};

/// The tests here time answers against a deadline, so they run one at a
/// time: on a small machine the others' load would be what they measure.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A store with the default deadline, which the fault tests hold it to.
fn store(server: &RedisServer) -> RedisStore {
    RedisStore::new(RedisConfig::from_url(&server.url()).unwrap()).unwrap()
}

/// A store for the tests of what Redis holds: a stall of the machine longer
/// than the default 50 ms made their calls fail with `Timeout` (seen in a
/// full local run), and the deadline is not what they test.
fn patient_store(server: &RedisServer) -> RedisStore {
    let config = RedisConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(Duration::from_secs(5));
    RedisStore::new(config).unwrap()
}

fn int_reply(reply: &str) -> i64 {
    reply.trim().trim_start_matches(':').parse().unwrap()
}

/// The PTTLs a key can show `started.elapsed()` after a call made at
/// `started` gave it `refill_ms` to live: the wait since is taken off, so a
/// stall of the machine between the call and the read does not fail the
/// check, and 2 ms allow for rounding to whole milliseconds either way.
fn ttl_window(refill_ms: i64, started: Instant) -> std::ops::RangeInclusive<i64> {
    let waited = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    refill_ms.saturating_sub(waited).saturating_sub(2)..=refill_ms + 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_when_full_again_and_always_have_a_ttl() {
    let _alone = ALONE.lock().await;
    let server = RedisServer::start();
    let store = patient_store(&server);
    // 2 tokens a second, burst 10: 4 taken refill in 2 s.
    let limit = Limit::new("ttl", TokenBucket::new(2.0, 10.0).unwrap());
    let started = Instant::now();
    let d = store
        .decide(Op::new(&limit, "u1", 4.0), Mode::CONSUME)
        .await
        .unwrap();
    assert!(d.allowed);
    let pttl = int_reply(&command(server.port(), &["PTTL", "sluice:{u1}:ttl"]).unwrap());
    assert!(
        ttl_window(2_000, started).contains(&pttl),
        "PTTL {pttl} ms, refill takes 2000 ms, {:?} since the call",
        started.elapsed()
    );

    // A reservation deep below zero lives until it is paid back and refilled.
    let deep = Limit::new("deep", TokenBucket::new(1.0, 5.0).unwrap());
    let started = Instant::now();
    let d = store
        .decide(Op::new(&deep, "u1", 15.0), Mode::RESERVE)
        .await
        .unwrap();
    assert!(d.allowed);
    let pttl = int_reply(&command(server.port(), &["PTTL", "sluice:{u1}:deep"]).unwrap());
    assert!(
        ttl_window(15_000, started).contains(&pttl),
        "PTTL {pttl} ms, refill takes 15 s, {:?} since the call",
        started.elapsed()
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
    let store = patient_store(&server);
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

/// The spans in which this process was not being run. A shared machine can
/// stop a process for longer than the 10 ms of slack a deadline allows (VM
/// steal); an answer late by no more than that says nothing of the store.
///
/// A task wakes every millisecond and logs each wake-up that came late as
/// the span it was kept waiting. It is a task on the test's own runtime, so
/// it is late whenever the store's tasks could not have run either.
struct Stalls {
    spans: Arc<Mutex<Vec<(Instant, Instant)>>>,
    stop: Arc<AtomicBool>,
}

impl Stalls {
    fn watch() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (log, done) = (spans.clone(), stop.clone());
        tokio::spawn(async move {
            let tick = Duration::from_millis(1);
            while !done.load(Ordering::Relaxed) {
                let due = Instant::now() + tick;
                tokio::time::sleep(tick).await;
                let woke = Instant::now();
                // A timer may fire up to a tick late on any machine; only
                // the wait beyond that is the process not being run.
                if woke > due + tick {
                    log.lock().unwrap().push((due + tick, woke));
                }
            }
        });
        Self { spans, stop }
    }

    /// How long, within `from..to`, the process was kept from running.
    fn within(&self, from: Instant, to: Instant) -> Duration {
        let spans = self.spans.lock().unwrap();
        spans
            .iter()
            .map(|&(a, b)| b.min(to).saturating_duration_since(a.max(from)))
            .sum()
    }

    /// The longest single stall seen.
    fn worst(&self) -> Duration {
        let spans = self.spans.lock().unwrap();
        spans.iter().map(|&(a, b)| b - a).max().unwrap_or_default()
    }
}

impl Drop for Stalls {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What one caller saw: its answers, failures and allowed answers, and the
/// span of every answer slower than `slow`.
#[derive(Default)]
struct Seen {
    answers: u64,
    failures: u64,
    allowed: u64,
    slow: Vec<(Instant, Instant)>,
}

/// One caller in a loop until told to stop, answering failures with
/// `on_error`.
async fn load(
    store: &RedisStore,
    limit: &Limit,
    on_error: OnStoreError,
    progress: &Progress,
    slow: Duration,
) -> Seen {
    let mut seen = Seen::default();
    while !progress.stop.load(Ordering::Relaxed) {
        let key = format!("k{}", seen.answers % 64);
        let ops = [Op::new(limit, &key, 1.0)];
        let started = Instant::now();
        let outcome = match store.transact(&ops, Mode::CONSUME).await {
            Ok(o) => o,
            Err(_) => {
                seen.failures += 1;
                progress.failures.fetch_add(1, Ordering::Relaxed);
                on_error.outcome(&ops)
            }
        };
        let answered = Instant::now();
        if answered - started > slow {
            seen.slow.push((started, answered));
        }
        seen.answers += 1;
        progress.answers.fetch_add(1, Ordering::Relaxed);
        seen.allowed += u64::from(outcome.allowed);
    }
    seen
}

/// Kills Redis under eight busy callers, lets every one of them likely meet
/// the outage, then stops them. Returns what they saw all together, and
/// whether the store still said it was ready once the outage was seen.
async fn outage(
    server: &mut RedisServer,
    store: &Arc<RedisStore>,
    limit: &Limit,
    on_error: OnStoreError,
    slow: Duration,
) -> (Seen, bool) {
    let progress = Arc::new(Progress::default());
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (store, limit, progress) = (store.clone(), limit.clone(), progress.clone());
            tokio::spawn(async move { load(&store, &limit, on_error, &progress, slow).await })
        })
        .collect();
    Progress::reach(&progress.answers, 200).await;
    server.kill();
    Progress::reach(&progress.failures, 64).await;
    progress.stop.store(true, Ordering::Relaxed);
    let mut all = Seen::default();
    for c in callers {
        let seen = c.await.unwrap();
        all.answers += seen.answers;
        all.failures += seen.failures;
        all.allowed += seen.allowed;
        all.slow.extend(seen.slow);
    }
    (all, store.is_ready())
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

    for on_error in [OnStoreError::Open, OnStoreError::Closed] {
        let stalls = Stalls::watch();
        let (seen, ready) = outage(&mut server, &store, &limit, on_error, bound).await;
        server.restart();
        let back = Instant::now();
        // Each answer is held to the deadline for the time the process was
        // being run while it waited; a late answer in a process that ran
        // on time fails the test.
        for &(asked, answered) in &seen.slow {
            let ran = (answered - asked).saturating_sub(stalls.within(asked, answered));
            assert!(
                ran <= bound,
                "{on_error:?}: an answer took {:?}, {ran:?} of it running, deadline {timeout:?} \
                 (worst stall {:?})",
                answered - asked,
                stalls.worst()
            );
        }
        if !seen.slow.is_empty() {
            eprintln!(
                "{on_error:?}: {} answers late by a stall of the process (worst {:?})",
                seen.slow.len(),
                stalls.worst()
            );
        }
        assert!(seen.failures > 0, "{on_error:?}: no call saw Redis down");
        // The limit is far above the load, so only the failure mode denies.
        match on_error {
            OnStoreError::Open => assert_eq!(seen.allowed, seen.answers),
            OnStoreError::Closed => assert_eq!(seen.allowed, seen.answers - seen.failures),
        }
        assert!(!ready, "{on_error:?}: still ready with Redis down");

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

/// Once Redis has refused the connection, decisions fail at once instead
/// of each waiting out its deadline while the connection is retried, and
/// resume once Redis answers the health check again. A patient deadline
/// shows the difference: no answer may take anywhere near it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_is_answered_at_once_until_it_returns() {
    let _alone = ALONE.lock().await;
    let mut server = RedisServer::start();
    let config = RedisConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(Duration::from_secs(5));
    let store = RedisStore::new(config).unwrap();
    let limit = Limit::new("refused", TokenBucket::new(1_000.0, 1_000.0).unwrap());
    let decide = || store.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME);
    assert!(decide().await.unwrap().allowed);
    server.kill();
    // The first call after the kill learns of it.
    let _ = decide().await;
    assert!(!store.is_ready());
    let stalls = Stalls::watch();
    for _ in 0..20 {
        let asked = Instant::now();
        let r = decide().await;
        let answered = Instant::now();
        assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
        let ran = (answered - asked).saturating_sub(stalls.within(asked, answered));
        assert!(
            ran < Duration::from_millis(100),
            "an answer took {ran:?} running"
        );
    }
    server.restart();
    let back = Instant::now();
    while decide().await.is_err() {
        assert!(
            back.elapsed() < Duration::from_secs(2),
            "decisions did not resume within 2 s of Redis returning"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(store.is_ready());
}

/// A Redis that hangs refuses no connection; only its silence says it is
/// down. Timeouts make the store not ready, and it is ready again once
/// Redis answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_is_not_ready_and_readiness_returns_with_its_answers() {
    let _alone = ALONE.lock().await;
    let server = RedisServer::start();
    let store = store(&server);
    let limit = Limit::new("paused", TokenBucket::new(1_000.0, 1_000.0).unwrap());
    store.ping().await.unwrap();
    assert!(store.is_ready());
    server.pause();
    let paused = Instant::now();
    // A missed deadline makes the health check ping at once; the ping
    // misses it too, and the store is no longer ready.
    while store.is_ready() {
        let r = store.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME).await;
        assert!(matches!(r, Err(StoreError::Timeout)), "{r:?}");
        assert!(
            paused.elapsed() < Duration::from_secs(2),
            "still ready 2 s into a pause in which every decision times out"
        );
    }
    for _ in 0..5 {
        let r = store.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME).await;
        assert!(matches!(r, Err(StoreError::Timeout)), "{r:?}");
        assert!(!store.is_ready(), "ready again while Redis is paused");
    }
    server.resume();
    let back = Instant::now();
    while !store.is_ready() {
        assert!(
            back.elapsed() < Duration::from_secs(2),
            "not ready 2 s after Redis resumed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let d = loop {
        match store.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME).await {
            Ok(d) => break d,
            Err(e) => assert!(
                back.elapsed() < Duration::from_secs(2),
                "no decision 2 s after Redis resumed: {e}"
            ),
        }
    };
    assert!(d.allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_starts_while_redis_is_down_and_becomes_ready() {
    let _alone = ALONE.lock().await;
    let mut server = RedisServer::start();
    server.kill();
    let store = store(&server);
    let limit = Limit::new("late", TokenBucket::new(1.0, 1.0).unwrap());
    let stalls = Stalls::watch();
    let asked = Instant::now();
    let r = store.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME).await;
    let answered = Instant::now();
    assert!(r.is_err());
    let ran = (answered - asked).saturating_sub(stalls.within(asked, answered));
    assert!(
        ran <= Duration::from_millis(60),
        "an answer took {ran:?} running"
    );
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
