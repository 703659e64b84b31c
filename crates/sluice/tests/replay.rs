//! `sluice replay` and `sluice validate` as a user runs them: the real binary,
//! real files, and traces built to probe the edges of the semantics. Every
//! expected number below is worked out by hand from `docs/semantics.md`.

// Test helpers outside #[test] functions fail loudly on purpose.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(tempfile::tempdir().unwrap())
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Replays `events` (one JSON value per line) through `policy`; returns one
/// JSON value per output line.
fn replay(policy: &str, events: &[Value]) -> Vec<Value> {
    let dir = Dir::new();
    let p = dir.file("policy.yaml", policy);
    let lines: Vec<String> = events.iter().map(Value::to_string).collect();
    let e = dir.file("events.jsonl", &lines.join("\n"));
    let out = sluice(&[
        "replay",
        "--quiet",
        "--policy",
        path(&p),
        "--events",
        path(&e),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "replay failed: {stderr}");
    let decisions: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(decisions.len(), events.len(), "one decision per event");
    for (d, e) in decisions.iter().zip(events) {
        assert_eq!(d["t"], e["t"], "decisions keep the events' order");
    }
    decisions
}

fn req(t: f64, ip: &str) -> Value {
    json!({"t": t, "ip": ip, "method": "GET", "path": "/api/x"})
}

fn column<'a>(ds: &'a [Value], field: &str) -> Vec<&'a Value> {
    ds.iter().map(|d| &d[field]).collect()
}

const PER_IP: &str = "
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 3}
";

#[test]
fn a_burst_at_one_instant_admits_the_burst_then_waits_for_the_rate() {
    let events: Vec<Value> = (0..5).map(|_| req(0.0, "203.0.113.9")).collect();
    let ds = replay(PER_IP, &events);
    assert_eq!(
        column(&ds, "allowed"),
        [true, true, true, false, false]
            .map(Value::from)
            .iter()
            .collect::<Vec<_>>()
    );
    assert_eq!(
        column(&ds, "remaining"),
        [2, 1, 0, 0, 0].map(Value::from).iter().collect::<Vec<_>>()
    );
    assert_eq!(ds[0]["rule"], "per-ip");
    assert_eq!(ds[0]["limit"], 3);
    assert_eq!(ds[0]["retry_after"], Value::Null);
    assert_eq!(ds[0]["reset"], 1.0);
    assert_eq!(ds[2]["reset"], 3.0);
    assert_eq!(ds[3]["retry_after"], 1.0);
    assert_eq!(ds[3]["reset"], 3.0);
}

/// A flood of drained keys larger than `max_keys` makes the store forget
/// the victim's bucket, the one nearest to full; it must come back as empty
/// as it left, not full.
#[test]
fn a_flood_beyond_the_key_cap_never_refills_an_over_limit_victim() {
    let policy = "
store: {kind: memory, max_keys: 1000}
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 1h, burst: 5}
";
    let mut events = Vec::new();
    let mut ms = 0u32;
    let mut t = 0.0;
    let victim = |events: &mut Vec<Value>, t: f64| events.push(req(t, "198.51.100.7"));
    for _ in 0..5 {
        victim(&mut events, t);
    }
    for i in 0..3_000u32 {
        let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
        for _ in 0..5 {
            ms += 1;
            t = f64::from(ms) / 1_000.0;
            events.push(req(t, &ip));
        }
        if i % 12 == 0 {
            victim(&mut events, t);
        }
    }
    let ds = replay(policy, &events);
    let to_victim: Vec<&Value> = ds
        .iter()
        .zip(&events)
        .filter(|(_, e)| e["ip"] == "198.51.100.7")
        .map(|(d, _)| &d["allowed"])
        .collect();
    assert_eq!(to_victim.len(), 255);
    let admitted = to_victim
        .iter()
        .filter(|a| ***a == Value::Bool(true))
        .count();
    assert_eq!(
        admitted, 5,
        "the victim's burst, and nothing the flood refilled"
    );
}

#[test]
fn an_idle_gap_longer_than_the_refill_time_refills_only_to_the_burst() {
    let mut events: Vec<Value> = (0..3).map(|_| req(0.0, "203.0.113.9")).collect();
    events.extend((0..4).map(|_| req(86_400.0, "203.0.113.9")));
    let ds = replay(PER_IP, &events);
    let allowed: Vec<bool> = ds.iter().map(|d| d["allowed"].as_bool().unwrap()).collect();
    assert_eq!(allowed, [true, true, true, true, true, true, false]);
    assert_eq!(ds[3]["remaining"], 2);
}

