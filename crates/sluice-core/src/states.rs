//! Transactions decided over states a store has read: how a store that keeps
//! its keys elsewhere (a database) lets the core decide. The store reads the
//! rows of a call's keys, hands them to [`States`], asks it to decide, and
//! writes back what it says changed. The algorithms are the same functions
//! the memory store runs, and the decisions are the memory store's to the
//! letter, which the conformance suite checks; only the keeping differs.
//!
//! A state is kept as a [`Stored`], which a store writes as bytes
//! ([`Stored::to_bytes`]) beside the time it holds nothing any more
//! ([`States::writes`]): after that time a row may be dropped, and a row
//! read after it counts as missing. A row of another kind than its limit
//! now keeps (the limit changed kind) comes back as the fullest state of
//! the new kind that is empty by that time, as on every store.

use std::collections::HashMap;
use std::hash::Hash;

use smallvec::SmallVec;

use crate::algorithm::{self, State};
use crate::bytes::Reader;
use crate::concurrency::Leases;
use crate::config::{Algorithm, Limit};
use crate::decision::{Decision, Outcome, Value};
use crate::sliding::{
    Log, WindowState, window_current, window_emptiest, window_empty_at, window_evaluate,
    window_settle,
};
use crate::store::{Mode, Op, Settle, StoreError, same_kind_per_name};
use crate::time::Nanos;

/// What a store keeps for one key: the state of the kind its limit keeps.
///
/// ```
/// use sluice_core::{Nanos, algorithm::State, states::Stored};
/// let s = Stored::Flat(State { tokens: 2.5, ts: Nanos(7) });
/// assert_eq!(Stored::from_bytes(&s.to_bytes()), Some(s));
/// assert_eq!(Stored::from_bytes(b"nonsense"), None);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Stored {
    /// A token bucket's or a fixed window's two numbers.
    Flat(State),
    /// A sliding window's counts.
    Window(WindowState),
    /// A sliding log's entries.
    Log(Log),
    /// A concurrency key's leases.
    Leases(Leases),
}

/// The kinds of state, as [`Stored`] holds them, and as a limit keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Flat,
    Window,
    Log,
    Leases,
}

impl Kind {
    fn of(alg: &Algorithm) -> Kind {
        match alg {
            Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_) => Kind::Flat,
            Algorithm::SlidingWindow(_) => Kind::Window,
            Algorithm::SlidingLog(_) => Kind::Log,
            Algorithm::Concurrency(_) => Kind::Leases,
        }
    }
}

// ---- Stored: its kind, its bytes ----

/// The first byte of each kind's bytes.
const FLAT: u8 = 1;
const WINDOW: u8 = 2;
const LOG: u8 = 3;
const LEASES: u8 = 4;

impl Stored {
    fn kind(&self) -> Kind {
        match self {
            Stored::Flat(_) => Kind::Flat,
            Stored::Window(_) => Kind::Window,
            Stored::Log(_) => Kind::Log,
            Stored::Leases(_) => Kind::Leases,
        }
    }

    /// The state as bytes: a byte naming its kind, then its numbers,
    /// little-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(17);
        match self {
            Stored::Flat(s) => {
                out.push(FLAT);
                out.extend(s.tokens.to_le_bytes());
                out.extend(s.ts.0.to_le_bytes());
            }
            Stored::Window(w) => {
                out.push(WINDOW);
                out.extend(w.cur.to_le_bytes());
                out.extend(w.ws.0.to_le_bytes());
                out.extend(w.prev.to_le_bytes());
            }
            Stored::Log(log) => {
                out.push(LOG);
                log.encode(&mut out);
            }
            Stored::Leases(leases) => {
                out.push(LEASES);
                leases.encode(&mut out);
            }
        }
        out
    }

    /// A state from [`Stored::to_bytes`]'s bytes, or `None` if they are not
    /// one.
    pub fn from_bytes(bytes: &[u8]) -> Option<Stored> {
        let (&kind, rest) = bytes.split_first()?;
        let mut r = Reader(rest);
        let stored = match kind {
            FLAT => Stored::Flat(State {
                tokens: r.f64()?,
                ts: Nanos(r.i64()?),
            }),
            WINDOW => Stored::Window(WindowState {
                cur: r.f64()?,
                ws: Nanos(r.i64()?),
                prev: r.f64()?,
            }),
            LOG => Stored::Log(Log::decode(&mut r)?),
            LEASES => Stored::Leases(Leases::decode(&mut r)?),
            _ => return None,
        };
        r.0.is_empty().then_some(stored)
    }
}

