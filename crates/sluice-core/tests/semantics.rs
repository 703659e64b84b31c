//! The formulas of `docs/semantics.md`, one behaviour per test, on a fake
//! clock through the in-memory store.

// Test helpers outside #[test] functions fail loudly on purpose.
#![allow(clippy::unwrap_used, clippy::panic)]

use sluice_core::algorithm::window_offset;
use sluice_core::{
    Algorithm, CostError, Decision, FakeClock, FixedWindow, Limit, MemoryStore, Mode, Nanos, Op,
    SlidingLog, SlidingWindow, StoreError, TokenBucket,
};

const S: i64 = Nanos::PER_SEC;

struct H {
    clock: FakeClock,
    store: MemoryStore<FakeClock>,
}

impl H {
    fn new() -> H {
        let clock = FakeClock::new(Nanos(1_000 * S));
        H {
            store: MemoryStore::with_clock(clock.clone()),
            clock,
        }
    }

    /// Moves to `t` seconds after the start.
    fn at(&self, t: f64) -> &Self {
        self.clock
            .set(Nanos(1_000 * S + Nanos::from_secs_f64(t).unwrap().0));
        self
    }

    fn run(&self, limit: &Limit, key: &str, cost: f64, mode: Mode) -> Decision {
        let out = self
            .store
            .transact_now(&[Op::new(limit, key, cost)], mode)
            .unwrap();
        assert_eq!(out.decisions.len(), 1);
        out.decisions[0]
    }

    fn take(&self, limit: &Limit, cost: f64) -> Decision {
        self.run(limit, "k", cost, Mode::CONSUME)
    }

    fn reserve(&self, limit: &Limit, cost: f64) -> Decision {
        self.run(limit, "k", cost, Mode::RESERVE)
    }

    fn tokens(&self, limit: &Limit) -> f64 {
        self.store.value_now(limit, "k").tokens
    }

    /// Reserves `cost`, which must be refused as impossible; returns the
    /// most the error says a call may ask for, and the error's text.
    fn impossible_reservation(&self, limit: &Limit, cost: f64) -> (f64, String) {
        let err = self
            .store
            .transact_now(&[Op::new(limit, "k", cost)], Mode::RESERVE)
            .unwrap_err();
        match &err {
            StoreError::Cost(CostError::Impossible { max, .. }) => (*max, err.to_string()),
            other => panic!("not an impossible cost: {other}"),
        }
    }
}

fn tb(rate: f64, burst: f64) -> Limit {
    Limit::new("tb", TokenBucket::new(rate, burst).unwrap())
}

fn tb_reserved(rate: f64, burst: f64, max_reserved: f64) -> Limit {
    let cfg = TokenBucket::new(rate, burst)
        .unwrap()
        .with_max_reserved(max_reserved)
        .unwrap();
    Limit::new("tb", cfg)
}

fn fw(rate: f64, period_s: f64, capacity: f64, start_s: f64) -> Limit {
    let cfg = FixedWindow::new(rate, Nanos::from_secs_f64(period_s).unwrap())
        .unwrap()
        .with_capacity(capacity)
        .unwrap()
        // Windows aligned to the harness's time zero.
        .with_start(Nanos(1_000 * S + Nanos::from_secs_f64(start_s).unwrap().0));
    Limit::new("fw", cfg)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

// ---- token bucket ----

#[test]
fn a_key_never_seen_starts_full() {
    let h = H::new();
    let l = tb(1.0, 10.0);
    assert_eq!(h.tokens(&l), 10.0);
    let d = h.take(&l, 1.0);
    assert!(d.allowed);
    assert_eq!((d.capacity, d.remaining, d.retry_after), (10.0, 9, None));
    // reset = (burst - tokens after) / rate
    assert!(close(d.reset, 1.0));
}

#[test]
fn tokens_refill_at_rate_and_stop_at_burst() {
    let h = H::new();
    let l = tb(2.0, 10.0);
    assert!(h.take(&l, 10.0).allowed);
    h.at(1.5);
    assert!(close(h.tokens(&l), 3.0));
    let d = h.take(&l, 3.0);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    assert!(close(d.reset, 5.0));
    h.at(100.0);
    assert_eq!(h.tokens(&l), 10.0);
}

#[test]
fn a_denial_changes_nothing_and_says_when_to_retry() {
    let h = H::new();
    let l = tb(4.0, 10.0);
    assert!(h.take(&l, 9.0).allowed);
    h.at(0.25); // available = 1 + 0.25 * 4 = 2
    let d = h.take(&l, 5.0);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(0.75)); // (5 - 2) / 4
    assert_eq!(d.remaining, 2);
    assert!(close(d.reset, 2.0)); // (10 - 2) / 4
    assert!(close(h.tokens(&l), 2.0));
    // Retrying exactly when told succeeds.
    h.at(1.0);
    assert!(h.take(&l, 5.0).allowed);
}

