//! An axum service whose limits live in its own PostgreSQL database and are
//! spent inside the transactions that do the work, with
//! [`PostgresStore::transact_in`]:
//!
//! - `POST /login` `{user, password}`: wrong passwords are limited per user.
//!   A failure is spent in the transaction that records it; a success
//!   forgets the user's failures; a user who ran out is answered 429 with
//!   `Retry-After`, even with the right password.
//! - `POST /messages` `{author, body}`: a message takes a token in the
//!   transaction that stores it. A message the database refuses (a body
//!   its `CHECK` does not take) is rolled back, token and all.
//! - `POST /users` `{user, password}`: makes a user to log in as.
//!
//! A transaction that fails to serialize (REPEATABLE READ or SERIALIZABLE
//! on a key another transaction spent meanwhile) is run again, at most
//! [`ATTEMPTS`] times. `main.rs` serves it; the tests drive it over HTTP on
//! a PostgreSQL of their own.

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use axum::Router;
use axum::extract::{Json, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value as JsonValue, json};
use sluice_core::{Limit, LimitError, Mode, Nanos, Op, Outcome, TokenBucket};
use sluice_http::{PROBLEM_JSON, Problem, retry_after_secs};
use sluice_postgres::{InTransactionError, PostgresStore};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};

/// The example's own tables. `pgcrypto` hashes the passwords, so that the
/// example keeps no password as it was sent and needs no hashing crate.
pub const SCHEMA: &str = "
CREATE EXTENSION IF NOT EXISTS pgcrypto;
CREATE TABLE IF NOT EXISTS users (
    name text PRIMARY KEY,
    password_hash text NOT NULL
);
CREATE TABLE IF NOT EXISTS login_failures (
    id bigserial PRIMARY KEY,
    name text NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS messages (
    id bigserial PRIMARY KEY,
    author text NOT NULL,
    body text NOT NULL CONSTRAINT body_length CHECK (char_length(body) BETWEEN 1 AND 500),
    sent_at timestamptz NOT NULL DEFAULT now()
);
";

/// Makes the example's tables if they are missing. The store makes its own
/// on its first call.
pub async fn make_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(SCHEMA).execute(pool).await.map(|_| ())
}

/// How long a request may wait for one of the pool's connections, and
/// one of its statements may run (waiting on a key's lock included):
/// `transact_in` has no deadline of its own, the caller's transaction has.
pub const DEADLINE: Duration = Duration::from_secs(5);

/// A pool on `url` whose statements and waits for a connection end after
/// [`DEADLINE`].
pub async fn connect(url: &str) -> Result<PgPool, sqlx::Error> {
    let deadline = format!("{}ms", DEADLINE.as_millis());
    let options =
        PgConnectOptions::from_str(url)?.options([("statement_timeout", deadline.as_str())]);
    PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(DEADLINE)
        .connect_with(options)
        .await
}

/// How many times a transaction that fails to serialize is run, the first
/// included, before the caller is told to come back.
pub const ATTEMPTS: u32 = 5;

/// The longest user or author name, in bytes: a name is a limit's key, and
/// a failure keeps it in a row.
pub const MAX_NAME: usize = 64;

/// The longest password taken, in bytes (bcrypt reads the first 72).
pub const MAX_PASSWORD: usize = 1_024;

/// The service's limits.
#[derive(Clone)]
pub struct Limits {
    /// Wrong passwords per user.
    pub login: Limit,
    /// Messages per author.
    pub send: Limit,
}

impl Limits {
    /// `failures` wrong passwords per user an hour, as many at once;
    /// `messages` per author an hour, `burst` at once.
    ///
    /// ```
    /// let limits = axum_postgres::Limits::per_hour(5.0, 60.0, 10.0).unwrap();
    /// assert_eq!(limits.login.algorithm().capacity(), 5.0);
    /// assert!(axum_postgres::Limits::per_hour(0.0, 60.0, 10.0).is_err());
    /// ```
    pub fn per_hour(failures: f64, messages: f64, burst: f64) -> Result<Limits, LimitError> {
        let hour = Nanos(3_600 * Nanos::PER_SEC);
        Ok(Limits {
            login: Limit::new(
                "login-failures",
                TokenBucket::per_period(failures, hour)?.with_capacity(failures)?,
            ),
            send: Limit::new(
                "messages",
                TokenBucket::per_period(messages, hour)?.with_capacity(burst)?,
            ),
        })
    }

    /// The service's: five wrong passwords, then one more every 12
    /// minutes; 60 messages an hour, 10 at once.
    pub fn standard() -> Result<Limits, LimitError> {
        Limits::per_hour(5.0, 60.0, 10.0)
    }
}

/// The isolation level the service's transactions run at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// PostgreSQL's default: a call on a key another transaction holds
    /// waits for it, then reads what it committed.
    #[default]
    ReadCommitted,
    /// A key another transaction spent since this one began is a
    /// serialization failure, and the transaction is run again.
    RepeatableRead,
    /// As [`Isolation::RepeatableRead`], for the service's own rows too.
    Serializable,
}

