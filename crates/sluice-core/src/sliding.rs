//! The sliding window and the sliding log as pure functions: a state, a
//! configuration, the time and a cost go in; a [`Decision`] and the state to
//! write come out.
//!
//! They follow `docs/semantics.md` with time in integer nanoseconds, as
//! [`crate::algorithm`] does for the token bucket and the fixed window. Their
//! states do not fit that module's two numbers: a sliding window keeps three
//! ([`WindowState`]), a sliding log every admission still in its window
//! ([`Log`]). Neither takes reservations, so there is no `reserve` argument.

use std::collections::VecDeque;

use crate::algorithm::{elapsed, remaining, window_start};
use crate::config::{SlidingLog, SlidingWindow};
use crate::decision::{Decision, Value};
use crate::store::Settle;
use crate::time::Nanos;

const NS: f64 = Nanos::PER_SEC as f64;

/// Seconds from `from` to `to`, negative if `to` is earlier.
#[inline]
fn secs_between(from: i64, to: i64) -> f64 {
    to.saturating_sub(from) as f64 / NS
}

// ---- sliding window ----

/// The stored state of one key under a sliding window: the start of its
/// current window and the counts of that window and the one before.
///
/// A key with no state has counted nothing.
///
/// ```
/// use sluice_core::{Nanos, sliding::WindowState};
/// let s = WindowState { ws: Nanos(0), cur: 2.0, prev: 5.0 };
/// assert_eq!(s.cur + s.prev, 7.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowState {
    /// The start of the current window.
    pub ws: Nanos,
    /// The tokens admitted in the current window.
    pub cur: f64,
    /// The tokens admitted in the window before it.
    pub prev: f64,
}

/// The result of evaluating one call against one sliding-window key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowEval {
    /// What the caller is told.
    pub decision: Decision,
    /// The state to store if the call is committed; `None` when it is
    /// denied.
    pub next: Option<WindowState>,
}

/// Moves `state` on to the window that contains `now`: the current count
/// becomes the previous one after one boundary, and both are forgotten
/// after two. A key never seen starts in the window of `now` on its
/// alignment (`start`, else `offset`). A clock that steps back moves
/// nothing.
// Twin in sluice-redis's Lua script: roll.
#[inline]
fn roll(sw: &SlidingWindow, state: Option<WindowState>, offset: i64, now: Nanos) -> WindowState {
    let p = sw.period().0;
    match state {
        None => WindowState {
            ws: window_start(now, sw.start().map_or(offset, |s| s.0), p),
            cur: 0.0,
            prev: 0.0,
        },
        Some(s) => match elapsed(s.ws, now) / p {
            0 => s,
            1 => WindowState {
                ws: Nanos(s.ws.0.saturating_add(p)),
                cur: 0.0,
                prev: s.cur,
            },
            k => WindowState {
                ws: Nanos(s.ws.0.saturating_add(k.saturating_mul(p))),
                cur: 0.0,
                prev: 0.0,
            },
        },
    }
}

/// The previous window's count weighted by the share of it that still
/// lies within the last period at `now`: `prev · (period − e) / period`.
// Twin in sluice-redis's Lua script: weighted.
#[inline]
fn weighted(sw: &SlidingWindow, s: &WindowState, now: Nanos) -> f64 {
    let p = sw.period().0;
    // Before the window's start (a clock that stepped back) the whole
    // previous window still counts.
    let e = elapsed(s.ws, now).min(p);
    s.prev * (p - e) as f64 / p as f64
}

