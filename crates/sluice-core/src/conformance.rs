//! The store conformance suite: the semantics every [`Store`] must show,
//! checked through the trait alone on a fake clock, so that the in-memory
//! store and the Redis store are held to one standard.
//!
//! Enabled by the `conformance` feature. Each check takes a store reading
//! time from the given [`FakeClock`] and panics on the first divergence.
//!
//! ```
//! use sluice_core::{FakeClock, MemoryStore, Nanos};
//! let clock = FakeClock::new(Nanos::ZERO);
//! let store = MemoryStore::with_clock(clock.clone());
//! // MemoryStore's futures are ready at once, so one poll runs the suite.
//! let mut suite = std::pin::pin!(sluice_core::conformance::run_all(&store, &clock));
//! let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
//! assert!(suite.as_mut().poll(&mut cx).is_ready());
//! ```

// A conformance suite reports a divergence by panicking, like a test.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use crate::algorithm::{State, evaluate, key_offset};
use crate::sliding::{Log, MAX_LOG_ENTRIES, WindowState, window_evaluate};
use crate::{
    Algorithm, Calendar, CalendarUnit, Clock, Concurrency, CostError, Decision, FakeClock,
    FixedWindow, Limit, MAX_SLOTS, MemoryStore, Mode, Nanos, Op, Settle, SlidingLog, SlidingWindow,
    Store, StoreError, TokenBucket,
};

const S: i64 = Nanos::PER_SEC;

/// Runs every check in turn. Each uses its own limit names, so one store
/// (and one Redis) serves them all.
pub async fn run_all<St: Store>(store: &St, clock: &FakeClock) {
    run_token_bucket_and_fixed_window(store, clock).await;
    run_sliding(store, clock).await;
    run_calendar(store, clock).await;
}

/// The checks of the token bucket and the fixed window, and of what every
/// store does whatever the algorithm (transactions, resets, shards).
pub async fn run_token_bucket_and_fixed_window<St: Store>(store: &St, clock: &FakeClock) {
    burst_then_exact_retry(store, clock).await;
    fractional_costs_and_partial_refill(store, clock).await;
    idle_gap_refills_to_full_only(store, clock).await;
    checks_never_consume(store, clock).await;
    reservations_up_to_max_reserved(store, clock).await;
    fixed_window_boundaries(store, clock).await;
    transactions_are_all_or_nothing(store, clock).await;
    same_key_twice_pays_twice(store, clock).await;
    reset_and_value(store, clock).await;
    impossible_and_invalid_costs(store, clock).await;
    backward_clock_credits_nothing(store, clock).await;
    shards_admit_the_whole_burst(store, clock).await;
    agrees_with_the_pure_algorithm(store, clock).await;
    settling_refunds_up_to_capacity_and_charges_below_zero(store, clock).await;
    a_penalty_gate_shuts_for_exactly_its_penalty(store, clock).await;
}

/// The checks of the sliding window and the sliding log.
pub async fn run_sliding<St: Store>(store: &St, clock: &FakeClock) {
    sliding_window_weighs_the_previous_window(store, clock).await;
    sliding_log_waits_for_entries_to_leave(store, clock).await;
    sliding_log_and_token_bucket_in_one_transaction(store, clock).await;
    sliding_refuses_reservations_and_impossible_costs(store, clock).await;
    sliding_reset_and_value(store, clock).await;
    sliding_log_sums_what_is_left_afresh(store, clock).await;
    sliding_same_key_twice_pays_twice(store, clock).await;
    a_change_of_kind_never_grants_a_burst(store, clock).await;
    a_change_of_kind_and_back_never_grants_a_burst(store, clock).await;
    sliding_settles_like_the_others(store, clock).await;
    concurrency_holds_at_most_max_in_flight(store, clock).await;
    concurrency_refuses_what_it_cannot_hold(store, clock).await;
    a_lease_joins_a_transaction(store, clock).await;
    sliding_agrees_with_the_pure_algorithm(store, clock).await;
    transactions_agree_with_the_memory_store(store, clock).await;
    keys_as_fat_as_allowed_agree_with_the_memory_store(store, clock).await;
}

fn tb(rate: f64, burst: f64) -> TokenBucket {
    TokenBucket::new(rate, burst).unwrap()
}

fn step(clock: &FakeClock, ns: i64) {
    clock.advance(Duration::from_nanos(ns.unsigned_abs()));
}

async fn one<St: Store>(store: &St, limit: &Limit, key: &str, cost: f64, mode: Mode) -> Decision {
    store
        .decide(Op::new(limit, key, cost), mode)
        .await
        .unwrap_or_else(|e| panic!("{}: unexpected error {e}", limit.name()))
}

/// A burst at one instant, then the exact wait, then one more.
pub async fn burst_then_exact_retry<St: Store>(store: &St, clock: &FakeClock) {
    let l = Limit::new(
        "conf-burst",
        TokenBucket::per_period(10.0, Nanos(60 * S))
            .unwrap()
            .with_capacity(20.0)
            .unwrap(),
    );
    for i in 0..20 {
        let d = one(store, &l, "k", 1.0, Mode::CONSUME).await;
        assert!(d.allowed, "call {i} of the burst");
        assert_eq!(d.remaining, 19 - i);
    }
    let d = one(store, &l, "k", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(6.0));
    assert_eq!(d.reset, 120.0);
    step(clock, 6 * S - 1);
    assert!(!one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
    step(clock, 1);
    let d = one(store, &l, "k", 1.0, Mode::CONSUME).await;
    assert!(d.allowed, "allowed exactly at retry_after");
    assert_eq!(d.remaining, 0);
}

/// Fractional costs; `remaining` is the floor.
pub async fn fractional_costs_and_partial_refill<St: Store>(store: &St, clock: &FakeClock) {
    let l = Limit::new("conf-frac", tb(2.0, 5.0));
    let d = one(store, &l, "k", 2.5, Mode::CONSUME).await;
    assert!(d.allowed);
    assert_eq!(d.remaining, 2);
    let d = one(store, &l, "k", 2.75, Mode::CONSUME).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(0.125));
    step(clock, S / 8);
    let d = one(store, &l, "k", 2.75, Mode::CONSUME).await;
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.reset, 2.5);
}

