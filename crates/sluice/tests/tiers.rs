//! Tiers: seed 001's per-API-key example with both rules in one `group`.
//! An enterprise key gets the enterprise rule's 1000 rps and no other; every
//! other key gets the free rule's 10 rps. Run through the real `sluice
//! replay` and through the middleware on a stopped clock.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::sync::Arc;

use jsonwebtoken::{EncodingKey, Header, encode};
use serde_json::json;
use sluice_core::{FakeClock, MemoryStore, Nanos};
use sluice_engine::Enforcer;
use sluice_http::RateLimitLayer;
use sluice_policy::Policy;
use tower::{Layer, ServiceExt};

const SECRET: &str = "0123456789abcdef0123456789abcdef-tiers";

fn policy() -> String {
    format!(
        r#"
jwt:
  keys:
    - {{alg: HS256, secret: "{SECRET}"}}
rules:
  - name: enterprise
    group: tier
    limit_keys: ["header:x-api-key"]
    match: {{"jwt:plan": enterprise}}
    algorithm: token_bucket
    algorithm_config: {{rps: 1000, burst: 2000}}
  - name: free
    group: tier
    limit_keys: ["header:x-api-key"]
    algorithm: token_bucket
    algorithm_config: {{rps: 10, burst: 20}}
"#
    )
}

fn bearer(plan: &str) -> String {
    let claims = json!({"sub": "someone", "plan": plan, "exp": 4_000_000_000_u64});
    let token = encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap();
    format!("Bearer {token}")
}

/// The traffic: each of the two keys calls 2,000 times a second for ten
/// seconds, one with an enterprise token and one with a free one.
const RATE: u32 = 2_000;
const SECONDS: u32 = 10;

fn events() -> Vec<(f64, &'static str, String)> {
    let (enterprise, free) = (bearer("enterprise"), bearer("free"));
    (0..RATE * SECONDS)
        .flat_map(|i| {
            let t = f64::from(i) / f64::from(RATE);
            [
                (t, "ent-key", enterprise.clone()),
                (t, "free-key", free.clone()),
            ]
        })
        .collect()
}

/// What a token bucket of `rate`/s and `burst` admits of the calls above:
/// the burst, then the rate; a call lands exactly as a token comes back.
fn expected(rate: f64, burst: f64) -> f64 {
    let last = f64::from(RATE * SECONDS - 1) / f64::from(RATE);
    (burst + (rate * last).floor()).min(f64::from(RATE * SECONDS))
}

fn assert_tiers(admitted_enterprise: usize, admitted_free: usize) {
    // The enterprise key's bucket alone: 2,000 then 1,000 a second.
    assert_eq!(admitted_enterprise as f64, expected(1000.0, 2000.0));
    // The free key: 20 then 10 a second.
    assert_eq!(admitted_free as f64, expected(10.0, 20.0));
}

#[test]
fn replay_gives_enterprise_keys_1000_rps_and_every_other_key_10() {
    let dir = tempfile::tempdir().unwrap();
    let policy_path = dir.path().join("policy.yaml");
    std::fs::write(&policy_path, policy()).unwrap();
    let lines: Vec<String> = events()
        .iter()
        .map(|(t, key, auth)| {
            json!({"t": t, "ip": "192.0.2.1", "method": "GET", "path": "/",
                   "headers": {"x-api-key": key, "authorization": auth}})
            .to_string()
        })
        .collect();
    let events_path = dir.path().join("events.jsonl");
    std::fs::write(&events_path, lines.join("\n")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["replay", "--quiet", "--policy"])
        .arg(&policy_path)
        .arg("--events")
        .arg(&events_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut admitted = [0, 0];
    for (line, event) in String::from_utf8(out.stdout).unwrap().lines().zip(events()) {
        let d: serde_json::Value = serde_json::from_str(line).unwrap();
        let expected_rule = if event.1 == "ent-key" {
            "enterprise"
        } else {
            "free"
        };
        // Only the tier that applied is reported, admitted or not.
        assert_eq!(d["rule"], expected_rule, "{line}");
        if d["allowed"] == true {
            admitted[usize::from(event.1 == "free-key")] += 1;
        }
    }
    assert_tiers(admitted[0], admitted[1]);
}

#[tokio::test]
async fn the_middleware_gives_enterprise_keys_1000_rps_and_every_other_key_10() {
    let clock = FakeClock::new(Nanos::ZERO);
    let policy = Policy::from_str(&policy(), "policy.yaml").unwrap();
    let enforcer = Enforcer::new(policy, MemoryStore::with_clock(clock.clone()));
    let service = RateLimitLayer::new(Arc::new(enforcer)).layer(tower::service_fn(
        |_: http::Request<()>| async { Ok::<_, Infallible>(http::Response::new(())) },
    ));
    let mut admitted = [0, 0];
    for (t, key, auth) in events() {
        clock.set(Nanos::from_secs_f64(t).unwrap());
        let req = http::Request::builder()
            .uri("/")
            .header("x-api-key", key)
            .header("authorization", auth)
            .body(())
            .unwrap();
        let res = service.clone().oneshot(req).await.unwrap();
        let policy_header = res.headers()["ratelimit-policy"].to_str().unwrap();
        let expected_rule = if key == "ent-key" {
            "\"enterprise\""
        } else {
            "\"free\""
        };
        // The headers name the tier that applied, and only that one.
        assert!(
            policy_header.starts_with(expected_rule) && !policy_header.contains(','),
            "{policy_header}"
        );
        if res.status() == http::StatusCode::OK {
            admitted[usize::from(key == "free-key")] += 1;
        }
    }
    assert_tiers(admitted[0], admitted[1]);
}