// ---- States ----

/// One key's state as the call found it and as it now stands.
#[derive(Debug)]
struct Entry {
    state: Option<Stored>,
    /// The store holds something for the key that is not a state this
    /// release reads (another release's, or damaged): it is taken to be of
    /// another kind, as full as any state empty by `empty_at`.
    unknown: bool,
    /// When the state, as read, holds nothing any more.
    empty_at: Nanos,
    /// The limit's algorithm, once it has been read under one: what the
    /// state counts against, and what tells when it is empty.
    alg: Option<Algorithm>,
    changed: bool,
}

/// What an admitted operation writes when its transaction commits.
#[derive(Debug, Clone, Copy)]
enum Write {
    Flat(State),
    Window(WindowState),
    Log(f64),
    Lease(f64, u64),
}

/// The states of the keys a call names, as a store read them, and what the
/// core decided on them.
///
/// ```
/// use sluice_core::{Limit, Mode, Nanos, Op, TokenBucket, states::States};
/// let limit = Limit::new("api", TokenBucket::new(1.0, 2.0).unwrap());
/// let mut states = States::new();
/// // The store read the key and found no row: a full bucket.
/// states.read("api/k", None, Nanos(0));
/// let ops = [Op::new(&limit, "k", 2.0)];
/// let out = states.transact(&ops, |_, _| "api/k", Mode::CONSUME, Nanos(0)).unwrap();
/// assert!(out.allowed);
/// // What to write back: the key, its state, and when it is full again.
/// let writes: Vec<_> = states.writes().collect();
/// assert_eq!(writes.len(), 1);
/// assert_eq!(writes[0].1.as_ref().map(|(_, at)| *at), Some(Nanos(2_000_000_000)));
/// ```
#[derive(Debug)]
pub struct States<K> {
    entries: HashMap<K, Entry>,
}

impl<K: Hash + Eq + Clone> Default for States<K> {
    fn default() -> Self {
        States {
            entries: HashMap::new(),
        }
    }
}

// ---- Reading and writing back ----

impl<K: Hash + Eq + Clone> States<K> {
    /// No keys yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records what the store holds for `key`: `state`, which holds nothing
    /// any more from `empty_at` on, or `None` for no row. A state read
    /// after its `empty_at` counts as no row.
    pub fn read(&mut self, key: K, state: Option<Stored>, empty_at: Nanos) {
        self.entries.insert(
            key,
            Entry {
                state,
                unknown: false,
                empty_at,
                alg: None,
                changed: false,
            },
        );
    }

