//! The embedded store: states in lock-striped flat tables, one small lock per
//! stripe, memory bounded by dropping full buckets and by a key cap.
//!
//! A key is held as a 64-bit fingerprint from SipHash-1-3 under a random
//! per-store key, next to its two numbers: 24 bytes an entry (see `flat`).
//! The sliding algorithms' states, which need more, live in maps of their own
//! beside the flat entries, under the same lock (see `sliding`). Keys of
//! different limits live in different tables, so two keys can only share
//! state if they belong to the same limit and their fingerprints collide
//! (chance about n²/2⁶⁵ for n live keys, and no one who doesn't know the
//! secret key can aim for it); sharing a bucket only ever admits less.
//!
//! This file is the store's face: [`MemoryStore`], its settings, its calls
//! on one key, and the [`Store`] trait. The rooms behind it, from the
//! outside in: `lane` (a stripe's lock, hot slots and share of the cap),
//! `stripe` (the tables under one lock, and the cap's work), `table` (one
//! limit's keys in a stripe), `flat`, `sliding`, `hot` and `ghosts` (what a
//! table keeps), and `transaction` (many operations at once, in phases).

use std::future::{Ready, ready};
use std::hash::{BuildHasher, Hasher, RandomState};

use smallvec::SmallVec;

use crate::algorithm;
use crate::config::{Algorithm, Limit};
use crate::decision::{Decision, Outcome, Value};
use crate::store::{Mode, Op, Settle, Store, StoreError};
use crate::time::{Clock, Nanos, SystemClock};

mod flat;
mod ghosts;
mod hot;
mod lane;
mod sliding;
mod stripe;
mod table;
mod transaction;

use flat::{Probe, nonzero};
use lane::{Lane, Padded, hint_tag};
use sliding::Kind;
use stripe::Stripe;

/// Lock stripes per core. Threads deciding different keys meet on a stripe
/// seldom with many stripes, and then neither waits for the other's lock
/// nor pulls the stripe's lock and table lines from the other's cache.
const STRIPES_PER_CORE: usize = 256;

/// The most stripes a store takes, however many cores: each costs up to half
/// a kilobyte, taken when the store is made.
const MAX_STRIPES: usize = 4096;

/// The in-memory [`Store`]: concurrent, exact, and bounded.
///
/// ```
/// use sluice_core::{FakeClock, Limit, MemoryStore, Mode, Op, TokenBucket};
/// let clock = FakeClock::default();
/// let store = MemoryStore::with_clock(clock.clone()).with_max_keys(1_000_000);
/// let limit = Limit::new("api", TokenBucket::new(1.0, 2.0).unwrap());
/// let out = store.transact_now(&[Op::new(&limit, "alice", 2.0)], Mode::CONSUME).unwrap();
/// assert!(out.allowed);
/// let out = store.transact_now(&[Op::new(&limit, "alice", 1.0)], Mode::CONSUME).unwrap();
/// assert_eq!(out.retry_after(), Some(1.0));
/// ```
pub struct MemoryStore<C = SystemClock> {
    clock: C,
    hasher: RandomState,
    stripes: Box<[Padded<Lane>]>,
    stripe_bits: u32,
    /// The key cap, `usize::MAX` for none; each stripe holds its share.
    max_keys: usize,
    heat_all: bool,
}

impl MemoryStore<SystemClock> {
    /// A store on the system clock, with no key cap.
    pub fn new() -> Self {
        Self::with_clock(SystemClock::new())
    }
}