#[test]
fn fractional_costs_are_exact() {
    let h = H::new();
    let l = tb(1.0, 1.0);
    assert!(h.take(&l, 0.5).allowed);
    assert!(h.take(&l, 0.25).allowed);
    let d = h.take(&l, 0.5);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(0.25));
    assert!(close(h.tokens(&l), 0.25));
}

#[test]
fn remaining_is_the_floor() {
    let h = H::new();
    let l = tb(1.0, 5.0);
    let d = h.take(&l, 1.5);
    assert_eq!(d.remaining, 3); // 3.5 left
}

#[test]
fn idle_gaps_longer_than_the_refill_time_do_not_overfill() {
    let h = H::new();
    let l = tb(10.0, 5.0);
    assert!(h.take(&l, 5.0).allowed);
    h.at(3600.0);
    assert!(h.take(&l, 5.0).allowed);
    assert!(!h.take(&l, 0.1).allowed);
}

#[test]
fn a_burst_at_one_instant_admits_exactly_the_burst() {
    let h = H::new();
    let l = tb(1.0, 7.0);
    let admitted = (0..20).filter(|_| h.take(&l, 1.0).allowed).count();
    assert_eq!(admitted, 7);
}

#[test]
fn cost_zero_is_a_check() {
    let h = H::new();
    let l = tb(1.0, 3.0);
    let d = h.take(&l, 0.0);
    assert!(d.allowed);
    assert_eq!(d.remaining, 3);
    assert_eq!(h.tokens(&l), 3.0);
    // Zero cost is denied while reservations keep the bucket below zero.
    let r = tb(1.0, 1.0);
    assert!(h.reserve(&r, 3.0).allowed);
    let d = h.take(&r, 0.0);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(2.0));
}

#[test]
fn a_reservation_goes_negative_and_delays() {
    let h = H::new();
    let l = tb(2.0, 3.0);
    let d = h.reserve(&l, 5.0);
    assert!(d.allowed);
    assert_eq!(d.retry_after, Some(1.0)); // (5 - 3) / 2
    assert_eq!(d.remaining, 0);
    assert!(close(d.reset, 2.5)); // (3 - -2) / 2
    assert!(close(h.tokens(&l), -2.0));
    // The debt is repaid by refill before anything else is admitted.
    h.at(0.5);
    let d = h.take(&l, 1.0);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(1.0)); // available -1, (1 - -1) / 2
}

#[test]
fn max_reserved_bounds_the_debt_inclusively() {
    let h = H::new();
    let l = tb_reserved(1.0, 2.0, 3.0);
    assert!(h.reserve(&l, 4.0).allowed); // deficit 2
    let d = h.reserve(&l, 1.5); // deficit 3.5 > 3
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(3.5));
    assert!(close(h.tokens(&l), -2.0));
    assert!(h.reserve(&l, 1.0).allowed); // deficit exactly 3
    assert!(close(h.tokens(&l), -3.0));
}

#[test]
fn reserving_is_opt_in() {
    let h = H::new();
    let l = tb(1.0, 2.0);
    assert!(h.take(&l, 2.0).allowed);
    assert!(!h.take(&l, 1.0).allowed);
    assert!(h.reserve(&l, 1.0).allowed);
}

