//! The store's tables: made on first use, or by `sluice migrate`, under an
//! advisory lock so that servers starting together make them once; and
//! versioned, so that a later release knows what it finds.

use sqlx::{Connection, PgConnection};

/// The schema version this release writes and reads: 2 keeps keys as
/// bytes (a key may hold a NUL, which text cannot, and a long one is kept
/// as its digest); 1 kept them as text.
pub const SCHEMA_VERSION: i32 = 2;

/// The advisory lock the servers of one database make the tables under:
/// "sluice" and a 1, so that no other application's lock is likely to be it.
const MIGRATION_LOCK: i64 = 0x736c_7569_6365_0001;

/// The SQL the store runs, written for its schema once.
#[derive(Debug)]
pub(crate) struct Statements {
    /// Takes the transaction-scoped locks of a call's keys, in one order
    /// for every call, so that calls over several keys never deadlock:
    /// `$1`, `$2`, `$3` the keys' limits, keys and shards.
    pub(crate) lock: String,
    /// The time on the database's clock, in microseconds since the epoch.
    pub(crate) now: &'static str,
    /// The time on the database's clock (as `now`) in the first column of
    /// every row, and the rows of the keys `$1`, `$2`, `$3`, locked
    /// against writers, in the others; one row of nulls but the time when
    /// none of the keys has a row.
    pub(crate) read: String,
    /// Writes rows (`$1`..`$3` their keys, `$4` their states, `$5` when
    /// each holds nothing any more) and drops the rows of the keys `$6`,
    /// `$7`, `$8`.
    pub(crate) write: String,
    /// Drops up to `$2` rows that hold nothing at `$1`, skipping rows a
    /// call holds.
    pub(crate) sweep: String,
}

impl Statements {
    pub(crate) fn for_schema(schema: &str) -> Statements {
        let keys = format!("{schema}.keys");
        let named = "SELECT * FROM unnest($1::text[], $2::bytea[], $3::int4[])";
        Statements {
            // The schema is in the hash, so that two schemas' stores in one
            // database do not wait for each other's keys.
            lock: format!(
                "SELECT pg_advisory_xact_lock(h) FROM (SELECT DISTINCT \
                 hashtextextended('{schema}' || chr(31) || l || chr(31) || encode(k, 'hex') || chr(31) || s::text, 0) \
                 AS h FROM unnest($1::text[], $2::bytea[], $3::int4[]) AS t(l, k, s)) AS hashes \
                 ORDER BY h"
            ),
            now: "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8",
            // The statement's own time, read once its locks are held (the
            // statement before this one took them), and in the same round
            // trip as the rows.
            read: format!(
                "WITH found AS (SELECT limit_name, key, shard, state, empty_at FROM {keys} \
                 WHERE (limit_name, key, shard) IN ({named}) FOR UPDATE) \
                 SELECT (extract(epoch FROM statement_timestamp()) * 1000000)::int8, found.* \
                 FROM (VALUES (1)) AS one LEFT JOIN found ON true"
            ),
            write: format!(
                "WITH dropped AS (DELETE FROM {keys} WHERE (limit_name, key, shard) IN \
                 (SELECT * FROM unnest($6::text[], $7::bytea[], $8::int4[]))) \
                 INSERT INTO {keys} (limit_name, key, shard, state, empty_at) \
                 SELECT * FROM unnest($1::text[], $2::bytea[], $3::int4[], $4::bytea[], $5::int8[]) \
                 ON CONFLICT (limit_name, key, shard) \
                 DO UPDATE SET state = excluded.state, empty_at = excluded.empty_at"
            ),
            sweep: format!(
                "DELETE FROM {keys} WHERE ctid IN (SELECT ctid FROM {keys} \
                 WHERE empty_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}

/// Why the tables could not be made or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The database refused or failed.
    #[error("the database: {0}")]
    Database(#[from] sqlx::Error),
    /// The tables are of another version than this release reads.
    #[error(
        "the schema holds version {found} of the store's tables, and this release reads \
         version {SCHEMA_VERSION}: run the release that made them, or migrate"
    )]
    Version {
        /// The version found.
        found: i32,
    },
}

/// Makes the store's tables in `schema` if they are missing, and checks
/// that tables already there are of the version this release reads.
/// `durable: false` makes the keys' table unlogged.
pub(crate) async fn migrate(
    conn: &mut PgConnection,
    schema: &str,
    durable: bool,
) -> Result<(), SchemaError> {
    let mut tx = conn.begin().await?;
    // The store's connections give up on a statement at a call's deadline;
    // making tables, and waiting for another server that is making them,
    // may take longer.
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await?;
    sqlx::query("SET LOCAL lock_timeout = 0")
        .execute(&mut *tx)
        .await?;
    // Tables someone made already (`sluice migrate` by a role that may
    // create them) are read without asking to create anything: a role
    // without CREATE is refused even `CREATE … IF NOT EXISTS` of what is
    // there.
    let made: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(format!("{schema}.version"))
        .fetch_one(&mut *tx)
        .await?;
    if made.is_some() {
        let found: Option<i32> =
            sqlx::query_scalar(&format!("SELECT version FROM {schema}.version"))
                .fetch_optional(&mut *tx)
                .await?;
        match found {
            Some(SCHEMA_VERSION) => {
                tx.commit().await?;
                return Ok(());
            }
            Some(found) => return Err(SchemaError::Version { found }),
            // Made, but not finished: finish below.
            None => {}
        }
    }
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {schema}.version (version int4 NOT NULL)"
    ))
    .execute(&mut *tx)
    .await?;
    let found: Option<i32> = sqlx::query_scalar(&format!("SELECT version FROM {schema}.version"))
        .fetch_optional(&mut *tx)
        .await?;
    match found {
        Some(SCHEMA_VERSION) => {}
        Some(found) => return Err(SchemaError::Version { found }),
        None => {
            let unlogged = if durable { "" } else { "UNLOGGED " };
            // A state's bytes, and when it holds nothing any more, in
            // nanoseconds since the epoch on the clock the store decides
            // by: a row past that time is read as no row, and swept.
            sqlx::query(&format!(
                "CREATE {unlogged}TABLE {schema}.keys (\
                 limit_name text NOT NULL, key bytea NOT NULL, shard int4 NOT NULL, \
                 state bytea NOT NULL, empty_at int8 NOT NULL, \
                 PRIMARY KEY (limit_name, key, shard))"
            ))
            .execute(&mut *tx)
            .await?;
            sqlx::query(&format!(
                "CREATE INDEX keys_empty_at ON {schema}.keys (empty_at)"
            ))
            .execute(&mut *tx)
            .await?;
            sqlx::query(&format!("INSERT INTO {schema}.version VALUES ($1)"))
                .bind(SCHEMA_VERSION)
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}
