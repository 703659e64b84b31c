//! A flat open-addressing table of 24-byte entries, keyed by fingerprint.
//!
//! Linear probing over entries that hold their own key, with no separate
//! control bytes, means a lookup usually touches one cache line: at a million
//! keys that is one memory miss per decision instead of the two a SwissTable
//! takes. Deletion shifts the probe run back, so there are no tombstones.

use smallvec::SmallVec;

/// Entries a stripe holds before inserts start sweeping for full buckets
/// (and a sliding table before it sweeps for emptied keys): a small stripe
/// costs little, and leaving it alone keeps `len` exact. Small, as there are
/// many stripes: a store of short-lived keys should not hold `SWEEP_FROM` of
/// them in every stripe before its tables start to shrink.
pub(super) const SWEEP_FROM: usize = 32;

/// One key's state. A fingerprint of 0 marks an empty slot.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Entry {
    pub(super) fp: u64,
    pub(super) tokens: f64,
    pub(super) ts: i64,
}

/// Fingerprints are never 0, which marks an empty slot; folding 0 into 1
/// merges two fingerprints out of 2⁶⁴.
#[inline]
pub(super) fn nonzero(fp: u64) -> u64 {
    fp.max(1)
}

/// The counts that an insert or a sweep writes come first, before the
/// slots' pointer, which only a resize writes.
#[derive(Default)]
#[repr(C)]
pub(super) struct FlatTable {
    len: usize,
    /// Where [`FlatTable::sweep`] resumes.
    cursor: usize,
    slots: Vec<Entry>,
}

/// Where a fingerprint is, if it is present.
#[derive(Clone, Copy)]
pub(super) enum Probe {
    Found(usize),
    Vacant,
}

