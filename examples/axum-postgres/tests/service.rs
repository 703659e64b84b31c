//! The example over real HTTP, on a real PostgreSQL of the tests' own: a
//! message the database refuses spends nothing and one it stores spends
//! its token; transactions that overlap on one key spend exactly what
//! committed, at each isolation level; wrong passwords lock a user out, a
//! success forgets them, and a locked-out user hears 429 whatever the
//! password. Overlap is made by a transaction the test holds open on the
//! key until the requests are seen waiting for its lock, never by sleeping.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../../crates/sluice-postgres/tests/support/mod.rs"]
mod postgres;

use std::future::Future;
use std::time::{Duration, Instant};

use axum_postgres::{App, Isolation, Limits};
use postgres::PostgresServer;
use serde_json::{Value as JsonValue, json};
use sluice_core::{Limit, Mode, Op, Store};
use sluice_postgres::{PostgresConfig, PostgresStore};
use sqlx::{PgPool, Postgres, Transaction};

/// A PostgreSQL with the example's tables, the service's pool on it, and a
/// store.
struct Database {
    _server: PostgresServer,
    pool: PgPool,
    store: PostgresStore,
}

impl Database {
    async fn start() -> Database {
        let server = PostgresServer::start();
        let pool = axum_postgres::connect(&server.url()).await.unwrap();
        axum_postgres::make_tables(&pool).await.unwrap();
        let config = PostgresConfig::from_url(&server.url())
            .unwrap()
            .with_timeout(Duration::from_secs(5));
        Database {
            store: PostgresStore::new(config).unwrap(),
            pool,
            _server: server,
        }
    }

    /// The service with `limits` at `isolation`, served on a free port.
    async fn serve(&self, limits: &Limits, isolation: Isolation) -> Client {
        let app = App::new(self.pool.clone(), self.store.clone(), limits.clone())
            .with_isolation(isolation);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, axum_postgres::router(app)).await });
        Client {
            base,
            http: reqwest::Client::new(),
        }
    }

    /// The tokens `limit` holds for `key` now.
    async fn tokens(&self, limit: &Limit, key: &str) -> f64 {
        self.store.value(limit, key).await.unwrap().tokens
    }

    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// A transaction of the test's own that has spent `cost` (0: nothing)
    /// on `key` of `limit`, and so holds the key's lock until it ends.
    async fn hold(&self, limit: &Limit, key: &str, cost: f64) -> Transaction<'static, Postgres> {
        let mut held = self.pool.begin().await.unwrap();
        let out = self
            .store
            .transact_in(&mut held, &[Op::new(limit, key, cost)], Mode::CONSUME)
            .await
            .unwrap();
        assert!(out.allowed, "the held transaction was denied");
        held
    }

    /// Waits until `n` transactions wait for a key's lock, polling with a
    /// deadline.
    async fn until_waiting(&self, n: i64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
            )
            .fetch_one(&self.pool)
            .await
            .unwrap();
            if waiting >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{waiting} of {n} requests came to wait for the held lock"
            );
            tokio::task::yield_now().await;
        }
    }

    /// Runs `requests` while `held` is open, ends it as `end` says once
    /// every one of them waits for its lock, and returns their answers in
    /// order.
    async fn behind<T, F>(
        &self,
        held: Transaction<'static, Postgres>,
        end: End,
        requests: Vec<F>,
    ) -> Vec<T>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let n = requests.len();
        let running: Vec<_> = requests.into_iter().map(tokio::spawn).collect();
        self.until_waiting(n as i64).await;
        match end {
            End::Commit => held.commit().await.unwrap(),
            End::RollBack => held.rollback().await.unwrap(),
        }
        let mut answers = Vec::with_capacity(n);
        for r in running {
            answers.push(r.await.unwrap());
        }
        answers
    }
}

/// How a held transaction ends.
enum End {
    Commit,
    RollBack,
}

