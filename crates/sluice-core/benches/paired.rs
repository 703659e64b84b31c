//! The `keyed` comparison with governor, timed so that the ratio holds on a
//! machine whose speed drifts: the two sides alternate in short slices (50
//! ms), the same number of decisions each, and every round gives a ratio
//! of two slices timed next to each other. The side that goes first
//! alternates too. Printed per case: the median time per decision of each
//! side, the median ratio (governor time / sluice time, so above 1 means
//! sluice is faster) and the range of the rounds' ratios.
//!
//! A second table pairs the same way the token bucket with each sliding
//! algorithm, all on the in-memory store, at 1 and 100k keys on one thread:
//! the time per decision of each, and the sliding one's time over the
//! bucket's (above 1 means the sliding one is slower).
//!
//! `cargo bench -p sluice-core --bench paired`. Settings (environment):
//! `SLUICE_PAIRED_ROUNDS` (15), `SLUICE_PAIRED_SLICE_MS` (50) and
//! `SLUICE_PAIRED_ONLY`, a substring of the case names to run
//! (`allowed/1keys/`, or `sliding_log/`, say). Run other than by `cargo
//! bench`, as by `cargo test --benches`, it makes one short round of each
//! case, as a smoke test.

// Setup code in a benchmark: a failure there is a broken benchmark, and
// panicking with the message is the right response.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::time::Duration;

use common::{Case, KEY_COUNTS, Sides, keys, timed};
use sluice_core::{Limit, MemoryStore, Mode, Nanos, Op, SlidingLog, SlidingWindow};

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn ns_per(d: Duration, iters: usize) -> f64 {
    d.as_secs_f64() * 1e9 / iters as f64
}

/// How the sides are timed: rounds of slices of a length.
struct Timing {
    rounds: u64,
    slice: Duration,
}

/// Two sides timed against each other: each one's median time per decision,
/// and the median and range of the rounds' ratios of `b` over `a`.
struct Pair {
    a_ns: f64,
    b_ns: f64,
    ratio: f64,
    lo: f64,
    hi: f64,
}

