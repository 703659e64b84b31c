//! The log of failed store calls, summarised: during an outage every
//! decision fails, and a line per failure would bury everything else (and
//! cost more than the decisions). The first failure is logged at once;
//! later ones are counted and logged at most once per interval, with the
//! count of those left out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::{OnStoreError, StoreError};

/// Counts a failed store call in `sluice_store_errors_total` for each rule
/// or limit it decided, by how that one fails, and logs it in `log`.
pub(crate) fn store_failed<'r>(
    log: &StoreErrorLog,
    e: &StoreError,
    deciding: impl IntoIterator<Item = (&'r str, OnStoreError)>,
) {
    let kind = match e {
        StoreError::Timeout => "timeout",
        _ => "unavailable",
    };
    for (name, on_error) in deciding {
        metrics::counter!("sluice_store_errors_total", "kind" => kind, "fail" => fail(on_error), "rule" => name.to_owned())
            .increment(1);
    }
    log.failed(e);
}

/// Counts a decision of the rule or named limit `name` made without the
/// store in `sluice_decisions_without_store_total`, by how it was made:
/// `open` admitted, `closed` denied. Unlike `sluice_store_errors_total`,
/// which counts failed store calls by how each rule in them fails (a
/// settlement, a penalty's charge and a shadow rule's call too), this
/// counts answers: an enforced rule in a transaction that another rule's
/// failing closed denied is counted `closed`.
pub(crate) fn decided_without_store(name: &str, how: OnStoreError) {
    metrics::counter!("sluice_decisions_without_store_total", "rule" => name.to_owned(), "fail" => fail(how))
        .increment(1);
}

fn fail(how: OnStoreError) -> &'static str {
    match how {
        OnStoreError::Open => "open",
        OnStoreError::Closed => "closed",
    }
}

/// How often, at most, a failure is logged.
const INTERVAL: Duration = Duration::from_secs(10);

pub(crate) struct StoreErrorLog {
    start: Instant,
    /// Milliseconds after `start` before which nothing more is logged.
    next: AtomicU64,
    /// Failures not logged since the last line.
    left_out: AtomicU64,
    /// Every failure so far.
    failures: AtomicU64,
}

impl Default for StoreErrorLog {
    fn default() -> Self {
        StoreErrorLog {
            start: Instant::now(),
            next: AtomicU64::new(0),
            left_out: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }
}

impl StoreErrorLog {
    /// Logs `e`, or counts it if a line was logged less than an interval ago.
    pub(crate) fn failed(&self, e: &StoreError) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        if let Some(left_out) = self.due(now) {
            if left_out == 0 {
                tracing::warn!(error = %e, "store call failed");
            } else {
                tracing::warn!(
                    error = %e,
                    left_out,
                    "store call failed; {left_out} more failed since the last such line"
                );
            }
        }
    }

    /// How many store calls have failed so far.
    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Whether a failure at `now` (ms) is logged, and if so how many were
    /// left out before it; `None` counts it as left out.
    fn due(&self, now: u64) -> Option<u64> {
        let next = self.next.load(Ordering::Relaxed);
        let interval = u64::try_from(INTERVAL.as_millis()).unwrap_or(u64::MAX);
        if now >= next
            && self
                .next
                .compare_exchange(
                    next,
                    now.saturating_add(interval),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            Some(self.left_out.swap(0, Ordering::Relaxed))
        } else {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_logs_one_line_per_interval_with_the_count_left_out() {
        let log = StoreErrorLog::default();
        // 793 failures over 6 s, as in the outage that prompted this: one line.
        let logged: Vec<u64> = (0..793).filter_map(|i| log.due(i * 6_000 / 793)).collect();
        assert_eq!(logged, [0]);
        // The next interval's first failure says how many were left out.
        assert_eq!(log.due(10_000), Some(792));
        assert_eq!(log.due(10_001), None);
        assert_eq!(log.due(20_000), Some(1));
    }
}