#[test]
fn partial_refill_is_exact_between_events() {
    let events: Vec<Value> = [0.0, 0.0, 0.0, 0.25, 1.0, 1.5]
        .iter()
        .map(|&t| req(t, "192.0.2.1"))
        .collect();
    let ds = replay(PER_IP, &events);
    // At 0.25 s the bucket holds 0.25: denied, 0.75 s to wait.
    assert_eq!(ds[3]["allowed"], false);
    assert_eq!(ds[3]["retry_after"], 0.75);
    assert_eq!(ds[3]["reset"], 2.75);
    // At 1.0 s it holds exactly 1.
    assert_eq!(ds[4]["allowed"], true);
    assert_eq!(ds[4]["remaining"], 0);
    assert_eq!(ds[5]["allowed"], false);
    assert_eq!(ds[5]["retry_after"], 0.5);
}

#[test]
fn fixed_windows_open_exactly_at_their_boundaries() {
    let policy = "
rules:
  - name: windowed
    limit_keys: []
    algorithm: fixed_window
    algorithm_config: {rate: 2, period: 10s, start: 0}
";
    let events: Vec<Value> = [5.0, 9.999, 9.999, 10.0, 10.0, 10.0, 35.0]
        .iter()
        .map(|&t| req(t, "203.0.113.9"))
        .collect();
    let ds = replay(policy, &events);
    let allowed: Vec<bool> = ds.iter().map(|d| d["allowed"].as_bool().unwrap()).collect();
    assert_eq!(allowed, [true, true, false, true, true, false, true]);
    let retry = ds[2]["retry_after"].as_f64().unwrap();
    assert!((retry - 0.001).abs() < 1e-9, "{retry}");
    assert_eq!(ds[5]["retry_after"], 10.0);
    // Windows never roll over more than the capacity (2 by default).
    assert_eq!(ds[6]["remaining"], 1);
    assert_eq!(ds[0]["limit"], 2);
}

/// `event` with the fields of `extra` added.
fn with_fields(mut event: Value, extra: Value) -> Value {
    if let (Some(e), Value::Object(more)) = (event.as_object_mut(), extra) {
        e.extend(more);
    }
    event
}

/// Asserts that `d` has these fields, `retry_after` to within a nanosecond.
#[track_caller]
fn assert_decision(d: &Value, allowed: bool, remaining: u64, retry_after: Option<f64>, reset: f64) {
    assert_eq!(d["allowed"], allowed, "{d}");
    assert_eq!(d["remaining"], remaining, "{d}");
    match retry_after {
        Some(r) => assert!((d["retry_after"].as_f64().unwrap() - r).abs() < 1e-9, "{d}"),
        None => assert_eq!(d["retry_after"], Value::Null, "{d}"),
    }
    assert!((d["reset"].as_f64().unwrap() - reset).abs() < 1e-9, "{d}");
}

#[test]
fn a_sliding_window_weighs_the_previous_window_by_its_overlap() {
    let policy = "
rules:
  - name: sliding
    limit_keys: []
    algorithm: sliding_window
    algorithm_config: {rate: 10, period: 10s, start: 0, cost_source: 'query:n'}
";
    let at = |t: f64, n: u32| json!({"t": t, "path": "/", "query": format!("n={n}")});
    let ds = replay(
        policy,
        &[
            at(1.0, 8),
            at(12.5, 4),
            at(12.5, 1),
            at(13.75, 1),
            at(14.0, 6),
        ],
    );
    // 8 in the window [0, 10): empty from 20.
    assert_decision(&ds[0], true, 2, None, 19.0);
    assert_eq!(
        (&ds[0]["limit"], &ds[0]["rule"]),
        (&json!(10), &json!("sliding"))
    );
    // At 12.5 the 8 weigh 8 × (10 − 2.5) / 10 = 6: 4 fit, leaving nothing.
    assert_decision(&ds[1], true, 0, None, 17.5);
    // One more waits until 8 × (10 − e) / 10 + 4 + 1 ≤ 10: e = 3.75.
    assert_decision(&ds[2], false, 0, Some(1.25), 17.5);
    assert_decision(&ds[3], true, 0, None, 16.25);
    // At 14: 8 × 0.6 + 5 = 9.8 counted, and 5 + 6 > 10, so the next window,
    // where 5 × (10 − e) / 10 + 6 ≤ 10 from e = 2: 6 + 2 = 8 s.
    assert_decision(&ds[4], false, 0, Some(8.0), 16.0);
}

