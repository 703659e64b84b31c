//! The algorithms as pure functions: a state, a configuration, the time and a
//! cost go in; a [`Decision`] and the state to write come out.
//!
//! These follow the formulas of `docs/semantics.md` line by line, with time in
//! integer nanoseconds so that window boundaries are exact. Every store runs
//! these same functions (or, in Redis, a script checked against them).
//!
//! The functions here hold a key in two numbers, a [`State`], which is all a
//! token bucket or a fixed window needs. The sliding window and the sliding
//! log need more, and are evaluated by [`crate::sliding`]; given one of them,
//! the functions here read the [`State`] as a fixed window of the same rate,
//! period and start, so that they stay total, but no store relies on that.

use crate::calendar::Calendar;
use crate::config::{Algorithm, FixedWindow, Limit, TokenBucket};
use crate::decision::{Decision, Value};
use crate::store::Settle;
use crate::time::Nanos;

const NS: f64 = Nanos::PER_SEC as f64;

/// The stored state of one key: tokens at time `ts`.
///
/// For a token bucket `ts` is the last update; for a fixed window it is the
/// start of the window the tokens belong to. A key with no state is full.
///
/// ```
/// use sluice_core::{Nanos, algorithm::State};
/// let s = State { tokens: 2.0, ts: Nanos(0) };
/// assert_eq!(s.tokens, 2.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    /// Tokens held at `ts`; negative while reservations are outstanding.
    pub tokens: f64,
    /// The time the tokens were counted at.
    pub ts: Nanos,
}

/// The result of evaluating one call against one key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Eval {
    /// What the caller is told.
    pub decision: Decision,
    /// The state to store if the call is committed; `None` when nothing
    /// changes (a denial).
    pub next: Option<State>,
}

/// Evaluates a call of `cost` tokens at `now`.
///
/// `offset` is the key's window alignment for a fixed window without a
/// configured `start` (see [`window_offset`]); token buckets ignore it. The
/// cost must already be validated (finite, ≥ 0, at most
/// [`Algorithm::max_cost`]).
///
/// ```
/// use sluice_core::{Algorithm, Nanos, TokenBucket, algorithm::evaluate};
/// let tb = Algorithm::from(TokenBucket::new(1.0, 2.0).unwrap());
/// let first = evaluate(&tb, None, 0, Nanos(0), 2.0, false);
/// assert!(first.decision.allowed);
/// let second = evaluate(&tb, first.next, 0, Nanos(0), 1.0, false);
/// assert!(!second.decision.allowed);
/// assert_eq!(second.decision.retry_after, Some(1.0));
/// assert_eq!(second.next, None);
/// ```
// Always: a store's decision is mostly this, and a bucket's share of it is a
// few operations.
#[inline(always)]
pub fn evaluate(
    alg: &Algorithm,
    state: Option<State>,
    offset: i64,
    now: Nanos,
    cost: f64,
    reserve: bool,
) -> Eval {
    if let Algorithm::TokenBucket(tb) = alg {
        // The common case, with a single look at the algorithm.
        let p = Pending::new(alg, tb_refill(tb, state, now), cost, reserve);
        return Eval {
            decision: p.token_bucket(tb),
            next: p.next(),
        };
    }
    let p = prepare(alg, state, offset, now, cost, reserve);
    Eval {
        decision: p.decision(alg, now),
        next: p.next(),
    }
}

/// The first half of [`evaluate`]: whether the call is admitted and the state
/// to commit. A store that commits optimistically computes just this between
/// reading a state and committing the next one, and the decision after, with
/// [`Pending::decision`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    /// The tokens (or the window's value) at `now`, before the call.
    available: f64,
    /// The time `available` is counted at.
    ts: Nanos,
    cost: f64,
    allowed: bool,
}

/// Refills (or rolls over) `state` to `now` and decides whether `cost` is
/// admitted: [`evaluate`] without the decision.
// Always: it sits between a hot slot's read and its compare-and-swap, where
// a call's spills widen the window another thread's commit can land in. (A
// fixed window's roll is still a call there, in `refill`: the price of a
// bucket's path free of the windows' code.)
#[inline(always)]
pub(crate) fn prepare(
    alg: &Algorithm,
    state: Option<State>,
    offset: i64,
    now: Nanos,
    cost: f64,
    reserve: bool,
) -> Pending {
    Pending::new(alg, refill(alg, state, offset, now), cost, reserve)
}

