//! Property tests of the algorithms through the in-memory store: the rate
//! bound over every window, denials and failed transactions never consume,
//! reservations stay within bounds, and agreement with a brute-force model.

// Test helpers outside #[test] functions fail loudly on purpose.
#![allow(clippy::unwrap_used, clippy::panic)]

use proptest::prelude::*;
use sluice_core::{
    Algorithm, FakeClock, FixedWindow, Limit, MemoryStore, Mode, Nanos, Op, TokenBucket,
};

const S: i64 = Nanos::PER_SEC;
const EPS: f64 = 1e-9;

fn store() -> (FakeClock, MemoryStore<FakeClock>) {
    let clock = FakeClock::new(Nanos::ZERO);
    (clock.clone(), MemoryStore::with_clock(clock))
}

/// A call: time step in ns, cost, reserve flag.
fn calls(max_cost: f64) -> impl Strategy<Value = Vec<(i64, f64, bool)>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0i64), 0..2 * S, 0..20 * S],
            prop_oneof![Just(1.0), 0.0..max_cost],
            any::<bool>(),
        ),
        1..120,
    )
}

fn token_bucket() -> impl Strategy<Value = Algorithm> {
    (0.1f64..50.0, 0.0f64..40.0, prop::option::of(0.0f64..20.0)).prop_map(|(rate, burst, mr)| {
        let tb = TokenBucket::new(rate, burst.max(1.0)).unwrap();
        match mr {
            Some(m) => tb.with_max_reserved(m).unwrap().into(),
            None => tb.into(),
        }
    })
}

fn fixed_window() -> impl Strategy<Value = Algorithm> {
    (
        0.5f64..20.0,
        1i64..30,
        1.0f64..3.0,
        0..30 * S,
        prop::option::of(0.0f64..20.0),
    )
        .prop_map(|(rate, period_s, cap_mult, start, mr)| {
            let fw = FixedWindow::new(rate, Nanos(period_s * S / 3))
                .unwrap()
                .with_capacity(rate * cap_mult)
                .unwrap()
                .with_start(Nanos(start));
            match mr {
                Some(m) => fw.with_max_reserved(m).unwrap().into(),
                None => fw.into(),
            }
        })
}

fn any_algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![token_bucket(), fixed_window()]
}

