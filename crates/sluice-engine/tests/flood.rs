//! A flood of distinct keys, as an attacker who varies the key on every
//! request sends it: what the engine keeps about denied keys for the
//! dashboard must not grow with the number of keys. The heap is measured
//! by an allocator that counts the bytes it hands out and gets back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sluice_core::{MemoryStore, Mode};
use sluice_engine::{Enforcer, TopKeys};
use sluice_policy::Policy;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// The allocator counts every thread's allocations: one measurement at a
/// time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Bytes allocated and not yet freed since `region` began.
fn live(region: &Region<'_, std::alloc::System>) -> isize {
    let c = region.change();
    c.bytes_allocated as isize - c.bytes_deallocated as isize + c.bytes_reallocated
}

/// Calls `each` with a million distinct keys of one length, and returns
/// the live heap after each 100,000, as moved since the first key.
fn flood(mut each: impl FnMut(&str)) -> Vec<isize> {
    let mut key = String::new();
    let mut live_at = Vec::with_capacity(10);
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let region = Region::new(ALLOCATOR);
    for i in 0..1_000_000u32 {
        key.clear();
        key.push_str("attacker-");
        key.push_str(&(1_000_000 + i).to_string());
        each(&key);
        if (i + 1) % 100_000 == 0 {
            live_at.push(live(&region));
        }
    }
    live_at
}

#[test]
fn a_million_distinct_denied_keys_grow_the_heap_by_less_than_a_megabyte_after_the_first_hundred_thousand()
 {
    // Each key is called twice, and its second call is denied; the store
    // keeps at most 10,000 keys, so that what is measured is what the
    // engine keeps.
    let policy = Policy::from_str(
        "limits: {flood: {algorithm: fixed_window, algorithm_config: {rate: 1, period: 3600}}}",
        "p",
    )
    .unwrap();
    let e = Enforcer::new(policy, MemoryStore::new().with_max_keys(10_000));
    let top = e.keep_top_keys();
    let policy = e.policy();
    let named = policy.named_limit("flood").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let live_at = flood(|key| {
        for _ in 0..2 {
            rt.block_on(e.decide_named(named, key, 1.0, Mode::CONSUME))
                .unwrap();
        }
    });
    // A store that is full admits a new key only as its room allows, so
    // more than half are denied.
    let flood = &e.activity().rules[0];
    assert_eq!(flood.allowed + flood.denied, 2_000_000);
    assert!(flood.denied >= 1_000_000);
    assert!(top.len() <= TopKeys::CAPACITY);
    assert_eq!(top.top(20).len(), 20);
    // From 100,000 keys to 1,000,000 the heap grows by less than 1 MiB,
    // the store's bookkeeping included; were a denied key kept for each,
    // it would grow by tens of megabytes.
    let grown = live_at[9] - live_at[0];
    assert!(grown < 1 << 20, "{live_at:?}");
}

#[test]
fn the_summary_of_denied_keys_holds_its_size_through_a_million_distinct_keys() {
    let top = TopKeys::default();
    let live_at = flood(|key| top.record("flood", sluice_policy::Enforcement::Enforce, key));
    // Every key is as long as every other, so a full summary's size is
    // fixed to the byte.
    assert!(live_at.iter().all(|&l| l == live_at[0]), "{live_at:?}");
    assert!(top.len() <= TopKeys::CAPACITY);
}
