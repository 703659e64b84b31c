//! The [`Store`] trait: where limit states live, and the one call that decides
//! a whole transaction.
//!
//! One call carries every operation of a transaction so that a remote store
//! (Redis) can decide it in a single round trip, atomically.

use std::future::Future;

use crate::config::{Algorithm, Limit};
use crate::decision::{Decision, Outcome, Value};

/// Why a cost was refused before any state was touched.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CostError {
    /// Costs must be finite and ≥ 0 (0 is a check).
    #[error("cost must be a finite number >= 0, got {}", Num(*.0))]
    Invalid(f64),
    /// The cost exceeds the most a call may ask of the limit (see
    /// [`Algorithm::max_cost`](crate::Algorithm::max_cost)).
    #[error(
        "cost {} can never succeed on limit {limit:?}: the most a call may ask for is {} \
         ({bound})", Num(*cost), Num(*max)
    )]
    Impossible {
        /// The limit's name.
        limit: String,
        /// The cost asked for.
        cost: f64,
        /// Capacity plus what may be reserved (see
        /// [`Algorithm::reservable`](crate::Algorithm::reservable)).
        max: f64,
        /// What `max` is, in the limit's own terms: a concurrency limit's
        /// slots, a sliding algorithm's rate, or a bucket's or window's
        /// capacity and what it may reserve.
        bound: &'static str,
    },
    /// A call on a concurrency limit takes whole slots.
    #[error(
        "limit {limit:?} counts calls in flight in whole slots: a count of {} is not one",
        Num(*cost)
    )]
    Slots {
        /// The limit's name.
        limit: String,
        /// The count asked for.
        cost: f64,
    },
    /// A concurrency limit's slots come back when their leases are
    /// released, not by settling.
    #[error(
        "limit {limit:?} counts calls in flight: release a lease to give its slots back, \
         rather than refund or force a charge"
    )]
    Unsettleable {
        /// The limit's name.
        limit: String,
    },
    /// A refund or a forced charge of more tokens than can be counted
    /// exactly.
    #[error("a refund or a forced charge must be at most 2^53 tokens, got {}", Num(*.0))]
    TooLarge(f64),
    /// The call reserves, and the limit's algorithm takes no reservations
    /// (the sliding window and the sliding log).
    #[error(
        "limit {limit:?} is a {algorithm}, which takes no reservations: call it without reserving"
    )]
    NoReservations {
        /// The limit's name.
        limit: String,
        /// The algorithm's name, as a policy file writes it.
        algorithm: &'static str,
    },
}

/// A number as an error quotes it: as written in full up to 16 digits, and
/// in scientific notation beyond (a cost of 10^300 is `1e300`, not three
/// hundred digits a client can make a server echo back).
///
/// ```
/// use sluice_core::{CostError};
/// assert_eq!(CostError::Invalid(-1e300).to_string(), "cost must be a finite number >= 0, got -1e300");
/// assert_eq!(CostError::Invalid(-2.5).to_string(), "cost must be a finite number >= 0, got -2.5");
/// ```
struct Num(f64);

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let x = self.0;
        if x != 0.0 && x.is_finite() && !(1e-6..1e16).contains(&x.abs()) {
            write!(f, "{x:e}")
        } else {
            write!(f, "{x}")
        }
    }
}

/// A change to a key made once the real cost of a call is known: see
/// [`Store::settle`].
///
/// ```
/// use sluice_core::{Limit, Settle, TokenBucket};
/// let llm = Limit::new("llm", TokenBucket::new(1000.0, 1000.0).unwrap());
/// assert!(Settle::Refund(600.0).validate(&llm).is_ok());
/// assert!(Settle::Charge(f64::NAN).validate(&llm).is_err());
/// assert!(Settle::Charge(1e300).validate(&llm).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Settle {
    /// Give back this many tokens, never filling the key above its
    /// capacity: a call that cost less than it took.
    Refund(f64),
    /// Take this many tokens whatever the key holds, down below zero if
    /// need be: a call that cost more than it took. The debt is repaid by
    /// refill, and until it is, calls are denied. A token bucket or fixed
    /// window goes no deeper than [`Algorithm::deepest_debt`], a year of
    /// refill.
    ///
    /// [`Algorithm::deepest_debt`]: crate::Algorithm::deepest_debt
    Charge(f64),
    /// [`Settle::Charge`], unless the key is in debt already (below zero,
    /// or counting more than its rate), when it changes nothing: however
    /// many of these land at once, the key pays once. What starts a
    /// penalty, which a denial during it must not lengthen.
    ChargeOnce(f64),
}

impl Settle {
    /// The tokens given back or taken.
    #[inline]
    pub fn amount(self) -> f64 {
        match self {
            Settle::Refund(n) | Settle::Charge(n) | Settle::ChargeOnce(n) => n,
        }
    }

