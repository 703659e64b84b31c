//! A limit from its `algorithm` and `algorithm_config`: each algorithm
//! takes its own fields and refuses the others', and the limit is split
//! into its shards.

use serde_saphyr::Spanned;
use sluice_core::sliding::MAX_LOG_ENTRIES;
use sluice_core::{
    Algorithm, Calendar, CalendarUnit, Concurrency, FixedWindow, Limit, Nanos, SlidingLog,
    SlidingWindow, TokenBucket,
};

use super::fields::{MIN_PERIOD, non_negative, one_of, positive, whole_micros};
use super::rate::{Rate, rated};
use crate::error::{Invalid, Pos, at};
use crate::schema::{AlgorithmKind, Num, RawConfig};
use crate::secs::Secs;

/// The most shards a limit may be split into. A shard is a key of its own
/// in the store, and a value or a reset visits every one.
pub(crate) const MAX_SHARDS: u32 = 1024;

/// Where a limit's capacity was set, for errors about it.
pub(super) struct CapacitySource {
    pub(super) pos: Pos,
    pub(super) label: String,
}

impl CapacitySource {
    fn given(field: &str, v: &Spanned<Num>) -> Self {
        CapacitySource {
            pos: Pos::from(v),
            label: format!("`{field}`"),
        }
    }

    fn defaulted(name: &str, rate: &Rate) -> Self {
        CapacitySource {
            pos: rate.pos,
            label: format!("the {name} (by default the `{}`)", rate.field),
        }
    }
}

/// Builds the limit named `name`, shards applied.
pub(super) fn build(
    name: &str,
    kind: AlgorithmKind,
    config: &Spanned<RawConfig>,
    warnings: &mut Vec<Invalid>,
) -> Result<(Limit, CapacitySource), Invalid> {
    let c = &config.value;
    if kind != AlgorithmKind::FixedWindow
        && let Some(pos) = c
            .calendar
            .as_ref()
            .map(Pos::from)
            .or(c.timezone.as_ref().map(Pos::from))
    {
        return Err(at(
            pos,
            "only a fixed_window opens on the calendar (`calendar`, `timezone`)",
        ));
    }
    let (algorithm, capacity) = match kind {
        AlgorithmKind::TokenBucket => token_bucket(c, &rated(config, warnings)?)?,
        AlgorithmKind::FixedWindow if c.calendar.is_some() || c.timezone.is_some() => {
            let (rate, calendar) = on_calendar(config)?;
            fixed_window(c, &rate, Some(calendar))?
        }
        AlgorithmKind::FixedWindow => fixed_window(c, &rated(config, warnings)?, None)?,
        AlgorithmKind::SlidingWindow => sliding_window(c, &rated(config, warnings)?)?,
        AlgorithmKind::SlidingLog => sliding_log(c, &rated(config, warnings)?)?,
        AlgorithmKind::Concurrency => concurrency(config)?,
    };
    let mut limit = Limit::new(name, algorithm);
    if let (Some(s), Algorithm::Concurrency(_)) = (&c.shards, &algorithm) {
        return Err(at(
            s,
            "a concurrency limit has no `shards`: its `max` slots are whole, and one key's \
             calls in flight are few enough for one",
        ));
    }
    if let Some(s) = &c.shards {
        if s.value > MAX_SHARDS {
            return Err(at(
                s,
                format!("`shards` must be at most {MAX_SHARDS}, got {}", s.value),
            ));
        }
        limit = limit.with_shards(s.value).map_err(|e| at(s, e))?;
    }
    if let Algorithm::SlidingLog(per_shard) = limit.shard_algorithm()
        && per_shard.rate() > MAX_LOG_ENTRIES as f64
    {
        // A sliding log's capacity is its rate, given where this points.
        warnings.push(at(
            capacity.pos,
            format!(
                "a key of this sliding_log may log {} calls of cost 1 per period; past \
                 {MAX_LOG_ENTRIES} a key merges its newest entries, which can deny a little \
                 early; a sliding_window counts in constant memory",
                per_shard.rate()
            ),
        ));
    }
    Ok((limit, capacity))
}

