//! The sliding window and the sliding log, and changes of kind.

use super::*;

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
