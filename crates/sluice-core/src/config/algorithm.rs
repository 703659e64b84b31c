//! [`Algorithm`]: any one of the five, and what every store asks of it.

use super::{
    Concurrency, FixedWindow, MAX_EXACT_TOKENS, RESERVATION_HORIZON, SlidingLog, SlidingWindow,
    TokenBucket,
};
use crate::time::Nanos;

/// The algorithm of a limit with its parameters.
///
/// ```
/// use sluice_core::{Algorithm, TokenBucket};
/// let a = Algorithm::from(TokenBucket::new(1.0, 5.0).unwrap());
/// assert_eq!(a.capacity(), 5.0);
/// ```
// An explicit tag byte: it is matched on several times a call, and one
// packed into a niche takes more instructions to read.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(u8)]
pub enum Algorithm {
    /// See [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`FixedWindow`].
    FixedWindow(FixedWindow),
    /// See [`SlidingWindow`].
    SlidingWindow(SlidingWindow),
    /// See [`SlidingLog`].
    SlidingLog(SlidingLog),
    /// See [`Concurrency`].
    Concurrency(Concurrency),
}

impl From<TokenBucket> for Algorithm {
    fn from(tb: TokenBucket) -> Self {
        Algorithm::TokenBucket(tb)
    }
}

impl From<FixedWindow> for Algorithm {
    fn from(fw: FixedWindow) -> Self {
        Algorithm::FixedWindow(fw)
    }
}

impl From<SlidingWindow> for Algorithm {
    fn from(sw: SlidingWindow) -> Self {
        Algorithm::SlidingWindow(sw)
    }
}

impl From<SlidingLog> for Algorithm {
    fn from(sl: SlidingLog) -> Self {
        Algorithm::SlidingLog(sl)
    }
}

impl From<Concurrency> for Algorithm {
    fn from(c: Concurrency) -> Self {
        Algorithm::Concurrency(c)
    }
}

impl Algorithm {
    /// The most tokens a key can hold: the bucket's or the window's
    /// capacity, a sliding algorithm's rate, or a concurrency limit's
    /// slots.
    #[inline]
    pub fn capacity(&self) -> f64 {
        match self {
            Algorithm::TokenBucket(tb) => tb.capacity,
            Algorithm::FixedWindow(fw) => fw.capacity,
            Algorithm::SlidingWindow(sw) => sw.rate,
            Algorithm::SlidingLog(sl) => sl.rate,
            Algorithm::Concurrency(c) => c.max,
        }
    }

    /// How far below zero a reservation may go; `None` is unlimited (and,
    /// for the algorithms that take no reservations, irrelevant).
    #[inline]
    pub fn max_reserved(&self) -> Option<f64> {
        match self {
            Algorithm::TokenBucket(tb) => tb.max_reserved,
            Algorithm::FixedWindow(fw) => fw.max_reserved,
            Algorithm::SlidingWindow(_) | Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => {
                None
            }
        }
    }

    /// Whether calls may reserve: false for the sliding algorithms and
    /// concurrency.
    ///
    /// ```
    /// use sluice_core::{Algorithm, Nanos, SlidingLog, TokenBucket};
    /// assert!(Algorithm::from(TokenBucket::new(1.0, 1.0).unwrap()).reserves());
    /// let sl = SlidingLog::per_period(1.0, Nanos(1)).unwrap();
    /// assert!(!Algorithm::from(sl).reserves());
    /// ```
    #[inline]
    pub fn reserves(&self) -> bool {
        self.is_flat()
    }

