//! Limit configurations: validated token-bucket, fixed-window, sliding-window
//! and sliding-log parameters, and [`Limit`], a named, cheaply clonable handle
//! that stores and callers share.

use std::fmt;
use std::sync::Arc;

use crate::calendar::Calendar;
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

fn finite_nonneg(x: f64, err: fn(f64) -> LimitError) -> Result<f64, LimitError> {
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(err(x))
    }
}

fn check_admits(capacity: f64, max_reserved: Option<f64>) -> Result<(), LimitError> {
    if capacity == 0.0 && max_reserved == Some(0.0) {
        Err(LimitError::NeverAdmits)
    } else {
        Ok(())
    }
}

/// A continuous token bucket: `rate` tokens per second up to its capacity
/// (a policy file's `burst`).
///
/// ```
/// use sluice_core::TokenBucket;
/// let tb = TokenBucket::new(10.0, 20.0).unwrap().with_max_reserved(5.0).unwrap();
/// assert_eq!((tb.rate(), tb.capacity(), tb.max_reserved()), (10.0, 20.0, Some(5.0)));
/// assert!(TokenBucket::new(-1.0, 20.0).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    // The rate is kept as the exact pair the user gave (tokens per period)
    // so that "10 per 60 s" refills 1 token in exactly 6 s, not 6.000000000000001.
    tokens: f64,
    period: Nanos,
    // Seconds per token, computed once as period / tokens so that "10 per
    // 60 s" waits exactly 6 s per token, and the hot path multiplies.
    secs_per_token: f64,
    capacity: f64,
    max_reserved: Option<f64>,
}

impl TokenBucket {
    /// A bucket refilling at `rate` tokens per second, holding at most
    /// `capacity` (a policy file's `burst`).
    pub fn new(rate: f64, capacity: f64) -> Result<Self, LimitError> {
        Self::per_period(rate, Nanos(Nanos::PER_SEC))?.with_capacity(capacity)
    }

    /// `tokens` per `period`, with the capacity defaulting to `tokens`.
    ///
    /// ```
    /// use sluice_core::{Nanos, TokenBucket};
    /// let tb = TokenBucket::per_period(10.0, Nanos(60 * Nanos::PER_SEC)).unwrap();
    /// assert_eq!(tb.capacity(), 10.0);
    /// assert!((tb.rate() - 10.0 / 60.0).abs() < 1e-15);
    /// ```
    pub fn per_period(tokens: f64, period: Nanos) -> Result<Self, LimitError> {
        if period.0 <= 0 {
            return Err(LimitError::Period(period.as_secs_f64()));
        }
        if !(tokens.is_finite() && tokens > 0.0) {
            return Err(LimitError::Rate(tokens));
        }
        Ok(TokenBucket {
            tokens,
            period,
            secs_per_token: period.as_secs_f64() / tokens,
            capacity: tokens,
            max_reserved: None,
        })
    }

    /// Replaces the capacity.
    pub fn with_capacity(self, capacity: f64) -> Result<Self, LimitError> {
        let capacity = finite_nonneg(capacity, LimitError::Capacity)?;
        check_admits(capacity, self.max_reserved)?;
        Ok(TokenBucket { capacity, ..self })
    }

    /// Allows reservations to take the bucket down to `-max_reserved`.
    pub fn with_max_reserved(self, max_reserved: f64) -> Result<Self, LimitError> {
        let m = finite_nonneg(max_reserved, LimitError::MaxReserved)?;
        check_admits(self.capacity, Some(m))?;
        Ok(TokenBucket {
            max_reserved: Some(m),
            ..self
        })
    }

    /// Tokens added per second.
    #[inline]
    pub fn rate(&self) -> f64 {
        self.tokens / self.period.as_secs_f64()
    }

    /// Tokens added per [`TokenBucket::period`]: the rate as configured.
    #[inline]
    pub fn tokens_per_period(&self) -> f64 {
        self.tokens
    }

