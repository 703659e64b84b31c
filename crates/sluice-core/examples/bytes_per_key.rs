//! Memory per key at 1M keys: sluice's `MemoryStore` against governor's keyed
//! rate limiter (DashMap store, `String` keys), and the memory store's keys
//! under the sliding window, the sliding log and a concurrency limit.
//!
//! A counting global allocator would need `unsafe`, which the workspace
//! forbids, so this measures the growth of the process's resident set
//! (`VmRSS` in `/proc/self/status`) across inserting 1M distinct keys, each
//! decided once with a burst of 10 and a rate of 1 per hour, so that every key
//! leaves a state behind (sluice does not hold full buckets); the sliding
//! sides admit 10 per hour, so that each key holds a count, or a log of one
//! entry, and each key of the concurrency limit holds one lease of an hour.
//! The key strings are generated before the first reading.
//!
//! ```text
//! cargo run --release -p sluice-core --example bytes_per_key            # all, in child processes
//! cargo run --release -p sluice-core --example bytes_per_key -- sluice  # one, in this process
//! cargo run --release -p sluice-core --example bytes_per_key -- governor
//! cargo run --release -p sluice-core --example bytes_per_key -- sliding_window
//! cargo run --release -p sluice-core --example bytes_per_key -- sliding_log
//! cargo run --release -p sluice-core --example bytes_per_key -- concurrency
//! ```
//!
//! Without an argument it runs each side in its own child process with
//! `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536`: a fixed threshold keeps
//! glibc from raising it as tables are freed while they grow, so every
//! superseded table goes back to the kernel instead of lingering in the heap
//! and inflating the resident set.

// Setup code in a measuring tool: any failure means there is nothing to
// report, and panicking with the message is the right response. Printing the
// result is the point of the program.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::Command;

use governor::{Quota, RateLimiter};
use sluice_core::{
    Concurrency, Limit, MemoryStore, Mode, Nanos, Op, SlidingLog, SlidingWindow, TokenBucket,
};

const KEYS: usize = 1_000_000;

/// The resident set of this process in bytes.
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .expect("VmRSS line")
        .trim()
        .parse()
        .expect("VmRSS value");
    kb * 1024
}

/// The sides, as named on the command line.
const SIDES: [&str; 5] = [
    "sluice",
    "governor",
    "sliding_window",
    "sliding_log",
    "concurrency",
];

/// Inserts the keys into one side and returns (keys held, RSS growth in bytes).
fn measure(side: &str, keys: &[String]) -> (usize, usize) {
    let hour = Nanos(3_600 * Nanos::PER_SEC);
    match side {
        "sluice" => in_memory(
            Limit::new("api", TokenBucket::new(1.0 / 3600.0, 10.0).unwrap()),
            keys,
        ),
        "sliding_window" => in_memory(
            Limit::new("api", SlidingWindow::per_period(10.0, hour).unwrap()),
            keys,
        ),
        "sliding_log" => in_memory(
            Limit::new("api", SlidingLog::per_period(10.0, hour).unwrap()),
            keys,
        ),
        "concurrency" => in_memory(
            Limit::new("api", Concurrency::new(10.0, hour).unwrap()),
            keys,
        ),
        "governor" => {
            let quota = Quota::per_hour(NonZeroU32::new(1).unwrap())
                .allow_burst(NonZeroU32::new(10).unwrap());
            let limiter = RateLimiter::keyed(quota);
            assert!(limiter.check_key(&"warm-up".to_string()).is_ok());
            let before = rss();
            for k in keys {
                assert!(black_box(limiter.check_key(k)).is_ok());
            }
            let after = rss();
            (limiter.len() - 1, after.saturating_sub(before))
        }
        other => panic_usage(other),
    }
}

/// [`measure`] for the memory store under `limit`.
fn in_memory(limit: Limit, keys: &[String]) -> (usize, usize) {
    let store = MemoryStore::new();
    // One key before the baseline, so that one-off setup is not counted.
    let op = |k: &str| store.transact_now(&[Op::new(&limit, k, 1.0)], Mode::CONSUME);
    assert!(op("warm-up").unwrap().allowed);
    let before = rss();
    for k in keys {
        assert!(black_box(op(k)).unwrap().allowed);
    }
    let after = rss();
    (store.len() - 1, after.saturating_sub(before))
}

fn panic_usage(arg: &str) -> ! {
    eprintln!("unknown argument {arg:?}: expected one of {SIDES:?}, or nothing");
    std::process::exit(2)
}

/// Runs one side in a child process and returns its bytes per key.
fn child(side: &str) -> f64 {
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new(exe)
        .arg(side)
        .env("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
        .output()
        .expect("run child");
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    assert!(
        out.status.success(),
        "child {side} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| l.strip_prefix("bytes_per_key="))
        .and_then(|v| v.split_whitespace().next())
        .expect("bytes_per_key line")
        .parse()
        .expect("bytes_per_key value")
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        None => {
            let per_key = SIDES.map(child);
            println!("ratio governor/sluice = {:.2}", per_key[1] / per_key[0]);
        }
        Some(side) if SIDES.contains(&side) => {
            let keys: Vec<String> = (0..KEYS).map(|i| format!("user:{i:08}")).collect();
            let (held, bytes) = measure(side, &keys);
            assert_eq!(held, KEYS, "{side} holds {held} keys, expected {KEYS}");
            #[allow(clippy::cast_precision_loss)] // exact below 2^53
            let per_key = bytes as f64 / KEYS as f64;
            println!(
                "side={side} keys={held} rss_growth={bytes} B ({:.1} MiB)",
                bytes as f64 / (1024.0 * 1024.0)
            );
            println!("bytes_per_key={per_key:.1} side={side}");
        }
        Some(other) => panic_usage(other),
    }
}