/// An HTTP client of one served service.
#[derive(Clone)]
struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// POSTs `body` to `path`: the status, `Retry-After` if any, and the
    /// body.
    async fn post(&self, path: &str, body: JsonValue) -> (u16, Option<u64>, JsonValue) {
        let res = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        let retry_after = res
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap());
        (status, retry_after, res.json().await.unwrap())
    }

    async fn login(&self, user: &str, password: &str) -> (u16, Option<u64>) {
        let (status, retry_after, _) = self
            .post("/login", json!({"user": user, "password": password}))
            .await;
        (status, retry_after)
    }

    async fn add_user(&self, user: &str, password: &str) {
        let (status, _, body) = self
            .post("/users", json!({"user": user, "password": password}))
            .await;
        assert_eq!(status, 201, "{body}");
    }

    async fn send(&self, author: &str, body: &str) -> (u16, Option<u64>, JsonValue) {
        self.post("/messages", json!({"author": author, "body": body}))
            .await
    }

    /// [`Client::send`], to run elsewhere.
    fn sending(
        &self,
        author: &str,
        body: &str,
    ) -> impl Future<Output = (u16, Option<u64>, JsonValue)> + Send + use<> {
        let (client, author, body) = (self.clone(), author.to_owned(), body.to_owned());
        async move { client.send(&author, &body).await }
    }
}

/// Limits of `login` wrong passwords and `send` messages, refilling by
/// the hour so that nothing refills while a test runs.
fn limits(login: f64, send: f64) -> Limits {
    Limits::per_hour(login, send, send).unwrap()
}

/// A database, and the service on it at READ COMMITTED, with five wrong
/// passwords and three messages an hour.
async fn service() -> (Database, Limits, Client) {
    let db = Database::start().await;
    let limits = limits(5.0, 3.0);
    let client = db.serve(&limits, Isolation::ReadCommitted).await;
    (db, limits, client)
}

