//! A rate: tokens per period, from whichever of `rps`,
//! `tokens_per_second` and `rate` (with its `period`) is given.

use serde_saphyr::Spanned;
use sluice_core::Nanos;

use super::fields::{MIN_PERIOD, one_of, positive, whole_micros};
use crate::error::{Invalid, Pos, at};
use crate::schema::RawConfig;

/// The slowest refill: one token in ten years. Slower is almost surely a
/// slip of the exponent, and its waits no longer fit in a timestamp.
const MAX_SECS_PER_TOKEN: f64 = 10.0 * 365.0 * 24.0 * 3600.0;

/// The rate of an algorithm that has one: every one but concurrency, whose
/// `max` and `lease` it refuses.
pub(super) fn rated(
    config: &Spanned<RawConfig>,
    warnings: &mut Vec<Invalid>,
) -> Result<Rate, Invalid> {
    let c = &config.value;
    let misplaced = [
        ("max", c.max.as_ref().map(Pos::from)),
        ("lease", c.lease.as_ref().map(Pos::from)),
    ]
    .into_iter()
    .find_map(|(f, pos)| Some((f, pos?)));
    if let Some((field, pos)) = misplaced {
        return Err(at(
            pos,
            format!("`{field}` belongs to a concurrency limit (`algorithm: concurrency`)"),
        ));
    }
    rate(config, warnings)
}

/// Tokens per period, from whichever of `rps`, `tokens_per_second`, `rate` is given.
pub(super) struct Rate {
    pub(super) tokens: f64,
    pub(super) period: Nanos,
    pub(super) pos: Pos,
    pub(super) field: &'static str,
}

fn rate(config: &Spanned<RawConfig>, warnings: &mut Vec<Invalid>) -> Result<Rate, Invalid> {
    let c = &config.value;
    let given = one_of(
        [
            ("rps", &c.rps),
            ("tokens_per_second", &c.tokens_per_second),
            ("rate", &c.rate),
        ],
        "the rate",
    )?;
    let Some((field, value)) = given else {
        return Err(at(
            config,
            "algorithm_config needs a rate: `rps`, `tokens_per_second`, \
             or `rate` with an optional `period`",
        ));
    };
    let tokens = positive(field, value)?;
    let period = match &c.period {
        None => {
            if field == "rate" {
                warnings.push(at(
                    value,
                    "`rate` without `period` counts per second; write `rps` to say so, \
                     or give the `period` it was meant for",
                ));
            }
            Nanos(Nanos::PER_SEC)
        }
        Some(p) if field != "rate" => {
            return Err(at(
                p,
                format!(
                    "`period` cannot be combined with `{field}`, which is per second; \
                     use `rate` with `period` instead"
                ),
            ));
        }
        Some(p) if p.value.0.0 <= 0 => return Err(at(p, "`period` must be positive")),
        Some(p) if p.value.0 < MIN_PERIOD => {
            return Err(at(p, "`period` must be at least 1ms"));
        }
        Some(p) if p.value.0.0 % 1_000 != 0 => return Err(at(p, whole_micros("period"))),
        Some(p) => p.value.0,
    };
    let secs_per_token = period.as_secs_f64() / tokens;
    if secs_per_token > MAX_SECS_PER_TOKEN {
        return Err(at(
            value,
            format!(
                "`{field}` {tokens} refills one token every {secs_per_token:e} s; \
                 the slowest allowed is one token in ten years"
            ),
        ));
    }
    Ok(Rate {
        tokens,
        period,
        pos: Pos::from(value),
        field,
    })
}