    /// The same change, split evenly over `shards` hot-key shards.
    #[inline]
    pub fn per_shard(self, shards: u32) -> Settle {
        let n = f64::from(shards.max(1));
        match self {
            Settle::Refund(x) => Settle::Refund(x / n),
            Settle::Charge(x) => Settle::Charge(x / n),
            Settle::ChargeOnce(x) => Settle::ChargeOnce(x / n),
        }
    }

    /// Checks the amount (finite, ≥ 0, and at most
    /// [`MAX_EXACT_TOKENS`](crate::MAX_EXACT_TOKENS), so that the key's
    /// tokens stay exact) and that `limit` counts tokens: a concurrency
    /// limit's slots come back by releasing leases.
    pub fn validate(self, limit: &Limit) -> Result<(), CostError> {
        if limit.takes_leases() {
            return Err(CostError::Unsettleable {
                limit: limit.name().to_owned(),
            });
        }
        let n = self.amount();
        if !(n.is_finite() && n >= 0.0) {
            return Err(CostError::Invalid(n));
        }
        if n > crate::MAX_EXACT_TOKENS {
            return Err(CostError::TooLarge(n));
        }
        Ok(())
    }
}

/// Why a store could not decide.
///
/// A denial is not an error: it is an [`Outcome`] with `allowed == false`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The request itself was bad; retrying will not help.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// The backend failed or is unreachable.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend did not answer in time.
    #[error("store timed out")]
    Timeout,
}

/// How a transaction treats the states it reads.
///
/// ```
/// use sluice_core::Mode;
/// assert!(Mode::CONSUME.consume && !Mode::CONSUME.reserve);
/// assert!(!Mode::CHECK.consume);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Commit the new states when every limit allows. `false` is a check.
    pub consume: bool,
    /// Allow going below zero, within `max_reserved`, with a delay.
    pub reserve: bool,
}

impl Mode {
    /// Take the tokens if every limit has them.
    pub const CONSUME: Mode = Mode {
        consume: true,
        reserve: false,
    };
    /// Take the tokens, reserving future ones if needed.
    pub const RESERVE: Mode = Mode {
        consume: true,
        reserve: true,
    };
    /// Say what `CONSUME` would say, changing nothing.
    pub const CHECK: Mode = Mode {
        consume: false,
        reserve: false,
    };
}

/// The ids a lease may take: nonzero (a forgotten key brought back holds
/// its slots under 0, for no one to release) and below 2⁵³, so that a
/// double holds each exactly (the Redis store keeps leases in doubles).
///
/// ```
/// use sluice_core::{Concurrency, LEASE_IDS, Limit, Nanos, Op};
/// let limit = Limit::new("uploads", Concurrency::new(2.0, Nanos(60)).unwrap());
/// assert!(LEASE_IDS.contains(&Op::new(&limit, "k", 1.0).lease));
/// ```
pub const LEASE_IDS: std::ops::Range<u64> = 1..1 << 53;

/// A lease id no one can guess from the ids handed out before it: whoever
/// holds an id can release its slots, and a server answers ids to callers
/// who may not be friends. So it comes from the operating system's
/// generator, not from a fast one whose output gives its state away. Only
/// if that fails (no such generator on the platform) does it fall back.
fn new_lease_id() -> u64 {
    let bits = getrandom::u64().unwrap_or_else(|_| fastrand::u64(..));
    // The top 53 bits, so that a double holds the id exactly; 0 is no lease.
    (bits >> 11).max(LEASE_IDS.start)
}

/// One limit, one key, one cost: a member of a transaction.
///
/// ```
/// use sluice_core::{Limit, Op, TokenBucket};
/// let limit = Limit::new("api", TokenBucket::new(1.0, 1.0).unwrap());
/// let op = Op::new(&limit, "user-1", 1.0);
/// assert_eq!(op.key, "user-1");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Op<'a> {
    /// The limit to apply.
    pub limit: &'a Limit,
    /// The key within the limit (a user, an IP, a composite).
    pub key: &'a str,
    /// Tokens to take.
    pub cost: f64,
    /// Random bits choosing the two candidate shards of a sharded limit.
    pub pick: u64,
    /// The id of the lease a call on a concurrency limit takes, with which
    /// it releases its slots (see [`Store::release`]); 0 for the others.
    pub lease: u64,
}

