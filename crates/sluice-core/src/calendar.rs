//! Calendar windows: a fixed window that opens at local midnight of each
//! day, ISO week (Monday), month or year in an IANA time zone.
//!
//! The calendar's windows are numbered: window `i` is `[start(i),
//! start(i + 1))`, and [`Calendar::index`] finds the window holding an
//! instant. A day is day `i` since 1970-01-01 in the zone, a week the
//! Monday-started week `i` since the week of that day, a month `12·year +
//! month - 1`, a year its number. With these two functions the fixed
//! window's formulas count boundaries and find the next ones exactly (see
//! `docs/semantics.md`), however long a window is: 23 or 25 hours for a day
//! across a daylight-saving change, 28 to 31 days for a month.
//!
//! The zone rules come from the tz database that jiff bundles, the same on
//! every server whatever its system has, so that two servers sharing a
//! store always agree on where a window begins.

use std::fmt;
use std::sync::RwLock;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp};

use crate::time::Nanos;

const DAY: i64 = 24 * 3_600 * Nanos::PER_SEC;

/// What a calendar cannot be made of.
///
/// ```
/// use sluice_core::{Calendar, CalendarError, CalendarUnit};
/// let err = Calendar::new(CalendarUnit::Day, "Europe/Atlantis").unwrap_err();
/// assert_eq!(err, CalendarError::TimeZone("Europe/Atlantis".into()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CalendarError {
    /// A calendar window's unit is one of day, week, month and year.
    #[error("calendar must be one of day, week, month, year; got {0:?}")]
    Unit(String),
    /// A calendar window's zone is an IANA name the tz database knows.
    #[error(
        "time zone {0:?} is not in the tz database (write an IANA name such as Europe/Berlin, or UTC)"
    )]
    TimeZone(String),
}

/// The calendar unit a window lasts.
///
/// ```
/// use sluice_core::CalendarUnit;
/// assert_eq!("month".parse::<CalendarUnit>(), Ok(CalendarUnit::Month));
/// assert_eq!(CalendarUnit::Week.to_string(), "week");
/// assert!("fortnight".parse::<CalendarUnit>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// From local midnight to the next.
    Day,
    /// An ISO week: from Monday's local midnight to the next Monday's.
    Week,
    /// From local midnight of the 1st to that of the next month's 1st.
    Month,
    /// From local midnight of 1 January to the next year's.
    Year,
}

impl CalendarUnit {
    /// Every unit, shortest first.
    pub const ALL: [CalendarUnit; 4] = [
        CalendarUnit::Day,
        CalendarUnit::Week,
        CalendarUnit::Month,
        CalendarUnit::Year,
    ];

    /// The name a policy file gives the unit.
    pub fn name(self) -> &'static str {
        match self {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Year => "year",
        }
    }

    /// The unit's nominal length: a day of 24 hours, a week of 7 days, a
    /// month of 30 days and a year of 365, as Envoy's rate limit service
    /// counts its units. It names the unit where a length is wanted (the
    /// `w` of `RateLimit-Policy`, a rate per second); no window is measured
    /// by it.
    pub fn nominal(self) -> Nanos {
        Nanos(match self {
            CalendarUnit::Day => DAY,
            CalendarUnit::Week => 7 * DAY,
            CalendarUnit::Month => 30 * DAY,
            CalendarUnit::Year => 365 * DAY,
        })
    }
}

impl fmt::Display for CalendarUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CalendarUnit {
    type Err = CalendarError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CalendarUnit::ALL
            .into_iter()
            .find(|u| u.name() == s)
            .ok_or_else(|| CalendarError::Unit(s.chars().take(32).collect()))
    }
}

/// The zones calendars have named, each once: a [`Calendar`] holds an index
/// into this list, so that it stays `Copy` as every algorithm is. Only names
/// the tz database knows get here, so it holds a few hundred at most.
static ZONES: RwLock<Vec<TimeZone>> = RwLock::new(Vec::new());