/// The admitted (time, cost) pairs of a run, after clamping costs into range.
fn run(alg: Algorithm, calls: &[(i64, f64, bool)], reserve_allowed: bool) -> Vec<(i64, f64)> {
    let (clock, store) = store();
    let limit = Limit::new("p", alg);
    let mut t = 0;
    let mut admitted = vec![];
    for &(dt, cost, reserve) in calls {
        t += dt;
        clock.set(Nanos(t));
        let reserve = reserve && reserve_allowed;
        let cost = cost.min(alg.max_cost(reserve));
        let mode = if reserve {
            Mode::RESERVE
        } else {
            Mode::CONSUME
        };
        let out = store
            .transact_now(&[Op::new(&limit, "k", cost)], mode)
            .unwrap();
        if out.allowed {
            admitted.push((t, cost));
        }
    }
    admitted
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// In any window of length T, a token bucket admits at most
    /// burst + rate·T (plus what it may reserve, when reserving).
    #[test]
    fn admitted_cost_in_any_window_is_bounded(alg in token_bucket(), calls in calls(45.0), reserve in any::<bool>()) {
        let Algorithm::TokenBucket(tb) = alg else { unreachable!() };
        let admitted = run(alg, &calls, reserve);
        let slack = if reserve { alg.reservable() } else { 0.0 };
        for i in 0..admitted.len() {
            let mut sum = 0.0;
            for j in i..admitted.len() {
                sum += admitted[j].1;
                let span = (admitted[j].0 - admitted[i].0) as f64 / S as f64;
                let bound = tb.capacity() + slack + tb.rate() * span;
                prop_assert!(sum <= bound + EPS * bound.max(1.0),
                    "admitted {sum} in {span}s > bound {bound}");
            }
        }
    }

    /// A fixed window admits at most `capacity` plus `rate` for each window
    /// boundary inside the span.
    #[test]
    fn fixed_window_admits_at_most_capacity_plus_windows(alg in fixed_window(), calls in calls(45.0)) {
        let Algorithm::FixedWindow(fw) = alg else { unreachable!() };
        let admitted = run(alg, &calls, false);
        for i in 0..admitted.len() {
            let mut sum = 0.0;
            for j in i..admitted.len() {
                sum += admitted[j].1;
                let boundaries = (admitted[j].0 - admitted[i].0) / fw.period().0 + 1;
                let bound = fw.capacity() + fw.rate() * boundaries as f64;
                prop_assert!(sum <= bound + EPS * bound);
            }
        }
    }

    /// A denial leaves the state exactly as it was, and a check never
    /// changes it.
    #[test]
    fn denials_and_checks_never_consume(alg in any_algorithm(), calls in calls(45.0)) {
        let (clock, store) = store();
        let limit = Limit::new("p", alg);
        let mut t = 0;
        for (dt, cost, reserve) in calls {
            t += dt;
            clock.set(Nanos(t));
            let cost = cost.min(alg.max_cost(reserve));
            let before = store.value_now(&limit, "k");
            let check = Mode { consume: false, reserve };
            let checked = store.transact_now(&[Op::new(&limit, "k", cost)], check).unwrap();
            prop_assert_eq!(store.value_now(&limit, "k"), before);
            let mode = if reserve { Mode::RESERVE } else { Mode::CONSUME };
            let out = store.transact_now(&[Op::new(&limit, "k", cost)], mode).unwrap();
            prop_assert_eq!(&checked, &out);
            if !out.allowed {
                prop_assert_eq!(store.value_now(&limit, "k"), before);
            } else {
                let after = store.value_now(&limit, "k").tokens;
                prop_assert!((before.tokens - cost - after).abs() <= EPS * cost.max(1.0));
            }
        }
    }

    /// Reservations never take a key below -max_reserved (or a year of
    /// refill, without one), and an allowed
    /// reservation's delay is exactly the time to refill the deficit.
    #[test]
    fn reservations_stay_within_max_reserved(alg in any_algorithm(), calls in calls(60.0)) {
        let (clock, store) = store();
        let limit = Limit::new("p", alg);
        let floor = -alg.reservable();
        let mut t = 0;
        for (dt, cost, _) in calls {
            t += dt;
            clock.set(Nanos(t));
            let cost = cost.min(alg.max_cost(true));
            let out = store.transact_now(&[Op::new(&limit, "k", cost)], Mode::RESERVE).unwrap();
            let tokens = store.value_now(&limit, "k").tokens;
            prop_assert!(tokens >= floor - EPS, "tokens {tokens} below {floor}");
            if out.allowed && tokens < 0.0 {
                prop_assert!(out.decisions[0].retry_after.is_some());
            }
        }
    }

    /// A transaction over several limits either commits every one or none.
    #[test]
    fn transactions_are_all_or_nothing(
        algs in prop::collection::vec(any_algorithm(), 1..5),
        steps in prop::collection::vec((0..3 * S, prop::collection::vec(0.0f64..30.0, 5), any::<bool>()), 1..60),
    ) {
        let (clock, store) = store();
        let limits: Vec<Limit> = algs.iter().enumerate().map(|(i, a)| Limit::new(format!("l{i}"), *a)).collect();
        let mut t = 0;
        for (dt, costs, check) in steps {
            t += dt;
            clock.set(Nanos(t));
            let ops: Vec<Op<'_>> = limits.iter().zip(&costs)
                .map(|(l, &c)| Op::new(l, "k", c.min(l.algorithm().capacity())))
                .collect();
            let before: Vec<f64> = limits.iter().map(|l| store.value_now(l, "k").tokens).collect();
            let mode = if check { Mode::CHECK } else { Mode::CONSUME };
            let out = store.transact_now(&ops, mode).unwrap();
            prop_assert_eq!(out.allowed, out.decisions.iter().all(|d| d.allowed));
            for ((l, op), b) in limits.iter().zip(&ops).zip(&before) {
                let now = store.value_now(l, "k").tokens;
                let spent = if out.allowed && !check { op.cost } else { 0.0 };
                prop_assert!((b - spent - now).abs() <= EPS * b.abs().max(1.0),
                    "{}: before {b} spent {spent} now {now}", l.name());
            }
            if !out.allowed {
                let worst = out.decisions.iter().filter_map(|d| d.retry_after).fold(0.0, f64::max);
                prop_assert_eq!(out.retry_after(), Some(worst));
            }
        }
    }
}

