//! Penalties: a key that a rule or limit denies is denied outright for a
//! while, whatever its tokens, as a mitigation timeout does for a client
//! that keeps hammering.

use sluice_core::{Limit, Nanos, TokenBucket};

/// A rule's or limit's `penalty`: how long a key it denies stays denied,
/// and the state that remembers when each key's penalty ends.
///
/// That state is a limit of its own, the key's *gate*: a token bucket of
/// capacity 0 that refills one token per penalty. A key's gate is open while
/// it holds 0 tokens (a call of cost 0 passes), and a denial charges it one
/// token, so that it opens again exactly one penalty later, on every store,
/// with the wait as its `retry_after`. Its name is the owner's followed by
/// `:penalty`, which the policy reserves.
///
/// ```
/// use sluice_core::Nanos;
/// use sluice_policy::Penalty;
/// let p = Penalty::new("login", Nanos(10 * Nanos::PER_SEC)).unwrap();
/// assert_eq!(p.gate().name(), "login:penalty");
/// assert_eq!(p.gate().algorithm().capacity(), 0.0);
/// assert_eq!(p.duration(), Nanos(10 * Nanos::PER_SEC));
/// ```
#[derive(Debug, Clone)]
pub struct Penalty {
    duration: Nanos,
    gate: Limit,
}

impl Penalty {
    /// The penalty of `duration` of the rule or limit named `owner`.
    pub fn new(owner: &str, duration: Nanos) -> Result<Penalty, sluice_core::LimitError> {
        let bucket = TokenBucket::per_period(1.0, duration)?.with_capacity(0.0)?;
        Ok(Penalty {
            duration,
            gate: Limit::new(Penalty::gate_name(owner), bucket),
        })
    }

    /// The name of the gate of `owner`'s penalty.
    pub(crate) fn gate_name(owner: &str) -> String {
        format!("{owner}:penalty")
    }

    /// How long a denied key stays denied.
    pub fn duration(&self) -> Nanos {
        self.duration
    }

    /// The state that says whether a key is serving its penalty.
    pub fn gate(&self) -> &Limit {
        &self.gate
    }
}