/// The zone at `index` in [`ZONES`].
fn zone(index: u32) -> TimeZone {
    let zones = ZONES.read().unwrap_or_else(|e| e.into_inner());
    zones.get(index as usize).cloned().unwrap_or(TimeZone::UTC)
}

/// The index of `tz` in [`ZONES`], added if it is new.
fn intern(name: &str, tz: TimeZone) -> u32 {
    let same = |z: &TimeZone| z.iana_name() == Some(name);
    if let Some(i) = ZONES
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .position(same)
    {
        return i as u32;
    }
    let mut zones = ZONES.write().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = zones.iter().position(same) {
        return i as u32;
    }
    zones.push(tz);
    (zones.len() - 1) as u32
}

/// Windows that open on the calendar: a unit in a time zone.
///
/// ```
/// use sluice_core::{Calendar, CalendarUnit, Nanos};
/// let month = Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap();
/// // 2026-03-31T21:59:59Z is 23:59:59 in Berlin (summer time since the 29th).
/// let last_second = Nanos(1_774_994_399 * Nanos::PER_SEC);
/// let april = month.start(month.index(last_second) + 1);
/// assert_eq!(april, Nanos(1_774_994_400 * Nanos::PER_SEC));
/// assert!(Calendar::new(CalendarUnit::Day, "Mars/Olympus_Mons").is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Calendar {
    unit: CalendarUnit,
    zone: u32,
}

impl Calendar {
    /// Windows of `unit` in the IANA zone `zone` (such as `Europe/Berlin`,
    /// or `UTC`), from the bundled tz database.
    pub fn new(unit: CalendarUnit, zone: &str) -> Result<Calendar, CalendarError> {
        let tz = jiff::tz::db()
            .get(zone)
            .map_err(|_| CalendarError::TimeZone(zone.chars().take(64).collect()))?;
        Ok(Calendar::of(unit, zone, tz))
    }

    /// Windows of `unit` in UTC.
    pub fn utc(unit: CalendarUnit) -> Calendar {
        let tz = jiff::tz::db().get("UTC").unwrap_or(TimeZone::UTC);
        Calendar::of(unit, "UTC", tz)
    }

    /// The calendar of `tz`, which was looked up as `zone`: interned by its
    /// canonical name, so that a zone named twice is one zone.
    fn of(unit: CalendarUnit, zone: &str, tz: TimeZone) -> Calendar {
        let name = tz.iana_name().unwrap_or(zone).to_owned();
        Calendar {
            unit,
            zone: intern(&name, tz),
        }
    }

    /// The unit each window lasts.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The zone's IANA name.
    pub fn zone_name(&self) -> String {
        zone(self.zone).iana_name().unwrap_or("UTC").to_owned()
    }

    /// The number of the window that holds `t`.
    ///
    /// ```
    /// use sluice_core::{Calendar, CalendarUnit, Nanos};
    /// let day = Calendar::utc(CalendarUnit::Day);
    /// assert_eq!(day.index(Nanos(86_399 * Nanos::PER_SEC)), 0);
    /// assert_eq!(day.index(Nanos(86_400 * Nanos::PER_SEC)), 1);
    /// assert_eq!(day.index(Nanos(-Nanos::PER_SEC)), -1);
    /// ```
    pub fn index(&self, t: Nanos) -> i64 {
        if let Some(w) = Recent::find(|w| w.calendar == *self && w.start <= t && t < w.end) {
            return w.index;
        }
        let index = self.index_uncached(t);
        Recent::keep(Window {
            calendar: *self,
            index,
            start: self.start_uncached(index),
            end: self.start_uncached(index.saturating_add(1)),
        });
        index
    }

    /// [`Calendar::index`] from the tz database.
    fn index_uncached(&self, t: Nanos) -> i64 {
        // Every i64 of nanoseconds is an instant jiff holds.
        let at = Timestamp::from_nanosecond(i128::from(t.0)).unwrap_or(Timestamp::UNIX_EPOCH);
        let date = at.to_zoned_datetime(zone(self.zone)).date();
        match self.unit {
            CalendarUnit::Day => epoch_day(date),
            // 1970-01-01 was a Thursday: the week holding it began three
            // days before.
            CalendarUnit::Week => (epoch_day(date) + 3).div_euclid(7),
            CalendarUnit::Month => i64::from(date.year()) * 12 + i64::from(date.month()) - 1,
            CalendarUnit::Year => i64::from(date.year()),
        }
    }

