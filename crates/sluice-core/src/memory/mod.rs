//! The embedded store: states in lock-striped flat tables, one small lock per
//! stripe, memory bounded by dropping full buckets and by a key cap.
//!
//! A key is held as a 64-bit fingerprint from SipHash-1-3 under a random
//! per-store key, next to its two numbers: 24 bytes an entry (see `slots`).
//! The sliding algorithms' states, which need more, live in maps of their own
//! beside the flat entries, under the same lock (see `sliding`). Keys of
//! different limits live in different tables, so two keys can only share
//! state if they belong to the same limit and their fingerprints collide
//! (chance about n²/2⁶⁵ for n live keys, and no one who doesn't know the
//! secret key can aim for it); sharing a bucket only ever admits less.

use std::future::{Ready, ready};
use std::hash::{BuildHasher, Hasher, RandomState};

use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use crate::algorithm::{self, State};
use crate::config::{Algorithm, Limit};
use crate::decision::{Decision, Outcome, Value};
use crate::store::{Mode, Op, Settle, Store, StoreError};
use crate::time::{Clock, Nanos, SystemClock};

mod flat;
mod ghosts;
mod hot;
mod sliding;

use flat::{Entry, FlatTable, Probe, SWEEP_FROM, nonzero};
use ghosts::Ghosts;
use hot::{Displaced, Hot};
use sliding::{Kind, Next, Sliding};

/// Lock stripes per core. Threads deciding different keys meet on a stripe
/// seldom with many stripes, and then neither waits for the other's lock
/// nor pulls the stripe's lock and table lines from the other's cache.
const STRIPES_PER_CORE: usize = 256;

/// The most stripes a store takes, however many cores: each costs up to half
/// a kilobyte, taken when the store is made.
const MAX_STRIPES: usize = 4096;

/// Slots an insert sweeps. A pass over a table then takes a quarter as many
/// inserts as it has slots, so when every key is short-lived a table stays
/// about a quarter full and never grows.
const SWEEP_STEP: usize = 4;

impl Entry {
    #[inline]
    fn new(fp: u64, s: State) -> Entry {
        Entry {
            fp,
            tokens: s.tokens,
            ts: s.ts.0,
        }
    }

    #[inline]
    fn state(&self) -> State {
        State {
            tokens: self.tokens,
            ts: Nanos(self.ts),
        }
    }
}

/// The keys of one limit within one stripe. The entries' counts, which
/// inserts write, come first: see [`Stripe`].
#[repr(C)]
struct Table {
    entries: FlatTable,
    /// The handle last used: its configuration is the table's, and comparing
    /// handles is cheaper than comparing configurations on every call.
    limit: Limit,
    /// The states of a sliding algorithm's keys (empty for the others);
    /// boxed, so that the table stays small for the others.
    sliding: Box<Sliding>,
    /// Keys the cap dropped before they were full; made at the first such
    /// drop, so a store without a cap, or that never reaches it, has none.
    ghosts: Option<Box<Ghosts>>,
}

impl Table {
    #[inline]
    fn alg(&self) -> Algorithm {
        *self.limit.shard_algorithm()
    }

    /// The key's state: its entry, else what the cap's eviction left of it,
    /// else none (full).
    fn get(&self, fp: u64, offset: i64, now: Nanos) -> Option<State> {
        match self.entries.get(fp) {
            Some(e) => Some(e.state()),
            None => self.forgotten(fp, offset, now),
        }
    }

    /// The state of a key that has no entry: full, unless the cap dropped
    /// it while it was short of tokens, in which case it is no fuller now
    /// than it would have been.
    #[inline]
    fn forgotten(&self, fp: u64, offset: i64, now: Nanos) -> Option<State> {
        let full_at = self.ghosts.as_ref()?.recall(fp, now)?;
        algorithm::emptiest_full_by(&self.alg(), full_at, offset, now)
    }

    /// Stores `s`, or forgets the key when `s` is full. Returns the change in
    /// the number of entries.
    fn put(&mut self, fp: u64, s: State) -> isize {
        let probe = self.entries.find(fp);
        self.put_at(probe, fp, s)
    }