impl Pending {
    /// Whether `cost` is admitted from the `refilled` state.
    #[inline(always)]
    fn new(alg: &Algorithm, refilled: State, cost: f64, reserve: bool) -> Pending {
        let State { tokens, ts } = refilled;
        Pending {
            available: tokens,
            ts,
            cost,
            allowed: tokens >= cost || (reserve && may_reserve(alg, cost - tokens)),
        }
    }

    /// The state to store if the call is committed; `None` when it is denied.
    #[inline]
    pub(crate) fn next(&self) -> Option<State> {
        self.allowed.then_some(State {
            tokens: self.available - self.cost,
            ts: self.ts,
        })
    }

    /// What the caller is told; `alg` and `now` are those it was prepared
    /// with.
    // Always: left to itself the compiler made it a call of its own since
    // calendar windows added to its fixed-window half. Inlined, a keyed
    // decision on one key is 438 instructions where it was 456, a denied
    // one on 100k keys 598 where it was 591 (`scripts/keyed-instructions`);
    // it runs after the compare-and-swap, so it widens no window.
    #[inline(always)]
    pub(crate) fn decision(&self, alg: &Algorithm, now: Nanos) -> Decision {
        match alg {
            Algorithm::TokenBucket(tb) => self.token_bucket(tb),
            _ => self.fixed_window(&alg.as_fixed(), now),
        }
    }

    /// The tokens left after the call: nothing is taken from a denial.
    #[inline]
    fn after(&self) -> f64 {
        if self.allowed {
            self.available - self.cost
        } else {
            self.available
        }
    }

    #[inline]
    fn token_bucket(&self, tb: &TokenBucket) -> Decision {
        let after = self.after();
        Decision {
            allowed: self.allowed,
            capacity: tb.capacity(),
            remaining: remaining(after),
            retry_after: (self.available < self.cost)
                .then(|| tb.secs_for(self.cost - self.available)),
            reset: tb.secs_for(tb.capacity() - after).max(0.0),
        }
    }

    #[inline]
    fn fixed_window(&self, fw: &FixedWindow, now: Nanos) -> Decision {
        let after = self.after();
        let deficit = self.cost - self.available;
        let reset = if after >= fw.capacity() {
            0.0
        } else {
            until_window(
                fw,
                self.ts,
                now,
                ((fw.capacity() - after) / fw.rate()).ceil(),
            )
        };
        Decision {
            allowed: self.allowed,
            capacity: fw.capacity(),
            remaining: remaining(after),
            retry_after: (self.available < self.cost)
                .then(|| until_window(fw, self.ts, now, (deficit / fw.rate()).ceil())),
            reset,
        }
    }
}

/// Whether a deficit of `deficit` tokens may be reserved.
#[cold]
fn may_reserve(alg: &Algorithm, deficit: f64) -> bool {
    deficit <= alg.reservable()
}

#[inline]
pub(crate) fn remaining(tokens: f64) -> u64 {
    // For values >= 0 the truncating `as` is the floor, and it saturates,
    // which is what a count of whole tokens wants.
    tokens.max(0.0) as u64
}

/// Seconds elapsed from `from` to `to`, never negative: a clock that steps
/// backwards refills nothing.
#[inline]
pub(crate) fn elapsed(from: Nanos, to: Nanos) -> i64 {
    to.0.saturating_sub(from.0).max(0)
}

// Twin in sluice-redis's Lua script: refill.
#[inline]
fn tb_refill(tb: &TokenBucket, state: Option<State>, now: Nanos) -> State {
    match state {
        None => State {
            tokens: tb.capacity(),
            ts: now,
        },
        Some(s) => State {
            tokens: (s.tokens + tb.refill(elapsed(s.ts, now))).min(tb.capacity()),
            // Keeping the later time guards against a clock that stepped
            // back: the span between would otherwise be credited twice.
            ts: s.ts.max(now),
        },
    }
}