/// An idle gap longer than the refill time leaves the bucket full, no more.
pub async fn idle_gap_refills_to_full_only<St: Store>(store: &St, clock: &FakeClock) {
    let l = Limit::new("conf-gap", tb(1.0, 3.0));
    for _ in 0..3 {
        assert!(one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
    }
    step(clock, 86_400 * S);
    for _ in 0..3 {
        assert!(one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
    }
    assert!(!one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
}

/// A check reports without consuming, allowed or not.
pub async fn checks_never_consume<St: Store>(store: &St, _clock: &FakeClock) {
    let l = Limit::new("conf-check", tb(1.0, 2.0));
    for _ in 0..5 {
        let d = one(store, &l, "k", 2.0, Mode::CHECK).await;
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
    }
    assert!(one(store, &l, "k", 2.0, Mode::CONSUME).await.allowed);
    let d = one(store, &l, "k", 1.0, Mode::CHECK).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(1.0));
}

/// Reservations go below zero up to `max_reserved` inclusive.
pub async fn reservations_up_to_max_reserved<St: Store>(store: &St, clock: &FakeClock) {
    let l = Limit::new("conf-reserve", tb(1.0, 2.0).with_max_reserved(3.0).unwrap());
    let d = one(store, &l, "k", 5.0, Mode::RESERVE).await;
    assert!(d.allowed);
    assert_eq!(d.retry_after, Some(3.0));
    assert_eq!(d.remaining, 0);
    let d = one(store, &l, "k", 0.5, Mode::RESERVE).await;
    assert!(!d.allowed, "beyond max_reserved");
    assert_eq!(d.retry_after, Some(3.5));
    step(clock, 3 * S);
    let d = one(store, &l, "k", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed, "the reservation is still being paid back");
    step(clock, S);
    assert!(one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
}

/// Fixed windows reset at the boundary, not before.
pub async fn fixed_window_boundaries<St: Store>(store: &St, clock: &FakeClock) {
    let base = clock.now();
    let start = Nanos(base.0 - base.0.rem_euclid(10 * S));
    let fw = FixedWindow::new(3.0, Nanos(10 * S))
        .unwrap()
        .with_start(start);
    let l = Limit::new("conf-window", fw);
    // Move to the next window's start, then 9.999 s into it.
    let into = clock.now().0 - start.0;
    step(clock, 10 * S - into);
    step(clock, 9_999_000_000);
    for _ in 0..3 {
        assert!(one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
    }
    let d = one(store, &l, "k", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed);
    let retry = d.retry_after.unwrap();
    assert!((retry - 0.001).abs() < 1e-9, "retry_after {retry}");
    step(clock, S / 1000);
    for _ in 0..3 {
        assert!(one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
    }
    assert!(!one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
}

/// A denial anywhere denies the whole transaction and consumes nothing; the
/// largest retry_after is reported.
pub async fn transactions_are_all_or_nothing<St: Store>(store: &St, _clock: &FakeClock) {
    let fast = Limit::new("conf-txn-fast", tb(10.0, 5.0));
    let slow = Limit::new("conf-txn-slow", tb(0.5, 1.0));
    let ops = [Op::new(&fast, "k", 1.0), Op::new(&slow, "k", 1.0)];
    let o = store.transact(&ops, Mode::CONSUME).await.unwrap();
    assert!(o.allowed, "{o:?}");
    let o = store.transact(&ops, Mode::CONSUME).await.unwrap();
    assert!(!o.allowed, "{o:?}");
    assert_eq!(o.retry_after(), Some(2.0));
    assert_eq!(o.decisions.len(), 2);
    // The fast limit would have allowed, and reports what it still holds:
    // the denial spent nothing.
    let fast_d = o.decisions[0];
    assert!(fast_d.allowed && fast_d.retry_after.is_none(), "{o:?}");
    assert_eq!((fast_d.remaining, fast_d.reset), (4, 0.1), "{o:?}");
    // The fast limit paid only for the first transaction.
    let d = one(store, &fast, "k", 4.0, Mode::CONSUME).await;
    assert!(
        d.allowed,
        "a denied transaction consumed from another limit"
    );
    assert!(!one(store, &fast, "k", 1.0, Mode::CHECK).await.allowed);
}

/// The same key twice in one transaction pays twice.
pub async fn same_key_twice_pays_twice<St: Store>(store: &St, _clock: &FakeClock) {
    let l = Limit::new("conf-twice", tb(1.0, 3.0));
    let ops = [Op::new(&l, "k", 2.0), Op::new(&l, "k", 2.0)];
    let o = store.transact(&ops, Mode::CONSUME).await.unwrap();
    assert!(!o.allowed, "4 tokens from a bucket of 3");
    assert!(o.decisions[0].allowed);
    assert_eq!(o.decisions[0].remaining, 3, "nothing was spent: {o:?}");
    assert_eq!(o.decisions[0].reset, 0.0, "{o:?}");
    let ops = [Op::new(&l, "k", 1.0), Op::new(&l, "k", 2.0)];
    let o = store.transact(&ops, Mode::CONSUME).await.unwrap();
    assert!(o.allowed);
    assert_eq!(o.decisions[1].remaining, 0);
}

/// `reset` restores full; `value` reports the tokens now.
pub async fn reset_and_value<St: Store>(store: &St, clock: &FakeClock) {
    let l = Limit::new("conf-reset", tb(1.0, 4.0));
    assert_eq!(store.value(&l, "k").await.unwrap().tokens, 4.0);
    assert!(one(store, &l, "k", 4.0, Mode::CONSUME).await.allowed);
    assert!(!one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
    assert!(!one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
    step(clock, S / 2);
    let v = store.value(&l, "k").await.unwrap();
    assert_eq!(v.tokens, 0.5);
    assert_eq!(v.ts, clock.now());
    store.reset(&l, "k").await.unwrap();
    assert_eq!(store.value(&l, "k").await.unwrap().tokens, 4.0);
    assert!(one(store, &l, "k", 4.0, Mode::CONSUME).await.allowed);
}

/// A cost above burst + max_reserved is an error, not a denial; up to it,
/// the formula decides.
pub async fn impossible_and_invalid_costs<St: Store>(store: &St, _clock: &FakeClock) {
    let l = Limit::new("conf-cost", tb(1.0, 2.0).with_max_reserved(1.0).unwrap());
    let err = |r: Result<Decision, StoreError>| match r {
        Err(StoreError::Cost(c)) => c,
        other => panic!("expected a cost error, got {other:?}"),
    };
    for mode in [Mode::CONSUME, Mode::RESERVE] {
        let e = err(store.decide(Op::new(&l, "k", 3.5), mode).await);
        assert!(matches!(e, CostError::Impossible { max, .. } if max == 3.0));
    }
    let d = store
        .decide(Op::new(&l, "k", 2.5), Mode::CONSUME)
        .await
        .unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(0.5));
    let d = store
        .decide(Op::new(&l, "k", 2.5), Mode::RESERVE)
        .await
        .unwrap();
    assert!(d.allowed);
    assert_eq!(d.retry_after, Some(0.5));
    // Without max_reserved, a call that does not reserve can never take
    // more than the burst.
    let unbounded = Limit::new("conf-cost-unbounded", tb(1.0, 2.0));
    let e = err(store
        .decide(Op::new(&unbounded, "k", 2.5), Mode::CONSUME)
        .await);
    assert!(matches!(e, CostError::Impossible { max, .. } if max == 2.0));
    for bad in [f64::NAN, -1.0, f64::INFINITY] {
        let e = err(store.decide(Op::new(&l, "k", bad), Mode::CONSUME).await);
        assert!(matches!(e, CostError::Invalid(_)));
    }
}

/// A clock that steps back refills nothing and credits nothing twice.
pub async fn backward_clock_credits_nothing<St: Store>(store: &St, clock: &FakeClock) {
    let l = Limit::new("conf-backward", tb(1.0, 2.0));
    step(clock, 10 * S);
    assert!(one(store, &l, "k", 2.0, Mode::CONSUME).await.allowed);
    let later = clock.now();
    clock.set(Nanos(later.0 - 5 * S));
    assert!(!one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
    clock.set(Nanos(later.0 + S / 2));
    assert!(!one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
    clock.set(Nanos(later.0 + S));
    assert!(one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
}

/// A sharded key admits its whole burst (the fuller shard is picked), and
/// no more.
pub async fn shards_admit_the_whole_burst<St: Store>(store: &St, _clock: &FakeClock) {
    let l = Limit::new("conf-shards", tb(1e-6, 8.0))
        .with_shards(4)
        .unwrap();
    let mut admitted = 0;
    for pick in 0..40u64 {
        let op = Op::new(&l, "hot", 1.0).with_pick(pick.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        if store.decide(op, Mode::CONSUME).await.unwrap().allowed {
            admitted += 1;
        }
    }
    assert!(
        (6..=8).contains(&admitted),
        "admitted {admitted} of a burst of 8"
    );
    assert_eq!(
        store.value(&l, "hot").await.unwrap().tokens.round() as i64,
        8 - admitted
    );
}

/// A long pseudo-random run of consumes, checks, reservations and resets on
/// a few keys decides exactly what the pure algorithm decides on a map.
pub async fn agrees_with_the_pure_algorithm<St: Store>(store: &St, clock: &FakeClock) {
    let algs: [Algorithm; 2] = [
        tb(3.0, 4.0).with_max_reserved(2.0).unwrap().into(),
        FixedWindow::new(4.0, Nanos(3 * S))
            .unwrap()
            .with_max_reserved(2.0)
            .unwrap()
            .into(),
    ];
    let steps = [0, 1_000, S / 7, S, 4 * S];
    let costs = [1.0, 0.5, 2.0, 3.25];
    agree_with_the_model(store, clock, &algs, "conf-model", (&steps, &costs), 7, 600).await;
}

/// Random calls (steps of the clock and costs from those given, and a
/// reset one time in twenty) on two or three keys of a limit for each of
/// `algs`, each decided as the pure algorithm decides it from the states
/// it left.
async fn agree_with_the_model<St: Store>(
    store: &St,
    clock: &FakeClock,
    algs: &[Algorithm],
    name: &str,
    (steps, costs): (&[i64], &[f64]),
    seed: u64,
    calls: usize,
) {
    let limits: Vec<Limit> = algs
        .iter()
        .enumerate()
        .map(|(i, a)| Limit::new(format!("{name}-{i}"), *a))
        .collect();
    let mut model: HashMap<(usize, usize), State> = HashMap::new();
    let mut rng = fastrand::Rng::with_seed(seed);
    for i in 0..calls {
        step(clock, steps[rng.usize(..steps.len())]);
        let (li, k) = (rng.usize(..limits.len()), rng.usize(..3));
        let (l, key) = (&limits[li], format!("k{k}"));
        if rng.u8(..20) == 0 {
            store.reset(l, &key).await.unwrap();
            model.remove(&(li, k));
            continue;
        }
        let mode = [Mode::CONSUME, Mode::CHECK, Mode::RESERVE][rng.usize(..3)];
        let cost = costs[rng.usize(..costs.len())];
        let alg = *l.shard_algorithm();
        let want = evaluate(
            &alg,
            model.get(&(li, k)).copied(),
            key_offset(&alg, &key),
            clock.now(),
            cost,
            mode.reserve,
        );
        let got = one(store, l, &key, cost, mode).await;
        assert_eq!(
            got,
            want.decision,
            "step {i}: {mode:?} {cost} on {} {key}",
            l.name()
        );
        if let (Some(next), true) = (want.next, mode.consume) {
            model.insert((li, k), next);
        }
    }
}

/// The start of the current `period`-long window on the clock's own
/// alignment, so that the checks below do not depend on where it starts.
fn aligned(clock: &FakeClock, period: i64) -> Nanos {
    let now = clock.now().0;
    Nanos(now - now.rem_euclid(period))
}

/// The previous window's count weighs in by its overlap with the last period.
pub async fn sliding_window_weighs_the_previous_window<St: Store>(store: &St, clock: &FakeClock) {
    let start = aligned(clock, 10 * S);
    let sw = SlidingWindow::per_period(10.0, Nanos(10 * S))
        .unwrap()
        .with_start(start);
    let l = Limit::new("conf-sliding-window", sw);
    // 1 s into a window, then 2.5 s into the next.
    clock.set(Nanos(start.0 + S));
    let d = one(store, &l, "k", 8.0, Mode::CONSUME).await;
    assert_eq!((d.allowed, d.remaining, d.reset), (true, 2, 19.0), "{d:?}");
    clock.set(Nanos(start.0 + 12_500_000_000));
    let d = one(store, &l, "k", 4.0, Mode::CONSUME).await;
    assert_eq!(
        (d.allowed, d.remaining),
        (true, 0),
        "8 × 0.75 + 4 = 10: {d:?}"
    );
    let d = one(store, &l, "k", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed);
    let retry = d.retry_after.unwrap();
    assert!((retry - 1.25).abs() < 1e-9, "retry_after {retry}");
    step(clock, 1_250_000_000);
    assert!(one(store, &l, "k", 1.0, Mode::CONSUME).await.allowed);
    // With 5 counted in this window, 6 more wait for the next one, where
    // the 5 weigh 5 × (1 − e/10) and 6 fit from e = 2 s.
    let d = one(store, &l, "k", 6.0, Mode::CONSUME).await;
    let retry = d.retry_after.unwrap();
    assert!((retry - 8.25).abs() < 1e-9, "retry_after {retry}");
}

/// A denied call waits exactly until enough logged entries have left.
pub async fn sliding_log_waits_for_entries_to_leave<St: Store>(store: &St, clock: &FakeClock) {
    let l = Limit::new(
        "conf-sliding-log",
        SlidingLog::per_period(5.0, Nanos(10 * S)).unwrap(),
    );
    assert!(one(store, &l, "k", 2.0, Mode::CONSUME).await.allowed);
    step(clock, 3 * S);
    assert!(one(store, &l, "k", 2.0, Mode::CONSUME).await.allowed);
    step(clock, 3 * S);
    let d = one(store, &l, "k", 2.0, Mode::CONSUME).await;
    assert_eq!((d.allowed, d.retry_after), (false, Some(4.0)), "{d:?}");
    assert_eq!((d.remaining, d.reset), (1, 7.0), "{d:?}");
    let d = one(store, &l, "k", 5.0, Mode::CONSUME).await;
    assert_eq!(d.retry_after, Some(7.0), "{d:?}");
    step(clock, 4 * S - 1);
    assert!(!one(store, &l, "k", 2.0, Mode::CONSUME).await.allowed);
    step(clock, 1);
    let d = one(store, &l, "k", 2.0, Mode::CONSUME).await;
    assert!(d.allowed, "allowed exactly at retry_after");
    assert_eq!((d.remaining, d.reset), (1, 10.0));
}

/// A sliding log and a token bucket decide one transaction together: all
/// or nothing, the largest wait reported.
pub async fn sliding_log_and_token_bucket_in_one_transaction<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let log = Limit::new(
        "conf-txn-log",
        SlidingLog::per_period(2.0, Nanos(10 * S)).unwrap(),
    );
    let bucket = Limit::new("conf-txn-bucket", tb(1.0, 3.0));
    let ops = [Op::new(&bucket, "k", 1.0), Op::new(&log, "k", 1.0)];
    for _ in 0..2 {
        let o = store.transact(&ops, Mode::CONSUME).await.unwrap();
        assert!(o.allowed, "{o:?}");
    }
    let o = store.transact(&ops, Mode::CONSUME).await.unwrap();
    assert!(!o.allowed, "{o:?}");
    assert_eq!(o.retry_after(), Some(10.0));
    assert!(o.decisions[0].allowed);
    assert_eq!(o.decisions[0].remaining, 1, "nothing was spent: {o:?}");
    // The bucket denies, the log would allow: still nothing is logged.
    step(clock, 10 * S);
    let greedy = [Op::new(&bucket, "k", 3.0), Op::new(&log, "k", 2.0)];
    store.transact(&[greedy[0]], Mode::CONSUME).await.unwrap();
    let o = store.transact(&greedy, Mode::CONSUME).await.unwrap();
    assert!(!o.allowed && o.decisions[1].allowed, "{o:?}");
    assert_eq!(o.decisions[1].reset, 0.0, "{o:?}");
    let d = one(store, &log, "k", 2.0, Mode::CHECK).await;
    assert!(d.allowed, "a denied transaction logged a cost: {d:?}");
}

/// The sliding algorithms take no reservations, and a cost above the rate
/// is an error.
pub async fn sliding_refuses_reservations_and_impossible_costs<St: Store>(
    store: &St,
    _clock: &FakeClock,
) {
    let algs: [Algorithm; 2] = [
        SlidingWindow::per_period(3.0, Nanos(S)).unwrap().into(),
        SlidingLog::per_period(3.0, Nanos(S)).unwrap().into(),
    ];
    for (i, alg) in algs.into_iter().enumerate() {
        let l = Limit::new(format!("conf-sliding-cost-{i}"), alg);
        match store.decide(Op::new(&l, "k", 1.0), Mode::RESERVE).await {
            Err(StoreError::Cost(CostError::NoReservations { .. })) => {}
            other => panic!("expected no reservations, got {other:?}"),
        }
        match store.decide(Op::new(&l, "k", 3.5), Mode::CONSUME).await {
            Err(StoreError::Cost(CostError::Impossible { max, .. })) => assert_eq!(max, 3.0),
            other => panic!("expected an impossible cost, got {other:?}"),
        }
        assert!(one(store, &l, "k", 3.0, Mode::CONSUME).await.allowed);
    }
}

/// `reset` empties a sliding key; `value` reports the rate less what is
/// counted.
pub async fn sliding_reset_and_value<St: Store>(store: &St, clock: &FakeClock) {
    let log = Limit::new(
        "conf-sliding-reset-log",
        SlidingLog::per_period(4.0, Nanos(10 * S)).unwrap(),
    );
    let window = Limit::new(
        "conf-sliding-reset-window",
        SlidingWindow::per_period(4.0, Nanos(10 * S)).unwrap(),
    );
    for l in [&log, &window] {
        assert_eq!(store.value(l, "k").await.unwrap().tokens, 4.0);
        assert!(one(store, l, "k", 3.0, Mode::CONSUME).await.allowed);
        assert_eq!(store.value(l, "k").await.unwrap().tokens, 1.0);
        store.reset(l, "k").await.unwrap();
        assert_eq!(store.value(l, "k").await.unwrap().tokens, 4.0);
        assert!(one(store, l, "k", 4.0, Mode::CONSUME).await.allowed);
    }
    step(clock, 5 * S);
    assert_eq!(store.value(&log, "k").await.unwrap().ts, clock.now());
}

/// A sliding key named twice in one transaction pays for both: the second
/// operation sees what the first admitted, and a denied transaction
/// reports the key as it stood.
pub async fn sliding_same_key_twice_pays_twice<St: Store>(store: &St, clock: &FakeClock) {
    let window = SlidingWindow::per_period(3.0, Nanos(10 * S))
        .unwrap()
        .with_start(aligned(clock, 10 * S));
    let algs: [Algorithm; 2] = [
        window.into(),
        SlidingLog::per_period(3.0, Nanos(10 * S)).unwrap().into(),
    ];
    for (i, alg) in algs.into_iter().enumerate() {
        let l = Limit::new(format!("conf-sliding-twice-{i}"), alg);
        let ops = [Op::new(&l, "k", 2.0), Op::new(&l, "k", 2.0)];
        let o = store.transact(&ops, Mode::CONSUME).await.unwrap();
        assert!(!o.allowed, "4 from a rate of 3: {o:?}");
        assert!(o.decisions[0].allowed && !o.decisions[1].allowed, "{o:?}");
        assert_eq!(o.decisions[0].remaining, 3, "nothing was spent: {o:?}");
        assert_eq!(o.decisions[1].remaining, 1, "{o:?}");
        let ops = [Op::new(&l, "k", 1.0), Op::new(&l, "k", 2.0)];
        let o = store.transact(&ops, Mode::CONSUME).await.unwrap();
        assert!(o.allowed, "{o:?}");
        assert_eq!(o.decisions[1].remaining, 0, "{o:?}");
        assert_eq!(store.value(&l, "k").await.unwrap().tokens, 0.0);
    }
}

/// A limit whose algorithm changes kind under the same name (a reload, or
/// a call that brings its own limit) cannot carry its keys' state over;
/// a key that still counted something comes back counting as much as any
/// state of the new kind could, never full: denied at once after a key
/// was exhausted under the old kind, whichever the direction.
pub async fn a_change_of_kind_never_grants_a_burst<St: Store>(store: &St, _clock: &FakeClock) {
    let log: Algorithm = SlidingLog::per_period(2.0, Nanos(10 * S)).unwrap().into();
    let bucket: Algorithm = tb(0.2, 2.0).into();
    let window: Algorithm = SlidingWindow::per_period(2.0, Nanos(10 * S))
        .unwrap()
        .into();
    for (i, (from, to)) in [
        (log, bucket),
        (bucket, log),
        (bucket, window),
        (window, log),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("conf-kind-{i}");
        let (old, new) = (Limit::new(name.clone(), from), Limit::new(name, to));
        assert!(one(store, &old, "k", 2.0, Mode::CONSUME).await.allowed);
        assert!(!one(store, &old, "k", 1.0, Mode::CHECK).await.allowed);
        let d = one(store, &new, "k", 1.0, Mode::CONSUME).await;
        assert!(!d.allowed, "{} to {}: {d:?}", from.name(), to.name());
        let left = store.value(&new, "k").await.unwrap().tokens;
        assert!(left < 1.0, "{} to {}: {left} left", from.name(), to.name());
    }
}

/// A key exhausted under one kind of state is still exhausted after a
/// change to another kind and back, however fast the kind in between
/// would have refilled it: the time the old state empties is what each
/// change carries, on every store, not the time the one in between would
/// have taken.
pub async fn a_change_of_kind_and_back_never_grants_a_burst<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let minute = Nanos(60 * S);
    let log: Algorithm = SlidingLog::per_period(5.0, minute).unwrap().into();
    let leases: Algorithm = Concurrency::new(2.0, minute).unwrap().into();
    // Full again 50 ms after it was emptied.
    let fast: Algorithm = tb(100.0, 5.0).into();
    for (i, (kind, used)) in [(log, 5.0), (leases, 2.0)].into_iter().enumerate() {
        let name = format!("conf-kind-back-{i}");
        let (old, between) = (Limit::new(name.clone(), kind), Limit::new(name, fast));
        for _ in 0..used as usize {
            assert!(one(store, &old, "k", 1.0, Mode::CONSUME).await.allowed);
        }
        step(clock, S);
        let d = one(store, &between, "k", 1.0, Mode::CHECK).await;
        assert!(
            !d.allowed,
            "{}: a bucket full only in 59 s: {d:?}",
            kind.name()
        );
        step(clock, S);
        let d = one(store, &old, "k", 1.0, Mode::CONSUME).await;
        assert!(!d.allowed, "{} and back: {d:?}", kind.name());
        assert_eq!(store.value(&old, "k").await.unwrap().tokens, 0.0);
        step(clock, 58 * S);
        assert!(one(store, &old, "k", used, Mode::CONSUME).await.allowed);
    }
}

/// A sliding log whose costs floating point cannot sum exactly (0.1 + 0.2
/// is 0.30000000000000004) counts what is left once an entry has left by
/// summing the entries left, not by taking the one that left off a sum
/// that carries rounding: the same number on every store.
pub async fn sliding_log_sums_what_is_left_afresh<St: Store>(store: &St, clock: &FakeClock) {
    let l = Limit::new(
        "conf-sliding-inexact",
        SlidingLog::per_period(1.0, Nanos(10 * S)).unwrap(),
    );
    assert!(one(store, &l, "k", 0.1, Mode::CONSUME).await.allowed);
    step(clock, S);
    assert!(one(store, &l, "k", 0.2, Mode::CONSUME).await.allowed);
    assert_eq!(
        store.value(&l, "k").await.unwrap().tokens,
        1.0 - (0.1 + 0.2)
    );
    step(clock, 9 * S + S / 2);
    assert_eq!(store.value(&l, "k").await.unwrap().tokens, 1.0 - 0.2);
}

async fn settle<St: Store>(store: &St, limit: &Limit, key: &str, change: Settle) -> Decision {
    store
        .settle(limit, key, change)
        .await
        .unwrap_or_else(|e| panic!("{}: settling {change:?}: {e}", limit.name()))
}

/// The LLM case on a token bucket: reserve an estimate, then give back what
/// was not used, or take what was used beyond it, below zero if need be,
/// after which calls wait for the debt to be repaid. Bad amounts are errors.
pub async fn settling_refunds_up_to_capacity_and_charges_below_zero<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let l = Limit::new(
        "conf-settle",
        TokenBucket::per_period(1000.0, Nanos(60 * S)).unwrap(),
    );
    assert!(one(store, &l, "team", 1000.0, Mode::CONSUME).await.allowed);
    let d = settle(store, &l, "team", Settle::Refund(600.0)).await;
    assert!(d.allowed && d.retry_after.is_none());
    assert_eq!((d.capacity, d.remaining), (1000.0, 600));
    assert_eq!(d.reset, 24.0, "400 tokens at 1000 a minute");
    assert_eq!(store.value(&l, "team").await.unwrap().tokens, 600.0);
    // Never above the capacity.
    let d = settle(store, &l, "team", Settle::Refund(5000.0)).await;
    assert_eq!((d.remaining, d.reset), (1000, 0.0));
    assert_eq!(store.value(&l, "team").await.unwrap().tokens, 1000.0);
    // A charge beyond what is there leaves a debt of 300.
    let d = settle(store, &l, "team", Settle::Charge(1300.0)).await;
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset), (0, 78.0));
    assert_eq!(store.value(&l, "team").await.unwrap().tokens, -300.0);
    let d = one(store, &l, "team", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(18.06), "301 tokens at 1000 a minute");
    step(clock, 18_060_000_000);
    assert!(one(store, &l, "team", 1.0, Mode::CONSUME).await.allowed);
    // No charge takes a key deeper than a year of refill below zero.
    let d = settle(store, &l, "team", Settle::Charge(9e15)).await;
    assert_eq!(
        d.reset,
        365.0 * 24.0 * 3600.0 + 60.0,
        "a year of debt, then a minute to fill up"
    );
    store.reset(&l, "team").await.unwrap();
    for bad in [f64::NAN, -1.0, f64::INFINITY, 1e300] {
        for change in [Settle::Refund(bad), Settle::Charge(bad)] {
            match store.settle(&l, "team", change).await {
                Err(StoreError::Cost(_)) => {}
                other => panic!("settling {change:?}: {other:?}"),
            }
        }
    }
    // A fixed window's refund is capped at its capacity too.
    let fw = Limit::new(
        "conf-settle-fw",
        FixedWindow::new(10.0, Nanos(60 * S))
            .unwrap()
            .with_start(Nanos::ZERO),
    );
    assert!(one(store, &fw, "k", 8.0, Mode::CONSUME).await.allowed);
    assert_eq!(
        settle(store, &fw, "k", Settle::Refund(3.0)).await.remaining,
        5
    );
    assert_eq!(
        settle(store, &fw, "k", Settle::Refund(30.0))
            .await
            .remaining,
        10
    );
    settle(store, &fw, "k", Settle::Charge(12.0)).await;
    assert_eq!(store.value(&fw, "k").await.unwrap().tokens, -2.0);
    // No deeper than a year of windows: 10 for each of 525,600 minutes.
    settle(store, &fw, "k", Settle::Charge(1e10)).await;
    assert_eq!(store.value(&fw, "k").await.unwrap().tokens, -5_256_000.0);
    // A sharded limit spreads a settlement over its shards.
    let sharded = Limit::new("conf-settle-shards", tb(1.0, 8.0))
        .with_shards(4)
        .unwrap();
    settle(store, &sharded, "k", Settle::Charge(8.0)).await;
    assert_eq!(store.value(&sharded, "k").await.unwrap().tokens, 0.0);
    let d = settle(store, &sharded, "k", Settle::Refund(4.0)).await;
    assert_eq!((d.capacity, d.remaining), (8.0, 4));
    assert_eq!(store.value(&sharded, "k").await.unwrap().tokens, 4.0);
}

/// The state a penalty keeps (see sluice-policy's `Penalty`): a token
/// bucket of capacity 0 refilling one token per penalty, open to a call of
/// cost 0 while it holds nothing, shut by a forced charge of 1 for exactly
/// the penalty, and telling the rest of it as `retry_after`.
pub async fn a_penalty_gate_shuts_for_exactly_its_penalty<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let gate = Limit::new(
        "conf-gate",
        TokenBucket::per_period(1.0, Nanos(10 * S))
            .unwrap()
            .with_capacity(0.0)
            .unwrap(),
    );
    assert!(one(store, &gate, "k", 0.0, Mode::CONSUME).await.allowed);
    let shut = settle(store, &gate, "k", Settle::Charge(1.0)).await;
    assert_eq!(shut.reset, 10.0);
    let d = one(store, &gate, "k", 0.0, Mode::CONSUME).await;
    assert_eq!((d.allowed, d.retry_after), (false, Some(10.0)));
    step(clock, 10 * S - S / 1000);
    let d = one(store, &gate, "k", 0.0, Mode::CONSUME).await;
    let left = d.retry_after.unwrap();
    assert!(!d.allowed && (left - 0.001).abs() < 1e-9, "{d:?}");
    step(clock, S / 1000 - 1);
    assert!(!one(store, &gate, "k", 0.0, Mode::CONSUME).await.allowed);
    step(clock, 1);
    assert!(one(store, &gate, "k", 0.0, Mode::CONSUME).await.allowed);
    // Shut again, once however many times: the gate opens a penalty after
    // the first.
    let shut = settle(store, &gate, "k", Settle::ChargeOnce(1.0)).await;
    assert_eq!(shut.reset, 10.0);
    step(clock, S);
    let again = settle(store, &gate, "k", Settle::ChargeOnce(1.0)).await;
    assert_eq!(again.reset, 9.0, "a second ChargeOnce changes nothing");
    assert!(!one(store, &gate, "k", 0.0, Mode::CHECK).await.allowed);
    store.reset(&gate, "k").await.unwrap();
    assert!(one(store, &gate, "k", 0.0, Mode::CHECK).await.allowed);
}

/// The sliding algorithms settle by their own rules: a refund takes back
/// the newest admissions of a log, and a window's current count before its
/// previous one's; a charge counts whatever the rate.
pub async fn sliding_settles_like_the_others<St: Store>(store: &St, clock: &FakeClock) {
    let log = Limit::new(
        "conf-settle-log",
        SlidingLog::per_period(10.0, Nanos(10 * S)).unwrap(),
    );
    assert!(one(store, &log, "k", 4.0, Mode::CONSUME).await.allowed);
    step(clock, S);
    assert!(one(store, &log, "k", 6.0, Mode::CONSUME).await.allowed);
    let d = settle(store, &log, "k", Settle::Refund(7.0)).await;
    // 6 came back from the newest entry and 1 from the one before.
    assert_eq!((d.remaining, d.reset), (7, 9.0));
    step(clock, 9 * S);
    assert_eq!(store.value(&log, "k").await.unwrap().tokens, 10.0);
    settle(store, &log, "k", Settle::Charge(15.0)).await;
    let d = one(store, &log, "k", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(10.0));
    assert_eq!(
        settle(store, &log, "k", Settle::Refund(99.0))
            .await
            .remaining,
        10
    );

    let period = 10 * S;
    let window = Limit::new(
        "conf-settle-window",
        SlidingWindow::per_period(10.0, Nanos(period))
            .unwrap()
            .with_start(Nanos::ZERO),
    );
    clock.set(aligned(clock, period));
    assert!(one(store, &window, "k", 8.0, Mode::CONSUME).await.allowed);
    step(clock, period + period / 4);
    assert!(one(store, &window, "k", 2.0, Mode::CONSUME).await.allowed);
    // 8 × 0.75 + 2 = 8 counted; a refund of 4 takes the 2, then 2 of the 8.
    let d = settle(store, &window, "k", Settle::Refund(4.0)).await;
    assert_eq!(d.remaining, 5, "6 × 0.75 counted: {d:?}");
    settle(store, &window, "k", Settle::Charge(20.0)).await;
    assert!(!one(store, &window, "k", 1.0, Mode::CHECK).await.allowed);
}

/// A concurrency limit admits calls while their slots, with those of the
/// leases still held, come to at most `max`; a release gives a lease's
/// slots back at once, and only once; a lease never released gives them
/// back when it expires, exactly a lease after it was taken, which is the
/// wait a denial is told.
pub async fn concurrency_holds_at_most_max_in_flight<St: Store>(store: &St, clock: &FakeClock) {
    let l = Limit::new(
        "conf-inflight",
        Concurrency::new(2.0, Nanos(10 * S)).unwrap(),
    );
    let take = |slots: f64| Op::new(&l, "k", slots);
    let a = take(1.0);
    let d = store.decide(a, Mode::CONSUME).await.unwrap();
    assert_eq!(
        (d.allowed, d.capacity, d.remaining, d.reset),
        (true, 2.0, 1, 10.0)
    );
    step(clock, S);
    let b = take(1.0);
    assert!(store.decide(b, Mode::CONSUME).await.unwrap().allowed);
    let d = store.decide(take(1.0), Mode::CONSUME).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (false, 0));
    assert_eq!(
        d.retry_after,
        Some(9.0),
        "a's lease expires 10 s after it was taken"
    );
    assert!(store.release(&l, "k", a.lease).await.unwrap());
    assert!(
        !store.release(&l, "k", a.lease).await.unwrap(),
        "released once"
    );
    assert!(!store.release(&l, "k", 12345).await.unwrap(), "never taken");
    assert_eq!(store.value(&l, "k").await.unwrap().tokens, 1.0);
    let c = take(1.0);
    assert!(store.decide(c, Mode::CONSUME).await.unwrap().allowed);
    assert!(!store.decide(take(1.0), Mode::CHECK).await.unwrap().allowed);
    assert!(store.release(&l, "k", c.lease).await.unwrap());
    // b is never released: its slot comes back 10 s after it was taken.
    step(clock, 10 * S - 1);
    let d = store.decide(take(2.0), Mode::CHECK).await.unwrap();
    assert_eq!((d.allowed, d.retry_after), (false, Some(1e-9)));
    step(clock, 1);
    assert!(store.decide(take(2.0), Mode::CHECK).await.unwrap().allowed);
    assert!(!store.release(&l, "k", b.lease).await.unwrap(), "b expired");
    // Several slots at once.
    let both = take(2.0);
    assert!(store.decide(both, Mode::CONSUME).await.unwrap().allowed);
    assert_eq!(store.value(&l, "k").await.unwrap().tokens, 0.0);
    assert!(store.release(&l, "k", both.lease).await.unwrap());
    assert_eq!(store.value(&l, "k").await.unwrap().tokens, 2.0);
    // A sharded limit finds a lease in whichever shard took it.
    let sharded = Limit::new(
        "conf-inflight-shards",
        Concurrency::new(4.0, Nanos(10 * S)).unwrap(),
    )
    .with_shards(2)
    .unwrap();
    let ops: Vec<Op<'_>> = (0..4)
        .map(|i| Op::new(&sharded, "k", 1.0).with_pick(i))
        .collect();
    for op in &ops {
        assert!(store.decide(*op, Mode::CONSUME).await.unwrap().allowed);
    }
    assert!(
        !store
            .decide(Op::new(&sharded, "k", 1.0), Mode::CHECK)
            .await
            .unwrap()
            .allowed
    );
    for op in &ops {
        assert!(store.release(&sharded, "k", op.lease).await.unwrap());
    }
    assert_eq!(store.value(&sharded, "k").await.unwrap().tokens, 4.0);
    // Any other limit holds no leases.
    let bucket = Limit::new("conf-inflight-bucket", tb(1.0, 1.0));
    assert!(!store.release(&bucket, "k", a.lease).await.unwrap());
}

/// What a concurrency limit refuses as errors: a count that is not whole
/// slots, more slots than it has, a reservation, a settlement.
pub async fn concurrency_refuses_what_it_cannot_hold<St: Store>(store: &St, _clock: &FakeClock) {
    let l = Limit::new(
        "conf-inflight-errors",
        Concurrency::new(3.0, Nanos(10 * S)).unwrap(),
    );
    let err = |r: Result<Decision, StoreError>| match r {
        Err(StoreError::Cost(e)) => e,
        other => panic!("expected a cost error, got {other:?}"),
    };
    let e = err(store.decide(Op::new(&l, "k", 1.5), Mode::CONSUME).await);
    assert!(matches!(e, CostError::Slots { .. }), "{e:?}");
    let e = err(store.decide(Op::new(&l, "k", 4.0), Mode::CONSUME).await);
    assert!(matches!(e, CostError::Impossible { .. }), "{e:?}");
    // In its own terms: a concurrency limit has no reservations to speak of.
    let text = e.to_string();
    assert!(text.contains("is 3 (the slots a key has)"), "{text}");
    assert!(!text.contains("max_reserved"), "{text}");
    let e = err(store.decide(Op::new(&l, "k", 1.0), Mode::RESERVE).await);
    assert!(matches!(e, CostError::NoReservations { .. }), "{e:?}");
    let e = err(store.settle(&l, "k", Settle::Refund(1.0)).await);
    assert!(matches!(e, CostError::Unsettleable { .. }), "{e:?}");
    // Nothing was taken by any of them.
    assert_eq!(store.value(&l, "k").await.unwrap().tokens, 3.0);
}

/// A lease is taken only if its whole transaction is admitted.
pub async fn a_lease_joins_a_transaction<St: Store>(store: &St, _clock: &FakeClock) {
    let inflight = Limit::new(
        "conf-inflight-txn",
        Concurrency::new(1.0, Nanos(10 * S)).unwrap(),
    );
    let bucket = Limit::new("conf-inflight-txn-rate", tb(0.001, 1.0));
    let first = [Op::new(&inflight, "k", 1.0), Op::new(&bucket, "k", 1.0)];
    assert!(store.transact(&first, Mode::CONSUME).await.unwrap().allowed);
    assert!(store.release(&inflight, "k", first[0].lease).await.unwrap());
    // The bucket is empty now: the slot is free, but not taken.
    let second = [Op::new(&inflight, "k", 1.0), Op::new(&bucket, "k", 1.0)];
    let out = store.transact(&second, Mode::CONSUME).await.unwrap();
    assert!(!out.allowed && out.decisions[0].allowed);
    assert!(
        !store
            .release(&inflight, "k", second[0].lease)
            .await
            .unwrap()
    );
    assert_eq!(store.value(&inflight, "k").await.unwrap().tokens, 1.0);
}

/// A pseudo-random run of consumes, checks, resets and transactions on a few
/// sliding keys decides exactly what the pure algorithms decide.
pub async fn sliding_agrees_with_the_pure_algorithm<St: Store>(store: &St, clock: &FakeClock) {
    let window = SlidingWindow::per_period(4.0, Nanos(3 * S)).unwrap();
    let log = SlidingLog::per_period(4.0, Nanos(3 * S)).unwrap();
    let limits = [
        Limit::new("conf-sliding-model-w", window),
        Limit::new("conf-sliding-model-l", log),
    ];
    let mut windows: HashMap<usize, WindowState> = HashMap::new();
    let mut logs: HashMap<usize, Log> = HashMap::new();
    let mut rng = fastrand::Rng::with_seed(11);
    for i in 0..600 {
        step(clock, [0, 1_000, S / 7, S, 4 * S][rng.usize(..5)]);
        let now = clock.now();
        let k = rng.usize(..3);
        let key = format!("k{k}");
        if rng.u8(..20) == 0 {
            for l in &limits {
                store.reset(l, &key).await.unwrap();
            }
            windows.remove(&k);
            logs.remove(&k);
            continue;
        }
        let mode = [Mode::CONSUME, Mode::CHECK][rng.usize(..2)];
        let (cw, cl) = (
            [1.0, 0.5, 2.0][rng.usize(..3)],
            [1.0, 0.25, 3.0][rng.usize(..3)],
        );
        let offset = key_offset(&Algorithm::from(window), &key);
        let want_w = window_evaluate(&window, windows.get(&k).copied(), offset, now, cw);
        let empty = Log::default();
        let want_l = logs.get(&k).unwrap_or(&empty).evaluate(&log, now, 0.0, cl);
        let ops = [Op::new(&limits[0], &key, cw), Op::new(&limits[1], &key, cl)];
        let both = rng.bool();
        let got = store
            .transact(if both { &ops } else { &ops[..1] }, mode)
            .await
            .unwrap();
        let allowed = want_w.decision.allowed && (!both || want_l.allowed);
        assert_eq!(got.allowed, allowed, "step {i}: {got:?}");
        if allowed {
            assert_eq!(got.decisions[0], want_w.decision, "step {i}");
            if both {
                assert_eq!(got.decisions[1], want_l, "step {i}");
            }
        }
        if allowed && mode.consume {
            if let Some(next) = want_w.next {
                windows.insert(k, next);
            }
            if both {
                logs.entry(k).or_default().commit(&log, now, cl);
            }
        }
    }
}

/// A long pseudo-random run of transactions of one to three operations
/// (the same limit twice included) over every algorithm, sharded and not,
/// with fractional costs that floating point cannot sum exactly, a clock
/// that now and then steps back, resets, values, refunds and forced
/// charges, decides exactly what
/// the memory store decides on the same clock: every field of every
/// decision, and every error.
///
/// The operations of a transaction share the caller's key, so a Redis
/// Cluster keeps each transaction on one slot.
pub async fn transactions_agree_with_the_memory_store<St: Store>(store: &St, clock: &FakeClock) {
    let period = |s: f64| Nanos::from_secs_f64(s).unwrap();
    let algs: [(Algorithm, u32); 8] = [
        (tb(2.0, 3.0).with_max_reserved(2.0).unwrap().into(), 1),
        (
            FixedWindow::new(3.0, period(2.0))
                .unwrap()
                .with_max_reserved(1.0)
                .unwrap()
                .into(),
            1,
        ),
        (
            SlidingWindow::per_period(4.0, period(3.0)).unwrap().into(),
            1,
        ),
        (SlidingLog::per_period(4.0, period(3.0)).unwrap().into(), 1),
        (SlidingLog::per_period(6.0, period(2.0)).unwrap().into(), 3),
        (
            SlidingWindow::per_period(6.0, period(2.0))
                .unwrap()
                .with_start(Nanos::ZERO)
                .into(),
            3,
        ),
        (Concurrency::new(3.0, period(2.0)).unwrap().into(), 1),
        (Concurrency::new(4.0, period(3.0)).unwrap().into(), 2),
    ];
    let limits: Vec<Limit> = algs
        .iter()
        .enumerate()
        .map(|(i, &(a, shards))| {
            Limit::new(format!("conf-diff-{i}"), a)
                .with_shards(shards)
                .unwrap()
        })
        .collect();
    let memory = MemoryStore::with_clock(clock.clone());
    let mut rng = fastrand::Rng::with_seed(23);
    // The leases admitted calls took: limit, key, id.
    let mut leases: Vec<(usize, String, u64)> = Vec::new();
    for i in 0..1500 {
        if rng.u8(..40) == 0 {
            // A clock that steps back, as a wall clock can.
            clock.set(Nanos(clock.now().0 - S / 2));
        } else {
            step(clock, [0, 1, 1_000, S / 7, S / 3, S, 4 * S][rng.usize(..7)]);
        }
        let key = format!("k{}", rng.usize(..3));
        let l = &limits[rng.usize(..limits.len())];
        match rng.u8(..30) {
            0 => {
                store.reset(l, &key).await.unwrap();
                memory.reset_now(l, &key);
                continue;
            }
            5..=7 if !leases.is_empty() => {
                let (l, key, id) = leases.swap_remove(rng.usize(..leases.len()));
                // Now and then, one released already: both say so.
                let id = if rng.u8(..4) == 0 { id ^ 1 } else { id };
                let got = store.release(&limits[l], &key, id).await.unwrap();
                assert_eq!(
                    got,
                    memory.release_now(&limits[l], &key, id),
                    "step {i}: release {id} of {}",
                    limits[l].name()
                );
                continue;
            }
            3 | 4 => {
                let amount = [0.5, 1.0, 2.5, 0.1, 7.0][rng.usize(..5)];
                let change = if rng.bool() {
                    Settle::Refund(amount)
                } else {
                    Settle::Charge(amount)
                };
                match (
                    store.settle(l, &key, change).await,
                    memory.settle_now(l, &key, change),
                ) {
                    (Ok(got), Ok(want)) => {
                        assert_eq!(got, want, "step {i}: {change:?} on {}", l.name());
                    }
                    (Err(StoreError::Cost(a)), Err(StoreError::Cost(b))) => assert_eq!(a, b),
                    (got, want) => panic!("step {i}: {change:?}: {got:?} against {want:?}"),
                }
                continue;
            }
            1 | 2 => {
                let got = store.value(l, &key).await.unwrap();
                assert_eq!(
                    got,
                    memory.value_now(l, &key),
                    "step {i}: value of {}",
                    l.name()
                );
                continue;
            }
            _ => {}
        }
        let mode = [Mode::CONSUME, Mode::CONSUME, Mode::CHECK, Mode::RESERVE][rng.usize(..4)];
        let chosen: Vec<usize> = (0..rng.usize(1..=3))
            .map(|_| rng.usize(..limits.len()))
            .collect();
        let ops: Vec<Op<'_>> = chosen
            .iter()
            .map(|&l| {
                let cost = [1.0, 1.0, 0.5, 2.0, 0.1, 0.3, 0.0, 3.0][rng.usize(..8)];
                Op::new(&limits[l], &key, cost).with_pick(rng.u64(..))
            })
            .collect();
        let got = store.transact(&ops, mode).await;
        let want = memory.transact_now(&ops, mode);
        if let Ok(out) = &want
            && out.allowed
            && mode.consume
        {
            for (&l, op) in chosen.iter().zip(&ops) {
                if limits[l].takes_leases() && op.cost > 0.0 {
                    leases.push((l, key.clone(), op.lease));
                }
            }
        }
        let what = || {
            let names: Vec<_> = ops.iter().map(|o| (o.limit.name(), o.cost)).collect();
            format!("step {i}: {mode:?} {names:?} on {key}")
        };
        match (got, want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{}", what()),
            (Err(got), Err(want)) => assert!(
                matches!(
                    (&got, &want),
                    (StoreError::Cost(a), StoreError::Cost(b)) if a == b
                ),
                "{}: {got} against {want}",
                what()
            ),
            (got, want) => panic!("{}: {got:?} against the memory store's {want:?}", what()),
        }
    }
}

/// A concurrency key holding every slot its limit allows, each under a
/// lease of its own, and a sliding log past the most entries a key keeps,
/// agree with the memory store through acquisitions, releases from the
/// middle, expiries of part of a key, checks of every size (whose waits
/// walk many leases or entries) and refunds: what a store keeps beside a
/// fat key so that no call adds all of it up must say what adding it up
/// would.
pub async fn keys_as_fat_as_allowed_agree_with_the_memory_store<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let max = MAX_SLOTS;
    let entries = MAX_LOG_ENTRIES as f64;
    let leases = Limit::new(
        "conf-fat-leases",
        Concurrency::new(max, Nanos(100 * S)).unwrap(),
    );
    let log = Limit::new(
        "conf-fat-log",
        SlidingLog::per_period(2.0 * entries, Nanos(100 * S)).unwrap(),
    );
    let memory = MemoryStore::with_clock(clock.clone());
    let mut rng = fastrand::Rng::with_seed(7);
    let mut held: Vec<u64> = Vec::new();
    let same = async |what: &str, op: Op<'_>, mode: Mode| {
        let got = store.transact(&[op], mode).await.unwrap();
        let want = memory.transact_now(&[op], mode).unwrap();
        assert_eq!(
            got,
            want,
            "{what}: {mode:?} of {} on {}",
            op.cost,
            op.limit.name()
        );
        got.allowed
    };
    let values_agree = async |what: &str| {
        for l in [&leases, &log] {
            let got = store.value(l, "k").await.unwrap();
            assert_eq!(
                got,
                memory.value_now(l, "k"),
                "{what}: value of {}",
                l.name()
            );
        }
    };
    // Fill both over half their period, so that later steps expire part
    // of each: every lease, and more entries than a log keeps, in costs
    // whose sums are exact and costs whose are not.
    for i in 0..max as usize {
        let op = Op::new(&leases, "k", 1.0);
        assert!(same("filling", op, Mode::CONSUME).await);
        held.push(op.lease);
        let cost = [1.0, 0.5, 0.1][i % 3];
        same("filling", Op::new(&log, "k", cost), Mode::CONSUME).await;
        if i % 5 == 0 {
            same("filling", Op::new(&log, "k", 0.25), Mode::CONSUME).await;
        }
        step(clock, S / 20);
    }
    values_agree("full").await;
    for round in 0..60 {
        let what = format!("round {round}");
        match rng.u8(..6) {
            // Part of each key leaves: the oldest leases and entries.
            0 => step(clock, [S, 3 * S, 7 * S, 20 * S][rng.usize(..4)]),
            // A release from anywhere in the key.
            1 if !held.is_empty() => {
                let id = held.swap_remove(rng.usize(..held.len()));
                let got = store.release(&leases, "k", id).await.unwrap();
                assert_eq!(got, memory.release_now(&leases, "k", id), "{what}");
            }
            2 => {
                let change = Settle::Refund([0.3, 7.0, 100.0][rng.usize(..3)]);
                let got = store.settle(&log, "k", change).await.unwrap();
                assert_eq!(got, memory.settle_now(&log, "k", change).unwrap(), "{what}");
            }
            _ => {}
        }
        step(clock, S / 1000);
        for cost in [1.0, max / 2.0, max] {
            let op = Op::new(&leases, "k", cost);
            let mode = if rng.bool() {
                Mode::CHECK
            } else {
                Mode::CONSUME
            };
            if same(&what, op, mode).await && mode.consume {
                held.push(op.lease);
            }
        }
        for cost in [0.1, 1.0, entries, 2.0 * entries] {
            let mode = if rng.bool() {
                Mode::CHECK
            } else {
                Mode::CONSUME
            };
            same(&what, Op::new(&log, "k", cost), mode).await;
        }
        values_agree(&what).await;
    }
}

/// The checks of calendar windows. They move the clock to dates in 2026
/// and 2028 (never back), so they run after the others.
pub async fn run_calendar<St: Store>(store: &St, clock: &FakeClock) {
    a_month_is_as_long_as_it_is_across_a_dst_change(store, clock).await;
    a_monthly_quota_renews_at_local_midnight(store, clock).await;
    a_daily_quota_admits_once_over_the_day_clocks_go_back(store, clock).await;
    an_iso_week_runs_on_across_new_year(store, clock).await;
    a_yearly_quota_renews_at_local_new_year(store, clock).await;
    a_leap_day_ends_its_month(store, clock).await;
    a_change_of_kind_to_the_calendar_never_grants_a_burst(store, clock).await;
    calendar_windows_agree_with_the_pure_algorithm(store, clock).await;
}

/// Moves the clock forward to `secs` after the epoch.
fn jump_to(clock: &FakeClock, secs: i64) {
    let at = Nanos(secs * S);
    assert!(
        clock.now() <= at,
        "the calendar checks never move the clock back"
    );
    clock.set(at);
}

fn calendar_limit(name: &str, rate: f64, unit: CalendarUnit, zone: &str) -> Limit {
    let cal = Calendar::new(unit, zone).unwrap();
    Limit::new(name, FixedWindow::on_calendar(rate, cal).unwrap())
}

/// Spends `n` calls of cost 1 on `key`, all admitted, then one more that is
/// denied with `retry_after` of `wait` seconds.
async fn spend_then_wait<St: Store>(store: &St, l: &Limit, key: &str, n: u64, wait: f64) {
    for i in 0..n {
        let d = one(store, l, key, 1.0, Mode::CONSUME).await;
        assert!(d.allowed, "{}: call {i} of {n}", l.name());
        assert_eq!(d.remaining, n - 1 - i);
    }
    let d = one(store, l, key, 1.0, Mode::CONSUME).await;
    assert!(!d.allowed, "{}: call {n} is one too many", l.name());
    assert_eq!(d.retry_after, Some(wait), "{}: retry_after", l.name());
    assert_eq!(d.reset, wait, "{}: reset", l.name());
}

/// Berlin's March 2026 lasts 31 days less the hour summer time takes: a
/// window of 30 days would renew a day early, one of 31 an hour late.
pub async fn a_month_is_as_long_as_it_is_across_a_dst_change<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let l = calendar_limit("conf-cal-march", 5.0, CalendarUnit::Month, "Europe/Berlin");
    // 2026-03-01T00:00:00+01:00.
    jump_to(clock, 1_772_319_600);
    spend_then_wait(store, &l, "k", 5, (31 * 86_400 - 3_600) as f64).await;
}

/// A monthly quota of 100 in Europe/Berlin admits 100 on 31 March at
/// 23:59:59 local time and 100 more from 1 April at 00:00:00 local time,
/// two days after the clocks went forward.
pub async fn a_monthly_quota_renews_at_local_midnight<St: Store>(store: &St, clock: &FakeClock) {
    let l = calendar_limit(
        "conf-cal-month",
        100.0,
        CalendarUnit::Month,
        "Europe/Berlin",
    );
    // 2026-03-31T23:59:59+02:00.
    jump_to(clock, 1_774_994_399);
    spend_then_wait(store, &l, "org", 100, 1.0).await;
    step(clock, S);
    // April has 30 days of summer time.
    spend_then_wait(store, &l, "org", 100, (30 * 86_400) as f64).await;
}

/// On 25 October 2026 Berlin's clocks go back an hour: the day lasts 25
/// hours and its quota is admitted once in them.
pub async fn a_daily_quota_admits_once_over_the_day_clocks_go_back<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let l = calendar_limit("conf-cal-day", 10.0, CalendarUnit::Day, "Europe/Berlin");
    // 2026-10-25T00:00:00+02:00.
    jump_to(clock, 1_792_879_200);
    spend_then_wait(store, &l, "k", 10, 25.0 * 3_600.0).await;
    // Where a day of 24 hours would have renewed it.
    step(clock, 24 * 3_600 * S);
    let d = one(store, &l, "k", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed, "still the 25-hour day");
    assert_eq!(d.retry_after, Some(3_600.0));
    step(clock, 3_600 * S);
    spend_then_wait(store, &l, "k", 10, 24.0 * 3_600.0).await;
}

