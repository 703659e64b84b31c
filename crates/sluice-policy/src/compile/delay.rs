//! A rule's `on_limit: {delay: {max}}`: how long it may hold a request.

use std::time::Duration;

use serde_saphyr::Spanned;
use sluice_core::Limit;

use crate::error::{Invalid, at};
use crate::schema::RawOnLimit;

/// The longest a rule may hold a request: past an hour a client has long
/// given up, and each held request keeps a connection and a task.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(3600);

/// The rule's `on_limit: {delay: {max}}`, checked against its limit: only
/// a limit that takes reservations can say when a request is due.
pub(super) fn delay(
    name: &Spanned<String>,
    domain: Option<&Spanned<String>>,
    on_limit: &Spanned<RawOnLimit>,
    limit: &Limit,
    warnings: &mut Vec<Invalid>,
) -> Result<Option<Duration>, Invalid> {
    let Some(delay) = &on_limit.value.delay else {
        return Ok(None);
    };
    let max = &delay.value.max;
    let name = &name.value;
    if max.value.0.0 <= 0 || max.value.0.as_secs_f64() > MAX_DELAY.as_secs_f64() {
        return Err(at(
            max,
            format!(
                "`max` is {} s; a delay must be longer than 0 and at most an hour",
                max.value.0.as_secs_f64()
            ),
        ));
    }
    let alg = limit.algorithm();
    if !alg.reserves() {
        return Err(at(
            delay,
            format!(
                "a {} cannot delay: only a token_bucket or a fixed_window takes the \
                 reservations that say when a request is due",
                alg.name()
            ),
        ));
    }
    let max_secs = max.value.0.as_secs_f64();
    let max_d = Duration::from_nanos(max.value.0.0.unsigned_abs());
    if let Some(domain) = domain {
        warnings.push(at(
            delay,
            format!(
                "rule `{name}` answers Envoy (domain `{}`), whose rate limit service cannot \
                 hold a request: it refuses beyond its limit as if it had no `delay`",
                domain.value
            ),
        ));
    }
    // The wait of the deepest reservation the limit allows, and the
    // `max_reserved` that a wait of `max` allows.
    let (deepest, fits) = match alg {
        sluice_core::Algorithm::TokenBucket(tb) => (
            alg.max_reserved().map(|m| m / tb.rate()),
            (tb.rate() * max_secs).floor(),
        ),
        sluice_core::Algorithm::FixedWindow(fw) => (
            alg.max_reserved()
                .map(|m| (m / fw.rate()).ceil() * fw.period().as_secs_f64()),
            (max_secs / fw.period().as_secs_f64()).floor() * fw.rate(),
        ),
        _ => (None, 0.0),
    };
    match deepest {
        None => warnings.push(at(
            delay,
            format!(
                "rule `{name}` delays but has no `max_reserved`: a request that would wait \
                 longer than `max` reserves and is then given back, two store calls for a \
                 refusal, and a flood reserves a year ahead in between; set `max_reserved` \
                 to {fits}, what `max` can hold"
            ),
        )),
        Some(wait) if wait > max_secs => warnings.push(at(
            max,
            format!(
                "`max` {max_secs} s is shorter than the {wait} s the rule's `max_reserved` \
                 may make a request wait: a request reserved beyond {max_secs} s is given \
                 back and refused; set `max_reserved` to {fits}, or `max` to {wait} s"
            ),
        )),
        Some(_) => {}
    }
    Ok(Some(max_d))
}
