//! The dispatcher: transactions that callers queue leave for Redis in
//! batches, one script call per batch (per hash slot on a Cluster), and
//! each caller is answered by its own deadline.

use std::collections::HashMap;
use std::sync::Arc;

use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use sluice_core::{Algorithm, StoreError};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::Shared;
use super::connection::{Resend, send};
use super::stats::bump;
use crate::script::{self, Txn, TxnReply};

/// Where a transaction's answer goes: it hands the transaction back with
/// Redis's answer, so the caller needn't keep a copy.
type Reply = oneshot::Sender<Result<(Txn, TxnReply), StoreError>>;

/// A queued transaction.
pub(super) struct Job {
    pub(super) txn: Txn,
    pub(super) reply: Reply,
    /// When the caller's time is up. The dispatcher enforces it, with one
    /// timer per script call rather than one per decision.
    pub(super) deadline: Instant,
}

/// Collects queued transactions into batches. A batch leaves as soon as a
/// call slot is free, so under load the queue fills while calls are in
/// flight and batches grow by themselves; when idle, a call leaves alone.
pub(super) async fn dispatch(shared: Arc<Shared>, mut rx: mpsc::Receiver<Job>, in_flight: usize) {
    let slots = Arc::new(Semaphore::new(in_flight));
    let max = shared.config.max_batch();
    let mut held = None;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        if slots.available_permits() + 1 < in_flight {
            // Another call is in flight, so Redis is busy: let the callers
            // that are ready to run queue their transactions first, and
            // send them together. Fewer, larger calls cost Redis and this
            // process less per decision; when idle, a call leaves at once.
            tokio::task::yield_now().await;
        }
        let (batch, next) = take_batch(first, &mut rx, max, Instant::now(), || shared.timed_out());
        held = next;
        if batch.is_empty() {
            continue;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            if shared.config.is_cluster() {
                let mut by_slot: HashMap<u16, Vec<Job>> = HashMap::new();
                for job in batch {
                    match job.txn.slot() {
                        Some(slot) => by_slot.entry(slot).or_default().push(job),
                        None => {
                            let _ = job.reply.send(Err(StoreError::Unavailable(
                                "a transaction over keys in different Cluster slots is not \
                                 atomic; use one key per transaction"
                                    .into(),
                            )));
                        }
                    }
                }
                let mut calls = tokio::task::JoinSet::new();
                for (_, jobs) in by_slot {
                    calls.spawn(call(shared.clone(), jobs));
                }
                while calls.join_next().await.is_some() {}
            } else {
                call(shared, batch).await;
            }
            drop(permit);
        });
    }
}

/// `first` and what else is queued, up to `max` transactions, as one
/// batch, leaving out (and answering) those whose time is up. A transaction
/// that uses a key an earlier one of the batch uses under another kind of
/// state (a limit changed kind, and a call under each handle is in flight)
/// is held back for the next batch, which it returns: in one script call
/// each kind would rebuild the key from what it held before the call, and
/// the second would not see what the first spent.
fn take_batch(
    first: Job,
    rx: &mut mpsc::Receiver<Job>,
    max: usize,
    now: Instant,
    timed_out: impl Fn() -> StoreError,
) -> (Vec<Job>, Option<Job>) {
    let mut batch: Vec<Job> = Vec::with_capacity(max.min(rx.len() + 1));
    // Keys by their hashes: two keys that share one only split a batch
    // that need not have been.
    let hasher = std::hash::RandomState::new();
    let hash = |k: &str| std::hash::BuildHasher::hash_one(&hasher, k);
    let mut kinds: HashMap<u64, Algorithm> = HashMap::new();
    let mut job = Some(first);
    while let Some(j) = job.take() {
        if j.deadline <= now {
            let _ = j.reply.send(Err(timed_out()));
        } else {
            let clash = j.txn.keys().any(|(k, alg)| {
                kinds
                    .get(&hash(k))
                    .is_some_and(|a| !a.keeps_states_like(alg))
            });
            if clash {
                return (batch, Some(j));
            }
            for (k, alg) in j.txn.keys() {
                kinds.entry(hash(k)).or_insert(*alg);
            }
            batch.push(j);
        }
        if batch.len() < max {
            job = rx.try_recv().ok();
        }
    }
    (batch, None)
}

/// Runs the script, loading it first if Redis does not have it (a restart,
/// `SCRIPT FLUSH`, a new Cluster node).
async fn eval(shared: &Shared, cmd: &Cmd) -> Result<Value, RedisError> {
    let mut conn = shared.conn.clone();
    match send(&mut conn, cmd, Resend::IfUnsent).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script::script().load_async(&mut conn).await?;
            send(&mut conn, cmd, Resend::IfUnsent).await
        }
        r => r,
    }
}