#[test]
fn an_estimate_is_settled_by_refund_or_forced_charge() {
    let policy = "
limits:
  llm:
    algorithm: token_bucket
    algorithm_config: {rate: 1000, period: 1m}
";
    let at = |t: f64, count: f64, extra: Value| {
        with_fields(
            json!({"t": t, "limit": "llm", "key": "team", "count": count}),
            extra,
        )
    };
    let ds = replay(
        policy,
        &[
            at(0.0, 1000.0, json!({})),
            at(1.0, 600.0, json!({"refund": true})),
            at(1.0, 617.0, json!({})),
            at(1.0, 616.0, json!({})),
            at(2.0, 200.0, json!({"force": true})),
            at(2.0, 1.0, json!({})),
        ],
    );
    // 1000 a minute is 1 token every 60 ms.
    assert_decision(&ds[0], true, 0, None, 60.0);
    // 1 s refilled 16⅔, and the refund gave back 600: 616⅔.
    assert_decision(&ds[1], true, 616, None, 23.0);
    assert_decision(&ds[2], false, 616, Some(0.02), 23.0);
    assert_decision(&ds[3], true, 0, None, 59.96);
    // A charge beyond what is held: 0⅔ + 16⅔ − 200 leaves a debt of 182⅔,
    // which the next call waits out with its own token: 183⅔ × 60 ms.
    assert_decision(&ds[4], true, 0, None, 70.96);
    assert_decision(&ds[5], false, 0, Some(11.02), 70.96);
}

#[test]
fn a_penalty_denies_a_key_outright_for_exactly_its_length() {
    let policy = "
rules:
  - name: login
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 2}
    penalty: 10s
";
    let ds = replay(
        policy,
        &[
            req(0.0, "192.0.2.1"),
            req(0.0, "192.0.2.1"),
            req(0.0, "192.0.2.1"),
            req(5.0, "192.0.2.1"),
            req(9.999, "192.0.2.1"),
            req(10.0, "192.0.2.1"),
            req(10.0, "192.0.2.2"),
        ],
    );
    assert_eq!(
        column(&ds, "allowed"),
        [true, true, false, false, false, true, true]
    );
    // The bucket alone would wait 1 s; the penalty, 10 from the denial, and
    // denials meanwhile do not lengthen it.
    assert_decision(&ds[2], false, 0, Some(10.0), 2.0);
    assert_decision(&ds[3], false, 0, Some(5.0), 0.0);
    assert!(
        (ds[4]["retry_after"].as_f64().unwrap() - 0.001).abs() < 1e-9,
        "{}",
        ds[4]
    );
    // It refilled all along: full again at 10 s.
    assert_decision(&ds[5], true, 1, None, 1.0);
}

#[test]
fn concurrency_holds_slots_for_a_duration_or_until_a_named_release() {
    let policy = "
limits:
  jobs:
    algorithm: concurrency
    algorithm_config: {max: 2, lease: 10s}
rules:
  - name: uploads
    limit_keys: [ip:address]
    match: {path: /upload}
    algorithm: concurrency
    algorithm_config: {max: 1, lease: 10s}
";
    let job =
        |t: f64, extra: Value| with_fields(json!({"t": t, "limit": "jobs", "key": "k"}), extra);
    let upload = |t: f64, extra: Value| {
        with_fields(json!({"t": t, "ip": "192.0.2.1", "path": "/upload"}), extra)
    };
    let ds = replay(
        policy,
        &[
            job(0.0, json!({"lease": "a"})),
            job(0.0, json!({"lease": "b"})),
            job(1.0, json!({})),
            job(2.0, json!({"release": "a"})),
            job(2.0, json!({"release": "a"})),
            job(3.0, json!({"duration": 2})),
            job(4.0, json!({})),
            job(5.0, json!({})),
            upload(6.0, json!({"duration": 1})),
            upload(6.5, json!({})),
            upload(7.0, json!({})),
            upload(7.0, json!({})),
        ],
    );
    assert_decision(&ds[0], true, 1, None, 10.0);
    assert_decision(&ds[1], true, 0, None, 10.0);
    // Full until a's lease would expire at 10.
    assert_decision(&ds[2], false, 0, Some(9.0), 9.0);
    assert_eq!(
        (&ds[3]["released"], &ds[4]["released"]),
        (&json!(true), &json!(false))
    );
    assert_decision(&ds[5], true, 0, None, 10.0);
    assert!(!ds[6]["allowed"].as_bool().unwrap(), "{}", ds[6]);
    // The call of 3 s ago held its slot for 2 s: free again at 5.
    assert!(ds[7]["allowed"].as_bool().unwrap(), "{}", ds[7]);
    // A request holds its slot for its duration; one without takes none.
    assert_eq!(column(&ds[8..], "allowed"), [true, false, true, true]);
    assert_eq!(ds[9]["retry_after"], 9.5);
}

