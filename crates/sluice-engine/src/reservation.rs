//! Shaping: the tokens a held request has reserved, and [`Reservation`],
//! which gives them back when the request is abandoned before it is due.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};
use sluice_core::{Limit, Settle, Store, StoreError};
use tokio::time::Instant;

use crate::give_back::{Giver, Taken};

/// How much earlier than its due time a held request's timer is set.
/// Tokio's timer counts whole milliseconds: it rounds a deadline up to the
/// next one, and its driver sleeps a fraction of a millisecond past that,
/// so a timer set for the due time fired 1.3 ms late on average (0.7 to
/// 3.6 ms, in `crates/sluice/tests/shaping_nginx.rs` on a 2-CPU machine),
/// where nginx forwards within a millisecond. Set a millisecond early it
/// fires 0.6 ms late on average, and now and then up to a millisecond
/// early. Under a paused clock it is exact. Every held request of a key
/// shifts alike, so the spacing the upstream sees is the limit's; the
/// tokens were reserved at the decision either way.
const TIMER_SLACK: Duration = Duration::from_millis(1);

/// The tokens one limit's part of a held request reserved: what to give
/// back if the request never goes on.
#[derive(Debug, Clone)]
pub struct Reserved {
    /// The limit (a rule's, or a named one).
    pub limit: Limit,
    /// The key under that limit.
    pub key: String,
    /// The tokens reserved.
    pub cost: f64,
}

impl PartialEq for Reserved {
    fn eq(&self, other: &Self) -> bool {
        self.limit.name() == other.limit.name() && self.key == other.key && self.cost == other.cost
    }
}

impl Taken for Reserved {
    fn limit(&self) -> &Limit {
        &self.limit
    }

    async fn give_back<S: Store>(&self, store: &S) -> Result<(), StoreError> {
        let refund = Settle::Refund(self.cost);
        store.settle(&self.limit, &self.key, refund).await.map(drop)
    }
}

/// Refunds reservations in the background (see
/// [`giver`](crate::give_back::giver)): a failed refund is counted, and the
/// tokens then stay spent.
pub(crate) type Refunder = Giver<Reserved>;

/// The held requests of one enforcer: how many are held now, how long
/// they were told to wait, and how many were abandoned.
#[derive(Default)]
pub(crate) struct HeldMeter {
    now: AtomicU64,
    gauge: OnceLock<Gauge>,
    waits: OnceLock<Histogram>,
    abandoned: OnceLock<Counter>,
}

impl HeldMeter {
    /// Requests held now.
    pub(crate) fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    fn gauge(&self) -> &Gauge {
        self.gauge
            .get_or_init(|| metrics::gauge!("sluice_held_requests"))
    }

    fn hold(&self, wait: Duration) {
        self.now.fetch_add(1, Ordering::Relaxed);
        self.gauge().increment(1.0);
        self.waits
            .get_or_init(|| metrics::histogram!("sluice_held_wait_seconds"))
            .record(wait.as_secs_f64());
    }

    fn let_go(&self, abandoned: bool) {
        self.now.fetch_sub(1, Ordering::Relaxed);
        self.gauge().decrement(1.0);
        if abandoned {
            self.abandoned
                .get_or_init(|| metrics::counter!("sluice_held_abandoned_total"))
                .increment(1);
        }
    }
}

/// A request or call held until its reservation is due. Dropping it before
/// it is [kept](Reservation::keep) gives the reserved tokens back (a
/// refund, a store call of its own made on the Tokio runtime the drop
/// happens on): a client that went away while held leaves the key as if
/// it had never asked. While one exists it counts in
/// `sluice_held_requests` and in [`Activity::held`](crate::Activity::held).
///
/// ```
/// use std::time::Duration;
/// use sluice_core::MemoryStore;
/// use sluice_engine::Enforcer;
/// use sluice_policy::{Policy, RequestParts};
/// let policy = Policy::from_str("rules: [{name: r, limit_keys: [ip:address], algorithm: token_bucket, \
///     algorithm_config: {rps: 10, burst: 1, max_reserved: 5}, on_limit: {delay: {max: 1s}}}]", "p").unwrap();
/// let e = Enforcer::new(policy, MemoryStore::new());
/// let req = RequestParts::new("GET", "/").with_ip([192, 0, 2, 1].into());
/// let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
/// assert_eq!(rt.block_on(e.enforce_shaped(&req)).delay, None);
/// let mut second = rt.block_on(e.enforce_shaped(&req));
/// assert!(second.allowed && second.delay.is_some_and(|d| d <= Duration::from_millis(100)));
/// let held = e.reservation(&mut second);
/// assert_eq!(e.activity().held, 1);
/// rt.block_on(held.until_due());
/// assert_eq!(e.activity().held, 0);
/// ```
#[must_use = "the reservation is given back as soon as this is dropped"]
pub struct Reservation {
    parts: Vec<Reserved>,
    due: Instant,
    by: Option<(Refunder, Arc<HeldMeter>)>,
}

impl Reservation {
    /// Holds nothing, and is due now.
    pub fn none() -> Reservation {
        Reservation {
            parts: Vec::new(),
            due: Instant::now(),
            by: None,
        }
    }

    /// Holds `parts` until `wait` from now, refunded by `by` when dropped.
    pub(crate) fn new(
        parts: Vec<Reserved>,
        wait: Duration,
        by: &Refunder,
        meter: &Arc<HeldMeter>,
    ) -> Reservation {
        meter.hold(wait);
        Reservation {
            parts,
            due: Instant::now() + wait,
            by: Some((Arc::clone(by), Arc::clone(meter))),
        }
    }

    /// When the request may go on.
    pub fn due(&self) -> Instant {
        self.due
    }

    /// The tokens held.
    pub fn parts(&self) -> &[Reserved] {
        &self.parts
    }

    /// Waits until the reservation is due, to within the timer's
    /// millisecond, then keeps it: the tokens are spent, and the request
    /// may go on. Dropping this future before then gives them back.
    pub async fn until_due(self) {
        if let Some(early) = self.due.checked_sub(TIMER_SLACK) {
            tokio::time::sleep_until(early).await;
        }
        // A timer fires past its deadline on a running clock, so less than
        // the slack is left; a paused clock (tests) stops on it exactly,
        // and the rest is waited exactly too.
        if self.due.saturating_duration_since(Instant::now()) >= TIMER_SLACK {
            tokio::time::sleep_until(self.due).await;
        }
        self.keep();
    }

    /// Keeps the reserved tokens spent: the request went on.
    pub fn keep(mut self) {
        if let Some((_, meter)) = self.by.take() {
            meter.let_go(false);
        }
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("parts", &self.parts)
            .field("due", &self.due)
            .finish()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some((by, meter)) = self.by.take() {
            meter.let_go(true);
            by(std::mem::take(&mut self.parts));
        }
    }
}
