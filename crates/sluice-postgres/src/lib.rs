//! A PostgreSQL implementation of [`sluice_core::Store`]: limits kept in the
//! application's own database, shared by every server that uses it, as
//! durable as its data, and spent, if the caller likes, inside its own
//! transaction, so that a transaction that fails spends nothing.
//!
//! The database keeps, locks and orders the keys' states; the core decides
//! on them ([`sluice_core::states`]), with the same functions the memory
//! store runs. A call takes advisory locks on its keys in one order (so
//! that calls over several keys never deadlock), reads the time on the
//! database's clock (so that every server decides by one clock), reads and
//! locks the keys' rows, and writes back what changed. A row that holds
//! nothing (a full bucket, an empty log) is dropped when written so, and a
//! row that comes to hold nothing as time passes is read as no row, and
//! dropped by [`PostgresStore::sweep`].
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use sluice_core::{Limit, Mode, Op, TokenBucket};
//! use sluice_postgres::{PostgresConfig, PostgresStore};
//! let store = PostgresStore::new(PostgresConfig::from_url("postgres://app@localhost/app")?)?;
//! let send = Limit::new("send", TokenBucket::new(1.0, 10.0)?);
//! // Inside the transaction that stores the message: rolled back, the
//! // message is not stored and the token not spent.
//! let mut tx = pool.begin().await?;
//! let out = store.transact_in(&mut tx, &[Op::new(&send, "alice", 1.0)], Mode::CONSUME).await?;
//! if out.allowed {
//!     sqlx::query("INSERT INTO messages (author, body) VALUES ('alice', 'hi')")
//!         .execute(&mut *tx)
//!         .await?;
//!     tx.commit().await?;
//! }
//! # Ok(()) }
//! ```

mod config;
mod schema;
mod store;

pub use config::{PostgresConfig, PostgresConfigError};
pub use schema::{SCHEMA_VERSION, SchemaError};
pub use store::{InTransactionError, NoRuntime, PostgresStats, PostgresStore};