    /// Records that the store holds for `key` something it cannot read as a
    /// state (bytes [`Stored::from_bytes`] refuses), which holds nothing
    /// any more from `empty_at` on. Until then the key is taken to be as
    /// full as any state that is empty by that time, as a key of another
    /// kind is: never emptier than it may be.
    pub fn read_unknown(&mut self, key: K, empty_at: Nanos) {
        self.read(key.clone(), None, empty_at);
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.unknown = true;
        }
    }

    /// Whether the store has read `key`.
    pub fn has(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// The keys whose states changed, each with what to write: the state
    /// and the time it holds nothing any more, or `None` to drop the row
    /// (it holds nothing now: a full bucket, an empty log).
    pub fn writes(&self) -> impl Iterator<Item = (&K, Option<(&Stored, Nanos)>)> + '_ {
        self.entries
            .iter()
            .filter(|(_, e)| e.changed)
            .map(|(k, e)| {
                let written = match (&e.state, &e.alg) {
                    (Some(state), Some(alg)) => Some((state, empty_at(alg, state))),
                    _ => None,
                };
                (k, written)
            })
    }

    /// The entry of `key` as a state of `alg`'s kind at `now`: missing if it
    /// expired, and, if it is of another kind, the fullest state of this
    /// kind that is empty when it would have been.
    fn prepare(&mut self, key: &K, alg: &Algorithm, offset: i64, now: Nanos) -> &mut Entry {
        let entry = self.entries.entry(key.clone()).or_insert(Entry {
            state: None,
            unknown: false,
            empty_at: Nanos(i64::MIN),
            alg: None,
            changed: false,
        });
        if let Some(prev) = entry.alg
            && Kind::of(&prev) != Kind::of(alg)
        {
            // An earlier call on these states used the key under another
            // kind (a store deciding a batch of calls, some queued before a
            // reload changed the limit's kind): what it left is read as
            // any row of another kind is, never as no row.
            if let Some(state) = &entry.state {
                entry.empty_at = empty_at(&prev, state);
            }
            entry.alg = None;
        }
        if entry.alg.is_none() {
            if entry.empty_at <= now && !entry.changed {
                entry.state = None;
                entry.unknown = false;
            }
            let kind = Kind::of(alg);
            if entry.unknown || entry.state.as_ref().is_some_and(|s| s.kind() != kind) {
                entry.unknown = false;
                let at = entry.empty_at;
                entry.state = match alg {
                    Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_) => {
                        algorithm::emptiest_full_by(alg, at, offset, now).map(Stored::Flat)
                    }
                    Algorithm::SlidingWindow(sw) => {
                        window_emptiest(sw, at, offset, now).map(Stored::Window)
                    }
                    Algorithm::SlidingLog(sl) => Log::emptiest(sl, at, now).map(Stored::Log),
                    Algorithm::Concurrency(c) => Leases::emptiest(c, at, now).map(Stored::Leases),
                };
            }
        }
        // The latest configuration of the kind decides when the state is
        // empty, as it would in a call of its own.
        entry.alg = Some(*alg);
        entry
    }

    fn flat(&self, key: &K) -> Option<State> {
        match self.entries.get(key)?.state {
            Some(Stored::Flat(s)) => Some(s),
            _ => None,
        }
    }

    fn stored(&self, key: &K) -> Option<&Stored> {
        self.entries.get(key)?.state.as_ref()
    }

    /// Writes `state` for `key`, or drops it when it holds nothing at `now`.
    fn put(&mut self, key: &K, state: Stored, now: Nanos) {
        if let Some(entry) = self.entries.get_mut(key) {
            let empty = entry.alg.is_some_and(|alg| empty_at(&alg, &state) <= now)
                || matches!(&state, Stored::Log(l) if l.is_empty())
                || matches!(&state, Stored::Leases(l) if l.is_empty());
            entry.state = (!empty).then_some(state);
            entry.changed = true;
        }
    }
}

/// When `state` holds nothing any more under `alg`.
fn empty_at(alg: &Algorithm, state: &Stored) -> Nanos {
    match (alg, state) {
        (_, Stored::Flat(s)) => {
            if s.tokens >= alg.capacity() {
                s.ts
            } else {
                algorithm::full_at(alg, s)
            }
        }
        (Algorithm::SlidingWindow(sw), Stored::Window(w)) => window_empty_at(sw, w),
        (Algorithm::SlidingLog(sl), Stored::Log(l)) => l.empty_at(sl),
        (Algorithm::Concurrency(c), Stored::Leases(l)) => l.empty_at(c),
        // A state is only written under its own kind.
        _ => Nanos(i64::MIN),
    }
}

// ---- Deciding ----

