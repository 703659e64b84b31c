//! A transaction of any number of operations, on sharded limits too, in
//! its phases: lock every stripe involved, evaluate each operation seeing
//! the earlier ones' effects, then either report what a denied transaction
//! left unspent or commit an admitted one.

use parking_lot::MutexGuard;
use smallvec::SmallVec;

use super::MemoryStore;
use super::lane::hint_tag;
use super::sliding::{Kind, Next};
use super::stripe::Stripe;
use super::table::Table;
use crate::algorithm::{self, State};
use crate::decision::{Decision, Outcome};
use crate::store::{Mode, Op, StoreError};
use crate::time::{Clock, Nanos};

/// One candidate state location: which locked stripe, which table, which key.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Place {
    guard: usize,
    table: usize,
    fp: u64,
}

/// What an admitted operation of a transaction writes when it commits.
#[derive(Clone, Copy)]
enum Write {
    Flat(State),
    Sliding(Next),
}

/// The stripes of a transaction, locked in a fixed order (which makes
/// concurrent multi-stripe transactions deadlock-free), and the time it
/// decides at.
struct Locked<'s, C> {
    store: &'s MemoryStore<C>,
    /// The locked stripes' indices, ascending; `guards[i]` locks `locks[i]`.
    locks: SmallVec<[usize; 8]>,
    guards: SmallVec<[MutexGuard<'s, Stripe>; 8]>,
    now: Nanos,
}

/// What evaluating a transaction's operations found: the writes to commit
/// if it is admitted, where each operation's key lives (with its offset),
/// and each operation's decision.
struct Evaluated {
    pending: SmallVec<[(Place, Write); 4]>,
    chosen: SmallVec<[(Place, i64); 4]>,
    decisions: SmallVec<[Decision; 2]>,
}

