//! Decisions are counted by rule, outcome and mode, through the metric
//! handles the enforcer keeps: the counts must keep adding up after the
//! first decision of each rule, when the handles are reused.

#![allow(clippy::unwrap_used)]

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use sluice_core::{
    Decision, Limit, MemoryStore, Mode, OnStoreError, Op, Outcome, Settle, Store, StoreError, Value,
};
use sluice_engine::{Enforcer, Refusal};
use sluice_policy::{Policy, RequestParts};

const POLICY: &str = r#"
limits:
  send: {algorithm: token_bucket, algorithm_config: {rate: 1, period: 1h, burst: 2}}
rules:
  - name: enforced
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 1h, burst: 1}
  - name: trial
    limit_keys: [ip:address]
    mode: shadow
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 1h, burst: 2}
"#;

/// A recorded counter: its name, labels and value.
type Recorded = (String, Vec<(String, String)>, u64);

/// The value of counter `series` with these labels, if recorded.
fn counter(snapshot: &[Recorded], series: &str, want: &[(&str, &str)]) -> Option<u64> {
    snapshot
        .iter()
        .find(|(name, l, _)| {
            name == series
                && want
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, v)| *v)
}

/// The value of `sluice_decisions_total` with these labels, if recorded.
fn decisions(snapshot: &[Recorded], labels: [&str; 3]) -> Option<u64> {
    let want = [
        ("rule", labels[0]),
        ("outcome", labels[1]),
        ("mode", labels[2]),
    ];
    counter(snapshot, "sluice_decisions_total", &want)
}

/// Runs `f` with a recorder of its own and returns the counters it left.
fn recorded(f: impl FnOnce(&tokio::runtime::Runtime)) -> Vec<Recorded> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || f(&rt));
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Counter(v) = value else {
                return None;
            };
            let (name, labels) = key.key().clone().into_parts();
            let labels = labels
                .into_iter()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            Some((name.as_str().to_owned(), labels, v))
        })
        .collect()
}

#[test]
fn penalties_started_and_settlements_are_counted() {
    let policy = "limits: {login: {algorithm: token_bucket, algorithm_config: {rate: 1, period: 1h, burst: 1}, penalty: 1m}}";
    let snapshot = recorded(|rt| {
        let enforcer = Enforcer::new(Policy::from_str(policy, "p").unwrap(), MemoryStore::new());
        let policy = enforcer.policy();
        let login = policy.named_limit("login").unwrap();
        // Allowed, denied (a penalty starts), denied (serving it).
        for _ in 0..3 {
            rt.block_on(enforcer.decide_named(login, "mallory", 1.0, Mode::CONSUME))
                .unwrap();
        }
        for change in [
            Settle::Refund(1.0),
            Settle::Charge(2.0),
            Settle::Refund(1.0),
        ] {
            rt.block_on(enforcer.settle_named(login, "alice", change))
                .unwrap();
        }
    });
    assert_eq!(
        counter(&snapshot, "sluice_penalties_total", &[("rule", "login")]),
        Some(1)
    );
    assert_eq!(
        decisions(&snapshot, ["login", "denied", "enforce"]),
        Some(2)
    );
    let settled = |kind| {
        counter(
            &snapshot,
            "sluice_settlements_total",
            &[("limit", "login"), ("kind", kind)],
        )
    };
    assert_eq!((settled("refund"), settled("charge")), (Some(2), Some(1)));
}

#[test]
fn decisions_are_counted_by_rule_outcome_and_mode() {
    let snapshot = recorded(|rt| {
        let enforcer = Enforcer::new(Policy::from_str(POLICY, "p").unwrap(), MemoryStore::new());
        let req = RequestParts::new("GET", "/").with_ip([192, 0, 2, 1].into());
        // enforced: allowed, then denied twice; trial: allowed twice, then
        // denied (a shadow rule is consulted even when an enforced one denies).
        let policy = enforcer.policy();
        for _ in 0..3 {
            rt.block_on(enforcer.enforce_with(&policy, &req));
        }
        let send = policy.named_limit("send").unwrap();
        for _ in 0..3 {
            rt.block_on(enforcer.decide_named(send, "alice", 1.0, Mode::CONSUME))
                .unwrap();
        }
    });
    assert_eq!(
        decisions(&snapshot, ["enforced", "allowed", "enforce"]),
        Some(1)
    );
    assert_eq!(
        decisions(&snapshot, ["enforced", "denied", "enforce"]),
        Some(2)
    );
    assert_eq!(
        decisions(&snapshot, ["trial", "allowed", "shadow"]),
        Some(2)
    );
    assert_eq!(decisions(&snapshot, ["trial", "denied", "shadow"]), Some(1));
    assert_eq!(
        decisions(&snapshot, ["send", "allowed", "enforce"]),
        Some(2)
    );
    assert_eq!(decisions(&snapshot, ["send", "denied", "enforce"]), Some(1));
    // A rule has series only for the mode it is in: an exporter would list
    // a registered series at 0, and wrongly.
    for [rule, mode] in [
        ["enforced", "shadow"],
        ["trial", "enforce"],
        ["send", "shadow"],
    ] {
        for outcome in ["allowed", "denied"] {
            assert_eq!(decisions(&snapshot, [rule, outcome, mode]), None);
        }
    }
}