/// The start of the window containing `now`, for windows at
/// `offset + k·period`.
// Twin in sluice-redis's Lua script: window_start.
#[inline]
pub(crate) fn window_start(now: Nanos, offset: i64, period: i64) -> Nanos {
    let k = (i128::from(now.0) - i128::from(offset)).div_euclid(i128::from(period));
    let start = i128::from(offset) + k * i128::from(period);
    Nanos(i64::try_from(start).unwrap_or(now.0))
}

// Twin in sluice-redis's Lua script: refill.
#[inline]
fn fw_roll(fw: &FixedWindow, state: Option<State>, offset: i64, now: Nanos) -> State {
    if let Some(cal) = fw.calendar() {
        return calendar_roll(fw, &cal, state, now);
    }
    let period = fw.period().0;
    match state {
        None => State {
            tokens: fw.capacity(),
            ts: window_start(now, fw.start().map_or(offset, |s| s.0), period),
        },
        Some(s) => {
            let windows = elapsed(s.ts, now) / period;
            State {
                tokens: (s.tokens + fw.rate() * windows as f64).min(fw.capacity()),
                ts: Nanos(s.ts.0.saturating_add(windows.saturating_mul(period))),
            }
        }
    }
}

/// [`fw_roll`] on the calendar: `rate` for each boundary passed since the
/// window of `ts`, and `ts` moved to the last one passed.
// Twin in sluice-redis's Lua script: refill.
#[cold]
fn calendar_roll(fw: &FixedWindow, cal: &Calendar, state: Option<State>, now: Nanos) -> State {
    let here = cal.index(now);
    match state {
        None => State {
            tokens: fw.capacity(),
            ts: cal.start(here),
        },
        Some(s) => {
            // None when the clock stepped back into an earlier window, as
            // `elapsed` credits nothing then.
            let windows = here.saturating_sub(cal.index(s.ts));
            if windows <= 0 {
                return s;
            }
            State {
                tokens: (s.tokens + fw.rate() * windows as f64).min(fw.capacity()),
                ts: cal.start(here),
            }
        }
    }
}

/// The key's state brought to `now`: the bucket refilled, the window rolled
/// over. A sliding algorithm is read as a fixed window (see the module's
/// documentation).
// Twin in sluice-redis's Lua script: refill.
// The bucket's few operations inline in every caller; the windows' division
// and alignment out of line. Inlining them too costs the bucket's hot path
// registers, and the bucket is the common case (instruction counts in
// docs/performance.md).
#[inline(always)]
fn refill(alg: &Algorithm, state: Option<State>, offset: i64, now: Nanos) -> State {
    match alg {
        Algorithm::TokenBucket(tb) => tb_refill(tb, state, now),
        _ => roll(alg, state, offset, now),
    }
}

/// [`refill`] for the algorithms that count in windows.
#[inline(never)]
fn roll(alg: &Algorithm, state: Option<State>, offset: i64, now: Nanos) -> State {
    fw_roll(&alg.as_fixed(), state, offset, now)
}

/// Seconds from `now` until the start of the window that is `windows`
/// windows after the one starting at `ts`.
#[inline]
fn until_window(fw: &FixedWindow, ts: Nanos, now: Nanos, windows: f64) -> f64 {
    if let Some(cal) = fw.calendar() {
        // `as` saturates: a count of windows past any date is "never".
        let at = cal.start_after(ts, windows as i64);
        return (i128::from(at.0) - i128::from(now.0)) as f64 / NS;
    }
    ((ts.0 - now.0) as f64 + windows * fw.period().0 as f64) / NS
}

/// An operation's decision as a denied transaction reports it: nothing was
/// spent, so `remaining` and `reset` describe the key's state `before` the
/// transaction, while `allowed` and `retry_after` still say what this
/// limit alone would have answered.
///
/// ```
/// use sluice_core::{Algorithm, Nanos, TokenBucket, algorithm::{evaluate, unspent}};
/// let tb = Algorithm::from(TokenBucket::new(1.0, 5.0).unwrap());
/// let d = evaluate(&tb, None, 0, Nanos(0), 2.0, false).decision;
/// assert_eq!(d.remaining, 3);
/// let u = unspent(&tb, None, 0, Nanos(0), d);
/// assert!(u.allowed);
/// assert_eq!((u.remaining, u.reset), (5, 0.0));
/// ```
pub fn unspent(
    alg: &Algorithm,
    before: Option<State>,
    offset: i64,
    now: Nanos,
    d: Decision,
) -> Decision {
    let idle = evaluate(alg, before, offset, now, 0.0, false).decision;
    Decision {
        remaining: idle.remaining,
        reset: idle.reset,
        ..d
    }
}

