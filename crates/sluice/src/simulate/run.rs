//! Runs a scenario through one algorithm at a time, on the engine `sluice
//! replay` decides with, in virtual time, and keeps what the report shows.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;
use sluice_core::{FakeClock, MemoryStore};
use sluice_policy::RequestParts;

use super::scenario::{KEY_HEADER, Scenario};
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
    /// How long an admitted call was held before it went on, in seconds:
    /// 0 but where a shaping rule delayed it.
    pub(crate) delay: f64,
}

impl CallRecord {
    /// When an admitted call reached the upstream.
    pub(crate) fn forwarded(&self) -> Option<f64> {
        self.allowed.then_some(self.t + self.delay)
    }
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
    /// Of a shaped scenario: the most calls held at once, and the longest
    /// any was held, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) most_held: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) longest_delay: Option<f64>,
}

/// A run: its totals and every call.
pub(crate) struct Run {
    pub(crate) totals: Totals,
    pub(crate) calls: Vec<CallRecord>,
}

/// Runs `s` through `algorithm`. A denied call is tried again after the
/// Retry-After a client would be told, whole seconds with Sluice's
/// per-client jitter when `jitter`, without it otherwise.
pub(crate) async fn run(
    algorithm: &'static str,
    s: &Scenario,
    jitter: bool,
) -> anyhow::Result<Run> {
    let mut replayer: Replayer<MemoryStore<FakeClock>> = Replayer::new(s.policy(algorithm)?, 0);
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
            delay: 0.0,
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
        most_held: None,
        longest_delay: None,
    };
    Ok(Run { totals, calls })
}

/// Runs the scenario's calls through its shaping rule as requests, held
/// when `delay` as a front end that can hold them holds them
/// ([`Enforcer::enforce_shaped`](sluice_engine::Enforcer::enforce_shaped):
/// a request over the limit reserves, and one whose wait is within the
/// rule's `max` reaches the upstream when the wait is over), refused over
/// the limit otherwise.
pub(crate) async fn shaped(s: &Scenario, delay: bool) -> anyhow::Result<Run> {
    let shaping = s
        .shaping
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the scenario {:?} does not shape", s.name))?;
    let mut replayer: Replayer<MemoryStore<FakeClock>> = Replayer::new(shaping.policy(s)?, 0);
    let arrivals = s.arrivals();
    let mut keys: Vec<&str> = Vec::new();
    let mut calls = Vec::with_capacity(arrivals.len());
    for (t, key) in arrivals {
        let k = keys.iter().position(|k| *k == key).unwrap_or_else(|| {
            keys.push(key);
            keys.len() - 1
        });
        replayer.set_time(t).await?;
        let req = RequestParts::new("GET", "/").with_header(KEY_HEADER, key);
        let verdict = if delay {
            replayer.request_shaped(&req).await
        } else {
            replayer.request(&req, 0.0).await
        };
        calls.push(CallRecord {
            t,
            key: k,
            allowed: verdict.allowed,
            retry_after: verdict.retry_after,
            remaining: None,
            attempt: 0,
            delay: verdict.delay.map_or(0.0, |d| d.as_secs_f64()),
        });
    }
    let admitted = calls.iter().filter(|c| c.allowed).count() as u64;
    let totals = Totals {
        algorithm: if delay { "delayed" } else { "refused" },
        admitted,
        denied: calls.len() as u64 - admitted,
        peak: peak(&calls, keys.len(), s.period),
        retries_in_busiest_second: 0,
        limit: s.rate,
        burst: shaping.burst,
        most_held: Some(held(&calls).into_iter().map(|(_, n)| n).max().unwrap_or(0)),
        longest_delay: Some(calls.iter().map(|c| c.delay).fold(0.0, f64::max)),
    };
    Ok(Run { totals, calls })
}

fn nanos(secs: f64) -> i64 {
    (secs * 1e9).round() as i64
}

/// `secs` in whole microseconds: where a simulation's moments are
/// compared, as virtual time is whole nanoseconds and a call's time and
/// its wait are each rounded to one.
pub(crate) fn micros(secs: f64) -> i64 {
    (secs * 1e6).round() as i64
}