    /// [`Table::put`] where the key has already been looked up.
    #[inline]
    fn put_at(&mut self, probe: Probe, fp: u64, s: State) -> isize {
        let full = s.tokens >= self.limit.shard_capacity();
        self.put_as(probe, fp, s, full)
    }

    /// Stores `s`, or forgets the key when `full` says `s` is full under
    /// the configuration that wrote it.
    #[inline]
    fn put_as(&mut self, probe: Probe, fp: u64, s: State, full: bool) -> isize {
        match probe {
            Probe::Found(i) if full => {
                self.entries.remove_at(i);
                -1
            }
            Probe::Found(i) => {
                *self.entries.at_mut(i) = Entry::new(fp, s);
                0
            }
            Probe::Vacant if full => 0,
            Probe::Vacant => {
                self.entries.insert_new(Entry::new(fp, s));
                1
            }
        }
    }

    /// Forgets the key entirely: it is full from `now` on.
    fn remove(&mut self, fp: u64, now: Nanos) -> isize {
        if let Some(g) = &mut self.ghosts {
            g.forget(fp, now);
        }
        self.sliding.remove(fp) - isize::from(self.entries.remove(fp))
    }

    /// Brings a sliding key that the cap forgot back into the map, as the
    /// fullest state its refill time allows, so that it is read like any
    /// other. Returns the change in the number of entries.
    fn restore(&mut self, kind: Kind<'_>, fp: u64, offset: i64, now: Nanos) -> isize {
        if self.sliding.contains(fp) {
            return 0;
        }
        match self.ghosts.as_ref().and_then(|g| g.recall(fp, now)) {
            Some(empty_at) => self.sliding.restore(kind, fp, empty_at, offset, now),
            None => 0,
        }
    }

    /// Forgets every key as the cap would, leaving the refill time of each
    /// one that is not full behind: what a key holds under one kind of
    /// algorithm means nothing under another.
    fn forget_all(&mut self, now: Nanos) {
        let alg = self.alg();
        let mut times: Vec<(u64, Nanos)> = self
            .entries
            .iter()
            .map(|e| (e.fp, algorithm::full_at(&alg, &e.state())))
            .collect();
        if let Some(kind) = Kind::of(&alg) {
            times.extend(self.sliding.empty_times(kind));
        }
        self.entries = FlatTable::default();
        *self.sliding = Sliding::default();
        let room = times.len().max(1);
        let ghosts = self
            .ghosts
            .get_or_insert_with(|| Box::new(Ghosts::with_room_for(room)));
        for (fp, at) in times {
            if at > now {
                ghosts.remember(fp, at, now);
            }
        }
    }
}

/// Picks the entries to evict: every one full before the cutoff, and as
/// many of those full at it as make up the rest.
struct Cutoff {
    at: i64,
    ties: usize,
}

impl Cutoff {
    fn evicts(&mut self, full_at: Nanos) -> bool {
        let evict = full_at.0 < self.at || (full_at.0 == self.at && self.ties > 0);
        if evict && full_at.0 == self.at {
            self.ties -= 1;
        }
        evict
    }
}

/// How many recently denied keys a stripe remembers.
const DENIED: usize = 4;

/// What a decision writes in a stripe comes first, in declared order: the
/// denied keys, the count and, at the start of the first table, that
/// table's own counts. They then share the lock's cache line, which two
/// cores deciding keys all over the store pass back and forth; a second
/// written line would cross between them as often (see the test
/// `the_fields_a_decision_writes_share_the_lock_s_cache_line`).
#[derive(Default)]
#[repr(C)]
struct Stripe {
    /// The low halves of the hot-slot tags of the stripe's last few denied
    /// keys, oldest overwritten first. Halves, so that the ring fits on the
    /// lock's line with the counts: they tell a few keys apart well enough,
    /// and a key mistaken for another only earns a hot slot early.
    denied: [u32; DENIED],
    denied_next: usize,
    len: usize,
    /// A store most often holds one limit, whose table then sits next to
    /// the lock, on lines no other stripe writes, rather than in a small
    /// heap block beside another stripe's.
    tables: SmallVec<[Table; 1]>,
}

