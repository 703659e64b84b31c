//! `States`, the core's side of a store that keeps its keys elsewhere, held
//! to the conformance suite through a store that keeps every key as bytes in
//! a map of rows, as a database would: read the rows a call names, decide,
//! write back what changed. The suite compares it with the memory store,
//! so a decision that differs from the memory store's fails here.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::future::Future;

use parking_lot::Mutex;
use sluice_core::states::{States, Stored};
use sluice_core::{
    Clock, Decision, FakeClock, Limit, Mode, Nanos, Op, Outcome, Settle, Store, StoreError, Value,
    conformance,
};

/// A row's key: the limit's name, the key, the shard.
type Row = (String, String, u32);

/// Rows of bytes, each with the time it holds nothing any more.
struct RowStore {
    rows: Mutex<HashMap<Row, (Vec<u8>, Nanos)>>,
    clock: FakeClock,
}

impl RowStore {
    /// Reads `keys`' rows, lets `decide` decide on them, and writes back
    /// what it changed, as one transaction.
    fn with<R>(&self, keys: &[Row], decide: impl FnOnce(&mut States<Row>, Nanos) -> R) -> R {
        let mut rows = self.rows.lock();
        let now = self.clock.now();
        let mut states = States::new();
        for k in keys {
            match rows.get(k) {
                Some((bytes, empty_at)) => {
                    let state = Stored::from_bytes(bytes).unwrap();
                    assert_eq!(state.to_bytes(), *bytes, "bytes read back as written");
                    states.read(k.clone(), Some(state), *empty_at);
                }
                None => states.read(k.clone(), None, Nanos(i64::MIN)),
            }
        }
        let out = decide(&mut states, now);
        for (k, written) in states.writes() {
            match written {
                Some((state, empty_at)) => {
                    rows.insert(k.clone(), (state.to_bytes(), empty_at));
                }
                None => {
                    rows.remove(k);
                }
            }
        }
        out
    }
}

fn row(limit: &Limit, key: &str, shard: u32) -> Row {
    (limit.name().to_owned(), key.to_owned(), shard)
}

fn shards(limit: &Limit, key: &str) -> Vec<Row> {
    (0..limit.shards()).map(|s| row(limit, key, s)).collect()
}

impl Store for RowStore {
    fn transact(
        &self,
        ops: &[Op<'_>],
        mode: Mode,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        let keys: Vec<Row> = ops
            .iter()
            .flat_map(|op| {
                let (a, b) = op.shards();
                [row(op.limit, op.key, a), row(op.limit, op.key, b)]
            })
            .collect();
        let out = self.with(&keys, |states, now| {
            states.transact(ops, |i, s| row(ops[i].limit, ops[i].key, s), mode, now)
        });
        std::future::ready(out)
    }

    fn reset(
        &self,
        limit: &Limit,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut rows = self.rows.lock();
        for k in shards(limit, key) {
            rows.remove(&k);
        }
        std::future::ready(Ok(()))
    }

    fn value(
        &self,
        limit: &Limit,
        key: &str,
    ) -> impl Future<Output = Result<Value, StoreError>> + Send {
        let keys = shards(limit, key);
        let v = self.with(&keys, |states, now| states.value(limit, key, &keys, now));
        std::future::ready(Ok(v))
    }

    fn settle(
        &self,
        limit: &Limit,
        key: &str,
        change: Settle,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let keys = shards(limit, key);
        let d = self.with(&keys, |states, now| {
            states.settle(limit, key, &keys, change, now)
        });
        std::future::ready(d)
    }

    fn release(
        &self,
        limit: &Limit,
        key: &str,
        id: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let keys = shards(limit, key);
        let released = self.with(&keys, |states, now| states.release(limit, &keys, id, now));
        std::future::ready(Ok(released))
    }
}

#[test]
fn a_store_of_rows_deciding_through_states_conforms() {
    let clock = FakeClock::new(Nanos(1_000 * Nanos::PER_SEC));
    let store = RowStore {
        rows: Mutex::new(HashMap::new()),
        clock: clock.clone(),
    };
    // Every future here is ready at once, so one poll runs the suite.
    let mut suite = std::pin::pin!(conformance::run_all(&store, &clock));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(suite.as_mut().poll(&mut cx).is_ready());
}

/// A store deciding a batch of calls on one `States` may meet a key under
/// two kinds of state in it: calls queued before a reload changed the
/// limit's kind, and after. What the first kind spent must hold the second
/// back, as it does across two calls.
#[test]
fn a_key_used_under_two_kinds_in_one_batch_grants_no_burst() {
    let log = Limit::new(
        "login",
        sluice_core::SlidingLog::per_period(5.0, Nanos(60 * Nanos::PER_SEC)).unwrap(),
    );
    let bucket = Limit::new(
        "login",
        sluice_core::TokenBucket::new(5.0 / 60.0, 5.0).unwrap(),
    );
    let key = |_: usize, _: u32| row(&log, "k", 0);
    let now = Nanos(1_000 * Nanos::PER_SEC);
    let mut states = States::new();
    states.read(key(0, 0), None, Nanos(i64::MIN));
    for _ in 0..5 {
        let out = states.transact(&[Op::new(&log, "k", 1.0)], key, Mode::CONSUME, now);
        assert!(out.unwrap().allowed);
    }
    let under_bucket = states.transact(&[Op::new(&bucket, "k", 1.0)], key, Mode::CONSUME, now);
    assert!(!under_bucket.unwrap().allowed, "the log's five are spent");
    let back = states.transact(&[Op::new(&log, "k", 1.0)], key, Mode::CONSUME, now);
    assert!(!back.unwrap().allowed, "back under the log, still spent");
    let (_, written) = states.writes().next().unwrap();
    let (_, empty_at) = written.unwrap();
    assert_eq!(empty_at, Nanos(now.0 + 60 * Nanos::PER_SEC));
}
