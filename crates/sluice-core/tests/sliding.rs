//! Property tests of the sliding window and the sliding log: the log's
//! exact bound over every period, its saturation, denials and checks that
//! never consume, agreement with brute-force models of the formulas in exact
//! integers, and the in-memory store's agreement with the pure algorithms.

// Test helpers outside #[test] functions fail loudly on purpose.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::HashMap;

use proptest::prelude::*;
use sluice_core::algorithm::{self, State};
use sluice_core::sliding::{Log, WindowState, window_current, window_evaluate};
use sluice_core::{
    Algorithm, Decision, FakeClock, Limit, MemoryStore, Mode, Nanos, Op, Outcome, SlidingLog,
    SlidingWindow, TokenBucket,
};

const S: i64 = Nanos::PER_SEC;

fn store() -> (FakeClock, MemoryStore<FakeClock>) {
    let clock = FakeClock::new(Nanos::ZERO);
    (clock.clone(), MemoryStore::with_clock(clock))
}

fn decide(store: &MemoryStore<FakeClock>, limit: &Limit, cost: f64, mode: Mode) -> Decision {
    store.decide_now(Op::new(limit, "k", cost), mode).unwrap()
}

/// Calls: time step in ns, cost (clamped to the rate by the caller), and
/// whether it only checks.
fn calls() -> impl Strategy<Value = Vec<(i64, f64, bool)>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0i64), 0..S / 2, 0..4 * S],
            prop_oneof![Just(1.0), 0.0..8.0f64],
            prop::bool::weighted(0.2),
        ),
        1..150,
    )
}

fn sliding_log() -> impl Strategy<Value = SlidingLog> {
    (0.5f64..20.0, 1i64..40)
        .prop_map(|(rate, tenths)| SlidingLog::per_period(rate, Nanos(tenths * S / 10)).unwrap())
}

fn sliding_window() -> impl Strategy<Value = SlidingWindow> {
    (0.5f64..20.0, 1i64..40, 0..4 * S).prop_map(|(rate, tenths, start)| {
        SlidingWindow::per_period(rate, Nanos(tenths * S / 10))
            .unwrap()
            .with_start(Nanos(start))
    })
}

