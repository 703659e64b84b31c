//! What a limit says about a call: [`Decision`] for one limit, [`Outcome`] for
//! a transaction, and [`Value`] for an inspection.

use smallvec::SmallVec;

use crate::time::Nanos;

/// One limit's answer for one call.
///
/// ```
/// use sluice_core::Decision;
/// let d = Decision { allowed: false, capacity: 10.0, remaining: 0, retry_after: Some(0.5), reset: 1.0 };
/// assert!(!d.allowed && d.retry_after == Some(0.5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// Whether this limit admits the call (now, or after `retry_after` for a
    /// reservation).
    pub allowed: bool,
    /// The capacity of the bucket or window: the most a key can hold
    /// (what HTTP answers call the `limit`).
    pub capacity: f64,
    /// Whole tokens left after the decision: `floor(max(0, tokens))`.
    pub remaining: u64,
    /// Seconds until the call would succeed (on a denial), or until a
    /// reservation may proceed (on an allowed reservation). `None` when the
    /// call may proceed now.
    pub retry_after: Option<f64>,
    /// Seconds until the key is full again.
    pub reset: f64,
}

impl Decision {
    /// What a settled key reports (see
    /// [`Store::settle`](crate::Store::settle)), from each of its hot-key
    /// shards as it stands: allowed, since a settlement is never refused,
    /// with the shards' capacities and remaining whole tokens added up (each
    /// shard's floored on its own) and the longest reset.
    ///
    /// ```
    /// use sluice_core::Decision;
    /// let part = |remaining, reset| Decision { allowed: false, capacity: 5.0, remaining, retry_after: Some(1.0), reset };
    /// let d = Decision::settled([part(2, 1.0), part(3, 0.5)]);
    /// assert!(d.allowed && d.retry_after.is_none());
    /// assert_eq!((d.capacity, d.remaining, d.reset), (10.0, 5, 1.0));
    /// ```
    pub fn settled(parts: impl IntoIterator<Item = Decision>) -> Decision {
        parts.into_iter().fold(
            Decision {
                allowed: true,
                capacity: 0.0,
                remaining: 0,
                retry_after: None,
                reset: 0.0,
            },
            |sum, d| Decision {
                capacity: sum.capacity + d.capacity,
                remaining: sum.remaining.saturating_add(d.remaining),
                reset: sum.reset.max(d.reset),
                ..sum
            },
        )
    }
}

/// The answer for a whole transaction: allowed only if every limit allows,
/// and then every limit consumed; otherwise none did.
///
/// ```
/// use sluice_core::{Decision, Outcome};
/// let deny = Decision { allowed: false, capacity: 1.0, remaining: 0, retry_after: Some(2.0), reset: 2.0 };
/// let ok = Decision { allowed: true, capacity: 5.0, remaining: 4, retry_after: None, reset: 0.2 };
/// let o = Outcome::from_decisions([ok, deny].into_iter().collect());
/// assert!(!o.allowed);
/// assert_eq!(o.retry_after(), Some(2.0));
/// assert_eq!(o.deciding(), Some(1));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// True when every limit allowed.
    pub allowed: bool,
    /// One decision per operation, in the order given.
    pub decisions: SmallVec<[Decision; 2]>,
}

impl Outcome {
    /// Builds an outcome; it is allowed only if every decision is.
    pub fn from_decisions(decisions: SmallVec<[Decision; 2]>) -> Outcome {
        Outcome {
            allowed: decisions.iter().all(|d| d.allowed),
            decisions,
        }
    }

    /// The largest `retry_after` of the transaction, if any.
    pub fn retry_after(&self) -> Option<f64> {
        self.decisions
            .iter()
            .filter_map(|d| d.retry_after)
            .reduce(f64::max)
    }

    /// The index of the decision that speaks for the transaction: the
    /// denying one with the largest `retry_after`, or else the allowing one
    /// with the fewest tokens remaining (the most restrictive).
    pub fn deciding(&self) -> Option<usize> {
        if self.allowed {
            (0..self.decisions.len()).min_by(|&a, &b| {
                let (da, db) = (&self.decisions[a], &self.decisions[b]);
                da.remaining
                    .cmp(&db.remaining)
                    .then(da.capacity.total_cmp(&db.capacity))
            })
        } else {
            (0..self.decisions.len())
                .filter(|&i| !self.decisions[i].allowed)
                .max_by(|&a, &b| {
                    let wait = |i: usize| self.decisions[i].retry_after.unwrap_or(0.0);
                    // Ties go to the earlier operation: max_by keeps the last maximum.
                    wait(a).total_cmp(&wait(b)).then(b.cmp(&a))
                })
        }
    }
}

/// The current state of one key, as [`Store::value`](crate::Store::value)
/// reports it.
///
/// ```
/// use sluice_core::{Nanos, Value};
/// let v = Value { tokens: 3.5, ts: Nanos(0) };
/// assert_eq!(v.tokens, 3.5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Value {
    /// Tokens available now (negative while reservations are outstanding).
    pub tokens: f64,
    /// The state's time: the last update for a token bucket, the current
    /// window's start for a fixed window.
    pub ts: Nanos,
}
