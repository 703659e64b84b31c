//! The store conformance suite: the semantics every [`Store`] must show,
//! checked through the trait alone on a fake clock, so that the in-memory
//! store and the Redis store are held to one standard.
//!
//! Enabled by the `conformance` feature. Each check takes a store reading
//! time from the given [`FakeClock`] and panics on the first divergence.
//!
//! ```
//! use sluice_core::{FakeClock, MemoryStore, Nanos};
//! let clock = FakeClock::new(Nanos::ZERO);
//! let store = MemoryStore::with_clock(clock.clone());
//! // MemoryStore's futures are ready at once, so one poll runs the suite.
//! let mut suite = std::pin::pin!(sluice_core::conformance::run_all(&store, &clock));
//! let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
//! assert!(suite.as_mut().poll(&mut cx).is_ready());
//! ```

// A conformance suite reports a divergence by panicking, like a test.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use crate::algorithm::{State, evaluate, key_offset};
use crate::sliding::{Log, MAX_LOG_ENTRIES, WindowState, window_evaluate};
use crate::{
    Algorithm, Calendar, CalendarUnit, Clock, Concurrency, CostError, Decision, FakeClock,
    FixedWindow, Limit, MAX_SLOTS, MemoryStore, Mode, Nanos, Op, Settle, SlidingLog, SlidingWindow,
    Store, StoreError, TokenBucket,
};

mod agreement;
mod buckets;
mod calendar;
mod concurrency;
mod settle;
mod sliding;

pub use agreement::*;
pub use buckets::*;
pub use calendar::*;
pub use concurrency::*;
pub use settle::*;
pub use sliding::*;

const S: i64 = Nanos::PER_SEC;

/// Runs every check in turn. Each uses its own limit names, so one store
/// (and one Redis) serves them all.
pub async fn run_all<St: Store>(store: &St, clock: &FakeClock) {
    run_token_bucket_and_fixed_window(store, clock).await;
    run_sliding(store, clock).await;
    run_calendar(store, clock).await;
}

/// The checks of the token bucket and the fixed window, and of what every
/// store does whatever the algorithm (transactions, resets, shards).
pub async fn run_token_bucket_and_fixed_window<St: Store>(store: &St, clock: &FakeClock) {
    burst_then_exact_retry(store, clock).await;
    fractional_costs_and_partial_refill(store, clock).await;
    idle_gap_refills_to_full_only(store, clock).await;
    checks_never_consume(store, clock).await;
    reservations_up_to_max_reserved(store, clock).await;
    fixed_window_boundaries(store, clock).await;
    transactions_are_all_or_nothing(store, clock).await;
    same_key_twice_pays_twice(store, clock).await;
    reset_and_value(store, clock).await;
    impossible_and_invalid_costs(store, clock).await;
    backward_clock_credits_nothing(store, clock).await;
    shards_admit_the_whole_burst(store, clock).await;
    agrees_with_the_pure_algorithm(store, clock).await;
    settling_refunds_up_to_capacity_and_charges_below_zero(store, clock).await;
    a_penalty_gate_shuts_for_exactly_its_penalty(store, clock).await;
}

/// The checks of the sliding window and the sliding log.
pub async fn run_sliding<St: Store>(store: &St, clock: &FakeClock) {
    sliding_window_weighs_the_previous_window(store, clock).await;
    sliding_log_waits_for_entries_to_leave(store, clock).await;
    sliding_log_and_token_bucket_in_one_transaction(store, clock).await;
    sliding_refuses_reservations_and_impossible_costs(store, clock).await;
    sliding_reset_and_value(store, clock).await;
    sliding_log_sums_what_is_left_afresh(store, clock).await;
    sliding_same_key_twice_pays_twice(store, clock).await;
    a_change_of_kind_never_grants_a_burst(store, clock).await;
    a_change_of_kind_and_back_never_grants_a_burst(store, clock).await;
    sliding_settles_like_the_others(store, clock).await;
    concurrency_holds_at_most_max_in_flight(store, clock).await;
    concurrency_refuses_what_it_cannot_hold(store, clock).await;
    a_lease_joins_a_transaction(store, clock).await;
    sliding_agrees_with_the_pure_algorithm(store, clock).await;
    transactions_agree_with_the_memory_store(store, clock).await;
    keys_as_fat_as_allowed_agree_with_the_memory_store(store, clock).await;
}

fn tb(rate: f64, burst: f64) -> TokenBucket {
    TokenBucket::new(rate, burst).unwrap()
}

fn step(clock: &FakeClock, ns: i64) {
    clock.advance(Duration::from_nanos(ns.unsigned_abs()));
}

async fn one<St: Store>(store: &St, limit: &Limit, key: &str, cost: f64, mode: Mode) -> Decision {
    store
        .decide(Op::new(limit, key, cost), mode)
        .await
        .unwrap_or_else(|e| panic!("{}: unexpected error {e}", limit.name()))
}

/// The start of the current `period`-long window on the clock's own
/// alignment, so that the checks below do not depend on where it starts.
fn aligned(clock: &FakeClock, period: i64) -> Nanos {
    let now = clock.now().0;
    Nanos(now - now.rem_euclid(period))
}

async fn settle<St: Store>(store: &St, limit: &Limit, key: &str, change: Settle) -> Decision {
    store
        .settle(limit, key, change)
        .await
        .unwrap_or_else(|e| panic!("{}: settling {change:?}: {e}", limit.name()))
}