impl Default for MemoryStore<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryStore<C> {
    /// A store reading time from `clock`, with no key cap.
    pub fn with_clock(clock: C) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        MemoryStore {
            clock,
            hasher: RandomState::new(),
            stripes: Box::default(),
            stripe_bits: 0,
            max_keys: usize::MAX,
            heat_all: false,
        }
        .with_stripes((cores * STRIPES_PER_CORE).min(MAX_STRIPES))
    }

    /// Caps the number of keys held. The cap is split across the lock
    /// stripes, as evenly as whole keys allow and at least one key a stripe,
    /// so that a cap below the number of stripes holds one key a stripe. When
    /// a stripe is full, the buckets nearest to full are dropped first.
    ///
    /// A dropped key never comes back fuller than it was, so a flood of
    /// more distinct keys than the cap can hold keys never seen back until
    /// the flood's own keys would have refilled, or, on a concurrency
    /// limit, until their leases end: size the cap for the keys that hold
    /// state within one refill or one lease (`docs/memory-store.md`, "The
    /// trade-off").
    ///
    /// ```
    /// use sluice_core::{FakeClock, Limit, MemoryStore, Mode, Nanos, Op, TokenBucket};
    /// let store = MemoryStore::with_clock(FakeClock::new(Nanos::ZERO)).with_max_keys(10_000);
    /// let limit = Limit::new("api", TokenBucket::new(0.001, 2.0).unwrap());
    /// for i in 0..50_000 {
    ///     store.decide_now(Op::new(&limit, &format!("k{i}"), 1.0), Mode::CONSUME).unwrap();
    /// }
    /// assert!(store.len() <= 10_000);
    /// ```
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self.split_cap();
        self
    }

    /// Uses `n` lock stripes (rounded up to a power of two) instead of 256
    /// a core, keeping the key cap. It exists so that tests whose keys must
    /// crowd a few stripes do so whatever the machine; call it before the
    /// store decides anything, as it starts the stripes afresh.
    ///
    /// ```
    /// use sluice_core::MemoryStore;
    /// let store = MemoryStore::new().with_stripes(64).with_max_keys(200);
    /// assert!(store.is_empty());
    /// ```
    #[doc(hidden)]
    pub fn with_stripes(mut self, n: usize) -> Self {
        let n = n.max(1).next_power_of_two();
        self.stripes = (0..n).map(|_| Padded(Lane::default())).collect();
        self.stripe_bits = n.trailing_zeros();
        self.split_cap();
        self
    }

    /// Gives each stripe its share of the key cap: whole keys that differ by
    /// one at most and add up to the cap, but at least one.
    fn split_cap(&mut self) {
        if self.max_keys == usize::MAX {
            return;
        }
        let (share, extra) = (
            self.max_keys >> self.stripe_bits,
            self.max_keys & ((1 << self.stripe_bits) - 1),
        );
        for (i, lane) in self.stripes.iter_mut().enumerate() {
            lane.0.cap = (share + usize::from(i < extra)).max(1);
        }
    }

    /// Moves every key written under a lock into a hot slot, instead of only
    /// the contended, the denied and those that find their slot free. Slower
    /// with many keys; it exists so that tests can drive keys in and out of
    /// the lock-free slots from one thread.
    ///
    /// ```
    /// use sluice_core::{Limit, MemoryStore, Mode, Op, TokenBucket};
    /// let store = MemoryStore::new().with_all_keys_hot();
    /// let limit = Limit::new("api", TokenBucket::new(1.0, 2.0).unwrap());
    /// assert!(store.decide_now(Op::new(&limit, "k", 1.0), Mode::CONSUME).unwrap().allowed);
    /// assert!(store.decide_now(Op::new(&limit, "k", 1.0), Mode::CONSUME).unwrap().allowed);
    /// assert!(!store.decide_now(Op::new(&limit, "k", 1.0), Mode::CONSUME).unwrap().allowed);
    /// assert_eq!(store.len(), 1);
    /// ```
    #[doc(hidden)]
    pub fn with_all_keys_hot(mut self) -> Self {
        self.heat_all = true;
        self
    }

    /// The clock the store reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The number of keys held. Full buckets are not held.
    ///
    /// ```
    /// use sluice_core::{Limit, MemoryStore, Mode, Op, TokenBucket};
    /// let store = MemoryStore::new();
    /// let limit = Limit::new("api", TokenBucket::new(1.0, 2.0).unwrap());
    /// store.transact_now(&[Op::new(&limit, "a", 1.0)], Mode::CONSUME).unwrap();
    /// assert_eq!(store.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.stripes
            .iter()
            .map(|s| {
                let mut stripe = s.0.lock.lock();
                // A hot key that filled up is still in its table until now.
                s.0.flush(&mut stripe);
                stripe.len
            })
            .sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    fn fingerprint(&self, key: &str, shard: u32) -> u64 {
        // The key's bytes alone: `str`'s `Hash` also writes a terminator, for
        // values hashed one after another, which one key does not need.
        let mut hasher = self.hasher.build_hasher();
        hasher.write(key.as_bytes());
        let h = hasher.finish();
        nonzero(if shard == 0 {
            h
        } else {
            // Distinct hot-key shards of one key must not collide with each other.
            h ^ splitmix64(u64::from(shard))
        })
    }

    #[inline]
    fn lock_index(&self, fp: u64) -> usize {
        // Middle bits: a table places entries by its low bits, which should
        // stay well spread within a stripe.
        ((fp >> 32) & ((1 << self.stripe_bits) - 1)) as usize
    }

    /// Decides a transaction now. This is the whole of the store; the
    /// [`Store`] methods wrap it in a ready future.
    pub fn transact_now(&self, ops: &[Op<'_>], mode: Mode) -> Result<Outcome, StoreError> {
        match ops {
            [op] if op.limit.shards() == 1 => {
                let d = self.single(op, mode)?;
                Ok(Outcome {
                    allowed: d.allowed,
                    decisions: smallvec::smallvec![d],
                })
            }
            _ => self.transaction(ops, mode),
        }
    }

    /// Decides one operation now: what [`Store::decide`] answers.
    ///
    /// ```
    /// use sluice_core::{Limit, MemoryStore, Mode, Op, TokenBucket};
    /// let store = MemoryStore::new();
    /// let limit = Limit::new("api", TokenBucket::new(1.0, 1.0).unwrap());
    /// assert!(store.decide_now(Op::new(&limit, "k", 1.0), Mode::CONSUME).unwrap().allowed);
    /// assert!(!store.decide_now(Op::new(&limit, "k", 1.0), Mode::CONSUME).unwrap().allowed);
    /// ```
    pub fn decide_now(&self, op: Op<'_>, mode: Mode) -> Result<Decision, StoreError> {
        if op.limit.shards() == 1 {
            return self.single(&op, mode);
        }
        let outcome = self.transaction(std::slice::from_ref(&op), mode)?;
        outcome
            .decisions
            .first()
            .copied()
            .ok_or_else(|| StoreError::Unavailable("no decision".into()))
    }

    /// The common case, one unsharded limit: one lock, one probe.
    fn single(&self, op: &Op<'_>, mode: Mode) -> Result<Decision, StoreError> {
        op.validate(mode.reserve)?;
        let alg = op.limit.shard_algorithm();
        let offset = algorithm::limit_key_offset(op.limit, op.key);
        let fp = self.fingerprint(op.key, 0);
        // Read before the lock to keep the critical section short. A thread
        // that read an earlier time and locks later sees a state from its
        // future, which the algorithms treat as no time elapsed.
        let now = self.clock.now();
        let lane = &self.stripes[self.lock_index(fp)].0;
        if !op.limit.is_flat() {
            return Ok(self.sliding_single(op, mode, lane, fp, (offset, now)));
        }
        let tag = hint_tag(fp, op.limit);
        let step = |s| {
            let p = algorithm::prepare(alg, Some(s), offset, now, op.cost, mode.reserve);
            (p.next(), move || p.decision(alg, now))
        };
        let cap = op.limit.shard_capacity();
        if let Some(d) = lane.hot.decide(tag, cap, mode.consume, step) {
            return Ok(d);
        }
        Ok(self.single_locked(op, mode, lane, (fp, tag), (alg, offset, now)))
    }

    /// [`MemoryStore::single`] for a key without a hot slot: under the
    /// stripe lock. Kept out of line so that the lock-free path stays small.
    #[inline(never)]
    fn single_locked(
        &self,
        op: &Op<'_>,
        mode: Mode,
        lane: &Lane,
        (fp, tag): (u64, u64),
        (alg, offset, now): (&Algorithm, i64, Nanos),
    ) -> Decision {
        let step = |s| {
            let p = algorithm::prepare(alg, Some(s), offset, now, op.cost, mode.reserve);
            (p.next(), move || p.decision(alg, now))
        };
        let cap = op.limit.shard_capacity();
        let (mut guard, contended) = match lane.lock.try_lock() {
            Some(g) => (g, false),
            None => (lane.lock.lock(), true),
        };
        // Another thread may have moved the key into a slot meanwhile; while
        // the lock is held, none can move it out (or in: a plain look at the
        // slot's key is exact).
        if lane.hot.holds(tag)
            && let Some(d) = lane.hot.decide(tag, cap, mode.consume, step)
        {
            return d;
        }
        let stripe = &mut *guard;
        let t = stripe.table(op.limit, now, &lane.hot);
        let table = &mut stripe.tables[t];
        // One probe serves both the read and the write.
        let probe = table.entries.find(fp);
        let state = match probe {
            Probe::Found(i) => Some(table.entries.at_mut(i).state()),
            Probe::Vacant => table.forgotten(fp, offset, now),
        };
        let ev = algorithm::evaluate(alg, state, offset, now, op.cost, mode.reserve);
        let heat = match (ev.next, state) {
            (Some(next), _) if mode.consume => {
                let delta = table.put_at(probe, fp, next);
                stripe.count_write(t, delta, now);
                // A free slot costs nothing to take, and a contended lock
                // means other threads decide in this stripe right now, quite
                // likely on this very key.
                (contended || self.heat_all || lane.hot.vacant(tag)).then_some(next)
            }
            // Only a held key can be denied. A key denied again is likely to
            // be asked again soon: let the next callers decide without the
            // lock.
            (None, Some(held)) if lane.hot.vacant(tag) || stripe.denied_again(tag) => Some(held),
            _ => None,
        };
        if let Some(state) = heat {
            lane.heat(stripe, tag, (fp, t), state);
        }
        lane.maintain(stripe, now);
        ev.decision
    }

    /// [`MemoryStore::single`] for a sliding algorithm: always under the
    /// stripe lock, as the lock-free slots hold two numbers.
    #[inline(never)]
    fn sliding_single(
        &self,
        op: &Op<'_>,
        mode: Mode,
        lane: &Lane,
        fp: u64,
        (offset, now): (i64, Nanos),
    ) -> Decision {
        let alg = op.limit.shard_algorithm();
        let Some(kind) = Kind::of(alg) else {
            // Only sliding algorithms come here.
            return self.single_locked(
                op,
                mode,
                lane,
                (fp, hint_tag(fp, op.limit)),
                (alg, offset, now),
            );
        };
        let mut guard = lane.lock.lock();
        let stripe = &mut *guard;
        let t = stripe.table(op.limit, now, &lane.hot);
        let delta = stripe.tables[t].restore(kind, fp, offset, now);
        stripe.apply(delta);
        let table = &mut stripe.tables[t];
        let (decision, next) = table
            .sliding
            .evaluate(kind, fp, offset, now, None, op.cost, op.lease);
        if let (Some(next), true) = (next, mode.consume) {
            let delta = table.sliding.commit(kind, fp, next, now);
            stripe.apply(delta);
        }
        lane.maintain(stripe, now);
        decision
    }

    fn with_key_slots<R>(
        &self,
        limit: &Limit,
        key: &str,
        now: Nanos,
        mut f: impl FnMut(&Lane, &mut Stripe, usize, u64) -> R,
    ) -> SmallVec<[R; 1]> {
        (0..limit.shards())
            .map(|s| {
                let fp = self.fingerprint(key, s);
                let lane = &self.stripes[self.lock_index(fp)].0;
                let mut stripe = lane.lock.lock();
                let table = stripe.table(limit, now, &lane.hot);
                f(lane, &mut stripe, table, fp)
            })
            .collect()
    }

    /// Restores a key to full (all its hot-key shards).
    ///
    /// ```
    /// use sluice_core::{Limit, MemoryStore, Mode, Op, TokenBucket};
    /// let store = MemoryStore::new();
    /// let limit = Limit::new("api", TokenBucket::new(1.0, 1.0).unwrap());
    /// store.transact_now(&[Op::new(&limit, "a", 1.0)], Mode::CONSUME).unwrap();
    /// store.reset_now(&limit, "a");
    /// assert!(store.transact_now(&[Op::new(&limit, "a", 1.0)], Mode::CONSUME).unwrap().allowed);
    /// ```
    pub fn reset_now(&self, limit: &Limit, key: &str) {
        let now = self.clock.now();
        self.with_key_slots(limit, key, now, |lane, stripe, t, fp| {
            // The slot's state is dropped with the table's.
            lane.hot.take(hint_tag(fp, limit));
            let delta = stripe.tables[t].remove(fp, now);
            stripe.apply(delta);
        });
    }

    /// Settles a call's real cost on a key (see [`Store::settle`]): each
    /// hot-key shard gets an even part of the change.
    ///
    /// ```
    /// use sluice_core::{Limit, MemoryStore, Mode, Op, Settle, TokenBucket};
    /// let store = MemoryStore::new();
    /// let limit = Limit::new("llm", TokenBucket::new(1.0, 1000.0).unwrap());
    /// store.decide_now(Op::new(&limit, "team", 1000.0), Mode::CONSUME).unwrap();
    /// let d = store.settle_now(&limit, "team", Settle::Refund(600.0)).unwrap();
    /// assert_eq!(d.remaining, 600);
    /// ```
    pub fn settle_now(
        &self,
        limit: &Limit,
        key: &str,
        change: Settle,
    ) -> Result<Decision, StoreError> {
        change.validate(limit)?;
        let alg = *limit.shard_algorithm();
        let offset = algorithm::key_offset(&alg, key);
        let part = change.per_shard(limit.shards());
        let now = self.clock.now();
        let parts = self.with_key_slots(limit, key, now, |lane, stripe, t, fp| {
            lane.cool(stripe, hint_tag(fp, limit));
            let (d, delta) = match Kind::of(&alg) {
                None => {
                    let table = &mut stripe.tables[t];
                    let state = table.get(fp, offset, now);
                    let next = algorithm::settle(&alg, state, offset, now, part);
                    let d = algorithm::evaluate(&alg, Some(next), offset, now, 0.0, false);
                    (d.decision, table.put(fp, next))
                }
                Some(kind) => {
                    let restored = stripe.tables[t].restore(kind, fp, offset, now);
                    stripe.apply(restored);
                    stripe.tables[t].sliding.settle(kind, fp, offset, now, part)
                }
            };
            stripe.count_write(t, delta, now);
            lane.maintain(stripe, now);
            d
        });
        Ok(Decision::settled(parts))
    }

    /// Releases lease `id` of `key` on the concurrency limit `limit`,
    /// giving its slots back (see [`Store::release`]); returns whether it
    /// was still held. Any other limit holds no leases.
    ///
    /// ```
    /// use sluice_core::{Concurrency, Limit, MemoryStore, Mode, Nanos, Op};
    /// let store = MemoryStore::new();
    /// let uploads = Limit::new("uploads", Concurrency::new(1.0, Nanos(60 * Nanos::PER_SEC)).unwrap());
    /// let op = Op::new(&uploads, "alice", 1.0);
    /// assert!(store.decide_now(op, Mode::CONSUME).unwrap().allowed);
    /// assert!(!store.decide_now(Op::new(&uploads, "alice", 1.0), Mode::CONSUME).unwrap().allowed);
    /// assert!(store.release_now(&uploads, "alice", op.lease));
    /// assert!(!store.release_now(&uploads, "alice", op.lease), "only once");
    /// assert!(store.decide_now(Op::new(&uploads, "alice", 1.0), Mode::CONSUME).unwrap().allowed);
    /// ```
    pub fn release_now(&self, limit: &Limit, key: &str, id: u64) -> bool {
        let Algorithm::Concurrency(c) = *limit.shard_algorithm() else {
            return false;
        };
        // No call takes lease 0: a forgotten key brought back holds its
        // slots under it, for no one to release.
        if id == 0 {
            return false;
        }
        let now = self.clock.now();
        // The lease is in the one shard that took it.
        self.with_key_slots(limit, key, now, |_, stripe, t, fp| {
            let (released, delta) = stripe.tables[t].sliding.release(&c, fp, now, id);
            stripe.apply(delta);
            released
        })
        .contains(&true)
    }

    /// The key's tokens now, summed over its hot-key shards, and the latest time.
    ///
    /// ```
    /// use sluice_core::{Limit, MemoryStore, TokenBucket};
    /// let store = MemoryStore::new();
    /// let limit = Limit::new("api", TokenBucket::new(1.0, 3.0).unwrap());
    /// assert_eq!(store.value_now(&limit, "never-seen").tokens, 3.0);
    /// ```
    pub fn value_now(&self, limit: &Limit, key: &str) -> Value {
        let alg = *limit.shard_algorithm();
        let offset = algorithm::key_offset(&alg, key);
        let now = self.clock.now();
        let parts = self.with_key_slots(limit, key, now, |lane, stripe, t, fp| {
            lane.cool(stripe, hint_tag(fp, limit));
            match Kind::of(&alg) {
                None => {
                    algorithm::current(&alg, stripe.tables[t].get(fp, offset, now), offset, now)
                }
                Some(kind) => {
                    let delta = stripe.tables[t].restore(kind, fp, offset, now);
                    stripe.apply(delta);
                    stripe.tables[t].sliding.current(kind, fp, offset, now)
                }
            }
        });
        Value {
            tokens: parts.iter().map(|v| v.tokens).sum(),
            ts: parts.iter().map(|v| v.ts).max().unwrap_or(now),
        }
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

// The futures are always ready; saying so lets callers poll them once.
#[allow(refining_impl_trait)]
impl<C: Clock> Store for MemoryStore<C> {
    fn transact(&self, ops: &[Op<'_>], mode: Mode) -> Ready<Result<Outcome, StoreError>> {
        ready(self.transact_now(ops, mode))
    }

    fn reset(&self, limit: &Limit, key: &str) -> Ready<Result<(), StoreError>> {
        self.reset_now(limit, key);
        ready(Ok(()))
    }

    fn value(&self, limit: &Limit, key: &str) -> Ready<Result<Value, StoreError>> {
        ready(Ok(self.value_now(limit, key)))
    }

    fn settle(
        &self,
        limit: &Limit,
        key: &str,
        change: Settle,
    ) -> Ready<Result<Decision, StoreError>> {
        ready(self.settle_now(limit, key, change))
    }

    fn release(&self, limit: &Limit, key: &str, id: u64) -> Ready<Result<bool, StoreError>> {
        ready(Ok(self.release_now(limit, key, id)))
    }

    fn decide(&self, op: Op<'_>, mode: Mode) -> Ready<Result<Decision, StoreError>> {
        ready(self.decide_now(op, mode))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_cap_is_split_over_the_stripes_in_whole_keys() {
        for (max, stripes) in [
            (1, 512),
            (100, 64),
            (1_000, 512),
            (10_007, 4_096),
            (1_000_000, 64),
        ] {
            let store = MemoryStore::new().with_max_keys(max).with_stripes(stripes);
            let caps: Vec<usize> = store.stripes.iter().map(|lane| lane.0.cap).collect();
            // Every stripe holds at least one key, and the shares differ by
            // one at most.
            assert_eq!(caps.iter().sum::<usize>(), max.max(caps.len()), "cap {max}");
            let (lo, hi) = (caps.iter().min(), caps.iter().max());
            assert!(hi.zip(lo).is_some_and(|(hi, lo)| hi - lo <= 1), "cap {max}");
        }
    }
}