impl<K: Hash + Eq + Clone> States<K> {
    /// Decides `ops` as one transaction at `now`, as the memory store does:
    /// `key(i, shard)` is the key of op `i`'s shard, which the store must
    /// have read (a key it did not read counts as no row). On an allowed
    /// transaction that consumes, every op's write is made; otherwise none.
    pub fn transact(
        &mut self,
        ops: &[Op<'_>],
        key: impl Fn(usize, u32) -> K,
        mode: Mode,
        now: Nanos,
    ) -> Result<Outcome, StoreError> {
        for op in ops {
            op.validate(mode.reserve)?;
        }
        same_kind_per_name(ops)?;
        let mut pending: SmallVec<[(K, Write); 4]> = SmallVec::new();
        let mut chosen: SmallVec<[(K, i64); 4]> = SmallVec::new();
        let mut decisions = SmallVec::new();
        for (i, op) in ops.iter().enumerate() {
            let alg = *op.limit.shard_algorithm();
            let offset = algorithm::key_offset(&alg, op.key);
            let (a, b) = op.shards();
            let (ka, kb) = (key(i, a), key(i, b));
            self.prepare(&ka, &alg, offset, now);
            self.prepare(&kb, &alg, offset, now);
            let earlier = |k: &K| pending_of(&pending, k);
            let tokens = |k: &K| self.tokens(&alg, k, offset, now, earlier(k));
            let k = if ka != kb && tokens(&kb) > tokens(&ka) {
                kb
            } else {
                ka
            };
            let (decision, next) =
                self.evaluate(&alg, &k, offset, now, earlier(&k), Call::of(op, mode));
            if let Some(next) = next {
                pending.push((k.clone(), next));
            }
            chosen.push((k, offset));
            decisions.push(decision);
        }
        let mut outcome = Outcome::from_decisions(decisions);
        if !outcome.allowed {
            // Nothing was spent: an op that would have been admitted reports
            // its key as it stands.
            for ((d, op), (k, offset)) in outcome.decisions.iter_mut().zip(ops).zip(&chosen) {
                if d.allowed {
                    let alg = op.limit.shard_algorithm();
                    let (idle, _) = self.evaluate(alg, k, *offset, now, None, Call::IDLE);
                    *d = Decision {
                        remaining: idle.remaining,
                        reset: idle.reset,
                        ..*d
                    };
                }
            }
        }
        if outcome.allowed && mode.consume {
            for (k, write) in pending {
                self.commit(&k, write, now);
            }
        }
        Ok(outcome)
    }

    /// The tokens `k` holds at `now` after what earlier ops of the
    /// transaction admitted on it: what picks the fuller of two shards.
    fn tokens(
        &self,
        alg: &Algorithm,
        k: &K,
        offset: i64,
        now: Nanos,
        earlier: Option<Write>,
    ) -> f64 {
        match (alg, earlier) {
            (_, Some(Write::Flat(s))) => algorithm::current(alg, Some(s), offset, now).tokens,
            (Algorithm::SlidingWindow(sw), Some(Write::Window(s))) => {
                window_current(sw, Some(s), offset, now).tokens
            }
            (_, Some(Write::Log(c) | Write::Lease(c, _))) => {
                self.current(alg, k, offset, now).tokens - c
            }
            _ => self.current(alg, k, offset, now).tokens,
        }
    }

    /// The tokens of `k` at `now` and the time they are counted at.
    fn current(&self, alg: &Algorithm, k: &K, offset: i64, now: Nanos) -> Value {
        match (alg, self.stored(k)) {
            (Algorithm::SlidingWindow(sw), state) => {
                let state = match state {
                    Some(Stored::Window(w)) => Some(*w),
                    _ => None,
                };
                window_current(sw, state, offset, now)
            }
            (Algorithm::SlidingLog(sl), Some(Stored::Log(l))) => l.current(sl, now),
            (Algorithm::SlidingLog(sl), _) => Log::default().current(sl, now),
            (Algorithm::Concurrency(c), Some(Stored::Leases(l))) => l.current(c, now),
            (Algorithm::Concurrency(c), _) => Leases::default().current(c, now),
            (_, _) => algorithm::current(alg, self.flat(k), offset, now),
        }
    }

    /// Decides `op` on `k` after what earlier ops admitted on it; returns the
    /// decision and, if admitted, what to write.
    fn evaluate(
        &self,
        alg: &Algorithm,
        k: &K,
        offset: i64,
        now: Nanos,
        earlier: Option<Write>,
        call: Call,
    ) -> (Decision, Option<Write>) {
        let cost = call.cost;
        match alg {
            Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_) => {
                let state = match earlier {
                    Some(Write::Flat(s)) => Some(s),
                    _ => self.flat(k),
                };
                let ev = algorithm::evaluate(alg, state, offset, now, cost, call.reserve);
                (ev.decision, ev.next.map(Write::Flat))
            }
            Algorithm::SlidingWindow(sw) => {
                let state = match (earlier, self.stored(k)) {
                    (Some(Write::Window(s)), _) | (_, Some(&Stored::Window(s))) => Some(s),
                    _ => None,
                };
                let ev = window_evaluate(sw, state, offset, now, cost);
                (ev.decision, ev.next.map(Write::Window))
            }
            Algorithm::SlidingLog(sl) => {
                let pending = match earlier {
                    Some(Write::Log(c)) => c,
                    _ => 0.0,
                };
                let d = match self.stored(k) {
                    Some(Stored::Log(log)) => log.evaluate(sl, now, pending, cost),
                    _ => Log::default().evaluate(sl, now, pending, cost),
                };
                (d, d.allowed.then_some(Write::Log(cost)))
            }
            Algorithm::Concurrency(c) => {
                let pending = match earlier {
                    Some(Write::Lease(slots, _)) => slots,
                    _ => 0.0,
                };
                let d = match self.stored(k) {
                    Some(Stored::Leases(l)) => l.evaluate(c, now, pending, cost),
                    _ => Leases::default().evaluate(c, now, pending, cost),
                };
                (d, d.allowed.then_some(Write::Lease(cost, call.lease)))
            }
        }
    }