impl<'a> Op<'a> {
    /// An operation with fresh random shard choices.
    #[inline]
    pub fn new(limit: &'a Limit, key: &'a str, cost: f64) -> Op<'a> {
        let pick = if limit.shards() > 1 {
            fastrand::u64(..)
        } else {
            0
        };
        let lease = if limit.takes_leases() {
            new_lease_id()
        } else {
            0
        };
        Op {
            limit,
            key,
            cost,
            pick,
            lease,
        }
    }

    /// The same operation with chosen shard bits, for reproducible runs.
    pub fn with_pick(self, pick: u64) -> Op<'a> {
        Op { pick, ..self }
    }

    /// The same operation taking the lease `id` (nonzero, below 2⁵³; an id
    /// of 0 could never be released), for reproducible runs; only a
    /// concurrency limit takes one.
    ///
    /// ```
    /// use sluice_core::{Concurrency, Limit, Nanos, Op};
    /// let limit = Limit::new("uploads", Concurrency::new(2.0, Nanos(60 * Nanos::PER_SEC)).unwrap());
    /// assert_eq!(Op::new(&limit, "k", 1.0).with_lease(9).lease, 9);
    /// ```
    pub fn with_lease(self, id: u64) -> Op<'a> {
        Op { lease: id, ..self }
    }

    /// The two candidate shards (equal when the limit has one shard).
    ///
    /// ```
    /// use sluice_core::{Limit, Op, TokenBucket};
    /// let limit = Limit::new("api", TokenBucket::new(4.0, 4.0).unwrap()).with_shards(4).unwrap();
    /// let (a, b) = Op::new(&limit, "k", 1.0).with_pick(7).shards();
    /// assert!(a != b && a < 4 && b < 4);
    /// ```
    #[inline]
    pub fn shards(&self) -> (u32, u32) {
        let n = u64::from(self.limit.shards());
        if n <= 1 {
            return (0, 0);
        }
        let a = self.pick % n;
        let b = (a + 1 + (self.pick >> 32) % (n - 1)) % n;
        // Both are below n, which is a u32.
        (a as u32, b as u32)
    }

    /// Checks the cost against the limit, so that bad input is an error and
    /// never a silent denial.
    ///
    /// ```
    /// use sluice_core::{Limit, Op, TokenBucket, CostError};
    /// let limit = Limit::new("api", TokenBucket::new(1.0, 5.0).unwrap());
    /// assert!(Op::new(&limit, "k", 5.0).validate(false).is_ok());
    /// assert!(matches!(Op::new(&limit, "k", 6.0).validate(false), Err(CostError::Impossible { .. })));
    /// assert!(matches!(Op::new(&limit, "k", -1.0).validate(false), Err(CostError::Invalid(_))));
    /// ```
    ///
    /// A sliding algorithm takes no reservations:
    ///
    /// ```
    /// use sluice_core::{CostError, Limit, Nanos, Op, SlidingLog};
    /// let limit = Limit::new("api", SlidingLog::per_period(5.0, Nanos(1)).unwrap());
    /// assert!(Op::new(&limit, "k", 5.0).validate(false).is_ok());
    /// assert!(matches!(Op::new(&limit, "k", 1.0).validate(true), Err(CostError::NoReservations { .. })));
    /// ```
    #[inline]
    pub fn validate(&self, reserve: bool) -> Result<(), CostError> {
        let max = self.limit.max_cost(reserve);
        // One test for the common case; NaN fails every comparison, and
        // `max` is finite (at most `MAX_EXACT_TOKENS`), which rules out ∞.
        if self.cost >= 0.0
            && self.cost <= max
            && (!reserve || self.limit.is_flat())
            // A whole number survives the round trip through an integer;
            // the cost is at most 2⁵³ here, so the cast is exact for one.
            // (`fract` is a library call on the baseline target, which the
            // compiler makes on every call.)
            && (!self.limit.takes_leases() || (self.cost as u64) as f64 == self.cost)
        {
            return Ok(());
        }
        Err(self.invalid(max, reserve))
    }

    #[cold]
    fn invalid(&self, max: f64, reserve: bool) -> CostError {
        let alg = self.limit.shard_algorithm();
        if reserve && !alg.reserves() {
            CostError::NoReservations {
                limit: self.limit.name().to_owned(),
                algorithm: alg.name(),
            }
        } else if self.limit.takes_leases() && self.cost.is_finite() && self.cost.fract() != 0.0 {
            CostError::Slots {
                limit: self.limit.name().to_owned(),
                cost: self.cost,
            }
        } else if !(self.cost.is_finite() && self.cost >= 0.0) {
            CostError::Invalid(self.cost)
        } else {
            CostError::Impossible {
                limit: self.limit.name().to_owned(),
                cost: self.cost,
                max,
                bound: match alg {
                    Algorithm::Concurrency(_) => "the slots a key has",
                    Algorithm::SlidingWindow(_) | Algorithm::SlidingLog(_) => "the rate",
                    Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_) => {
                        "the capacity, plus max_reserved or at most a year of refill when \
                         reserving"
                    }
                },
            }
        }
    }
}