/// Evaluates a call of `cost` tokens at `now` on a sliding window.
///
/// `offset` is the key's window alignment when the configuration has no
/// `start` (see [`crate::algorithm::key_offset`]). The cost must already be
/// validated (finite, ≥ 0, at most the rate).
///
/// ```
/// use sluice_core::{Nanos, SlidingWindow, sliding::{window_evaluate, WindowState}};
/// let sw = SlidingWindow::per_period(10.0, Nanos(10 * Nanos::PER_SEC)).unwrap().with_start(Nanos(0));
/// // 2.5 s into a window, after 8 in the previous one and 3 in this one:
/// // 8 × 0.75 + 3 = 9 are counted, so 1 more fits and 2 do not.
/// let s = Some(WindowState { ws: Nanos(10 * Nanos::PER_SEC), cur: 3.0, prev: 8.0 });
/// let now = Nanos(12_500_000_000);
/// assert!(window_evaluate(&sw, s, 0, now, 1.0).decision.allowed);
/// let d = window_evaluate(&sw, s, 0, now, 2.0).decision;
/// assert!(!d.allowed);
/// // Until 8 × (1 − e/10) + 3 + 2 ≤ 10, that is e = 3.75 s.
/// assert_eq!(d.retry_after, Some(1.25));
/// ```
// Twin in sluice-redis's Lua script: window_state, sliding_op.
pub fn window_evaluate(
    sw: &SlidingWindow,
    state: Option<WindowState>,
    offset: i64,
    now: Nanos,
    cost: f64,
) -> WindowEval {
    let s = roll(sw, state, offset, now);
    let w = weighted(sw, &s, now);
    let rate = sw.rate();
    let allowed = w + s.cur + cost <= rate;
    let after = WindowState {
        cur: if allowed { s.cur + cost } else { s.cur },
        ..s
    };
    let decision = Decision {
        allowed,
        capacity: rate,
        remaining: remaining(rate - (w + after.cur)),
        retry_after: (!allowed).then(|| window_wait(sw, &s, now, cost)),
        reset: secs_between(now.0, window_empty_at(sw, &after).0).max(0.0),
    };
    WindowEval {
        decision,
        next: allowed.then_some(after),
    }
}

/// The least wait after which a call of `cost` denied on `s` at `now` is
/// admitted, if nothing else is admitted meanwhile.
///
/// While the current window lasts, its count stays and the previous one's
/// weight falls linearly; a denial with `cur + cost ≤ rate` therefore has
/// `prev > 0` (else the estimate would be `cur`), and is admitted within
/// this window. Otherwise only the next window helps, where this window's
/// count becomes the weighted one, and it is positive since
/// `cur > rate − cost ≥ 0`.
fn window_wait(sw: &SlidingWindow, s: &WindowState, now: Nanos, cost: f64) -> f64 {
    let p = sw.period().as_secs_f64();
    let e = secs_between(s.ws.0, now.0);
    let rate = sw.rate();
    let wait = if s.cur + cost <= rate {
        p * (1.0 - (rate - s.cur - cost) / s.prev) - e
    } else {
        (p - e) + (p * (1.0 - (rate - cost) / s.cur)).max(0.0)
    };
    // Rounding could take a wait that is positive by a hair below zero.
    wait.max(0.0)
}

/// The key's tokens at `now` (the rate less the estimate) and the start of
/// its current window, without changing anything.
///
/// ```
/// use sluice_core::{Nanos, SlidingWindow, sliding::{window_current, WindowState}};
/// let sw = SlidingWindow::per_period(10.0, Nanos(4)).unwrap().with_start(Nanos(0));
/// let s = WindowState { ws: Nanos(0), cur: 4.0, prev: 0.0 };
/// // One window on, the 4 weigh 3 quarters a quarter of the way in.
/// let v = window_current(&sw, Some(s), 0, Nanos(5));
/// assert_eq!((v.tokens, v.ts), (7.0, Nanos(4)));
/// ```
pub fn window_current(
    sw: &SlidingWindow,
    state: Option<WindowState>,
    offset: i64,
    now: Nanos,
) -> Value {
    let s = roll(sw, state, offset, now);
    Value {
        tokens: sw.rate() - (weighted(sw, &s, now) + s.cur),
        ts: s.ws,
    }
}

/// When `s` has counted nothing any more: two windows after the start of
/// its window if that window counted something, one if only the previous
/// one did. From then on the key holds no information (a missing key has
/// counted nothing), so a store may drop it.
///
/// ```
/// use sluice_core::{Nanos, SlidingWindow, sliding::{window_empty_at, WindowState}};
/// let sw = SlidingWindow::per_period(10.0, Nanos(4)).unwrap();
/// let s = WindowState { ws: Nanos(8), cur: 1.0, prev: 0.0 };
/// assert_eq!(window_empty_at(&sw, &s), Nanos(16));
/// ```
// Twin in sluice-redis's Lua script: window_empty_at.
#[inline]
pub fn window_empty_at(sw: &SlidingWindow, s: &WindowState) -> Nanos {
    let p = sw.period().0;
    let windows = if s.cur > 0.0 {
        2
    } else if s.prev > 0.0 {
        1
    } else {
        0
    };
    Nanos(s.ws.0.saturating_add(p.saturating_mul(windows)))
}

