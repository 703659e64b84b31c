//! The one Lua script that decides a batch of transactions, how operations
//! are encoded for it, and how its reply is read back.
//!
//! The script returns the state each operation saw; the decisions themselves
//! are then computed by `sluice_core::algorithm::evaluate`, the same code the
//! in-memory store runs, so the two stores cannot drift apart in what they
//! report.

use std::sync::LazyLock;

use redis::Value;
use sluice_core::algorithm::{self, State};
use sluice_core::{Algorithm, Limit, Mode, Nanos, Op, StoreError};

use crate::keys;

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("lua/transact.lua")));

/// The shared script handle (EVALSHA, reloaded on NOSCRIPT).
pub(crate) fn script() -> &'static redis::Script {
    &SCRIPT
}

/// How times are expressed inside Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeUnit {
    /// Microseconds from Redis `TIME`: every server agrees on the clock.
    RedisMicros,
    /// Nanoseconds from the caller's clock (virtual time, tests).
    ClientNanos,
}

impl TimeUnit {
    pub(crate) fn ns(self) -> i64 {
        match self {
            TimeUnit::RedisMicros => 1_000,
            TimeUnit::ClientNanos => 1,
        }
    }
}

/// One transaction, encoded.
#[derive(Debug)]
pub(crate) struct Txn {
    /// Bit 0: consume; bit 1: reserve.
    pub(crate) flags: u8,
    /// Two keys per operation: the two candidate shards (equal when unsharded).
    pub(crate) keys: Vec<String>,
    /// Seven arguments per operation: kind, five parameters, cost.
    pub(crate) args: Vec<String>,
    /// The window alignment of each operation, in nanoseconds.
    pub(crate) offsets: Vec<i64>,
}

impl Txn {
    /// Encodes `ops` (already validated) for the script.
    pub(crate) fn encode(
        prefix: &str,
        ops: &[Op<'_>],
        mode: Mode,
        unit: TimeUnit,
    ) -> Result<Txn, StoreError> {
        let mut txn = Txn {
            flags: u8::from(mode.consume) | (u8::from(mode.reserve) << 1),
            keys: Vec::with_capacity(ops.len() * 2),
            args: Vec::with_capacity(ops.len() * 7),
            offsets: Vec::with_capacity(ops.len()),
        };
        for op in ops {
            let (a, b) = op.shards();
            txn.push(prefix, op.limit, op.key, (a, b), op.cost, unit)?;
        }
        Ok(txn)
    }

    /// A check of every shard of `key` at no cost: what `value` reads.
    pub(crate) fn value(
        prefix: &str,
        limit: &Limit,
        key: &str,
        unit: TimeUnit,
    ) -> Result<Txn, StoreError> {
        let mut txn = Txn {
            flags: 0,
            keys: Vec::new(),
            args: Vec::new(),
            offsets: Vec::new(),
        };
        for s in 0..limit.shards() {
            txn.push(prefix, limit, key, (s, s), 0.0, unit)?;
        }
        Ok(txn)
    }

    fn push(
        &mut self,
        prefix: &str,
        limit: &Limit,
        key: &str,
        (a, b): (u32, u32),
        cost: f64,
        unit: TimeUnit,
    ) -> Result<(), StoreError> {
        let u = unit.ns();
        let alg = limit.shard_algorithm();
        self.keys.push(keys::shard_key(prefix, limit, key, a));
        self.keys.push(keys::shard_key(prefix, limit, key, b));
        let mr = |m: Option<f64>| m.map_or_else(|| "-1".to_owned(), |m| m.to_string());
        match alg {
            Algorithm::TokenBucket(tb) => {
                self.offsets.push(0);
                self.args.extend([
                    "1".to_owned(),
                    tb.tokens_per_period().to_string(),
                    tb.period().0.to_string(),
                    tb.burst().to_string(),
                    mr(tb.max_reserved()),
                    "0".to_owned(),
                ]);
            }
            Algorithm::FixedWindow(fw) => {
                let whole = |ns: i64, what: &str| {
                    if ns % u == 0 {
                        Ok(ns / u)
                    } else {
                        Err(StoreError::Unavailable(format!(
                            "limit {:?}: the fixed window's {what} must be a whole number of \
                             microseconds on Redis time",
                            limit.name()
                        )))
                    }
                };
                let period = whole(fw.period().0, "period")?;
                let origin = match fw.start() {
                    Some(start) => whole(start.0, "start")?,
                    // The key's own alignment, rounded to the unit so the
                    // script and the decision agree on it.
                    None => algorithm::key_offset(alg, key).div_euclid(u),
                };
                self.offsets.push(origin * u);
                self.args.extend([
                    "2".to_owned(),
                    fw.rate().to_string(),
                    period.to_string(),
                    fw.capacity().to_string(),
                    mr(fw.max_reserved()),
                    origin.to_string(),
                ]);
            }
        }
        self.args.push(cost.to_string());
        Ok(())
    }

    /// The Cluster slot of the transaction, or `None` if its keys span slots.
    pub(crate) fn slot(&self) -> Option<u16> {
        let mut slots = self.keys.iter().map(|k| keys::slot(k));
        let first = slots.next()?;
        slots.all(|s| s == first).then_some(first)
    }
}

/// What the script said about one operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Seen {
    /// Which candidate key was used: 0 or 1.
    pub(crate) pick: u8,
    /// The state the operation saw, with its time in nanoseconds.
    pub(crate) state: Option<State>,
}