impl Stripe {
    /// Whether `tag` is among the stripe's last few denied keys; if not, it
    /// is now. A key denied twice in a short while is likely to be asked
    /// again, the pattern of abuse, and earns a hot slot; a key denied once
    /// may be one of a stream of distinct keys, each of which would evict the
    /// slot's key only to be evicted in turn, two table writes a denial.
    fn denied_again(&mut self, tag: u64) -> bool {
        let low = tag as u32;
        if self.denied.contains(&low) {
            return true;
        }
        self.denied[self.denied_next] = low;
        self.denied_next = (self.denied_next + 1) % DENIED;
        false
    }

    /// The table of `limit`, created on first use. A changed configuration
    /// takes effect at once and keeps the stored tokens; what the key cap
    /// forgot is carried over as the new configuration would count it. A
    /// change to an algorithm whose states are of another kind (between the
    /// two-number ones, the sliding window and the sliding log) forgets
    /// every key as the cap would, after moving the stripe's hot keys
    /// (`hot`) back.
    #[inline]
    fn table(&mut self, limit: &Limit, now: Nanos, hot: &Hot) -> usize {
        match self.tables.iter().position(|t| t.limit.same(limit)) {
            Some(i) => i,
            None => self.new_table(limit, now, hot),
        }
    }

    /// [`Stripe::table`] for a handle no table was last used with: a new
    /// limit, or a new handle to one (a reload).
    #[cold]
    #[inline(never)]
    fn new_table(&mut self, limit: &Limit, now: Nanos, hot: &Hot) -> usize {
        match self
            .tables
            .iter()
            .position(|t| t.limit.name() == limit.name())
        {
            Some(i) => {
                let (from, to) = (self.tables[i].alg(), *limit.shard_algorithm());
                let same_states = Kind::same_states(&from, &to);
                if !same_states {
                    hot.drain(|held| self.write_back(held));
                    self.tables[i].forget_all(now);
                    self.recount();
                }
                let table = &mut self.tables[i];
                // A reload hands over a new handle to the same configuration
                // as often as a changed one; only a change moves the times.
                // A change of kind keeps them as they are: each key comes
                // back as the fullest state of the new kind that is empty by
                // the time the old one would have been, as on Redis, whose
                // keys keep their expiry. Moved to the new kind's refill,
                // they would be lost to a change back: a log of a minute
                // turned into a fast bucket and back would forget its calls.
                if let Some(g) = &mut table.ghosts
                    && from != to
                    && same_states
                {
                    g.remap(now, |at| algorithm::refill_time_under(&from, &to, at, now));
                }
                table.limit = limit.clone();
                i
            }
            None => {
                self.tables.push(Table {
                    limit: limit.clone(),
                    entries: FlatTable::default(),
                    sliding: Box::default(),
                    ghosts: None,
                });
                self.tables.len() - 1
            }
        }
    }

    fn apply(&mut self, delta: isize) {
        self.len = self.len.saturating_add_signed(delta);
    }

    /// Counts a write to table `t`; after an insert into a large table, also
    /// sweeps a few of its slots for buckets that are full by `now`.
    ///
    /// The sweep may drop the entry of a key that sits in a hot slot, which
    /// is lossless: a slot that changed the state writes it back when it
    /// lets the key go, and one that did not holds the same full state.
    #[inline]
    fn count_write(&mut self, t: usize, delta: isize, now: Nanos) {
        if delta == 0 {
            return;
        }
        self.apply(delta);
        if delta > 0 && self.len >= SWEEP_FROM {
            self.sweep(t, now);
        }
    }

    /// The sweep of [`Stripe::count_write`]: out of line, as most writes
    /// replace an entry and insert none.
    #[inline(never)]
    fn sweep(&mut self, t: usize, now: Nanos) {
        if let Some(table) = self.tables.get_mut(t) {
            let alg = table.alg();
            let removed = table
                .entries
                .sweep(SWEEP_STEP, |e| algorithm::full_at(&alg, &e.state()) <= now);
            self.apply(-isize::try_from(removed).unwrap_or(isize::MAX));
        }
    }

