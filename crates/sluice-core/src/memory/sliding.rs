//! The states of the sliding algorithms and of concurrency limits, which
//! do not fit a flat table's two numbers: a map per table from fingerprint
//! to state, under the same stripe lock as the flat entries, so that a
//! transaction mixing the kinds stays atomic.
//!
//! A key whose window has emptied carries no information (a missing key has
//! counted nothing), so it is dropped: when a write leaves it empty, and by
//! a sweep of the whole map each time the map has doubled since the last,
//! which keeps a map of short-lived keys within twice its live keys at an
//! amortised constant cost per insert.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::flat::SWEEP_FROM;
use crate::concurrency::Leases;
use crate::config::{Algorithm, Concurrency, SlidingLog, SlidingWindow};
use crate::decision::{Decision, Value};
use crate::sliding::{
    Log, WindowState, window_current, window_emptiest, window_empty_at, window_evaluate,
    window_settle,
};
use crate::store::Settle;
use crate::time::Nanos;

/// Fingerprints are already uniform hashes: the map uses them as they are.
#[derive(Default)]
pub(super) struct FpHasher(u64);

impl Hasher for FpHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type FpMap<V> = HashMap<u64, V, BuildHasherDefault<FpHasher>>;

/// The configuration of a table whose states are not two numbers.
#[derive(Clone, Copy)]
pub(super) enum Kind<'a> {
    Window(&'a SlidingWindow),
    Log(&'a SlidingLog),
    Leases(&'a Concurrency),
}

impl Kind<'_> {
    /// The configuration of `alg`, if its states are not two numbers.
    #[inline]
    pub(super) fn of(alg: &Algorithm) -> Option<Kind<'_>> {
        match alg {
            Algorithm::SlidingWindow(sw) => Some(Kind::Window(sw)),
            Algorithm::SlidingLog(sl) => Some(Kind::Log(sl)),
            Algorithm::Concurrency(c) => Some(Kind::Leases(c)),
            Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_) => None,
        }
    }

    /// Whether `a` and `b` keep states of one kind: both in two numbers
    /// (a token bucket's and a fixed window's are read one as the other),
    /// both sliding windows, both sliding logs, or both leases.
    pub(super) fn same_states(a: &Algorithm, b: &Algorithm) -> bool {
        a.keeps_states_like(b)
    }
}

/// What an admitted operation writes, held until its transaction commits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Next {
    /// The window's state after the operation.
    Window(WindowState),
    /// A cost to log at the transaction's time.
    Log(f64),
    /// Slots to take under a lease id at the transaction's time (in
    /// pending sums, the id of the last).
    Lease(f64, u64),
}

/// The sliding states of one table.
#[derive(Default)]
pub(super) struct Sliding {
    windows: FpMap<WindowState>,
    logs: FpMap<Log>,
    leases: FpMap<Leases>,
    /// The size at which inserts next sweep the maps for emptied keys.
    sweep_at: usize,
}

