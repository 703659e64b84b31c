//! The store's upkeep: pings that keep readiness current, the tables made
//! and noticed gone, and sweeps of rows that hold nothing any more.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sluice_core::{Nanos, StoreError};
use sqlx::{Connection as _, PgConnection};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::dispatch::Queued;
use super::stats::bump;
use super::{Shared, unavailable};
use crate::schema::{self, SchemaError};

/// The most rows one sweep drops in one statement: few enough that it
/// holds its row locks for a moment only.
const SWEEP_BATCH: i64 = 1_000;

/// How often the store asks the database whether it answers.
const PING_EVERY: Duration = Duration::from_millis(250);

/// How often it asks while the database refuses connections.
const PING_WHILE_DOWN: Duration = Duration::from_millis(25);

/// How far behind the database's clock a sweep looks.
const SWEEP_MARGIN: Duration = Duration::from_secs(1);

/// How often the upkeep drops rows that hold nothing any more.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The store's upkeep, for as long as a handle of it lives: a ping every
/// [`PING_EVERY`], which keeps readiness current while no call comes (and
/// finds out, before any call, whether the database answers at start),
/// the tables made once it answers, and a sweep every [`SWEEP_EVERY`].
pub(super) async fn upkeep(shared: Arc<Shared>, alive: mpsc::WeakSender<Box<dyn Queued>>) {
    let mut last_sweep = Instant::now();
    while alive.strong_count() > 0 {
        let _ = shared.ping().await;
        if shared.ready.load(Ordering::Relaxed) && !shared.migrated.load(Ordering::Acquire) {
            // Made before the first call needs them, so that it does not
            // spend its deadline on them; a failure is the first call's to
            // report.
            let _ = tokio::time::timeout(shared.config.timeout() * 10, shared.migrate()).await;
        }
        if shared.ready.load(Ordering::Relaxed) && last_sweep.elapsed() >= SWEEP_EVERY {
            last_sweep = Instant::now();
            // A sweep that fails leaves the rows for the next.
            while let Ok(n) = shared.sweep().await {
                if n < SWEEP_BATCH as u64 || alive.strong_count() == 0 {
                    break;
                }
            }
        }
        // While the database refuses, ping often (each time one
        // connection attempt, refused at once), so that calls resume soon
        // after it is back; a failed batch asks for a ping at once.
        let pause = if shared.refused.load(Ordering::Relaxed) {
            PING_WHILE_DOWN
        } else {
            PING_EVERY
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shared.suspect.notified() => {}
        }
    }
}

impl Shared {
    pub(super) async fn ping(&self) -> Result<(), StoreError> {
        if !self.ready.load(Ordering::Relaxed) {
            self.probe().await?;
        }
        let work = async {
            sqlx::query("SELECT 1")
                .execute(&self.pool)
                .await
                .map_err(unavailable)
        };
        let result = tokio::time::timeout(self.config.timeout(), work)
            .await
            .unwrap_or(Err(StoreError::Timeout))
            .map(|_| ());
        match result {
            Ok(()) => self.answered(),
            Err(_) => {
                // Before readiness says so: a caller that sees the store
                // not ready finds calls failing at once if the database
                // refuses.
                let _ = self.probe().await;
                self.ready.store(false, Ordering::Relaxed);
            }
        }
        result
    }

    /// The database answered: ready, and no longer refusing.
    pub(super) fn answered(&self) {
        self.refused.store(false, Ordering::Relaxed);
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Opens a connection of its own, and notes whether the database
    /// refused it: the pool's attempts hide why they failed, and a refusal
    /// (nothing listens on its port) is what lets calls fail at once.
    async fn probe(&self) -> Result<(), StoreError> {
        let opened = tokio::time::timeout(
            self.config.timeout(),
            PgConnection::connect_with(&self.config.options),
        )
        .await;
        let refused = matches!(
            &opened,
            Ok(Err(sqlx::Error::Io(e))) if e.kind() == std::io::ErrorKind::ConnectionRefused
        );
        self.refused.store(refused, Ordering::Relaxed);
        match opened {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                Ok(())
            }
            Ok(Err(e)) => {
                if refused {
                    self.ready.store(false, Ordering::Relaxed);
                }
                Err(unavailable(e))
            }
            Err(_) => Err(StoreError::Timeout),
        }
    }

    pub(super) async fn migrate(&self) -> Result<(), SchemaError> {
        if self.migrated.load(Ordering::Acquire) {
            return Ok(());
        }
        // Calls that find the tables unknown at once each run this; the
        // migration's advisory lock makes one make them and the others
        // find them made.
        let mut conn = self.pool.acquire().await?;
        schema::migrate(&mut conn, self.config.schema(), self.config.durable()).await?;
        self.migrated.store(true, Ordering::Release);
        Ok(())
    }

    /// Notes a database error that says the tables are gone, so that the
    /// next call makes them again.
    pub(super) fn noticed(&self, e: &sqlx::Error) {
        if let sqlx::Error::Database(db) = e
            && matches!(db.code().as_deref(), Some("42P01" | "3F000"))
        {
            self.migrated.store(false, Ordering::Release);
        }
    }

    pub(super) async fn sweep(&self) -> Result<u64, StoreError> {
        let work = async {
            self.migrate().await.map_err(unavailable)?;
            let mut conn = self.pool.acquire().await.map_err(unavailable)?;
            let now = self.now(&mut conn).await.map_err(unavailable)?;
            // A second behind: a batch that read its time a moment before
            // this reads its rows, and must still find a row that was not
            // yet empty at its time.
            let before = now.0.saturating_sub(SWEEP_MARGIN.as_nanos() as i64);
            sqlx::query(&self.sql.sweep)
                .bind(before)
                .bind(SWEEP_BATCH)
                .execute(&mut *conn)
                .await
                .map(|done| done.rows_affected())
                .map_err(unavailable)
        };
        let swept = tokio::time::timeout(self.config.timeout(), work)
            .await
            .unwrap_or(Err(StoreError::Timeout))?;
        bump(&self.counters.swept, swept);
        Ok(swept)
    }

    /// The time calls are decided at: the database's clock, read on `conn`,
    /// unless the store was given a clock of its own.
    async fn now(&self, conn: &mut PgConnection) -> Result<Nanos, sqlx::Error> {
        match &self.clock {
            Some(clock) => Ok(clock.now()),
            None => {
                let micros: i64 = sqlx::query_scalar(self.sql.now).fetch_one(conn).await?;
                Ok(Nanos(micros.saturating_mul(1_000)))
            }
        }
    }
}