fn token_bucket(c: &RawConfig, rate: &Rate) -> Result<(Algorithm, CapacitySource), Invalid> {
    if let Some(s) = &c.start {
        return Err(at(
            s,
            "`start` aligns fixed windows; a token_bucket has no windows",
        ));
    }
    // `capacity` is accepted as another name for the burst, as some people write it.
    let burst = one_of(
        [("burst", &c.burst), ("capacity", &c.capacity)],
        "the burst",
    )?;
    let per_sec = rate.tokens / rate.period.as_secs_f64();
    let mut tb = TokenBucket::new(per_sec, rate.tokens).map_err(|e| at(rate.pos, e))?;
    let capacity = match burst {
        Some((field, v)) => {
            tb = tb
                .with_capacity(non_negative(field, v)?)
                .map_err(|e| at(v, e))?;
            CapacitySource::given(field, v)
        }
        None => CapacitySource::defaulted("burst", rate),
    };
    if let Some(m) = &c.max_reserved {
        tb = tb
            .with_max_reserved(non_negative("max_reserved", m)?)
            .map_err(|e| at(m, e))?;
    }
    Ok((tb.into(), capacity))
}

/// A calendar window's `rate` per unit and its [`Calendar`]: `calendar:
/// month` with `timezone: Europe/Berlin` (UTC when absent). `period` and
/// `start` are the calendar's to say, and a rate per second has no unit.
fn on_calendar(config: &Spanned<RawConfig>) -> Result<(Rate, Calendar), Invalid> {
    let c = &config.value;
    let Some(unit_field) = &c.calendar else {
        let tz = c.timezone.as_ref().map_or(Pos::from(config), Pos::from);
        return Err(at(
            tz,
            "`timezone` says where calendar windows open: give `calendar` (day, week, month              or year) too",
        ));
    };
    let clashing = [
        ("period", c.period.as_ref().map(Pos::from)),
        ("start", c.start.as_ref().map(Pos::from)),
        ("rps", c.rps.as_ref().map(Pos::from)),
        (
            "tokens_per_second",
            c.tokens_per_second.as_ref().map(Pos::from),
        ),
    ];
    if let Some((field, pos)) = clashing.into_iter().find_map(|(f, pos)| Some((f, pos?))) {
        return Err(at(
            pos,
            format!(
                "`{field}` cannot be combined with `calendar`: a calendar window admits `rate`                  tokens in each {}, which opens at local midnight",
                unit_field.value
            ),
        ));
    }
    let unit: CalendarUnit = unit_field.value.parse().map_err(|e| at(unit_field, e))?;
    let calendar = match &c.timezone {
        Some(tz) => Calendar::new(unit, &tz.value).map_err(|e| at(tz, e))?,
        None => Calendar::utc(unit),
    };
    let Some(value) = &c.rate else {
        return Err(at(
            config,
            format!("a calendar window needs `rate`: the tokens in each {unit}"),
        ));
    };
    let rate = Rate {
        tokens: positive("rate", value)?,
        period: unit.nominal(),
        pos: Pos::from(value),
        field: "rate",
    };
    Ok((rate, calendar))
}

fn fixed_window(
    c: &RawConfig,
    rate: &Rate,
    calendar: Option<Calendar>,
) -> Result<(Algorithm, CapacitySource), Invalid> {
    if let Some(b) = &c.burst {
        return Err(at(
            b,
            "a fixed_window has no `burst`; use `capacity` to let unused tokens roll over",
        ));
    }
    let mut fw = match calendar {
        Some(cal) => FixedWindow::on_calendar(rate.tokens, cal),
        None => FixedWindow::new(rate.tokens, rate.period),
    }
    .map_err(|e| at(rate.pos, e))?;
    let mut capacity = CapacitySource::defaulted("capacity", rate);
    if let Some(v) = &c.capacity {
        fw = fw
            .with_capacity(non_negative("capacity", v)?)
            .map_err(|e| at(v, e))?;
        capacity = CapacitySource::given("capacity", v);
    }
    if let Some(s) = &c.start {
        fw = fw.with_start(window_alignment(s)?);
    }
    if let Some(m) = &c.max_reserved {
        fw = fw
            .with_max_reserved(non_negative("max_reserved", m)?)
            .map_err(|e| at(m, e))?;
    }
    Ok((fw.into(), capacity))
}

/// A window's alignment, its `start`: fixed and sliding windows read it alike.
fn window_alignment(s: &Spanned<Secs>) -> Result<Nanos, Invalid> {
    if s.value.0.0 < 0 {
        return Err(at(s, "`start` must not be negative"));
    }
    if s.value.0.0 % 1_000 != 0 {
        return Err(at(s, whole_micros("start")));
    }
    Ok(s.value.0)
}