/// The state of a key after settling `change` at `now`: refilled (or rolled
/// over) to `now`, then given tokens back up to the capacity at most, or
/// charged down to [`Algorithm::deepest_debt`] below zero at most (a
/// [`Settle::ChargeOnce`] only if the key is not below zero already).
///
/// ```
/// use sluice_core::{Algorithm, Nanos, Settle, TokenBucket, algorithm::{settle, State}};
/// let tb = Algorithm::from(TokenBucket::new(1.0, 1000.0).unwrap());
/// let s = Some(State { tokens: 0.0, ts: Nanos(0) });
/// assert_eq!(settle(&tb, s, 0, Nanos(0), Settle::Refund(600.0)).tokens, 600.0);
/// assert_eq!(settle(&tb, s, 0, Nanos(0), Settle::Refund(6000.0)).tokens, 1000.0);
/// assert_eq!(settle(&tb, s, 0, Nanos(0), Settle::Charge(50.0)).tokens, -50.0);
/// let owing = Some(State { tokens: -5.0, ts: Nanos(0) });
/// assert_eq!(settle(&tb, owing, 0, Nanos(0), Settle::ChargeOnce(50.0)).tokens, -5.0);
/// ```
// Twin in sluice-redis's Lua script: settle_op.
pub fn settle(
    alg: &Algorithm,
    state: Option<State>,
    offset: i64,
    now: Nanos,
    change: Settle,
) -> State {
    let s = refill(alg, state, offset, now);
    let tokens = match change {
        Settle::Refund(n) => (s.tokens + n).min(alg.capacity()),
        Settle::ChargeOnce(_) if s.tokens < 0.0 => s.tokens,
        Settle::Charge(n) | Settle::ChargeOnce(n) => (s.tokens - n).max(-alg.deepest_debt()),
    };
    State { tokens, ts: s.ts }
}

/// The key's tokens and time at `now`, without changing anything.
///
/// ```
/// use sluice_core::{Algorithm, Nanos, TokenBucket, algorithm::{current, State}};
/// let tb = Algorithm::from(TokenBucket::new(2.0, 10.0).unwrap());
/// let v = current(&tb, Some(State { tokens: 1.0, ts: Nanos(0) }), 0, Nanos(1_000_000_000));
/// assert_eq!(v.tokens, 3.0);
/// ```
#[inline]
pub fn current(alg: &Algorithm, state: Option<State>, offset: i64, now: Nanos) -> Value {
    let s = refill(alg, state, offset, now);
    Value {
        tokens: s.tokens,
        ts: s.ts,
    }
}

/// The earliest time at which `state` has refilled to full.
///
/// From then on the state carries no information (a missing key is full), so
/// a store may drop it, and Redis may let it expire. The result is rounded up
/// so that nothing is dropped early.
///
/// ```
/// use sluice_core::{Algorithm, Nanos, TokenBucket, algorithm::{full_at, State}};
/// let tb = Algorithm::from(TokenBucket::new(2.0, 10.0).unwrap());
/// let s = State { tokens: 9.0, ts: Nanos(0) };
/// assert_eq!(full_at(&tb, &s), Nanos(500_000_000));
/// ```
// Twin in sluice-redis's Lua script: full_after.
#[inline]
pub fn full_at(alg: &Algorithm, state: &State) -> Nanos {
    let missing = alg.capacity() - state.tokens;
    if missing <= 0.0 {
        return state.ts;
    }
    let span = match alg {
        Algorithm::TokenBucket(tb) => (tb.secs_for(missing) * NS).ceil(),
        Algorithm::FixedWindow(fw) => match fw.calendar() {
            Some(cal) => return cal.start_after(state.ts, (missing / fw.rate()).ceil() as i64),
            None => (missing / fw.rate()).ceil() * fw.period().0 as f64,
        },
        Algorithm::SlidingWindow(_) | Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => {
            let fw = alg.as_fixed();
            (missing / fw.rate()).ceil() * fw.period().0 as f64
        }
    };
    // `as` saturates, so an absurd span just means "never".
    Nanos(state.ts.0.saturating_add(span as i64))
}

