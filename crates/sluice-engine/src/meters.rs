//! The metric handles the engine records decisions and store calls into,
//! and the running tallies that [`Enforcer::activity`] reads back.
//!
//! [`Enforcer::activity`]: crate::Enforcer::activity

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use metrics::{Counter, Histogram};
use quanta::Instant;
use sluice_policy::Enforcement;

use crate::activity::{Activity, LATENCY_BUCKETS, RuleActivity, StoreActivity, latency_bucket};
use crate::reservation::HeldMeter;
use crate::store_errors::StoreErrorLog;
use crate::top_keys::TopKeys;

/// A decision's place among a rule's four series: allowed and denied when
/// enforced, then allowed and denied in shadow mode.
fn series(enforcement: Enforcement, allowed: bool) -> usize {
    usize::from(!allowed) + 2 * usize::from(enforcement == Enforcement::Shadow)
}

/// One rule's or named limit's decisions.
#[derive(Default)]
struct RuleMeters {
    /// `sluice_decisions_total` in each series. Each is registered when
    /// first counted, since an exporter lists every registered series, at 0
    /// too, and an enforced rule has no business in the shadow series.
    counters: [OnceLock<Counter>; 4],
    /// The same counts, which the exporter does not give back.
    tally: [AtomicU64; 4],
}

/// The kinds of store call timed in `sluice_store_seconds`.
#[derive(Clone, Copy)]
pub(crate) enum StoreOp {
    /// Rules' transactions.
    Transact,
    /// Named limits' decisions.
    Decide,
    /// Settlements.
    Settle,
    /// Releases.
    Release,
}

/// The metric handles decisions record into, made on first use and then
/// kept: making a labelled handle costs an allocation and a registry lookup,
/// a large share of a decision on the memory store. So a metrics recorder
/// must be installed before the first decision, as it is at start-up.
pub(crate) struct Meters {
    /// By rule or named limit. Every decision looks its rules up here, and
    /// the names are the policy's, plus at most the inline and override
    /// limits' caps more, so a fast hasher serves, where SipHash would be
    /// much of what counting a decision costs.
    decisions: RwLock<HashMap<Box<str>, RuleMeters, foldhash::fast::RandomState>>,
    /// `sluice_store_seconds`, by [`StoreOp`].
    seconds: [OnceLock<Histogram>; 4],
    /// Every store call's duration, by [`latency_bucket`].
    latency: Box<[AtomicU64; LATENCY_BUCKETS]>,
    /// Failed store calls, logged a line per interval.
    /// Shared with the task that releases leases in the background.
    pub(crate) errors: Arc<StoreErrorLog>,
    /// The most denied keys, once kept (see
    /// [`Enforcer::keep_top_keys`](crate::Enforcer::keep_top_keys)).
    pub(crate) top_keys: OnceLock<TopKeys>,
    /// The requests held until their reservations are due.
    pub(crate) held: Arc<HeldMeter>,
}

impl Default for Meters {
    fn default() -> Self {
        Meters {
            decisions: RwLock::default(),
            seconds: Default::default(),
            latency: Box::new([const { AtomicU64::new(0) }; LATENCY_BUCKETS]),
            errors: Arc::default(),
            top_keys: OnceLock::new(),
            held: Arc::default(),
        }
    }
}

/// The `sluice_decisions_total` series of `rule` at index `i` (see
/// [`series`]).
fn decision_counter(rule: &str, i: usize) -> Counter {
    let outcome = if i.is_multiple_of(2) {
        "allowed"
    } else {
        "denied"
    };
    let mode = if i < 2 { "enforce" } else { "shadow" };
    metrics::counter!("sluice_decisions_total", "rule" => rule.to_owned(), "outcome" => outcome, "mode" => mode)
}

impl Meters {
    /// Counts a decision of `rule` on `key`; a denial also counts towards
    /// the key's place among the most denied, when those are kept.
    pub(crate) fn count(&self, rule: &str, enforcement: Enforcement, allowed: bool, key: &str) {
        let i = series(enforcement, allowed);
        let bump = |m: &RuleMeters| {
            m.counters[i]
                .get_or_init(|| decision_counter(rule, i))
                .increment(1);
            m.tally[i].fetch_add(1, Ordering::Relaxed);
        };
        if !allowed && let Some(top) = self.top_keys.get() {
            top.record(rule, enforcement, key);
        }
        if let Ok(m) = self.decisions.read()
            && let Some(m) = m.get(rule)
        {
            return bump(m);
        }
        match self.decisions.write() {
            Ok(mut m) => bump(m.entry(rule.into()).or_default()),
            // Poisoned: count without keeping the handle.
            Err(_) => decision_counter(rule, i).increment(1),
        }
    }

    /// Records how long a store call that began at `started` took. The
    /// time is the CPU's cycle counter's, read through `quanta`: a memory
    /// store's call takes a fraction of a microsecond, and the two readings
    /// of the operating system's clock were a noticeable part of it.
    pub(crate) fn timed(&self, op: StoreOp, started: Instant) {
        let took = started.elapsed();
        let label = match op {
            StoreOp::Transact => "transact",
            StoreOp::Decide => "decide",
            StoreOp::Settle => "settle",
            StoreOp::Release => "release",
        };
        self.seconds[op as usize]
            .get_or_init(|| metrics::histogram!("sluice_store_seconds", "op" => label))
            .record(took.as_secs_f64());
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.latency[latency_bucket(nanos)].fetch_add(1, Ordering::Relaxed);
    }

    /// What has been decided and called so far.
    pub(crate) fn activity(&self) -> Activity {
        let rules = match self.decisions.read() {
            Ok(m) => m
                .iter()
                .flat_map(|(rule, m)| {
                    let n = |i: usize| m.tally[i].load(Ordering::Relaxed);
                    [Enforcement::Enforce, Enforcement::Shadow]
                        .into_iter()
                        .map(move |enforcement| RuleActivity {
                            rule: rule.to_string(),
                            enforcement,
                            allowed: n(series(enforcement, true)),
                            denied: n(series(enforcement, false)),
                        })
                        .filter(|r| r.allowed + r.denied > 0)
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        let mut latency = [0; LATENCY_BUCKETS];
        for (n, bucket) in latency.iter_mut().zip(self.latency.iter()) {
            *n = bucket.load(Ordering::Relaxed);
        }
        Activity {
            rules,
            store: StoreActivity {
                latency,
                errors: self.errors.failures(),
            },
            held: self.held.now(),
        }
    }
}