/// An ISO week starts on a Monday: the week from Monday 28 December 2026
/// runs on into January, and renews on Monday 4 January.
pub async fn an_iso_week_runs_on_across_new_year<St: Store>(store: &St, clock: &FakeClock) {
    let l = calendar_limit("conf-cal-week", 3.0, CalendarUnit::Week, "UTC");
    // Thursday 2026-12-31T12:00:00Z.
    jump_to(clock, 1_798_718_400);
    spend_then_wait(store, &l, "k", 3, (3 * 86_400 + 12 * 3_600) as f64).await;
    // New Year's Day renews nothing.
    step(clock, 12 * 3_600 * S + S);
    let d = one(store, &l, "k", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some((3 * 86_400 - 1) as f64));
}

/// A yearly quota in New York renews at midnight there, five hours after
/// midnight in UTC, and lasts the year's 365 days.
pub async fn a_yearly_quota_renews_at_local_new_year<St: Store>(store: &St, clock: &FakeClock) {
    let l = calendar_limit("conf-cal-year", 2.0, CalendarUnit::Year, "America/New_York");
    // 2026-12-31T23:59:59-05:00.
    jump_to(clock, 1_798_779_599);
    spend_then_wait(store, &l, "k", 2, 1.0).await;
    step(clock, S);
    spend_then_wait(store, &l, "k", 2, (365 * 86_400) as f64).await;
}