#[test]
fn a_cost_above_burst_plus_max_reserved_is_an_error() {
    let h = H::new();
    let l = tb_reserved(1.0, 2.0, 3.0);
    let op = |c| [Op::new(&l, "k", c)];
    // Above burst + max_reserved, in either mode.
    for mode in [Mode::CONSUME, Mode::RESERVE, Mode::CHECK] {
        let err = h.store.transact_now(&op(5.5), mode).unwrap_err();
        assert!(matches!(err, StoreError::Cost(CostError::Impossible { max, .. }) if max == 5.0));
    }
    // Up to it, the formula decides: without reserving, a denial with
    // retry_after = (cost - available) / rate, and nothing taken.
    let d = h.take(&l, 2.5);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(0.5));
    assert_eq!((d.remaining, d.reset), (2, 0.0));
    assert_eq!(h.tokens(&l), 2.0);
    let d = h.reserve(&l, 5.0);
    assert!(d.allowed);
    assert_eq!(d.retry_after, Some(3.0));
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let err = h.store.transact_now(&op(bad), Mode::CONSUME).unwrap_err();
        assert!(matches!(err, StoreError::Cost(CostError::Invalid(_))));
    }
    // Without max_reserved a reservation may wait up to a year, and a
    // call that does not reserve can never take more than the burst.
    let unbounded = tb(1.0, 2.0);
    let err = h
        .store
        .transact_now(&[Op::new(&unbounded, "k", 2.5)], Mode::CONSUME)
        .unwrap_err();
    assert!(matches!(err, StoreError::Cost(CostError::Impossible { max, .. }) if max == 2.0));
    assert!(h.reserve(&unbounded, 1e6).allowed);
}

/// One caller must not be able to freeze a shared key: a reservation
/// whose wait would pass the one-year horizon is an error, and the key is
/// untouched; within the horizon reservations still work, however slow
/// the limit.
#[test]
fn a_reservation_past_the_one_year_horizon_is_an_error_and_freezes_nobody() {
    let h = H::new();
    let per_sec = tb(1.0, 5.0);
    let (max, err) = h.impossible_reservation(&per_sec, 1e300);
    assert_eq!(max, 5.0 + 31_536_000.0);
    assert!(err.contains("a year"), "{err}");
    assert_eq!(h.tokens(&per_sec), 5.0);
    assert!(h.take(&per_sec, 1.0).allowed, "the key still serves others");

    // 100 on a limit of one an hour: 99 hours' wait, well within a year.
    let hourly = Limit::new(
        "hourly",
        TokenBucket::per_period(1.0, Nanos(3_600 * S)).unwrap(),
    );
    let d = h.reserve(&hourly, 100.0);
    assert!(d.allowed);
    assert_eq!(d.retry_after, Some(99.0 * 3_600.0));

    // Reservations that each fit but together would pass the horizon stop
    // at it: the debt never exceeds a year of refill.
    let year = 365.0 * 24.0;
    let d = h.reserve(&hourly, year);
    assert!(
        !d.allowed,
        "99 hours' debt plus a year's worth is past the horizon"
    );
    assert_eq!(h.tokens(&hourly), -99.0);
    assert!(h.reserve(&hourly, year - 99.0).allowed);
    assert_eq!(h.tokens(&hourly), -year);
}

/// A count so large that a double cannot hold the tokens left exactly is
/// refused, even where the horizon would allow it.
#[test]
fn a_count_beyond_exact_floating_point_is_an_error() {
    let h = H::new();
    let torrent = tb(1e12, 1e6);
    let (max, _) = h.impossible_reservation(&torrent, 1e17);
    assert_eq!(max, sluice_core::MAX_EXACT_TOKENS);
    assert!(h.reserve(&torrent, 1e15).allowed);
}

#[test]
fn a_clock_stepping_back_refills_nothing_and_credits_nothing_twice() {
    let h = H::new();
    let l = tb(1.0, 10.0);
    h.at(5.0);
    assert!(h.take(&l, 10.0).allowed);
    h.at(3.0); // two seconds back
    let d = h.take(&l, 1.0);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(1.0));
    h.at(6.0);
    // Only the one second after the last update counts.
    assert!(close(h.tokens(&l), 1.0));
}

#[test]
fn check_reports_without_consuming() {
    let h = H::new();
    let l = tb(1.0, 2.0);
    let d = h.run(&l, "k", 2.0, Mode::CHECK);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(h.tokens(&l), 2.0);
}

#[test]
fn reset_restores_full_and_value_reports_tokens_and_time() {
    let h = H::new();
    let l = tb(1.0, 4.0);
    h.at(2.0);
    assert!(h.take(&l, 3.0).allowed);
    let v = h.store.value_now(&l, "k");
    assert_eq!(v.tokens, 1.0);
    assert_eq!(v.ts, Nanos(1_002 * S));
    h.store.reset_now(&l, "k");
    assert_eq!(h.tokens(&l), 4.0);
    assert!(h.store.is_empty());
}

#[test]
fn keys_are_independent() {
    let h = H::new();
    let l = tb(1.0, 1.0);
    assert!(h.run(&l, "a", 1.0, Mode::CONSUME).allowed);
    assert!(h.run(&l, "b", 1.0, Mode::CONSUME).allowed);
    assert!(!h.run(&l, "a", 1.0, Mode::CONSUME).allowed);
}