/// A brute-force model in exact integers: time advances in ticks of 1/8 s
/// one tick at a time, and tokens are counted in eighths. Every quantity the
/// code computes is then a small dyadic rational, so decisions must agree
/// exactly.
mod model {
    use super::*;

    pub(super) const TICK: i64 = S / 8;

    pub(super) struct Bucket {
        /// Eighths of a token added per tick: rate (tokens/s) × 8 / 8.
        pub(super) per_tick: i64,
        pub(super) cap: i64,
        pub(super) max_reserved: Option<i64>,
        pub(super) tokens: i64,
    }

    impl Bucket {
        pub(super) fn tick(&mut self) {
            self.tokens = (self.tokens + self.per_tick).min(self.cap);
        }

        /// Returns (allowed, remaining whole tokens, deficit in eighths).
        pub(super) fn take(&mut self, cost: i64, reserve: bool) -> (bool, i64, i64) {
            let deficit = cost - self.tokens;
            let ok =
                self.tokens >= cost || (reserve && self.max_reserved.is_none_or(|m| deficit <= m));
            if ok {
                self.tokens -= cost;
            }
            (ok, self.tokens.max(0) / 8, deficit)
        }
    }

    #[derive(Clone, Copy)]
    pub(super) struct Window {
        pub(super) rate: i64,
        pub(super) period_ticks: i64,
        pub(super) start_tick: i64,
        pub(super) cap: i64,
        pub(super) max_reserved: Option<i64>,
        pub(super) tokens: i64,
    }

    impl Window {
        /// Called once per tick; adds a window's tokens when one begins.
        pub(super) fn tick(&mut self, tick: i64) {
            if (tick - self.start_tick).rem_euclid(self.period_ticks) == 0 {
                self.tokens = (self.tokens + self.rate).min(self.cap);
            }
        }

        pub(super) fn take(&mut self, cost: i64, reserve: bool) -> (bool, i64) {
            let deficit = cost - self.tokens;
            let ok =
                self.tokens >= cost || (reserve && self.max_reserved.is_none_or(|m| deficit <= m));
            if ok {
                self.tokens -= cost;
            }
            (ok, self.tokens.max(0) / 8)
        }
    }
}