    /// The period the rate is expressed over (one second unless given).
    #[inline]
    pub fn period(&self) -> Nanos {
        self.period
    }

    /// Tokens added over `ns` nanoseconds.
    #[inline]
    pub(crate) fn refill(&self, ns: i64) -> f64 {
        // One multiplication and one division keep whole results exact.
        ns as f64 * self.tokens / self.period.0 as f64
    }

    /// Seconds needed to add `tokens` tokens.
    #[inline]
    pub(crate) fn secs_for(&self, tokens: f64) -> f64 {
        tokens * self.secs_per_token
    }

    /// The most tokens the bucket holds (a policy file's `burst`).
    #[inline]
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// How far below zero a reservation may take the bucket; `None` is unlimited.
    #[inline]
    pub fn max_reserved(&self) -> Option<f64> {
        self.max_reserved
    }
}

/// Fixed windows: `rate` tokens every `period`, rolling over up to `capacity`.
///
/// ```
/// use sluice_core::{FixedWindow, Nanos};
/// let fw = FixedWindow::new(100.0, Nanos(60 * Nanos::PER_SEC)).unwrap()
///     .with_capacity(150.0).unwrap()
///     .with_start(Nanos(0));
/// assert_eq!(fw.capacity(), 150.0);
/// assert_eq!(fw.start(), Some(Nanos(0)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FixedWindow {
    rate: f64,
    /// The window length, or a calendar unit's nominal length.
    period: Nanos,
    capacity: f64,
    start: Option<Nanos>,
    max_reserved: Option<f64>,
    /// Windows that open on the calendar instead of every `period`.
    calendar: Option<Calendar>,
}