/// One script call for `jobs`, answering each by its own deadline: a job
/// whose time is up fails alone, and the call goes on for the others, so a
/// backlog of old jobs never cuts short the time of fresh ones.
async fn call(shared: Arc<Shared>, jobs: Vec<Job>) {
    let now = shared.client_time.then(|| shared.clock.now());
    let cmd = script::invocation(
        jobs.iter().map(|j| &j.txn),
        shared.unit,
        now,
        now.unwrap_or_else(|| shared.clock.now()),
        shared.min_ttl_ms(),
    );
    // The transactions stay to read the reply by; the callers still
    // waiting for it are those whose deadline has not passed.
    let (txns, mut waiting): (Vec<Txn>, Vec<Option<(Reply, Instant)>>) = jobs
        .into_iter()
        .map(|j| (j.txn, Some((j.reply, j.deadline))))
        .unzip();
    bump(&shared.counters.script_calls);
    let result = {
        let mut reply = std::pin::pin!(eval(&shared, &cmd));
        loop {
            let Some(deadline) = waiting.iter().flatten().map(|w| w.1).min() else {
                // Every caller has been answered: nobody waits for the reply.
                return;
            };
            tokio::select! {
                biased;
                r = &mut reply => break r.map_err(|e| shared.classify(&e)),
                () = tokio::time::sleep_until(deadline) => {
                    let now = Instant::now();
                    for slot in &mut waiting {
                        if let Some((tx, _)) = slot.take_if(|w| w.1 <= now) {
                            let _ = tx.send(Err(shared.timed_out()));
                        }
                    }
                }
            }
        }
    };
    drop(cmd);
    let replies = result.and_then(|v| {
        shared.replied();
        let mut replies = script::parse_reply(v, shared.unit)?;
        // Every reply is read before any is sent, so a malformed one fails
        // the whole batch rather than answering part of it.
        let parsed = txns
            .iter()
            .map(|txn| replies.next_txn(txn))
            .collect::<Result<Vec<TxnReply>, StoreError>>()?;
        if replies.finished() {
            Ok(parsed)
        } else {
            Err(StoreError::Unavailable(
                "unexpected reply from the Redis script: too long".into(),
            ))
        }
    });
    match replies {
        Ok(parsed) => {
            for ((txn, waiter), reply) in txns.into_iter().zip(waiting).zip(parsed) {
                if let Some((tx, _)) = waiter {
                    let _ = tx.send(Ok((txn, reply)));
                }
            }
        }
        Err(e) => {
            for (tx, _) in waiting.into_iter().flatten() {
                let _ = tx.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::script::TimeUnit;
    use sluice_core::{Limit, Mode, Nanos, Op, SlidingLog, TokenBucket};
    use std::time::Duration;

    fn job(limit: &Limit, key: &str) -> Job {
        let ops = [Op::new(limit, key, 1.0)];
        let (reply, _) = oneshot::channel();
        Job {
            txn: Txn::encode("p:", &ops, Mode::CONSUME, TimeUnit::ClientNanos).unwrap(),
            reply,
            deadline: Instant::now() + Duration::from_secs(60),
        }
    }

    /// A limit that changed kind, with a call under each handle queued at
    /// once: the second would rebuild the key from what it held before the
    /// script call and not see what the first spent (a sliding log of one
    /// an hour and a token bucket of one an hour both admitted, 50 times in
    /// 50, when they shared a call).
    #[tokio::test]
    async fn a_key_under_two_kinds_of_state_never_shares_a_script_call() {
        let hour = Nanos(3_600 * Nanos::PER_SEC);
        let log = Limit::new("chat", SlidingLog::per_period(1.0, hour).unwrap());
        let bucket = Limit::new("chat", TokenBucket::per_period(1.0, hour).unwrap());
        let (tx, mut rx) = mpsc::channel(16);
        for j in [
            job(&bucket, "other"),
            job(&bucket, "k"),
            job(&log, "other2"),
        ] {
            tx.send(j).await.unwrap();
        }
        let queued = job(&log, "k");
        tx.send(queued).await.unwrap();
        let now = Instant::now();
        let first = job(&log, "k");
        let (batch, held) = take_batch(first, &mut rx, 256, now, || StoreError::Timeout);
        // The log on k, then the bucket on another key; the bucket on k waits.
        assert_eq!(batch.len(), 2);
        let held = held.expect("the bucket on k is held back");
        assert!(held.txn.keys().all(|(k, _)| k.contains("{k}")));
        // The next batch starts with it, and takes the log on another key;
        // the log on k, queued behind, clashes with the bucket on k.
        let (batch, held) = take_batch(held, &mut rx, 256, now, || StoreError::Timeout);
        assert_eq!(batch.len(), 2);
        let (batch, rest) = take_batch(held.unwrap(), &mut rx, 256, now, || StoreError::Timeout);
        assert_eq!((batch.len(), rest.is_none()), (1, true));
        // One kind on one key, or a token bucket beside a fixed window,
        // shares a call as before.
        let (tx, mut rx) = mpsc::channel(16);
        tx.send(job(&log, "k")).await.unwrap();
        let (batch, held) = take_batch(job(&log, "k"), &mut rx, 256, now, || StoreError::Timeout);
        assert_eq!((batch.len(), held.is_none()), (2, true));
    }
}