/// A store that is down: every call fails.
struct Down;

fn down() -> StoreError {
    StoreError::Unavailable("connection refused".into())
}

impl Store for Down {
    async fn transact(&self, _: &[Op<'_>], _: Mode) -> Result<Outcome, StoreError> {
        Err(down())
    }

    async fn reset(&self, _: &Limit, _: &str) -> Result<(), StoreError> {
        Err(down())
    }

    async fn value(&self, _: &Limit, _: &str) -> Result<Value, StoreError> {
        Err(down())
    }

    async fn settle(&self, _: &Limit, _: &str, _: Settle) -> Result<Decision, StoreError> {
        Err(down())
    }

    async fn release(&self, _: &Limit, _: &str, _: u64) -> Result<bool, StoreError> {
        Err(down())
    }
}

const FAILING: &str = r#"
limits:
  lenient: {algorithm: token_bucket, algorithm_config: {rps: 1}, on_store_error: open}
  strict: {algorithm: token_bucket, algorithm_config: {rps: 1}, on_store_error: closed}
rules:
  - name: open-rule
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 1}
    on_store_error: open
  - name: closed-rule
    limit_keys: [ip:address]
    match: {path: /strict}
    algorithm: token_bucket
    algorithm_config: {rps: 1}
    on_store_error: closed
  - name: trial
    limit_keys: [ip:address]
    mode: shadow
    algorithm: token_bucket
    algorithm_config: {rps: 1}
"#;

#[test]
fn decisions_made_without_the_store_say_so_and_are_counted_by_how() {
    let snapshot = recorded(|rt| {
        let enforcer = Enforcer::new(Policy::from_str(FAILING, "p").unwrap(), Down);
        let policy = enforcer.policy();
        let at = |path| RequestParts::new("GET", path).with_ip([192, 0, 2, 1].into());

        let open = rt.block_on(enforcer.enforce_with(&policy, &at("/")));
        assert!(open.allowed);
        assert_eq!(open.without_store, Some(OnStoreError::Open));
        // One rule failing closed denies the whole transaction.
        let closed = rt.block_on(enforcer.enforce_with(&policy, &at("/strict")));
        assert!(!closed.allowed);
        assert_eq!(closed.without_store, Some(OnStoreError::Closed));
        assert!(matches!(
            closed.refusal,
            Some((ref rule, Refusal::StoreFailed(_))) if rule == "closed-rule"
        ));

        let lenient = policy.named_limit("lenient").unwrap();
        let d = rt
            .block_on(enforcer.decide_named(lenient, "k", 1.0, Mode::CONSUME))
            .unwrap();
        assert!(d.decision.allowed);
        assert_eq!(d.without_store, Some(OnStoreError::Open));
        let strict = policy.named_limit("strict").unwrap();
        assert!(
            rt.block_on(enforcer.decide_named(strict, "k", 1.0, Mode::CONSUME))
                .is_err()
        );

        // A store that answers leaves nothing to say.
        let fine = Enforcer::new(Policy::from_str(FAILING, "p").unwrap(), MemoryStore::new());
        let v = rt.block_on(fine.enforce(&at("/strict")));
        assert_eq!(v.without_store, None);
        let d = rt
            .block_on(fine.decide_named(lenient, "k", 1.0, Mode::CONSUME))
            .unwrap();
        assert_eq!(d.without_store, None);
    });
    let without = |rule, fail| {
        counter(
            &snapshot,
            "sluice_decisions_without_store_total",
            &[("rule", rule), ("fail", fail)],
        )
    };
    // open-rule admitted once and was denied once, with closed-rule.
    assert_eq!(without("open-rule", "open"), Some(1));
    assert_eq!(without("open-rule", "closed"), Some(1));
    assert_eq!(without("closed-rule", "closed"), Some(1));
    assert_eq!(without("closed-rule", "open"), None);
    assert_eq!(without("lenient", "open"), Some(1));
    assert_eq!(without("strict", "closed"), Some(1));
    // A shadow rule answers no one.
    assert_eq!(without("trial", "open"), None);
}
