//! Time as the algorithms see it: integer nanoseconds on a [`Clock`].
//!
//! Integer nanoseconds keep window arithmetic exact (a period of 0.1 s is
//! exactly 100,000,000 ns), while token counts stay `f64` so that costs may be
//! fractional. The core never reads the system clock itself: stores own a
//! clock, and tests use [`FakeClock`].

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time, or a span, in nanoseconds.
///
/// Points are measured from the Unix epoch by [`SystemClock`], and from
/// whatever origin a [`FakeClock`] or a replay chooses.
///
/// ```
/// use sluice_core::Nanos;
/// let t = Nanos::from_secs_f64(0.25).unwrap();
/// assert_eq!(t, Nanos(250_000_000));
/// assert_eq!(t.as_secs_f64(), 0.25);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Nanos(pub i64);

impl Nanos {
    /// Time zero of the clock.
    pub const ZERO: Nanos = Nanos(0);

    /// Nanoseconds per second.
    pub const PER_SEC: i64 = 1_000_000_000;

    /// Converts seconds to the nearest nanosecond of what the double
    /// holds. The whole seconds and the fraction are converted apart: their
    /// product with 10⁹ in one double would round, at today's epoch by up
    /// to 128 ns (1795820513.25 s came out 1795820513.250000128).
    ///
    /// Returns `None` for NaN, infinities and values beyond about ±292 years.
    ///
    /// ```
    /// use sluice_core::Nanos;
    /// assert_eq!(Nanos::from_secs_f64(1.5), Some(Nanos(1_500_000_000)));
    /// assert_eq!(Nanos::from_secs_f64(1795820513.25), Some(Nanos(1_795_820_513_250_000_000)));
    /// assert_eq!(Nanos::from_secs_f64(-2.5), Some(Nanos(-2_500_000_000)));
    /// assert_eq!(Nanos::from_secs_f64(f64::NAN), None);
    /// assert_eq!(Nanos::from_secs_f64(1e10), None);
    /// ```
    pub fn from_secs_f64(secs: f64) -> Option<Nanos> {
        const NS: f64 = Nanos::PER_SEC as f64;
        let whole = secs.trunc();
        // Beyond ±9.2e9 s the nanoseconds do not fit an i64.
        if !whole.is_finite() || whole.abs() >= i64::MAX as f64 / NS {
            return None;
        }
        let fraction = ((secs - whole) * NS).round() as i64;
        (whole as i64)
            .checked_mul(Self::PER_SEC)?
            .checked_add(fraction)
            .map(Nanos)
    }

    /// This time in seconds.
    ///
    /// ```
    /// use sluice_core::Nanos;
    /// assert_eq!(Nanos(1_500_000_000).as_secs_f64(), 1.5);
    /// ```
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / Self::PER_SEC as f64
    }

    /// Converts a [`Duration`], saturating at `i64::MAX` nanoseconds.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_core::Nanos;
    /// assert_eq!(Nanos::from_duration(Duration::from_millis(3)), Nanos(3_000_000));
    /// ```
    pub fn from_duration(d: Duration) -> Nanos {
        Nanos(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
}

/// A source of the current time.
///
/// ```
/// use sluice_core::{Clock, FakeClock, Nanos};
/// let clock = FakeClock::new(Nanos(5));
/// assert_eq!(clock.now(), Nanos(5));
/// ```
pub trait Clock: Send + Sync {
    /// The current time. Successive calls should not go backwards, but the
    /// algorithms tolerate it when they do.
    fn now(&self) -> Nanos;
}

/// A monotonic clock anchored to the Unix epoch when it is created.
///
/// Fixed windows with a `start` offset are aligned to UTC, so the clock must
/// read wall time; it advances with the CPU's invariant time-stamp counter
/// (through `quanta`, which falls back to the OS monotonic clock where there
/// is none), so a wall-clock step never moves it backwards and a reading
/// costs a few nanoseconds instead of a `clock_gettime`.
///
/// ```
/// use sluice_core::{Clock, SystemClock};
/// let clock = SystemClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug, Clone)]
pub struct SystemClock {
    counter: quanta::Clock,
    origin_raw: u64,
    origin_unix: i64,
}

impl SystemClock {
    /// Creates a clock reading the current wall time.
    pub fn new() -> Self {
        let counter = quanta::Clock::new();
        let origin_raw = counter.raw();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(Nanos::from_duration)
            .unwrap_or(Nanos::ZERO);
        SystemClock {
            counter,
            origin_raw,
            origin_unix: unix.0,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Nanos {
        let elapsed = self
            .counter
            .delta_as_nanos(self.origin_raw, self.counter.raw());
        Nanos(
            self.origin_unix
                .saturating_add(i64::try_from(elapsed).unwrap_or(i64::MAX)),
        )
    }
}

/// A clock that only moves when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use sluice_core::{Clock, FakeClock, Nanos};
/// let clock = FakeClock::default();
/// let handle = clock.clone();
/// handle.advance(Duration::from_secs(2));
/// assert_eq!(clock.now(), Nanos(2_000_000_000));
/// handle.set(Nanos(1));
/// assert_eq!(clock.now(), Nanos(1));
/// ```
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    now: Arc<AtomicI64>,
}

impl FakeClock {
    /// Creates a clock that reads `start`.
    pub fn new(start: Nanos) -> Self {
        FakeClock {
            now: Arc::new(AtomicI64::new(start.0)),
        }
    }

    /// Moves the clock to `t`, forwards or backwards.
    pub fn set(&self, t: Nanos) {
        self.now.store(t.0, Ordering::SeqCst);
    }

    /// Moves the clock forwards by `d`.
    pub fn advance(&self, d: Duration) {
        let d = Nanos::from_duration(d).0;
        // fetch_update never fails with a closure that always returns Some.
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(d))
            });
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Nanos {
        Nanos(self.now.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}
