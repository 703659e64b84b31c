//! Lock-free homes for a stripe's hottest keys: the keys that are denied
//! under abuse, or that several threads decide at once.
//!
//! Each slot is a seqlock built from atomics that holds one key's state.
//! While a slot holds a key, the slot is that key's state and the stripe
//! table's entry is at most a stale copy (`dirty` says whether it is). A
//! decision reads the slot, evaluates, and commits with one compare-and-swap
//! of the sequence number, so it is linearizable without the stripe lock: a
//! hot key costs one cache line and one atomic read-modify-write, where the
//! lock costs two and a table probe. A denial or a check writes nothing, so
//! a key under abuse stays in shared cache lines on every core.
//!
//! Only the holder of the stripe lock moves keys in or out of slots, which
//! is what lets the locked path trust that a key not in a slot stays out.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering, fence};

use crate::algorithm::State;
use crate::decision::Decision;
use crate::time::Nanos;

/// Slots per stripe lock. A direct-mapped cache this small holds the few keys
/// that are hammered hard; keys that merely share a slot take turns in it.
const SLOTS: usize = 4;

/// Spins before a waiter yields its core to a writer that may be preempted.
const SPINS: u32 = 64;

/// One slot, on its own cache line: two hot keys in neighbouring slots must
/// not slow each other down.
#[derive(Default)]
#[repr(align(64))]
struct Slot {
    /// Odd while a write is in progress.
    seq: AtomicU64,
    /// The key's fingerprint mixed with its limit's name; 0 is empty.
    tag: AtomicU64,
    tokens: AtomicU64,
    ts: AtomicI64,
    /// Whether the state changed since it left the table.
    dirty: AtomicBool,
    /// The capacity of the configuration that wrote the state: a bucket
    /// written full is dropped, as the locked path drops it, even if the
    /// table's configuration has changed since.
    cap: AtomicU64,
    /// Where the state belongs in the stripe: fingerprint and table index.
    /// Written and read only under the stripe lock.
    fp: AtomicU64,
    table: AtomicUsize,
}

/// A key that left its slot, for the caller to write back to its table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Displaced {
    pub(super) fp: u64,
    pub(super) table: usize,
    pub(super) state: State,
    /// Whether `state` differs from the table's entry.
    pub(super) dirty: bool,
    /// Whether `state` was full when written.
    pub(super) full: bool,
}

/// A stripe's slots, inline: a lock-free decision finds its slot from the
/// stripe's address alone, with no pointer to load first, and on lines that
/// nothing written under the stripe lock shares.
pub(super) struct Hot {
    slots: [Slot; SLOTS],
}

impl Default for Hot {
    fn default() -> Self {
        Hot {
            slots: std::array::from_fn(|_| Slot::default()),
        }
    }
}

/// Spins, then yields: a writer holds a slot for a few stores, but it may
/// have been preempted holding it.
fn backoff(spins: &mut u32) {
    if *spins < SPINS {
        *spins += 1;
        spin_loop();
    } else {
        std::thread::yield_now();
    }
}

impl Slot {
    #[inline]
    fn state(&self) -> State {
        State {
            tokens: f64::from_bits(self.tokens.load(Ordering::Relaxed)),
            ts: Nanos(self.ts.load(Ordering::Relaxed)),
        }
    }

    /// Takes the slot for writing and returns its even sequence number.
    #[inline]
    fn claim(&self) -> u64 {
        let mut spins = 0;
        loop {
            let seq = self.seq.load(Ordering::Relaxed);
            if seq & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // Readers that see any of the new data also see the odd
                // sequence number.
                fence(Ordering::Release);
                return seq;
            }
            backoff(&mut spins);
        }
    }

    #[inline]
    fn release(&self, seq: u64) {
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    #[inline]
    fn store(&self, state: State, cap: f64) {
        self.tokens.store(state.tokens.to_bits(), Ordering::Relaxed);
        self.ts.store(state.ts.0, Ordering::Relaxed);
        self.cap.store(cap.to_bits(), Ordering::Relaxed);
    }

    /// Empties a claimed slot, returning what it held.
    #[inline]
    fn evict(&self) -> Option<Displaced> {
        let tag = self.tag.load(Ordering::Relaxed);
        if tag == 0 {
            return None;
        }
        self.tag.store(0, Ordering::Relaxed);
        let state = self.state();
        Some(Displaced {
            fp: self.fp.load(Ordering::Relaxed),
            table: self.table.load(Ordering::Relaxed),
            state,
            dirty: self.dirty.load(Ordering::Relaxed),
            full: state.tokens >= f64::from_bits(self.cap.load(Ordering::Relaxed)),
        })
    }
}

