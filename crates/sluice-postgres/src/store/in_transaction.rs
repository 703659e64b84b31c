//! Deciding inside the caller's own transaction: spent when it commits,
//! nothing spent when it is rolled back.

use sluice_core::{CostError, Limit, Mode, Op, Outcome, StoreError};
use sqlx::PgConnection;

use super::PostgresStore;
use super::rows::{Row, columns, op_rows, row, shard_rows};
use crate::schema::SchemaError;

/// What went wrong deciding inside a caller's transaction.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InTransactionError {
    /// The call itself was bad (a cost no limit can take); retrying will
    /// not help.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// The database failed, or refused the transaction: see
    /// [`InTransactionError::is_retryable`].
    #[error("the database: {0}")]
    Database(#[from] sqlx::Error),
    /// The store's tables are missing or of another version.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// The transaction cannot be decided as it is (one limit named under
    /// two kinds of state).
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for InTransactionError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Cost(c) => InTransactionError::Cost(c),
            other => InTransactionError::Store(other),
        }
    }
}

impl InTransactionError {
    /// Whether the caller should roll back and run its transaction again:
    /// a serialization failure (SERIALIZABLE, or REPEATABLE READ over a row
    /// another transaction changed since it began) or a deadlock with the
    /// caller's own locks. Nothing was decided wrongly; nothing was spent
    /// once the transaction is rolled back.
    pub fn is_retryable(&self) -> bool {
        match self {
            InTransactionError::Database(sqlx::Error::Database(e)) => {
                matches!(e.code().as_deref(), Some("40001" | "40P01"))
            }
            _ => false,
        }
    }
}

impl PostgresStore {
    /// Decides `ops` inside the caller's transaction `conn` (a
    /// `sqlx::Transaction<'_, Postgres>` dereferences to one): rolled back,
    /// nothing was spent; committed, it was spent as durably as the
    /// caller's own rows.
    ///
    /// The keys' rows stay locked until the caller's transaction ends, so
    /// on one hot key the callers' transactions run one after another: keep
    /// the ones that decide short. Under REPEATABLE READ or SERIALIZABLE,
    /// a key another transaction changed since this one began is a
    /// serialization failure ([`InTransactionError::is_retryable`]), never
    /// a decision made on what it held before.
    ///
    /// There is no deadline here: the caller's transaction has its own
    /// (`statement_timeout`, `lock_timeout`). Nor is the call batched with
    /// others: it is the caller's transaction that commits it.
    pub async fn transact_in(
        &self,
        conn: &mut PgConnection,
        ops: &[Op<'_>],
        mode: Mode,
    ) -> Result<Outcome, InTransactionError> {
        for op in ops {
            op.validate(mode.reserve)?;
        }
        self.shared.migrate().await?;
        let keys = op_rows(ops);
        let outcome = self
            .shared
            .decide_in(conn, &keys, |states, now| {
                states.transact(ops, |i, s| row(ops[i].limit, ops[i].key, s), mode, now)
            })
            .await
            .inspect_err(|e| self.shared.noticed(e))?;
        Ok(outcome?)
    }

    /// Forgets `key` of `limit` inside the caller's transaction `conn`, as
    /// [`Store::reset`] does: committed, the key is full again; rolled
    /// back, it holds what it held. A login that succeeds can forget the
    /// failures before it in the transaction that records the success.
    ///
    /// [`Store::reset`]: sluice_core::Store::reset
    pub async fn reset_in(
        &self,
        conn: &mut PgConnection,
        limit: &Limit,
        key: &str,
    ) -> Result<(), InTransactionError> {
        self.shared.migrate().await?;
        let keys = shard_rows(limit, key);
        let dropped: Vec<&Row> = keys.iter().collect();
        let cols = columns(keys.iter());
        let forget = async {
            self.shared.lock(&mut *conn, &cols).await?;
            self.shared.write(&mut *conn, &[], &dropped).await
        };
        forget.await.inspect_err(|e| self.shared.noticed(e))?;
        Ok(())
    }
}
