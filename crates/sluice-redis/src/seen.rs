//! What the script saw for one operation, with the configuration it is
//! read under, and the decision sluice-core makes from it: the same
//! functions the memory store decides with, so that the two stores cannot
//! drift apart in what they report.

use sluice_core::algorithm::{self, State};
use sluice_core::sliding::{LogReading, WindowState, window_current, window_evaluate};
use sluice_core::{Algorithm, Decision, Nanos, SlidingLog, SlidingWindow, Value};

/// The state an operation saw, by the kind of its limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum SeenState {
    /// A token bucket's or a fixed window's two numbers, if the key had any.
    Flat(Algorithm, Option<State>),
    /// A sliding window's state, if the key had one.
    Window(SlidingWindow, Option<WindowState>),
    /// What a sliding log's decision is made from.
    Log(SlidingLog, LogReading),
}

impl SeenState {
    /// The two-number state, for a token bucket or a fixed window.
    pub(crate) fn flat(&self) -> Option<State> {
        match self {
            SeenState::Flat(_, s) => *s,
            SeenState::Window(..) | SeenState::Log(..) => None,
        }
    }

    /// The decision on a call of `cost` at `now`; `pending` is what the
    /// transaction's earlier operations admitted on the same sliding log
    /// (the other kinds saw those in their state already).
    pub(crate) fn decide(
        &self,
        offset: i64,
        now: Nanos,
        cost: f64,
        reserve: bool,
        pending: f64,
    ) -> Decision {
        match self {
            SeenState::Flat(alg, state) => {
                algorithm::evaluate(alg, *state, offset, now, cost, reserve).decision
            }
            SeenState::Window(sw, state) => window_evaluate(sw, *state, offset, now, cost).decision,
            SeenState::Log(sl, reading) => reading.decide(sl, pending, cost),
        }
    }

    /// `d`, from an operation of a denied transaction that would have been
    /// admitted, reporting the key as it stands, since nothing was spent:
    /// `self` is what the transaction's first operation on the key saw.
    pub(crate) fn unspent(&self, offset: i64, now: Nanos, d: Decision) -> Decision {
        let idle = self.decide(offset, now, 0.0, false, 0.0);
        Decision {
            remaining: idle.remaining,
            reset: idle.reset,
            ..d
        }
    }

    /// The key's tokens at `now` and the time they are counted at.
    pub(crate) fn current(&self, offset: i64, now: Nanos) -> Value {
        match self {
            SeenState::Flat(alg, state) => algorithm::current(alg, *state, offset, now),
            SeenState::Window(sw, state) => window_current(sw, *state, offset, now),
            SeenState::Log(sl, reading) => reading.current(sl),
        }
    }
}