impl Isolation {
    fn begin(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "BEGIN ISOLATION LEVEL READ COMMITTED",
            Isolation::RepeatableRead => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            Isolation::Serializable => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        }
    }
}

/// The service: its database, the store its limits are kept in, and the
/// limits.
#[derive(Clone)]
pub struct App {
    pool: PgPool,
    store: PostgresStore,
    limits: Limits,
    isolation: Isolation,
}

impl App {
    /// A service on `pool`, keeping `limits` in `store`, at READ
    /// COMMITTED. The store must be on the database `pool` is on: it
    /// makes its tables there, and `transact_in` reads and writes them in
    /// the transactions of `pool` it is given.
    pub fn new(pool: PgPool, store: PostgresStore, limits: Limits) -> App {
        App {
            pool,
            store,
            limits,
            isolation: Isolation::default(),
        }
    }

    /// The same service running its transactions at `isolation`.
    pub fn with_isolation(self, isolation: Isolation) -> App {
        App { isolation, ..self }
    }

    /// The store its limits are kept in.
    pub fn store(&self) -> &PostgresStore {
        &self.store
    }

    /// Its limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
}

/// The routes.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/users", post(add_user))
        .route("/login", post(login))
        .route("/messages", post(send))
        .with_state(app)
}

/// A name and a password.
#[derive(Deserialize)]
pub struct Credentials {
    /// The user's name.
    pub user: String,
    /// The password.
    pub password: String,
}

/// A message to store.
#[derive(Deserialize)]
pub struct Message {
    /// Who sends it.
    pub author: String,
    /// What it says.
    pub body: String,
}

async fn add_user(
    State(app): State<App>,
    Json(new): Json<Credentials>,
) -> Result<(StatusCode, Json<JsonValue>), Refusal> {
    let user = checked_name(&new.user)?;
    let password = checked_password(&new.password)?;
    sqlx::query("INSERT INTO users (name, password_hash) VALUES ($1, crypt($2, gen_salt('bf')))")
        .bind(user)
        .bind(password)
        .execute(&app.pool)
        .await?;
    Ok((StatusCode::CREATED, Json(json!({ "user": user }))))
}

async fn login(
    State(app): State<App>,
    Json(attempt): Json<Credentials>,
) -> Result<Json<JsonValue>, Refusal> {
    let user = checked_name(&attempt.user)?;
    let password = checked_password(&attempt.password)?;
    app.retrying(|| app.login_once(user, password)).await?;
    Ok(Json(json!({ "user": user })))
}

async fn send(
    State(app): State<App>,
    Json(message): Json<Message>,
) -> Result<(StatusCode, Json<JsonValue>), Refusal> {
    let author = checked_name(&message.author)?;
    let (id, remaining) = app
        .retrying(|| app.send_once(author, &message.body))
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": id, "remaining": remaining })),
    ))
}

impl App {
    async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool.begin_with(self.isolation.begin()).await
    }

    /// Runs `attempt`, each time in a transaction of its own, again while
    /// it fails to serialize, at most [`ATTEMPTS`] times in all. There is
    /// no pause between attempts: the next waits on the key's lock anyway.
    async fn retrying<T, F>(&self, mut attempt: impl FnMut() -> F) -> Result<T, Refusal>
    where
        F: Future<Output = Result<T, Refusal>>,
    {
        let mut tries = 1;
        loop {
            match attempt().await {
                Err(Refusal::Database(e)) if e.is_retryable() => {
                    if tries == ATTEMPTS {
                        return Err(Refusal::Busy);
                    }
                    tries += 1;
                }
                done => return done,
            }
        }
    }

    async fn login_once(&self, user: &str, password: &str) -> Result<(), Refusal> {
        let failure = [Op::new(&self.limits.login, user, 1.0)];
        let mut tx = self.begin().await?;
        // A check, not a spend: only a wrong password costs. The check
        // takes the user's lock until this transaction ends, so attempts
        // on one user take turns, and wrong passwords sent at once cannot
        // all pass the check before any of them is counted.
        let check = self
            .store
            .transact_in(&mut tx, &failure, Mode::CHECK)
            .await?;
        if !check.allowed {
            // Dropping the transaction rolls it back.
            return Err(Refusal::limited(&check, &self.limits.login, user));
        }
        let right: Option<bool> = sqlx::query_scalar(
            "SELECT password_hash = crypt($2, password_hash) FROM users WHERE name = $1",
        )
        .bind(user)
        .bind(password)
        .fetch_optional(&mut *tx)
        .await?;
        if right == Some(true) {
            // A reset rather than a refund: a success forgets every failure
            // before it, however many, and drops the key's row, so a user
            // in good standing costs no row. In this transaction, under the
            // lock the check took, so that no failure recorded meanwhile
            // is forgotten with the ones before the success.
            self.store
                .reset_in(&mut tx, &self.limits.login, user)
                .await?;
            tx.commit().await?;
            return Ok(());
        }
        // Allowed: the check above found the token, and the lock has been
        // held since.
        self.store
            .transact_in(&mut tx, &failure, Mode::CONSUME)
            .await?;
        sqlx::query("INSERT INTO login_failures (name) VALUES ($1)")
            .bind(user)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Err(Refusal::WrongPassword)
    }

    /// Stores a message and spends its token in one transaction: the id and
    /// the tokens left.
    async fn send_once(&self, author: &str, body: &str) -> Result<(i64, u64), Refusal> {
        let mut tx = self.begin().await?;
        let out = self
            .store
            .transact_in(
                &mut tx,
                &[Op::new(&self.limits.send, author, 1.0)],
                Mode::CONSUME,
            )
            .await?;
        if !out.allowed {
            return Err(Refusal::limited(&out, &self.limits.send, author));
        }
        // Refused here (the body's CHECK), the transaction is dropped,
        // so rolled back, and the token taken above was never spent.
        let id: i64 =
            sqlx::query_scalar("INSERT INTO messages (author, body) VALUES ($1, $2) RETURNING id")
                .bind(author)
                .bind(body)
                .fetch_one(&mut *tx)
                .await?;
        tx.commit().await?;
        let remaining = out.decisions.first().map_or(0, |d| d.remaining);
        Ok((id, remaining))
    }
}

