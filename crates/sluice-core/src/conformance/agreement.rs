//! Random calls that a store must decide as the pure algorithm, or the
//! memory store, does.

use super::*;

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
pub(super) async fn agree_with_the_model<St: Store>(
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
