//! Token buckets and fixed windows, and what every store does whatever
//! the algorithm: transactions, resets, invalid costs, a clock stepping
//! back, shards.

use super::*;

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