    /// Whether [`Stripe::maintain`] has work to do.
    fn due(&self, cap: usize) -> bool {
        self.len > cap
    }

    /// Enforces the key cap: drops the full buckets, then, if that is not
    /// enough, the buckets nearest to full, which hold the least.
    fn maintain(&mut self, now: Nanos, cap: usize) {
        for t in &mut self.tables {
            let alg = t.alg();
            t.entries
                .retain(|e| algorithm::full_at(&alg, &e.state()) > now);
            if let Some(kind) = Kind::of(&alg) {
                t.sliding.drop_empty(kind, now);
            }
        }
        self.recount();
        if self.len > cap {
            self.evict_nearest_full(cap - cap / 8, now, cap);
        }
    }

    /// Puts a key that left its hot slot back into its table.
    fn write_back(&mut self, held: Displaced) {
        if held.dirty
            && let Some(t) = self.tables.get_mut(held.table)
        {
            let probe = t.entries.find(held.fp);
            let delta = t.put_as(probe, held.fp, held.state, held.full);
            self.apply(delta);
        }
    }

    fn recount(&mut self) {
        self.len = self
            .tables
            .iter()
            .map(|t| t.entries.len() + t.sliding.len())
            .sum();
    }

    /// Drops the entries nearest to full until `target` are left, leaving
    /// each one's refill time behind in its table's ghosts (room for `cap`).
    fn evict_nearest_full(&mut self, target: usize, now: Nanos, cap: usize) {
        let mut times: Vec<i64> = Vec::with_capacity(self.len);
        for t in &self.tables {
            let alg = t.alg();
            times.extend(
                t.entries
                    .iter()
                    .map(|e| algorithm::full_at(&alg, &e.state()).0),
            );
            if let Some(kind) = Kind::of(&alg) {
                times.extend(t.sliding.empty_times(kind).map(|(_, at)| at.0));
            }
        }
        let excess = times.len().saturating_sub(target);
        if excess == 0 {
            return;
        }
        let (_, &mut cutoff, _) = times.select_nth_unstable(excess - 1);
        // Everything nearer to full than the cutoff goes, and as many of
        // those at the cutoff as make up the rest, so that a key strictly
        // nearer to full is never kept while one further from it goes.
        let below = times.iter().filter(|&&t| t < cutoff).count();
        let mut cut = Cutoff {
            at: cutoff,
            ties: excess - below,
        };
        for t in &mut self.tables {
            let alg = t.alg();
            let ghosts = &mut t.ghosts;
            let mut evict = |fp: u64, full_at: Nanos| {
                let evict = cut.evicts(full_at);
                if evict {
                    ghosts
                        .get_or_insert_with(|| Box::new(Ghosts::with_room_for(cap)))
                        .remember(fp, full_at, now);
                }
                evict
            };
            t.entries
                .retain(|e| !evict(e.fp, algorithm::full_at(&alg, &e.state())));
            if let Some(kind) = Kind::of(&alg) {
                t.sliding.retain(kind, |fp, at| !evict(fp, at));
            }
        }
        self.recount();
    }
}

/// Cache-line alignment keeps neighbouring stripe locks from false sharing.
#[repr(align(128))]
struct Padded<T>(T);

/// One stripe: its lock, the lock-free slots of its hottest keys, and its
/// share of the key cap.
struct Lane {
    lock: Mutex<Stripe>,
    hot: Hot,
    /// Entries the stripe may hold; set once, before the store is shared.
    cap: usize,
}

impl Default for Lane {
    fn default() -> Self {
        Lane {
            lock: Mutex::default(),
            hot: Hot::default(),
            cap: usize::MAX,
        }
    }
}

