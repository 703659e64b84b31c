//! A flood on a rule that delays is bounded: ten thousand clients on one
//! key hold no more requests than the rule's `max_reserved`, and clients
//! on many keys, each of which could hold that many, no more than the
//! proxy's `--max-held`. The clients are `sluice bench http`, the proxy the
//! real binary; what it holds is its `sluice_held_requests`, read every
//! 10 ms while the flood lasts. (`scripts/shaping-flood` measures the same
//! floods, and the proxy's memory.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::proxy::spawn_proxy;
use support::upstream::start_upstream;
use support::{PATIENCE, get_text, policy_file};

/// The rule every flood meets: a request a minute a key, each key holding
/// up to `MAX_RESERVED` (the deepest waits 10 minutes). No reservation
/// comes due while a flood lasts, so what is held is what is reserved: a
/// proxy slowed by the flood, which wakes a due request late, cannot be
/// read as holding one more than the bucket lets it.
const MAX_RESERVED: u64 = 10;

fn policy() -> String {
    format!(
        "rules:\n  - name: flood\n    limit_keys: [\"query:client\"]\n    \
         algorithm: token_bucket\n    \
         algorithm_config: {{rate: 1, period: 1m, burst: 1, max_reserved: {MAX_RESERVED}}}\n    \
         on_limit: {{delay: {{max: 15m}}}}\n"
    )
}

/// The requests the proxy at `admin` holds now, over every series.
async fn held(client: &reqwest::Client, admin: SocketAddr) -> u64 {
    let text = get_text(client, &format!("http://{admin}/metrics")).await;
    let held: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("sluice_held_requests ") || l.starts_with("sluice_held_requests{")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    held as u64
}

/// What a flood did: the most requests read as held, and the result of
/// `sluice bench http`.
struct Flood {
    most_held: u64,
    reads: usize,
    bench: Value,
}

/// One flood at a time: two at once on a 2-CPU machine starve each other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `clients` connections of `sluice bench http` send to the proxy at
/// `listen` back to back for two seconds after two of warm-up (while they
/// connect), each request on one of `keys` keys, while the proxy's held
/// requests are read every 10 ms.
async fn flood(listen: SocketAddr, admin: SocketAddr, clients: u32, keys: u32) -> Flood {
    let _alone = ONE_AT_A_TIME.lock().await;
    let mut bench = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "http", "--target", &listen.to_string()])
        .args([
            "--concurrency",
            &clients.to_string(),
            "--keys",
            &keys.to_string(),
        ])
        .args(["--duration", "2", "--warmup", "2", "--timeout", "10"])
        .args(["-X", "GET", "--path", "/?client={key}", "--json", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let (mut most_held, mut reads) = (0, 0);
    let deadline = std::time::Instant::now() + 2 * PATIENCE;
    while bench.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the flood did not end"
        );
        most_held = most_held.max(held(&client, admin).await);
        reads += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let out = bench.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Flood {
        most_held,
        reads,
        bench: serde_json::from_slice(&out.stdout).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_clients_on_one_key_hold_no_more_than_max_reserved() {
    let (up, _seen) = start_upstream().await;
    let (_dir, path) = policy_file(&policy());
    let (_proxy, listen, admin) = spawn_proxy(up, &path, &[]).await;
    let f = flood(listen, admin, 10_000, 1).await;
    let outcomes = &f.bench["outcomes"];
    eprintln!("most held {} in {} reads; {outcomes}", f.most_held, f.reads);
    // The bound holds, and the flood reached it: a proxy that held every
    // request, or none, fails here.
    assert_eq!(f.most_held, MAX_RESERVED, "{}", f.bench);
    // Within the two seconds measured, after the warm-up took the burst,
    // nothing is due: none forwarded, the rest refused at once.
    let forwarded = outcomes["status_2xx"].as_u64().unwrap();
    assert_eq!(forwarded, 0, "{}", f.bench);
    assert!(outcomes["status_429"].as_u64().unwrap() > 0, "{}", f.bench);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_on_many_keys_hold_no_more_than_the_proxys_cap() {
    let (up, _seen) = start_upstream().await;
    let (_dir, path) = policy_file(&policy());
    // 100 keys could hold 1,000 between them.
    let (_proxy, listen, admin) = spawn_proxy(up, &path, &[("SLUICE_MAX_HELD", "50")]).await;
    let f = flood(listen, admin, 1_000, 100).await;
    eprintln!(
        "most held {} in {} reads; {}",
        f.most_held, f.reads, f.bench["outcomes"]
    );
    assert_eq!(f.most_held, 50, "{}", f.bench);
}