#[test]
fn limits_with_the_same_key_are_independent() {
    let h = H::new();
    let a = Limit::new("a", TokenBucket::new(1.0, 1.0).unwrap());
    let b = Limit::new("b", TokenBucket::new(1.0, 1.0).unwrap());
    assert!(h.take(&a, 1.0).allowed);
    assert!(h.take(&b, 1.0).allowed);
}

// ---- fixed window ----

#[test]
fn fixed_window_starts_full_and_refills_at_window_starts() {
    let h = H::new();
    let l = fw(3.0, 10.0, 3.0, 0.0);
    h.at(4.0);
    for _ in 0..3 {
        assert!(h.take(&l, 1.0).allowed);
    }
    let d = h.take(&l, 1.0);
    assert!(!d.allowed);
    // ts + period * ceil((1 - 0) / 3) - now = 0 + 10 - 4
    assert_eq!(d.retry_after, Some(6.0));
    h.at(9.999_999_999);
    assert!(!h.take(&l, 1.0).allowed);
    h.at(10.0);
    let d = h.take(&l, 1.0);
    assert!(d.allowed);
    assert_eq!(d.remaining, 2);
}

#[test]
fn fixed_window_rolls_unused_tokens_over_up_to_capacity() {
    let h = H::new();
    let l = fw(2.0, 1.0, 5.0, 0.0);
    assert!(h.take(&l, 5.0).allowed);
    h.at(1.0);
    assert_eq!(h.tokens(&l), 2.0);
    h.at(2.5);
    assert_eq!(h.tokens(&l), 4.0);
    h.at(10.0);
    assert_eq!(h.tokens(&l), 5.0);
}

#[test]
fn fixed_window_retry_counts_whole_windows() {
    let h = H::new();
    let l = fw(2.0, 10.0, 6.0, 0.0);
    h.at(3.0);
    assert!(h.take(&l, 6.0).allowed);
    let d = h.take(&l, 5.0);
    assert!(!d.allowed);
    // ceil(5 / 2) = 3 windows after the one starting at 0, minus now.
    assert_eq!(d.retry_after, Some(27.0));
    // Seconds until full: ceil(6 / 2) windows.
    assert_eq!(d.reset, 27.0);
}

#[test]
fn fixed_window_reservations_wait_for_the_window() {
    let h = H::new();
    let l = Limit::new(
        "fw",
        FixedWindow::new(1.0, Nanos(S))
            .unwrap()
            .with_start(Nanos(0))
            .with_max_reserved(2.0)
            .unwrap(),
    );
    h.at(0.5);
    assert!(h.reserve(&l, 3.0).allowed);
    assert!(close(h.tokens(&l), -2.0));
    let d = h.reserve(&l, 1.0);
    assert!(!d.allowed);
    // value -2, ceil(3 / 1) windows from the window start at 0 → 3 - 0.5
    assert_eq!(d.retry_after, Some(2.5));
}

#[test]
fn fixed_window_offsets_come_from_the_key_when_start_is_absent() {
    let h = H::new();
    let cfg = FixedWindow::new(1.0, Nanos(60 * S)).unwrap();
    let l = Limit::new("fw", cfg);
    let starts: Vec<i64> = (0..8)
        .map(|i| h.store.value_now(&l, &format!("user-{i}")).ts.0 % (60 * S))
        .collect();
    // Deterministic: the same key gets the same window start again.
    assert_eq!(starts[0], h.store.value_now(&l, "user-0").ts.0 % (60 * S));
    let distinct: std::collections::BTreeSet<_> = starts.iter().collect();
    assert!(distinct.len() > 4, "windows should be spread: {starts:?}");
    // The window start is never after now.
    assert!(h.store.value_now(&l, "user-3").ts <= h.clock_now());
}

impl H {
    fn clock_now(&self) -> Nanos {
        use sluice_core::Clock;
        self.clock.now()
    }
}

// ---- transactions ----

