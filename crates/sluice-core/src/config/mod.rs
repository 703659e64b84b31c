//! Limit configurations: validated token-bucket, fixed-window, sliding-window
//! and sliding-log parameters, and [`Limit`], a named, cheaply clonable handle
//! that stores and callers share.
//!
//! A file an algorithm's parameters (`token_bucket`, `fixed_window`,
//! `sliding`, `concurrency`), [`Algorithm`] (any one of them, and what a
//! store asks of it) and [`Limit`]; here, why a configuration is refused
//! and the bounds every one of them keeps.

use crate::time::Nanos;

/// Why a limit configuration was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// The refill rate must be a positive finite number.
    #[error("rate must be a positive finite number, got {0}")]
    Rate(f64),
    /// The capacity (a token bucket's `burst`) must be a finite number ≥ 0.
    #[error("burst/capacity must be a finite number >= 0, got {0}")]
    Capacity(f64),
    /// `max_reserved` must be a finite number ≥ 0.
    #[error("max_reserved must be a finite number >= 0, got {0}")]
    MaxReserved(f64),
    /// The period must be at least one nanosecond.
    #[error("period must be positive, got {0} s")]
    Period(f64),
    /// Nothing could ever be admitted: the capacity is zero and no
    /// reservations are allowed.
    #[error("a limit with zero capacity and max_reserved 0 can never admit anything")]
    NeverAdmits,
    /// A limit needs at least one shard.
    #[error("shards must be at least 1")]
    Shards,
    /// The rate is more tokens than can be counted exactly.
    #[error("rate must be at most {MAX_EXACT_TOKENS}, got {0}")]
    TooManyTokens(f64),
    /// A concurrency limit's slots are whole, and bounded.
    #[error(
        "max must be a whole number from 1 to {MAX_SLOTS} (the most leases one key holds, \
         which bounds what a call on it costs), got {0}"
    )]
    Slots(f64),
    /// A calendar window rolls unused tokens over for at most
    /// [`CALENDAR_WINDOWS`] windows.
    #[error(
        "a calendar window's capacity must be at most {CALENDAR_WINDOWS} times its rate, got {0}"
    )]
    CalendarCapacity(f64),
}

/// How long a reservation may make its caller wait: one year. A reservation
/// whose wait would be longer is refused, with or without `max_reserved`,
/// so that no single call can freeze a shared key for longer than that.
pub const RESERVATION_HORIZON: Nanos = Nanos(365 * 24 * 3600 * Nanos::PER_SEC);

/// How many windows of its rate a calendar window may hold: its capacity
/// is at most this many times its rate, and a key goes at most this many
/// windows' rate below zero (and never further than a year's windows).
/// With both, a key is full again at most twice this many boundaries after
/// its last write, however long its windows, which is what lets the Redis
/// script be handed every boundary that can matter to a call.
pub const CALENDAR_WINDOWS: i64 = 32;

/// The largest number of tokens a call or a reservation may count: 2⁵³,
/// above which a double no longer holds every whole number, so that
/// `tokens - cost` would not be exact.
pub const MAX_EXACT_TOKENS: f64 = 9_007_199_254_740_992.0;

pub(super) fn finite_nonneg(x: f64, err: fn(f64) -> LimitError) -> Result<f64, LimitError> {
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(err(x))
    }
}

pub(super) fn check_admits(capacity: f64, max_reserved: Option<f64>) -> Result<(), LimitError> {
    if capacity == 0.0 && max_reserved == Some(0.0) {
        Err(LimitError::NeverAdmits)
    } else {
        Ok(())
    }
}

mod algorithm;
mod concurrency;
mod fixed_window;
mod limit;
mod sliding;
mod token_bucket;

pub use algorithm::Algorithm;
pub use concurrency::{Concurrency, MAX_SLOTS};
pub use fixed_window::FixedWindow;
pub use limit::Limit;
pub use sliding::{SlidingLog, SlidingWindow};
pub use token_bucket::TokenBucket;