/// The fullest state (the fewest tokens at `now` and at every later time)
/// of any key that is known only to be empty by `empty_at`, or `None` when
/// that time has come. A store that forgot a key brings it back as this.
///
/// That is the whole rate counted in the window two periods before the
/// first boundary (on the key's alignment) at or after `empty_at`: no
/// state that is empty by then counts more at any time.
///
/// ```
/// use sluice_core::{Nanos, SlidingWindow, sliding::{window_emptiest, window_empty_at}};
/// let sw = SlidingWindow::per_period(10.0, Nanos(4)).unwrap().with_start(Nanos(0));
/// let s = window_emptiest(&sw, Nanos(14), 0, Nanos(9)).unwrap();
/// assert_eq!((s.ws, s.cur, s.prev), (Nanos(8), 10.0, 0.0));
/// assert!(window_empty_at(&sw, &s) >= Nanos(14));
/// assert_eq!(window_emptiest(&sw, Nanos(14), 0, Nanos(14)), None);
/// ```
// Twin in sluice-redis's Lua script: window_of.
pub fn window_emptiest(
    sw: &SlidingWindow,
    empty_at: Nanos,
    offset: i64,
    now: Nanos,
) -> Option<WindowState> {
    if empty_at <= now {
        return None;
    }
    let p = sw.period().0;
    let align = sw.start().map_or(offset, |s| s.0);
    let boundary = window_start(Nanos(empty_at.0.saturating_sub(1)), align, p)
        .0
        .saturating_add(p);
    Some(WindowState {
        ws: Nanos(boundary.saturating_sub(p.saturating_mul(2))),
        cur: sw.rate(),
        prev: 0.0,
    })
}

// ---- sliding log ----

/// The most entries a [`Log`] keeps. Admissions at one nanosecond share an
/// entry, so a log holds at most as many entries as distinct admission
/// times in one period; one that would need more merges its newest entry
/// into the admission after it (see [`Log::commit`]).
pub const MAX_LOG_ENTRIES: usize = 1 << 10;

/// One logged admission: when, and how many tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    t: i64,
    cost: f64,
}

/// What a call on a sliding log is decided from, as a store reads it:
/// enough to decide the call without the log's entries, so that a store
/// that keeps the log elsewhere (Redis) sends back these four numbers
/// instead of the log, and both stores decide with [`LogReading::decide`].
///
/// ```
/// use sluice_core::{Nanos, SlidingLog, sliding::LogReading};
/// let sl = SlidingLog::per_period(3.0, Nanos(10 * Nanos::PER_SEC)).unwrap();
/// let r = LogReading {
///     at: Nanos(5 * Nanos::PER_SEC),
///     used: 3.0,
///     newest: Some(Nanos(2 * Nanos::PER_SEC)),
///     frees_at: Nanos(2 * Nanos::PER_SEC),
/// };
/// let d = r.decide(&sl, 0.0, 2.0);
/// assert_eq!((d.allowed, d.retry_after, d.reset), (false, Some(7.0), 7.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogReading {
    /// The time the log is read at: the call's time, or the newest entry's
    /// if that is later (a clock that stepped back).
    pub at: Nanos,
    /// The costs logged within the period that ends at `at`, summed as
    /// [`Log`] keeps them.
    pub used: f64,
    /// The newest entry within that period, if any.
    pub newest: Option<Nanos>,
    /// For a call that does not fit: the time of the entry whose leaving
    /// lets it in (it fits a period after that). Otherwise `at`.
    pub frees_at: Nanos,
}

impl LogReading {
    /// Decides a call of `cost` after `pending` tokens admitted at `at` by
    /// earlier operations of the same transaction; `frees_at` must have
    /// been read for the same call.
    // Twin in sluice-redis's Lua script: sliding_op.
    pub fn decide(&self, sl: &SlidingLog, pending: f64, cost: f64) -> Decision {
        let at = self.at.0;
        let used = if pending > 0.0 {
            self.used + pending
        } else {
            self.used
        };
        let rate = sl.rate();
        let allowed = used + cost <= rate;
        let after = if allowed { used + cost } else { used };
        let newest = if pending > 0.0 || (allowed && cost > 0.0) {
            Some(at)
        } else {
            self.newest.map(|t| t.0)
        };
        let period = sl.period().0;
        Decision {
            allowed,
            capacity: rate,
            remaining: remaining(rate - after),
            retry_after: (!allowed)
                .then(|| secs_between(at, self.frees_at.0.saturating_add(period))),
            reset: newest.map_or(0.0, |t| secs_between(at, t.saturating_add(period))),
        }
    }