/// Refuses what a sliding algorithm has no use for: it admits at most its
/// `rate` per `period`, with no burst above it and no reservations.
fn refuse_for_sliding(c: &RawConfig, name: &str) -> Result<(), Invalid> {
    let burst = [("burst", &c.burst), ("capacity", &c.capacity)]
        .into_iter()
        .find_map(|(f, v)| Some((f, v.as_ref()?)));
    if let Some((field, v)) = burst {
        return Err(at(
            v,
            format!(
                "a {name} has no `{field}`: it admits at most `rate` per `period`; \
                 use a token_bucket for bursts above the rate"
            ),
        ));
    }
    if let Some(m) = &c.max_reserved {
        return Err(at(
            m,
            format!("a {name} takes no reservations, so it has no `max_reserved`"),
        ));
    }
    Ok(())
}

/// Where a sliding algorithm's capacity comes from: its rate.
fn rate_as_capacity(rate: &Rate) -> CapacitySource {
    CapacitySource {
        pos: rate.pos,
        label: format!("`{}`", rate.field),
    }
}

fn sliding_window(c: &RawConfig, rate: &Rate) -> Result<(Algorithm, CapacitySource), Invalid> {
    refuse_for_sliding(c, "sliding_window")?;
    let mut sw =
        SlidingWindow::per_period(rate.tokens, rate.period).map_err(|e| at(rate.pos, e))?;
    if let Some(s) = &c.start {
        sw = sw.with_start(window_alignment(s)?);
    }
    Ok((sw.into(), rate_as_capacity(rate)))
}

fn sliding_log(c: &RawConfig, rate: &Rate) -> Result<(Algorithm, CapacitySource), Invalid> {
    refuse_for_sliding(c, "sliding_log")?;
    if let Some(s) = &c.start {
        return Err(at(
            s,
            "`start` aligns windows; a sliding_log has none: its window ends at every call",
        ));
    }
    let sl = SlidingLog::per_period(rate.tokens, rate.period).map_err(|e| at(rate.pos, e))?;
    Ok((sl.into(), rate_as_capacity(rate)))
}

/// How long a concurrency limit's lease lasts when `lease` is not given.
const DEFAULT_LEASE: Nanos = Nanos(60 * Nanos::PER_SEC);

fn concurrency(config: &Spanned<RawConfig>) -> Result<(Algorithm, CapacitySource), Invalid> {
    let c = &config.value;
    let rate_fields = [
        ("rps", c.rps.as_ref().map(Pos::from)),
        (
            "tokens_per_second",
            c.tokens_per_second.as_ref().map(Pos::from),
        ),
        ("rate", c.rate.as_ref().map(Pos::from)),
        ("period", c.period.as_ref().map(Pos::from)),
        ("burst", c.burst.as_ref().map(Pos::from)),
        ("capacity", c.capacity.as_ref().map(Pos::from)),
        ("start", c.start.as_ref().map(Pos::from)),
        ("max_reserved", c.max_reserved.as_ref().map(Pos::from)),
    ];
    if let Some((field, pos)) = rate_fields.into_iter().find_map(|(f, pos)| Some((f, pos?))) {
        return Err(at(
            pos,
            format!(
                "a concurrency limit counts calls in flight, not calls over time: it has \
                 no `{field}`; give `max` (and `lease`)"
            ),
        ));
    }
    let Some(max) = &c.max else {
        return Err(at(
            config,
            "a concurrency limit needs `max`: how many calls of a key may be in flight at once",
        ));
    };
    let lease = match &c.lease {
        None => DEFAULT_LEASE,
        Some(l) if l.value.0 < MIN_PERIOD => return Err(at(l, "`lease` must be at least 1ms")),
        Some(l) if l.value.0 > sluice_core::RESERVATION_HORIZON => {
            return Err(at(l, "`lease` must be at most a year"));
        }
        Some(l) if l.value.0.0 % 1_000 != 0 => return Err(at(l, whole_micros("lease"))),
        Some(l) => l.value.0,
    };
    let limit = Concurrency::new(max.value.0, lease).map_err(|e| at(max, e))?;
    Ok((limit.into(), CapacitySource::given("max", max)))
}