impl Hot {
    #[inline]
    fn slot(&self, tag: u64) -> &Slot {
        // Bits the lock index and the table placement don't use.
        &self.slots[(tag >> 16) as usize % SLOTS]
    }

    /// Decides for `tag` from its slot. `step` maps the state to the state
    /// to store (`None`: nothing changes) and to a function that makes the
    /// decision; the state is committed when `commit` is set, and `cap` is
    /// the capacity of the configuration `step` applies. The decision is made
    /// only once the commit has landed: between reading the state and
    /// committing, another thread's commit makes this one start over, so that
    /// span is kept to the arithmetic the next state needs.
    /// Returns `None` when no slot holds `tag`; the caller then takes the
    /// stripe lock. `step` may run more than once, if another thread commits
    /// first.
    #[inline]
    pub(super) fn decide<D: FnOnce() -> Decision>(
        &self,
        tag: u64,
        cap: f64,
        commit: bool,
        mut step: impl FnMut(State) -> (Option<State>, D),
    ) -> Option<Decision> {
        let slot = self.slot(tag);
        let mut spins = 0;
        loop {
            let seq = slot.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                backoff(&mut spins);
                continue;
            }
            if slot.tag.load(Ordering::Relaxed) != tag {
                return None;
            }
            let state = slot.state();
            // Orders the data loads before the second read of the sequence.
            fence(Ordering::Acquire);
            if slot.seq.load(Ordering::Relaxed) != seq {
                continue;
            }
            let (next, decision) = step(state);
            let next = match next {
                Some(next) if commit => next,
                _ => return Some(decision()),
            };
            // Commits only if nothing was written since the read: the
            // decision was made on the state it replaces.
            if slot
                .seq
                .compare_exchange_weak(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            fence(Ordering::Release);
            slot.store(next, cap);
            slot.dirty.store(true, Ordering::Relaxed);
            slot.release(seq);
            return Some(decision());
        }
    }

    /// The state held for `tag`, if a slot holds it and no write was in
    /// progress.
    #[cfg(test)]
    pub(super) fn get(&self, tag: u64) -> Option<State> {
        let mut out = None;
        self.decide(tag, 0.0, false, |s| {
            out = Some(s);
            (None, || Decision {
                allowed: true,
                capacity: 0.0,
                remaining: 0,
                retry_after: None,
                reset: 0.0,
            })
        })?;
        out
    }

    /// Gives `tag` a slot holding `state`, which the table also holds
    /// (written under a configuration of capacity `cap`). The caller holds
    /// the stripe lock, and writes back what this evicts.
    pub(super) fn install(
        &self,
        tag: u64,
        (fp, table): (u64, usize),
        state: State,
        cap: f64,
    ) -> Option<Displaced> {
        let slot = self.slot(tag);
        let seq = slot.claim();
        let out = slot.evict();
        slot.tag.store(tag, Ordering::Relaxed);
        slot.fp.store(fp, Ordering::Relaxed);
        slot.table.store(table, Ordering::Relaxed);
        slot.store(state, cap);
        slot.dirty.store(false, Ordering::Relaxed);
        slot.release(seq);
        out
    }

    /// Whether a slot holds `tag`. Exact for the holder of the stripe lock,
    /// as only it moves keys in and out.
    #[inline]
    pub(super) fn holds(&self, tag: u64) -> bool {
        self.slot(tag).tag.load(Ordering::Relaxed) == tag
    }

    /// Whether the slot `tag` would go in holds no key.
    #[inline]
    pub(super) fn vacant(&self, tag: u64) -> bool {
        self.slot(tag).tag.load(Ordering::Relaxed) == 0
    }

