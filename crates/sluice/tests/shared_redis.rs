//! Several real `sluice serve` processes sharing one real redis-server, as a
//! platform team runs them, hammered over HTTP on one shared key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis;

use std::time::{Duration, Instant};

use support::measure::{Seen, hammer, most_in_one_period};
use support::serve::spawn_serve;
use support::{Process, policy_file};

#[test]
fn a_group_proven_within_one_period_is_counted_and_one_that_is_not_is_left_out() {
    let t0 = Instant::now();
    let at = |sent: u64, answered: u64| Seen {
        sent: t0 + Duration::from_millis(sent),
        answered: t0 + Duration::from_millis(answered),
        allowed: true,
    };
    let period = Duration::from_millis(100);
    // The third was answered a period after the first was sent: it may have
    // been decided after the first left the window.
    let seen = [at(0, 10), at(20, 30), at(90, 100), at(95, 99)];
    assert_eq!(most_in_one_period(&seen, period), 3);
    let denied = Seen {
        allowed: false,
        ..at(1, 2)
    };
    assert_eq!(most_in_one_period(&[denied], period), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_servers_sharing_one_redis_admit_a_sliding_logs_rate_and_never_more_in_any_period() {
    const RATE: usize = 100;
    const PERIOD: Duration = Duration::from_secs(1);
    // Whole periods counted from the first admission, and the time after
    // them that keeps the last one saturated.
    const PERIODS: u32 = 3;
    const CLIENTS_PER_SERVER: usize = 3;

    let redis = redis::RedisServer::start();
    let (_dir, path) = policy_file(&format!(
        "store: {{kind: redis, url: \"{}\", timeout_ms: 2000}}\n\
         limits:\n  chat:\n    algorithm: sliding_log\n    \
         algorithm_config: {{rate: {RATE}, period: 1s}}\n",
        redis.url()
    ));
    let mut servers: Vec<(Process, String)> = Vec::new();
    for _ in 0..4 {
        let (process, base, _grpc) = spawn_serve(&path).await;
        servers.push((process, base));
    }

    let client = reqwest::Client::new();
    let until = Instant::now() + PERIOD * PERIODS + PERIOD / 2;
    let bases: Vec<String> = servers.iter().map(|(_, base)| base.clone()).collect();
    let seen = hammer(
        &client,
        &bases,
        CLIENTS_PER_SERVER,
        r#"{"limit": "chat", "key": "room"}"#,
        until,
    )
    .await;

    let most = most_in_one_period(&seen, PERIOD);
    assert!(most <= RATE, "{most} admissions within one period");
    // Saturated, a log admits the rate again as each admission leaves:
    // within the whole periods after the first admission, all but what
    // the time between a slot freeing and the next call costs.
    let first = seen
        .iter()
        .filter(|s| s.allowed)
        .map(|s| s.sent)
        .min()
        .unwrap();
    let end = first + PERIOD * PERIODS;
    let admitted = seen
        .iter()
        .filter(|s| s.allowed && s.answered < end)
        .count();
    let exact = RATE * PERIODS as usize;
    eprintln!(
        "{} calls; {admitted} admitted in the {PERIODS} periods after the first admission, \
         of {exact}; at most {most} proven within one period",
        seen.len()
    );
    assert!(
        admitted * 100 >= exact * 98,
        "{admitted} admitted in {PERIODS} periods of {RATE}, of {} calls",
        seen.len()
    );
    assert!(
        admitted <= exact,
        "{admitted} admitted in {PERIODS} periods"
    );
}

/// One series of a server's `/metrics`, 0 when it is not there yet.
async fn metric_of(client: &reqwest::Client, base: &str, series: &str) -> f64 {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    support::metric(&text, series).unwrap_or(0.0)
}

/// `POST /v1/<path>` on `base` with `body`: the status and the answer.
async fn post(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let res = client
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.json().await.unwrap())
}

/// The LLM gateway's round on two servers sharing one Redis: one reserves
/// 1000 tokens and refunds the 600 it did not use; the other, whose deny
/// cache had learnt that the key is empty, admits a call of 600 as soon as
/// the refund's announcement reaches it, not when refill would (in 18 days).
/// The refill is that slow so that what it adds while the test runs, on a
/// machine however busy, stays far below a hundredth of a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_on_one_server_reaches_another_servers_deny_cache_at_once() {
    let redis = redis::RedisServer::start();
    let (_dir, path) = policy_file(&format!(
        "store: {{kind: redis, url: \"{}\", timeout_ms: 2000}}\n\
         limits:\n  llm:\n    algorithm: token_bucket\n    \
         algorithm_config: {{rate: 1000, period: 30d, max_reserved: 1000}}\n",
        redis.url()
    ));
    let (_a, a, _) = spawn_serve(&path).await;
    let (_b, b, _) = spawn_serve(&path).await;
    let client = reqwest::Client::new();
    const LOCAL: &str = "sluice_redis_transactions_total{decided_by=\"deny_cache\"}";
    const HEARD: &str = "sluice_redis_invalidations_total";
    let estimate = r#"{"limit": "llm", "key": "org-7", "count": 1000, "reserve": true}"#;
    let (status, d) = post(&client, &a, "/v1/limit", estimate).await;
    assert_eq!((status, d["remaining"].as_u64()), (200, Some(0)), "{d}");

    let call = r#"{"limit": "llm", "key": "org-7", "count": 600}"#;
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric_of(&client, &b, LOCAL).await < 1.0 {
        let (status, d) = post(&client, &b, "/v1/limit", call).await;
        assert_eq!(status, 429, "{d}");
        assert!(
            Instant::now() < deadline,
            "server b never denied from its cache"
        );
    }
    let heard = metric_of(&client, &b, HEARD).await;

    let (status, d) = post(
        &client,
        &a,
        "/v1/refund",
        r#"{"limit": "llm", "key": "org-7", "count": 600}"#,
    )
    .await;
    assert_eq!((status, d["remaining"].as_u64()), (200, Some(600)), "{d}");
    let value = client
        .get(format!("{a}/v1/value?limit=llm&key=org-7"))
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    let tokens = value["tokens"].as_f64().unwrap();
    assert!((600.0..600.01).contains(&tokens), "{value}");

    // The announcement travels through Redis's pub/sub to b's subscriber;
    // until it lands, b's cache may still deny.
    let refunded = Instant::now();
    let mut denied_meanwhile = 0;
    loop {
        let (status, d) = post(&client, &b, "/v1/limit", call).await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 429, "{d}");
        denied_meanwhile += 1;
        // Milliseconds, measured; the bound leaves room for a machine
        // busy with the other tests here, which saturate it.
        assert!(
            refunded.elapsed() < Duration::from_secs(5),
            "b still denies 5 s after the refund"
        );
    }
    eprintln!(
        "admitted by b {:?} after a's refund answered, after {denied_meanwhile} denials",
        refunded.elapsed()
    );
    assert!(metric_of(&client, &b, HEARD).await > heard);
}

