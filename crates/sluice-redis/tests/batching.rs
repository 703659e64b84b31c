//! Many concurrent transactions, so that the dispatcher packs them into
//! shared script calls, on a fake clock that stands still: whatever order
//! Redis decided them in, every key ends up holding exactly its capacity less
//! the costs of the transactions reported allowed, each transaction is
//! all-or-nothing, and the script's verdict agrees with the decisions
//! sluice-core computes from the states it reported.
//!
//! The mix has what a batch must get right: the same key in many
//! transactions of one call, a key named twice in one transaction, several
//! limits per transaction, sharded limits, fixed windows, reservations,
//! checks, and denials that must leave no trace.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::sync::Arc;

use sluice_core::{FakeClock, FixedWindow, Limit, Mode, Nanos, Op, Store, TokenBucket};
use sluice_redis::{RedisConfig, RedisStore};

const TASKS: usize = 48;
const CALLS_PER_TASK: usize = 40;
const KEYS: usize = 6;

fn limits() -> Vec<Limit> {
    let sec = Nanos::PER_SEC;
    vec![
        Limit::new("tb", TokenBucket::new(1.0, 12.0).unwrap()),
        Limit::new(
            "tb-reserve",
            TokenBucket::new(1.0, 6.0)
                .unwrap()
                .with_max_reserved(4.0)
                .unwrap(),
        ),
        Limit::new("sharded", TokenBucket::new(4.0, 16.0).unwrap())
            .with_shards(4)
            .unwrap(),
        Limit::new(
            "fw",
            FixedWindow::new(10.0, Nanos(60 * sec))
                .unwrap()
                .with_start(Nanos(0)),
        ),
        Limit::new(
            "fw-keyed",
            FixedWindow::new(8.0, Nanos(60 * sec))
                .unwrap()
                .with_max_reserved(2.0)
                .unwrap(),
        ),
    ]
}

/// One random transaction: 1 to 3 operations on one key (one hash tag),
/// sometimes the same limit twice. Costs are multiples of ½ so sums are exact.
fn transaction(rng: &mut fastrand::Rng, limits: &[Limit]) -> (String, Vec<(usize, f64)>, Mode) {
    let key = format!("k{}", rng.usize(..KEYS));
    let n = 1 + rng.usize(..3);
    let ops = (0..n)
        .map(|_| {
            let l = rng.usize(..limits.len());
            (l, f64::from(rng.u8(0..5)) / 2.0)
        })
        .collect();
    let mode = match rng.u8(..10) {
        0 => Mode::CHECK,
        1 | 2 => Mode::RESERVE,
        _ => Mode::CONSUME,
    };
    (key, ops, mode)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_account_for_every_token() {
    let server = support::RedisServer::start();
    let clock = FakeClock::new(Nanos(1_000 * Nanos::PER_SEC));
    // The accounting is under test, not the deadline: with the default
    // 50 ms, a machine that stalls the test for that long failed it with
    // "store timed out" (seen in a full local run).
    let config = RedisConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(std::time::Duration::from_secs(5));
    let store = Arc::new(RedisStore::with_clock(config, clock.clone()).unwrap());
    let limits = Arc::new(limits());

    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (store, limits) = (store.clone(), limits.clone());
            tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(t as u64);
                // (key, limit, cost) of every operation that consumed.
                let mut taken = Vec::new();
                for _ in 0..CALLS_PER_TASK {
                    let (key, spec, mode) = transaction(&mut rng, &limits);
                    let ops: Vec<Op<'_>> = spec
                        .iter()
                        .map(|&(l, cost)| Op::new(&limits[l], &key, cost))
                        .collect();
                    let outcome = match store.transact(&ops, mode).await {
                        Ok(o) => o,
                        // A cost beyond what a reservation may take.
                        Err(sluice_core::StoreError::Cost(_)) => continue,
                        Err(e) => panic!("{e}"),
                    };
                    assert_eq!(
                        outcome.allowed,
                        outcome.decisions.iter().all(|d| d.allowed),
                        "the script and sluice-core disagree on {spec:?} {mode:?}"
                    );
                    if outcome.allowed && mode.consume {
                        taken.extend(spec.iter().map(|&(l, cost)| (key.clone(), l, cost)));
                    }
                }
                taken
            })
        })
        .collect();
    let mut taken = Vec::new();
    for task in tasks {
        taken.extend(task.await.unwrap());
    }
    let stats = store.stats();
    assert!(
        stats.remote > stats.script_calls,
        "no batching happened: {stats:?}"
    );

    for (l, limit) in limits.iter().enumerate() {
        for k in 0..KEYS {
            let key = format!("k{k}");
            let spent: f64 = taken
                .iter()
                .filter(|(tk, tl, _)| *tk == key && *tl == l)
                .map(|(_, _, cost)| cost)
                .sum();
            let value = store.value(limit, &key).await.unwrap();
            assert_eq!(
                value.tokens,
                limit.algorithm().capacity() - spent,
                "{} of {key}",
                limit.name()
            );
        }
    }
}

/// A transaction too large for one `MGET`, one `struct.unpack` of its ops or
/// one `DEL`, which the script splits into chunks, decides as the memory
/// store does: allowed whole, then denied whole by its last op, then
/// allowed again, refilling every bucket to full (so every key is deleted).
#[tokio::test]
async fn a_transaction_larger_than_the_scripts_chunks_is_one_decision() {
    const KEYS: usize = 3_500;
    let server = support::RedisServer::start();
    let clock = FakeClock::new(Nanos(1_000 * Nanos::PER_SEC));
    // A debug build encodes and decodes thousands of ops per call: more than
    // the default 50 ms on a busy machine.
    let config = RedisConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(std::time::Duration::from_secs(5));
    let redis = RedisStore::with_clock(config, clock.clone()).unwrap();
    let memory = sluice_core::MemoryStore::with_clock(clock.clone());
    let limit = Limit::new("wide", TokenBucket::new(1.0, 2.0).unwrap());
    let keys: Vec<String> = (0..KEYS).map(|i| format!("u{i}")).collect();
    let mut ops: Vec<Op<'_>> = keys.iter().map(|k| Op::new(&limit, k, 1.0)).collect();

    let first_r = redis.transact(&ops, Mode::CONSUME).await.unwrap();
    let first_m = memory.transact(&ops, Mode::CONSUME).await.unwrap();
    assert!(first_r.allowed);
    assert_eq!(first_r, first_m);

    // The first key a second time: it has one token left, so the whole
    // transaction, 3,501 ops, is denied and takes nothing.
    ops.push(Op::new(&limit, &keys[0], 1.0));
    let denied_r = redis.transact(&ops, Mode::CONSUME).await.unwrap();
    let denied_m = memory.transact(&ops, Mode::CONSUME).await.unwrap();
    assert!(!denied_r.allowed);
    assert_eq!(denied_r, denied_m);
    let last = redis.value(&limit, &keys[KEYS - 1]).await.unwrap();
    assert_eq!(last.tokens, 1.0);

    // A cost of 0 commits each bucket after a refill to full: each key
    // is then deleted, in more than one DEL.
    clock.advance(std::time::Duration::from_secs(5));
    let free: Vec<Op<'_>> = keys.iter().map(|k| Op::new(&limit, k, 0.0)).collect();
    let refill = redis.transact(&free, Mode::CONSUME).await.unwrap();
    assert!(refill.allowed);
    assert_eq!(refill, memory.transact(&free, Mode::CONSUME).await.unwrap());
    let left = support::command(server.port(), &["DBSIZE"]).unwrap();
    assert_eq!(left.trim(), ":0", "full buckets are deleted");
}