    /// Takes `tag` out of its slot, if one holds it. The caller holds the
    /// stripe lock.
    pub(super) fn take(&self, tag: u64) -> Option<Displaced> {
        let slot = self.slot(tag);
        if slot.tag.load(Ordering::Relaxed) != tag {
            // Only the lock holder changes tags, so this cannot go stale.
            return None;
        }
        let seq = slot.claim();
        let out = slot.evict();
        slot.release(seq);
        out
    }

    /// Empties every slot into `f`. The caller holds the stripe lock.
    pub(super) fn drain(&self, mut f: impl FnMut(Displaced)) {
        for slot in self.slots.iter() {
            if slot.tag.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let seq = slot.claim();
            let out = slot.evict();
            slot.release(seq);
            if let Some(held) = out {
                f(held);
            }
        }
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

    /// A step that takes one token, or denies at zero.
    fn take_one(s: State) -> (Option<State>, impl FnOnce() -> Decision) {
        let allowed = s.tokens >= 1.0;
        let decision = move || Decision {
            allowed,
            capacity: 0.0,
            remaining: 0,
            retry_after: None,
            reset: 0.0,
        };
        (allowed.then_some(st(s.tokens - 1.0, s.ts.0 + 1)), decision)
    }

    #[test]
    fn a_slot_holds_one_key_and_hands_it_back() {
        let h = Hot::default();
        let (a, b) = (7 << 16, (7 << 16) | 1);
        assert_eq!(h.get(a), None);
        assert_eq!(h.install(a, (11, 2), st(3.0, 10), 4.0), None);
        assert_eq!(h.get(a), Some(st(3.0, 10)));
        // Same slot, other key: a miss.
        assert_eq!(h.get(b), None);
        assert!(h.decide(a, 3.0, true, take_one).is_some_and(|d| d.allowed));
        assert_eq!(h.get(a), Some(st(2.0, 11)));
        // A check commits nothing.
        assert!(h.decide(a, 3.0, false, take_one).is_some());
        assert_eq!(h.get(a), Some(st(2.0, 11)));
        // The other key evicts it, dirty, with where it belongs, and full
        // by the capacity it was last written under.
        let evicted = h.install(b, (12, 0), st(1.0, 1), 4.0);
        assert_eq!(
            evicted,
            Some(Displaced {
                fp: 11,
                table: 2,
                state: st(2.0, 11),
                dirty: true,
                full: false,
            })
        );
        assert_eq!(h.take(a), None);
        assert_eq!(h.take(b).map(|x| x.dirty), Some(false));
        assert_eq!(h.get(b), None);
        h.install(a, (11, 2), st(1.0, 1), 1.0);
        assert_eq!(h.take(a).map(|x| x.full), Some(true));
        h.install(a, (11, 2), st(1.0, 1), 2.0);
        h.install((9 << 16) | 5, (13, 1), st(1.0, 1), 2.0);
        let mut fps = Vec::new();
        h.drain(|x| fps.push(x.fp));
        fps.sort_unstable();
        assert_eq!(fps, [11, 13]);
        assert_eq!(h.get(a), None);
    }

    #[test]
    fn concurrent_commits_are_never_lost_or_torn() {
        // Two threads take one token at a time from 200k; every commit must
        // land exactly once, and every read sees tokens and ts that agree.
        const N: i64 = 200_000;
        let h = Hot::default();
        let tag = 3 << 16;
        h.install(tag, (1, 0), st(N as f64, 0), N as f64);
        let allowed = std::thread::scope(|s| {
            let run = || {
                let mut ok = 0i64;
                loop {
                    let d = h.decide(tag, N as f64, true, |s| {
                        assert_eq!(s.tokens + s.ts.0 as f64, N as f64, "torn read");
                        take_one(s)
                    });
                    match d {
                        Some(d) if d.allowed => ok += 1,
                        Some(_) => return ok,
                        None => panic!("the key left its slot"),
                    }
                }
            };
            let a = s.spawn(run);
            let b = s.spawn(run);
            a.join().unwrap() + b.join().unwrap()
        });
        assert_eq!(allowed, N);
        assert_eq!(h.get(tag), Some(st(0.0, N)));
    }
}