/// The acceptance run for concurrency limits: four `sluice serve` processes
/// on one Redis, 32 callers each taking a slot of one key, holding it for a
/// random 0 to 20 ms of work, and giving it back. Each caller counts itself
/// in before its work and out after it (before it releases), so the count
/// the callers see is never below what Redis holds: it must never pass
/// `max`. And it must reach it, or the run proved nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_servers_sharing_one_redis_never_let_more_than_max_calls_in_flight() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const MAX: usize = 5;
    let redis = redis::RedisServer::start();
    let (_dir, path) = policy_file(&format!(
        "store: {{kind: redis, url: \"{}\", timeout_ms: 2000}}\n\
         limits:\n  jobs:\n    algorithm: concurrency\n    \
         algorithm_config: {{max: {MAX}, lease: 1m}}\n",
        redis.url()
    ));
    let mut servers = Vec::new();
    for _ in 0..4 {
        let (process, base, _grpc) = spawn_serve(&path).await;
        servers.push((process, base));
    }
    let client = reqwest::Client::new();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs(2);
    let callers: Vec<_> = (0..32)
        .map(|i| {
            let base = servers[i % 4].1.clone();
            let (client, in_flight, most) = (client.clone(), in_flight.clone(), most.clone());
            tokio::spawn(async move {
                let mut held = 0;
                while Instant::now() < until {
                    let (status, d) = post(
                        &client,
                        &base,
                        "/v1/acquire",
                        r#"{"limit": "jobs", "key": "queue"}"#,
                    )
                    .await;
                    if status == 429 {
                        continue;
                    }
                    assert_eq!(status, 200, "{d}");
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    // The caller's work: 0 to 20 ms.
                    tokio::time::sleep(Duration::from_micros(fastrand::u64(0..20_000))).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    let body = format!(
                        r#"{{"limit": "jobs", "key": "queue", "lease": "{}"}}"#,
                        d["lease"].as_str().unwrap()
                    );
                    let (status, r) = post(&client, &base, "/v1/release", &body).await;
                    assert_eq!((status, &r["released"]), (200, &serde_json::json!(true)));
                    held += 1;
                }
                held
            })
        })
        .collect();
    let mut held = 0;
    for caller in callers {
        held += caller.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    eprintln!("{held} leases held and released; at most {most} in flight at once, of {MAX}");
    assert!(most <= MAX, "{most} in flight at once");
    assert_eq!(most, MAX, "the callers never filled every slot");
}

/// A server killed while its callers hold leases frees nothing itself; the
/// leases expire a lease after they were taken, and then another server
/// admits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_held_through_a_killed_server_free_within_their_lease() {
    const LEASE: Duration = Duration::from_secs(2);
    let redis = redis::RedisServer::start();
    let (_dir, path) = policy_file(&format!(
        "store: {{kind: redis, url: \"{}\", timeout_ms: 2000}}\n\
         limits:\n  jobs:\n    algorithm: concurrency\n    \
         algorithm_config: {{max: 3, lease: 2s}}\n",
        redis.url()
    ));
    let (mut doomed, a, _) = spawn_serve(&path).await;
    let (_survivor, b, _) = spawn_serve(&path).await;
    let client = reqwest::Client::new();
    let take = r#"{"limit": "jobs", "key": "queue"}"#;
    let taken = Instant::now();
    for _ in 0..3 {
        assert_eq!(post(&client, &a, "/v1/acquire", take).await.0, 200);
    }
    doomed.0.kill().unwrap();
    doomed.0.wait().unwrap();
    let (status, d) = post(&client, &b, "/v1/acquire", take).await;
    assert_eq!(status, 429, "{d}");
    let wait = d["retry_after"].as_f64().unwrap();
    assert!(wait > 0.0 && wait <= LEASE.as_secs_f64(), "{d}");
    loop {
        let (status, d) = post(&client, &b, "/v1/acquire", take).await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 429, "{d}");
        assert!(
            taken.elapsed() < LEASE + Duration::from_millis(500),
            "still full {:?} after the leases were taken",
            taken.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let freed = taken.elapsed();
    eprintln!("the dead server's leases freed {freed:?} after they were taken");
    assert!(
        freed >= LEASE - Duration::from_millis(100),
        "freed early: {freed:?}"
    );
}