#[test]
fn a_sliding_log_admits_exactly_its_rate_over_any_period() {
    let policy = "
limits:
  search:
    algorithm: sliding_log
    algorithm_config: {rate: 3, period: 1m}
";
    let call =
        |t: f64, count: f64| json!({"t": t, "limit": "search", "key": "user-1", "count": count});
    let mut reserve = call(60.0, 1.0);
    reserve["reserve"] = json!(true);
    let ds = replay(
        policy,
        &[
            call(0.0, 1.0),
            call(20.0, 1.0),
            call(40.0, 1.0),
            call(59.5, 1.0),
            call(60.0, 1.0),
            call(60.0, 2.0),
            reserve,
            call(100.0, 2.0),
        ],
    );
    assert_decision(&ds[0], true, 2, None, 60.0);
    assert_decision(&ds[1], true, 1, None, 60.0);
    assert_decision(&ds[2], true, 0, None, 60.0);
    // The call at 0 leaves the window at 60; the newest, at 40, at 100.
    assert_decision(&ds[3], false, 0, Some(0.5), 40.5);
    assert_decision(&ds[4], true, 0, None, 60.0);
    // 2 more need the calls at 20 and 40 gone: until 100.
    assert_decision(&ds[5], false, 0, Some(40.0), 60.0);
    assert!(
        ds[6]["error"]
            .as_str()
            .unwrap()
            .contains("takes no reservations"),
        "{}",
        ds[6]
    );
    assert_decision(&ds[7], true, 0, None, 60.0);
}

#[test]
fn a_sliding_log_and_a_token_bucket_decide_a_request_together() {
    let policy = "
rules:
  - name: log
    limit_keys: [ip:address]
    match: {path_prefix: /api}
    algorithm: sliding_log
    algorithm_config: {rate: 2, period: 10s}
  - name: bucket
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 0.1, burst: 5}
";
    let ip = "203.0.113.9";
    let mut events: Vec<Value> = [0.0, 1.0, 2.0, 4.0].iter().map(|&t| req(t, ip)).collect();
    events.push(json!({"t": 4.0, "ip": ip, "method": "GET", "path": "/other"}));
    let ds = replay(policy, &events);
    let allowed: Vec<bool> = ds.iter().map(|d| d["allowed"].as_bool().unwrap()).collect();
    assert_eq!(allowed, [true, true, false, false, true]);
    // The log denies at 2 and 4: its first entry leaves at 10.
    assert_eq!(
        (&ds[2]["rule"], &ds[2]["retry_after"]),
        (&json!("log"), &json!(8.0))
    );
    assert_eq!(ds[3]["retry_after"], 6.0);
    // The denials took nothing from the bucket: 5 − 1 at 0, + 0.1 − 1 at
    // 1, + 0.3 at 4 is 3.4, and the request only it limits leaves 2.4.
    assert_eq!(
        (&ds[4]["rule"], &ds[4]["remaining"]),
        (&json!("bucket"), &json!(2))
    );
}

#[test]
fn bad_cost_headers_fall_back_to_the_default_cost() {
    let policy = "
rules:
  - name: metered
    limit_keys: ['header:x-api-key']
    algorithm: token_bucket
    algorithm_config:
      rps: 0.001
      burst: 20
      cost_source: header:x-cost
      default_cost: 2
";
    let with_cost = |t: f64, cost: Option<&str>| {
        let mut headers = json!({"x-api-key": "k1"});
        if let Some(c) = cost {
            headers["X-Cost"] = json!(c);
        }
        json!({"t": t, "ip": "192.0.2.1", "path": "/", "headers": headers})
    };
    let events = [
        with_cost(0.0, Some("abc")),
        with_cost(0.0, Some("-1")),
        with_cost(0.0, Some("0")),
        with_cost(0.0, Some("NaN")),
        with_cost(0.0, None),
        with_cost(0.0, Some("3.5")),
    ];
    let ds = replay(policy, &events);
    // 20 - 2×5 = 10, then 10 - 3.5 = 6.5.
    assert_eq!(
        column(&ds, "remaining"),
        [18, 16, 14, 12, 10, 6]
            .map(Value::from)
            .iter()
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_cost_above_the_burst_is_refused_with_a_reason() {
    let policy = "
rules:
  - name: metered
    limit_keys: []
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 5, cost_source: 'query:n'}
";
    let ds = replay(
        policy,
        &[
            json!({"t": 0, "path": "/", "query": "n=50"}),
            json!({"t": 0, "path": "/", "query": "n=5"}),
        ],
    );
    assert_eq!(ds[0]["allowed"], false);
    assert_eq!(ds[0]["retry_after"], Value::Null);
    assert!(
        ds[0]["error"]
            .as_str()
            .unwrap()
            .contains("can never succeed")
    );
    // The refused request took nothing.
    assert_eq!(ds[1]["allowed"], true);
    assert_eq!(ds[1]["remaining"], 0);
}

#[test]
fn several_rules_are_one_transaction() {
    let policy = "
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 10}
  - name: per-key
    limit_keys: ['header:x-api-key']
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 2, burst: 3}
";
    let keyed =
        |t: f64| json!({"t": t, "ip": "192.0.2.1", "path": "/", "headers": {"x-api-key": "k"}});
    let events = [
        keyed(0.0),
        keyed(0.0),
        keyed(0.0),
        keyed(0.0),
        json!({"t": 0.0, "ip": "192.0.2.1", "path": "/"}),
    ];
    let ds = replay(policy, &events);
    // The most restrictive allowing rule speaks for allowed requests.
    assert_eq!(ds[0]["rule"], "per-key");
    assert_eq!(ds[0]["remaining"], 2);
    assert_eq!(ds[3]["allowed"], false);
    assert_eq!(ds[3]["rule"], "per-key");
    assert_eq!(ds[3]["retry_after"], 2.0);
    // per-ip did not pay for the denied request: 10 - 3 - 1 = 6.
    assert_eq!(ds[4]["rule"], "per-ip");
    assert_eq!(ds[4]["remaining"], 6);
}