/// February 2028 ends on its 29th; unused tokens roll over into March up to
/// the capacity, and a reservation waits for the window that repays it.
pub async fn a_leap_day_ends_its_month<St: Store>(store: &St, clock: &FakeClock) {
    let cal = Calendar::new(CalendarUnit::Month, "UTC").unwrap();
    let fw = FixedWindow::on_calendar(4.0, cal)
        .unwrap()
        .with_capacity(6.0)
        .unwrap()
        .with_max_reserved(4.0)
        .unwrap();
    let l = Limit::new("conf-cal-leap", fw);
    // 2028-02-29T12:00:00Z, twelve hours before March.
    jump_to(clock, 1_835_438_400);
    let d = one(store, &l, "k", 3.0, Mode::CONSUME).await;
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset), (3, 12.0 * 3_600.0));
    step(clock, 12 * 3_600 * S);
    // 3 left and 4 more, up to the capacity of 6.
    let d = one(store, &l, "k", 0.0, Mode::CHECK).await;
    assert_eq!(d.remaining, 6);
    // Taking 8 reserves 2 of April's 4: the wait is March's 31 days.
    let d = one(store, &l, "k", 8.0, Mode::RESERVE).await;
    assert!(d.allowed);
    assert_eq!(d.retry_after, Some((31 * 86_400) as f64));
    // Two months to be full again: from -2, April brings 4, May 4 more.
    assert_eq!(d.reset, ((31 + 30) * 86_400) as f64);
}

