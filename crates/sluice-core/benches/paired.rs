//! The `keyed` comparison with governor, timed so that the ratio holds on a
//! machine whose speed drifts: the two sides alternate in short slices (25
//! ms), the same number of decisions each, and every round gives a ratio
//! of slices timed next to each other. A round runs them as A B B A, so
//! that each side runs once straight after itself and once straight after
//! the other: a side can run much faster straight after itself (see
//! `docs/performance.md`), and a round that gave one side only that start
//! would favour it. Printed per case: the median time per decision of each
//! side, the median ratio (governor time / sluice time, so above 1 means
//! sluice is faster) and the range of the rounds' ratios.
//!
//! A second table pairs the same way the token bucket with each sliding
//! algorithm and with a calendar window, all on the in-memory store, at 1
//! and 100k keys on one thread: the time per decision of each, and the
//! other one's time over the bucket's (above 1 means the other is slower).
//!
//! `cargo bench -p sluice-core --bench paired`. Settings (environment):
//! `SLUICE_PAIRED_ROUNDS` (15), `SLUICE_PAIRED_SLICE_MS` (25),
//! `SLUICE_PAIRED_ONLY`, a substring of the case names to run
//! (`allowed/1keys/`, or `sliding_log/`, say), and `SLUICE_PAIRED_SOLO`,
//! `sluice` or `governor`, which times that side in every slice of every
//! round and prints how many decisions it made, so that
//! `scripts/keyed-instructions` can count one side's instructions. Run
//! other than by `cargo bench`, as by `cargo test --benches`, it makes one
//! short round of each case, as a smoke test.

// Setup code in a benchmark: a failure there is a broken benchmark, and
// panicking with the message is the right response.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::time::Duration;

use common::{Case, Fill, KEY_COUNTS, Sides, Walk, keys, timed_walk};
use sluice_core::{
    Calendar, CalendarUnit, FixedWindow, Limit, MemoryStore, Mode, Nanos, Op, SlidingLog,
    SlidingWindow,
};

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
    /// Decisions made by both sides together, warm-up included.
    decisions: usize,
}

/// Times `a` and `b` over `keys`, visited as `walk` says, on `threads`
/// threads in slices of the same number of decisions, each round in the
/// order A B B A.
fn pair<A, B>(
    timing: &Timing,
    keys: &[String],
    walk: &Walk,
    threads: usize,
    a: &(impl Fn(&String) -> A + Sync),
    b: &(impl Fn(&String) -> B + Sync),
) -> Pair {
    let (mut at_a, mut at_b) = (0, 0);
    // Size a slice by the slower side, from a first pass of each (which
    // also warms both up). B's goes first, so that the first round's first
    // slice, A's, runs straight after A as every later round's does.
    let probe = walk.visits.len().clamp(10_000, 100_000);
    let per_b = ns_per(timed_walk(keys, walk, &mut at_b, probe, threads, b), probe);
    let per = ns_per(timed_walk(keys, walk, &mut at_a, probe, threads, a), probe).max(per_b);
    let iters = ((timing.slice.as_secs_f64() * 1e9 / per) as usize).max(threads);
    let (mut a_ns, mut b_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..timing.rounds {
        let a1 = timed_walk(keys, walk, &mut at_a, iters, threads, a);
        let b1 = timed_walk(keys, walk, &mut at_b, iters, threads, b);
        let b2 = timed_walk(keys, walk, &mut at_b, iters, threads, b);
        let a2 = timed_walk(keys, walk, &mut at_a, iters, threads, a);
        let (ta, tb) = (a1 + a2, b1 + b2);
        a_ns.push(ns_per(ta, 2 * iters));
        b_ns.push(ns_per(tb, 2 * iters));
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
        decisions: 2 * (probe + 2 * iters * timing.rounds as usize),
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
            setting("SLUICE_PAIRED_SLICE_MS", 25).max(1)
        } else {
            1
        }),
    };
    let only = std::env::var("SLUICE_PAIRED_ONLY").unwrap_or_default();
    let wanted = |name: &str| name.contains(&only);
    let measured = against_governor(&timing, &wanted) + against_the_bucket(&timing, &wanted);
    assert!(measured > 0, "no case matches SLUICE_PAIRED_ONLY={only:?}");
}

/// A traffic shape: how the keys are first decided and then visited.
struct Shape {
    /// The prefix of its cases' names; empty for the shuffled walk.
    prefix: &'static str,
    fill: Fill,
    /// The key counts (names from `KEY_COUNTS`) and thread counts it runs.
    keys: &'static [&'static str],
    threads: &'static [usize],
    walk: fn(n: usize, threads: usize) -> Walk,
}

/// The shapes measured against governor:
/// - the shuffled walk: keys first decided in an order unrelated to the
///   one they are visited in, threads half a lap apart;
/// - `inserted:` keys visited in the order they were first decided, so
///   that governor's copies of them lie in memory in visiting order;
/// - `near:` two threads walking the same keys four apart, so that they
///   meet on the same stripes and cache lines;
/// - `zipf:` 4M visits drawn from a Zipf distribution (s = 1.1) over 1M
///   keys, as real traffic comes.
const SHAPES: [Shape; 4] = [
    Shape {
        prefix: "",
        fill: Fill::Shuffled,
        keys: &["1keys", "100kkeys", "1Mkeys"],
        threads: &[1, 2],
        walk: Walk::apart,
    },
    Shape {
        prefix: "inserted:",
        fill: Fill::AsVisited,
        keys: &["100kkeys", "1Mkeys"],
        threads: &[1, 2],
        walk: Walk::apart,
    },
    Shape {
        prefix: "near:",
        fill: Fill::Shuffled,
        keys: &["100kkeys", "1Mkeys"],
        threads: &[2],
        walk: |n, _| Walk::near(n, 4),
    },
    Shape {
        prefix: "zipf:",
        fill: Fill::Shuffled,
        keys: &["1Mkeys"],
        threads: &[1, 2],
        walk: |n, threads| Walk::zipf(n, 1.1, 1 << 22, threads),
    },
];

