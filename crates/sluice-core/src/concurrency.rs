//! Concurrency limits as pure functions: the leases a key holds, a
//! configuration, the time and a call go in; a [`Decision`] and the leases
//! to keep come out.
//!
//! A key's leases count like a sliding log whose window is the lease: a
//! lease is an entry taken at its acquisition, holding its slots until it
//! is released or a lease's length has passed. So a call is decided from a
//! [`LogReading`], by the same [`LogReading::decide`] as a sliding log's
//! (see [`Concurrency::as_log`]), and only releasing is new. Slots are whole,
//! so every sum here is exact.

use std::collections::VecDeque;

use crate::config::Concurrency;
use crate::decision::{Decision, Value};
use crate::sliding::LogReading;
use crate::time::Nanos;

/// One lease: when it was taken, how many slots it holds, and its id.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Lease {
    t: i64,
    slots: f64,
    id: u64,
}

/// The leases one key holds, oldest first. A key without leases has every
/// slot free.
///
/// ```
/// use sluice_core::{Concurrency, Nanos, concurrency::Leases};
/// let c = Concurrency::new(2.0, Nanos(60)).unwrap();
/// let mut key = Leases::default();
/// key.acquire(&c, Nanos(0), 1.0, 7);
/// key.acquire(&c, Nanos(1), 1.0, 8);
/// assert!(!key.evaluate(&c, Nanos(2), 0.0, 1.0).allowed);
/// assert!(key.release(&c, Nanos(3), 7));
/// assert!(!key.release(&c, Nanos(3), 7), "released once");
/// assert!(key.evaluate(&c, Nanos(3), 0.0, 1.0).allowed);
/// // A lease never released frees its slot when it expires.
/// assert!(key.evaluate(&c, Nanos(61), 0.0, 2.0).allowed);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Leases {
    leases: VecDeque<Lease>,
    /// The slots of every lease held, expired or not. Slots are whole, so
    /// the sum is exact however it was reached: a call reads it instead of
    /// adding up every lease, so that a key holding many leases costs a
    /// call no more than one holding few (a store such as Redis runs calls
    /// one at a time).
    held: f64,
}

impl Leases {
    /// How many leases are held (some may have expired and not yet been
    /// dropped).
    #[inline]
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Whether no lease is held.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The time the key is read at for a call at `now`: never before its
    /// newest lease, so that a clock that steps back sees no lease expire
    /// early, and leases stay in order.
    // Twin in sluice-redis's Lua script: read_at.
    #[inline]
    fn at(&self, now: Nanos) -> i64 {
        self.leases.back().map_or(now.0, |l| l.t.max(now.0))
    }

    /// How many leases, oldest first, have expired by `at`.
    // Twin in sluice-redis's Lua script: expired.
    #[inline]
    fn expired(&self, c: &Concurrency, at: i64) -> usize {
        let cutoff = at.saturating_sub(c.lease().0);
        self.leases.partition_point(|l| l.t <= cutoff)
    }

    /// What a call of `slots` at `now`, after `pending` slots taken at
    /// `now` by earlier operations of the same transaction, is decided
    /// from: the slots in flight as a sliding log's `used`, and, for a call
    /// that does not fit, the lease whose expiry would let it in.
    ///
    /// ```
    /// use sluice_core::{Concurrency, Nanos, concurrency::Leases};
    /// let c = Concurrency::new(2.0, Nanos(10)).unwrap();
    /// let mut key = Leases::default();
    /// key.acquire(&c, Nanos(1), 2.0, 5);
    /// let r = key.read(&c, Nanos(4), 0.0, 1.0);
    /// assert_eq!((r.used, r.frees_at, r.newest), (2.0, Nanos(1), Some(Nanos(1))));
    /// ```
    // Twin in sluice-redis's Lua script: lease_read, walk, walk_back.
    pub fn read(&self, c: &Concurrency, now: Nanos, pending: f64, slots: f64) -> LogReading {
        let at = self.at(now);
        let gone = self.expired(c, at);
        let used = self.held_after(gone);
        let live = self.leases.range(gone..);
        let mut left = used + pending;
        // The slots that must leave for the call to fit, and those that may
        // stay held. Past every lease only the pending slots are left, which
        // expire a lease after `at`: if they alone leave no room, no lease's
        // leaving helps.
        let need = left + slots - c.max();
        let keep = c.max() - slots - pending;
        let frees_at = if need <= 0.0 || keep < 0.0 {
            at
        } else if keep + 1.0 < need {
            // The lease sought is the newest whose slots, with the newer
            // ones', come to more than may stay. Every lease holds a slot
            // at least, so walking from whichever end is nearer to it
            // visits at most `keep + 1` or `need` leases, not all of a fat
            // key's: a call asking for every slot of a full key finds it
            // at once. Slots are whole, so both walks meet exactly.
            let mut newer = 0.0;
            live.clone()
                .rev()
                .find(|l| {
                    newer += l.slots;
                    newer > keep
                })
                .map_or(at, |l| l.t)
        } else {
            live.clone()
                .find(|l| {
                    left -= l.slots;
                    left + slots <= c.max()
                })
                .map_or(at, |l| l.t)
        };
        LogReading {
            at: Nanos(at),
            used,
            newest: live.last().map(|l| Nanos(l.t)),
            frees_at: Nanos(frees_at),
        }
    }