    /// Makes an admitted op's write.
    fn commit(&mut self, k: &K, write: Write, now: Nanos) {
        let Some(alg) = self.entries.get(k).and_then(|e| e.alg) else {
            return;
        };
        let next = match (write, &alg, self.stored(k)) {
            (Write::Flat(s), _, _) => Stored::Flat(s),
            (Write::Window(w), _, _) => Stored::Window(w),
            (Write::Log(cost), Algorithm::SlidingLog(sl), state) => {
                let mut log = match state {
                    Some(Stored::Log(l)) => l.clone(),
                    _ => Log::default(),
                };
                log.commit(sl, now, cost);
                Stored::Log(log)
            }
            (Write::Lease(slots, id), Algorithm::Concurrency(c), state) => {
                let mut leases = match state {
                    Some(Stored::Leases(l)) => l.clone(),
                    _ => Leases::default(),
                };
                leases.acquire(c, now, slots, id);
                Stored::Leases(leases)
            }
            // A write is only made under the kind that made it.
            _ => return,
        };
        self.put(k, next, now);
    }
}

/// What an op asks, as [`States::evaluate`] decides it.
#[derive(Clone, Copy)]
struct Call {
    cost: f64,
    lease: u64,
    reserve: bool,
}

impl Call {
    /// Asks nothing: what a key that spent nothing reports.
    const IDLE: Call = Call {
        cost: 0.0,
        lease: 0,
        reserve: false,
    };

    fn of(op: &Op<'_>, mode: Mode) -> Call {
        Call {
            cost: op.cost,
            lease: op.lease,
            reserve: mode.reserve,
        }
    }
}