/// A key exhausted under a sliding log, then decided by a daily calendar
/// window of the same name, waits for the next midnight, and one exhausted
/// by the calendar waits under a log.
pub async fn a_change_of_kind_to_the_calendar_never_grants_a_burst<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let day = calendar_limit("conf-cal-kind", 3.0, CalendarUnit::Day, "Europe/Berlin");
    let log = Limit::new(
        "conf-cal-kind",
        SlidingLog::per_period(3.0, Nanos(60 * S)).unwrap(),
    );
    // 2028-03-02T12:00:00+01:00.
    jump_to(clock, 1_835_607_600);
    for _ in 0..3 {
        assert!(one(store, &log, "k", 1.0, Mode::CONSUME).await.allowed);
    }
    let d = one(store, &day, "k", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed, "the log's state still counts: {d:?}");
    assert_eq!(
        d.retry_after,
        Some(12.0 * 3_600.0),
        "until midnight in Berlin"
    );
    // (Not stepped to midnight: a Redis key expires in Redis's time, which
    // a fake clock does not move.)
    spend_then_wait(store, &day, "k2", 3, 12.0 * 3_600.0).await;
    let d = one(store, &log, "k2", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed, "the calendar's state still counts: {d:?}");
}

/// Random calls on a daily quota across Berlin's clock change of March 2028
/// and a monthly one in New York, decided as the pure algorithm decides.
pub async fn calendar_windows_agree_with_the_pure_algorithm<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let berlin = Calendar::new(CalendarUnit::Day, "Europe/Berlin").unwrap();
    let new_york = Calendar::new(CalendarUnit::Month, "America/New_York").unwrap();
    let algs: [Algorithm; 2] = [
        FixedWindow::on_calendar(4.0, berlin)
            .unwrap()
            .with_max_reserved(3.0)
            .unwrap()
            .into(),
        FixedWindow::on_calendar(5.0, new_york)
            .unwrap()
            .with_capacity(7.0)
            .unwrap()
            .with_max_reserved(6.0)
            .unwrap()
            .into(),
    ];
    // 2028-03-20T00:00:00Z: Berlin's clocks go forward on the 26th, New
    // York's went on the 12th and go back in November.
    jump_to(clock, 1_837_123_200);
    let hour = 3_600 * S;
    let steps = [0, S, hour, 7 * hour, 25 * hour];
    let costs = [1.0, 2.0, 3.5];
    agree_with_the_model(
        store,
        clock,
        &algs,
        "conf-cal-model",
        (&steps, &costs),
        11,
        500,
    )
    .await;
}
