//! Concurrency limits and their leases.

use super::*;

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
