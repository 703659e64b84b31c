//! A server whose `/metrics` nobody scrapes: every store call and proxied
//! request records a histogram sample, and the recorder holds each one
//! until it is folded into the histogram's buckets. The heap is measured by
//! an allocator that counts the bytes it hands out and gets back.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::{Duration, Instant};

use sluice_server::serve::Metrics;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Bytes allocated and not yet freed since `region` began.
fn live(region: &Region<'_, std::alloc::System>) -> i64 {
    let c = region.change();
    c.bytes_allocated as i64 - c.bytes_deallocated as i64 + c.bytes_reallocated as i64
}

#[test]
fn histogram_samples_do_not_pile_up_when_nobody_scrapes() {
    let _metrics = Metrics::global().expect("the recorder to install");
    let seconds = metrics::histogram!("sluice_store_seconds", "op" => "transact");
    let region = Region::new(ALLOCATOR);
    // About a million samples a second, a busy server's store calls, until
    // the heap holds less than a quarter of what they would take unfolded
    // (eight bytes each), after at least three seconds' worth.
    // Unfolded, ten million samples would hold about 160 MB: the test gives
    // up there, or after 30 s on a slow machine.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut recorded: i64 = 0;
    loop {
        for _ in 0..1_000 {
            seconds.record(0.000_05);
        }
        recorded += 1_000;
        let held = live(&region);
        if recorded >= 3_000_000 && held < recorded * 8 / 4 {
            break;
        }
        assert!(
            Instant::now() < deadline && recorded < 10_000_000,
            "{held} bytes still held after {recorded} samples"
        );
        // Paces the load; the loop itself waits for the fold.
        std::thread::sleep(Duration::from_millis(1));
    }
}
