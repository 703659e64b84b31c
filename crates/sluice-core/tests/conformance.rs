//! The store conformance suite on the in-memory store. The Redis store runs
//! the same suite (crates/sluice-redis/tests/conformance.rs).

use std::pin::pin;
use std::task::{Context, Poll, Waker};

use sluice_core::{FakeClock, MemoryStore, Nanos, conformance};

#[test]
fn memory_store_conforms() {
    let clock = FakeClock::new(Nanos::ZERO);
    let store = MemoryStore::with_clock(clock.clone());
    // The memory store's futures are always ready: one poll runs it all.
    let mut suite = pin!(conformance::run_all(&store, &clock));
    let poll = suite.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    assert_eq!(poll, Poll::Ready(()));
}
