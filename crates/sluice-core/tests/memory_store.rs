//! The in-memory store's own promises: full buckets are dropped losslessly,
//! the key cap holds under a flood, and decisions stay exact across threads.

// Test helpers outside #[test] functions fail loudly on purpose.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use sluice_core::{FakeClock, Limit, MemoryStore, Mode, Nanos, Op, TokenBucket};

fn take(store: &MemoryStore<FakeClock>, limit: &Limit, key: &str) -> bool {
    store
        .transact_now(&[Op::new(limit, key, 1.0)], Mode::CONSUME)
        .unwrap()
        .allowed
}

#[test]
fn full_buckets_are_dropped_and_nothing_is_lost() {
    let clock = FakeClock::new(Nanos::ZERO);
    let store = MemoryStore::with_clock(clock.clone());
    let limit = Limit::new("l", TokenBucket::new(1.0, 2.0).unwrap());
    for i in 0..20_000 {
        assert!(take(&store, &limit, &format!("old-{i}")));
    }
    assert_eq!(store.len(), 20_000);
    // One second later every old bucket is full again.
    clock.advance(Duration::from_secs(1));
    for i in 0..40_000 {
        assert!(take(&store, &limit, &format!("new-{i}")));
    }
    assert!(
        store.len() < 45_000,
        "full buckets should have been swept, {} held",
        store.len()
    );
    // A dropped bucket behaves exactly as a full one.
    assert!(take(&store, &limit, "old-7"));
    assert!(take(&store, &limit, "old-7"));
    assert!(!take(&store, &limit, "old-7"));
}

#[test]
fn the_key_cap_holds_under_a_flood_of_unique_keys() {
    let clock = FakeClock::new(Nanos::ZERO);
    let store = MemoryStore::with_clock(clock.clone()).with_max_keys(4_096);
    let limit = Limit::new("l", TokenBucket::new(0.001, 2.0).unwrap());
    let mut peak = 0;
    for i in 0..200_000 {
        take(&store, &limit, &format!("flood-{i}"));
        if i % 1_000 == 0 {
            peak = peak.max(store.len());
        }
    }
    assert!(peak <= 4_096, "peak {peak}");
    assert!(store.len() > 2_000, "the cap should not empty the store");
}

#[test]
fn eviction_drops_the_buckets_nearest_to_full_first() {
    let clock = FakeClock::new(Nanos::ZERO);
    let store = MemoryStore::with_clock(clock.clone()).with_max_keys(1_024);
    let slow = Limit::new("slow", TokenBucket::new(0.01, 100.0).unwrap());
    let fast = Limit::new("fast", TokenBucket::new(10.0, 2.0).unwrap());
    let drained = store
        .transact_now(&[Op::new(&slow, "victim", 100.0)], Mode::CONSUME)
        .unwrap();
    assert!(drained.allowed);
    for i in 0..50_000 {
        take(&store, &fast, &format!("noise-{i}"));
    }
    // The victim's empty bucket (full in 10,000 s) outlived the noise
    // (full in 0.1 s), so the flood did not refill it.
    assert!(!take(&store, &slow, "victim"));
}

#[test]
fn threads_racing_on_one_key_admit_exactly_the_burst() {
    let store = MemoryStore::with_clock(FakeClock::new(Nanos::ZERO));
    let limit = Limit::new("l", TokenBucket::new(1e-6, 1_000.0).unwrap());
    let admitted: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| (0..500).filter(|_| take(&store, &limit, "hot")).count()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(admitted, 1_000);
}

#[test]
fn crossing_transactions_neither_deadlock_nor_tear() {
    let store = MemoryStore::with_clock(FakeClock::new(Nanos::ZERO));
    let a = Limit::new("a", TokenBucket::new(1e-6, 300.0).unwrap());
    let b = Limit::new("b", TokenBucket::new(1e-6, 500.0).unwrap());
    let allowed: usize = std::thread::scope(|s| {
        let run = |first: &'static str, flip: bool| {
            let (store, a, b) = (&store, &a, &b);
            s.spawn(move || {
                (0..400)
                    .filter(|i| {
                        let key = if i % 2 == 0 { first } else { "shared" };
                        let ops = if flip {
                            [Op::new(b, key, 1.0), Op::new(a, key, 1.0)]
                        } else {
                            [Op::new(a, key, 1.0), Op::new(b, key, 1.0)]
                        };
                        store.transact_now(&ops, Mode::CONSUME).unwrap().allowed
                    })
                    .count()
            })
        };
        let hs = [
            run("x", false),
            run("x", true),
            run("y", false),
            run("y", true),
        ];
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    // Every allowed transaction took one token from each limit's key, and
    // nothing else did.
    let spent = |l: &Limit| -> f64 {
        ["x", "y", "shared"]
            .iter()
            .map(|k| l.algorithm().capacity() - store.value_now(l, k).tokens)
            .sum()
    };
    assert!((spent(&a) - allowed as f64).abs() < 1e-3);
    assert!((spent(&b) - allowed as f64).abs() < 1e-3);
    // "shared" is bounded by a's burst of 300; x and y take 400 each at most.
    assert!(allowed <= 300 + 2 * 400);
    assert!(allowed >= 300);
}
