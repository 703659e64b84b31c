//! The metric handles the engine records decisions and store calls into.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use metrics::{Counter, Histogram};
use sluice_policy::Enforcement;

use crate::store_errors::StoreErrorLog;

/// The metric handles decisions record into, made on first use and then
/// kept: making a labelled handle costs an allocation and a registry lookup,
/// a large share of a decision on the memory store. So a metrics recorder
/// must be installed before the first decision, as it is at start-up.
#[derive(Default)]
pub(crate) struct Meters {
    /// `sluice_decisions_total` by rule: allowed and denied when enforced,
    /// then allowed and denied in shadow mode. Each is registered when first
    /// counted, since an exporter lists every registered series, at 0 too,
    /// and an enforced rule has no business in the shadow series.
    decisions: RwLock<HashMap<Box<str>, [OnceLock<Counter>; 4]>>,
    /// `sluice_store_seconds` of rules' transactions.
    transact: OnceLock<Histogram>,
    /// `sluice_store_seconds` of named limits' decisions.
    decide: OnceLock<Histogram>,
    /// `sluice_store_seconds` of settlements.
    settle: OnceLock<Histogram>,
    /// `sluice_store_seconds` of releases.
    release: OnceLock<Histogram>,
    /// Failed store calls, logged a line per interval.
    /// Shared with the task that releases leases in the background.
    pub(crate) errors: Arc<StoreErrorLog>,
}

/// The `sluice_decisions_total` series of `rule` at index `i` of
/// [`Meters::decisions`].
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
    pub(crate) fn count(&self, rule: &str, mode: Enforcement, allowed: bool) {
        let i = usize::from(!allowed) + 2 * usize::from(mode == Enforcement::Shadow);
        let bump = |counters: &[OnceLock<Counter>; 4]| {
            counters[i]
                .get_or_init(|| decision_counter(rule, i))
                .increment(1);
        };
        if let Ok(m) = self.decisions.read()
            && let Some(counters) = m.get(rule)
        {
            return bump(counters);
        }
        match self.decisions.write() {
            Ok(mut m) => bump(m.entry(rule.into()).or_default()),
            // Poisoned: count without keeping the handle.
            Err(_) => decision_counter(rule, i).increment(1),
        }
    }

    pub(crate) fn transact(&self) -> &Histogram {
        self.transact
            .get_or_init(|| metrics::histogram!("sluice_store_seconds", "op" => "transact"))
    }

    pub(crate) fn release(&self) -> &Histogram {
        self.release
            .get_or_init(|| metrics::histogram!("sluice_store_seconds", "op" => "release"))
    }

    pub(crate) fn settle(&self) -> &Histogram {
        self.settle
            .get_or_init(|| metrics::histogram!("sluice_store_seconds", "op" => "settle"))
    }

    pub(crate) fn decide(&self) -> &Histogram {
        self.decide
            .get_or_init(|| metrics::histogram!("sluice_store_seconds", "op" => "decide"))
    }
}
