//! The sliding window's and the sliding log's configurations.

use super::{LimitError, MAX_EXACT_TOKENS};
use crate::time::Nanos;

/// Checks a sliding algorithm's `rate` per `period`.
fn sliding_params(rate: f64, period: Nanos) -> Result<(), LimitError> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err(LimitError::Rate(rate));
    }
    if rate > MAX_EXACT_TOKENS {
        return Err(LimitError::TooManyTokens(rate));
    }
    if period.0 <= 0 {
        return Err(LimitError::Period(period.as_secs_f64()));
    }
    Ok(())
}

/// A sliding window (weighted counter): at most `rate` tokens per `period`,
/// estimated from the count of the current fixed window and the previous
/// window's count weighted by how much of it still overlaps the last
/// `period`. No reservations.
///
/// ```
/// use sluice_core::{Nanos, SlidingWindow};
/// let sw = SlidingWindow::per_period(100.0, Nanos(60 * Nanos::PER_SEC)).unwrap()
///     .with_start(Nanos(0));
/// assert_eq!((sw.rate(), sw.start()), (100.0, Some(Nanos(0))));
/// assert!(SlidingWindow::per_period(0.0, Nanos(1)).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    pub(super) rate: f64,
    pub(super) period: Nanos,
    pub(super) start: Option<Nanos>,
}

impl SlidingWindow {
    /// `rate` tokens per `period`, windows aligned per key (see
    /// [`SlidingWindow::with_start`]).
    pub fn per_period(rate: f64, period: Nanos) -> Result<Self, LimitError> {
        sliding_params(rate, period)?;
        Ok(SlidingWindow {
            rate,
            period,
            start: None,
        })
    }

    /// Aligns every key's windows to `start + k·period`. Without it each key
    /// gets its own offset, derived from a hash of the key, as for a
    /// [`FixedWindow`].
    pub fn with_start(self, start: Nanos) -> Self {
        SlidingWindow {
            start: Some(start),
            ..self
        }
    }

    /// The most tokens admitted over any `period`, as estimated.
    #[inline]
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The window length.
    #[inline]
    pub fn period(&self) -> Nanos {
        self.period
    }

    /// The configured window alignment, if any.
    #[inline]
    pub fn start(&self) -> Option<Nanos> {
        self.start
    }
}

/// A sliding log (exact): every admitted call is logged with its time and
/// cost, and a call is admitted only if the costs logged over the last
/// `period`, its own included, come to at most `rate`. No reservations.
///
/// ```
/// use sluice_core::{Nanos, SlidingLog};
/// let sl = SlidingLog::per_period(10.0, Nanos(Nanos::PER_SEC)).unwrap();
/// assert_eq!((sl.rate(), sl.period()), (10.0, Nanos(Nanos::PER_SEC)));
/// assert!(SlidingLog::per_period(10.0, Nanos(0)).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingLog {
    pub(super) rate: f64,
    pub(super) period: Nanos,
}

impl SlidingLog {
    /// `rate` tokens per `period`.
    pub fn per_period(rate: f64, period: Nanos) -> Result<Self, LimitError> {
        sliding_params(rate, period)?;
        Ok(SlidingLog { rate, period })
    }

    /// The most tokens admitted over any `period`.
    #[inline]
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The length of the log's window.
    #[inline]
    pub fn period(&self) -> Nanos {
        self.period
    }
}
