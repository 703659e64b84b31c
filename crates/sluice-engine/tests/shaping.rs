//! Shaping: rules that delay hold a request over their limit until its
//! reservation is due, refuse beyond their `max`, and give a reservation
//! back when the request is abandoned; `until_ready_named` does the same
//! for a named limit's call.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Clock, MemoryStore, Mode, Nanos};
use sluice_engine::{Enforcer, NotReady, Verdict};
use sluice_policy::{Policy, RequestParts};
use tokio::time::Instant;

/// The store's clock, following Tokio's, so that paused time moves both.
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        Nanos(i64::try_from(self.0.elapsed().as_nanos()).unwrap())
    }
}

fn enforcer(policy: &str) -> Enforcer<MemoryStore<TokioClock>> {
    let store = MemoryStore::with_clock(TokioClock(Instant::now()));
    Enforcer::new(Policy::from_str(policy, "p").unwrap(), store)
}

/// One rule at 10 a second, a bucket of 1 and room for `reserved` more,
/// held for up to `max`.
fn shaped(reserved: u32, max: &str) -> String {
    format!(
        "rules:\n  - name: shaped\n    limit_keys: [ip:address]\n    algorithm: token_bucket\n    \
         algorithm_config: {{rps: 10, burst: 1, max_reserved: {reserved}}}\n    \
         on_limit: {{delay: {{max: {max}}}}}\n"
    )
}

fn request() -> RequestParts {
    RequestParts::new("GET", "/").with_ip([192, 0, 2, 1].into())
}

async fn shaped_verdict<S: sluice_core::Store + 'static>(e: &Enforcer<S>) -> Verdict {
    e.enforce_shaped(&request()).await
}

const MS: fn(u64) -> Duration = Duration::from_millis;

#[tokio::test(start_paused = true)]
async fn requests_beyond_the_bucket_are_held_one_interval_apart_up_to_max_reserved() {
    let e = enforcer(&shaped(3, "1s"));
    let mut delays = Vec::new();
    for _ in 0..5 {
        let v = shaped_verdict(&e).await;
        delays.push(v.allowed.then_some(v.delay));
    }
    let want = [
        Some(None),
        Some(Some(MS(100))),
        Some(Some(MS(200))),
        Some(Some(MS(300))),
        None,
    ];
    assert_eq!(delays, want);
}

#[tokio::test(start_paused = true)]
async fn a_refused_request_beyond_max_reserved_says_when_to_retry() {
    let e = enforcer(&shaped(1, "1s"));
    shaped_verdict(&e).await;
    shaped_verdict(&e).await;
    let refused = shaped_verdict(&e).await;
    assert!(!refused.allowed);
    assert_eq!(refused.denied_by(), Some("shaped"));
    assert_eq!(refused.delay, None);
    assert!(refused.reserved.is_empty());
    let wait = refused.retry_after.unwrap();
    assert!((wait - 0.2).abs() < 1e-9, "{wait}");
}

#[tokio::test(start_paused = true)]
async fn a_wait_longer_than_max_is_refused_and_its_reservation_given_back() {
    // Room for 10 held, but only 250 ms of waiting: the fourth would wait 300.
    let e = enforcer(&shaped(10, "250ms"));
    for _ in 0..3 {
        assert!(shaped_verdict(&e).await.allowed);
    }
    let refused = shaped_verdict(&e).await;
    assert!(!refused.allowed, "{refused:?}");
    assert_eq!(refused.delay, None);
    assert!((refused.retry_after.unwrap() - 0.3).abs() < 1e-9);
    assert!(!refused.rules[0].decision.allowed);
    // Given back: the next is told 300 ms again, not 400.
    let again = shaped_verdict(&e).await;
    assert!((again.retry_after.unwrap() - 0.3).abs() < 1e-9, "{again:?}");
}

#[tokio::test(start_paused = true)]
async fn a_request_that_another_rule_would_refuse_is_refused_not_held() {
    let policy = format!(
        "{}  - name: plain\n    limit_keys: [ip:address]\n    algorithm: token_bucket\n    \
         algorithm_config: {{rps: 10, burst: 1}}\n",
        shaped(3, "1s")
    );
    let e = enforcer(&policy);
    assert!(shaped_verdict(&e).await.allowed);
    let second = shaped_verdict(&e).await;
    assert!(!second.allowed && second.delay.is_none());
}