fn checked_name(name: &str) -> Result<&str, Refusal> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(Refusal::Invalid("a name is 1 to 64 bytes"));
    }
    // PostgreSQL's text holds no NUL, and no name needs a control
    // character.
    if name.chars().any(char::is_control) {
        return Err(Refusal::Invalid("a name has no control characters"));
    }
    Ok(name)
}

fn checked_password(password: &str) -> Result<&str, Refusal> {
    if password.len() > MAX_PASSWORD {
        return Err(Refusal::Invalid("a password is at most 1,024 bytes"));
    }
    Ok(password)
}

/// Why a request was not done, answered as a problem (RFC 9457).
#[derive(Debug)]
pub enum Refusal {
    /// A field out of bounds: 422.
    Invalid(&'static str),
    /// No such user, or another password: 401.
    WrongPassword,
    /// The limit is spent: 429, with `Retry-After` in seconds.
    Limited {
        /// Whole seconds to wait, jittered per key.
        retry_after: u64,
    },
    /// The row is there already (a unique constraint): 409.
    Conflict(String),
    /// The database's constraint refused the row: 422.
    Refused(String),
    /// Every attempt failed to serialize: 503, to come back in a second.
    Busy,
    /// The database failed: 503.
    Database(InTransactionError),
}

impl Refusal {
    fn limited(out: &Outcome, limit: &Limit, key: &str) -> Refusal {
        let exact = out
            .decisions
            .iter()
            .find_map(|d| d.retry_after)
            .unwrap_or(0.0);
        let retry_after = retry_after_secs(exact, &format!("{}/{key}", limit.name())).max(1);
        Refusal::Limited { retry_after }
    }
}

impl From<InTransactionError> for Refusal {
    fn from(e: InTransactionError) -> Self {
        Refusal::Database(e)
    }
}

impl From<sqlx::Error> for Refusal {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            let constraint = db.constraint().unwrap_or_default().to_owned();
            match db.code().as_deref() {
                Some("23505") => return Refusal::Conflict(constraint),
                Some(code) if code.starts_with("23") => return Refusal::Refused(constraint),
                _ => {}
            }
        }
        // One place says which errors are worth another attempt: the
        // store's, for the service's own queries too.
        Refusal::Database(InTransactionError::from(e))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, detail, retry_after) = match &self {
            Refusal::Invalid(why) => (StatusCode::UNPROCESSABLE_ENTITY, (*why).to_owned(), None),
            Refusal::WrongPassword => (
                StatusCode::UNAUTHORIZED,
                "no such user, or another password".to_owned(),
                None,
            ),
            Refusal::Limited { retry_after } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too many attempts; try again later".to_owned(),
                Some(*retry_after),
            ),
            Refusal::Conflict(c) => (StatusCode::CONFLICT, format!("already there ({c})"), None),
            Refusal::Refused(c) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("the database refused it ({c})"),
                None,
            ),
            Refusal::Busy => (
                StatusCode::SERVICE_UNAVAILABLE,
                "too busy; try again".to_owned(),
                Some(1),
            ),
            Refusal::Database(e) => {
                // The caller is told nothing of the database; its operator is.
                eprintln!("database: {e}");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the database failed".to_owned(),
                    None,
                )
            }
        };
        let mut res = (status, Problem::new(status, detail).to_json()).into_response();
        res.headers_mut().insert(header::CONTENT_TYPE, PROBLEM_JSON);
        if let Some(secs) = retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}
