//! Runs a scenario through one algorithm at a time, on the engine `sluice
//! replay` decides with, in virtual time, and keeps what the report shows.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;
use sluice_core::MemoryStore;
use sluice_policy::Policy;

use super::scenario::Scenario;
use crate::replay::{Call, Hold, Replayer};

/// The algorithms compared, as a policy file names them.
pub(crate) const ALGORITHMS: [&str; 4] = [
    "token_bucket",
    "fixed_window",
    "sliding_window",
    "sliding_log",
];

/// One call as the simulation saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallRecord {
    pub(crate) t: f64,
    pub(crate) key: usize,
    pub(crate) allowed: bool,
    pub(crate) retry_after: Option<f64>,
    pub(crate) remaining: Option<u64>,
    /// 0 for a first call, then 1, 2… for its retries.
    pub(crate) attempt: u32,
}

/// What one algorithm did with the scenario.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Totals {
    pub(crate) algorithm: &'static str,
    /// Calls admitted, retries included.
    pub(crate) admitted: u64,
    /// Calls denied, retries included.
    pub(crate) denied: u64,
    /// The most calls of one key admitted within any span of one period.
    pub(crate) peak: u64,
    /// The limit every algorithm was given: `rate` per period.
    pub(crate) limit: f64,
    /// How far above `limit` the algorithm may let one span of one period
    /// go, by its own formula, so that `peak` is at most `limit + burst`: a
    /// token bucket its burst (here the rate); a sliding window up to one
    /// more rate's worth, as its estimate takes the previous window's calls
    /// to have been spread evenly; a sliding log nothing. A fixed window
    /// promises its rate per window, not per span: a span of one period
    /// that straddles a boundary holds the end of one window and the start
    /// of the next, each with its whole rate, so a whole rate more. That is
    /// the gap a double-window attack goes through.
    pub(crate) burst: f64,
    /// The most retries, of every key, within any span of one second: how
    /// hard the denied clients come back at once.
    pub(crate) retries_in_busiest_second: u64,
}

/// A run: its totals and every call.
pub(crate) struct Run {
    pub(crate) totals: Totals,
    pub(crate) calls: Vec<CallRecord>,
}

/// The policy of one algorithm at the scenario's limit: a named limit
/// `sim` whose windows, if it has any, open at 0.
fn policy(algorithm: &str, s: &Scenario) -> anyhow::Result<Policy> {
    let (rate, period) = (s.rate, s.period);
    let start = if matches!(algorithm, "fixed_window" | "sliding_window") {
        ", start: 0"
    } else {
        ""
    };
    let text = format!(
        "limits:\n  sim:\n    algorithm: {algorithm}\n    \
         algorithm_config: {{rate: {rate}, period: {period}{start}}}\n"
    );
    Ok(Policy::from_str(&text, "simulation")?)
}

/// Runs `s` through `algorithm`. A denied call is tried again after the
/// Retry-After a client would be told, whole seconds with Sluice's
/// per-client jitter when `jitter`, without it otherwise.
pub(crate) async fn run(
    algorithm: &'static str,
    s: &Scenario,
    jitter: bool,
) -> anyhow::Result<Run> {
    let mut replayer: Replayer<MemoryStore<sluice_core::FakeClock>> =
        Replayer::new(policy(algorithm, s)?, 0);
    let arrivals = s.arrivals();
    let mut keys: Vec<&str> = Vec::new();
    // (time in ns, sequence, key index, attempt)
    let mut queue: BinaryHeap<Reverse<(i64, u64, usize, u32)>> = BinaryHeap::new();
    for (seq, (t, key)) in arrivals.iter().enumerate() {
        let k = match keys.iter().position(|k| k == key) {
            Some(k) => k,
            None => {
                keys.push(key);
                keys.len() - 1
            }
        };
        queue.push(Reverse((nanos(*t), seq as u64, k, 0)));
    }
    let mut seq = arrivals.len() as u64;
    let mut calls = Vec::with_capacity(arrivals.len());
    while let Some(Reverse((t_ns, _, k, attempt))) = queue.pop() {
        let t = t_ns as f64 / 1e9;
        replayer.set_time(t).await?;
        let call = Call {
            limit: "sim".to_owned(),
            key: keys[k].to_owned(),
            count: 1.0,
            reserve: false,
            settle: None,
            hold: Hold::Expiry,
            inline: None,
        };
        let t_json = serde_json::Number::from_f64(t).unwrap_or_else(|| 0.into());
        let line = replayer.call(&t_json, &call).await?;
        let seen = CallRecord {
            t,
            key: k,
            allowed: line.allowed,
            retry_after: line.retry_after,
            remaining: line.remaining,
            attempt,
        };
        calls.push(seen);
        if let (false, Some(exact)) = (seen.allowed, seen.retry_after)
            && attempt < s.retries
        {
            let secs = if jitter {
                sluice_http::retry_after_secs(exact, &format!("sim/{}", keys[k]))
            } else {
                exact.ceil() as u64
            };
            seq += 1;
            queue.push(Reverse((
                t_ns + nanos(secs.max(1) as f64),
                seq,
                k,
                attempt + 1,
            )));
        }
    }
    let admitted = calls.iter().filter(|c| c.allowed).count() as u64;
    let totals = Totals {
        algorithm,
        admitted,
        denied: calls.len() as u64 - admitted,
        peak: peak(&calls, keys.len(), s.period),
        retries_in_busiest_second: busiest(
            calls.iter().filter(|c| c.attempt > 0).map(|c| c.t),
            1.0,
        ),
        limit: s.rate,
        burst: match algorithm {
            // Exact: no span of one period holds more than the rate.
            "sliding_log" => 0.0,
            _ => s.rate,
        },
    };
    Ok(Run { totals, calls })
}

fn nanos(secs: f64) -> i64 {
    (secs * 1e9).round() as i64
}

/// The most calls of one key admitted within any span shorter than
/// `period`.
pub(crate) fn peak(calls: &[CallRecord], keys: usize, period: f64) -> u64 {
    (0..keys)
        .map(|k| {
            let times = calls
                .iter()
                .filter(|c| c.allowed && c.key == k)
                .map(|c| c.t);
            busiest(times, period)
        })
        .max()
        .unwrap_or(0)
}

/// The most of `times` (in order) within any span shorter than `span`.
fn busiest(times: impl Iterator<Item = f64>, span: f64) -> u64 {
    let times: Vec<f64> = times.collect();
    let mut best = 0;
    let mut first = 0;
    for (last, &t) in times.iter().enumerate() {
        while t - times[first] >= span {
            first += 1;
        }
        best = best.max(last + 1 - first);
    }
    best as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(t: f64, allowed: bool) -> CallRecord {
        CallRecord {
            t,
            key: 0,
            allowed,
            retry_after: None,
            remaining: None,
            attempt: 0,
        }
    }

    #[test]
    fn the_peak_counts_admissions_within_less_than_one_period() {
        let calls = [
            seen(0.0, true),
            seen(0.5, true),
            seen(0.9, false),
            seen(1.0, true),
            seen(1.2, true),
        ];
        // 0.5, 1.0 and 1.2 lie within one second; 0.0 and 1.0 do not.
        assert_eq!(peak(&calls, 1, 1.0), 3);
        assert_eq!(peak(&calls, 1, 10.0), 4);
        assert_eq!(peak(&[], 0, 1.0), 0);
    }
}
