//! Deciding on rows in a transaction: lock them in one order, read them,
//! let the core decide, write back what changed.

use std::collections::HashMap;

use sluice_core::Nanos;
use sluice_core::states::{States, Stored};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row as _};

use super::Shared;
use super::rows::{Columns, Row, columns, slices};

impl Shared {
    /// Locks `keys`, reads their rows, lets `decide` decide on them, and
    /// writes back what changed, in the transaction `conn` is in.
    pub(super) async fn decide_in<R>(
        &self,
        conn: &mut PgConnection,
        keys: &[Row],
        decide: impl FnOnce(&mut States<Row>, Nanos) -> R,
    ) -> Result<R, sqlx::Error> {
        let cols = columns(keys.iter());
        self.lock(&mut *conn, &cols).await?;
        let (limits, names, shards) = &cols;
        // Read once the locks are held, so that no call on these keys that
        // came before this one can have read a later time.
        let rows: Vec<PgRow> = sqlx::query(&self.sql.read)
            .bind(limits)
            .bind(slices(names))
            .bind(shards)
            .fetch_all(&mut *conn)
            .await?;
        let mut states = States::new();
        for k in keys {
            states.read(k.clone(), None, Nanos(i64::MIN));
        }
        // A row names its key by the bytes it keeps, a digest for a long
        // one: back to the key the call named.
        let asked: HashMap<(&str, &[u8], i32), &Row> = keys
            .iter()
            .zip(limits.iter().zip(names).zip(shards))
            .map(|(row, ((l, k), s))| ((*l, k.as_ref(), *s), row))
            .collect();
        let mut db_now = None;
        for r in rows {
            db_now = Some(r.try_get::<i64, _>(0)?);
            let Some(limit) = r.try_get::<Option<&str>, _>(1)? else {
                // The one row of a read that found none.
                continue;
            };
            let shard: i32 = r.try_get(3)?;
            let stored: &[u8] = r.try_get(2)?;
            let Some(&key) = asked.get(&(limit, stored, shard)) else {
                continue;
            };
            let key = key.clone();
            let bytes: Vec<u8> = r.try_get(4)?;
            let empty_at = Nanos(r.try_get(5)?);
            match Stored::from_bytes(&bytes) {
                Some(state) => states.read(key, Some(state), empty_at),
                None => states.read_unknown(key, empty_at),
            }
        }
        let now = match &self.clock {
            Some(clock) => clock.now(),
            None => {
                let micros = db_now.ok_or_else(|| {
                    sqlx::Error::Protocol("the read returned no row and no time".into())
                })?;
                Nanos(micros.saturating_mul(1_000))
            }
        };
        let out = decide(&mut states, now);
        let (mut written, mut dropped) = (Vec::new(), Vec::new());
        for (k, write) in states.writes() {
            match write {
                Some((state, empty_at)) => written.push((k, state.to_bytes(), empty_at.0)),
                None => dropped.push(k),
            }
        }
        if !(written.is_empty() && dropped.is_empty()) {
            self.write(&mut *conn, &written, &dropped).await?;
        }
        Ok(out)
    }

    /// Takes the transaction-scoped locks of the keys given as
    /// [`columns`], in the one order every call takes them in.
    pub(super) async fn lock(
        &self,
        conn: &mut PgConnection,
        (limits, names, shards): &Columns<'_>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&self.sql.lock)
            .bind(limits)
            .bind(slices(names))
            .bind(shards)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Writes `written` (each a key, its state's bytes and when it holds
    /// nothing any more) and drops the rows of `dropped`, in one statement.
    pub(super) async fn write(
        &self,
        conn: &mut PgConnection,
        written: &[(&Row, Vec<u8>, i64)],
        dropped: &[&Row],
    ) -> Result<(), sqlx::Error> {
        let (limits, names, shards) = columns(written.iter().map(|w| w.0));
        let bytes: Vec<&[u8]> = written.iter().map(|w| w.1.as_slice()).collect();
        let times: Vec<i64> = written.iter().map(|w| w.2).collect();
        let (d_limits, d_names, d_shards) = columns(dropped.iter().copied());
        sqlx::query(&self.sql.write)
            .bind(&limits)
            .bind(slices(&names))
            .bind(&shards)
            .bind(&bytes)
            .bind(&times)
            .bind(&d_limits)
            .bind(slices(&d_names))
            .bind(&d_shards)
            .execute(conn)
            .await?;
        Ok(())
    }
}
