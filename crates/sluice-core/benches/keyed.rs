//! Keyed decisions on the in-memory store, side by side with governor's keyed
//! rate limiter (`RateLimiter::keyed`, DashMap store, `String` keys).
//!
//! Every benchmark is named `keyed/{mode}/{keys}/{threads}/{sluice|governor}`:
//!
//! - `mode`: `allowed` (1e9 per second, burst 1e9: every call is allowed and
//!   every bucket is full again by the next call), `allowed_held` (rate 1 per
//!   second, burst 4e9: every call is allowed but no bucket ever refills to
//!   full, so every key stays held) or `denied` (1 per hour, burst 1: after the
//!   warm-up pass every call is denied);
//! - `keys`: `1keys`, `100kkeys` or `1Mkeys` distinct keys `user:{:08}`, visited
//!   in one pre-shuffled order that both sides share;
//! - `threads`: `1threads`, or `2threads` where two scoped threads each make
//!   half of the decisions and the wall time is measured.
//!
//! The stores are populated (every key decided once, in a different shuffled
//! order) before timing, so the numbers are steady-state lookups, not first
//! inserts.

// Setup code in a benchmark: a failure there is a broken benchmark, and
// panicking with the message is the right response.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use sluice_core::{Limit, MemoryStore, Mode, Op, TokenBucket};

/// The quota of one benchmark mode, for both limiters.
#[derive(Clone, Copy)]
enum Case {
    Allowed,
    AllowedHeld,
    Denied,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Allowed => "allowed",
            Case::AllowedHeld => "allowed_held",
            Case::Denied => "denied",
        }
    }

    fn sluice(self) -> Limit {
        let tb = match self {
            Case::Allowed => TokenBucket::new(1e9, 1e9),
            Case::AllowedHeld => TokenBucket::new(1.0, 4e9),
            Case::Denied => TokenBucket::new(1.0 / 3600.0, 1.0),
        };
        Limit::new("api", tb.unwrap())
    }

    fn governor(self) -> Quota {
        let nz = |n: u32| NonZeroU32::new(n).unwrap();
        match self {
            Case::Allowed => Quota::per_second(nz(1_000_000_000)).allow_burst(nz(1_000_000_000)),
            Case::AllowedHeld => Quota::per_second(nz(1)).allow_burst(nz(4_000_000_000)),
            Case::Denied => Quota::per_hour(nz(1)).allow_burst(nz(1)),
        }
    }

    /// What every timed call should decide once the warm-up pass is done.
    fn expect_allowed(self) -> bool {
        !matches!(self, Case::Denied)
    }
}

/// `n` distinct keys `user:{:08}` in a shuffled order (fixed seed). The
/// strings are allocated in visiting order, as a request's key would be hot
/// in cache; the table lookups behind them are random for both sides.
fn keys(n: usize) -> Vec<String> {
    let mut ids: Vec<usize> = (0..n).collect();
    fastrand::Rng::with_seed(0x51u64).shuffle(&mut ids);
    ids.into_iter().map(|i| format!("user:{i:08}")).collect()
}

/// Times `iters` calls of `decide`, cycling through `keys` from where the
/// previous sample stopped, on `threads` threads (each making its share, the
/// first taking the remainder, starting `n / threads` keys apart).
fn bench_one<R>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: String,
    keys: &[String],
    threads: usize,
    decide: impl Fn(&String) -> R + Sync,
) {
    let n = keys.len();
    let mut cursor = 0usize;
    let decide = &decide;
    group.bench_function(id, |b| {
        b.iter_custom(|iters| {
            let iters = usize::try_from(iters).unwrap();
            let start_at = cursor;
            cursor = (cursor + iters / threads) % n;
            let run = move |from: usize, count: usize| {
                let mut i = from;
                for _ in 0..count {
                    black_box(decide(black_box(&keys[i])));
                    i += 1;
                    if i == n {
                        i = 0;
                    }
                }
            };
            if threads == 1 {
                let start = Instant::now();
                run(start_at, iters);
                start.elapsed()
            } else {
                let per = iters / threads;
                let start = Instant::now();
                thread::scope(|s| {
                    for t in 0..threads {
                        let count = if t == 0 {
                            iters - per * (threads - 1)
                        } else {
                            per
                        };
                        let from = (start_at + t * (n / threads)) % n;
                        s.spawn(move || run(from, count));
                    }
                });
                start.elapsed()
            }
        });
    });
}

fn keyed(c: &mut Criterion) {
    let key_sets = [
        ("1keys", keys(1)),
        ("100kkeys", keys(100_000)),
        ("1Mkeys", keys(1_000_000)),
    ];
    let mut group = c.benchmark_group("keyed");
    group
        .throughput(Throughput::Elements(1))
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    for case in [Case::Allowed, Case::AllowedHeld, Case::Denied] {
        for (keys_name, keys) in &key_sets {
            // Fresh stores per (mode, key count), each key decided once.
            let store = MemoryStore::new();
            let limit = case.sluice();
            let sluice = |k: &String| store.decide_now(Op::new(&limit, k, 1.0), Mode::CONSUME);
            let gov = RateLimiter::keyed(case.governor());
            let governor = |k: &String| gov.check_key(k);
            // Populate in an order unrelated to the visiting order, so that
            // the keys governor clones into its map are not laid out in memory
            // in the order the benchmark then reads them.
            let mut fill: Vec<&String> = keys.iter().collect();
            fastrand::Rng::with_seed(0xF111u64).shuffle(&mut fill);
            for k in fill {
                assert!(
                    sluice(k).unwrap().allowed,
                    "first call on {k} denied by sluice"
                );
                assert!(governor(k).is_ok(), "first call on {k} denied by governor");
            }
            let probe = &keys[0];
            assert_eq!(sluice(probe).unwrap().allowed, case.expect_allowed());
            assert_eq!(governor(probe).is_ok(), case.expect_allowed());

            for threads in [1usize, 2] {
                let id = |who: &str| format!("{}/{keys_name}/{threads}threads/{who}", case.name());
                bench_one(&mut group, id("sluice"), keys, threads, sluice);
                bench_one(&mut group, id("governor"), keys, threads, governor);
            }
        }
    }
    group.finish();
}

criterion_group!(benches, keyed);
criterion_main!(benches);