/// The emptiest state at `now` of a key that is known only to be full by
/// `full_at` (as [`full_at`] rounds it), or `None` when that time has come.
///
/// Every state whose [`full_at`] is at most `full_at` holds at least these
/// tokens at `now` and at every later time, so a store that forgot a key
/// and kept only that time errs towards denying when it brings the key
/// back.
///
/// ```
/// use sluice_core::{Algorithm, Nanos, TokenBucket, algorithm::{emptiest_full_by, full_at, State}};
/// let tb = Algorithm::from(TokenBucket::new(2.0, 10.0).unwrap());
/// let s = State { tokens: 4.0, ts: Nanos(0) };
/// let back = emptiest_full_by(&tb, full_at(&tb, &s), 0, Nanos(1_000_000_000)).unwrap();
/// assert!(back.tokens <= 6.0 && back.tokens > 5.999);
/// assert_eq!(emptiest_full_by(&tb, full_at(&tb, &s), 0, Nanos(3_000_000_000)), None);
/// ```
// Twin in sluice-redis's Lua script: flat_ghost.
pub fn emptiest_full_by(alg: &Algorithm, full_at: Nanos, offset: i64, now: Nanos) -> Option<State> {
    if full_at <= now {
        return None;
    }
    let ts = match alg {
        Algorithm::TokenBucket(_) => now,
        Algorithm::FixedWindow(_)
        | Algorithm::SlidingWindow(_)
        | Algorithm::SlidingLog(_)
        | Algorithm::Concurrency(_) => {
            let fw = alg.as_fixed();
            match fw.calendar() {
                Some(cal) => cal.start_after(now, 0),
                None => window_start(now, fw.start().map_or(offset, |s| s.0), fw.period().0),
            }
        }
    };
    Some(State {
        tokens: least_tokens(alg, full_at, now),
        ts,
    })
}

/// The fewest tokens at `now` of any key that is full by `full_at`, on any
/// window alignment.
// Twin in sluice-redis's Lua script: flat_ghost.
fn least_tokens(alg: &Algorithm, full_at: Nanos, now: Nanos) -> f64 {
    let span = full_at.0.saturating_sub(now.0).max(0);
    match alg {
        // One nanosecond more than the span keeps float rounding in the
        // refill from crediting a token the key did not have.
        Algorithm::TokenBucket(tb) => tb.capacity() - tb.refill(span.saturating_add(1)),
        // Every key shares a calendar's boundaries: those up to `full_at`
        // are the ones the key still needs, and one at least, since a key
        // not yet full (a state of another kind that still counts) is
        // taken to be full no sooner than the next.
        Algorithm::FixedWindow(fw) if fw.calendar().is_some() => {
            let boundaries = fw.calendar().map_or(1, |cal| {
                cal.index(full_at).saturating_sub(cal.index(now)).max(1)
            });
            // No key is ever deeper in debt than that.
            (fw.capacity() - fw.rate() * boundaries as f64).max(-alg.deepest_debt())
        }
        // A span of length L holds at most ceil(L / period) boundaries of
        // any alignment, each adding `rate`; on the key's own alignment,
        // where `full_at` lies, exactly that many.
        Algorithm::FixedWindow(fw) => {
            let boundaries = (span as u64).div_ceil(fw.period().0 as u64) as f64;
            fw.capacity() - fw.rate() * boundaries
        }
        // A sliding or concurrency key may have used its whole rate until
        // it is full.
        Algorithm::SlidingWindow(_) | Algorithm::SlidingLog(_) | Algorithm::Concurrency(_)
            if span > 0 =>
        {
            0.0
        }
        Algorithm::SlidingWindow(_) | Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => {
            alg.capacity()
        }
    }
}