/// Times `a` and `b` over `keys` on `threads` threads in alternating slices
/// of the same number of decisions, the side that goes first alternating.
fn pair<A, B>(
    timing: &Timing,
    keys: &[String],
    threads: usize,
    a: &(impl Fn(&String) -> A + Sync),
    b: &(impl Fn(&String) -> B + Sync),
) -> Pair {
    let (mut at_a, mut at_b) = (0, 0);
    // Size a slice by the slower side, from a first pass of each (which
    // also warms both up).
    let probe = keys.len().clamp(10_000, 100_000);
    let per = ns_per(timed(keys, &mut at_a, probe, threads, a), probe)
        .max(ns_per(timed(keys, &mut at_b, probe, threads, b), probe));
    let iters = ((timing.slice.as_secs_f64() * 1e9 / per) as usize).max(threads);
    let (mut a_ns, mut b_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..timing.rounds {
        let (ta, tb) = if round % 2 == 0 {
            let ta = timed(keys, &mut at_a, iters, threads, a);
            (ta, timed(keys, &mut at_b, iters, threads, b))
        } else {
            let tb = timed(keys, &mut at_b, iters, threads, b);
            (timed(keys, &mut at_a, iters, threads, a), tb)
        };
        a_ns.push(ns_per(ta, iters));
        b_ns.push(ns_per(tb, iters));
        ratios.push(tb.as_secs_f64() / ta.as_secs_f64());
    }
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    Pair {
        a_ns: median(&mut a_ns),
        b_ns: median(&mut b_ns),
        ratio: median(&mut ratios),
        lo,
        hi,
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let timing = Timing {
        rounds: if full {
            setting("SLUICE_PAIRED_ROUNDS", 15).max(1)
        } else {
            1
        },
        slice: Duration::from_millis(if full {
            setting("SLUICE_PAIRED_SLICE_MS", 50).max(1)
        } else {
            1
        }),
    };
    let only = std::env::var("SLUICE_PAIRED_ONLY").unwrap_or_default();
    let wanted = |name: &str| name.contains(&only);
    let measured = against_governor(&timing, &wanted) + against_the_bucket(&timing, &wanted);
    assert!(measured > 0, "no case matches SLUICE_PAIRED_ONLY={only:?}");
}

/// The token bucket against governor; returns the cases measured.
fn against_governor(timing: &Timing, wanted: &impl Fn(&str) -> bool) -> usize {
    let name =
        |case: Case, keys: &str, threads: usize| format!("{}/{keys}/{threads}threads", case.name());
    if !KEY_COUNTS.iter().any(|&(k, _)| {
        Case::ALL
            .iter()
            .any(|&c| [1, 2].iter().any(|&t| wanted(&name(c, k, t))))
    }) {
        return 0;
    }
    println!(
        "{:<34} {:>12} {:>12} {:>7}  rounds' ratios ({} rounds of {} ms slices)",
        "case",
        "sluice",
        "governor",
        "ratio",
        timing.rounds,
        timing.slice.as_millis()
    );
    let mut measured = 0;
    for (keys_name, n) in KEY_COUNTS {
        if !Case::ALL
            .iter()
            .any(|&c| [1, 2].iter().any(|&t| wanted(&name(c, keys_name, t))))
        {
            continue;
        }
        let keys = keys(n);
        for case in Case::ALL {
            let names = [1usize, 2].map(|t| name(case, keys_name, t));
            if !names.iter().any(|n| wanted(n)) {
                continue;
            }
            let sides = Sides::filled(case, &keys);
            let sluice = |k: &String| sides.sluice(k);
            let governor = |k: &String| sides.governor(k);
            for (threads, name) in [1usize, 2].into_iter().zip(names) {
                if !wanted(&name) {
                    continue;
                }
                // The ratio is governor's time over sluice's.
                let p = pair(timing, &keys, threads, &sluice, &governor);
                println!(
                    "{name:<34} {:>9.1} ns {:>9.1} ns {:>7.2}  {:.2}–{:.2}",
                    p.a_ns, p.b_ns, p.ratio, p.lo, p.hi,
                );
                measured += 1;
            }
        }
    }
    measured
}

/// One limit in a memory store of its own, every key decided once.
struct Filled {
    store: MemoryStore,
    limit: Limit,
}

impl Filled {
    /// Decides every key once, in an order unrelated to the visiting order,
    /// and checks that a further call is `allowed` as every timed one will be.
    fn new(limit: Limit, keys: &[String], allowed: bool) -> Filled {
        let filled = Filled {
            store: MemoryStore::new(),
            limit,
        };
        let mut order: Vec<&String> = keys.iter().collect();
        fastrand::Rng::with_seed(0xF111u64).shuffle(&mut order);
        for k in order {
            assert!(filled.decide(k).allowed, "first call on {k} denied");
        }
        assert_eq!(filled.decide(&keys[0]).allowed, allowed);
        filled
    }

    #[inline]
    fn decide(&self, key: &str) -> sluice_core::Decision {
        self.store
            .decide_now(Op::new(&self.limit, key, 1.0), Mode::CONSUME)
            .unwrap()
    }
}

/// The sliding algorithms' limits for a case, each the counterpart of the
/// bucket's: every call allowed, with each key empty again by its next
/// visit at 100k keys (a window or a log of 100 µs, as the bucket is full
/// again), and holding a few thousand calls' worth at 1 key; every call
/// allowed with every key held (a window of an hour; a log would grow by
/// every call, so it has no such case); every call denied after the first,
/// each key holding one count or one entry.
fn sliding(case: Case) -> Vec<(&'static str, Limit)> {
    let window = |rate, ns| SlidingWindow::per_period(rate, Nanos(ns)).unwrap();
    let log = |rate, ns| SlidingLog::per_period(rate, Nanos(ns)).unwrap();
    let (short, hour) = (Nanos::PER_SEC / 10_000, 3_600 * Nanos::PER_SEC);
    match case {
        Case::Allowed => vec![
            ("sliding_window", Limit::new("api", window(1e9, short))),
            ("sliding_log", Limit::new("api", log(1e9, short))),
        ],
        Case::AllowedHeld => vec![("sliding_window", Limit::new("api", window(4e9, hour)))],
        Case::Denied => vec![
            ("sliding_window", Limit::new("api", window(1.0, hour))),
            ("sliding_log", Limit::new("api", log(1.0, hour))),
        ],
    }
}

/// The token bucket against each sliding algorithm, one thread, at 1 and
/// 100k keys; returns the cases measured.
fn against_the_bucket(timing: &Timing, wanted: &impl Fn(&str) -> bool) -> usize {
    let mut measured = 0;
    let mut header = true;
    for (keys_name, n) in &KEY_COUNTS[..2] {
        let cases: Vec<(Case, String, Limit)> = Case::ALL
            .into_iter()
            .flat_map(|case| {
                sliding(case).into_iter().map(move |(alg, limit)| {
                    (case, format!("{alg}/{}/{keys_name}", case.name()), limit)
                })
            })
            .filter(|(_, name, _)| wanted(name))
            .collect();
        if cases.is_empty() {
            continue;
        }
        if header {
            println!(
                "\n{:<38} {:>12} {:>12} {:>7}  rounds' ratios (sliding / bucket, 1 thread)",
                "case", "bucket", "sliding", "ratio"
            );
            header = false;
        }
        let keys = keys(*n);
        for (case, name, limit) in cases {
            let bucket = Filled::new(case.sluice(), &keys, case.expect_allowed());
            let other = Filled::new(limit, &keys, case.expect_allowed());
            let p = pair(
                timing,
                &keys,
                1,
                &|k: &String| bucket.decide(k),
                &|k: &String| other.decide(k),
            );
            println!(
                "{name:<38} {:>9.1} ns {:>9.1} ns {:>7.2}  {:.2}–{:.2}",
                p.a_ns, p.b_ns, p.ratio, p.lo, p.hi,
            );
            measured += 1;
        }
    }
    measured
}