#[test]
fn a_transaction_is_all_or_nothing_and_reports_the_largest_wait() {
    let h = H::new();
    let roomy = Limit::new("roomy", TokenBucket::new(1.0, 10.0).unwrap());
    let tight = Limit::new("tight", TokenBucket::new(0.5, 1.0).unwrap());
    let slow = Limit::new("slow", TokenBucket::new(0.25, 1.0).unwrap());
    let ops = [
        Op::new(&roomy, "k", 1.0),
        Op::new(&tight, "k", 1.0),
        Op::new(&slow, "k", 1.0),
    ];
    assert!(h.store.transact_now(&ops, Mode::CONSUME).unwrap().allowed);
    let out = h.store.transact_now(&ops, Mode::CONSUME).unwrap();
    assert!(!out.allowed);
    assert!(out.decisions[0].allowed);
    assert_eq!(out.retry_after(), Some(4.0));
    assert_eq!(out.deciding(), Some(2));
    // The roomy limit did not pay for the denied transaction.
    assert_eq!(h.store.value_now(&roomy, "k").tokens, 9.0);
}

#[test]
fn an_allowed_transaction_names_the_most_restrictive_limit() {
    let h = H::new();
    let a = Limit::new("a", TokenBucket::new(1.0, 10.0).unwrap());
    let b = Limit::new("b", TokenBucket::new(1.0, 3.0).unwrap());
    let out = h
        .store
        .transact_now(
            &[Op::new(&a, "k", 1.0), Op::new(&b, "k", 1.0)],
            Mode::CONSUME,
        )
        .unwrap();
    assert!(out.allowed);
    assert_eq!(out.deciding(), Some(1));
}

#[test]
fn the_same_key_twice_in_one_transaction_pays_twice() {
    let h = H::new();
    let l = tb(1.0, 3.0);
    let ops = [Op::new(&l, "k", 2.0), Op::new(&l, "k", 2.0)];
    let out = h.store.transact_now(&ops, Mode::CONSUME).unwrap();
    assert!(!out.allowed);
    assert_eq!(h.tokens(&l), 3.0);
    let ops = [Op::new(&l, "k", 1.0), Op::new(&l, "k", 2.0)];
    assert!(h.store.transact_now(&ops, Mode::CONSUME).unwrap().allowed);
    assert_eq!(h.tokens(&l), 0.0);
}

// ---- hot-key shards ----

#[test]
fn shards_split_the_limit_and_pick_the_fuller_of_two() {
    let h = H::new();
    let l = Limit::new("hot", TokenBucket::new(4.0, 8.0).unwrap())
        .with_shards(4)
        .unwrap();
    let Algorithm::TokenBucket(per) = l.shard_algorithm() else {
        panic!("token bucket expected")
    };
    assert_eq!((per.rate(), per.capacity()), (1.0, 2.0));
    // Drain shard 0 through picks (0,1),(0,1): the first goes to 0, the
    // second sees 0 emptier and picks 1.
    let pick = |p: u64| [Op::new(&l, "k", 1.0).with_pick(p)];
    let p01 = 0u64; // a = 0, b = 1
    assert_eq!(pick(p01)[0].shards(), (0, 1));
    for _ in 0..4 {
        assert!(
            h.store
                .transact_now(&pick(p01), Mode::CONSUME)
                .unwrap()
                .allowed
        );
    }
    // Shards 0 and 1 are now empty; the whole key still has 4 tokens.
    assert!(
        !h.store
            .transact_now(&pick(p01), Mode::CONSUME)
            .unwrap()
            .allowed
    );
    assert_eq!(h.store.value_now(&l, "k").tokens, 4.0);
    // Random picks find the two full shards, and never more than they hold.
    fastrand::seed(7);
    let admitted = (0..100)
        .filter(|_| {
            h.store
                .transact_now(&[Op::new(&l, "k", 1.0)], Mode::CONSUME)
                .unwrap()
                .allowed
        })
        .count();
    assert_eq!(admitted, 4);
}

#[test]
fn a_rate_per_period_keeps_whole_results_whole() {
    let h = H::new();
    let per_minute = TokenBucket::per_period(10.0, Nanos(60 * S))
        .unwrap()
        .with_capacity(20.0)
        .unwrap();
    let l = Limit::new("sendMessage", per_minute);
    assert!(h.take(&l, 20.0).allowed);
    let d = h.take(&l, 1.0);
    assert_eq!(d.retry_after, Some(6.0));
    assert_eq!(d.reset, 120.0);
    h.at(6.0);
    assert_eq!(h.tokens(&l), 1.0);
    assert!(h.take(&l, 1.0).allowed);
}

// ---- sliding window ----