    /// The tokens the log leaves at `at`, and `at`: what `value` reports.
    ///
    /// ```
    /// use sluice_core::{Nanos, SlidingLog, sliding::LogReading};
    /// let sl = SlidingLog::per_period(5.0, Nanos(10)).unwrap();
    /// let r = LogReading { at: Nanos(9), used: 2.0, newest: Some(Nanos(0)), frees_at: Nanos(9) };
    /// assert_eq!((r.current(&sl).tokens, r.current(&sl).ts), (3.0, Nanos(9)));
    /// ```
    pub fn current(&self, sl: &SlidingLog) -> Value {
        Value {
            tokens: sl.rate() - self.used,
            ts: self.at,
        }
    }
}

/// The state of a sliding-window key after settling `change` at `now`: a
/// charge counts in the current window whatever the rate; a refund takes
/// back from the current window's count first, then from the previous
/// window's, never below zero.
///
/// ```
/// use sluice_core::{Nanos, Settle, SlidingWindow, sliding::{window_settle, WindowState}};
/// let sw = SlidingWindow::per_period(10.0, Nanos(10)).unwrap().with_start(Nanos(0));
/// let s = Some(WindowState { ws: Nanos(10), cur: 3.0, prev: 8.0 });
/// let back = window_settle(&sw, s, 0, Nanos(12), Settle::Refund(5.0));
/// assert_eq!((back.cur, back.prev), (0.0, 6.0));
/// let more = window_settle(&sw, s, 0, Nanos(12), Settle::Charge(20.0));
/// assert_eq!(more.cur, 23.0);
/// ```
// Twin in sluice-redis's Lua script: window_state, settle_op.
pub fn window_settle(
    sw: &SlidingWindow,
    state: Option<WindowState>,
    offset: i64,
    now: Nanos,
    change: Settle,
) -> WindowState {
    let mut s = roll(sw, state, offset, now);
    match change {
        Settle::ChargeOnce(_) if weighted(sw, &s, now) + s.cur > sw.rate() => {}
        Settle::Charge(n) | Settle::ChargeOnce(n) => s.cur += n,
        Settle::Refund(n) => {
            let back = n.min(s.cur);
            s.cur -= back;
            s.prev = (s.prev - (n - back)).max(0.0);
        }
    }
    s
}

/// The stored state of one key under a sliding log: the admissions still
/// in its window, oldest first, with their sum.
///
/// An empty log is a key that has admitted nothing within a period.
///
/// ```
/// use sluice_core::{Nanos, SlidingLog, sliding::Log};
/// let sl = SlidingLog::per_period(3.0, Nanos(10)).unwrap();
/// let mut log = Log::default();
/// log.commit(&sl, Nanos(0), 2.0);
/// log.commit(&sl, Nanos(4), 1.0);
/// assert_eq!(log.len(), 2);
/// assert!(!log.evaluate(&sl, Nanos(9), 0.0, 1.0).allowed);
/// // The first entry leaves the window at 10.
/// assert!(log.evaluate(&sl, Nanos(10), 0.0, 2.0).allowed);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Log {
    entries: VecDeque<Entry>,
    /// The sum of the entries' costs.
    used: f64,
    /// Whether `used` is the exact sum, each addition and subtraction
    /// having been exact (always, for costs on a common binary grid such as
    /// whole numbers or halves); if not, it is summed afresh, oldest first,
    /// when entries leave, so that rounding never accumulates.
    inexact: bool,
}

/// `a + b`, and whether that is exact (the rounding error of the sum is 0).
// Twin in sluice-redis's Lua script: add_exact.
#[inline]
fn add_exact(a: f64, b: f64) -> (f64, bool) {
    let s = a + b;
    let bb = s - a;
    let err = (a - (s - bb)) + (b - bb);
    (s, err == 0.0)
}