fn any_sliding() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        sliding_log().prop_map(Algorithm::from),
        sliding_window().prop_map(Algorithm::from),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Over every span of one period, a sliding log admits at most its rate.
    #[test]
    fn a_sliding_log_never_admits_more_than_its_rate_in_any_period(sl in sliding_log(), calls in calls()) {
        let (clock, store) = store();
        let limit = Limit::new("p", sl);
        let mut t = 0;
        let mut admitted: Vec<(i64, f64)> = vec![];
        for (dt, cost, _) in calls {
            t += dt;
            clock.set(Nanos(t));
            let cost = cost.min(sl.rate());
            if decide(&store, &limit, cost, Mode::CONSUME).allowed {
                admitted.push((t, cost));
            }
        }
        // The heaviest spans end at an admission.
        for &(end, _) in &admitted {
            let sum: f64 = admitted
                .iter()
                .filter(|&&(t, _)| t > end - sl.period().0 && t <= end)
                .map(|&(_, c)| c)
                .sum();
            prop_assert!(sum <= sl.rate() * (1.0 + 1e-12), "{sum} in the period to {end}");
        }
    }

    /// What docs/semantics.md says a sliding window's estimate bounds: at
    /// most `rate` in each of the key's own windows, and in a span of one
    /// period that starts a share `x` into a window, at most `rate + a × x`,
    /// where `a` is what that window admitted within the span: less than
    /// twice the rate, never the rate alone.
    #[test]
    fn a_sliding_window_admits_its_rate_a_window_and_less_than_twice_it_in_any_period(
        sw in sliding_window(), calls in calls(),
    ) {
        let (clock, store) = store();
        let limit = Limit::new("p", sw);
        let (p, start, rate) = (sw.period().0, sw.start().unwrap().0, sw.rate());
        let mut t = 0;
        let mut admitted: Vec<(i64, f64)> = vec![];
        for (dt, cost, _) in calls {
            t += dt;
            clock.set(Nanos(t));
            let cost = cost.min(rate);
            if decide(&store, &limit, cost, Mode::CONSUME).allowed {
                admitted.push((t, cost));
            }
        }
        let sum = |from: i64, to: i64| -> f64 {
            admitted.iter().filter(|&&(t, _)| t >= from && t < to).map(|&(_, c)| c).sum()
        };
        let slack = rate * 1e-12;
        for &(at, _) in &admitted {
            let ws = start + (at - start).div_euclid(p) * p;
            prop_assert!(sum(ws, ws + p) <= rate + slack, "the window from {ws}");
            // The heaviest spans start at an admission.
            let a = sum(at, ws + p);
            let x = (at - ws) as f64 / p as f64;
            let span = sum(at, at + p);
            prop_assert!(span <= rate + a * x + slack, "{span} in the period from {at}");
            prop_assert!(span < 2.0 * rate + slack, "{span} in the period from {at}");
        }
    }

    /// Callers that take one token at a time until denied, at random
    /// moments, keep a sliding log of a whole rate at exactly its rate: the
    /// period before every call holds exactly `rate` admitted.
    #[test]
    fn a_saturated_sliding_log_admits_exactly_its_rate_per_period(
        rate in 1u32..30, tenths in 1i64..40, steps in prop::collection::vec(0..3 * S, 1..80),
    ) {
        let sl = SlidingLog::per_period(f64::from(rate), Nanos(tenths * S / 10)).unwrap();
        let (clock, store) = store();
        let limit = Limit::new("p", sl);
        let mut t = 0;
        let mut admitted: Vec<i64> = vec![];
        for dt in steps {
            t += dt;
            clock.set(Nanos(t));
            while decide(&store, &limit, 1.0, Mode::CONSUME).allowed {
                admitted.push(t);
            }
            let window = admitted.iter().filter(|&&a| a > t - sl.period().0).count();
            prop_assert_eq!(window, rate as usize, "at {}", t);
        }
    }

    /// A denial leaves the key exactly as it was, a check never changes it,
    /// and an admission takes exactly its cost.
    #[test]
    fn sliding_denials_and_checks_never_consume(alg in any_sliding(), calls in calls()) {
        let (clock, store) = store();
        let limit = Limit::new("p", alg);
        let mut t = 0;
        for (dt, cost, _) in calls {
            t += dt;
            clock.set(Nanos(t));
            let cost = cost.min(alg.capacity());
            let before = store.value_now(&limit, "k");
            let checked = decide(&store, &limit, cost, Mode::CHECK);
            prop_assert_eq!(store.value_now(&limit, "k"), before);
            let d = decide(&store, &limit, cost, Mode::CONSUME);
            prop_assert_eq!(checked, d);
            let after = store.value_now(&limit, "k").tokens;
            if d.allowed {
                prop_assert!((before.tokens - cost - after).abs() <= 1e-9 * cost.max(1.0));
            } else {
                prop_assert_eq!(after, before.tokens);
                prop_assert!(d.retry_after.is_some_and(|r| r > 0.0), "{:?}", d);
            }
        }
    }
}

/// Exact models of the formulas: time in ticks of 1/8 s, tokens in
/// quarters, every comparison in integers.
mod model {
    pub(super) const TICK: i64 = super::S / 8;

    fn secs(ticks: i128, per: i128) -> f64 {
        ticks as f64 / per as f64 / 8.0
    }

    /// The weighted counter, in whole quarters and ticks.
    pub(super) struct Window {
        pub(super) rate: i64,
        pub(super) period: i64,
        pub(super) start: i64,
        pub(super) state: Option<(i64, i64, i64)>,
    }

    /// What the model decides: allowed, remaining, retry_after, reset.
    pub(super) type Answer = (bool, u64, Option<f64>, f64);

    impl Window {
        pub(super) fn take(&mut self, now: i64, cost: i64, commit: bool) -> Answer {
            let p = self.period;
            let (ws, cur, prev) = match self.state {
                None => (self.start + (now - self.start).div_euclid(p) * p, 0, 0),
                Some((ws, cur, prev)) => match (now - ws) / p {
                    0 => (ws, cur, prev),
                    1 => (ws + p, 0, cur),
                    k => (ws + k * p, 0, 0),
                },
            };
            let e = now - ws;
            let r = self.rate;
            // estimate · 4p = prev·(p − e) + cur·p, in quarter-ticks.
            let weighted = i128::from(prev) * i128::from(p - e);
            let over = |cur: i64| weighted + i128::from(cur) * i128::from(p);
            let allowed = over(cur + cost) <= i128::from(r) * i128::from(p);
            let after = if allowed { cur + cost } else { cur };
            let left = (i128::from(r) * i128::from(p) - over(after)).max(0);
            let remaining = (left / (4 * i128::from(p))) as u64;
            let retry = (!allowed).then(|| {
                if cur + cost <= r {
                    // e' = p·(1 − (r − cur − cost)/prev), as a fraction over prev.
                    let num = i128::from(p) * i128::from(prev - (r - cur - cost))
                        - i128::from(e) * i128::from(prev);
                    secs(num, i128::from(prev))
                } else {
                    let later = (i128::from(p) * i128::from(cur - (r - cost))).max(0);
                    secs(i128::from(p - e), 1) + secs(later, i128::from(cur))
                }
            });
            let empty_at = if after > 0 {
                ws + 2 * p
            } else if prev > 0 {
                ws + p
            } else {
                now
            };
            if allowed && commit {
                self.state = Some((ws, after, prev));
            }
            (
                allowed,
                remaining,
                retry,
                secs(i128::from(empty_at - now), 1),
            )
        }
    }