impl FixedWindow {
    /// `rate` tokens per `period`; the capacity defaults to `rate`.
    pub fn new(rate: f64, period: Nanos) -> Result<Self, LimitError> {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(LimitError::Rate(rate));
        }
        if period.0 <= 0 {
            return Err(LimitError::Period(period.as_secs_f64()));
        }
        Ok(FixedWindow {
            rate,
            period,
            capacity: rate,
            start: None,
            max_reserved: None,
            calendar: None,
        })
    }

    /// `rate` tokens in each window of `calendar`, which opens at local
    /// midnight of the unit's first day in the calendar's zone (see
    /// [`Calendar`]); the capacity defaults to `rate`. Every key shares
    /// the calendar's windows.
    ///
    /// ```
    /// use sluice_core::{Calendar, CalendarUnit, FixedWindow};
    /// let month = Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap();
    /// let quota = FixedWindow::on_calendar(100_000.0, month).unwrap();
    /// assert_eq!(quota.calendar(), Some(month));
    /// assert_eq!(quota.period(), CalendarUnit::Month.nominal());
    /// ```
    pub fn on_calendar(rate: f64, calendar: Calendar) -> Result<Self, LimitError> {
        Ok(FixedWindow {
            calendar: Some(calendar),
            ..FixedWindow::new(rate, calendar.unit().nominal())?
        })
    }

    /// Lets unused tokens roll over up to `capacity`.
    pub fn with_capacity(self, capacity: f64) -> Result<Self, LimitError> {
        let capacity = finite_nonneg(capacity, LimitError::Capacity)?;
        check_admits(capacity, self.max_reserved)?;
        if self.calendar.is_some() && capacity > self.rate * CALENDAR_WINDOWS as f64 {
            return Err(LimitError::CalendarCapacity(capacity));
        }
        Ok(FixedWindow { capacity, ..self })
    }

    /// Aligns every key's windows to `start + k·period`. Without it each key
    /// gets its own offset, derived from a hash of the key. A calendar
    /// window keeps its calendar's alignment.
    pub fn with_start(self, start: Nanos) -> Self {
        FixedWindow {
            start: Some(start),
            ..self
        }
    }

    /// Allows reservations to take the window down to `-max_reserved`.
    pub fn with_max_reserved(self, max_reserved: f64) -> Result<Self, LimitError> {
        let m = finite_nonneg(max_reserved, LimitError::MaxReserved)?;
        check_admits(self.capacity, Some(m))?;
        Ok(FixedWindow {
            max_reserved: Some(m),
            ..self
        })
    }

    /// Tokens added at the start of each window.
    #[inline]
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The window length; for a calendar window, its unit's nominal length
    /// (see [`CalendarUnit::nominal`](crate::CalendarUnit::nominal)), which no window is measured by.
    #[inline]
    pub fn period(&self) -> Nanos {
        self.period
    }

    /// The calendar the windows open on, if they do.
    #[inline]
    pub fn calendar(&self) -> Option<Calendar> {
        self.calendar
    }

    /// The most tokens a key can hold.
    #[inline]
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The configured window alignment, if any (never for a calendar
    /// window).
    pub fn start(&self) -> Option<Nanos> {
        if self.calendar.is_some() {
            return None;
        }
        self.start
    }

    /// How far below zero a reservation may go; `None` is unlimited.
    #[inline]
    pub fn max_reserved(&self) -> Option<f64> {
        self.max_reserved
    }

    /// How many windows' rate a key may owe at most (see
    /// [`Algorithm::deepest_debt`]): the windows in a year, and for a
    /// calendar window at most [`CALENDAR_WINDOWS`].
    ///
    /// ```
    /// use sluice_core::{Calendar, CalendarUnit, FixedWindow, Nanos};
    /// let hourly = FixedWindow::new(1.0, Nanos(3600 * Nanos::PER_SEC)).unwrap();
    /// assert_eq!(hourly.debt_windows(), 8760);
    /// let daily = FixedWindow::on_calendar(1.0, Calendar::utc(CalendarUnit::Day)).unwrap();
    /// assert_eq!(daily.debt_windows(), 32);
    /// ```
    pub fn debt_windows(&self) -> i64 {
        let windows = RESERVATION_HORIZON.0 / self.period.0.max(1);
        match self.calendar {
            Some(_) => windows.min(CALENDAR_WINDOWS),
            None => windows,
        }
    }
}

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
    rate: f64,
    period: Nanos,
    start: Option<Nanos>,
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
    rate: f64,
    period: Nanos,
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
    max: f64,
    lease: Nanos,
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
    fn split(self, n: u32) -> Algorithm {
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

struct LimitInner {
    name: Arc<str>,
    /// A hash of `name`, so a store can tell limits apart without comparing strings.
    name_tag: u64,
    algorithm: Algorithm,
    shards: u32,
    shard_algorithm: Algorithm,
    facts: Facts,
}

/// What every call asks of a limit's shard algorithm, worked out once: each
/// would otherwise be a match on the algorithm, on the hot path.
#[derive(Clone, Copy)]
struct Facts {
    capacity: f64,
    /// [`Algorithm::max_cost`] without and with reserving.
    max_cost: [f64; 2],
    flat: bool,
    /// Whether calls take leases (a concurrency limit).
    leases: bool,
    /// The period of windows aligned per key (no `start`), whose offset is
    /// a hash of the key modulo it.
    own_windows: Option<i64>,
}

impl Facts {
    fn of(alg: &Algorithm) -> Facts {
        let own_windows = match alg {
            Algorithm::FixedWindow(fw) if fw.start().is_none() && fw.calendar.is_none() => {
                Some(fw.period.0)
            }
            Algorithm::SlidingWindow(sw) if sw.start.is_none() => Some(sw.period.0),
            _ => None,
        };
        Facts {
            capacity: alg.capacity(),
            max_cost: [alg.max_cost(false), alg.max_cost(true)],
            flat: alg.is_flat(),
            leases: matches!(alg, Algorithm::Concurrency(_)),
            own_windows,
        }
    }
}

/// A named limit. Cloning is cheap; stores keep one state per (limit name, key).
///
/// ```
/// use sluice_core::{Limit, TokenBucket};
/// let limit = Limit::new("sendMessage", TokenBucket::new(10.0 / 60.0, 20.0).unwrap());
/// assert_eq!(limit.name(), "sendMessage");
/// let hot = limit.with_shards(4).unwrap();
/// assert_eq!(hot.shard_algorithm().capacity(), 5.0);
/// ```
#[derive(Clone)]
pub struct Limit {
    inner: Arc<LimitInner>,
}

impl Limit {
    /// Creates a limit with one shard.
    pub fn new(name: impl Into<Arc<str>>, algorithm: impl Into<Algorithm>) -> Limit {
        let algorithm = algorithm.into();
        let name: Arc<str> = name.into();
        Limit {
            inner: Arc::new(LimitInner {
                name_tag: std::hash::BuildHasher::hash_one(
                    &std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default(),
                    &*name,
                ),
                name,
                algorithm,
                shards: 1,
                shard_algorithm: algorithm,
                facts: Facts::of(&algorithm),
            }),
        }
    }

    /// Splits a hot key into `n` shards, each with 1/n of the rate, capacity
    /// and `max_reserved`; each call uses the fuller of two random shards.
    pub fn with_shards(&self, n: u32) -> Result<Limit, LimitError> {
        if n == 0 {
            return Err(LimitError::Shards);
        }
        let shard_algorithm = self.inner.algorithm.split(n);
        Ok(Limit {
            inner: Arc::new(LimitInner {
                name: self.inner.name.clone(),
                name_tag: self.inner.name_tag,
                algorithm: self.inner.algorithm,
                shards: n,
                shard_algorithm,
                facts: Facts::of(&shard_algorithm),
            }),
        })
    }

    /// Whether two handles are clones of one limit (and so configured alike).
    #[inline]
    pub(crate) fn same(&self, other: &Limit) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A hash of the name, equal for every handle of the same name.
    #[inline]
    pub(crate) fn name_tag(&self) -> u64 {
        self.inner.name_tag
    }

    /// The limit's name, which namespaces its keys in a store.
    #[inline]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The configured algorithm, before any sharding.
    #[inline]
    pub fn algorithm(&self) -> &Algorithm {
        &self.inner.algorithm
    }

    /// The number of shards each key is split into.
    #[inline]
    pub fn shards(&self) -> u32 {
        self.inner.shards
    }

    /// The algorithm each shard runs: [`Limit::algorithm`] divided by the
    /// number of shards.
    #[inline]
    pub fn shard_algorithm(&self) -> &Algorithm {
        &self.inner.shard_algorithm
    }

    /// [`Algorithm::capacity`] of the shard algorithm.
    #[inline]
    pub(crate) fn shard_capacity(&self) -> f64 {
        self.inner.facts.capacity
    }

    /// [`Algorithm::max_cost`] of the shard algorithm.
    #[inline]
    pub(crate) fn max_cost(&self, reserve: bool) -> f64 {
        self.inner.facts.max_cost[usize::from(reserve)]
    }

    /// Whether the shard algorithm keeps two numbers a key (see
    /// [`Algorithm::is_flat`]).
    #[inline]
    pub(crate) fn is_flat(&self) -> bool {
        self.inner.facts.flat
    }

    /// Whether calls take leases: a concurrency limit.
    #[inline]
    pub fn takes_leases(&self) -> bool {
        self.inner.facts.leases
    }

    /// The period of the shard algorithm's windows when each key has its
    /// own phase (windows without a `start`).
    #[inline]
    pub(crate) fn own_windows(&self) -> Option<i64> {
        self.inner.facts.own_windows
    }
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.inner.name)
            .field("algorithm", &self.inner.algorithm)
            .field("shards", &self.inner.shards)
            .finish()
    }
}
