//! A lock stripe: the tables of the keys whose fingerprints fall in it,
//! under one small lock, and the key cap's work on them.

use smallvec::SmallVec;

use super::flat::{FlatTable, SWEEP_FROM};
use super::ghosts::Ghosts;
use super::hot::{Displaced, Hot};
use super::sliding::Kind;
use super::table::{Cutoff, Table};
use crate::algorithm;
use crate::config::Limit;
use crate::time::Nanos;

/// Entries an insert sweeps. A pass over a table then takes a quarter as many
/// inserts as it has slots, so when every key is short-lived a table stays
/// about a quarter full and never grows.
pub(super) const SWEEP_STEP: usize = 4;

/// How many recently denied keys a stripe remembers.
pub(super) const DENIED: usize = 4;

/// What a decision writes in a stripe comes first, in declared order: the
/// denied keys, the count and, at the start of the first table, that
/// table's own counts. They then share the lock's cache line, which two
/// cores deciding keys all over the store pass back and forth; a second
/// written line would cross between them as often (see the test
/// `the_fields_a_decision_writes_share_the_lock_s_cache_line`).
#[derive(Default)]
#[repr(C)]
pub(super) struct Stripe {
    /// The low halves of the hot-slot tags of the stripe's last few denied
    /// keys, oldest overwritten first. Halves, so that the ring fits on the
    /// lock's line with the counts: they tell a few keys apart well enough,
    /// and a key mistaken for another only earns a hot slot early.
    denied: [u32; DENIED],
    denied_next: usize,
    pub(super) len: usize,
    /// A store most often holds one limit, whose table then sits next to
    /// the lock, on lines no other stripe writes, rather than in a small
    /// heap block beside another stripe's.
    pub(super) tables: SmallVec<[Table; 1]>,
}

impl Stripe {
    /// Whether `tag` is among the stripe's last few denied keys; if not, it
    /// is now. A key denied twice in a short while is likely to be asked
    /// again, the pattern of abuse, and earns a hot slot; a key denied once
    /// may be one of a stream of distinct keys, each of which would evict the
    /// slot's key only to be evicted in turn, two table writes a denial.
    pub(super) fn denied_again(&mut self, tag: u64) -> bool {
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
    pub(super) fn table(&mut self, limit: &Limit, now: Nanos, hot: &Hot) -> usize {
        match self.tables.iter().position(|t| t.limit.same(limit)) {
            Some(i) => i,
            None => self.new_table(limit, now, hot),
        }
    }

    /// [`Stripe::table`] for a handle no table was last used with: a new
    /// limit, or a new handle to one (a reload).
    #[cold]
    #[inline(never)]
    pub(super) fn new_table(&mut self, limit: &Limit, now: Nanos, hot: &Hot) -> usize {
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

    pub(super) fn apply(&mut self, delta: isize) {
        self.len = self.len.saturating_add_signed(delta);
    }

    /// Counts a write to table `t`; after an insert into a large table, also
    /// sweeps a few of its slots for buckets that are full by `now`.
    ///
    /// The sweep may drop the entry of a key that sits in a hot slot, which
    /// is lossless: a slot that changed the state writes it back when it
    /// lets the key go, and one that did not holds the same full state.
    #[inline]
    pub(super) fn count_write(&mut self, t: usize, delta: isize, now: Nanos) {
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
    pub(super) fn sweep(&mut self, t: usize, now: Nanos) {
        if let Some(table) = self.tables.get_mut(t) {
            let alg = table.alg();
            let removed = table
                .entries
                .sweep(SWEEP_STEP, |e| algorithm::full_at(&alg, &e.state()) <= now);
            self.apply(-isize::try_from(removed).unwrap_or(isize::MAX));
        }
    }

    /// Whether [`Stripe::maintain`] has work to do.
    pub(super) fn due(&self, cap: usize) -> bool {
        self.len > cap
    }

    /// Enforces the key cap: drops the full buckets, then, if that is not
    /// enough, the buckets nearest to full, which hold the least.
    pub(super) fn maintain(&mut self, now: Nanos, cap: usize) {
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
    pub(super) fn write_back(&mut self, held: Displaced) {
        if held.dirty
            && let Some(t) = self.tables.get_mut(held.table)
        {
            let probe = t.entries.find(held.fp);
            let delta = t.put_as(probe, held.fp, held.state, held.full);
            self.apply(delta);
        }
    }

    pub(super) fn recount(&mut self) {
        self.len = self
            .tables
            .iter()
            .map(|t| t.entries.len() + t.sliding.len())
            .sum();
    }

    /// Drops the entries nearest to full until `target` are left, leaving
    /// each one's refill time behind in its table's ghosts (room for `cap`).
    pub(super) fn evict_nearest_full(&mut self, target: usize, now: Nanos, cap: usize) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    use crate::memory::lane::{Lane, Padded};

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
}