impl FlatTable {
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The counts that an insert or a sweep writes, for a test of where
    /// they lie.
    #[cfg(test)]
    pub(super) fn counts(&self) -> [&usize; 2] {
        [&self.len, &self.cursor]
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    #[inline]
    pub(super) fn find(&self, fp: u64) -> Probe {
        if self.slots.is_empty() {
            return Probe::Vacant;
        }
        let mask = self.mask();
        let mut i = fp as usize & mask;
        // The table is never full (load ≤ 3/4), so the loop meets an empty slot.
        loop {
            match self.slots[i].fp {
                0 => return Probe::Vacant,
                f if f == fp => return Probe::Found(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    #[inline]
    pub(super) fn get(&self, fp: u64) -> Option<&Entry> {
        match self.find(fp) {
            Probe::Found(i) => self.slots.get(i),
            Probe::Vacant => None,
        }
    }

    #[inline]
    pub(super) fn at_mut(&mut self, i: usize) -> &mut Entry {
        &mut self.slots[i]
    }

    /// Inserts an entry whose fingerprint is not present.
    pub(super) fn insert_new(&mut self, e: Entry) {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.resize((self.slots.len() * 2).max(16));
        }
        self.place(e);
        self.len += 1;
    }

    fn place(&mut self, e: Entry) {
        let mask = self.mask();
        let mut i = e.fp as usize & mask;
        while self.slots[i].fp != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = e;
    }

    /// Removes slot `i`, shifting later members of its probe run back so
    /// that every entry stays reachable from its home slot.
    pub(super) fn remove_at(&mut self, mut i: usize) {
        let mask = self.mask();
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let fp = self.slots[j].fp;
            if fp == 0 {
                break;
            }
            let home = fp as usize & mask;
            // Move j into the hole unless its home lies cyclically in (i, j].
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(i) & mask {
                self.slots[i] = self.slots[j];
                i = j;
            }
        }
        self.slots[i] = Entry::default();
        self.len -= 1;
    }

    pub(super) fn remove(&mut self, fp: u64) -> bool {
        match self.find(fp) {
            Probe::Found(i) => {
                self.remove_at(i);
                true
            }
            Probe::Vacant => false,
        }
    }

    /// Examines at least the next `budget` slots after the last sweep's,
    /// removing the entries `drop` accepts, and returns how many it removed.
    /// A sweep a few slots at a time, instead of the whole table at once,
    /// keeps every caller's wait under the stripe lock short. Once a pass over
    /// the whole table finds it sparse, it gives memory back by half.
    pub(super) fn sweep(&mut self, budget: usize, mut drop: impl FnMut(&Entry) -> bool) -> usize {
        let mut removed = 0;
        let mut examined = 0;
        while examined < budget.min(self.slots.len()) {
            let mask = self.mask();
            let i = self.cursor;
            let mut next = (i + 1) & mask;
            examined += 1;
            let e = self.slots[i];
            if e.fp != 0 && drop(&e) {
                // Removing entries one by one would shift the rest of the
                // run back each time; instead take the run out from here,
                // and put back what stays. Each entry then lands at or
                // before where it was, so the run stays within its slots.
                self.slots[i] = Entry::default();
                self.len -= 1;
                removed += 1;
                let mut run: SmallVec<[Entry; 8]> = SmallVec::new();
                while self.slots[next].fp != 0 {
                    run.push(std::mem::take(&mut self.slots[next]));
                    next = (next + 1) & mask;
                }
                examined += run.len();
                for e in run {
                    if drop(&e) {
                        self.len -= 1;
                        removed += 1;
                    } else {
                        self.place(e);
                    }
                }
            }
            let wrapped = next <= i;
            self.cursor = next;
            if wrapped && self.slots.len() > 16 && self.len * 8 < self.slots.len() {
                self.resize(self.slots.len() / 2);
                break;
            }
        }
        removed
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().filter(|e| e.fp != 0)
    }

    /// Keeps the entries `keep` accepts, and gives memory back when the
    /// table has become sparse: by half at a time, so that a table that is
    /// swept empty and refilled between sweeps does not resize over and over.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) {
        let kept: Vec<Entry> = self.iter().filter(|e| keep(e)).copied().collect();
        let mut cap = self.slots.len();
        if cap > 16 && kept.len() * 8 < cap {
            cap /= 2;
        }
        self.slots = vec![Entry::default(); cap];
        self.cursor = 0;
        self.len = kept.len();
        for e in kept {
            self.place(e);
        }
    }

    fn resize(&mut self, cap: usize) {
        self.cursor = 0;
        let old = std::mem::replace(&mut self.slots, vec![Entry::default(); cap]);
        for e in old.into_iter().filter(|e| e.fp != 0) {
            self.place(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Step {
        Put(u64, f64),
        Remove(u64),
        Retain(u64),
        Sweep(usize, u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        // Few distinct fingerprints with clustered low bits force long probe
        // runs, wrap-around and shifting on removal.
        let fp = prop_oneof![
            1u64..40,
            (0u64..8).prop_map(|k| (k << 40) | 3),
            Just(u64::MAX)
        ];
        prop_oneof![
            4 => (fp.clone(), any::<f64>()).prop_map(|(f, t)| Step::Put(f, t)),
            2 => fp.prop_map(Step::Remove),
            1 => (1u64..5).prop_map(Step::Retain),
            2 => (0usize..40, 1u64..5).prop_map(|(n, m)| Step::Sweep(n, m)),
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_a_map(steps in prop::collection::vec(step(), 0..400)) {
            let mut slots = FlatTable::default();
            let mut model: HashMap<u64, f64> = HashMap::new();
            for s in steps {
                match s {
                    Step::Put(fp, t) => match slots.find(fp) {
                        Probe::Found(i) => {
                            slots.at_mut(i).tokens = t;
                            model.insert(fp, t);
                        }
                        Probe::Vacant => {
                            prop_assert!(!model.contains_key(&fp));
                            slots.insert_new(Entry { fp, tokens: t, ts: 0 });
                            model.insert(fp, t);
                        }
                    },
                    Step::Remove(fp) => {
                        prop_assert_eq!(slots.remove(fp), model.remove(&fp).is_some());
                    }
                    Step::Retain(m) => {
                        slots.retain(|e| e.fp % m != 0);
                        model.retain(|fp, _| fp % m != 0);
                    }
                    Step::Sweep(budget, m) => {
                        let mut dropped = Vec::new();
                        let n = slots.sweep(budget, |e| {
                            let hit = e.fp % m == 0;
                            if hit {
                                dropped.push(e.fp);
                            }
                            hit
                        });
                        prop_assert_eq!(n, dropped.len());
                        for fp in dropped {
                            prop_assert!(model.remove(&fp).is_some());
                        }
                    }
                }
                prop_assert_eq!(slots.len(), model.len());
                prop_assert_eq!(slots.iter().count(), model.len());
                for (fp, t) in &model {
                    let e = slots.get(*fp);
                    prop_assert!(e.is_some_and(|e| e.tokens.to_bits() == t.to_bits()));
                }
            }
        }
    }

    #[test]
    fn sweeps_cover_the_whole_table_and_give_memory_back() {
        let mut slots = FlatTable::default();
        for fp in 1..=1000u64 {
            slots.insert_new(Entry {
                fp,
                tokens: 0.0,
                ts: 0,
            });
        }
        let cap = slots.slots.len();
        // One pass, a few slots at a time, finds every odd fingerprint.
        let mut removed = 0;
        for _ in 0..cap / 3 + 1 {
            removed += slots.sweep(3, |e| e.fp % 2 == 1);
        }
        assert_eq!(removed, 500);
        assert!((1..=1000u64).all(|fp| matches!(slots.find(fp), Probe::Found(_)) == (fp % 2 == 0)));
        assert_eq!(slots.slots.len(), cap, "half full is not sparse");
        // Emptied, the table halves after each pass that finds it sparse.
        for _ in 0..4 * cap {
            slots.sweep(1, |_| true);
        }
        assert_eq!(slots.len(), 0);
        assert!(slots.slots.len() <= cap / 2, "{} slots", slots.slots.len());
    }

    #[test]
    fn zero_is_never_a_fingerprint() {
        assert_eq!(nonzero(0), 1);
        assert_eq!(nonzero(7), 7);
    }
}