    /// The slots held by the leases from index `gone` on: the total less
    /// those before it, or those after it, whichever are fewer to add up.
    // Twin in sluice-redis's Lua script: held_after.
    fn held_after(&self, gone: usize) -> f64 {
        if gone == 0 {
            self.held
        } else if gone <= self.leases.len() - gone {
            self.held - self.leases.range(..gone).map(|l| l.slots).sum::<f64>()
        } else {
            self.leases.range(gone..).map(|l| l.slots).sum()
        }
    }

    /// Decides a call of `slots` at `now`, after `pending`. Changes
    /// nothing: see [`Leases::acquire`].
    #[inline]
    pub fn evaluate(&self, c: &Concurrency, now: Nanos, pending: f64, slots: f64) -> Decision {
        self.read(c, now, pending, slots)
            .decide(&c.as_log(), pending, slots)
    }

    /// Takes `slots` under lease `id` at `now` (at the newest lease's time,
    /// if the clock stepped back), after dropping the leases that have
    /// expired. A call of 0 slots takes no lease.
    // Twin in sluice-redis's Lua script: lease_acquire.
    pub fn acquire(&mut self, c: &Concurrency, now: Nanos, slots: f64, id: u64) {
        let at = self.at(now);
        self.expire(c, at);
        if slots > 0.0 {
            if self.leases.capacity() == 0 {
                self.leases.reserve_exact(1);
            }
            self.leases.push_back(Lease { t: at, slots, id });
            self.held += slots;
        }
    }

    /// Gives back the slots of lease `id`, after dropping the leases that
    /// have expired; returns whether it was still held. Releasing a lease
    /// that is unknown, expired or already released changes nothing.
    // Twin in sluice-redis's Lua script: lease_release.
    pub fn release(&mut self, c: &Concurrency, now: Nanos, id: u64) -> bool {
        let at = self.at(now);
        self.expire(c, at);
        match self.leases.iter().position(|l| l.id == id) {
            Some(i) => {
                if let Some(l) = self.leases.remove(i) {
                    self.held -= l.slots;
                }
                true
            }
            None => false,
        }
    }

    // Twin in sluice-redis's Lua script: lease_expire.
    fn expire(&mut self, c: &Concurrency, at: i64) {
        let gone = self.expired(c, at);
        if gone == 0 {
            return;
        }
        self.held = self.held_after(gone);
        self.leases.drain(..gone);
        if self.leases.capacity() > 8 && self.leases.len() * 4 < self.leases.capacity() {
            self.leases.shrink_to(self.leases.len() * 2);
        }
    }

    /// Appends the key's bytes, for a store to keep: the slots held, then
    /// each lease's time, slots and id, oldest first.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(8 + 24 * self.leases.len());
        out.extend(self.held.to_le_bytes());
        for l in &self.leases {
            out.extend(l.t.to_le_bytes());
            out.extend(l.slots.to_le_bytes());
            out.extend(l.id.to_le_bytes());
        }
    }

    /// A key from [`Leases::encode`]'s bytes: all that `r` holds.
    pub(crate) fn decode(r: &mut crate::bytes::Reader<'_>) -> Option<Leases> {
        let held = r.f64()?;
        if !r.left().is_multiple_of(24) || r.left() / 24 > crate::MAX_SLOTS as usize {
            return None;
        }
        let mut leases = VecDeque::with_capacity(r.left() / 24);
        while r.left() > 0 {
            leases.push_back(Lease {
                t: r.i64()?,
                slots: r.f64()?,
                id: r.u64()?,
            });
        }
        Some(Leases { leases, held })
    }

    /// The slots free at `now`, and the time they are counted at.
    pub fn current(&self, c: &Concurrency, now: Nanos) -> Value {
        self.read(c, now, 0.0, 0.0).current(&c.as_log())
    }

    /// When every lease has expired: a lease after the newest was taken.
    /// From then on the key holds nothing, and a store may drop it.
    #[inline]
    pub fn empty_at(&self, c: &Concurrency) -> Nanos {
        self.leases
            .back()
            .map_or(Nanos(i64::MIN), |l| Nanos(l.t.saturating_add(c.lease().0)))
    }

    /// The fullest key (every slot taken, at `now` and every later time) of
    /// any that is known only to be empty by `empty_at`, or `None` when that
    /// time has come: every slot, under one lease taken a lease before
    /// `empty_at` (or at `now`, if that is earlier), which no id can
    /// release. A store that forgot a key brings it back as this.
    // Twin in sluice-redis's Lua script: leases_of.
    pub fn emptiest(c: &Concurrency, empty_at: Nanos, now: Nanos) -> Option<Leases> {
        if empty_at <= now {
            return None;
        }
        let t = empty_at.0.saturating_sub(c.lease().0).min(now.0);
        Some(Leases {
            leases: VecDeque::from([Lease {
                t,
                slots: c.max(),
                id: 0,
            }]),
            held: c.max(),
        })
    }
}