/// A sliding window of `rate` per `period_s`, windows aligned to the
/// harness's time zero.
fn sw(rate: f64, period_s: f64) -> Limit {
    let cfg = SlidingWindow::per_period(rate, Nanos::from_secs_f64(period_s).unwrap())
        .unwrap()
        .with_start(Nanos(1_000 * S));
    Limit::new("sw", cfg)
}

#[test]
fn a_sliding_window_weighs_the_previous_window_by_its_overlap() {
    let h = H::new();
    let l = sw(10.0, 10.0);
    h.at(1.0);
    let d = h.take(&l, 8.0);
    assert!(d.allowed);
    // 8 counted in this window: empty two windows after its start.
    assert_eq!(
        (d.capacity, d.remaining, d.retry_after, d.reset),
        (10.0, 2, None, 19.0)
    );
    // 2.5 s into the next window the 8 weigh 8 × 0.75 = 6.
    h.at(12.5);
    assert_eq!(h.tokens(&l), 4.0);
    let d = h.take(&l, 4.0);
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset), (0, 17.5));
    // cur + cost = 5 ≤ 10: the previous window's weight must fall to 5,
    // at e = 10 × (1 − 5/8) = 3.75 s.
    let d = h.take(&l, 1.0);
    assert!(!d.allowed);
    assert!(close(d.retry_after.unwrap(), 1.25), "{d:?}");
    assert_eq!(d.remaining, 0);
    h.at(13.749);
    assert!(!h.take(&l, 1.0).allowed);
    h.at(13.75);
    assert!(h.take(&l, 1.0).allowed);
}

#[test]
fn a_window_full_by_itself_waits_for_the_next_even_with_nothing_before() {
    let h = H::new();
    let l = sw(10.0, 10.0);
    h.at(2.0);
    assert!(h.take(&l, 10.0).allowed);
    // prev = 0 and cur + cost = 11 > 10: only the next window helps, where
    // the 10 weigh 10 × (1 − e/10) and 1 more fits from e = 1 s.
    h.at(4.0);
    let d = h.take(&l, 1.0);
    assert!(!d.allowed);
    assert!(close(d.retry_after.unwrap(), 7.0), "{d:?}");
    assert!(close(d.reset, 16.0));
    h.at(10.999);
    assert!(!h.take(&l, 1.0).allowed);
    h.at(11.0);
    let d = h.take(&l, 1.0);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
}

#[test]
fn a_cost_of_the_whole_rate_waits_for_both_windows_to_pass() {
    let h = H::new();
    let l = sw(4.0, 10.0);
    h.at(5.0);
    assert!(h.take(&l, 1.0).allowed);
    // cur + 4 > 4, and the 1 must weigh nothing: the window after next.
    let d = h.take(&l, 4.0);
    assert!(close(d.retry_after.unwrap(), 15.0), "{d:?}");
    h.at(19.999);
    assert!(!h.take(&l, 4.0).allowed);
    h.at(20.0);
    assert!(h.take(&l, 4.0).allowed);
}

#[test]
fn a_sliding_window_forgets_everything_two_windows_on() {
    let h = H::new();
    let l = sw(3.0, 10.0);
    h.at(9.0);
    assert!(h.take(&l, 3.0).allowed);
    h.at(20.0);
    let v = h.store.value_now(&l, "k");
    assert_eq!((v.tokens, v.ts), (3.0, Nanos(1_020 * S)));
    let d = h.take(&l, 3.0);
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset), (0, 20.0));
}

#[test]
fn sliding_window_offsets_come_from_the_key_when_start_is_absent() {
    let h = H::new();
    let period = Nanos(60 * S);
    let l = Limit::new("sw", SlidingWindow::per_period(5.0, period).unwrap());
    for key in ["alice", "bob"] {
        assert!(h.run(&l, key, 1.0, Mode::CONSUME).allowed);
        let offset = window_offset(key.as_bytes(), period.0);
        let ts = h.store.value_now(&l, key).ts;
        assert_eq!((ts.0 - offset).rem_euclid(period.0), 0, "{key}");
        assert!(ts.0 <= 1_000 * S && 1_000 * S < ts.0 + period.0);
    }
}

#[test]
fn sliding_windows_refuse_reservations_and_costs_above_the_rate() {
    let h = H::new();
    let l = sw(5.0, 1.0);
    let err = h
        .store
        .transact_now(&[Op::new(&l, "k", 1.0)], Mode::RESERVE)
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Cost(CostError::NoReservations { algorithm, .. }) if *algorithm == "sliding_window"),
        "{err}"
    );
    assert!(err.to_string().contains("takes no reservations"), "{err}");
    let err = h
        .store
        .transact_now(&[Op::new(&l, "k", 5.5)], Mode::CONSUME)
        .unwrap_err();
    assert!(matches!(err, StoreError::Cost(CostError::Impossible { max, .. }) if max == 5.0));
    assert!(h.take(&l, 5.0).allowed, "the whole rate is a legal cost");
}

