//! The `keyed` comparison with governor, timed so that the ratio holds on a
//! machine whose speed drifts: the two sides alternate in short slices (50
//! ms), the same number of decisions each, and every round gives a ratio
//! of two slices timed next to each other. The side that goes first
//! alternates too. Printed per case: the median time per decision of each
//! side, the median ratio (governor time / sluice time, so above 1 means
//! sluice is faster) and the range of the rounds' ratios.
//!
//! `cargo bench -p sluice-core --bench paired`. Settings (environment):
//! `SLUICE_PAIRED_ROUNDS` (15), `SLUICE_PAIRED_SLICE_MS` (50) and
//! `SLUICE_PAIRED_ONLY`, a substring of the case names to run
//! (`allowed/1keys/`, say). Run other than by `cargo bench`, as by `cargo
//! test --benches`, it makes one short round of each case, as a smoke test.

// Setup code in a benchmark: a failure there is a broken benchmark, and
// panicking with the message is the right response.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::time::Duration;

use common::{Case, KEY_COUNTS, Sides, keys, timed};

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

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds = if full {
        setting("SLUICE_PAIRED_ROUNDS", 15).max(1)
    } else {
        1
    };
    let slice = Duration::from_millis(if full {
        setting("SLUICE_PAIRED_SLICE_MS", 50).max(1)
    } else {
        1
    });
    let only = std::env::var("SLUICE_PAIRED_ONLY").unwrap_or_default();
    let wanted = |name: &str| name.contains(&only);

    println!(
        "{:<34} {:>12} {:>12} {:>7}  rounds' ratios ({rounds} rounds of {} ms slices)",
        "case",
        "sluice",
        "governor",
        "ratio",
        slice.as_millis()
    );
    let mut measured = 0;
    for (keys_name, n) in KEY_COUNTS {
        if !Case::ALL.iter().any(|c| {
            [1, 2]
                .iter()
                .any(|t| wanted(&format!("{}/{keys_name}/{t}threads", c.name())))
        }) {
            continue;
        }
        let keys = keys(n);
        for case in Case::ALL {
            let names = [1usize, 2].map(|t| format!("{}/{keys_name}/{t}threads", case.name()));
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
                let (mut at_s, mut at_g) = (0, 0);
                // Size a slice by the slower side, from a first pass of each
                // (which also warms both up).
                let probe = n.clamp(10_000, 100_000);
                let per = ns_per(timed(&keys, &mut at_s, probe, threads, &sluice), probe).max(
                    ns_per(timed(&keys, &mut at_g, probe, threads, &governor), probe),
                );
                let iters = ((slice.as_secs_f64() * 1e9 / per) as usize).max(threads);
                let (mut s_ns, mut g_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
                for round in 0..rounds {
                    let (s, g) = if round % 2 == 0 {
                        let s = timed(&keys, &mut at_s, iters, threads, &sluice);
                        (s, timed(&keys, &mut at_g, iters, threads, &governor))
                    } else {
                        let g = timed(&keys, &mut at_g, iters, threads, &governor);
                        (timed(&keys, &mut at_s, iters, threads, &sluice), g)
                    };
                    s_ns.push(ns_per(s, iters));
                    g_ns.push(ns_per(g, iters));
                    ratios.push(g.as_secs_f64() / s.as_secs_f64());
                }
                let (lo, hi) = ratios
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
                println!(
                    "{name:<34} {:>9.1} ns {:>9.1} ns {:>7.2}  {lo:.2}–{hi:.2}",
                    median(&mut s_ns),
                    median(&mut g_ns),
                    median(&mut ratios),
                );
                measured += 1;
            }
        }
    }
    assert!(measured > 0, "no case matches SLUICE_PAIRED_ONLY={only:?}");
}