impl Lane {
    /// Runs [`Stripe::maintain`] when the stripe is over its cap, after moving
    /// the hot keys back: eviction judges entries by their states, and must
    /// see every key's latest.
    #[inline]
    fn maintain(&self, stripe: &mut Stripe, now: Nanos) {
        if stripe.due(self.cap) {
            self.enforce_cap(stripe, now, self.cap);
        }
    }

    /// The work of [`Lane::maintain`], out of line: a stripe is seldom over
    /// its cap.
    #[cold]
    #[inline(never)]
    fn enforce_cap(&self, stripe: &mut Stripe, now: Nanos, cap: usize) {
        self.flush(stripe);
        stripe.maintain(now, cap);
    }

    /// Moves every hot key back into its table.
    fn flush(&self, stripe: &mut Stripe) {
        self.hot.drain(|held| stripe.write_back(held));
    }

    /// Moves `tag` back into its table if a slot holds it.
    fn cool(&self, stripe: &mut Stripe, tag: u64) {
        if let Some(held) = self.hot.take(tag) {
            stripe.write_back(held);
        }
    }

    /// Gives `tag` a hot slot, writing back the key it displaces.
    fn heat(&self, stripe: &mut Stripe, tag: u64, at: (u64, usize), state: State) {
        let cap = stripe.tables[at.1].alg().capacity();
        if let Some(held) = self.hot.install(tag, at, state, cap) {
            stripe.write_back(held);
        }
    }
}

/// The hot-slot tag of a key: its fingerprint mixed with its limit's name.
#[inline]
fn hint_tag(fp: u64, limit: &Limit) -> u64 {
    nonzero(fp ^ limit.name_tag())
}

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

