//! A concurrency limit's configuration.

use super::{LimitError, SlidingLog};
use crate::time::Nanos;

/// The most slots a concurrency limit may have per key (and so the most
/// leases a key can hold): every lease is kept until it is released or
/// expires.
pub const MAX_SLOTS: f64 = 1_024.0;

/// In-flight calls: at most `max` slots held at once per key. A call
/// takes its slots with a lease, and gives them back when it releases the
/// lease, or when the lease expires, `lease` after it was taken, if it
/// never does (a caller that died). No reservations.
///
/// ```
/// use sluice_core::{Concurrency, Nanos};
/// let c = Concurrency::new(2.0, Nanos(60 * Nanos::PER_SEC)).unwrap();
/// assert_eq!((c.max(), c.lease()), (2.0, Nanos(60 * Nanos::PER_SEC)));
/// assert!(Concurrency::new(1.5, Nanos(1)).is_err());
/// assert!(Concurrency::new(2.0, Nanos(0)).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Concurrency {
    pub(super) max: f64,
    pub(super) lease: Nanos,
}

impl Concurrency {
    /// `max` slots per key (a whole number from 1 to [`MAX_SLOTS`]), each
    /// lease expiring after `lease`.
    pub fn new(max: f64, lease: Nanos) -> Result<Self, LimitError> {
        if lease.0 <= 0 {
            return Err(LimitError::Period(lease.as_secs_f64()));
        }
        if !((1.0..=MAX_SLOTS).contains(&max) && max.fract() == 0.0) {
            return Err(LimitError::Slots(max));
        }
        Ok(Concurrency { max, lease })
    }

    /// The most slots a key may hold at once.
    #[inline]
    pub fn max(&self) -> f64 {
        self.max
    }

    /// How long a lease holds its slots if it is never released.
    #[inline]
    pub fn lease(&self) -> Nanos {
        self.lease
    }

    /// The sliding log that counts the same: every lease an entry taken at
    /// its acquisition and leaving the window when it expires, so that
    /// [`crate::sliding::LogReading`] decides both alike.
    #[inline]
    pub fn as_log(&self) -> SlidingLog {
        SlidingLog {
            rate: self.max,
            period: self.lease,
        }
    }
}