#[test]
fn a_sliding_window_check_and_cost_zero_change_nothing() {
    let h = H::new();
    let l = sw(2.0, 1.0);
    assert!(h.take(&l, 1.5).allowed);
    for mode in [Mode::CHECK, Mode::CONSUME] {
        let d = h.run(&l, "k", 0.0, mode);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
    }
    let d = h.run(&l, "k", 1.0, Mode::CHECK);
    assert!(!d.allowed);
    assert_eq!(h.tokens(&l), 0.5);
    h.store.reset_now(&l, "k");
    assert_eq!(h.tokens(&l), 2.0);
    assert!(h.take(&l, 2.0).allowed);
}

// ---- sliding log ----

fn sl(rate: f64, period_s: f64) -> Limit {
    let cfg = SlidingLog::per_period(rate, Nanos::from_secs_f64(period_s).unwrap()).unwrap();
    Limit::new("sl", cfg)
}

#[test]
fn a_sliding_log_admits_exactly_rate_in_any_period() {
    let h = H::new();
    let l = sl(3.0, 10.0);
    for t in [0.0, 2.0, 4.0] {
        h.at(t);
        assert!(h.take(&l, 1.0).allowed, "at {t}");
    }
    h.at(9.999);
    let d = h.take(&l, 1.0);
    assert!(!d.allowed);
    // The entry at 0 leaves the window at 10.
    assert!(close(d.retry_after.unwrap(), 0.001), "{d:?}");
    assert_eq!(d.remaining, 0);
    // The newest entry, at 4, leaves at 14.
    assert!(close(d.reset, 4.001), "{d:?}");
    h.at(10.0);
    let d = h.take(&l, 1.0);
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset), (0, 10.0));
    let d = h.take(&l, 1.0);
    assert_eq!(d.retry_after, Some(2.0));
}

#[test]
fn a_denied_log_call_waits_for_as_many_entries_as_it_needs_to_leave() {
    let h = H::new();
    let l = sl(5.0, 10.0);
    assert!(h.take(&l, 2.0).allowed);
    h.at(3.0);
    assert!(h.take(&l, 2.0).allowed);
    h.at(6.0);
    // 4 used: 2 more need the entry at 0 gone (at 10), 5 more both (at 13).
    let d = h.take(&l, 2.0);
    assert!(!d.allowed);
    assert_eq!((d.retry_after, d.remaining, d.reset), (Some(4.0), 1, 7.0));
    let d = h.take(&l, 5.0);
    assert_eq!(d.retry_after, Some(7.0));
    // A denial logged nothing.
    assert!(h.take(&l, 1.0).allowed);
    assert_eq!(h.tokens(&l), 0.0);
}

#[test]
fn a_sliding_log_counts_fractional_costs_exactly() {
    let h = H::new();
    let l = sl(1.0, 1.0);
    for _ in 0..4 {
        assert!(h.take(&l, 0.25).allowed);
    }
    let d = h.take(&l, 0.25);
    assert!(!d.allowed);
    // All four share one instant, so one entry: all leave together.
    assert_eq!(d.retry_after, Some(1.0));
    h.at(0.5);
    assert!(!h.take(&l, 0.125).allowed);
    h.at(1.0);
    assert!(h.take(&l, 1.0).allowed);
}

#[test]
fn a_sliding_log_check_cost_zero_reset_and_value() {
    let h = H::new();
    let l = sl(4.0, 10.0);
    assert_eq!(h.tokens(&l), 4.0);
    h.at(1.0);
    assert!(h.take(&l, 3.0).allowed);
    let d = h.run(&l, "k", 2.0, Mode::CHECK);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(10.0));
    let d = h.run(&l, "k", 0.0, Mode::CONSUME);
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset), (1, 10.0));
    h.at(2.5);
    let v = h.store.value_now(&l, "k");
    assert_eq!((v.tokens, v.ts), (1.0, Nanos(1_002_500_000_000)));
    h.store.reset_now(&l, "k");
    assert_eq!(h.tokens(&l), 4.0);
    assert!(h.take(&l, 4.0).allowed);
}

