//! Deciding inside the caller's own transaction, on a real PostgreSQL:
//! rolled back, nothing was spent; committed, it was; two transactions on
//! one key take turns; under SERIALIZABLE a conflict is an error to retry,
//! never a decision made on what a key held before. And what the store
//! keeps: rows that hold nothing are dropped, bytes it cannot read are
//! taken as full as they may be, and servers on one database share one
//! exact limit on the database's clock.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::{Clock, FakeClock, Limit, Mode, Nanos, Op, SlidingLog, Store, TokenBucket};
use sluice_postgres::{PostgresConfig, PostgresStore};
use sqlx::{Connection, PgConnection};
use support::PostgresServer;

fn config(server: &PostgresServer) -> PostgresConfig {
    PostgresConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(Duration::from_secs(5))
}

async fn connect(server: &PostgresServer) -> PgConnection {
    PgConnection::connect(&server.url()).await.unwrap()
}

/// Decides `cost` on `key` of `limit` inside `tx`: whether it was admitted.
async fn spend_in(
    store: &PostgresStore,
    tx: &mut PgConnection,
    limit: &Limit,
    key: &str,
    cost: f64,
) -> bool {
    store
        .transact_in(tx, &[Op::new(limit, key, cost)], Mode::CONSUME)
        .await
        .unwrap()
        .allowed
}

