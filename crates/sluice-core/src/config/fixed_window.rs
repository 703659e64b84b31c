//! The fixed window's configuration, on a period or on the calendar.

use super::{CALENDAR_WINDOWS, LimitError, RESERVATION_HORIZON, check_admits, finite_nonneg};
use crate::calendar::Calendar;
use crate::time::Nanos;

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
    pub(super) rate: f64,
    /// The window length, or a calendar unit's nominal length.
    pub(super) period: Nanos,
    pub(super) capacity: f64,
    pub(super) start: Option<Nanos>,
    pub(super) max_reserved: Option<f64>,
    /// Windows that open on the calendar instead of every `period`.
    pub(super) calendar: Option<Calendar>,
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