    /// Every admission ever, in quarters at ticks.
    pub(super) struct Log {
        pub(super) rate: i64,
        pub(super) period: i64,
        pub(super) admitted: Vec<(i64, i64)>,
    }

    impl Log {
        fn used(&self, at: i64) -> i64 {
            let live = self.admitted.iter().filter(|&&(t, _)| t > at - self.period);
            live.map(|&(_, c)| c).sum()
        }

        pub(super) fn take(&mut self, now: i64, cost: i64, commit: bool) -> Answer {
            let r = self.rate;
            let used = self.used(now);
            let allowed = used + cost <= r;
            let taken = if allowed { cost } else { 0 };
            // The least wait: the first moment an entry leaves after which
            // the cost fits.
            let retry = (!allowed).then(|| {
                let wait = self
                    .admitted
                    .iter()
                    .map(|&(t, _)| t + self.period - now)
                    .filter(|&d| d > 0 && self.used(now + d) + cost <= r)
                    .min()
                    .unwrap_or(0);
                secs(i128::from(wait), 1)
            });
            let newest = self
                .admitted
                .iter()
                .map(|&(t, _)| t)
                .filter(|&t| t > now - self.period)
                .chain((taken > 0).then_some(now))
                .max();
            let reset = newest.map_or(0, |t| t + self.period - now);
            if commit && taken > 0 {
                self.admitted.push((now, cost));
            }
            (
                allowed,
                ((r - used - taken).max(0) / 4) as u64,
                retry,
                secs(i128::from(reset), 1),
            )
        }
    }
}

/// Calls in model units: ticks to wait, quarters to take, and whether to
/// only check.
fn model_calls() -> impl Strategy<Value = Vec<(i64, i64, bool)>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0i64), 0i64..6, 0i64..60],
            0i64..48,
            prop::bool::weighted(0.2),
        ),
        1..120,
    )
}

fn assert_answer(d: Decision, want: model::Answer, limit: f64) -> Result<(), TestCaseError> {
    let (allowed, remaining, retry, reset) = want;
    prop_assert_eq!(d.allowed, allowed, "{:?} vs {:?}", d, want);
    prop_assert_eq!(d.capacity, limit);
    prop_assert_eq!(d.remaining, remaining, "{:?} vs {:?}", d, want);
    match (d.retry_after, retry) {
        (Some(a), Some(b)) => prop_assert!((a - b).abs() < 1e-6, "{:?} vs {:?}", d, want),
        (a, b) => prop_assert_eq!(a, b),
    }
    prop_assert!((d.reset - reset).abs() < 1e-6, "{:?} vs {:?}", d, want);
    Ok(())
}