    /// When window `index` opens: local midnight of its first day (or the
    /// first instant of that day, where midnight falls in a gap), saturated
    /// to the times [`Nanos`] holds.
    ///
    /// ```
    /// use sluice_core::{Calendar, CalendarUnit, Nanos};
    /// let year = Calendar::utc(CalendarUnit::Year);
    /// assert_eq!(year.start(1971), Nanos(365 * 86_400 * Nanos::PER_SEC));
    /// assert_eq!(year.start(9_000), Nanos(i64::MAX));
    /// ```
    pub fn start(&self, index: i64) -> Nanos {
        let near = Recent::find(|w| {
            w.calendar == *self && (w.index == index || w.index.checked_add(1) == Some(index))
        });
        match near {
            Some(w) if w.index == index => w.start,
            Some(w) => w.end,
            None => self.start_uncached(index),
        }
    }

    /// [`Calendar::start`] from the tz database.
    fn start_uncached(&self, index: i64) -> Nanos {
        let date = match self.unit {
            CalendarUnit::Day => from_epoch_day(index),
            CalendarUnit::Week => index
                .checked_mul(7)
                .and_then(|d| d.checked_sub(3))
                .and_then(from_epoch_day),
            CalendarUnit::Month => i16::try_from(index.div_euclid(12))
                .ok()
                .and_then(|y| Date::new(y, (index.rem_euclid(12) + 1) as i8, 1).ok()),
            CalendarUnit::Year => i16::try_from(index)
                .ok()
                .and_then(|y| Date::new(y, 1, 1).ok()),
        };
        let ns = date
            .and_then(|d| d.to_zoned_datetime(zone(self.zone)).ok())
            .map(|z| z.timestamp().as_nanosecond());
        match ns {
            Some(ns) => Nanos(ns.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64),
            None if index < 0 => Nanos(i64::MIN),
            None => Nanos(i64::MAX),
        }
    }

    /// When the window that is `n` windows after the one holding `t` opens.
    #[inline]
    pub fn start_after(&self, t: Nanos, n: i64) -> Nanos {
        self.start(self.index(t).saturating_add(n))
    }
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calendar")
            .field("unit", &self.unit)
            .field("zone", &self.zone_name())
            .finish()
    }
}

/// A window a thread has looked up: most calls on a calendar window ask
/// about the window that holds the present, and its bounds, again and
/// again, and the tz database takes far longer to answer than this.
#[derive(Clone, Copy)]
struct Window {
    calendar: Calendar,
    index: i64,
    start: Nanos,
    end: Nanos,
}

/// The windows this thread looked up last, a few calendars' worth.
struct Recent;

const RECENT: usize = 4;

thread_local! {
    static RECENT_WINDOWS: std::cell::Cell<([Option<Window>; RECENT], usize)> =
        const { std::cell::Cell::new(([None; RECENT], 0)) };
}

impl Recent {
    fn find(wanted: impl Fn(&Window) -> bool) -> Option<Window> {
        let (windows, _) = RECENT_WINDOWS.get();
        windows.into_iter().flatten().find(wanted)
    }

    /// Keeps `w` in place of the one kept longest ago.
    fn keep(w: Window) {
        let (mut windows, next) = RECENT_WINDOWS.get();
        windows[next] = Some(w);
        RECENT_WINDOWS.set((windows, (next + 1) % RECENT));
    }
}

/// 1970-01-01, day 0.
const EPOCH: Date = Date::constant(1970, 1, 1);

fn epoch_day(date: Date) -> i64 {
    date.since(EPOCH)
        .map_or(0, |span| i64::from(span.get_days()))
}

fn from_epoch_day(day: i64) -> Option<Date> {
    EPOCH.checked_add(Span::new().try_days(day).ok()?).ok()
}