/// The token bucket against governor, in every shape; returns the cases
/// measured.
fn against_governor(timing: &Timing, wanted: &impl Fn(&str) -> bool) -> usize {
    let solo = std::env::var("SLUICE_PAIRED_SOLO").unwrap_or_default();
    assert!(
        ["", "sluice", "governor"].contains(&solo.as_str()),
        "SLUICE_PAIRED_SOLO is sluice or governor, not {solo:?}"
    );
    let name = |shape: &Shape, case: Case, keys: &str, threads: usize| {
        format!("{}{}/{keys}/{threads}threads", shape.prefix, case.name())
    };
    // Every case wanted, in order: (key count, fill) groups share the
    // filled stores.
    let mut cases = Vec::new();
    for (keys_name, n) in KEY_COUNTS {
        for fill in [Fill::Shuffled, Fill::AsVisited] {
            for case in Case::ALL {
                for shape in SHAPES
                    .iter()
                    .filter(|s| s.fill == fill && s.keys.contains(&keys_name))
                {
                    for &threads in shape.threads {
                        let id = name(shape, case, keys_name, threads);
                        if wanted(&id) {
                            cases.push((n, fill, case, shape, threads, id));
                        }
                    }
                }
            }
        }
    }
    if cases.is_empty() {
        return 0;
    }
    println!(
        "{:<40} {:>12} {:>12} {:>7}  rounds' ratios ({} rounds of A B B A, {} ms slices)",
        "case",
        "sluice",
        "governor",
        "ratio",
        timing.rounds,
        timing.slice.as_millis()
    );
    let mut filled: Option<(usize, Fill, usize, Vec<String>, Sides)> = None;
    for (n, fill, case, shape, threads, id) in &cases {
        let same = |f: &(usize, Fill, usize, Vec<String>, Sides)| {
            f.0 == *n && f.1 == *fill && f.2 == *case as usize
        };
        if !filled.as_ref().is_some_and(same) {
            // The old stores go first: two at a million keys are a lot.
            drop(filled.take());
            let keys = keys(*n);
            let sides = Sides::filled_in(*case, &keys, *fill);
            filled = Some((*n, *fill, *case as usize, keys, sides));
        }
        let (_, _, _, keys, sides) = filled.as_ref().unwrap();
        let (visited, walk) = (shape.walk)(*n, *threads).laid_out(keys);
        let sluice = |k: &String| sides.sluice(k);
        let governor = |k: &String| sides.governor(k);
        let (keys, walk) = (&visited, &walk);
        // The ratio is governor's time over sluice's.
        let p = match solo.as_str() {
            "sluice" => pair(timing, keys, walk, *threads, &sluice, &sluice),
            "governor" => pair(timing, keys, walk, *threads, &governor, &governor),
            _ => pair(timing, keys, walk, *threads, &sluice, &governor),
        };
        println!(
            "{id:<40} {:>9.1} ns {:>9.1} ns {:>7.2}  {:.2}–{:.2}",
            p.a_ns, p.b_ns, p.ratio, p.lo, p.hi,
        );
        if !solo.is_empty() {
            println!("{solo} alone made {} decisions", p.decisions);
        }
    }
    cases.len()
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
///
/// And a calendar window (a day in Berlin), whose every call reads the
/// local date from the tz database: every call allowed with every key held,
/// and every call denied after the first. (A day is too long for keys to
/// be empty again by their next visit.)
fn sliding(case: Case) -> Vec<(&'static str, Limit)> {
    let window = |rate, ns| SlidingWindow::per_period(rate, Nanos(ns)).unwrap();
    let log = |rate, ns| SlidingLog::per_period(rate, Nanos(ns)).unwrap();
    let day = |rate| {
        let berlin = Calendar::new(CalendarUnit::Day, "Europe/Berlin").unwrap();
        Limit::new("api", FixedWindow::on_calendar(rate, berlin).unwrap())
    };
    let (short, hour) = (Nanos::PER_SEC / 10_000, 3_600 * Nanos::PER_SEC);
    match case {
        Case::Allowed => vec![
            ("sliding_window", Limit::new("api", window(1e9, short))),
            ("sliding_log", Limit::new("api", log(1e9, short))),
        ],
        Case::AllowedHeld => vec![
            ("sliding_window", Limit::new("api", window(4e9, hour))),
            ("calendar_day", day(4e9)),
        ],
        Case::Denied => vec![
            ("sliding_window", Limit::new("api", window(1.0, hour))),
            ("sliding_log", Limit::new("api", log(1.0, hour))),
            ("calendar_day", day(1.0)),
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
                "\n{:<38} {:>12} {:>12} {:>7}  rounds' ratios (other / bucket, 1 thread)",
                "case", "bucket", "other", "ratio"
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
                &Walk::apart(keys.len(), 1),
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
