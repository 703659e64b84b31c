//! What the key cap forgot: for each key evicted before it was full, the
//! time it would have been full again, so that the key never comes back
//! with more tokens than it left with.
//!
//! A key that is dropped because it is full loses nothing (a missing key is
//! full). A key dropped by the cap while short of tokens would, without
//! this, come back full: an attacker who floods the store with keys could
//! refill a victim's bucket at will. So every such key leaves its refill
//! time behind, and a key found neither in its table nor here is as full as
//! a key never seen.
//!
//! The table is bounded: set-associative, [`WAYS`] entries a set. When a
//! set has no room, its entry that is full soonest is folded into the set's
//! `floor`, the latest refill time of any key dropped from that set. A key
//! with no entry of its own in a set whose floor is still to come is taken
//! to be full only then. That is the trade-off: a flood of keys larger than
//! the table makes some keys, never seen or reset, start short of full
//! until the flood's own buckets would have refilled; no key ever starts
//! fuller than it was.
//!
//! An entry is the key's latest word: a key brought back from a floor, then
//! evicted again, leaves a refill time at least that floor, so an entry of
//! its own overrides the floor.

use crate::time::Nanos;

/// Entries a set holds before it folds one into its floor.
const WAYS: usize = 4;

/// Marks a slot as empty; fingerprints are never 0.
const EMPTY: u64 = 0;

/// A time earlier than any refill time: says nothing.
const NEVER: i64 = i64::MIN;

#[derive(Clone, Copy)]
struct Set {
    fps: [u64; WAYS],
    full_at: [i64; WAYS],
    /// The latest refill time of the keys folded out of this set.
    floor: i64,
}

impl Default for Set {
    fn default() -> Self {
        Set {
            fps: [EMPTY; WAYS],
            full_at: [NEVER; WAYS],
            floor: NEVER,
        }
    }
}

/// The refill times of keys evicted before they were full.
pub(super) struct Ghosts {
    sets: Box<[Set]>,
}

impl Ghosts {
    /// Room for about `keys` keys.
    pub(super) fn with_room_for(keys: usize) -> Ghosts {
        let sets = keys.div_ceil(WAYS).next_power_of_two();
        Ghosts {
            sets: vec![Set::default(); sets].into_boxed_slice(),
        }
    }

    #[inline]
    fn set(&self, fp: u64) -> usize {
        // The high bits: the table placed the key by its low bits and the
        // store chose its lock by the middle ones.
        (fp >> 48) as usize & (self.sets.len() - 1)
    }

    /// Remembers that the key `fp` is full at `full_at` and not before.
    pub(super) fn remember(&mut self, fp: u64, full_at: Nanos, now: Nanos) {
        let i = self.set(fp);
        let set = &mut self.sets[i];
        let way = match set.fps.iter().position(|&f| f == fp) {
            Some(w) => w,
            None => {
                // The entry that is full soonest says least; one that is full
                // already says nothing and is dropped without a trace.
                let w = (0..WAYS).min_by_key(|&w| set.full_at[w]).unwrap_or(0);
                if set.fps[w] != EMPTY && set.full_at[w] > now.0 {
                    set.floor = set.floor.max(set.full_at[w]);
                }
                set.fps[w] = fp;
                w
            }
        };
        set.full_at[way] = full_at.0;
    }

    /// When the forgotten key `fp` is full again, if that is after `now`.
    #[inline]
    pub(super) fn recall(&self, fp: u64, now: Nanos) -> Option<Nanos> {
        let set = &self.sets[self.set(fp)];
        let at = match set.fps.iter().position(|&f| f == fp) {
            Some(w) => set.full_at[w],
            None => set.floor,
        };
        (at > now.0).then_some(Nanos(at))
    }

    /// Rewrites every refill time with `f`, as when the limit's
    /// configuration changes.
    pub(super) fn remap(&mut self, now: Nanos, f: impl Fn(Nanos) -> Nanos) {
        for set in &mut self.sets {
            for at in set.full_at.iter_mut().chain([&mut set.floor]) {
                if *at > now.0 {
                    *at = f(Nanos(*at)).0;
                }
            }
        }
    }

    /// Records that the key `fp` is full now (it was reset), overriding a
    /// floor that would otherwise hold it back.
    pub(super) fn forget(&mut self, fp: u64, now: Nanos) {
        let i = self.set(fp);
        let set = &self.sets[i];
        if set.fps.contains(&fp) || set.floor > now.0 {
            self.remember(fp, Nanos(NEVER), now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_remembered_key_is_recalled_until_its_refill_time() {
        let mut g = Ghosts::with_room_for(16);
        g.remember(7, Nanos(100), Nanos(0));
        assert_eq!(g.recall(7, Nanos(50)), Some(Nanos(100)));
        assert_eq!(g.recall(7, Nanos(100)), None);
        assert_eq!(g.recall(8, Nanos(50)), None, "a key never evicted is full");
    }

    #[test]
    fn a_reset_key_is_full_even_under_a_floor() {
        let mut g = Ghosts::with_room_for(1);
        // One set of four: the fifth key folds the soonest-full one into the floor.
        for fp in 1..=5 {
            g.remember(fp << 48, Nanos(1000 + fp as i64), Nanos(0));
        }
        assert_eq!(g.recall(99 << 48, Nanos(0)), Some(Nanos(1001)));
        g.forget(99 << 48, Nanos(0));
        assert_eq!(g.recall(99 << 48, Nanos(0)), None);
    }

    proptest! {
        /// However full the table gets, a key is never recalled as full
        /// sooner than it was remembered to be (unless it was reset since).
        #[test]
        fn no_key_is_recalled_as_fuller_than_it_was_remembered(
            events in prop::collection::vec((1u64..40, 0i64..1000, any::<bool>()), 1..300),
        ) {
            let mut g = Ghosts::with_room_for(8);
            let mut truth: std::collections::HashMap<u64, i64> = Default::default();
            for (i, (key, full_at, reset)) in events.into_iter().enumerate() {
                // Spread keys over the few sets by their high bits.
                let fp = key << 47 | key;
                let now = Nanos(i as i64);
                if reset {
                    g.forget(fp, now);
                    truth.remove(&fp);
                } else {
                    g.remember(fp, Nanos(full_at), now);
                    truth.insert(fp, full_at);
                }
                for (&fp, &at) in &truth {
                    if at > now.0 {
                        prop_assert!(g.recall(fp, now).is_some_and(|r| r.0 >= at));
                    }
                }
            }
        }
    }
}