fn model_calls() -> impl Strategy<Value = Vec<(i64, i64, bool)>> {
    prop::collection::vec((0i64..40, 0i64..64, any::<bool>()), 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn token_bucket_agrees_with_the_brute_force_model(
        rate in 1i64..40, burst in 1i64..64, mr in prop::option::of(0i64..64), calls in model_calls(),
    ) {
        // rate tokens/s = rate eighths per tick.
        let mut tb = TokenBucket::new(rate as f64, burst as f64 / 8.0).unwrap();
        if let Some(m) = mr { tb = tb.with_max_reserved(m as f64 / 8.0).unwrap(); }
        let limit = Limit::new("m", tb);
        let mut model = model::Bucket { per_tick: rate, cap: burst, max_reserved: mr, tokens: burst };
        let (clock, store) = store();
        let mut tick = 0;
        for (dt, cost, reserve) in calls {
            for _ in 0..dt { model.tick(); }
            tick += dt;
            clock.set(Nanos(tick * model::TICK));
            let max = if reserve { mr.map_or(i64::MAX, |m| burst + m) } else { burst };
            let cost = cost.min(max);
            let mode = if reserve { Mode::RESERVE } else { Mode::CONSUME };
            let d = store.transact_now(&[Op::new(&limit, "k", cost as f64 / 8.0)], mode).unwrap().decisions[0];
            let (ok, remaining, deficit) = model.take(cost, reserve);
            prop_assert_eq!(d.allowed, ok, "tick {} cost {}/8", tick, cost);
            prop_assert_eq!(d.remaining as i64, remaining);
            let want_retry = (deficit > 0).then(|| deficit as f64 / 8.0 / rate as f64);
            match (d.retry_after, want_retry) {
                (Some(a), Some(b)) => prop_assert!((a - b).abs() < 1e-12),
                (a, b) => prop_assert_eq!(a, b),
            }
            prop_assert_eq!(store.value_now(&limit, "k").tokens, model.tokens as f64 / 8.0);
        }
    }

    #[test]
    fn fixed_window_agrees_with_the_brute_force_model(
        rate in 1i64..40, period_ticks in 1i64..20, start_tick in 0i64..20, cap_extra in 0i64..40,
        mr in prop::option::of(0i64..64), calls in model_calls(),
    ) {
        let cap = rate + cap_extra;
        let mut fw = FixedWindow::new(rate as f64 / 8.0, Nanos(period_ticks * model::TICK)).unwrap()
            .with_capacity(cap as f64 / 8.0).unwrap()
            .with_start(Nanos(start_tick * model::TICK));
        if let Some(m) = mr { fw = fw.with_max_reserved(m as f64 / 8.0).unwrap(); }
        let limit = Limit::new("m", fw);
        let mut model = model::Window { rate, period_ticks, start_tick, cap, max_reserved: mr, tokens: cap };
        let (clock, store) = store();
        let mut tick = 0;
        for (dt, cost, reserve) in calls {
            for _ in 0..dt { tick += 1; model.tick(tick); }
            clock.set(Nanos(tick * model::TICK));
            let max = if reserve { mr.map_or(i64::MAX, |m| cap + m) } else { cap };
            let cost = cost.min(max);
            let mode = if reserve { Mode::RESERVE } else { Mode::CONSUME };
            let d = store.transact_now(&[Op::new(&limit, "k", cost as f64 / 8.0)], mode).unwrap().decisions[0];
            let (ok, remaining) = model.take(cost, reserve);
            prop_assert_eq!(d.allowed, ok, "tick {} cost {}/8", tick, cost);
            prop_assert_eq!(d.remaining as i64, remaining);
            prop_assert_eq!(store.value_now(&limit, "k").tokens, model.tokens as f64 / 8.0);
            if let Some(wait) = d.retry_after {
                // The model's answer: step forward until windows bring enough
                // (uncapped, since a reservation may exceed the capacity).
                let before = model.tokens + if ok { cost } else { 0 };
                let mut probe = model::Window { tokens: before, cap: i64::MAX, ..model };
                let mut t = tick;
                while probe.tokens < cost { t += 1; probe.tick(t); }
                prop_assert!((wait - ((t - tick) * model::TICK) as f64 / S as f64).abs() < 1e-9);
            }
        }
    }
}

/// Every algorithm, the sliding ones included.
fn every_algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        any_algorithm(),
        (1.0f64..20.0, 1i64..30).prop_map(|(rate, tenths)| {
            sluice_core::SlidingLog::per_period(rate, Nanos(tenths * S / 10))
                .unwrap()
                .into()
        }),
        (1.0f64..20.0, 1i64..30).prop_map(|(rate, tenths)| {
            sluice_core::SlidingWindow::per_period(rate, Nanos(tenths * S / 10))
                .unwrap()
                .into()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Settling, among calls, does what it says to the key's tokens: a
    /// forced charge takes exactly its amount, whatever the key holds; a
    /// refund gives back at most its amount, never lifts the key above its
    /// capacity, and gives back all of it on a token bucket or a fixed
    /// window when there is room. A settlement is never refused.
    #[test]
    fn settling_moves_a_keys_tokens_by_its_amount_and_never_above_capacity(
        alg in every_algorithm(),
        steps in prop::collection::vec((0i64..3 * S, 0.0f64..30.0, 0u8..3), 1..80),
    ) {
        let (clock, store) = store();
        let limit = Limit::new("p", alg);
        let cap = alg.capacity();
        let flat = matches!(alg, Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_));
        let mut t = 0;
        for (dt, amount, what) in steps {
            t += dt;
            clock.set(Nanos(t));
            let before = store.value_now(&limit, "k").tokens;
            match what {
                0 => {
                    let cost = amount.min(alg.max_cost(false));
                    store.decide_now(Op::new(&limit, "k", cost), Mode::CONSUME).unwrap();
                }
                1 => {
                    let d = store.settle_now(&limit, "k", sluice_core::Settle::Refund(amount)).unwrap();
                    prop_assert!(d.allowed);
                    let after = store.value_now(&limit, "k").tokens;
                    prop_assert!(after <= cap + EPS, "{after} above {cap}");
                    prop_assert!(after >= before - EPS && after - before <= amount + EPS,
                        "{before} to {after} by a refund of {amount}");
                    if flat {
                        prop_assert!((after - (before + amount).min(cap)).abs() < EPS,
                            "{before} to {after} by a refund of {amount}");
                    }
                }
                _ => {
                    let d = store.settle_now(&limit, "k", sluice_core::Settle::Charge(amount)).unwrap();
                    prop_assert!(d.allowed);
                    let after = store.value_now(&limit, "k").tokens;
                    prop_assert!((before - amount - after).abs() < EPS,
                        "{before} to {after} by a charge of {amount}");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A concurrency limit against a brute-force list of leases: every
    /// acquisition, check and release decides as the list says (a call fits
    /// when the slots of the leases not yet expired, its own included, come
    /// to at most `max`; one that does not waits for the oldest leases that
    /// must expire), and the slots held never pass `max`.
    #[test]
    fn concurrency_agrees_with_a_brute_force_list_of_leases(
        max in 1u32..12,
        lease_ms in 1i64..50,
        steps in prop::collection::vec((0i64..20, 0u8..4, 0u32..13, any::<prop::sample::Index>()), 1..120),
    ) {
        let lease = lease_ms * 1_000_000;
        let c = sluice_core::Concurrency::new(f64::from(max), Nanos(lease)).unwrap();
        let limit = Limit::new("c", c);
        let (clock, store) = store();
        // The brute force: (taken at, slots, id) of every lease not released.
        let mut model: Vec<(i64, f64, u64)> = Vec::new();
        let mut ids: Vec<u64> = Vec::new();
        let mut t = 0;
        for (step_ms, what, slots, pick) in steps {
            t += step_ms * 1_000_000;
            clock.set(Nanos(t));
            let held = |model: &[(i64, f64, u64)]| -> f64 {
                model.iter().filter(|l| l.0 + lease > t).map(|l| l.1).sum()
            };
            match what {
                0 | 1 => {
                    let slots = f64::from(slots.min(max));
                    let mode = if what == 0 { Mode::CONSUME } else { Mode::CHECK };
                    let op = Op::new(&limit, "k", slots);
                    let d = store.decide_now(op, mode).unwrap();
                    let fits = held(&model) + slots <= f64::from(max);
                    prop_assert_eq!(d.allowed, fits, "t {} slots {}", t, slots);
                    if !fits {
                        // The wait: until the oldest leases that must
                        // expire for the call to fit have expired.
                        let mut left = held(&model);
                        let frees = model
                            .iter()
                            .filter(|l| l.0 + lease > t)
                            .find(|l| {
                                left -= l.1;
                                left + slots <= f64::from(max)
                            })
                            .map(|l| (l.0 + lease - t) as f64 / 1e9);
                        prop_assert_eq!(d.retry_after, frees, "t {} slots {}", t, slots);
                    }
                    // What is left after the call, as a check says too.
                    let taken = if fits { slots } else { 0.0 };
                    let left = f64::from(max) - held(&model) - taken;
                    prop_assert_eq!(d.remaining, left.max(0.0) as u64);
                    if fits && mode.consume && slots > 0.0 {
                        model.push((t, slots, op.lease));
                        ids.push(op.lease);
                    }
                }
                _ if !ids.is_empty() => {
                    let id = ids[pick.index(ids.len())];
                    let live = model.iter().position(|l| l.2 == id && l.0 + lease > t);
                    let released = store.release_now(&limit, "k", id);
                    prop_assert_eq!(released, live.is_some(), "release {} at {}", id, t);
                    model.retain(|l| l.2 != id);
                }
                _ => {}
            }
            prop_assert!(held(&model) <= f64::from(max));
            let free = store.value_now(&limit, "k").tokens;
            prop_assert_eq!(free, f64::from(max) - held(&model));
        }
    }
}