/// One candidate state location: which locked stripe, which table, which key.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Slot {
    guard: usize,
    table: usize,
    fp: u64,
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

    /// Any number of operations, on sharded limits too: every lock stripe involved
    /// is locked (in a fixed order) for the whole decision.
    fn transaction(&self, ops: &[Op<'_>], mode: Mode) -> Result<Outcome, StoreError> {
        for op in ops {
            op.validate(mode.reserve)?;
        }
        crate::store::same_kind_per_name(ops)?;
        // Candidate fingerprints for every op, and the lock stripes they live in.
        let cands: SmallVec<[(u64, u64); 4]> = ops
            .iter()
            .map(|op| {
                let (a, b) = op.shards();
                let fa = self.fingerprint(op.key, a);
                (
                    fa,
                    if a == b {
                        fa
                    } else {
                        self.fingerprint(op.key, b)
                    },
                )
            })
            .collect();
        let mut locks: SmallVec<[usize; 8]> = cands
            .iter()
            .flat_map(|&(a, b)| [self.lock_index(a), self.lock_index(b)])
            .collect();
        // A fixed order makes concurrent multi-stripe transactions deadlock-free.
        locks.sort_unstable();
        locks.dedup();
        let mut guards: SmallVec<[MutexGuard<'_, Stripe>; 8]> = locks
            .iter()
            .map(|&i| self.stripes[i].0.lock.lock())
            .collect();
        let now = self.clock.now();
        // The tables must hold the latest states before they are read; and
        // while the locks are held, no key can move back into a slot.
        for (op, &(fa, fb)) in ops.iter().zip(&cands) {
            for fp in [fa, fb] {
                let i = self.lock_index(fp);
                let g = locks.binary_search(&i).unwrap_or(0);
                self.stripes[i]
                    .0
                    .cool(&mut guards[g], hint_tag(fp, op.limit));
            }
        }

        let mut pending: SmallVec<[(Slot, Write); 4]> = SmallVec::new();
        // Where each op's key lives, in case the transaction is denied and
        // must report that nothing was spent.
        let mut chosen: SmallVec<[(Slot, i64); 4]> = SmallVec::new();
        let mut decisions = SmallVec::new();
        for (op, &(fa, fb)) in ops.iter().zip(&cands) {
            let alg = *op.limit.shard_algorithm();
            let offset = algorithm::key_offset(&alg, op.key);
            let mut slot_of = |fp: u64| {
                let guard = locks.binary_search(&self.lock_index(fp)).unwrap_or(0);
                let hot = &self.stripes[locks[guard]].0.hot;
                let table = guards[guard].table(op.limit, now, hot);
                Slot { guard, table, fp }
            };
            let (sa, sb) = (slot_of(fa), slot_of(fb));
            let (slot, decision, next) = match Kind::of(&alg) {
                None => {
                    // Later ops of the same transaction see the earlier ops' effects.
                    let read = |s: Slot| {
                        pending
                            .iter()
                            .rev()
                            .find_map(|&(p, w)| match w {
                                Write::Flat(st) if p == s => Some(st),
                                _ => None,
                            })
                            .or_else(|| guards[s.guard].tables[s.table].get(s.fp, offset, now))
                    };
                    let (slot, state) = if sa == sb {
                        (sa, read(sa))
                    } else {
                        let (st_a, st_b) = (read(sa), read(sb));
                        let tokens = |st| algorithm::current(&alg, st, offset, now).tokens;
                        if tokens(st_b) > tokens(st_a) {
                            (sb, st_b)
                        } else {
                            (sa, st_a)
                        }
                    };
                    let ev = algorithm::evaluate(&alg, state, offset, now, op.cost, mode.reserve);
                    (slot, ev.decision, ev.next.map(Write::Flat))
                }
                Some(kind) => {
                    for s in [sa, sb] {
                        let stripe = &mut *guards[s.guard];
                        let delta = stripe.tables[s.table].restore(kind, s.fp, offset, now);
                        stripe.apply(delta);
                    }
                    let states = |s: Slot| &guards[s.guard].tables[s.table].sliding;
                    let earlier = |s: Slot| sliding_pending(&pending, s);
                    let tokens = |s: Slot| states(s).tokens(kind, s.fp, offset, now, earlier(s));
                    let slot = if sa != sb && tokens(sb) > tokens(sa) {
                        sb
                    } else {
                        sa
                    };
                    let (d, next) = states(slot).evaluate(
                        kind,
                        slot.fp,
                        offset,
                        now,
                        earlier(slot),
                        op.cost,
                        op.lease,
                    );
                    (slot, d, next.map(Write::Sliding))
                }
            };
            if let Some(next) = next {
                pending.push((slot, next));
            }
            chosen.push((slot, offset));
            decisions.push(decision);
        }
        let mut outcome = Outcome::from_decisions(decisions);
        if !outcome.allowed {
            // Nothing was committed, so the tables still hold what each key
            // had before the transaction.
            for ((d, op), &(slot, offset)) in outcome.decisions.iter_mut().zip(ops).zip(&chosen) {
                if d.allowed {
                    let alg = op.limit.shard_algorithm();
                    let table = &guards[slot.guard].tables[slot.table];
                    *d = match Kind::of(alg) {
                        None => {
                            let st = table.get(slot.fp, offset, now);
                            algorithm::unspent(alg, st, offset, now, *d)
                        }
                        Some(kind) => {
                            let (idle, _) = table
                                .sliding
                                .evaluate(kind, slot.fp, offset, now, None, 0.0, 0);
                            Decision {
                                remaining: idle.remaining,
                                reset: idle.reset,
                                ..*d
                            }
                        }
                    };
                }
            }
        }
        if outcome.allowed && mode.consume {
            for (slot, w) in pending {
                let stripe = &mut *guards[slot.guard];
                match w {
                    Write::Flat(st) => {
                        let delta = stripe.tables[slot.table].put(slot.fp, st);
                        stripe.count_write(slot.table, delta, now);
                    }
                    Write::Sliding(next) => {
                        let Table { limit, sliding, .. } = &mut stripe.tables[slot.table];
                        if let Some(kind) = Kind::of(limit.shard_algorithm()) {
                            let delta = sliding.commit(kind, slot.fp, next, now);
                            stripe.apply(delta);
                        }
                    }
                }
            }
            for (g, &i) in guards.iter_mut().zip(&locks) {
                self.stripes[i].0.maintain(g, now);
            }
        }
        Ok(outcome)
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

/// What an admitted operation of a transaction writes when it commits.
#[derive(Clone, Copy)]
enum Write {
    Flat(State),
    Sliding(Next),
}

/// What the earlier operations of a transaction admitted on a sliding key:
/// the window's latest state, or the sum of the costs to log.
fn sliding_pending(pending: &[(Slot, Write)], slot: Slot) -> Option<Next> {
    pending
        .iter()
        .filter(|(p, _)| *p == slot)
        .fold(None, |acc, &(_, w)| match (acc, w) {
            (Some(Next::Log(a)), Write::Sliding(Next::Log(b))) => Some(Next::Log(a + b)),
            (Some(Next::Lease(a, _)), Write::Sliding(Next::Lease(b, id))) => {
                Some(Next::Lease(a + b, id))
            }
            (_, Write::Sliding(next)) => Some(next),
            (acc, Write::Flat(_)) => acc,
        })
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
    fn a_stripe_takes_under_half_a_kilobyte_and_its_lock_shares_no_line_with_its_slots() {
        assert!(std::mem::size_of::<Padded<Lane>>() <= 512);
        let lane = Lane::default();
        let offset = |addr: usize| addr - std::ptr::from_ref(&lane).addr();
        // Pairs of lines, as the hardware fetches the line next to a miss too
        // (which is why stripes are padded to 128 bytes).
        let lines = |start: usize, len: usize| start / 128..=(start + len - 1) / 128;
        let slots = lines(
            offset(std::ptr::from_ref(&lane.hot).addr()),
            std::mem::size_of::<Hot>(),
        );
        let lock = lines(
            offset(std::ptr::from_ref(&lane.lock).addr()),
            std::mem::size_of::<Mutex<Stripe>>(),
        );
        // The slots are read without the lock on every decision; what is
        // written under the lock must not invalidate them.
        assert!(
            lock.end() < slots.start() || slots.end() < lock.start(),
            "slots on lines {slots:?}, lock and stripe on {lock:?}"
        );
    }

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

    #[test]
    fn the_fields_a_decision_writes_share_the_lock_s_cache_line() {
        /// The cache lines of a value's first and last bytes.
        fn lines<T>(at: &T) -> [usize; 2] {
            let start = std::ptr::from_ref(at).addr();
            [start / 64, (start + std::mem::size_of::<T>() - 1) / 64]
        }
        let lane = Padded(Lane::default());
        // The lock's state is what the mutex holds before its data.
        let mutex = std::ptr::from_ref(&lane.0.lock).addr();
        let data = lane.0.lock.data_ptr().addr() - mutex;
        assert!(
            data > 0
                && data + std::mem::size_of::<Stripe>() == std::mem::size_of::<Mutex<Stripe>>(),
            "the stripe at byte {data} of the mutex"
        );
        let lock = mutex / 64;
        let mut stripe = lane.0.lock.lock();
        let limit = Limit::new("api", crate::TokenBucket::new(1.0, 2.0).unwrap());
        let t = stripe.table(&limit, Nanos::ZERO, &lane.0.hot);
        let mut written = vec![
            lines(&stripe.denied),
            lines(&stripe.denied_next),
            lines(&stripe.len),
        ];
        written.extend(stripe.tables[t].entries.counts().map(lines));
        for (i, at) in written.iter().enumerate() {
            assert_eq!(*at, [lock, lock], "written field {i}");
        }
    }

    #[test]
    fn a_stripe_remembers_its_last_few_denied_keys() {
        let mut stripe = Stripe::default();
        // Once is not enough; twice is, while the key is among the last few.
        assert!(!stripe.denied_again(7));
        assert!(stripe.denied_again(7));
        for tag in 100..100 + DENIED as u64 - 1 {
            assert!(!stripe.denied_again(tag));
        }
        assert!(stripe.denied_again(7), "{DENIED} keys are remembered");
        // A key whose tag shares the low half is taken for it.
        assert!(stripe.denied_again(7 | 1 << 32));
        // One more distinct key pushes it out.
        assert!(!stripe.denied_again(200));
        assert!(!stripe.denied_again(7), "only {DENIED} keys are remembered");
    }
}
