//! Calls queued while the database is busy are decided together, in one
//! transaction, in the order they came, and exactly: a call that cannot be
//! decided fails alone, and a caller that gave up spends nothing.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use sluice_core::{Limit, Mode, Nanos, Op, SlidingLog, Store, StoreError, TokenBucket};
use sluice_postgres::{PostgresConfig, PostgresStore};
use sqlx::{Connection, PgConnection};
use support::PostgresServer;

/// Polls `ready` until it holds, for at most a minute.
async fn until(what: &str, mut ready: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A connection whose open transaction holds the store's table: every
/// batch waits for it until it commits.
async fn hold_the_table(server: &PostgresServer) -> PgConnection {
    let mut conn = PgConnection::connect(&server.url()).await.unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE sluice.keys IN EXCLUSIVE MODE")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_queued_behind_a_busy_batch_are_decided_together_and_exactly() {
    let server = PostgresServer::start();
    // One batch in flight at a time, so that the calls made while it
    // waits queue for the next.
    let config = PostgresConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .with_batching(256, 1);
    let store = PostgresStore::new(config).unwrap();
    // A token an hour, a burst of 20: nothing refills while the test runs.
    let limit = Limit::new(
        "batched",
        TokenBucket::per_period(1.0, Nanos(3_600 * Nanos::PER_SEC))
            .unwrap()
            .with_capacity(20.0)
            .unwrap(),
    );
    let other_kind = Limit::new(
        "batched",
        SlidingLog::per_period(5.0, Nanos(Nanos::PER_SEC)).unwrap(),
    );
    // The first call makes the tables.
    let warm = Limit::new("warm", TokenBucket::new(1.0, 1.0).unwrap());
    store
        .decide(Op::new(&warm, "k", 1.0), Mode::CONSUME)
        .await
        .unwrap();
    let before = store.stats();

    // Another transaction holds the table, so the next batch waits for it.
    let mut lock = hold_the_table(&server).await;
    let spend = |store: &PostgresStore| {
        let (store, limit) = (store.clone(), limit.clone());
        tokio::spawn(async move {
            store
                .decide(Op::new(&limit, "k", 1.0), Mode::CONSUME)
                .await
                .unwrap()
                .allowed
        })
    };
    let first = spend(&store);
    let mut probe = PgConnection::connect(&server.url()).await.unwrap();
    until("the first batch waits for the table", async || {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = 'sluice' AND wait_event_type = 'Lock' \
             AND query LIKE 'WITH found%'",
        )
        .fetch_one(&mut probe)
        .await
        .unwrap();
        waiting == 1
    })
    .await;

    let abandoned = spend(&store);
    let calls: Vec<_> = (0..15).map(|_| spend(&store)).collect();
    let bad = {
        let (store, a, b) = (store.clone(), limit.clone(), other_kind.clone());
        tokio::spawn(async move {
            let ops = [Op::new(&a, "k", 1.0), Op::new(&b, "k", 1.0)];
            store.transact(&ops, Mode::CONSUME).await
        })
    };
    // All 17 wait: 16 in the queue, one held by the dispatcher for a free
    // batch slot.
    until("the calls queue", async || store.stats().queued == 16).await;
    abandoned.abort();
    // Dropped, and its end of the reply with it, before the batch leaves.
    assert!(abandoned.await.unwrap_err().is_cancelled());
    sqlx::raw_sql("COMMIT").execute(&mut lock).await.unwrap();

    assert!(first.await.unwrap(), "the first call was admitted");
    for call in calls {
        assert!(call.await.unwrap(), "16 of a burst of 20 are admitted");
    }
    let refused = bad.await.unwrap();
    assert!(
        matches!(refused, Err(StoreError::Unavailable(ref why)) if why.contains("batched")),
        "{refused:?}"
    );
    let after = store.stats();
    assert_eq!(after.batches - before.batches, 2, "{after:?}");
    // The first, the 15 and the bad one; the abandoned call was left out.
    assert_eq!(after.decided - before.decided, 17, "{after:?}");
    let left = store.value(&limit, "k").await.unwrap().tokens;
    assert!((4.0..4.1).contains(&left), "{left} tokens left: 4 of 20");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_4096_calls_wait_and_a_batch_decides_at_most_256() {
    let server = PostgresServer::start();
    let config = PostgresConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(Duration::from_secs(60))
        .with_batching(256, 1);
    let store = PostgresStore::new(config).unwrap();
    let limit = Limit::new("flood", TokenBucket::new(1.0, 10_000.0).unwrap());
    store
        .decide(Op::new(&limit, "warm", 1.0), Mode::CONSUME)
        .await
        .unwrap();
    let before = store.stats();
    let mut lock = hold_the_table(&server).await;
    let calls: Vec<_> = (0..4_200)
        .map(|i| {
            let (store, limit) = (store.clone(), limit.clone());
            tokio::spawn(async move {
                let key = format!("k{}", i % 50);
                store
                    .decide(Op::new(&limit, &key, 1.0), Mode::CONSUME)
                    .await
            })
        })
        .collect();
    // One batch waits for the table, the dispatcher holds the next call,
    // 4,096 wait in the queue, and the rest wait for room in it.
    until("the queue fills", async || store.stats().queued == 4_096).await;
    sqlx::raw_sql("COMMIT").execute(&mut lock).await.unwrap();
    for call in calls {
        assert!(call.await.unwrap().unwrap().allowed);
    }
    let after = store.stats();
    assert_eq!(after.queued, 0);
    let (decided, batches) = (
        after.decided - before.decided,
        after.batches - before.batches,
    );
    assert_eq!(decided, 4_200);
    assert!(
        batches >= 4_200u64.div_ceil(256),
        "{decided} calls in {batches} batches: more than 256 a batch"
    );
}
