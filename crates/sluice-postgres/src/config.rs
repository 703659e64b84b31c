//! How to reach the database and how to use it: the URL, the schema the
//! store keeps its table in, the deadline of a call, the pool.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

/// A configuration the store cannot use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresConfigError {
    /// The URL is not one PostgreSQL's client reads.
    #[error("not a PostgreSQL URL ({0}): write postgres://user:password@host:port/database")]
    Url(String),
    /// The schema is not a plain lowercase identifier.
    #[error(
        "schema {0:?} must be 1 to 63 lowercase ASCII letters, digits and `_`, starting with a \
         letter or `_`"
    )]
    Schema(String),
}

/// Where the store keeps its keys, and how long a call may take.
///
/// ```
/// use std::time::Duration;
/// use sluice_postgres::PostgresConfig;
/// let c = PostgresConfig::from_url("postgres://app:secret@db.internal:5432/app")?
///     .with_schema("limits")?
///     .with_timeout(Duration::from_millis(100));
/// assert_eq!(c.schema(), "limits");
/// assert_eq!(c.to_string(), "postgres://app@db.internal:5432/app (schema limits)");
/// # Ok::<_, sluice_postgres::PostgresConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    pub(crate) options: PgConnectOptions,
    schema: String,
    timeout: Duration,
    pool_size: u32,
    durable: bool,
    max_batch: usize,
    max_in_flight: usize,
}

impl PostgresConfig {
    /// The database at `url` (`postgres://` or `postgresql://`, TLS as its
    /// `sslmode` says), with the defaults: schema `sluice`, a deadline of
    /// 100 ms a call, at most 16 connections, a durable table, batches of
    /// at most 256 calls, at most 4 of them in flight at once.
    pub fn from_url(url: &str) -> Result<Self, PostgresConfigError> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(PostgresConfigError::Url(
                "it must start with postgres:// or postgresql://".into(),
            ));
        }
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| PostgresConfigError::Url(e.to_string()))?
            .application_name("sluice");
        Ok(PostgresConfig {
            options,
            schema: "sluice".into(),
            timeout: Duration::from_millis(100),
            pool_size: 16,
            durable: true,
            max_batch: 256,
            // Enough for batches on different keys to keep a few of the
            // database's cores busy; few enough that, on one hot key, whose
            // batches run one after another, the calls queued meanwhile
            // make large batches rather than many small ones.
            max_in_flight: 4,
        })
    }

    /// Keeps the store's tables in `schema`, which is created if missing.
    pub fn with_schema(mut self, schema: &str) -> Result<Self, PostgresConfigError> {
        let mut chars = schema.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !(first_ok && rest_ok && schema.len() <= 63) {
            return Err(PostgresConfigError::Schema(schema.to_owned()));
        }
        self.schema = schema.to_owned();
        Ok(self)
    }

    /// The deadline of every call, the wait for a connection included.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// At most `size` connections (at least 1).
    pub fn with_pool_size(mut self, size: u32) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// Decides queued calls in batches of at most `max_batch` (at least 1),
    /// each one database transaction, with at most `max_in_flight` (at
    /// least 1) batches in flight at once.
    ///
    /// ```
    /// use sluice_postgres::PostgresConfig;
    /// let c = PostgresConfig::from_url("postgres://u@localhost/db")?.with_batching(0, 2);
    /// assert_eq!((c.max_batch(), c.max_in_flight()), (1, 2));
    /// # Ok::<_, sluice_postgres::PostgresConfigError>(())
    /// ```
    pub fn with_batching(mut self, max_batch: usize, max_in_flight: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self.max_in_flight = max_in_flight.max(1);
        self
    }

    /// Whether the table survives a crash of the database (`true`, the
    /// default) or is an unlogged table, faster to write and emptied by a
    /// crash. It is chosen when the table is created.
    pub fn with_durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// The schema the store's tables are in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The deadline of a call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The most connections the store opens.
    pub fn pool_size(&self) -> u32 {
        self.pool_size
    }

    /// Whether the table is made durable.
    pub fn durable(&self) -> bool {
        self.durable
    }

    /// The most calls one batch decides.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// The most batches in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }
}

/// The database, as a log line may show it: no password.
impl std::fmt::Display for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o = &self.options;
        write!(
            f,
            "postgres://{}@{}:{}/{} (schema {})",
            o.get_username(),
            o.get_host(),
            o.get_port(),
            o.get_database().unwrap_or(o.get_username()),
            self.schema
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_schema_that_could_carry_sql_is_refused() {
        let c = PostgresConfig::from_url("postgres://u@localhost/db").unwrap();
        for bad in [
            "",
            "Upper",
            "1st",
            "a;drop table x",
            "a-b",
            "\"q\"",
            &"a".repeat(64),
        ] {
            assert!(c.clone().with_schema(bad).is_err(), "{bad:?}");
        }
        for good in ["sluice", "_x", "limits_2"] {
            assert!(c.clone().with_schema(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn a_url_that_is_not_postgres_is_refused_and_a_password_never_shown() {
        assert!(PostgresConfig::from_url("redis://localhost").is_err());
        let c = PostgresConfig::from_url("postgresql://app:hunter2@db:6000/x").unwrap();
        let shown = c.to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(shown, "postgres://app@db:6000/x (schema sluice)");
    }
}