/// What the earlier ops of a transaction admitted on `k`: a flat key's or a
/// window's latest state, or the sum of the costs to log or the slots to
/// take.
fn pending_of<K: Eq>(pending: &[(K, Write)], k: &K) -> Option<Write> {
    pending
        .iter()
        .filter(|(p, _)| p == k)
        .fold(None, |acc, &(_, w)| match (acc, w) {
            (Some(Write::Log(a)), Write::Log(b)) => Some(Write::Log(a + b)),
            (Some(Write::Lease(a, _)), Write::Lease(b, id)) => Some(Write::Lease(a + b, id)),
            (_, w) => Some(w),
        })
}

// ---- Settling, releasing, reading ----

impl<K: Hash + Eq + Clone> States<K> {
    /// Settles `change` on `key` of `limit` at `now`, spread evenly over its
    /// shards `keys` (one a shard, in order), as the memory store does;
    /// returns the key as it then stands.
    pub fn settle(
        &mut self,
        limit: &Limit,
        key: &str,
        keys: &[K],
        change: Settle,
        now: Nanos,
    ) -> Result<Decision, StoreError> {
        change.validate(limit)?;
        let alg = *limit.shard_algorithm();
        let offset = algorithm::key_offset(&alg, key);
        let part = change.per_shard(limit.shards());
        let mut parts: SmallVec<[Decision; 1]> = SmallVec::new();
        for k in keys {
            self.prepare(k, &alg, offset, now);
            let next = match &alg {
                Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_) => Some(Stored::Flat(
                    algorithm::settle(&alg, self.flat(k), offset, now, part),
                )),
                Algorithm::SlidingWindow(sw) => {
                    let state = match self.stored(k) {
                        Some(Stored::Window(w)) => Some(*w),
                        _ => None,
                    };
                    Some(Stored::Window(window_settle(sw, state, offset, now, part)))
                }
                Algorithm::SlidingLog(sl) => {
                    let mut log = match self.stored(k) {
                        Some(Stored::Log(l)) => l.clone(),
                        _ => Log::default(),
                    };
                    log.settle(sl, now, part);
                    Some(Stored::Log(log))
                }
                // Refused by `validate`: slots come back by release.
                Algorithm::Concurrency(_) => None,
            };
            if let Some(next) = next {
                self.put(k, next, now);
            }
            parts.push(self.evaluate(&alg, k, offset, now, None, Call::IDLE).0);
        }
        Ok(Decision::settled(parts))
    }

    /// Releases lease `id` from whichever of `keys` (a concurrency limit's
    /// shards of one key) holds it, as the memory store does; returns
    /// whether one did.
    pub fn release(&mut self, limit: &Limit, keys: &[K], id: u64, now: Nanos) -> bool {
        let alg = *limit.shard_algorithm();
        let Algorithm::Concurrency(c) = alg else {
            return false;
        };
        // No call takes lease 0: a key brought back as every slot held
        // holds them under it, for no one to release.
        if id == 0 {
            return false;
        }
        let mut released = false;
        for k in keys {
            self.prepare(k, &alg, 0, now);
            if let Some(Stored::Leases(held)) = self.stored(k) {
                let mut held = held.clone();
                let before = held.len();
                released |= held.release(&c, now, id);
                if held.len() != before {
                    self.put(k, Stored::Leases(held), now);
                }
            }
        }
        released
    }

    /// The tokens of `key` of `limit` at `now`, summed over its shards
    /// `keys`, and the latest time they are counted at.
    pub fn value(&mut self, limit: &Limit, key: &str, keys: &[K], now: Nanos) -> Value {
        let alg = *limit.shard_algorithm();
        let offset = algorithm::key_offset(&alg, key);
        let mut total = Value {
            tokens: 0.0,
            ts: Nanos(i64::MIN),
        };
        for k in keys {
            self.prepare(k, &alg, offset, now);
            let v = self.current(&alg, k, offset, now);
            total.tokens += v.tokens;
            total.ts = total.ts.max(v.ts);
        }
        if keys.is_empty() {
            total.ts = now;
        }
        total
    }
}
