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
//!
//! Criterion times one side after the other, several seconds each, so on a
//! machine whose speed drifts the ratio of two results can drift too; the
//! `paired` benchmark alternates the sides in short slices for a ratio that
//! does not.

// Setup code in a benchmark: a failure there is a broken benchmark, and
// panicking with the message is the right response.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Case, KEY_COUNTS, Sides, keys, timed};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};

/// Benchmarks `decide` over `keys` on `threads` threads, each sample going
/// on from where the previous one stopped.
fn bench_one<R>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: String,
    keys: &[String],
    threads: usize,
    decide: impl Fn(&String) -> R + Sync,
) {
    let mut cursor = 0usize;
    group.bench_function(id, |b| {
        b.iter_custom(|iters| {
            let iters = usize::try_from(iters).unwrap();
            timed(keys, &mut cursor, iters, threads, &decide)
        });
    });
}

fn keyed(c: &mut Criterion) {
    let key_sets = KEY_COUNTS.map(|(name, n)| (name, keys(n)));
    let mut group = c.benchmark_group("keyed");
    group
        .throughput(Throughput::Elements(1))
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    for case in Case::ALL {
        for (keys_name, keys) in &key_sets {
            // Fresh stores per (mode, key count), each key decided once.
            let sides = Sides::filled(case, keys);
            let sluice = |k: &String| sides.sluice(k);
            let governor = |k: &String| sides.governor(k);

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