#[test]
fn a_sliding_log_refuses_reservations_and_costs_above_the_rate() {
    let h = H::new();
    let l = sl(2.0, 1.0);
    let err = h
        .store
        .transact_now(&[Op::new(&l, "k", 1.0)], Mode::RESERVE)
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::Cost(CostError::NoReservations { .. })
    ));
    let err = h
        .store
        .transact_now(&[Op::new(&l, "k", 2.5)], Mode::CONSUME)
        .unwrap_err();
    assert!(matches!(err, StoreError::Cost(CostError::Impossible { max, .. }) if max == 2.0));
}

#[test]
fn a_clock_stepping_back_lets_no_log_entry_leave_early() {
    let h = H::new();
    let l = sl(2.0, 10.0);
    h.at(5.0);
    assert!(h.take(&l, 2.0).allowed);
    h.at(20.0);
    assert!(h.take(&l, 1.0).allowed);
    // Back to 14.9, when the 2 at 5 were still in the window: the log is
    // read at its newest time, 20, where only the 1 counts.
    h.at(14.9);
    let d = h.take(&l, 1.0);
    assert!(d.allowed);
    assert_eq!(d.reset, 10.0);
    assert!(!h.take(&l, 1.0).allowed);
}

#[test]
fn sharded_sliding_limits_split_the_rate() {
    let h = H::new();
    let l = sl(8.0, 10.0).with_shards(4).unwrap();
    let Algorithm::SlidingLog(per) = l.shard_algorithm() else {
        panic!("sliding log expected")
    };
    assert_eq!(per.rate(), 2.0);
    fastrand::seed(11);
    let admitted = (0..100).filter(|_| h.take(&l, 1.0).allowed).count();
    assert!((6..=8).contains(&admitted), "{admitted}");
    assert_eq!(h.tokens(&l), 8.0 - admitted as f64);
    h.at(10.0);
    assert_eq!(h.tokens(&l), 8.0);
}

#[test]
fn a_transaction_mixes_sliding_and_bucket_limits_all_or_nothing() {
    let h = H::new();
    let log = sl(2.0, 10.0);
    let window = sw(3.0, 10.0);
    let bucket = tb(1.0, 5.0);
    let ops = [
        Op::new(&bucket, "k", 1.0),
        Op::new(&log, "k", 1.0),
        Op::new(&window, "k", 1.0),
    ];
    for _ in 0..2 {
        assert!(h.store.transact_now(&ops, Mode::CONSUME).unwrap().allowed);
    }
    let out = h.store.transact_now(&ops, Mode::CONSUME).unwrap();
    assert!(!out.allowed);
    assert_eq!(out.deciding(), Some(1));
    assert_eq!(out.retry_after(), Some(10.0));
    // The others would have allowed, and report what they still hold.
    let [b, _, w] = [out.decisions[0], out.decisions[1], out.decisions[2]];
    assert!(b.allowed && w.allowed);
    assert_eq!((b.remaining, w.remaining), (3, 1));
    assert_eq!((h.tokens(&bucket), h.tokens(&window)), (3.0, 1.0));
    // The same log key twice pays twice.
    h.at(10.0);
    let twice = [Op::new(&log, "k", 1.0), Op::new(&log, "k", 1.5)];
    assert!(!h.store.transact_now(&twice, Mode::CONSUME).unwrap().allowed);
    let twice = [Op::new(&log, "k", 1.0), Op::new(&log, "k", 1.0)];
    let out = h.store.transact_now(&twice, Mode::CONSUME).unwrap();
    assert!(out.allowed);
    assert_eq!(out.decisions[1].remaining, 0);
    assert_eq!(h.tokens(&log), 0.0);
}

#[test]
fn one_name_as_a_bucket_and_a_log_in_one_transaction_is_refused() {
    let h = H::new();
    let bucket = Limit::new("same", TokenBucket::new(1.0, 5.0).unwrap());
    let log = Limit::new("same", SlidingLog::per_period(5.0, Nanos(S)).unwrap());
    let ops = [Op::new(&bucket, "k", 1.0), Op::new(&log, "k", 1.0)];
    let err = h.store.transact_now(&ops, Mode::CONSUME).unwrap_err();
    assert!(
        err.to_string()
            .contains("as both a token_bucket and a sliding_log"),
        "{err}"
    );
    assert_eq!(h.tokens(&bucket), 5.0, "nothing was spent");
}
