//! The exact local deny cache.
//!
//! A token bucket only gains tokens with time, and other servers can only take
//! tokens away. So the tokens Redis last reported for a key, plus what time
//! could have added since the request that learned them was *sent*, bound the
//! tokens available now from above. When even that bound is short of the
//! cost, the denial is certain and Redis need not be asked.
//!
//! A reset is the one thing that gives a key tokens faster than time does:
//! the key is forgotten, and replies to requests sent before the reset are
//! not learned. Resets made elsewhere reach this cache through Redis pub/sub
//! (see `resets`); when some may have been missed, the whole cache is
//! cleared the same way.

use std::hash::{BuildHasher, RandomState};

use parking_lot::Mutex;
use sluice_core::algorithm::{self, State};
use sluice_core::{Algorithm, Decision, Nanos};

#[derive(Clone, Copy)]
struct Entry {
    fp: u64,
    /// The configuration the bound was learned under: a changed limit must
    /// not reuse it.
    alg: Algorithm,
    /// Tokens at most available at `ts` (local time).
    bound: State,
}

#[derive(Default)]
struct Slot {
    entry: Option<Entry>,
    /// The last reset of a key in this slot: a reply to a request sent before
    /// it describes the state before the reset, and must not be learned.
    reset_at: Nanos,
}

/// A shortfall of tokens within this share of a bucket (or of the cost, if
/// larger) may be rounding rather than a shortfall: far above a double's
/// rounding error, far below any token a client could notice.
const ROUNDING: f64 = 1e-9;

/// A direct-mapped table of upper bounds, one small lock per slot.
pub(crate) struct DenyCache {
    slots: Box<[Mutex<Slot>]>,
    hasher: RandomState,
}

impl DenyCache {
    pub(crate) fn new(slots: usize) -> DenyCache {
        DenyCache {
            slots: (0..slots.next_power_of_two())
                .map(|_| Mutex::new(Slot::default()))
                .collect(),
            hasher: RandomState::new(),
        }
    }

    /// The fingerprint of one key (shard 0 when unsharded) of one limit.
    pub(crate) fn fingerprint(&self, limit: &str, key: &str, shard: u32) -> u64 {
        self.hasher.hash_one((limit, key, shard))
    }

    fn slot(&self, fp: u64) -> &Mutex<Slot> {
        &self.slots[fp as usize & (self.slots.len() - 1)]
    }

    /// The key's bound, if the cache holds one for this algorithm: the
    /// most tokens it can have had at the bound's time.
    pub(crate) fn bound(&self, fp: u64, alg: &Algorithm) -> Option<State> {
        let entry = self.slot(fp).lock().entry?;
        (entry.fp == fp && entry.alg == *alg).then_some(entry.bound)
    }

    /// A certain denial of `cost` at local time `now`, if the bound proves one.
    pub(crate) fn deny(
        &self,
        fp: u64,
        alg: &Algorithm,
        now: Nanos,
        cost: f64,
        reserve: bool,
    ) -> Option<Decision> {
        let entry = self.slot(fp).lock().entry?;
        if entry.fp != fp || entry.alg != *alg {
            return None;
        }
        let ev = algorithm::evaluate(alg, Some(entry.bound), 0, now, cost, reserve);
        if ev.decision.allowed {
            return None;
        }
        // Redis worked the bound out in doubles, and refilling it here rounds
        // again: a key that holds exactly enough (a penalty's gate the moment
        // it opens) can come out a rounding error short. Only a shortfall
        // beyond rounding is certain; Redis decides the rest exactly.
        let slack = ROUNDING * alg.capacity().max(cost).max(1.0);
        let raised = State {
            tokens: entry.bound.tokens + slack,
            ..entry.bound
        };
        let sure = !algorithm::evaluate(alg, Some(raised), 0, now, cost, reserve)
            .decision
            .allowed;
        sure.then_some(ev.decision)
    }

    /// Records that the key had at most `tokens` when Redis answered a request
    /// sent at local time `sent`.
    pub(crate) fn learn(&self, fp: u64, alg: &Algorithm, tokens: f64, sent: Nanos) {
        let bound = State { tokens, ts: sent };
        let mut slot = self.slot(fp).lock();
        if sent >= slot.reset_at {
            slot.entry = Some(Entry {
                fp,
                alg: *alg,
                bound,
            });
        }
    }

    /// Forgets the key, reset at local time `now`, and ignores what replies
    /// to requests sent before then say about it.
    pub(crate) fn forget(&self, fp: u64, now: Nanos) {
        let mut slot = self.slot(fp).lock();
        if slot.entry.is_some_and(|e| e.fp == fp) {
            slot.entry = None;
        }
        slot.reset_at = slot.reset_at.max(now);
    }

