//! What only a named limit can get wrong.

use serde_saphyr::Spanned;
use sluice_core::{Algorithm, Limit};

use super::algorithm::CapacitySource;
use crate::error::{Invalid, at};

/// What only a named limit can get wrong: callers choose its costs and may
/// reserve, so its capacity must admit a whole call, and a reservation
/// should have a bound of the operator's choosing.
pub(super) fn check_named(
    name: &Spanned<String>,
    limit: &Limit,
    capacity: &CapacitySource,
    warnings: &mut Vec<Invalid>,
) -> Result<(), Invalid> {
    let alg = limit.algorithm();
    let cap = alg.capacity();
    if cap == 0.0 && alg.max_reserved().is_none() {
        return Err(at(
            capacity.pos,
            format!(
                "{} is 0 and there is no `max_reserved`: no call could pass without \
                 reserving; give `max_reserved` for a queue with no burst",
                capacity.label
            ),
        ));
    }
    if cap > 0.0 && cap < 1.0 {
        warnings.push(at(
            capacity.pos,
            format!(
                "{} {cap} is less than 1: a call that costs 1 can never pass",
                capacity.label
            ),
        ));
    }
    if alg.reserves() && alg.max_reserved().is_none() {
        let span = match alg {
            Algorithm::FixedWindow(fw) if fw.calendar().is_some() => {
                let unit = fw.calendar().map_or("window", |c| c.unit().name());
                format!("{} {unit}s of refill", fw.debt_windows())
            }
            _ => "a year of refill".to_owned(),
        };
        warnings.push(at(
            name,
            format!(
                "limit `{}` has no `max_reserved`: a caller that reserves may take up to \
                 {} tokens ({span}) ahead and hold every caller of the key back \
                 that long; set `max_reserved`, and let only trusted callers reserve",
                name.value,
                alg.reservable()
            ),
        ));
    }
    Ok(())
}