/// How many calls are held after each arrival of a delayed call and
/// each forwarding, in time order: each is held from its arrival until it
/// is forwarded, and one forwarded at the moment another arrives is gone
/// first. Moments are whole microseconds: virtual time is whole
/// nanoseconds and a wait is rounded to one, so a call due as another
/// arrives may be due a nanosecond after it.
pub(crate) fn held(calls: &[CallRecord]) -> Vec<(f64, u64)> {
    let mut changes: Vec<(i64, i64)> = calls
        .iter()
        .filter(|c| c.allowed && c.delay > 0.0)
        .flat_map(|c| [(micros(c.t), 1), (micros(c.t + c.delay), -1)])
        .collect();
    changes.sort_unstable();
    let mut now: i64 = 0;
    changes
        .into_iter()
        .map(|(t, change)| {
            now += change;
            (t as f64 / 1e6, now.max(0) as u64)
        })
        .collect()
}

/// The most calls of one key that reached the upstream within any span
/// shorter than `period`.
pub(crate) fn peak(calls: &[CallRecord], keys: usize, period: f64) -> u64 {
    (0..keys)
        .map(|k| {
            let mut times: Vec<f64> = calls
                .iter()
                .filter(|c| c.key == k)
                .filter_map(CallRecord::forwarded)
                .collect();
            // A delayed call may reach the upstream after later ones.
            times.sort_by(f64::total_cmp);
            busiest(times.into_iter(), period)
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
            delay: 0.0,
        }
    }

    /// Six calls at once under ten a second with a burst of one and room
    /// for `max_reserved` more, held for up to `max` seconds.
    async fn six_at_once(max_reserved: f64, max: f64, delay: bool) -> Vec<Option<f64>> {
        let s: Scenario = serde_json::from_value(serde_json::json!({
            "name": "six", "rate": 10, "period": 1,
            "waves": [{"at": 1, "count": 6}],
            "shaping": {"burst": 1, "max_reserved": max_reserved, "max": max},
        }))
        .unwrap();
        s.check().unwrap();
        let run = shaped(&s, delay).await.unwrap();
        let at = |c: &CallRecord| c.forwarded().map(|t| (t * 1e6).round() / 1e6);
        run.calls.iter().map(at).collect()
    }

    #[tokio::test]
    async fn a_delayed_call_reaches_the_upstream_when_its_reservation_is_due() {
        // As nginx's `limit_req rate=10r/s burst=3`: the first at once,
        // three more 100 ms apart, the rest refused.
        assert_eq!(
            six_at_once(3.0, 1.0, true).await,
            [Some(1.0), Some(1.1), Some(1.2), Some(1.3), None, None]
        );
        // A reservation due later than `max` is given back: the next call
        // finds the bucket as the last admitted one left it.
        assert_eq!(
            six_at_once(3.0, 0.15, true).await,
            [Some(1.0), Some(1.1), None, None, None, None]
        );
        // Without the delay, only the burst.
        assert_eq!(
            six_at_once(3.0, 1.0, false).await,
            [Some(1.0), None, None, None, None, None]
        );
    }

    #[test]
    fn held_calls_are_counted_from_arrival_until_forwarded() {
        let call = |t: f64, delay: f64| CallRecord {
            delay,
            ..seen(t, true)
        };
        let counts = |calls: &[CallRecord]| -> Vec<u64> {
            held(calls).into_iter().map(|(_, n)| n).collect()
        };
        // One forwarded at once is never held.
        let calls = [
            call(0.0, 0.0),
            call(0.0, 0.1),
            call(0.0, 0.2),
            call(0.15, 0.1),
        ];
        assert_eq!(counts(&calls), [1, 2, 1, 2, 1, 0]);
        // One forwarded as another arrives, even a nanosecond late (as the
        // store rounds its wait), is gone first.
        let calls = [call(0.0, 0.100_000_000_3), call(0.1, 0.1)];
        assert_eq!(counts(&calls), [1, 0, 1, 0]);
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
