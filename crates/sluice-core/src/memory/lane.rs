//! A stripe's lane: its lock, the lock-free slots of its hottest keys, and
//! its share of the key cap.

use parking_lot::Mutex;

use super::flat::nonzero;
use super::hot::Hot;
use super::stripe::Stripe;
use crate::algorithm::State;
use crate::config::Limit;
use crate::time::Nanos;

/// Cache-line alignment keeps neighbouring stripe locks from false sharing.
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

/// One stripe: its lock, the lock-free slots of its hottest keys, and its
/// share of the key cap.
pub(super) struct Lane {
    pub(super) lock: Mutex<Stripe>,
    pub(super) hot: Hot,
    /// Entries the stripe may hold; set once, before the store is shared.
    pub(super) cap: usize,
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
    pub(super) fn maintain(&self, stripe: &mut Stripe, now: Nanos) {
        if stripe.due(self.cap) {
            self.enforce_cap(stripe, now, self.cap);
        }
    }

    /// The work of [`Lane::maintain`], out of line: a stripe is seldom over
    /// its cap.
    #[cold]
    #[inline(never)]
    pub(super) fn enforce_cap(&self, stripe: &mut Stripe, now: Nanos, cap: usize) {
        self.flush(stripe);
        stripe.maintain(now, cap);
    }

    /// Moves every hot key back into its table.
    pub(super) fn flush(&self, stripe: &mut Stripe) {
        self.hot.drain(|held| stripe.write_back(held));
    }

    /// Moves `tag` back into its table if a slot holds it.
    pub(super) fn cool(&self, stripe: &mut Stripe, tag: u64) {
        if let Some(held) = self.hot.take(tag) {
            stripe.write_back(held);
        }
    }

    /// Gives `tag` a hot slot, writing back the key it displaces.
    pub(super) fn heat(&self, stripe: &mut Stripe, tag: u64, at: (u64, usize), state: State) {
        let cap = stripe.tables[at.1].alg().capacity();
        if let Some(held) = self.hot.install(tag, at, state, cap) {
            stripe.write_back(held);
        }
    }
}

/// The hot-slot tag of a key: its fingerprint mixed with its limit's name.
#[inline]
pub(super) fn hint_tag(fp: u64, limit: &Limit) -> u64 {
    nonzero(fp ^ limit.name_tag())
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
}