#[tokio::test(start_paused = true)]
async fn shadow_rules_and_callers_that_cannot_hold_never_delay() {
    let shadow = shaped(3, "1s").replace("    on_limit", "    mode: shadow\n    on_limit");
    let e = enforcer(&shadow);
    for _ in 0..3 {
        let v = shaped_verdict(&e).await;
        assert!(v.allowed && v.delay.is_none());
    }
    assert!(!shaped_verdict(&e).await.shadow[0].allowed);

    let e = enforcer(&shaped(3, "1s"));
    let policy = e.policy();
    assert!(e.enforce_with(&policy, &request()).await.allowed);
    let refused = e.enforce_with(&policy, &request()).await;
    assert!(!refused.allowed && refused.delay.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_held_request_that_is_abandoned_gives_its_tokens_back() {
    let e = enforcer(&shaped(3, "1s"));
    shaped_verdict(&e).await;
    let mut held = shaped_verdict(&e).await;
    assert_eq!(held.delay, Some(MS(100)));
    let reservation = e.reservation(&mut held);
    assert_eq!(e.activity().held, 1);
    drop(reservation);
    assert_eq!(e.activity().held, 0);
    // The refund is a task of its own.
    tokio::task::yield_now().await;
    assert_eq!(shaped_verdict(&e).await.delay, Some(MS(100)));
}

#[tokio::test(start_paused = true)]
async fn a_held_request_that_goes_on_keeps_its_tokens_spent() {
    let e = enforcer(&shaped(3, "1s"));
    shaped_verdict(&e).await;
    let mut held = shaped_verdict(&e).await;
    let reservation = e.reservation(&mut held);
    let start = Instant::now();
    reservation.until_due().await;
    assert_eq!(start.elapsed(), MS(100));
    tokio::task::yield_now().await;
    // Due now: its token is spent, and the next waits a whole interval.
    assert_eq!(shaped_verdict(&e).await.delay, Some(MS(100)));
}

const NAMED: &str = "limits:\n  send:\n    algorithm: token_bucket\n    \
                     algorithm_config: {rps: 10, burst: 1, max_reserved: 10}\n";

#[tokio::test(start_paused = true)]
async fn until_ready_waits_until_each_call_is_due() {
    let e = enforcer(NAMED);
    let policy = e.policy();
    let send = policy.named_limit("send").unwrap();
    let start = Instant::now();
    let mut went = Vec::new();
    for _ in 0..4 {
        e.until_ready_named(send, "alice", 1.0, Duration::from_secs(1), None)
            .await
            .unwrap();
        went.push(start.elapsed());
    }
    assert_eq!(went, [MS(0), MS(100), MS(200), MS(300)]);
    assert_eq!(e.activity().held, 0);
}

#[tokio::test(start_paused = true)]
async fn until_ready_refuses_a_wait_beyond_max_and_gives_it_back() {
    let e = enforcer(NAMED);
    let policy = e.policy();
    let send = policy.named_limit("send").unwrap();
    e.until_ready_named(send, "alice", 1.0, MS(100), None)
        .await
        .unwrap();
    let start = Instant::now();
    let err = e.until_ready_named(send, "alice", 3.0, MS(100), None).await;
    assert!(
        matches!(err, Err(NotReady::Wait(w)) if w == MS(300)),
        "{err:?}"
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "not waited");
    // Given back: a call of 1 is due in 100 ms, as before the refused one.
    let d = e
        .decide_named(send, "alice", 1.0, Mode::RESERVE)
        .await
        .unwrap();
    assert_eq!(d.decision.retry_after, Some(0.1));
}

#[tokio::test(start_paused = true)]
async fn until_ready_beyond_max_reserved_says_how_long_without_waiting() {
    let e = enforcer(NAMED);
    let policy = e.policy();
    let send = policy.named_limit("send").unwrap();
    let d = e
        .decide_named(send, "alice", 11.0, Mode::RESERVE)
        .await
        .unwrap();
    assert!(d.decision.allowed);
    let start = Instant::now();
    let err = e.until_ready_named(send, "alice", 1.0, MS(100), None).await;
    assert!(
        matches!(err, Err(NotReady::Wait(w)) if w == MS(1100)),
        "{err:?}"
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "not waited");
}

#[tokio::test(start_paused = true)]
async fn until_ready_dropped_before_it_is_due_gives_the_reservation_back() {
    let e = Arc::new(enforcer(NAMED));
    let policy = e.policy();
    let send = policy.named_limit("send").unwrap();
    e.until_ready_named(send, "alice", 1.0, MS(500), None)
        .await
        .unwrap();
    let waiting = e.until_ready_named(send, "alice", 2.0, MS(500), None);
    let timed_out = tokio::time::timeout(MS(50), waiting).await;
    assert!(timed_out.is_err());
    assert_eq!(e.activity().held, 0);
    tokio::task::yield_now().await;
    // 50 ms later, the key is half a token short again, not two and a half.
    let d = e
        .decide_named(send, "alice", 1.0, Mode::RESERVE)
        .await
        .unwrap();
    assert_eq!(d.decision.retry_after, Some(0.05));
}

#[tokio::test(start_paused = true)]
async fn until_ready_adds_at_most_the_jitter_to_a_wait() {
    let e = enforcer(NAMED);
    let policy = e.policy();
    let send = policy.named_limit("send").unwrap();
    let mut extra = Vec::new();
    for i in 0..10 {
        let start = Instant::now();
        e.until_ready_named(send, &format!("k{i}"), 2.0, MS(500), Some(MS(40)))
            .await
            .unwrap();
        extra.push(start.elapsed() - MS(100));
    }
    assert!(extra.iter().all(|x| *x <= MS(40)), "{extra:?}");
    assert!(extra.iter().any(|x| *x > Duration::ZERO), "{extra:?}");
}

#[tokio::test(start_paused = true)]
async fn a_key_serving_a_penalty_cannot_reserve_its_way_through() {
    let e = enforcer(
        "limits:\n  login:\n    algorithm: token_bucket\n    \
         algorithm_config: {rps: 1, burst: 1, max_reserved: 100}\n    penalty: 1h\n",
    );
    let policy = e.policy();
    let login = policy.named_limit("login").unwrap();
    let call = |mode| e.decide_named(login, "mallory", 1.0, mode);
    assert!(call(Mode::CONSUME).await.unwrap().decision.allowed);
    // Denied: the penalty starts.
    assert!(!call(Mode::CONSUME).await.unwrap().decision.allowed);
    let reserved = call(Mode::RESERVE).await.unwrap().decision;
    assert!(!reserved.allowed, "{reserved:?}");
    assert_eq!(reserved.retry_after, Some(3600.0));
    // Nothing was reserved meanwhile: once the penalty is over, a call passes at once.
    tokio::time::advance(Duration::from_secs(3600)).await;
    let after = call(Mode::CONSUME).await.unwrap().decision;
    assert!(after.allowed, "{after:?}");
}