#[test]
fn the_denying_rule_with_the_longest_wait_is_reported() {
    let policy = "
rules:
  - name: fast
    limit_keys: []
    algorithm: token_bucket
    algorithm_config: {rps: 2, burst: 1}
  - name: slow
    limit_keys: []
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 4, burst: 1}
";
    let ds = replay(policy, &[req(0.0, "192.0.2.1"), req(0.0, "192.0.2.1")]);
    assert_eq!(ds[1]["allowed"], false);
    assert_eq!(ds[1]["rule"], "slow");
    assert_eq!(ds[1]["retry_after"], 4.0);
}

#[test]
fn reservations_queue_within_max_reserved() {
    let policy = "
limits:
  sendMessage:
    algorithm: token_bucket
    algorithm_config: {rate: 10, period: 60, burst: 20, max_reserved: 50}
";
    let call = |t: f64, count: f64, reserve: bool| json!({"t": t, "limit": "sendMessage", "key": "user-1", "count": count, "reserve": reserve});
    let ds = replay(
        policy,
        &[
            call(0.0, 20.0, false),
            call(0.0, 1.0, false),
            call(0.0, 30.0, true),
            call(0.0, 25.0, true),
            call(0.0, 20.0, true),
            call(300.0, 1.0, false),
            call(306.0, 1.0, false),
        ],
    );
    assert_eq!(ds[0]["remaining"], 0);
    assert_eq!(ds[1]["allowed"], false);
    assert_eq!(ds[1]["retry_after"], 6.0);
    // Reserved: 30 tokens short, 6 s each.
    assert_eq!(ds[2]["allowed"], true);
    assert_eq!(ds[2]["retry_after"], 180.0);
    assert_eq!(ds[2]["rule"], "sendMessage");
    // 55 short would exceed max_reserved 50.
    assert_eq!(ds[3]["allowed"], false);
    assert_eq!(ds[3]["retry_after"], 330.0);
    // 50 short is exactly allowed.
    assert_eq!(ds[4]["allowed"], true);
    assert_eq!(ds[4]["retry_after"], 300.0);
    // After 300 s the debt is paid but nothing is left; 6 s later one token.
    assert_eq!(ds[5]["allowed"], false);
    assert_eq!(ds[6]["allowed"], true);
}

#[test]
fn shadow_rules_report_but_never_deny() {
    let policy = "
rules:
  - name: trial
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
    mode: shadow
";
    let ds = replay(policy, &[req(0.0, "192.0.2.1"), req(0.0, "192.0.2.1")]);
    assert_eq!(ds[1]["allowed"], true);
    assert_eq!(ds[1]["shadow_denied"], json!(["trial"]));
    assert!(ds[0].get("shadow_denied").is_none());
}

#[test]
fn unmatched_events_and_composite_keys() {
    let policy = "
rules:
  - name: per-ip-and-path
    limit_keys: [ip:address, path]
    match: {method: POST}
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
";
    let post = |ip: &str, path: &str| json!({"t": 0, "ip": ip, "method": "POST", "path": path});
    let ds = replay(
        policy,
        &[
            post("192.0.2.1", "/a"),
            post("192.0.2.1", "/b"),
            post("192.0.2.1", "/a"),
            req(0.0, "192.0.2.1"),
        ],
    );
    let allowed: Vec<bool> = ds.iter().map(|d| d["allowed"].as_bool().unwrap()).collect();
    assert_eq!(allowed, [true, true, false, true]);
    assert_eq!(ds[3]["rule"], Value::Null);
    assert_eq!(ds[3]["remaining"], Value::Null);
}