    /// Forgets every key, as if each had been reset at local time `now`: for
    /// when resets may have been missed. Slot by slot under each slot's lock,
    /// so a concurrent `learn` either lands before and is cleared, or after
    /// and is refused if its request was sent before `now`.
    pub(crate) fn clear(&self, now: Nanos) {
        for slot in &self.slots {
            let mut slot = slot.lock();
            slot.entry = None;
            slot.reset_at = slot.reset_at.max(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::TokenBucket;

    #[test]
    fn denies_only_what_the_bound_proves() {
        let tb = Algorithm::from(TokenBucket::new(1.0, 10.0).unwrap());
        let c = DenyCache::new(8);
        let fp = c.fingerprint("l", "k", 0);
        assert_eq!(c.deny(fp, &tb, Nanos(0), 1.0, false), None);
        // 0.5 tokens when Redis answered a request sent at t = 0.
        c.learn(fp, &tb, 0.5, Nanos(0));
        let d = c.deny(fp, &tb, Nanos(0), 1.0, false).unwrap();
        assert_eq!(d.retry_after, Some(0.5));
        // Half a second later the bound reaches 1: no longer certain.
        assert_eq!(c.deny(fp, &tb, Nanos(500_000_000), 1.0, false), None);
        // A raised limit does not reuse the bound.
        let raised = Algorithm::from(TokenBucket::new(1.0, 20.0).unwrap());
        assert_eq!(c.deny(fp, &raised, Nanos(0), 1.0, false), None);
        c.forget(fp, Nanos(10));
        assert_eq!(c.deny(fp, &tb, Nanos(0), 1.0, false), None);
        // A reply to a request sent before the reset is not learned.
        c.learn(fp, &tb, 0.0, Nanos(9));
        assert_eq!(c.deny(fp, &tb, Nanos(10), 1.0, false), None);
        c.learn(fp, &tb, 0.0, Nanos(10));
        assert!(c.deny(fp, &tb, Nanos(10), 1.0, false).is_some());
    }

    #[test]
    fn a_bound_a_rounding_error_short_of_enough_proves_no_denial() {
        // A penalty's gate: one token every 10 s, none held. Charged at 0,
        // it opens again at exactly 10 s. Redis's reply to a call sent 1 ns
        // before that says -1 + (1e10 - 1) × 1e-10 tokens, worked out in
        // doubles, about 8e-18 further from 0 than the exact -1e-10; a
        // nanosecond's refill then leaves it short of 0 by that much.
        let gate = Algorithm::from(
            TokenBucket::per_period(1.0, Nanos(10 * Nanos::PER_SEC))
                .unwrap()
                .with_capacity(0.0)
                .unwrap(),
        );
        let c = DenyCache::new(8);
        let fp = c.fingerprint("login:penalty", "mallory", 0);
        let sent = Nanos(10 * Nanos::PER_SEC - 1);
        let tokens = -1.0 + (1e10 - 1.0) * 1e-10;
        assert!(tokens < -1e-10, "the reply is a rounding error short");
        c.learn(fp, &gate, tokens, sent);
        assert_eq!(
            c.deny(fp, &gate, Nanos(10 * Nanos::PER_SEC), 0.0, false),
            None
        );
        // A shortfall beyond rounding is still denied here.
        c.learn(fp, &gate, -0.5, Nanos(5 * Nanos::PER_SEC));
        let d = c
            .deny(fp, &gate, Nanos(5 * Nanos::PER_SEC), 0.0, false)
            .unwrap();
        assert_eq!(d.retry_after, Some(5.0));
    }

    #[test]
    fn clearing_forgets_every_key_and_older_replies() {
        let tb = Algorithm::from(TokenBucket::new(1.0, 10.0).unwrap());
        let c = DenyCache::new(8);
        let fps: Vec<u64> = (0..20)
            .map(|i| c.fingerprint("l", &i.to_string(), 0))
            .collect();
        for &fp in &fps {
            c.learn(fp, &tb, 0.0, Nanos(0));
        }
        assert!(
            fps.iter()
                .any(|&fp| c.deny(fp, &tb, Nanos(0), 1.0, false).is_some())
        );
        c.clear(Nanos(5));
        for &fp in &fps {
            assert_eq!(c.deny(fp, &tb, Nanos(5), 1.0, false), None);
            // A reply to a request sent before the clear is not learned...
            c.learn(fp, &tb, 0.0, Nanos(4));
            assert_eq!(c.bound(fp, &tb), None);
        }
        // ...one sent at or after it is.
        c.learn(fps[0], &tb, 0.0, Nanos(5));
        assert!(c.deny(fps[0], &tb, Nanos(5), 1.0, false).is_some());
    }
}