impl Sliding {
    /// The number of keys held.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.windows.len() + self.logs.len() + self.leases.len()
    }

    /// Whether `fp` has a state.
    pub(super) fn contains(&self, fp: u64) -> bool {
        self.windows.contains_key(&fp)
            || self.logs.contains_key(&fp)
            || self.leases.contains_key(&fp)
    }

    /// Brings back a key that the cap forgot while it still counted
    /// something, as the fullest state that is empty by `empty_at`.
    /// Returns the change in the number of keys.
    pub(super) fn restore(
        &mut self,
        kind: Kind<'_>,
        fp: u64,
        empty_at: Nanos,
        offset: i64,
        now: Nanos,
    ) -> isize {
        let restored = match kind {
            Kind::Window(sw) => window_emptiest(sw, empty_at, offset, now)
                .map(|s| self.windows.insert(fp, s).is_none()),
            Kind::Log(sl) => {
                Log::emptiest(sl, empty_at, now).map(|l| self.logs.insert(fp, l).is_none())
            }
            Kind::Leases(c) => {
                Leases::emptiest(c, empty_at, now).map(|l| self.leases.insert(fp, l).is_none())
            }
        };
        isize::from(restored == Some(true))
    }

    /// Evaluates `cost` on `fp` at `now`, after what earlier operations of
    /// the same transaction admitted on it (`pending`); returns the
    /// decision and, if admitted, what to write (under lease `id`, on a
    /// concurrency limit).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn evaluate(
        &self,
        kind: Kind<'_>,
        fp: u64,
        offset: i64,
        now: Nanos,
        pending: Option<Next>,
        cost: f64,
        id: u64,
    ) -> (Decision, Option<Next>) {
        match kind {
            Kind::Window(sw) => {
                let state = match pending {
                    Some(Next::Window(s)) => Some(s),
                    _ => self.windows.get(&fp).copied(),
                };
                let ev = window_evaluate(sw, state, offset, now, cost);
                (ev.decision, ev.next.map(Next::Window))
            }
            Kind::Log(sl) => {
                let pending = match pending {
                    Some(Next::Log(c)) => c,
                    _ => 0.0,
                };
                let d = match self.logs.get(&fp) {
                    Some(log) => log.evaluate(sl, now, pending, cost),
                    None => Log::default().evaluate(sl, now, pending, cost),
                };
                (d, d.allowed.then_some(Next::Log(cost)))
            }
            Kind::Leases(c) => {
                let (pending, id) = match pending {
                    Some(Next::Lease(slots, _)) => (slots, id),
                    _ => (0.0, id),
                };
                let d = match self.leases.get(&fp) {
                    Some(l) => l.evaluate(c, now, pending, cost),
                    None => Leases::default().evaluate(c, now, pending, cost),
                };
                (d, d.allowed.then_some(Next::Lease(cost, id)))
            }
        }
    }

    /// The tokens of `fp` at `now`, after `pending`.
    pub(super) fn tokens(
        &self,
        kind: Kind<'_>,
        fp: u64,
        offset: i64,
        now: Nanos,
        pending: Option<Next>,
    ) -> f64 {
        match (kind, pending) {
            (Kind::Window(sw), Some(Next::Window(s))) => {
                window_current(sw, Some(s), offset, now).tokens
            }
            (Kind::Log(_), Some(Next::Log(c))) | (Kind::Leases(_), Some(Next::Lease(c, _))) => {
                self.current(kind, fp, offset, now).tokens - c
            }
            _ => self.current(kind, fp, offset, now).tokens,
        }
    }

    /// The tokens of `fp` at `now` and the time they are counted at.
    pub(super) fn current(&self, kind: Kind<'_>, fp: u64, offset: i64, now: Nanos) -> Value {
        match kind {
            Kind::Window(sw) => window_current(sw, self.windows.get(&fp).copied(), offset, now),
            Kind::Log(sl) => match self.logs.get(&fp) {
                Some(log) => log.current(sl, now),
                None => Log::default().current(sl, now),
            },
            Kind::Leases(c) => match self.leases.get(&fp) {
                Some(l) => l.current(c, now),
                None => Leases::default().current(c, now),
            },
        }
    }

    /// Writes what an admitted operation decided, dropping the key if that
    /// leaves it empty, and now and then sweeps the maps. Returns the
    /// change in the number of keys.
    pub(super) fn commit(&mut self, kind: Kind<'_>, fp: u64, next: Next, now: Nanos) -> isize {
        let delta = match (kind, next) {
            (Kind::Window(sw), Next::Window(s)) => {
                if window_empty_at(sw, &s) <= now {
                    -isize::from(self.windows.remove(&fp).is_some())
                } else {
                    isize::from(self.windows.insert(fp, s).is_none())
                }
            }
            (Kind::Log(sl), Next::Log(cost)) => {
                let before = self.logs.len();
                let log = self.logs.entry(fp).or_default();
                log.commit(sl, now, cost);
                if log.is_empty() {
                    self.logs.remove(&fp);
                }
                self.logs.len() as isize - before as isize
            }
            (Kind::Leases(c), Next::Lease(slots, id)) => {
                let before = self.leases.len();
                let held = self.leases.entry(fp).or_default();
                held.acquire(c, now, slots, id);
                if held.is_empty() {
                    self.leases.remove(&fp);
                }
                self.leases.len() as isize - before as isize
            }
            // A write of the other kind cannot happen: a table changes
            // kind only between transactions.
            _ => 0,
        };
        if delta > 0 && self.len() > self.sweep_at {
            let swept = self.drop_empty(kind, now);
            self.sweep_at = SWEEP_FROM.max(2 * self.len());
            return delta - swept as isize;
        }
        delta
    }

    /// Releases lease `id` of `fp` at `now`, dropping the key if that
    /// leaves it empty. Returns whether the lease was held, and the change
    /// in the number of keys.
    pub(super) fn release(
        &mut self,
        c: &Concurrency,
        fp: u64,
        now: Nanos,
        id: u64,
    ) -> (bool, isize) {
        let Some(held) = self.leases.get_mut(&fp) else {
            return (false, 0);
        };
        let released = held.release(c, now, id);
        if held.is_empty() {
            self.leases.remove(&fp);
            return (released, -1);
        }
        (released, 0)
    }

    /// Settles `change` on `fp` at `now`, dropping the key if that leaves
    /// it empty. Returns the key as it then stands, and the change in the
    /// number of keys. A concurrency key is never settled (the store
    /// refuses first).
    pub(super) fn settle(
        &mut self,
        kind: Kind<'_>,
        fp: u64,
        offset: i64,
        now: Nanos,
        change: Settle,
    ) -> (Decision, isize) {
        let before = self.len();
        match kind {
            Kind::Window(sw) => {
                let s = window_settle(sw, self.windows.get(&fp).copied(), offset, now, change);
                if window_empty_at(sw, &s) <= now {
                    self.windows.remove(&fp);
                } else {
                    self.windows.insert(fp, s);
                }
            }
            Kind::Log(sl) => {
                let log = self.logs.entry(fp).or_default();
                log.settle(sl, now, change);
                if log.is_empty() {
                    self.logs.remove(&fp);
                }
            }
            Kind::Leases(_) => {}
        }
        let (idle, _) = self.evaluate(kind, fp, offset, now, None, 0.0, 0);
        (idle, self.len() as isize - before as isize)
    }

    /// Drops `fp`'s state; returns the change in the number of keys.
    pub(super) fn remove(&mut self, fp: u64) -> isize {
        let had = self.windows.remove(&fp).is_some()
            | self.logs.remove(&fp).is_some()
            | self.leases.remove(&fp).is_some();
        -isize::from(had)
    }

    /// Drops the states that are empty by `now`; returns how many.
    pub(super) fn drop_empty(&mut self, kind: Kind<'_>, now: Nanos) -> usize {
        let before = self.len();
        self.retain(kind, |_, empty_at| empty_at > now);
        before - self.len()
    }

    /// When each key is empty, as (fingerprint, time).
    pub(super) fn empty_times<'a>(
        &'a self,
        kind: Kind<'a>,
    ) -> impl Iterator<Item = (u64, Nanos)> + 'a {
        let windows = self.windows.iter().filter_map(move |(&fp, s)| match kind {
            Kind::Window(sw) => Some((fp, window_empty_at(sw, s))),
            Kind::Log(_) | Kind::Leases(_) => None,
        });
        let logs = self.logs.iter().filter_map(move |(&fp, l)| match kind {
            Kind::Log(sl) => Some((fp, l.empty_at(sl))),
            Kind::Window(_) | Kind::Leases(_) => None,
        });
        let leases = self.leases.iter().filter_map(move |(&fp, l)| match kind {
            Kind::Leases(c) => Some((fp, l.empty_at(c))),
            Kind::Window(_) | Kind::Log(_) => None,
        });
        windows.chain(logs).chain(leases)
    }

    /// Keeps the keys that `keep` accepts, given each one's fingerprint and
    /// the time it is empty; a state of the other kind is never kept.
    pub(super) fn retain(&mut self, kind: Kind<'_>, mut keep: impl FnMut(u64, Nanos) -> bool) {
        match kind {
            Kind::Window(sw) => {
                self.logs.clear();
                self.leases.clear();
                self.windows
                    .retain(|&fp, s| keep(fp, window_empty_at(sw, s)));
            }
            Kind::Log(sl) => {
                self.windows.clear();
                self.leases.clear();
                self.logs.retain(|&fp, l| keep(fp, l.empty_at(sl)));
            }
            Kind::Leases(c) => {
                self.windows.clear();
                self.logs.clear();
                self.leases.retain(|&fp, l| keep(fp, l.empty_at(c)));
            }
        }
        let room = self.windows.capacity() + self.logs.capacity() + self.leases.capacity();
        if self.len() * 4 < room {
            self.windows.shrink_to_fit();
            self.logs.shrink_to_fit();
            self.leases.shrink_to_fit();
        }
    }
}
