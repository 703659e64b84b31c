//! The number and duration fields of an `algorithm_config`: one of two
//! names, positive or not negative, counted exactly, in whole microseconds.

use serde_saphyr::Spanned;
use sluice_core::{MAX_EXACT_TOKENS, Nanos};

use crate::error::{Invalid, Pos, at};
use crate::schema::Num;

/// The shortest period: below a millisecond no clock or network keeps time
/// well enough for the limit to mean what it says.
pub(super) const MIN_PERIOD: Nanos = Nanos(Nanos::PER_SEC / 1_000);

/// Periods and window alignments are kept to whole microseconds, the
/// resolution of Redis's clock: finer, a window could not open at the same
/// instant on every store, and the Redis store refuses it.
pub(super) fn whole_micros(field: &str) -> String {
    format!("`{field}` must be a whole number of microseconds")
}

/// The one field of `fields` that is set, refusing two that set the same thing.
pub(super) fn one_of<'a, const N: usize>(
    fields: [(&'static str, &'a Option<Spanned<Num>>); N],
    what: &str,
) -> Result<Option<(&'static str, &'a Spanned<Num>)>, Invalid> {
    let mut given: Vec<_> = fields
        .into_iter()
        .filter_map(|(f, v)| Some((f, v.as_ref()?)))
        .collect();
    // Blame whichever of the two comes later in the file.
    given.sort_by_key(|(_, v)| Pos::from(*v));
    match given.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(*one)),
        [(first, _), (second, v), ..] => Err(at(
            *v,
            format!("`{second}` and `{first}` both set {what}; give only one of them"),
        )),
    }
}

pub(super) fn positive(field: &str, v: &Spanned<Num>) -> Result<f64, Invalid> {
    let x = v.value.0;
    if x > MAX_EXACT_TOKENS {
        Err(too_many(field, v))
    } else if x.is_finite() && x > 0.0 {
        Ok(x)
    } else {
        Err(at(
            v,
            format!("`{field}` must be a positive number, got {x}"),
        ))
    }
}

pub(super) fn non_negative(field: &str, v: &Spanned<Num>) -> Result<f64, Invalid> {
    let x = v.value.0;
    if x > MAX_EXACT_TOKENS {
        Err(too_many(field, v))
    } else if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(at(v, format!("`{field}` must be a number >= 0, got {x}")))
    }
}

fn too_many(field: &str, v: &Spanned<Num>) -> Invalid {
    at(
        v,
        format!(
            "`{field}` {} is more than {MAX_EXACT_TOKENS}, the most tokens that can be \
             counted exactly",
            v.value.0
        ),
    )
}