/// `tokens` is `expected`, give or take what refills in a few seconds.
fn about(tokens: f64, expected: f64) -> bool {
    (expected..expected + 0.01).contains(&tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_database_refuses_after_its_token_was_taken_spends_nothing_and_one_it_stores_spends_its_token()
 {
    let (db, limits, client) = service().await;

    // The token is taken, then the body's CHECK refuses the row: the
    // transaction rolls back with the token in it.
    for body in ["x".repeat(501), String::new()] {
        let (status, _, problem) = client.send("ann", &body).await;
        assert_eq!(status, 422, "{problem}");
        assert!(problem["detail"].as_str().unwrap().contains("body_length"));
        assert_eq!(db.tokens(&limits.send, "ann").await, 3.0);
    }
    assert_eq!(db.count("messages").await, 0);

    let (status, _, sent) = client.send("ann", "hello").await;
    assert_eq!((status, &sent["remaining"]), (201, &json!(2)), "{sent}");
    let left = db.tokens(&limits.send, "ann").await;
    assert!(about(left, 2.0), "{left}");
    assert_eq!(db.count("messages").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_transactions_on_one_key_spend_exactly_what_committed_at_every_isolation_level()
{
    let db = Database::start().await;
    let limits = limits(5.0, 2.0);
    for isolation in [
        Isolation::ReadCommitted,
        Isolation::RepeatableRead,
        Isolation::Serializable,
    ] {
        let client = db.serve(&limits, isolation).await;

        // The held transaction commits while the request waits: both
        // spent. Under REPEATABLE READ and SERIALIZABLE the request's
        // first attempt fails to serialize and is run again.
        let key = format!("committed-{isolation:?}");
        let left = send_behind(&db, &client, &limits.send, &key, 1.0, End::Commit).await;
        assert!(about(left, 0.0), "{isolation:?}: {left}");
        // And the key is spent: nothing past the limit.
        let (status, retry_after, _) = client.send(&key, "again").await;
        assert_eq!(status, 429, "{isolation:?}");
        assert!(retry_after.is_some_and(|s| s >= 1800), "{retry_after:?}");

        // The held transaction, which took both tokens, rolls back while
        // the request waits: only the request spent.
        let key = format!("rolled-back-{isolation:?}");
        let left = send_behind(&db, &client, &limits.send, &key, 2.0, End::RollBack).await;
        assert!(about(left, 1.0), "{isolation:?}: {left}");
    }
}

/// Sends a message on `key` behind a transaction that spent `held` of
/// `limit` there and ends as `end` says; the message must be stored.
/// What the key holds after.
async fn send_behind(
    db: &Database,
    client: &Client,
    limit: &Limit,
    key: &str,
    held: f64,
    end: End,
) -> f64 {
    let held = db.hold(limit, key, held).await;
    let sent = db
        .behind(held, end, vec![client.sending(key, "hello")])
        .await;
    assert_eq!(sent[0].0, 201, "{key}: {}", sent[0].2);
    db.tokens(limit, key).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_sent_at_once_on_one_key_store_exactly_as_many_as_the_limit_has_left() {
    let (db, limits, client) = service().await;
    // Eight requests queue behind a transaction that took one of three.
    let held = db.hold(&limits.send, "crowd", 1.0).await;
    let requests = (0..8).map(|i| client.sending("crowd", &format!("message {i}")));
    let sent = db.behind(held, End::Commit, requests.collect()).await;
    let mut statuses: Vec<u16> = sent.iter().map(|s| s.0).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 201, 429, 429, 429, 429, 429, 429]);
    assert_eq!(db.count("messages").await, 2);
    let left = db.tokens(&limits.send, "crowd").await;
    assert!(about(left, 0.0), "{left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_wrong_passwords_lock_a_user_out_and_then_even_the_right_one_gets_429_with_retry_after()
 {
    let (db, limits, client) = service().await;
    client.add_user("alice", "wonderland").await;
    client.add_user("bob", "builder").await;

    for _ in 0..5 {
        assert_eq!(client.login("alice", "guess").await, (401, None));
    }
    let left = db.tokens(&limits.login, "alice").await;
    assert!(about(left, 0.0), "{left}");
    // A wrong password an hour five times over: 12 minutes to the next
    // attempt, and up to half that again of jitter.
    let (status, retry_after) = client.login("alice", "wonderland").await;
    assert_eq!(status, 429);
    let retry_after = retry_after.expect("Retry-After on a lockout");
    assert!((720..=1080).contains(&retry_after), "{retry_after}");
    // Locked out, a wrong password is not even tried, nor recorded.
    assert_eq!(client.login("alice", "guess").await.0, 429);
    assert_eq!(db.count("login_failures").await, 5);
    // Another user is not locked out.
    assert_eq!(client.login("bob", "builder").await, (200, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_login_forgets_the_wrong_passwords_before_it() {
    let (db, limits, client) = service().await;
    client.add_user("alice", "wonderland").await;

    for _ in 0..4 {
        assert_eq!(client.login("alice", "guess").await.0, 401);
    }
    assert_eq!(client.login("alice", "wonderland").await, (200, None));
    assert_eq!(db.tokens(&limits.login, "alice").await, 5.0);
    // Five more wrong passwords before the lockout, not one.
    for _ in 0..5 {
        assert_eq!(client.login("alice", "guess").await.0, 401);
    }
    assert_eq!(client.login("alice", "wonderland").await.0, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_passwords_sent_at_once_are_counted_one_by_one_and_only_five_are_tried() {
    let (db, limits, client) = service().await;
    client.add_user("alice", "wonderland").await;
    // Ten attempts queue behind a transaction holding alice's key.
    let held = db.hold(&limits.login, "alice", 0.0).await;
    let attempts = (0..10).map(|i| {
        let client = client.clone();
        async move { client.login("alice", &format!("guess {i}")).await.0 }
    });
    let mut statuses = db.behind(held, End::Commit, attempts.collect()).await;
    statuses.sort_unstable();
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429, 429, 429, 429, 429]);
    assert_eq!(db.count("login_failures").await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_passwords_out_of_bounds_are_refused_before_anything_is_tried_or_spent() {
    let (db, limits, client) = service().await;
    let long = "n".repeat(axum_postgres::MAX_NAME + 1);
    let (status, _, problem) = client.send(&long, "hello").await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(client.login(&long, "guess").await.0, 422);
    assert_eq!(client.login("", "guess").await.0, 422);
    let password = "p".repeat(axum_postgres::MAX_PASSWORD + 1);
    assert_eq!(client.login("alice", &password).await.0, 422);
    assert_eq!(db.count("messages").await, 0);
    assert_eq!(db.count("login_failures").await, 0);
    assert_eq!(db.tokens(&limits.login, "alice").await, 5.0);
    assert_eq!(db.tokens(&limits.send, &long).await, 3.0);
}