/// Runs `calls` through `limit` in the store and through `model`, which
/// answers for (tick, cost in quarters, commit), comparing every decision.
fn agrees(
    limit: &Limit,
    calls: Vec<(i64, i64, bool)>,
    mut model: impl FnMut(i64, i64, bool) -> model::Answer,
) -> Result<(), TestCaseError> {
    let rate = limit.algorithm().capacity();
    let (clock, store) = store();
    let mut tick = 0;
    for (dt, cost, check) in calls {
        tick += dt;
        clock.set(Nanos(tick * model::TICK));
        let cost = cost.min((rate * 4.0) as i64);
        let mode = if check { Mode::CHECK } else { Mode::CONSUME };
        let d = decide(&store, limit, cost as f64 / 4.0, mode);
        assert_answer(d, model(tick, cost, !check), rate)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every field of every decision of a sliding window agrees, to 1 µs,
    /// with the formulas computed in exact integers.
    #[test]
    fn a_sliding_window_agrees_with_the_formulas_in_exact_arithmetic(
        rate in 1i64..48, period in 1i64..24, start in 0i64..24, calls in model_calls(),
    ) {
        let sw = SlidingWindow::per_period(rate as f64 / 4.0, Nanos(period * model::TICK))
            .unwrap()
            .with_start(Nanos(start * model::TICK));
        let mut model = model::Window { rate, period, start, state: None };
        agrees(&Limit::new("m", sw), calls, |t, c, commit| model.take(t, c, commit))?;
    }

    /// Every field of every decision of a sliding log agrees with a log of
    /// every admission ever, searched by brute force.
    #[test]
    fn a_sliding_log_agrees_with_a_brute_force_log(
        rate in 1i64..48, period in 1i64..24, calls in model_calls(),
    ) {
        let sl = SlidingLog::per_period(rate as f64 / 4.0, Nanos(period * model::TICK)).unwrap();
        let mut model = model::Log { rate, period, admitted: vec![] };
        agrees(&Limit::new("m", sl), calls, |t, c, commit| model.take(t, c, commit))?;
    }
}

/// One step of the store-versus-pure run.
#[derive(Debug, Clone)]
enum Step {
    Call {
        dt: i64,
        limit: usize,
        key: usize,
        cost: f64,
        check: bool,
    },
    /// All three limits on one key (the log's thrice), as one transaction.
    All {
        key: usize,
        costs: [f64; 5],
    },
    Reset {
        limit: usize,
        key: usize,
    },
    Value {
        limit: usize,
        key: usize,
    },
    /// The same name, a higher rate: states carry over.
    Raise {
        limit: usize,
    },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let key = || prop_oneof![4 => 0..3usize, 1 => 0..300usize];
    let cost = || prop_oneof![Just(1.0), 0.0..3.0f64];
    let call = (
        prop_oneof![Just(0i64), 0..S, 0..8 * S],
        0..3usize,
        key(),
        cost(),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(dt, limit, key, cost, check)| Step::Call {
            dt,
            limit,
            key,
            cost,
            check,
        });
    prop::collection::vec(
        prop_oneof![
            8 => call,
            2 => (key(), [cost(), cost(), cost(), cost(), cost()]).prop_map(|(key, costs)| Step::All { key, costs }),
            1 => (0..3usize, key()).prop_map(|(limit, key)| Step::Reset { limit, key }),
            1 => (0..3usize, key()).prop_map(|(limit, key)| Step::Value { limit, key }),
            1 => (1..3usize).prop_map(|limit| Step::Raise { limit }),
        ],
        1..200,
    )
}

/// The pure states of every key, by limit: a token bucket's, a sliding
/// window's and a sliding log's.
#[derive(Default)]
struct Pure {
    bucket: HashMap<usize, State>,
    window: HashMap<usize, WindowState>,
    log: HashMap<usize, Log>,
}

/// The three limits of the run, the sliding ones at `rate`.
fn make_limits(rate: [f64; 2]) -> [Limit; 3] {
    let period = Nanos(3 * S);
    [
        Limit::new("tb", TokenBucket::new(2.0, 4.0).unwrap()),
        Limit::new(
            "sw",
            SlidingWindow::per_period(rate[0], period)
                .unwrap()
                .with_start(Nanos::ZERO),
        ),
        Limit::new("sl", SlidingLog::per_period(rate[1], period).unwrap()),
    ]
}

impl Pure {
    /// Decides `cost` on limit `l` of `key`, after `pending` tokens already
    /// logged at `now` (for the log).
    fn decide(
        &self,
        limits: &[Limit; 3],
        l: usize,
        key: usize,
        now: Nanos,
        cost: f64,
        pending: f64,
    ) -> Decision {
        match limits[l].shard_algorithm() {
            Algorithm::TokenBucket(_) => {
                let alg = limits[l].shard_algorithm();
                algorithm::evaluate(alg, self.bucket.get(&key).copied(), 0, now, cost, false)
                    .decision
            }
            Algorithm::SlidingWindow(sw) => {
                window_evaluate(sw, self.window.get(&key).copied(), 0, now, cost).decision
            }
            Algorithm::SlidingLog(sl) => {
                let empty = Log::default();
                self.log
                    .get(&key)
                    .unwrap_or(&empty)
                    .evaluate(sl, now, pending, cost)
            }
            Algorithm::FixedWindow(_) | Algorithm::Concurrency(_) => {
                unreachable!("no fixed window nor concurrency in this run")
            }
        }
    }

    fn commit(&mut self, limits: &[Limit; 3], l: usize, key: usize, now: Nanos, cost: f64) {
        match limits[l].shard_algorithm() {
            Algorithm::TokenBucket(_) => {
                let alg = limits[l].shard_algorithm();
                let ev =
                    algorithm::evaluate(alg, self.bucket.get(&key).copied(), 0, now, cost, false);
                self.bucket.insert(key, ev.next.unwrap());
            }
            Algorithm::SlidingWindow(sw) => {
                let ev = window_evaluate(sw, self.window.get(&key).copied(), 0, now, cost);
                self.window.insert(key, ev.next.unwrap());
            }
            Algorithm::SlidingLog(sl) => self.log.entry(key).or_default().commit(sl, now, cost),
            Algorithm::FixedWindow(_) | Algorithm::Concurrency(_) => {
                unreachable!("no fixed window nor concurrency in this run")
            }
        }
    }

    fn tokens(&self, limits: &[Limit; 3], l: usize, key: usize, now: Nanos) -> f64 {
        match limits[l].shard_algorithm() {
            Algorithm::SlidingWindow(sw) => {
                window_current(sw, self.window.get(&key).copied(), 0, now).tokens
            }
            Algorithm::SlidingLog(sl) => self
                .log
                .get(&key)
                .map_or(sl.rate(), |g| g.current(sl, now).tokens),
            alg => algorithm::current(alg, self.bucket.get(&key).copied(), 0, now).tokens,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The store decides exactly what the pure algorithms decide on plain
    /// maps, through single calls, checks, transactions mixing a token
    /// bucket with both sliding algorithms (the same log key thrice),
    /// values, resets and rate changes.
    #[test]
    fn the_store_decides_exactly_what_the_pure_sliding_algorithms_decide(steps in steps()) {
        let (clock, store) = store();
        let mut rates = [4.0, 4.0];
        let mut limits = make_limits(rates);
        let mut pure = Pure::default();
        for step in steps {
            let now = |clock: &FakeClock| sluice_core::Clock::now(clock);
            match step {
                Step::Call { dt, limit, key, cost, check } => {
                    clock.advance(std::time::Duration::from_nanos(dt.unsigned_abs()));
                    let cost = cost.min(limits[limit].shard_algorithm().capacity());
                    let mode = if check { Mode::CHECK } else { Mode::CONSUME };
                    let want = pure.decide(&limits, limit, key, now(&clock), cost, 0.0);
                    let got = store.decide_now(Op::new(&limits[limit], &format!("k{key}"), cost), mode).unwrap();
                    prop_assert_eq!(got, want);
                    if want.allowed && !check {
                        pure.commit(&limits, limit, key, now(&clock), cost);
                    }
                }
                Step::All { key, costs } => {
                    let name = format!("k{key}");
                    let order = [0, 2, 1, 2, 2];
                    let costs: Vec<f64> = order.iter().zip(costs).map(|(&l, c)| c.min(limits[l].shard_algorithm().capacity())).collect();
                    let ops: Vec<Op<'_>> = order.iter().zip(&costs).map(|(&l, &c)| Op::new(&limits[l], &name, c)).collect();
                    let t = now(&clock);
                    let mut logged = 0.0;
                    let mut decisions = Vec::new();
                    for (&l, &c) in order.iter().zip(&costs) {
                        let d = pure.decide(&limits, l, key, t, c, logged);
                        if l == 2 && d.allowed {
                            logged += c;
                        }
                        decisions.push(d);
                    }
                    let mut want = Outcome::from_decisions(decisions.into_iter().collect());
                    if !want.allowed {
                        for (d, &l) in want.decisions.iter_mut().zip(&order) {
                            if d.allowed {
                                let idle = pure.decide(&limits, l, key, t, 0.0, 0.0);
                                (d.remaining, d.reset) = (idle.remaining, idle.reset);
                            }
                        }
                    }
                    let got = store.transact_now(&ops, Mode::CONSUME).unwrap();
                    prop_assert_eq!(&got, &want);
                    if want.allowed {
                        for (&l, &c) in order.iter().zip(&costs) {
                            pure.commit(&limits, l, key, t, c);
                        }
                    }
                }
                Step::Reset { limit, key } => {
                    store.reset_now(&limits[limit], &format!("k{key}"));
                    match limit {
                        0 => { pure.bucket.remove(&key); }
                        1 => { pure.window.remove(&key); }
                        _ => { pure.log.remove(&key); }
                    }
                }
                Step::Value { limit, key } => {
                    let got = store.value_now(&limits[limit], &format!("k{key}")).tokens;
                    prop_assert_eq!(got, pure.tokens(&limits, limit, key, now(&clock)));
                }
                Step::Raise { limit } => {
                    rates[limit - 1] += 1.5;
                    limits = make_limits(rates);
                }
            }
        }
    }
}