    /// Whether a key's state is two numbers (a token bucket and a fixed
    /// window): the sliding algorithms and concurrency keep more (see
    /// [`crate::sliding`] and [`crate::concurrency`]).
    #[inline]
    pub(crate) fn is_flat(&self) -> bool {
        matches!(self, Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_))
    }

    /// Whether keys under `self` and under `other` keep states of one kind,
    /// so that a state written under one is read under the other: both two
    /// numbers (a token bucket's are read as a fixed window's), or both
    /// sliding windows, both sliding logs, or both leases.
    ///
    /// ```
    /// use sluice_core::{Algorithm, FixedWindow, Nanos, SlidingLog, TokenBucket};
    /// let tb = Algorithm::from(TokenBucket::new(1.0, 1.0).unwrap());
    /// let fw = Algorithm::from(FixedWindow::new(1.0, Nanos(1_000)).unwrap());
    /// let log = Algorithm::from(SlidingLog::per_period(1.0, Nanos(1_000)).unwrap());
    /// assert!(tb.keeps_states_like(&fw) && !tb.keeps_states_like(&log));
    /// ```
    #[inline]
    pub fn keeps_states_like(&self, other: &Algorithm) -> bool {
        (self.is_flat() && other.is_flat())
            || std::mem::discriminant(self) == std::mem::discriminant(other)
    }

    /// The name a policy file gives the algorithm.
    ///
    /// ```
    /// use sluice_core::{Algorithm, Nanos, SlidingWindow};
    /// let sw = SlidingWindow::per_period(1.0, Nanos(1)).unwrap();
    /// assert_eq!(Algorithm::from(sw).name(), "sliding_window");
    /// ```
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket(_) => "token_bucket",
            Algorithm::FixedWindow(_) => "fixed_window",
            Algorithm::SlidingWindow(_) => "sliding_window",
            Algorithm::SlidingLog(_) => "sliding_log",
            Algorithm::Concurrency(_) => "concurrency",
        }
    }

    /// The period of a windowed algorithm, `None` for a token bucket and
    /// for concurrency, which counts calls in flight, not over a window.
    ///
    /// ```
    /// use sluice_core::{Algorithm, Nanos, SlidingLog, TokenBucket};
    /// let sl = SlidingLog::per_period(1.0, Nanos(5)).unwrap();
    /// assert_eq!(Algorithm::from(sl).window(), Some(Nanos(5)));
    /// assert_eq!(Algorithm::from(TokenBucket::new(1.0, 1.0).unwrap()).window(), None);
    /// ```
    #[inline]
    pub fn window(&self) -> Option<Nanos> {
        match self {
            Algorithm::TokenBucket(_) | Algorithm::Concurrency(_) => None,
            Algorithm::FixedWindow(fw) => Some(fw.period),
            Algorithm::SlidingWindow(sw) => Some(sw.period),
            Algorithm::SlidingLog(sl) => Some(sl.period),
        }
    }

    /// The window a limit's quota is stated over, in seconds: the `w` of
    /// the RateLimit-Policy header. A token bucket's is the time it takes to
    /// refill from empty; a window's, its period (a calendar window's, the
    /// nominal length of its unit). Concurrency counts calls in flight over
    /// no window: 0.
    ///
    /// ```
    /// use sluice_core::{Algorithm, FixedWindow, Nanos, TokenBucket};
    /// let tb = Algorithm::from(TokenBucket::new(10.0, 50.0).unwrap());
    /// assert_eq!(tb.quota_window(), 5.0);
    /// let fw = Algorithm::from(FixedWindow::new(100.0, Nanos::from_secs_f64(60.0).unwrap()).unwrap());
    /// assert_eq!(fw.quota_window(), 60.0);
    /// ```
    pub fn quota_window(&self) -> f64 {
        match self {
            // `rate` is per second.
            Algorithm::TokenBucket(tb) => tb.capacity() / tb.rate(),
            windowed => windowed.window().map_or(0.0, Nanos::as_secs_f64),
        }
    }

    /// The fixed window of the same rate, period and start: how the
    /// two-number functions of [`crate::algorithm`] read a sliding
    /// algorithm, whose state they cannot hold.
    #[inline(always)]
    pub(crate) fn as_fixed(&self) -> FixedWindow {
        let (rate, period, start) = match self {
            Algorithm::TokenBucket(tb) => (tb.tokens, tb.period, None),
            Algorithm::FixedWindow(fw) => return *fw,
            Algorithm::SlidingWindow(sw) => (sw.rate, sw.period, sw.start),
            Algorithm::SlidingLog(sl) => (sl.rate, sl.period, None),
            Algorithm::Concurrency(c) => (c.max, c.lease, None),
        };
        FixedWindow {
            rate,
            period,
            capacity: rate,
            start,
            max_reserved: Some(0.0),
            calendar: None,
        }
    }

    /// How far below zero a reservation may take a key: `max_reserved`,
    /// but never more than the tokens refilled in [`RESERVATION_HORIZON`]
    /// (a fixed window: its rate times the whole windows in it), nor more
    /// than [`MAX_EXACT_TOKENS`]. Nothing for the sliding algorithms.
    ///
    /// ```
    /// use sluice_core::{Algorithm, Nanos, TokenBucket};
    /// let hourly = TokenBucket::per_period(1.0, Nanos(3600 * Nanos::PER_SEC)).unwrap();
    /// assert_eq!(Algorithm::from(hourly).reservable(), 8760.0);
    /// let bounded = hourly.with_max_reserved(100.0).unwrap();
    /// assert_eq!(Algorithm::from(bounded).reservable(), 100.0);
    /// ```
    pub fn reservable(&self) -> f64 {
        self.max_reserved()
            .unwrap_or(f64::INFINITY)
            .min(self.deepest_debt())
    }

    /// The deepest a key may go below zero, whatever takes it there: the
    /// tokens refilled in [`RESERVATION_HORIZON`] (a fixed window: its rate
    /// times the whole windows in it), at most [`MAX_EXACT_TOKENS`], so
    /// that no caller can hold a key back for longer than a year (a
    /// calendar window: at most [`CALENDAR_WINDOWS`] of its windows). Nothing
    /// for the sliding algorithms and concurrency, which never go below
    /// zero.
    ///
    /// ```
    /// use sluice_core::{Algorithm, Nanos, TokenBucket};
    /// let hourly = TokenBucket::per_period(1.0, Nanos(3600 * Nanos::PER_SEC)).unwrap();
    /// assert_eq!(Algorithm::from(hourly.with_max_reserved(5.0).unwrap()).deepest_debt(), 8760.0);
    /// ```
    pub fn deepest_debt(&self) -> f64 {
        let horizon = match self {
            Algorithm::TokenBucket(tb) => tb.refill(RESERVATION_HORIZON.0),
            Algorithm::FixedWindow(fw) => fw.rate * fw.debt_windows() as f64,
            Algorithm::SlidingWindow(_) | Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => {
                0.0
            }
        };
        horizon.min(MAX_EXACT_TOKENS)
    }

    /// The largest cost a call may ask for; above it the cost is an error
    /// rather than a denial. `docs/semantics.md` sets it at the capacity plus
    /// `max_reserved`, for a call that reserves or not: below it, a call
    /// that does not reserve is decided by the formula (denied, with the
    /// `retry_after` the formula gives). Without `max_reserved`, a
    /// reservation may wait up to [`RESERVATION_HORIZON`] (see
    /// [`Algorithm::reservable`]), and a call that does not reserve can
    /// never take more than the capacity. Nothing above
    /// [`MAX_EXACT_TOKENS`] is ever counted. A sliding algorithm's is its
    /// rate (and a call that reserves is refused by
    /// [`Op::validate`](crate::Op::validate)).
    ///
    /// ```
    /// use sluice_core::{Algorithm, TokenBucket};
    /// let tb = TokenBucket::new(1.0, 5.0).unwrap();
    /// let a = Algorithm::from(tb.with_max_reserved(2.0).unwrap());
    /// assert_eq!(a.max_cost(false), 7.0);
    /// assert_eq!(a.max_cost(true), 7.0);
    /// let unbounded = Algorithm::from(tb);
    /// assert_eq!(unbounded.max_cost(false), 5.0);
    /// // A year of refill at one token a second, on top of the burst.
    /// assert_eq!(unbounded.max_cost(true), 5.0 + 31_536_000.0);
    /// ```
    #[inline]
    pub fn max_cost(&self, reserve: bool) -> f64 {
        // One match for what every call needs; `reservable` only for the
        // calls that may reserve.
        let (capacity, max_reserved) = match self {
            Algorithm::TokenBucket(tb) => (tb.capacity, tb.max_reserved),
            Algorithm::FixedWindow(fw) => (fw.capacity, fw.max_reserved),
            Algorithm::SlidingWindow(sw) => (sw.rate, None),
            Algorithm::SlidingLog(sl) => (sl.rate, None),
            Algorithm::Concurrency(c) => (c.max, None),
        };
        let reserved = if reserve || max_reserved.is_some() {
            self.reservable()
        } else {
            0.0
        };
        (capacity + reserved).min(MAX_EXACT_TOKENS)
    }

    /// The same algorithm with rate, capacity and `max_reserved` divided by `n`.
    pub(super) fn split(self, n: u32) -> Algorithm {
        let n = f64::from(n);
        match self {
            Algorithm::TokenBucket(tb) => Algorithm::TokenBucket(TokenBucket {
                tokens: tb.tokens / n,
                secs_per_token: tb.secs_per_token * n,
                capacity: tb.capacity / n,
                max_reserved: tb.max_reserved.map(|m| m / n),
                ..tb
            }),
            Algorithm::FixedWindow(fw) => Algorithm::FixedWindow(FixedWindow {
                rate: fw.rate / n,
                capacity: fw.capacity / n,
                max_reserved: fw.max_reserved.map(|m| m / n),
                ..fw
            }),
            Algorithm::SlidingWindow(sw) => Algorithm::SlidingWindow(SlidingWindow {
                rate: sw.rate / n,
                ..sw
            }),
            Algorithm::SlidingLog(sl) => Algorithm::SlidingLog(SlidingLog {
                rate: sl.rate / n,
                ..sl
            }),
            Algorithm::Concurrency(c) => Algorithm::Concurrency(Concurrency {
                max: c.max / n,
                ..c
            }),
        }
    }
}
