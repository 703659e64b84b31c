//! Calendar windows against a brute-force model: a clock ticking every
//! quarter of an hour (every zone's offset is a whole number of quarters)
//! that adds a window's tokens whenever the local date, ISO week or month
//! it reads in the zone changes. The model asks jiff for the civil date
//! only, never for a window boundary, so it shares no arithmetic with
//! `Calendar`.

// Test helpers outside #[test] functions fail loudly on purpose.
#![allow(clippy::unwrap_used, clippy::panic)]

use jiff::Timestamp;
use jiff::tz::TimeZone;
use proptest::prelude::*;
use sluice_core::{
    Calendar, CalendarUnit, FakeClock, FixedWindow, Limit, MemoryStore, Mode, Nanos, Op,
};

const S: i64 = Nanos::PER_SEC;
const TICK: i64 = 15 * 60 * S;
/// 2025-01-01T00:00:00Z, in ticks.
const FIRST: i64 = 1_735_689_600 * S / TICK;

/// Zones with the changes that trip calendars up: summer time in both
/// hemispheres, half-hour and 45-minute offsets, a 30-minute change (Lord
/// Howe), and a change at midnight, when the day begins at 01:00 (Chile).
const ZONES: [&str; 7] = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Asia/Kolkata",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/Santiago",
];

/// Which window the instant `tick` is in, read from the local calendar.
fn window_of(unit: CalendarUnit, tz: &TimeZone, tick: i64) -> (i32, i32) {
    let at = Timestamp::from_nanosecond(i128::from(tick * TICK)).unwrap();
    let date = at.to_zoned_datetime(tz.clone()).date();
    match unit {
        CalendarUnit::Day => (i32::from(date.year()), i32::from(date.day_of_year())),
        CalendarUnit::Week => {
            let week = date.iso_week_date();
            (i32::from(week.year()), i32::from(week.week()))
        }
        CalendarUnit::Month => (i32::from(date.year()), i32::from(date.month())),
        CalendarUnit::Year => (i32::from(date.year()), 0),
    }
}

/// Tokens in eighths, a window's `rate` added on each change of window.
struct Model {
    unit: CalendarUnit,
    tz: TimeZone,
    rate: i64,
    /// `max_reserved`, bounded by the windows of one year
    /// (`RESERVATION_HORIZON` over the unit's nominal length), and by
    /// `CALENDAR_WINDOWS`.
    max_reserved: i64,
    tokens: i64,
}

impl Model {
    /// The tokens after moving from tick `from` to tick `to`, capped or not.
    fn roll(&self, tokens: i64, from: i64, to: i64, cap: i64) -> i64 {
        let mut tokens = tokens;
        let mut window = window_of(self.unit, &self.tz, from);
        for t in from + 1..=to {
            let w = window_of(self.unit, &self.tz, t);
            if w != window {
                tokens = (tokens + self.rate).min(cap);
                window = w;
            }
        }
        tokens
    }

    fn take(&mut self, cost: i64, reserve: bool) -> bool {
        let deficit = cost - self.tokens;
        let ok = self.tokens >= cost || (reserve && deficit <= self.max_reserved);
        if ok {
            self.tokens -= cost;
        }
        ok
    }
}

fn units() -> impl Strategy<Value = CalendarUnit> {
    prop_oneof![
        Just(CalendarUnit::Day),
        Just(CalendarUnit::Week),
        Just(CalendarUnit::Month)
    ]
}