/// The costs of `entries` summed oldest first, and whether every step was
/// exact.
// Twin in sluice-redis's Lua script: sum_span.
fn fold<'a>(entries: impl Iterator<Item = &'a Entry>) -> (f64, bool) {
    entries.fold((0.0, true), |(sum, exact), e| {
        let (s, ok) = add_exact(sum, e.cost);
        (s, exact && ok)
    })
}

impl Log {
    /// How many entries the log holds.
    #[inline]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log holds no entry.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The logged admissions, oldest first, as (time, cost).
    ///
    /// ```
    /// use sluice_core::{Nanos, SlidingLog, sliding::Log};
    /// let sl = SlidingLog::per_period(3.0, Nanos(10)).unwrap();
    /// let mut log = Log::default();
    /// log.commit(&sl, Nanos(1), 1.0);
    /// log.commit(&sl, Nanos(1), 0.5);
    /// assert_eq!(log.entries().collect::<Vec<_>>(), [(Nanos(1), 1.5)]);
    /// ```
    pub fn entries(&self) -> impl Iterator<Item = (Nanos, f64)> + '_ {
        self.entries.iter().map(|e| (Nanos(e.t), e.cost))
    }

    /// The time the log is evaluated at for a call at `now`: never before
    /// its newest entry, so that a clock that steps back sees no entry
    /// leave, and entries stay in order.
    // Twin in sluice-redis's Lua script: read_at.
    #[inline]
    fn at(&self, now: Nanos) -> i64 {
        self.entries.back().map_or(now.0, |e| e.t.max(now.0))
    }

    /// How many entries, from the oldest, have left the window that ends
    /// at `now` (those logged at or before `now − period`).
    // Twin in sluice-redis's Lua script: expired.
    #[inline]
    fn expired(&self, sl: &SlidingLog, now: i64) -> usize {
        let cutoff = now.saturating_sub(sl.period().0);
        self.entries.partition_point(|e| e.t <= cutoff)
    }

    /// The sum of the costs of the entries from index `live` on, and
    /// whether it is exact.
    // Twin in sluice-redis's Lua script: sum_from.
    fn sum_from(&self, live: usize) -> (f64, bool) {
        if live == 0 {
            return (self.used, !self.inexact);
        }
        let rest = self.entries.len() - live;
        if !self.inexact && live <= rest {
            // Taking the few expired entries off the exact sum is exact
            // too, as long as each step is.
            let (u, exact) = self
                .entries
                .range(..live)
                .fold((self.used, true), |(u, exact), e| {
                    let (d, ok) = add_exact(u, -e.cost);
                    (d, exact && ok)
                });
            if exact {
                return (u, true);
            }
        }
        fold(self.entries.range(live..))
    }

    /// Evaluates a call of `cost` tokens at `now`, after `pending` tokens
    /// already admitted at `now` by earlier operations of the same
    /// transaction (0 for a call on its own). Changes nothing: see
    /// [`Log::commit`].
    ///
    /// The cost must already be validated (finite, ≥ 0, at most the rate).
    ///
    /// ```
    /// use sluice_core::{Nanos, SlidingLog, sliding::Log};
    /// let sl = SlidingLog::per_period(3.0, Nanos(10 * Nanos::PER_SEC)).unwrap();
    /// let mut log = Log::default();
    /// log.commit(&sl, Nanos(0), 1.0);
    /// log.commit(&sl, Nanos(2 * Nanos::PER_SEC), 2.0);
    /// let d = log.evaluate(&sl, Nanos(5 * Nanos::PER_SEC), 0.0, 2.0);
    /// assert!(!d.allowed);
    /// // Both entries must leave: the later one does at 12 s.
    /// assert_eq!(d.retry_after, Some(7.0));
    /// assert_eq!((d.remaining, d.reset), (0, 7.0));
    /// ```
    #[inline]
    pub fn evaluate(&self, sl: &SlidingLog, now: Nanos, pending: f64, cost: f64) -> Decision {
        self.read(sl, now, pending, cost).decide(sl, pending, cost)
    }

    /// What a call of `cost` at `now`, after `pending`, is decided from
    /// (see [`LogReading`]).
    ///
    /// ```
    /// use sluice_core::{Nanos, SlidingLog, sliding::Log};
    /// let sl = SlidingLog::per_period(3.0, Nanos(10)).unwrap();
    /// let mut log = Log::default();
    /// log.commit(&sl, Nanos(2), 2.0);
    /// log.commit(&sl, Nanos(4), 1.0);
    /// let r = log.read(&sl, Nanos(5), 0.0, 2.0);
    /// assert_eq!((r.at, r.used, r.newest), (Nanos(5), 3.0, Some(Nanos(4))));
    /// // 2 fit once the entry of 2 tokens has left, at 2 + 10.
    /// assert_eq!(r.frees_at, Nanos(2));
    /// ```
    // Twin in sluice-redis's Lua script: log_read.
    pub fn read(&self, sl: &SlidingLog, now: Nanos, pending: f64, cost: f64) -> LogReading {
        let at = self.at(now);
        let live = self.expired(sl, at);
        let used = self.sum_from(live).0;
        let with_pending = if pending > 0.0 { used + pending } else { used };
        let frees_at = if with_pending + cost <= sl.rate() {
            at
        } else {
            self.frees_at(sl, at, live, with_pending, pending, cost)
        };
        LogReading {
            at: Nanos(at),
            used,
            newest: self.entries.range(live..).next_back().map(|e| Nanos(e.t)),
            frees_at: Nanos(frees_at),
        }
    }

    /// The time of the entry whose leaving lets `cost` in, if nothing else
    /// is admitted meanwhile: the entries leave oldest first, `pending`
    /// (logged at `now`) last.
    // Twin in sluice-redis's Lua script: walk, log_read.
    fn frees_at(
        &self,
        sl: &SlidingLog,
        now: i64,
        live: usize,
        used: f64,
        pending: f64,
        cost: f64,
    ) -> i64 {
        let rate = sl.rate();
        let mut left = used;
        let pending_entry = Entry {
            t: now,
            cost: pending,
        };
        let mut entries = self
            .entries
            .range(live..)
            .chain((pending > 0.0).then_some(&pending_entry));
        entries
            .find(|e| {
                left -= e.cost;
                left + cost <= rate
            })
            // Only rounding can get past the last entry: then the log is
            // empty once the newest time has left.
            .map_or(now, |e| e.t)
    }

    /// Logs an admission of `cost` tokens at `now` (at the newest entry's
    /// time, if the clock stepped back), dropping the entries that have left
    /// the window. A cost of 0 logs nothing.
    ///
    /// An admission at the newest entry's time joins that entry. If the log
    /// already holds [`MAX_LOG_ENTRIES`], the newest entry joins this
    /// admission instead, at `now`: it then leaves the window later than it
    /// should, which can only deny more, never admit more.
    ///
    /// ```
    /// use sluice_core::{Nanos, SlidingLog, sliding::Log};
    /// let sl = SlidingLog::per_period(5.0, Nanos(10)).unwrap();
    /// let mut log = Log::default();
    /// log.commit(&sl, Nanos(0), 1.0);
    /// log.commit(&sl, Nanos(3), 1.0);
    /// log.commit(&sl, Nanos(12), 2.0);
    /// assert_eq!(log.entries().collect::<Vec<_>>(), [(Nanos(3), 1.0), (Nanos(12), 2.0)]);
    /// ```
    // Twin in sluice-redis's Lua script: log_commit.
    pub fn commit(&mut self, sl: &SlidingLog, now: Nanos, cost: f64) {
        let now = self.at(now);
        self.expire(sl, now);
        if cost <= 0.0 {
            return;
        }
        let full = self.entries.len() >= MAX_LOG_ENTRIES;
        let merged = match self.entries.back_mut() {
            Some(e) if e.t == now || full => {
                let (c, ok) = add_exact(e.cost, cost);
                e.t = now;
                e.cost = c;
                ok
            }
            _ => {
                // Most keys log one call at a time: room for just that one
                // at first, instead of the four a first push makes room for.
                if self.entries.capacity() == 0 {
                    self.entries.reserve_exact(1);
                }
                self.entries.push_back(Entry { t: now, cost });
                true
            }
        };
        let (used, ok) = add_exact(self.used, cost);
        self.used = used;
        self.inexact |= !(merged && ok);
    }

    /// Settles `change` at `now` (at the newest entry's time, if the clock
    /// stepped back), after dropping the entries that have left the window.
    /// A charge is logged like an admission, whatever the rate. A refund
    /// takes back from the newest entries first, the ones that would count
    /// longest, and never below an empty log.
    ///
    /// ```
    /// use sluice_core::{Nanos, Settle, SlidingLog, sliding::Log};
    /// let sl = SlidingLog::per_period(5.0, Nanos(10)).unwrap();
    /// let mut log = Log::default();
    /// log.commit(&sl, Nanos(0), 2.0);
    /// log.commit(&sl, Nanos(3), 2.0);
    /// log.settle(&sl, Nanos(4), Settle::Refund(3.0));
    /// assert_eq!(log.entries().collect::<Vec<_>>(), [(Nanos(0), 1.0)]);
    /// log.settle(&sl, Nanos(5), Settle::Charge(9.0));
    /// assert_eq!(log.current(&sl, Nanos(5)).tokens, -5.0);
    /// ```
    // Twin in sluice-redis's Lua script: log_refund, settle_op.
    pub fn settle(&mut self, sl: &SlidingLog, now: Nanos, change: Settle) {
        let n = match change {
            Settle::ChargeOnce(_) if self.current(sl, now).tokens < 0.0 => return,
            Settle::Charge(n) | Settle::ChargeOnce(n) => return self.commit(sl, now, n),
            Settle::Refund(n) => n,
        };
        let now = self.at(now);
        self.expire(sl, now);
        let mut left = n;
        while left > 0.0 {
            let Some(e) = self.entries.back_mut() else {
                break;
            };
            if e.cost <= left {
                left -= e.cost;
                self.entries.pop_back();
            } else {
                e.cost -= left;
                left = 0.0;
            }
        }
        let (used, exact) = fold(self.entries.iter());
        self.used = used;
        self.inexact = !exact;
    }

    /// Drops the entries that have left the window ending at `now`.
    // Twin in sluice-redis's Lua script: log_commit, log_refund.
    fn expire(&mut self, sl: &SlidingLog, now: i64) {
        let gone = self.expired(sl, now);
        if gone == 0 {
            return;
        }
        let (used, exact) = self.sum_from(gone);
        self.entries.drain(..gone);
        self.used = used;
        self.inexact = !exact;
        // A burst that has left gives its memory back.
        if self.entries.capacity() > 8 && self.entries.len() * 4 < self.entries.capacity() {
            self.entries.shrink_to(self.entries.len() * 2);
        }
    }

    /// The tokens available at `now` (the rate less the costs in the
    /// window) and the time they are counted at, without changing anything.
    ///
    /// ```
    /// use sluice_core::{Nanos, SlidingLog, sliding::Log};
    /// let sl = SlidingLog::per_period(5.0, Nanos(10)).unwrap();
    /// let mut log = Log::default();
    /// log.commit(&sl, Nanos(0), 2.0);
    /// assert_eq!(log.current(&sl, Nanos(9)).tokens, 3.0);
    /// assert_eq!(log.current(&sl, Nanos(10)).tokens, 5.0);
    /// ```
    pub fn current(&self, sl: &SlidingLog, now: Nanos) -> Value {
        self.read(sl, now, 0.0, 0.0).current(sl)
    }

    /// Appends the log's bytes, for a store to keep: the sum and whether it
    /// is exact, then each entry's time and cost, oldest first.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(9 + 16 * self.entries.len());
        out.extend(self.used.to_le_bytes());
        out.push(u8::from(self.inexact));
        for e in &self.entries {
            out.extend(e.t.to_le_bytes());
            out.extend(e.cost.to_le_bytes());
        }
    }

    /// A log from [`Log::encode`]'s bytes: all that `r` holds.
    pub(crate) fn decode(r: &mut crate::bytes::Reader<'_>) -> Option<Log> {
        let used = r.f64()?;
        let inexact = r.u8()? != 0;
        if !r.left().is_multiple_of(16) || r.left() / 16 > MAX_LOG_ENTRIES {
            return None;
        }
        let mut entries = VecDeque::with_capacity(r.left() / 16);
        while r.left() > 0 {
            entries.push_back(Entry {
                t: r.i64()?,
                cost: r.f64()?,
            });
        }
        Some(Log {
            entries,
            used,
            inexact,
        })
    }

    /// When the log is empty: a period after its newest entry. From then
    /// on the key holds no information (a missing key has logged nothing),
    /// so a store may drop it.
    ///
    /// ```
    /// use sluice_core::{Nanos, SlidingLog, sliding::Log};
    /// let sl = SlidingLog::per_period(5.0, Nanos(10)).unwrap();
    /// let mut log = Log::default();
    /// assert_eq!(log.empty_at(&sl), Nanos(i64::MIN));
    /// log.commit(&sl, Nanos(3), 1.0);
    /// assert_eq!(log.empty_at(&sl), Nanos(13));
    /// ```
    #[inline]
    pub fn empty_at(&self, sl: &SlidingLog) -> Nanos {
        self.entries.back().map_or(Nanos(i64::MIN), |e| {
            Nanos(e.t.saturating_add(sl.period().0))
        })
    }

    /// The fullest log (the fewest tokens at `now` and at every later time)
    /// of any key that is known only to be empty by `empty_at`, or `None`
    /// when that time has come: the whole rate, logged a period before
    /// `empty_at` (or at `now`, if that is earlier). A store that forgot a
    /// key brings it back as this.
    ///
    /// ```
    /// use sluice_core::{Nanos, SlidingLog, sliding::Log};
    /// let sl = SlidingLog::per_period(5.0, Nanos(10)).unwrap();
    /// let log = Log::emptiest(&sl, Nanos(13), Nanos(6)).unwrap();
    /// assert_eq!(log.entries().collect::<Vec<_>>(), [(Nanos(3), 5.0)]);
    /// assert_eq!(Log::emptiest(&sl, Nanos(13), Nanos(13)), None);
    /// ```
    // Twin in sluice-redis's Lua script: log_of.
    pub fn emptiest(sl: &SlidingLog, empty_at: Nanos, now: Nanos) -> Option<Log> {
        if empty_at <= now {
            return None;
        }
        let t = empty_at.0.saturating_sub(sl.period().0).min(now.0);
        Some(Log {
            entries: VecDeque::from([Entry { t, cost: sl.rate() }]),
            used: sl.rate(),
            inexact: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactness_is_tracked_through_sums() {
        assert_eq!(add_exact(1.0, 2.0), (3.0, true));
        assert!(!add_exact(0.1, 0.2).1);
        assert_eq!(add_exact(0.5, 0.25), (0.75, true));
    }

    #[test]
    fn a_log_of_inexact_costs_is_summed_afresh_as_entries_leave() {
        let sl = SlidingLog::per_period(1.0, Nanos(10)).unwrap();
        let mut log = Log::default();
        for t in 0..10 {
            log.commit(&sl, Nanos(t), 0.1);
        }
        // Each entry leaves in turn; the sum stays that of the entries left,
        // summed oldest first, not a running total with its rounding.
        for t in 10..19 {
            log.commit(&sl, Nanos(t), 0.0);
            let left = (t - 9) as usize;
            let want = fold(log.entries.iter()).0;
            assert_eq!(log.len(), 10 - left);
            assert_eq!(log.used.to_bits(), want.to_bits(), "at {t}");
        }
        log.commit(&sl, Nanos(19), 0.0);
        log.commit(&sl, Nanos(100), 0.0);
        assert!(log.is_empty());
        assert_eq!((log.used, log.inexact), (0.0, false));
    }

    #[test]
    fn a_full_log_merges_its_newest_entry_forward() {
        let sl = SlidingLog::per_period(1e9, Nanos(1 << 40)).unwrap();
        let mut log = Log::default();
        for t in 0..MAX_LOG_ENTRIES as i64 + 3 {
            log.commit(&sl, Nanos(t), 1.0);
        }
        assert_eq!(log.len(), MAX_LOG_ENTRIES);
        let newest = log.entries().last();
        assert_eq!(newest, Some((Nanos(MAX_LOG_ENTRIES as i64 + 2), 4.0)));
        assert_eq!(log.used, MAX_LOG_ENTRIES as f64 + 3.0);
    }

    #[test]
    fn a_clock_that_steps_back_logs_at_the_newest_time() {
        let sl = SlidingLog::per_period(3.0, Nanos(10)).unwrap();
        let mut log = Log::default();
        log.commit(&sl, Nanos(20), 1.0);
        log.commit(&sl, Nanos(5), 1.0);
        assert_eq!(log.entries().collect::<Vec<_>>(), [(Nanos(20), 2.0)]);
        assert_eq!(log.current(&sl, Nanos(0)).ts, Nanos(20));
    }
}
