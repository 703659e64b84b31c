//! The one namespace of rules, named limits and penalty states: the store
//! keeps state by name, so two of them under one name would share it.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use serde_saphyr::Spanned;

use crate::error::{Invalid, Pos, at};

/// Records `name` as taken, refusing empty and duplicate names.
pub(super) fn claim(
    names: &mut HashMap<String, (Pos, &'static str)>,
    name: &Spanned<String>,
    kind: &'static str,
) -> Result<(), Invalid> {
    if name.value.is_empty() {
        return Err(at(name, format!("a {kind} name must not be empty")));
    }
    match names.entry(name.value.clone()) {
        Entry::Vacant(v) => {
            v.insert((Pos::from(name), kind));
            Ok(())
        }
        Entry::Occupied(o) => {
            let (first, first_kind) = *o.get();
            Err(at(
                name,
                if first_kind == kind {
                    format!(
                        "duplicate {kind} name `{}`; it is first used at {first}",
                        name.value
                    )
                } else {
                    format!(
                        "{kind} name `{}` is already the name of a {first_kind} at {first}; \
                         rules and limits share one namespace in the store",
                        name.value
                    )
                },
            ))
        }
    }
}
