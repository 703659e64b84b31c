//! Exact rate limiting: token buckets, fixed windows, sliding windows and
//! sliding logs with variable costs, reservations, multi-limit transactions
//! and hot-key shards.
//!
//! The algorithms in [`algorithm`] are pure functions of a state, a
//! configuration and the time. A [`Store`] keeps the states and decides a whole
//! transaction at once; [`MemoryStore`] is the embedded one. A denial is a
//! [`Decision`] value, never an error.
//!
//! An application needs only the names at this crate's root. Four modules
//! are public for the crates that implement a [`Store`] elsewhere and must
//! decide exactly as this one does: [`algorithm`], [`sliding`] and
//! [`concurrency`] (the pure functions and the states they read, which
//! `sluice-redis` decides with from what its script returns, and which its
//! script mirrors) and [`states`] (what `sluice-postgres` decides on the
//! rows it reads). `conformance` holds every store to one
//! standard (feature `conformance`).

pub mod algorithm;
mod bytes;
mod calendar;
pub mod concurrency;
mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
mod decision;
mod memory;
pub mod sliding;
pub mod states;
mod store;
mod time;

pub use calendar::{Calendar, CalendarError, CalendarUnit};
pub use config::{
    Algorithm, CALENDAR_WINDOWS, Concurrency, FixedWindow, Limit, LimitError, MAX_EXACT_TOKENS,
    MAX_SLOTS, RESERVATION_HORIZON, SlidingLog, SlidingWindow, TokenBucket,
};
pub use decision::{Decision, Outcome, Value};
pub use memory::MemoryStore;
pub use store::{CostError, LEASE_IDS, Mode, OnStoreError, Op, Settle, Store, StoreError};
pub use time::{Clock, FakeClock, Nanos, SystemClock};