/// What the script said about one transaction.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TxnReply {
    pub(crate) allowed: bool,
    pub(crate) now: Nanos,
    pub(crate) ops: Vec<Seen>,
}

/// Builds one script call deciding `txns` in order.
pub(crate) fn invocation<'a>(
    txns: &[&Txn],
    unit: TimeUnit,
    now: Option<Nanos>,
    min_ttl_ms: u64,
) -> redis::ScriptInvocation<'a> {
    let mut inv = script().prepare_invoke();
    // The same key in two transactions of a batch gets one index, so that a
    // transaction naming a key twice sees its own pending write.
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut key_args: Vec<usize> = Vec::new();
    for txn in txns {
        for k in &txn.keys {
            let next = index.len() + 1;
            let i = *index.entry(k.as_str()).or_insert_with(|| {
                inv.key(k.as_str());
                next
            });
            key_args.push(i);
        }
    }
    inv.arg(unit.ns());
    match now {
        Some(now) => inv.arg(now.0.div_euclid(unit.ns())),
        None => inv.arg(""),
    };
    inv.arg(txns.len());
    inv.arg(min_ttl_ms);
    let mut keys = key_args.into_iter();
    for txn in txns {
        let ops = txn.keys.len() / 2;
        inv.arg(txn.flags);
        inv.arg(ops);
        for op in 0..ops {
            inv.arg(keys.next().unwrap_or(1));
            inv.arg(keys.next().unwrap_or(1));
            for a in &txn.args[op * 7..op * 7 + 7] {
                inv.arg(a.as_str());
            }
        }
    }
    inv
}

fn malformed(what: &str) -> StoreError {
    StoreError::Unavailable(format!("unexpected reply from the Redis script: {what}"))
}

/// Reads the script's reply: one [`TxnReply`] per transaction, in order.
pub(crate) fn parse_reply(
    value: Value,
    unit: TimeUnit,
    expect: &[usize],
) -> Result<Vec<TxnReply>, StoreError> {
    let Value::Array(items) = value else {
        return Err(malformed("not an array"));
    };
    let mut items = items.into_iter();
    let now = match items.next() {
        Some(Value::Int(n)) => Nanos(n.saturating_mul(unit.ns())),
        _ => return Err(malformed("no time")),
    };
    let replies: Vec<TxnReply> = items
        .zip(expect)
        .map(|(item, &ops)| parse_txn(item, unit, now, ops))
        .collect::<Result<_, _>>()?;
    if replies.len() != expect.len() {
        return Err(malformed("too few transactions"));
    }
    Ok(replies)
}

fn parse_txn(item: Value, unit: TimeUnit, now: Nanos, ops: usize) -> Result<TxnReply, StoreError> {
    let Value::Array(fields) = item else {
        return Err(malformed("transaction is not an array"));
    };
    if fields.len() != 1 + 2 * ops {
        return Err(malformed("wrong number of fields"));
    }
    let mut fields = fields.into_iter();
    let allowed = matches!(fields.next(), Some(Value::Int(1)));
    let mut seen = Vec::with_capacity(ops);
    while let (Some(pick), Some(state)) = (fields.next(), fields.next()) {
        let pick = match pick {
            Value::Int(1) => 1,
            _ => 0,
        };
        let state = match state {
            Value::Nil => None,
            Value::BulkString(b) => Some(decode_state(&b, unit)?),
            _ => return Err(malformed("state is not a string")),
        };
        seen.push(Seen { pick, state });
    }
    Ok(TxnReply {
        allowed,
        now,
        ops: seen,
    })
}

/// A stored state: two little-endian doubles, tokens and time in `unit`s.
pub(crate) fn decode_state(bytes: &[u8], unit: TimeUnit) -> Result<State, StoreError> {
    let (Some(t), Some(ts)) = (bytes.get(0..8), bytes.get(8..16)) else {
        return Err(malformed("state is not 16 bytes"));
    };
    let double = |b: &[u8]| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        f64::from_le_bytes(a)
    };
    // Whole numbers of units below 2⁵³, so the conversion is exact.
    let ts = double(ts) as i64;
    Ok(State {
        tokens: double(t),
        ts: Nanos(ts.saturating_mul(unit.ns())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_decode_and_bad_replies_are_errors() {
        let mut b = 2.5f64.to_le_bytes().to_vec();
        b.extend(7.0f64.to_le_bytes());
        let s = decode_state(&b, TimeUnit::RedisMicros).unwrap();
        assert_eq!(s.tokens, 2.5);
        assert_eq!(s.ts, Nanos(7_000));
        assert!(decode_state(&b[..15], TimeUnit::ClientNanos).is_err());

        let ok = Value::Array(vec![
            Value::Int(5),
            Value::Array(vec![Value::Int(1), Value::Int(0), Value::Nil]),
        ]);
        let r = parse_reply(ok, TimeUnit::ClientNanos, &[1]).unwrap();
        assert!(r[0].allowed);
        assert_eq!(r[0].now, Nanos(5));
        assert_eq!(r[0].ops[0].state, None);
        assert!(parse_reply(Value::Int(3), TimeUnit::ClientNanos, &[1]).is_err());
        let short = Value::Array(vec![Value::Int(5)]);
        assert!(parse_reply(short, TimeUnit::ClientNanos, &[1]).is_err());
    }
}
