//! Lock-free copies of the states of recently denied keys, so that a key
//! under abuse is denied without taking its shard's lock.
//!
//! Each slot is a small seqlock built from atomics. Only the holder of the
//! shard lock writes a slot, and it keeps the slot equal to the table entry it
//! mirrors, so a reader that sees a stable sequence number holds the key's
//! exact state at that instant, not an estimate. Readers never write, which
//! is the point: a denied hot key's cache line stays shared between cores.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering, fence};

use crate::algorithm::State;
use crate::time::Nanos;

/// Slots per shard lock. A direct-mapped cache this small holds the few keys
/// that are hammered hard; keys that merely share a slot take turns in it.
const SLOTS: usize = 64;

#[derive(Default)]
struct Slot {
    /// Odd while a write is in progress.
    seq: AtomicU64,
    /// The key's fingerprint mixed with its limit's name; 0 is empty.
    tag: AtomicU64,
    tokens: AtomicU64,
    ts: AtomicI64,
}

const EMPTY: State = State {
    tokens: 0.0,
    ts: Nanos(0),
};

pub(super) struct Hints {
    slots: Box<[Slot]>,
}

impl Default for Hints {
    fn default() -> Self {
        Hints {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        }
    }
}

impl Hints {
    fn slot(&self, tag: u64) -> &Slot {
        // Bits the lock index and the table placement don't use.
        &self.slots[(tag >> 16) as usize % SLOTS]
    }

    /// The state held for `tag`, if it is held and no write was in progress.
    pub(super) fn get(&self, tag: u64) -> Option<State> {
        let slot = self.slot(tag);
        let before = slot.seq.load(Ordering::Acquire);
        if before & 1 == 1 || slot.tag.load(Ordering::Relaxed) != tag {
            return None;
        }
        let tokens = f64::from_bits(slot.tokens.load(Ordering::Relaxed));
        let ts = slot.ts.load(Ordering::Relaxed);
        // Orders the data loads before the second read of the sequence.
        fence(Ordering::Acquire);
        let tag_after = slot.tag.load(Ordering::Relaxed);
        (slot.seq.load(Ordering::Relaxed) == before && tag_after == tag).then_some(State {
            tokens,
            ts: Nanos(ts),
        })
    }

    /// Holds `state` for `tag`, evicting whatever shared the slot. The caller
    /// holds the shard lock.
    pub(super) fn put(&self, tag: u64, state: State) {
        self.write(self.slot(tag), tag, state);
    }

    /// Mirrors a write of `tag`'s state (`None`: the key was dropped) if the
    /// slot holds it. The caller holds the shard lock.
    pub(super) fn update(&self, tag: u64, state: Option<State>) {
        let slot = self.slot(tag);
        if slot.tag.load(Ordering::Relaxed) != tag {
            return;
        }
        match state {
            Some(s) => self.write(slot, tag, s),
            None => self.write(slot, 0, EMPTY),
        }
    }

    /// Forgets every slot, after entries were dropped wholesale. The caller
    /// holds the shard lock.
    pub(super) fn clear(&self) {
        for slot in self.slots.iter() {
            if slot.tag.load(Ordering::Relaxed) != 0 {
                self.write(slot, 0, EMPTY);
            }
        }
    }

    fn write(&self, slot: &Slot, tag: u64, state: State) {
        let seq = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // Readers that see any of the new data also see the odd sequence.
        fence(Ordering::Release);
        slot.tag.store(tag, Ordering::Relaxed);
        slot.tokens.store(state.tokens.to_bits(), Ordering::Relaxed);
        slot.ts.store(state.ts.0, Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(2), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(tokens: f64, ts: i64) -> State {
        State {
            tokens,
            ts: Nanos(ts),
        }
    }

    #[test]
    fn holds_only_what_was_put_and_follows_updates() {
        let h = Hints::default();
        assert_eq!(h.get(7 << 16), None);
        h.put(7 << 16, st(0.5, 10));
        assert_eq!(h.get(7 << 16), Some(st(0.5, 10)));
        // Same slot, other key: a miss, and updates to it are ignored.
        let other = (7 << 16) | 1;
        assert_eq!(h.get(other), None);
        h.update(other, Some(st(9.0, 11)));
        assert_eq!(h.get(7 << 16), Some(st(0.5, 10)));
        h.update(7 << 16, Some(st(0.25, 12)));
        assert_eq!(h.get(7 << 16), Some(st(0.25, 12)));
        h.update(7 << 16, None);
        assert_eq!(h.get(7 << 16), None);
        h.put(other, st(1.0, 1));
        h.clear();
        assert_eq!(h.get(other), None);
    }

    #[test]
    fn readers_never_see_a_torn_state() {
        // Every write keeps tokens == ts; a torn read would break that.
        let h = Hints::default();
        let tag = 3 << 16;
        h.put(tag, st(0.0, 0));
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 1..200_000i64 {
                    h.put(tag, st(i as f64, i));
                }
                done.store(true, Ordering::Release);
            });
            loop {
                let finished = done.load(Ordering::Acquire);
                if let Some(s) = h.get(tag) {
                    assert_eq!(s.tokens, s.ts.0 as f64);
                }
                if finished {
                    break;
                }
            }
        });
        assert_eq!(h.get(tag), Some(st(199_999.0, 199_999)));
    }
}