#[test]
fn replays_are_reproducible_and_summarised() {
    let dir = Dir::new();
    let p = dir.file(
        "policy.yaml",
        "
limits:
  hot:
    algorithm: token_bucket
    algorithm_config: {rps: 4, burst: 8, shards: 4}
",
    );
    let events: Vec<String> = (0..200)
        .map(|i| json!({"t": f64::from(i) * 0.05, "limit": "hot", "key": "k"}).to_string())
        .collect();
    let e = dir.file("events.jsonl", &events.join("\n"));
    let run = || sluice(&["replay", "-q", "--summary", "-p", path(&p), "-e", path(&e)]);
    let (a, b) = (run(), run());
    assert!(a.status.success());
    assert_eq!(a.stdout, b.stdout);
    let text = String::from_utf8(a.stdout).unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let hot = &last["summary"]["limits"][0];
    assert_eq!(hot["name"], "hot");
    assert_eq!(hot["hits"], 200);
    let allowed = hot["allowed"].as_u64().unwrap();
    // 10 s at 4/s plus the burst of 8 bounds what can be admitted.
    assert!(allowed <= 8 + 40, "{allowed}");
    assert!(allowed >= 30, "{allowed}");
    assert!(String::from_utf8_lossy(&a.stderr).contains("200 events"));
}

// ---- bad input: a clear error, a non-zero exit, never a panic ----

fn fails_with(out: &Output, wanted: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for w in wanted {
        assert!(stderr.contains(w), "missing {w:?} in: {stderr}");
    }
}

