//! A limit's keys within one stripe: flat entries for the two-number
//! algorithms, the sliding states beside them, and what the key cap forgot.

use super::flat::{Entry, FlatTable, Probe};
use super::ghosts::Ghosts;
use super::sliding::{Kind, Sliding};
use crate::algorithm::{self, State};
use crate::config::{Algorithm, Limit};
use crate::time::Nanos;

impl Entry {
    #[inline]
    pub(super) fn new(fp: u64, s: State) -> Entry {
        Entry {
            fp,
            tokens: s.tokens,
            ts: s.ts.0,
        }
    }

    #[inline]
    pub(super) fn state(&self) -> State {
        State {
            tokens: self.tokens,
            ts: Nanos(self.ts),
        }
    }
}

/// The keys of one limit within one stripe. The entries' counts, which
/// inserts write, come first: see [`Stripe`].
#[repr(C)]
pub(super) struct Table {
    pub(super) entries: FlatTable,
    /// The handle last used: its configuration is the table's, and comparing
    /// handles is cheaper than comparing configurations on every call.
    pub(super) limit: Limit,
    /// The states of a sliding algorithm's keys (empty for the others);
    /// boxed, so that the table stays small for the others.
    pub(super) sliding: Box<Sliding>,
    /// Keys the cap dropped before they were full; made at the first such
    /// drop, so a store without a cap, or that never reaches it, has none.
    pub(super) ghosts: Option<Box<Ghosts>>,
}

impl Table {
    #[inline]
    pub(super) fn alg(&self) -> Algorithm {
        *self.limit.shard_algorithm()
    }

    /// The key's state: its entry, else what the cap's eviction left of it,
    /// else none (full).
    pub(super) fn get(&self, fp: u64, offset: i64, now: Nanos) -> Option<State> {
        match self.entries.get(fp) {
            Some(e) => Some(e.state()),
            None => self.forgotten(fp, offset, now),
        }
    }

    /// The state of a key that has no entry: full, unless the cap dropped
    /// it while it was short of tokens, in which case it is no fuller now
    /// than it would have been.
    #[inline]
    pub(super) fn forgotten(&self, fp: u64, offset: i64, now: Nanos) -> Option<State> {
        let full_at = self.ghosts.as_ref()?.recall(fp, now)?;
        algorithm::emptiest_full_by(&self.alg(), full_at, offset, now)
    }

    /// Stores `s`, or forgets the key when `s` is full. Returns the change in
    /// the number of entries.
    pub(super) fn put(&mut self, fp: u64, s: State) -> isize {
        let probe = self.entries.find(fp);
        self.put_at(probe, fp, s)
    }

    /// [`Table::put`] where the key has already been looked up.
    #[inline]
    pub(super) fn put_at(&mut self, probe: Probe, fp: u64, s: State) -> isize {
        let full = s.tokens >= self.limit.shard_capacity();
        self.put_as(probe, fp, s, full)
    }

    /// Stores `s`, or forgets the key when `full` says `s` is full under
    /// the configuration that wrote it.
    #[inline]
    pub(super) fn put_as(&mut self, probe: Probe, fp: u64, s: State, full: bool) -> isize {
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
    pub(super) fn remove(&mut self, fp: u64, now: Nanos) -> isize {
        if let Some(g) = &mut self.ghosts {
            g.forget(fp, now);
        }
        self.sliding.remove(fp) - isize::from(self.entries.remove(fp))
    }

    /// Brings a sliding key that the cap forgot back into the map, as the
    /// fullest state its refill time allows, so that it is read like any
    /// other. Returns the change in the number of entries.
    pub(super) fn restore(&mut self, kind: Kind<'_>, fp: u64, offset: i64, now: Nanos) -> isize {
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
    pub(super) fn forget_all(&mut self, now: Nanos) {
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
pub(super) struct Cutoff {
    pub(super) at: i64,
    pub(super) ties: usize,
}

impl Cutoff {
    pub(super) fn evicts(&mut self, full_at: Nanos) -> bool {
        let evict = full_at.0 < self.at || (full_at.0 == self.at && self.ties > 0);
        if evict && full_at.0 == self.at {
            self.ties -= 1;
        }
        evict
    }
}
