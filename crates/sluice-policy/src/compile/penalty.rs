//! A rule's or named limit's `penalty`: how long a key that is refused
//! stays shut, and the name of the state that keeps it.

use std::collections::HashMap;

use serde_saphyr::Spanned;
use sluice_core::Nanos;

use super::fields::{MIN_PERIOD, whole_micros};
use super::names::claim;
use crate::error::{Invalid, Pos, at};
use crate::penalty::Penalty;
use crate::secs::Secs;

/// The longest penalty: a year, as long as a reservation may make a caller
/// wait. Longer is almost surely a slip, and a key cannot be let off early
/// but by a reset.
const MAX_PENALTY: Nanos = sluice_core::RESERVATION_HORIZON;

/// The penalty of the rule or limit `owner`, if it sets one, claiming the
/// name of its gate's state so that no other rule or limit can share it.
pub(super) fn penalty(
    names: &mut HashMap<String, (Pos, &'static str)>,
    owner: &Spanned<String>,
    raw: Option<&Spanned<Secs>>,
) -> Result<Option<Penalty>, Invalid> {
    let Some(p) = raw else {
        return Ok(None);
    };
    let d = p.value.0;
    if d < MIN_PERIOD || d > MAX_PENALTY {
        return Err(at(
            p,
            format!(
                "penalty is {} s; it must be from 1ms to a year",
                d.as_secs_f64()
            ),
        ));
    }
    if d.0 % 1_000 != 0 {
        return Err(at(p, whole_micros("penalty")));
    }
    let gate = Spanned {
        value: Penalty::gate_name(&owner.value),
        ..owner.clone()
    };
    claim(names, &gate, "penalty state")?;
    Penalty::new(&owner.value, d)
        .map(Some)
        .map_err(|e| at(p, e.to_string()))
}
