//! A rule's cost (`cost_source`, `fixed_cost`, `default_cost`), which a
//! named limit refuses: its callers say what each call costs.

use serde_saphyr::Spanned;

use super::fields::positive;
use crate::error::{Invalid, Pos, at};
use crate::keys::{Cost, CostSource};
use crate::schema::{Num, RawConfig};

pub(super) fn cost(c: &RawConfig) -> Result<Cost, Invalid> {
    let source = match &c.cost_source {
        Some(s) => CostSource::parse(&s.value).map_err(|m| at(s, m))?,
        None => CostSource::Fixed,
    };
    let amount = |field, v: &Option<Spanned<Num>>| match v {
        Some(v) => positive(field, v),
        None => Ok(1.0),
    };
    Ok(Cost::new(
        source,
        amount("fixed_cost", &c.fixed_cost)?,
        amount("default_cost", &c.default_cost)?,
    ))
}

pub(super) fn forbid_cost(c: &RawConfig) -> Result<(), Invalid> {
    let fields = [
        ("cost_source", c.cost_source.as_ref().map(Pos::from)),
        ("fixed_cost", c.fixed_cost.as_ref().map(Pos::from)),
        ("default_cost", c.default_cost.as_ref().map(Pos::from)),
    ];
    match fields.into_iter().find_map(|(f, pos)| Some((f, pos?))) {
        Some((field, pos)) => Err(at(
            pos,
            format!("`{field}` applies to rules; a named limit is charged what each call asks"),
        )),
        None => Ok(()),
    }
}