fn bucket(name: &str, burst: f64) -> Limit {
    // A token an hour: nothing refills while a test runs.
    Limit::new(
        name,
        TokenBucket::per_period(1.0, Nanos(3_600 * Nanos::PER_SEC))
            .unwrap()
            .with_capacity(burst)
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_spends_nothing_and_a_committed_one_spends() {
    let server = PostgresServer::start();
    let store = PostgresStore::new(config(&server)).unwrap();
    let limit = bucket("send", 3.0);
    let mut conn = connect(&server).await;

    let mut tx = conn.begin().await.unwrap();
    assert!(spend_in(&store, &mut tx, &limit, "alice", 2.0).await);
    tx.rollback().await.unwrap();
    assert_eq!(store.value(&limit, "alice").await.unwrap().tokens, 3.0);

    let mut tx = conn.begin().await.unwrap();
    assert!(spend_in(&store, &mut tx, &limit, "alice", 2.0).await);
    tx.commit().await.unwrap();
    let left = store.value(&limit, "alice").await.unwrap().tokens;
    assert!((1.0..1.01).contains(&left), "{left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_transactions_on_one_key_take_turns_and_the_second_sees_what_the_first_spent() {
    let server = PostgresServer::start();
    let store = Arc::new(PostgresStore::new(config(&server)).unwrap());
    let limit = bucket("login", 1.0);
    let mut first = connect(&server).await;
    let mut tx = first.begin().await.unwrap();
    assert!(spend_in(&store, &mut tx, &limit, "bob", 1.0).await);
    // The second waits for the first's lock; it must not decide on the
    // token the first has taken but not yet committed.
    let (second_store, second_limit) = (Arc::clone(&store), limit.clone());
    let url = server.url();
    let second = tokio::spawn(async move {
        let mut conn = PgConnection::connect(&url).await.unwrap();
        let mut tx = conn.begin().await.unwrap();
        let out = second_store
            .transact_in(
                &mut tx,
                &[Op::new(&second_limit, "bob", 1.0)],
                Mode::CONSUME,
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
        out.allowed
    });
    // The second is blocked on the lock the first holds: it has not
    // answered while the first is open.
    let mut probe = connect(&server).await;
    let waiting = async {
        loop {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
            )
            .fetch_one(&mut probe)
            .await
            .unwrap();
            if n > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the second transaction waits for the first's lock");
    assert!(!second.is_finished());
    tx.commit().await.unwrap();
    assert!(
        !second.await.unwrap(),
        "the second was admitted after the first spent the token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_serializable_a_key_changed_since_the_transaction_began_is_an_error_to_retry() {
    let server = PostgresServer::start();
    let store = PostgresStore::new(config(&server)).unwrap();
    let limit = bucket("pay", 5.0);
    // The key is spent before the caller's transaction begins.
    assert!(
        store
            .decide(Op::new(&limit, "carol", 5.0), Mode::CONSUME)
            .await
            .unwrap()
            .allowed
    );
    let mut conn = connect(&server).await;
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        .execute(&mut *tx)
        .await
        .unwrap();
    // The transaction's snapshot is taken by its first query.
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    // Another server gives 3 back after the snapshot. Read from the
    // snapshot, the key would be empty and the call denied, with nothing
    // written that could conflict: a wrong decision, silently.
    let refund = sluice_core::Settle::Refund(3.0);
    store.settle(&limit, "carol", refund).await.unwrap();
    let err = store
        .transact_in(&mut tx, &[Op::new(&limit, "carol", 1.0)], Mode::CONSUME)
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    tx.rollback().await.unwrap();
    // The retry decides on what the key holds now.
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(spend_in(&store, &mut tx, &limit, "carol", 3.0).await);
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_that_hold_nothing_are_dropped_and_unreadable_bytes_are_as_full_as_they_may_be() {
    let server = PostgresServer::start();
    let clock = FakeClock::new(Nanos(1_000 * Nanos::PER_SEC));
    let store = PostgresStore::with_clock(config(&server), clock.clone()).unwrap();
    let limit = Limit::new("api", TokenBucket::new(1.0, 2.0).unwrap());
    let mut probe = connect(&server).await;
    let rows = async |probe: &mut PgConnection| -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM sluice.keys")
            .fetch_one(probe)
            .await
            .unwrap()
    };
    // A call that leaves a bucket full writes no row; one that does not, does.
    assert!(
        store
            .decide(Op::new(&limit, "a", 0.0), Mode::CONSUME)
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(rows(&mut probe).await, 0);
    assert!(
        store
            .decide(Op::new(&limit, "a", 1.0), Mode::CONSUME)
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(rows(&mut probe).await, 1);
    // Full again a second later; the sweep, which looks a second behind
    // the clock, drops it a second after that, and nothing changes.
    clock.advance(Duration::from_secs(1));
    assert_eq!(store.sweep().await.unwrap(), 0);
    clock.advance(Duration::from_secs(1));
    assert_eq!(store.sweep().await.unwrap(), 1);
    assert_eq!(rows(&mut probe).await, 0);
    assert_eq!(store.value(&limit, "a").await.unwrap().tokens, 2.0);

    // Bytes this release cannot read, empty in 10 s: the key is taken to
    // be as empty as any bucket full by then, and then full.
    sqlx::query("INSERT INTO sluice.keys VALUES ('api', 'b', 0, '\\xdeadbeef', $1)")
        .bind(clock.now().0 + 10 * Nanos::PER_SEC)
        .execute(&mut probe)
        .await
        .unwrap();
    assert!(
        !store
            .decide(Op::new(&limit, "b", 1.0), Mode::CONSUME)
            .await
            .unwrap()
            .allowed
    );
    clock.advance(Duration::from_secs(10));
    assert!(
        store
            .decide(Op::new(&limit, "b", 2.0), Mode::CONSUME)
            .await
            .unwrap()
            .allowed
    );
}

/// What each of several stores, with pools of their own, saw of the calls
/// they made on one key: sent, answered, admitted.
async fn hammer(
    stores: &[Arc<PostgresStore>],
    limit: &Limit,
    until: Instant,
) -> Vec<(Instant, Instant, bool)> {
    let mut callers = Vec::new();
    for store in stores {
        for _ in 0..4 {
            let (store, limit) = (Arc::clone(store), limit.clone());
            callers.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                while Instant::now() < until {
                    let sent = Instant::now();
                    let d = store
                        .decide(Op::new(&limit, "hot", 1.0), Mode::CONSUME)
                        .await
                        .unwrap();
                    seen.push((sent, Instant::now(), d.allowed));
                }
                seen
            }));
        }
    }
    let mut all = Vec::new();
    for c in callers {
        all.extend(c.await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_stores_on_one_database_never_admit_more_than_the_bound() {
    let server = PostgresServer::start();
    let stores: Vec<Arc<PostgresStore>> = (0..4)
        .map(|_| Arc::new(PostgresStore::new(config(&server)).unwrap()))
        .collect();
    // 50 a second, a burst of 20; a sliding log of 100 a second.
    let bucket = Limit::new("hot-bucket", TokenBucket::new(50.0, 20.0).unwrap());
    let log = Limit::new(
        "hot-log",
        SlidingLog::per_period(100.0, Nanos(Nanos::PER_SEC)).unwrap(),
    );
    let started = Instant::now();
    let seen = hammer(&stores, &bucket, started + Duration::from_secs(2)).await;
    // Every admission was decided between the first call's sending and the
    // last answer: the bucket can have admitted at most its burst and its
    // rate over that span, whatever the latencies.
    let span = seen.iter().map(|s| s.1).max().unwrap() - started;
    let admitted = seen.iter().filter(|s| s.2).count() as f64;
    assert!(
        admitted <= 20.0 + 50.0 * span.as_secs_f64(),
        "{admitted} in {span:?}"
    );
    assert!(admitted >= 20.0, "{admitted}: not even the burst");

    let started = Instant::now();
    let seen = hammer(&stores, &log, started + Duration::from_secs(2)).await;
    // In any group of admissions sent within one second of the first and
    // answered before a second after it, there can be at most 100.
    let mut admitted: Vec<&(Instant, Instant, bool)> = seen.iter().filter(|s| s.2).collect();
    admitted.sort_by_key(|s| s.0);
    for (i, first) in admitted.iter().enumerate() {
        let within = admitted[i..]
            .iter()
            .take_while(|s| s.0 < first.0 + Duration::from_secs(1))
            .filter(|s| s.1 < first.0 + Duration::from_secs(1))
            .count();
        assert!(within <= 100, "{within} admitted within one second");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_that_went_missing_are_made_again_by_the_call_after_the_one_that_found_them_gone() {
    let server = PostgresServer::start();
    let store = PostgresStore::new(config(&server)).unwrap();
    let limit = bucket("gone", 2.0);
    assert!(
        store
            .decide(Op::new(&limit, "k", 1.0), Mode::CONSUME)
            .await
            .unwrap()
            .allowed
    );
    // A database restored from a backup older than the tables.
    let mut probe = connect(&server).await;
    sqlx::query("DROP SCHEMA sluice CASCADE")
        .execute(&mut probe)
        .await
        .unwrap();
    assert!(
        store
            .decide(Op::new(&limit, "k", 1.0), Mode::CONSUME)
            .await
            .is_err()
    );
    let d = store
        .decide(Op::new(&limit, "k", 1.0), Mode::CONSUME)
        .await
        .unwrap();
    assert!(d.allowed && d.remaining == 1, "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_inside_a_transaction_forgets_the_key_only_if_it_commits() {
    let server = PostgresServer::start();
    let store = PostgresStore::new(config(&server)).unwrap();
    let limit = bucket("failures", 5.0);
    let mut conn = connect(&server).await;
    for _ in 0..3 {
        let mut tx = conn.begin().await.unwrap();
        assert!(spend_in(&store, &mut tx, &limit, "alice", 1.0).await);
        tx.commit().await.unwrap();
    }
    let tokens = async || store.value(&limit, "alice").await.unwrap().tokens.floor();
    assert_eq!(tokens().await, 2.0);

    let mut tx = conn.begin().await.unwrap();
    store.reset_in(&mut tx, &limit, "alice").await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(tokens().await, 2.0, "a reset rolled back forgets nothing");

    let mut tx = conn.begin().await.unwrap();
    store.reset_in(&mut tx, &limit, "alice").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(tokens().await, 5.0, "a reset committed forgets the key");
}

/// A key is whatever a client sends: PostgreSQL's text cannot hold a NUL,
/// and an index row holds at most some 2,700 bytes. Such keys are decided
/// as any other, each its own, and a batch they share fails no one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_no_text_column_or_index_row_could_hold_are_decided_and_fail_no_one_else() {
    let server = PostgresServer::start();
    let store = PostgresStore::new(config(&server)).unwrap();
    let limit = bucket("odd", 2.0);
    let fat = "k".repeat(64 * 1024);
    let keys = [
        "a\0b".to_owned(),
        "a".to_owned(),
        fat.clone(),
        format!("{fat}x"),
        "plain".to_owned(),
    ];
    for round in 0..3 {
        // At once, so that they share batches.
        let calls: Vec<_> = keys
            .iter()
            .map(|k| {
                let (store, limit, k) = (store.clone(), limit.clone(), k.clone());
                tokio::spawn(
                    async move { store.decide(Op::new(&limit, &k, 1.0), Mode::CONSUME).await },
                )
            })
            .collect();
        for (k, call) in keys.iter().zip(calls) {
            let out = call.await.unwrap();
            let allowed = out.unwrap_or_else(|e| panic!("{:.8}…: {e}", k)).allowed;
            assert_eq!(allowed, round < 2, "round {round}, key {:.8}…", k);
        }
    }
}

/// Tables made ahead (`sluice migrate`, by a role that may) serve a role
/// that may only read and write them: it is never asked to create what is
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_may_not_create_tables_uses_tables_made_ahead() {
    let server = PostgresServer::start();
    PostgresStore::new(config(&server))
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let mut admin = connect(&server).await;
    for grant in [
        "CREATE ROLE app LOGIN",
        "GRANT USAGE ON SCHEMA sluice TO app",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON sluice.keys TO app",
        "GRANT SELECT ON sluice.version TO app",
    ] {
        sqlx::query(grant).execute(&mut admin).await.unwrap();
    }
    let url = server.url().replacen("postgres@", "app@", 1);
    let app = PostgresStore::new(
        PostgresConfig::from_url(&url)
            .unwrap()
            .with_timeout(Duration::from_secs(5)),
    )
    .unwrap();
    app.migrate().await.unwrap();
    let limit = bucket("app", 1.0);
    let first = app.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME).await;
    assert!(first.unwrap().allowed);
    let second = app.decide(Op::new(&limit, "k", 1.0), Mode::CONSUME).await;
    assert!(!second.unwrap().allowed);
}

/// A caller's transaction may hold a key as long as it likes. Calls on that
/// key meanwhile miss their deadline; their connections must come back to
/// the pool rather than wait on for the lock, or the other keys would find
/// none left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_by_a_long_transaction_never_starves_the_other_keys() {
    let server = PostgresServer::start();
    let store = PostgresStore::new(
        PostgresConfig::from_url(&server.url())
            .unwrap()
            .with_timeout(Duration::from_millis(300))
            .with_pool_size(4),
    )
    .unwrap();
    let limit = bucket("held", 100.0);
    store.migrate().await.unwrap();
    let mut conn = connect(&server).await;
    let mut holder = conn.begin().await.unwrap();
    assert!(spend_in(&store, &mut holder, &limit, "held", 1.0).await);
    for _ in 0..3 {
        // More calls than the pool has connections, one after another so
        // that each is a batch of its own.
        for _ in 0..6 {
            let out = store
                .decide(Op::new(&limit, "held", 1.0), Mode::CONSUME)
                .await;
            assert!(out.is_err(), "decided while the key was held: {out:?}");
        }
        let other = store
            .decide(Op::new(&limit, "free", 1.0), Mode::CONSUME)
            .await;
        assert!(other.unwrap().allowed, "another key was starved");
    }
    holder.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_drops_at_most_a_thousand_rows_at_a_time() {
    let server = PostgresServer::start();
    let clock = FakeClock::new(Nanos(1_000 * Nanos::PER_SEC));
    let store = PostgresStore::with_clock(config(&server), clock.clone()).unwrap();
    store.migrate().await.unwrap();
    let mut probe = connect(&server).await;
    sqlx::query(
        "INSERT INTO sluice.keys SELECT 'old', convert_to(i::text, 'UTF8'), 0, '\\x00', 1 \
         FROM generate_series(1, 1500) AS i",
    )
    .execute(&mut probe)
    .await
    .unwrap();
    assert_eq!(store.sweep().await.unwrap(), 1_000);
    assert_eq!(store.sweep().await.unwrap(), 500);
    assert_eq!(store.sweep().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_dropped_closes_its_connections_and_stops_its_tasks() {
    let server = PostgresServer::start();
    let store = PostgresStore::new(config(&server)).unwrap();
    let limit = bucket("gone", 2.0);
    store
        .decide(Op::new(&limit, "k", 1.0), Mode::CONSUME)
        .await
        .unwrap();
    let mut probe = connect(&server).await;
    let open = async |probe: &mut PgConnection| -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sluice'",
        )
        .fetch_one(probe)
        .await
        .unwrap()
    };
    assert!(open(&mut probe).await > 0);
    drop(store);
    // The upkeep notices within a ping, and the pool closes with it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while open(&mut probe).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the store's connections stay open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