/// Carries a forgotten key's refill time from one configuration to
/// another: the latest time by which a key that was full by `full_at`
/// under `from` is full under `to`, on any window alignment.
///
/// ```
/// use sluice_core::{Algorithm, Nanos, TokenBucket, algorithm::refill_time_under};
/// let slow = Algorithm::from(TokenBucket::new(1.0, 10.0).unwrap());
/// let fast = Algorithm::from(TokenBucket::new(10.0, 10.0).unwrap());
/// // Four tokens short under the slow rate is 0.4 s short under the fast one.
/// let at = refill_time_under(&slow, &fast, Nanos(4_000_000_000), Nanos(0));
/// assert!((400_000_000..=400_000_010).contains(&at.0));
/// ```
pub fn refill_time_under(from: &Algorithm, to: &Algorithm, full_at: Nanos, now: Nanos) -> Nanos {
    if full_at <= now {
        return full_at;
    }
    let missing = to.capacity() - least_tokens(from, full_at, now);
    if missing <= 0.0 {
        return now;
    }
    let span = match to {
        Algorithm::TokenBucket(tb) => (tb.secs_for(missing) * NS).ceil(),
        Algorithm::FixedWindow(fw) if fw.calendar().is_some() => {
            let windows = (missing / fw.rate()).ceil() as i64;
            return fw
                .calendar()
                .map_or(now, |cal| cal.start_after(now, windows));
        }
        // Counted from `now`, not from the start of the key's window, which
        // is no later: an upper bound on any alignment.
        Algorithm::FixedWindow(fw) => (missing / fw.rate()).ceil() * fw.period().0 as f64,
        // As if the key had used its whole rate just now: a log is empty a
        // period after its last entry, a sliding window two periods after
        // the start of the window of its last count.
        Algorithm::SlidingLog(sl) => sl.period().0 as f64,
        // As if every slot had just been taken: free a lease from now.
        Algorithm::Concurrency(c) => c.lease().0 as f64,
        Algorithm::SlidingWindow(sw) => 2.0 * sw.period().0 as f64,
    };
    Nanos(now.0.saturating_add(span as i64))
}

/// The `offset` argument of [`evaluate`] for `key` under `alg`: the key's
/// own window alignment for a fixed or sliding window without a `start`,
/// else 0.
///
/// ```
/// use sluice_core::{Algorithm, FixedWindow, Nanos, TokenBucket, algorithm::key_offset};
/// let tb = Algorithm::from(TokenBucket::new(1.0, 1.0).unwrap());
/// assert_eq!(key_offset(&tb, "k"), 0);
/// let fw = Algorithm::from(FixedWindow::new(5.0, Nanos(60_000_000_000)).unwrap());
/// assert!((0..60_000_000_000).contains(&key_offset(&fw, "k")));
/// ```
#[inline]
pub fn key_offset(alg: &Algorithm, key: &str) -> i64 {
    match alg {
        Algorithm::FixedWindow(fw) if fw.start().is_none() && fw.calendar().is_none() => {
            window_offset(key.as_bytes(), fw.period().0)
        }
        Algorithm::SlidingWindow(sw) if sw.start().is_none() => {
            window_offset(key.as_bytes(), sw.period().0)
        }
        _ => 0,
    }
}

/// [`key_offset`] under a limit's shard algorithm, without matching on it.
#[inline]
pub(crate) fn limit_key_offset(limit: &Limit, key: &str) -> i64 {
    match limit.own_windows() {
        Some(period) => window_offset(key.as_bytes(), period),
        None => 0,
    }
}

/// The window alignment of a key when a fixed window has no `start`: a
/// stable hash of the key, modulo the period.
///
/// The hash is FNV-1a so that every process (and every store) derives the same
/// windows for the same key.
///
/// ```
/// use sluice_core::algorithm::window_offset;
/// let a = window_offset(b"user-1", 60_000_000_000);
/// assert_eq!(a, window_offset(b"user-1", 60_000_000_000));
/// assert!((0..60_000_000_000).contains(&a));
/// ```
pub fn window_offset(key: &[u8], period: i64) -> i64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let h = key
        .iter()
        .fold(OFFSET_BASIS, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    if period <= 0 {
        return 0;
    }
    (h % period as u64) as i64
}
