//! Settling a cost known afterwards, and penalties.

use super::*;

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