/// Steps in ticks: often none, often within a day, sometimes days on.
fn calls() -> impl Strategy<Value = Vec<(i64, i64, bool)>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0i64), 0..96i64, 0..4 * 96i64],
            0i64..64,
            any::<bool>(),
        ),
        1..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Decisions, remaining tokens, the stored value and `retry_after` are
    /// what the model says, in every zone, across its clock changes.
    #[test]
    fn calendar_windows_agree_with_the_brute_force_model(
        unit in units(), zone in 0..ZONES.len(), start in 0i64..2 * 365 * 96,
        rate in 8i64..40, cap_extra in 0i64..40, mr in prop::option::of(0i64..64),
        calls in calls(),
    ) {
        let cap = rate + cap_extra;
        let calendar = Calendar::new(unit, ZONES[zone]).unwrap();
        let mut fw = FixedWindow::on_calendar(rate as f64 / 8.0, calendar).unwrap()
            .with_capacity(cap as f64 / 8.0).unwrap();
        if let Some(m) = mr { fw = fw.with_max_reserved(m as f64 / 8.0).unwrap(); }
        let limit = Limit::new("cal", fw);
        let tz = jiff::tz::db().get(ZONES[zone]).unwrap();
        // A year's windows, at most CALENDAR_WINDOWS.
        let horizon = match unit {
            CalendarUnit::Month => 12,
            _ => 32,
        };
        let max_reserved = mr.unwrap_or(i64::MAX).min(rate * horizon);
        let mut model = Model { unit, tz, rate, max_reserved, tokens: cap };
        let mut tick = FIRST + start;
        let clock = FakeClock::new(Nanos(tick * TICK));
        let store = MemoryStore::with_clock(clock.clone());
        for (dt, cost, reserve) in calls {
            model.tokens = model.roll(model.tokens, tick, tick + dt, cap);
            tick += dt;
            clock.set(Nanos(tick * TICK));
            let max = if reserve || mr.is_some() { cap + max_reserved } else { cap };
            let cost = cost.min(max);
            let mode = if reserve { Mode::RESERVE } else { Mode::CONSUME };
            let d = store.transact_now(&[Op::new(&limit, "k", cost as f64 / 8.0)], mode)
                .unwrap().decisions[0];
            let before = model.tokens;
            let ok = model.take(cost, reserve);
            prop_assert_eq!(d.allowed, ok, "{} {:?}: tick {} cost {}/8", ZONES[zone], unit, tick, cost);
            prop_assert_eq!(d.remaining as i64, model.tokens.max(0) / 8);
            prop_assert_eq!(store.value_now(&limit, "k").tokens, model.tokens as f64 / 8.0);
            if let Some(wait) = d.retry_after {
                // Tick on until the windows bring enough, uncapped, since a
                // reservation may take more than the capacity.
                let mut t = tick;
                let mut tokens = before;
                while tokens < cost {
                    tokens = model.roll(tokens, t, t + 1, i64::MAX);
                    t += 1;
                }
                let want = ((t - tick) * TICK) as f64 / S as f64;
                prop_assert!((wait - want).abs() < 1e-6, "retry_after {} != {}", wait, want);
            }
        }
    }

    /// However the calls come, no window of a calendar without rollover
    /// admits more than its rate (nothing reserved).
    #[test]
    fn no_calendar_window_admits_more_than_its_rate(
        unit in units(), zone in 0..ZONES.len(), start in 0i64..2 * 365 * 96,
        rate in 8i64..40, calls in calls(),
    ) {
        let calendar = Calendar::new(unit, ZONES[zone]).unwrap();
        let limit = Limit::new("cal", FixedWindow::on_calendar(rate as f64 / 8.0, calendar).unwrap());
        let tz = jiff::tz::db().get(ZONES[zone]).unwrap();
        let mut tick = FIRST + start;
        let clock = FakeClock::new(Nanos(tick * TICK));
        let store = MemoryStore::with_clock(clock.clone());
        let mut spent: std::collections::HashMap<(i32, i32), i64> = Default::default();
        for (dt, cost, _) in calls {
            tick += dt;
            clock.set(Nanos(tick * TICK));
            let cost = cost.min(rate);
            let out = store.transact_now(&[Op::new(&limit, "k", cost as f64 / 8.0)], Mode::CONSUME).unwrap();
            if out.allowed {
                let total = spent.entry(window_of(unit, &tz, tick)).or_default();
                *total += cost;
                prop_assert!(*total <= rate, "{} eighths in one window of {}", total, rate);
            }
        }
    }
}
