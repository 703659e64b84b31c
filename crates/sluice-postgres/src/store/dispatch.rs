//! Calls queued and decided in batches: one database transaction locks the
//! rows of every call in a batch, and one commit writes them back.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sluice_core::states::States;
use sluice_core::{Nanos, StoreError};
use sqlx::Connection as _;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::rows::Row;
use super::stats::bump;
use super::{PostgresStore, Shared, unavailable};

/// How a batch's transaction begins.
pub(super) const READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// The most calls queued for a batch, per store: a caller beyond it waits,
/// within its deadline, for room.
pub(super) const MAX_QUEUED: usize = 4_096;

/// A call waiting for a batch, whatever it decides and answers: one queue
/// carries every kind of call.
pub(super) trait Queued: Send {
    /// The rows the call may use.
    fn rows(&self) -> &[Row];
    /// When its caller stops waiting.
    fn deadline(&self) -> Instant;
    /// Whether its caller has stopped waiting already.
    fn is_abandoned(&self) -> bool;
    /// Decides the call on `states`, keeping the answer until the batch
    /// commits.
    fn decide(&mut self, states: &mut States<Row>, now: Nanos);
    /// Sends the answer, or `failed` when the batch did not commit.
    fn answer(self: Box<Self>, failed: Option<&StoreError>);
}

struct Job<R, F> {
    rows: Vec<Row>,
    deadline: Instant,
    decide: Option<F>,
    decided: Option<R>,
    reply: oneshot::Sender<Result<R, StoreError>>,
}

impl<R, F> Queued for Job<R, F>
where
    R: Send,
    F: FnOnce(&mut States<Row>, Nanos) -> R + Send,
{
    fn rows(&self) -> &[Row] {
        &self.rows
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }

    fn is_abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    fn decide(&mut self, states: &mut States<Row>, now: Nanos) {
        if let Some(decide) = self.decide.take() {
            self.decided = Some(decide(states, now));
        }
    }

    fn answer(self: Box<Self>, failed: Option<&StoreError>) {
        let answer = match (failed, self.decided) {
            (None, Some(decided)) => Ok(decided),
            (Some(e), _) => Err(e.clone()),
            (None, None) => Err(StoreError::Unavailable("the call was not decided".into())),
        };
        // A caller that stopped waiting has its answer from its deadline.
        let _ = self.reply.send(answer);
    }
}

/// Collects queued calls into batches. A batch leaves as soon as one of
/// the [`PostgresConfig::max_in_flight`] slots is free, so under load the
/// queue fills while batches are in flight and batches grow by themselves;
/// when idle, a call leaves alone at once.
///
/// [`PostgresConfig::max_in_flight`]: crate::PostgresConfig::max_in_flight
pub(super) async fn dispatch(shared: Arc<Shared>, mut calls: mpsc::Receiver<Box<dyn Queued>>) {
    let in_flight = shared.config.max_in_flight();
    let max = shared.config.max_batch();
    let slots = Arc::new(Semaphore::new(in_flight));
    while let Some(first) = calls.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        if slots.available_permits() + 1 < in_flight {
            // Another batch is in flight, so the database is busy: let the
            // callers that are ready to run queue their calls first.
            tokio::task::yield_now().await;
        }
        let mut batch = Vec::with_capacity(max.min(calls.len() + 1));
        let mut next = Some(first);
        while let Some(job) = next.take() {
            if !job.is_abandoned() {
                batch.push(job);
            }
            if batch.len() < max {
                next = calls.try_recv().ok();
            }
        }
        if batch.is_empty() {
            continue;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            shared.batch(batch).await;
            drop(slot);
        });
    }
}

impl PostgresStore {
    /// Queues a call that `decide` decides on the rows `keys`, and waits,
    /// within the deadline, for the batch it joins to commit.
    pub(super) async fn run<R, F>(&self, keys: Vec<Row>, decide: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut States<Row>, Nanos) -> R + Send + 'static,
    {
        let deadline = Instant::now() + self.shared.config.timeout();
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Job {
            rows: keys,
            deadline,
            decide: Some(decide),
            decided: None,
            reply,
        });
        let wait = async {
            self.queue
                .send(job)
                .await
                .map_err(|_| StoreError::Unavailable("the store has stopped".into()))?;
            answer
                .await
                .unwrap_or_else(|_| Err(StoreError::Unavailable("the store has stopped".into())))
        };
        // A caller that gives up (its deadline, or its client gone) drops
        // its end of the reply; a batch not yet made leaves it out.
        tokio::time::timeout_at(deadline, wait)
            .await
            .unwrap_or(Err(StoreError::Timeout))
    }
}

impl Shared {
    /// Decides `jobs` as one database transaction, in the order they came,
    /// and answers each: with its decision once the transaction commits, or
    /// with why it failed. It gives up at the latest of the jobs' deadlines,
    /// when nobody waits for it any more.
    async fn batch(&self, mut jobs: Vec<Box<dyn Queued>>) {
        let mut rows: Vec<Row> = jobs.iter().flat_map(|j| j.rows().iter().cloned()).collect();
        rows.sort_unstable();
        rows.dedup();
        let Some(deadline) = jobs.iter().map(|j| j.deadline()).max() else {
            return;
        };
        let work = async {
            if self.refused.load(Ordering::Relaxed) {
                return Err(StoreError::Unavailable(
                    "the database refuses connections".into(),
                ));
            }
            self.migrate().await.map_err(unavailable)?;
            let asked = Instant::now();
            let mut conn = self.pool.acquire().await.map_err(unavailable)?;
            bump(&self.counters.pool_acquires, 1);
            let waited = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
            bump(&self.counters.pool_wait_micros, waited);
            // READ COMMITTED whatever the role's default: each statement
            // must see what the batch before it committed once its locks
            // are held, not a snapshot taken while it waited for them.
            let mut tx = conn.begin_with(READ_COMMITTED).await.map_err(unavailable)?;
            self.decide_in(&mut tx, &rows, |states, now| {
                for job in &mut jobs {
                    // A caller that gave up since the batch left is not
                    // charged for a call it was told failed.
                    if !job.is_abandoned() {
                        job.decide(states, now);
                    }
                }
            })
            .await
            .map_err(|e| {
                self.noticed(&e);
                unavailable(e)
            })?;
            tx.commit().await.map_err(unavailable)
        };
        let result = tokio::time::timeout_at(deadline, work)
            .await
            .unwrap_or(Err(StoreError::Timeout));
        match &result {
            Ok(()) => {
                bump(&self.counters.batches, 1);
                bump(&self.counters.decided, jobs.len() as u64);
                self.answered();
            }
            Err(StoreError::Timeout) => bump(&self.counters.timeouts, 1),
            Err(_) => bump(&self.counters.errors, 1),
        }
        for job in jobs {
            job.answer(result.as_ref().err());
        }
        if result.is_err() {
            // Whether the database is down, slow or only busy with this
            // batch's keys is the ping's to say: readiness follows pings.
            self.suspect.notify_one();
        }
    }
}