impl<C: Clock> MemoryStore<C> {
    /// Any number of operations, on sharded limits too: every lock stripe
    /// involved is locked for the whole decision.
    pub(super) fn transaction(&self, ops: &[Op<'_>], mode: Mode) -> Result<Outcome, StoreError> {
        for op in ops {
            op.validate(mode.reserve)?;
        }
        crate::store::same_kind_per_name(ops)?;
        let cands = self.candidates(ops);
        let mut locked = self.lock_stripes(ops, &cands);
        let evaluated = locked.evaluate(ops, &cands, mode);
        let mut outcome = Outcome::from_decisions(evaluated.decisions);
        if !outcome.allowed {
            locked.report_unspent(&mut outcome, ops, &evaluated.chosen);
        } else if mode.consume {
            locked.commit(evaluated.pending);
        }
        Ok(outcome)
    }

    /// Each operation's two candidate fingerprints (the same one twice for
    /// a limit without hot-key shards).
    fn candidates(&self, ops: &[Op<'_>]) -> SmallVec<[(u64, u64); 4]> {
        ops.iter()
            .map(|op| {
                let (a, b) = op.shards();
                let fa = self.fingerprint(op.key, a);
                let fb = if a == b {
                    fa
                } else {
                    self.fingerprint(op.key, b)
                };
                (fa, fb)
            })
            .collect()
    }

    /// Locks every stripe the candidates live in, in ascending order, and
    /// moves their keys out of the hot slots: the tables must hold the
    /// latest states before they are read, and while the locks are held no
    /// key can move back into a slot.
    fn lock_stripes(&self, ops: &[Op<'_>], cands: &[(u64, u64)]) -> Locked<'_, C> {
        let mut locks: SmallVec<[usize; 8]> = cands
            .iter()
            .flat_map(|&(a, b)| [self.lock_index(a), self.lock_index(b)])
            .collect();
        locks.sort_unstable();
        locks.dedup();
        let mut guards: SmallVec<[MutexGuard<'_, Stripe>; 8]> = locks
            .iter()
            .map(|&i| self.stripes[i].0.lock.lock())
            .collect();
        let now = self.clock.now();
        for (op, &(fa, fb)) in ops.iter().zip(cands) {
            for fp in distinct(fa, fb) {
                let i = self.lock_index(fp);
                let g = locks.binary_search(&i).unwrap_or(0);
                self.stripes[i]
                    .0
                    .cool(&mut guards[g], hint_tag(fp, op.limit));
            }
        }
        Locked {
            store: self,
            locks,
            guards,
            now,
        }
    }
}

impl<C: Clock> Locked<'_, C> {
    /// Decides each operation in order, each seeing what the earlier ones
    /// would write; of a sharded key's two candidates, the one holding more.
    fn evaluate(&mut self, ops: &[Op<'_>], cands: &[(u64, u64)], mode: Mode) -> Evaluated {
        let now = self.now;
        let mut pending: SmallVec<[(Place, Write); 4]> = SmallVec::new();
        let mut chosen: SmallVec<[(Place, i64); 4]> = SmallVec::new();
        let mut decisions = SmallVec::new();
        for (op, &(fa, fb)) in ops.iter().zip(cands) {
            let alg = *op.limit.shard_algorithm();
            let offset = algorithm::key_offset(&alg, op.key);
            let pa = self.place(op, fa);
            let pb = if fb == fa { pa } else { self.place(op, fb) };
            let guards = &mut self.guards;
            let (place, decision, next) = match Kind::of(&alg) {
                None => {
                    let read = |p: Place| {
                        pending
                            .iter()
                            .rev()
                            .find_map(|&(q, w)| match w {
                                Write::Flat(st) if q == p => Some(st),
                                _ => None,
                            })
                            .or_else(|| guards[p.guard].tables[p.table].get(p.fp, offset, now))
                    };
                    let (place, state) = if pa == pb {
                        (pa, read(pa))
                    } else {
                        let (st_a, st_b) = (read(pa), read(pb));
                        let tokens = |st| algorithm::current(&alg, st, offset, now).tokens;
                        if tokens(st_b) > tokens(st_a) {
                            (pb, st_b)
                        } else {
                            (pa, st_a)
                        }
                    };
                    let ev = algorithm::evaluate(&alg, state, offset, now, op.cost, mode.reserve);
                    (place, ev.decision, ev.next.map(Write::Flat))
                }
                Some(kind) => {
                    for p in distinct(pa, pb) {
                        let stripe = &mut *guards[p.guard];
                        let delta = stripe.tables[p.table].restore(kind, p.fp, offset, now);
                        stripe.apply(delta);
                    }
                    let states = |p: Place| &guards[p.guard].tables[p.table].sliding;
                    let earlier = |p: Place| sliding_pending(&pending, p);
                    let tokens = |p: Place| states(p).tokens(kind, p.fp, offset, now, earlier(p));
                    let place = if pa != pb && tokens(pb) > tokens(pa) {
                        pb
                    } else {
                        pa
                    };
                    let (d, next) = states(place).evaluate(
                        kind,
                        place.fp,
                        offset,
                        now,
                        earlier(place),
                        op.cost,
                        op.lease,
                    );
                    (place, d, next.map(Write::Sliding))
                }
            };
            if let Some(next) = next {
                pending.push((place, next));
            }
            chosen.push((place, offset));
            decisions.push(decision);
        }
        Evaluated {
            pending,
            chosen,
            decisions,
        }
    }

    /// Where `fp`, a candidate of `op`'s key, lives among the locked
    /// stripes; its table is made on first use.
    fn place(&mut self, op: &Op<'_>, fp: u64) -> Place {
        let guard = self
            .locks
            .binary_search(&self.store.lock_index(fp))
            .unwrap_or(0);
        let hot = &self.store.stripes[self.locks[guard]].0.hot;
        let table = self.guards[guard].table(op.limit, self.now, hot);
        Place { guard, table, fp }
    }

    /// A denied transaction spent nothing, so each operation that its own
    /// limit admitted reports what its key holds untouched: the tables
    /// still hold what each key had before the transaction.
    fn report_unspent(&self, outcome: &mut Outcome, ops: &[Op<'_>], chosen: &[(Place, i64)]) {
        let now = self.now;
        for ((d, op), &(place, offset)) in outcome.decisions.iter_mut().zip(ops).zip(chosen) {
            if !d.allowed {
                continue;
            }
            let alg = op.limit.shard_algorithm();
            let table = &self.guards[place.guard].tables[place.table];
            *d = match Kind::of(alg) {
                None => {
                    let st = table.get(place.fp, offset, now);
                    algorithm::unspent(alg, st, offset, now, *d)
                }
                Some(kind) => {
                    let (idle, _) = table
                        .sliding
                        .evaluate(kind, place.fp, offset, now, None, 0.0, 0);
                    Decision {
                        remaining: idle.remaining,
                        reset: idle.reset,
                        ..*d
                    }
                }
            };
        }
    }

    /// Writes what an admitted transaction decided, then lets each stripe
    /// enforce its share of the key cap.
    fn commit(&mut self, pending: SmallVec<[(Place, Write); 4]>) {
        let now = self.now;
        for (place, w) in pending {
            let stripe = &mut *self.guards[place.guard];
            match w {
                Write::Flat(st) => {
                    let delta = stripe.tables[place.table].put(place.fp, st);
                    stripe.count_write(place.table, delta, now);
                }
                Write::Sliding(next) => {
                    let Table { limit, sliding, .. } = &mut stripe.tables[place.table];
                    if let Some(kind) = Kind::of(limit.shard_algorithm()) {
                        let delta = sliding.commit(kind, place.fp, next, now);
                        stripe.apply(delta);
                    }
                }
            }
        }
        for (g, &i) in self.guards.iter_mut().zip(&self.locks) {
            self.store.stripes[i].0.maintain(g, now);
        }
    }
}

/// What the earlier operations of a transaction admitted on a sliding key:
/// the window's latest state, or the sum of the costs to log.
fn sliding_pending(pending: &[(Place, Write)], place: Place) -> Option<Next> {
    pending
        .iter()
        .filter(|(p, _)| *p == place)
        .fold(None, |acc, &(_, w)| match (acc, w) {
            (Some(Next::Log(a)), Write::Sliding(Next::Log(b))) => Some(Next::Log(a + b)),
            (Some(Next::Lease(a, _)), Write::Sliding(Next::Lease(b, id))) => {
                Some(Next::Lease(a + b, id))
            }
            (_, Write::Sliding(next)) => Some(next),
            (acc, Write::Flat(_)) => acc,
        })
}

/// A key's candidates, each once: one for a limit without hot-key shards.
fn distinct<T: PartialEq + Copy>(a: T, b: T) -> impl Iterator<Item = T> {
    std::iter::once(a).chain((b != a).then_some(b))
}
