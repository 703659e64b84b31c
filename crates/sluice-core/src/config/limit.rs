//! [`Limit`]: a name and an algorithm, shards applied, with what every
//! call asks of it worked out once.

use std::fmt;
use std::sync::Arc;

use super::{Algorithm, LimitError};

struct LimitInner {
    name: Arc<str>,
    /// A hash of `name`, so a store can tell limits apart without comparing strings.
    name_tag: u64,
    algorithm: Algorithm,
    shards: u32,
    shard_algorithm: Algorithm,
    facts: Facts,
}

/// What every call asks of a limit's shard algorithm, worked out once: each
/// would otherwise be a match on the algorithm, on the hot path.
#[derive(Clone, Copy)]
struct Facts {
    capacity: f64,
    /// [`Algorithm::max_cost`] without and with reserving.
    max_cost: [f64; 2],
    flat: bool,
    /// Whether calls take leases (a concurrency limit).
    leases: bool,
    /// The period of windows aligned per key (no `start`), whose offset is
    /// a hash of the key modulo it.
    own_windows: Option<i64>,
}

impl Facts {
    fn of(alg: &Algorithm) -> Facts {
        let own_windows = match alg {
            Algorithm::FixedWindow(fw) if fw.start().is_none() && fw.calendar.is_none() => {
                Some(fw.period.0)
            }
            Algorithm::SlidingWindow(sw) if sw.start.is_none() => Some(sw.period.0),
            _ => None,
        };
        Facts {
            capacity: alg.capacity(),
            max_cost: [alg.max_cost(false), alg.max_cost(true)],
            flat: alg.is_flat(),
            leases: matches!(alg, Algorithm::Concurrency(_)),
            own_windows,
        }
    }
}

/// A named limit. Cloning is cheap; stores keep one state per (limit name, key).
///
/// ```
/// use sluice_core::{Limit, TokenBucket};
/// let limit = Limit::new("sendMessage", TokenBucket::new(10.0 / 60.0, 20.0).unwrap());
/// assert_eq!(limit.name(), "sendMessage");
/// let hot = limit.with_shards(4).unwrap();
/// assert_eq!(hot.shard_algorithm().capacity(), 5.0);
/// ```
#[derive(Clone)]
pub struct Limit {
    inner: Arc<LimitInner>,
}

impl Limit {
    /// Creates a limit with one shard.
    pub fn new(name: impl Into<Arc<str>>, algorithm: impl Into<Algorithm>) -> Limit {
        let algorithm = algorithm.into();
        let name: Arc<str> = name.into();
        Limit {
            inner: Arc::new(LimitInner {
                name_tag: std::hash::BuildHasher::hash_one(
                    &std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default(),
                    &*name,
                ),
                name,
                algorithm,
                shards: 1,
                shard_algorithm: algorithm,
                facts: Facts::of(&algorithm),
            }),
        }
    }

    /// Splits a hot key into `n` shards, each with 1/n of the rate, capacity
    /// and `max_reserved`; each call uses the fuller of two random shards.
    pub fn with_shards(&self, n: u32) -> Result<Limit, LimitError> {
        if n == 0 {
            return Err(LimitError::Shards);
        }
        let shard_algorithm = self.inner.algorithm.split(n);
        Ok(Limit {
            inner: Arc::new(LimitInner {
                name: self.inner.name.clone(),
                name_tag: self.inner.name_tag,
                algorithm: self.inner.algorithm,
                shards: n,
                shard_algorithm,
                facts: Facts::of(&shard_algorithm),
            }),
        })
    }

    /// Whether two handles are clones of one limit (and so configured alike).
    #[inline]
    pub(crate) fn same(&self, other: &Limit) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A hash of the name, equal for every handle of the same name.
    #[inline]
    pub(crate) fn name_tag(&self) -> u64 {
        self.inner.name_tag
    }

    /// The limit's name, which namespaces its keys in a store.
    #[inline]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The configured algorithm, before any sharding.
    #[inline]
    pub fn algorithm(&self) -> &Algorithm {
        &self.inner.algorithm
    }

    /// The number of shards each key is split into.
    #[inline]
    pub fn shards(&self) -> u32 {
        self.inner.shards
    }

    /// The algorithm each shard runs: [`Limit::algorithm`] divided by the
    /// number of shards.
    #[inline]
    pub fn shard_algorithm(&self) -> &Algorithm {
        &self.inner.shard_algorithm
    }

    /// [`Algorithm::capacity`] of the shard algorithm.
    #[inline]
    pub(crate) fn shard_capacity(&self) -> f64 {
        self.inner.facts.capacity
    }

    /// [`Algorithm::max_cost`] of the shard algorithm.
    #[inline]
    pub(crate) fn max_cost(&self, reserve: bool) -> f64 {
        self.inner.facts.max_cost[usize::from(reserve)]
    }

    /// Whether the shard algorithm keeps two numbers a key (see
    /// [`Algorithm::is_flat`]).
    #[inline]
    pub(crate) fn is_flat(&self) -> bool {
        self.inner.facts.flat
    }

    /// Whether calls take leases: a concurrency limit.
    #[inline]
    pub fn takes_leases(&self) -> bool {
        self.inner.facts.leases
    }

    /// The period of the shard algorithm's windows when each key has its
    /// own phase (windows without a `start`).
    #[inline]
    pub(crate) fn own_windows(&self) -> Option<i64> {
        self.inner.facts.own_windows
    }
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.inner.name)
            .field("algorithm", &self.inner.algorithm)
            .field("shards", &self.inner.shards)
            .finish()
    }
}