#[test]
fn bad_policies_are_reported_with_file_line_and_column() {
    let dir = Dir::new();
    let events = dir.file("e.jsonl", "");
    let cases = [
        (
            "malformed.yaml",
            "rules: [\n  {name: a\n",
            "malformed.yaml:",
        ),
        (
            "type.yaml",
            "rules:\n  - name: a\n    limit_keys: []\n    algorithm: token_bucket\n    algorithm_config: {rps: fast}\n",
            "type.yaml:5:",
        ),
        (
            "negative.yaml",
            "rules:\n  - name: a\n    limit_keys: []\n    algorithm: token_bucket\n    algorithm_config: {rps: -3}\n",
            "negative.yaml:5:29:",
        ),
        (
            "unknown.yaml",
            "rules:\n  - name: a\n    limit_keys: []\n    algorithm: token_bucket\n    algorithm_config: {rps: 3}\n    colour: red\n",
            "unknown.yaml:6:",
        ),
    ];
    for (name, text, place) in cases {
        let p = dir.file(name, text);
        fails_with(&sluice(&["validate", path(&p)]), &[place]);
        fails_with(
            &sluice(&["replay", "-p", path(&p), "-e", path(&events)]),
            &[place],
        );
    }
    let good = dir.file("good.yaml", PER_IP);
    let out = sluice(&["validate", path(&good)]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok (0 limits, 1 rules)"));
}

#[test]
fn bad_events_are_reported_with_their_line() {
    let dir = Dir::new();
    let p = dir.file(
        "p.yaml",
        &format!(
            "{PER_IP}limits:\n  l: {{algorithm: token_bucket, algorithm_config: {{rps: 1}}}}\n"
        ),
    );
    let cases = [
        (
            "{\"t\": 1, \"ip\": \"192.0.2.1\"}\n{\"t\": 0.5, \"ip\": \"192.0.2.1\"}\n",
            vec!["e.jsonl:2:", "out of time order"],
        ),
        ("{\"t\": 1}\n{\"t\": \n", vec!["e.jsonl:2:", "bad event"]),
        ("{\"t\": \"noon\"}\n", vec!["e.jsonl:1:", "invalid type"]),
        (
            "{\"t\": 1, \"limit\": \"nope\"}\n",
            vec!["e.jsonl:1", "no limit named \"nope\""],
        ),
        (
            "{\"t\": 1, \"ip\": \"not-an-ip\"}\n",
            vec!["e.jsonl:1:", "bad `ip`"],
        ),
        ("{\"t\": 1, \"limit\": \"l\", \"count\": -2}\n", vec![]),
    ];
    for (text, wanted) in cases {
        let e = dir.file("e.jsonl", text);
        let out = sluice(&["replay", "-q", "-p", path(&p), "-e", path(&e)]);
        if wanted.is_empty() {
            // A negative count is answered, not fatal: the event is refused.
            assert!(out.status.success());
            let line: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(line["allowed"], false);
            assert!(line["error"].as_str().unwrap().contains(">= 0"));
        } else {
            fails_with(&out, &wanted);
        }
    }
    fails_with(
        &sluice(&["replay", "-p", path(&p), "-e", "/nonexistent/e.jsonl"]),
        &["cannot open"],
    );
}

/// `/dev/zero` is a line without end. The replay must refuse it once the
/// line passes the bound, naming the file and the line, and its memory must
/// stay near that bound meanwhile: it is read from `/proc` while the
/// process runs, and the process is killed if it passes 64 MiB (an
/// unbounded read passed 3 GB in fifteen seconds).
#[cfg(target_os = "linux")]
#[test]
fn an_endless_line_is_refused_at_the_bound_with_bounded_memory() {
    use std::time::{Duration, Instant};
    const MOST_RSS_KIB: u64 = 64 << 10;

    let dir = Dir::new();
    let p = dir.file("p.yaml", PER_IP);
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["replay", "-q", "-p", path(&p), "-e", "/dev/zero"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let started = Instant::now();
    let mut most = 0;
    while child.try_wait().unwrap().is_none() {
        let high_water = std::fs::read_to_string(&status_file)
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_owned();
                line.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .unwrap_or(0);
        most = most.max(high_water);
        if most > MOST_RSS_KIB || started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the replay held {most} KiB after {:?}", started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    fails_with(
        &out,
        &["/dev/zero:1: the line is longer than 1048576 bytes"],
    );
    eprintln!(
        "refused after {:?}, at most {most} KiB seen",
        started.elapsed()
    );
}

/// A policy that is legal but likely wrong still validates, with a warning
/// per doubtful value at its file, line and column.
#[test]
fn validate_warns_about_likely_mistakes_and_still_succeeds() {
    let dir = Dir::new();
    let p = dir.file(
        "policy.yaml",
        "limits:\n  send:\n    algorithm: token_bucket\n    algorithm_config: {rate: 5}\n",
    );
    let out = sluice(&["validate", path(&p)]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let file = path(&p);
    assert!(
        stderr.contains(&format!(
            "{file}:2:3: warning: limit `send` has no `max_reserved`"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{file}:4:30: warning: `rate` without `period`")),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok (1 limits, 0 rules)"));
}

#[test]
fn a_call_that_brings_its_own_limit_replays_as_the_same_limit_in_the_policy() {
    let config = json!({"rate": 2, "period": 10});
    let calls = |inline: bool| -> Vec<Value> {
        [0.0, 1.0, 2.0, 5.5, 11.0]
            .iter()
            .map(|&t| {
                let mut e = json!({"t": t, "limit": "quota", "key": "org-7"});
                if inline {
                    e["algorithm"] = "sliding_log".into();
                    e["algorithm_config"] = config.clone();
                }
                e
            })
            .collect()
    };
    let policy =
        format!("limits: {{quota: {{algorithm: sliding_log, algorithm_config: {config}}}}}");
    let named = replay(&policy, &calls(false));
    let inline = replay("limits: {}", &calls(true));
    assert_eq!(inline, named);
    // 2 a 10 s period: the third call waits for the first to leave at 10 s.
    assert_eq!(
        column(&inline, "allowed"),
        [
            &json!(true),
            &json!(true),
            &json!(false),
            &json!(false),
            &json!(true)
        ]
    );
    assert_eq!(inline[2]["retry_after"], json!(8.0));
}

#[test]
fn ipv6_clients_are_keyed_by_their_64_unless_the_policy_says_otherwise() {
    let policy = |prefix: &str| {
        format!(
            "{prefix}rules:\n  - name: per-ip\n    limit_keys: [ip:address]\n    \
             algorithm: token_bucket\n    algorithm_config: {{rate: 1, period: 1h, burst: 1}}\n"
        )
    };
    let events = [
        req(0.0, "2001:db8:1:2::1"),
        req(0.0, "2001:db8:1:2:ffff::9"),
        req(0.0, "2001:db8:1:3::1"),
        req(0.0, "192.0.2.1"),
        req(0.0, "192.0.2.2"),
    ];
    // One /64 is one client: its second address finds the bucket spent.
    let ds = replay(&policy(""), &events);
    assert_eq!(column(&ds, "allowed"), [true, false, true, true, true]);
    // Keyed per address, each has its own.
    let ds = replay(&policy("ipv6_prefix: 128\n"), &events);
    assert_eq!(column(&ds, "allowed"), [true, true, true, true, true]);
    // A /48 puts both /64s of the site together.
    let ds = replay(&policy("ipv6_prefix: 48\n"), &events);
    assert_eq!(column(&ds, "allowed"), [true, false, false, true, true]);
}

#[test]
fn a_report_shows_each_rule_over_time_and_what_shadow_rules_would_have_done() {
    let dir = Dir::new();
    let policy = dir.file(
        "policy.yaml",
        "rules:\n  - name: per-ip\n    limit_keys: [ip:address]\n    algorithm: token_bucket\n    \
         algorithm_config: {rps: 1, burst: 2}\n  - name: tighter-trial\n    limit_keys: [ip:address]\n    \
         algorithm: token_bucket\n    algorithm_config: {rate: 1, period: 10s}\n    mode: shadow\n",
    );
    let lines: Vec<String> = (0..40)
        .map(|i| {
            req(
                f64::from(i) * 0.25,
                if i % 4 == 0 { "192.0.2.9" } else { "192.0.2.1" },
            )
            .to_string()
        })
        .collect();
    let events = dir.file("events.jsonl", &lines.join("\n"));
    let report = dir.0.path().join("report.html");
    let out = sluice(&[
        "replay",
        "--quiet",
        "--policy",
        path(&policy),
        "--events",
        path(&events),
        "--report",
        path(&report),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 40);
    let html = std::fs::read_to_string(&report).unwrap();
    assert_eq!(html.matches("<svg").count(), 4);
    for id in ["denied", "allowed", "shadow", "retry_after"] {
        assert!(
            html.contains(&format!("<figure id=\"{id}\">")),
            "no {id} chart"
        );
    }
    // The shadow rule's would-be denials are drawn, and the most denied
    // client tops the table.
    let shadow = &html[html.find("<figure id=\"shadow\">").unwrap()..];
    assert!(shadow[..shadow.find("</figure>").unwrap()].contains("tighter-trial"));
    assert!(html.contains("192.0.2.1 ("), "{html}");
    for outside in ["<script", "<link", "src=", "url(", "https://"] {
        assert!(
            !html.contains(outside),
            "the report refers outside itself: {outside}"
        );
    }
}

const CALENDAR: &str = "
rules:
  - name: monthly
    match: {path: /api/month}
    limit_keys: [ip:address]
    algorithm: fixed_window
    algorithm_config: {rate: 100, calendar: month, timezone: Europe/Berlin}
  - name: daily
    match: {path: /api/day}
    limit_keys: [ip:address]
    algorithm: fixed_window
    algorithm_config: {rate: 10, calendar: day, timezone: Europe/Berlin}
";

fn at(t: i64, path: &str) -> Value {
    json!({"t": t, "ip": "203.0.113.9", "method": "GET", "path": path})
}

/// Events at 31 March 2026, 23:59:59 in Berlin (two days into summer
/// time), then from 1 April, 00:00:00: a hundred of each are admitted.
#[test]
fn a_monthly_quota_in_berlin_renews_at_local_midnight_on_replay() {
    let (march, april) = (1_774_994_399, 1_774_994_400);
    let mut events: Vec<Value> = (0..101).map(|_| at(march, "/api/month")).collect();
    events.extend((0..101).map(|_| at(april, "/api/month")));
    let ds = replay(CALENDAR, &events);
    let admitted = |ds: &[Value]| ds.iter().filter(|d| d["allowed"] == true).count();
    assert_eq!(admitted(&ds[..101]), 100);
    assert_eq!(ds[100]["allowed"], false);
    assert_eq!(ds[100]["retry_after"], 1.0);
    assert_eq!(admitted(&ds[101..]), 100);
    assert_eq!(ds[201]["retry_after"], 30.0 * 86_400.0, "April has 30 days");
}

/// On 25 October 2026 Berlin's clocks go back: the day lasts 25 hours, and
/// its quota of ten is admitted once in them.
#[test]
fn a_daily_quota_on_the_day_clocks_go_back_admits_once_on_replay() {
    let day = 1_792_879_200; // 2026-10-25T00:00:00+02:00
    let hour = 3_600;
    let mut events: Vec<Value> = (0..11).map(|_| at(day, "/api/day")).collect();
    events.push(at(day + 24 * hour, "/api/day"));
    events.extend((0..11).map(|_| at(day + 25 * hour, "/api/day")));
    let ds = replay(CALENDAR, &events);
    let allowed: Vec<bool> = ds.iter().map(|d| d["allowed"] == true).collect();
    let mut want = vec![true; 10];
    want.push(false);
    want.push(false);
    want.extend([true; 10]);
    want.push(false);
    assert_eq!(allowed, want);
    assert_eq!(ds[10]["retry_after"], 25.0 * 3_600.0);
    assert_eq!(ds[11]["retry_after"], 3_600.0, "an hour of the 25 is left");
    assert_eq!(ds[22]["retry_after"], 24.0 * 3_600.0);
}