/// Refuses a transaction that names one limit with algorithms whose states
/// are of different kinds (two handles of one name configured
/// differently): they could not share a key's state. Only a sliding
/// algorithm or a concurrency limit can make that matter, so a transaction
/// without one is not looked at.
pub(crate) fn same_kind_per_name(ops: &[Op<'_>]) -> Result<(), StoreError> {
    if ops.iter().all(|op| op.limit.is_flat()) {
        return Ok(());
    }
    for (i, a) in ops.iter().enumerate() {
        let (alg_a, name) = (a.limit.shard_algorithm(), a.limit.name());
        if let Some(b) = ops[i + 1..]
            .iter()
            .find(|b| b.limit.name() == name && !b.limit.shard_algorithm().keeps_states_like(alg_a))
        {
            return Err(StoreError::Unavailable(format!(
                "limit {name:?} appears in one transaction as both a {} and a {}",
                alg_a.name(),
                b.limit.shard_algorithm().name()
            )));
        }
    }
    Ok(())
}

/// Where limit states live.
///
/// Implementations decide a whole transaction atomically: either every
/// operation's limit allows and (unless checking) every one consumes, or
/// none changes.
///
/// ```
/// use sluice_core::{FakeClock, Limit, MemoryStore, Mode, Op, Store, TokenBucket};
/// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     match f.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
/// #         std::task::Poll::Ready(v) => v,
/// #         std::task::Poll::Pending => unreachable!(),
/// #     }
/// # }
/// let store = MemoryStore::with_clock(FakeClock::default());
/// let limit = Limit::new("api", TokenBucket::new(1.0, 1.0).unwrap());
/// let d = block_on(store.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME)).unwrap();
/// assert!(d.allowed);
/// let d = block_on(store.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME)).unwrap();
/// assert!(!d.allowed);
/// ```
pub trait Store: Send + Sync {
    /// Decides every operation as one transaction.
    fn transact(
        &self,
        ops: &[Op<'_>],
        mode: Mode,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// Restores a key to full.
    fn reset(
        &self,
        limit: &Limit,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The key's current tokens and time (summed over shards).
    fn value(
        &self,
        limit: &Limit,
        key: &str,
    ) -> impl Future<Output = Result<Value, StoreError>> + Send;

    /// Settles a call whose real cost is known only now: gives tokens back
    /// to `key`, or takes them even below zero (see [`Settle`]). A sharded
    /// limit spreads the change evenly over its shards. Returns the key as
    /// it stands afterwards, as an allowed decision.
    ///
    /// A refund adds tokens faster than time does, so a store that caches
    /// denials forgets what it knew of the key, as after a reset.
    fn settle(
        &self,
        limit: &Limit,
        key: &str,
        change: Settle,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Releases lease `id` of `key` on the concurrency limit `limit`,
    /// giving back the slots the call that took it held. Returns whether
    /// the lease was still held: releasing one that is unknown, expired or
    /// already released changes nothing, and neither does releasing on
    /// another kind of limit, which holds no leases.
    fn release(
        &self,
        limit: &Limit,
        key: &str,
        id: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Decides a single operation.
    fn decide(
        &self,
        op: Op<'_>,
        mode: Mode,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        async move {
            let outcome = self.transact(std::slice::from_ref(&op), mode).await?;
            outcome
                .decisions
                .first()
                .copied()
                .ok_or_else(|| StoreError::Unavailable("store returned no decision".into()))
        }
    }
}

/// What a rule or limit does when its store fails or misses its deadline
/// (`on_store_error` in a policy file).
///
/// ```
/// use sluice_core::{Limit, Op, OnStoreError, TokenBucket};
/// let limit = Limit::new("api", TokenBucket::new(1.0, 5.0).unwrap());
/// let ops = [Op::new(&limit, "k", 1.0)];
/// assert!(OnStoreError::Open.outcome(&ops).allowed);
/// let closed = OnStoreError::Closed.outcome(&ops);
/// assert!(!closed.allowed);
/// assert_eq!(closed.decisions[0].capacity, 5.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum OnStoreError {
    /// Allow the request: availability over enforcement.
    #[default]
    Open,
    /// Deny the request: enforcement over availability.
    Closed,
}

impl OnStoreError {
    /// The outcome to report for `ops` when the store could not decide. The
    /// state is unknown, so `remaining` is 0 and there is no retry time.
    pub fn outcome(self, ops: &[Op<'_>]) -> Outcome {
        let allowed = self == OnStoreError::Open;
        Outcome {
            allowed,
            decisions: ops
                .iter()
                .map(|op| Decision {
                    allowed,
                    capacity: op.limit.algorithm().capacity(),
                    remaining: 0,
                    retry_after: None,
                    reset: 0.0,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_whole_doubles_never_zero_and_never_repeat() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(|_| new_lease_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|id| LEASE_IDS.contains(id)));
        // Drawn from all 53 bits, not a narrow range.
        assert!(ids.iter().any(|&id| id > 1 << 52));
    }
}
