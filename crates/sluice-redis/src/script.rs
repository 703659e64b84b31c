//! The one Lua script that decides a batch of transactions, how a batch is
//! encoded for it, and how its reply is read back.
//!
//! The script returns the state each operation saw; the decisions themselves
//! are then computed by `sluice_core::algorithm::evaluate`, the same code the
//! in-memory store runs, so the two stores cannot drift apart in what they
//! report.
//!
//! Numbers cross the wire as little-endian doubles packed into three binary
//! arguments per batch (the limits, the operations, and the few operations'
//! extras), decoded with `struct.unpack` in the script. That keeps them
//! bit-exact without formatting or parsing decimal text, and a batch costs
//! six arguments plus its keys whatever its size. Each distinct limit
//! configuration of a batch is sent once and referred to by index.

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::{Cmd, Value};
use sluice_core::algorithm::{self, State};
use sluice_core::sliding::{LogReading, MAX_LOG_ENTRIES, WindowState};
use sluice_core::{Algorithm, Calendar, FixedWindow, Limit, Mode, Nanos, Op, Settle, StoreError};
use smallvec::SmallVec;

use crate::keys;
use crate::seen::SeenState;

/// Names the script's files once, in the order they are joined: the script
/// is their text with a blank line between each (the join's, so that no
/// file ends in one). Lua sees a local only after its definition, so the
/// files come in the order of their definitions.
macro_rules! lua_files {
    ($first:literal $(, $rest:literal)* $(,)?) => {
        /// The files of the Lua script, in `src/lua`, in the order they are
        /// joined. Not an API: `tests/lua_mirror.rs` reads the twins in them.
        #[doc(hidden)]
        pub const LUA_FILES: &[&str] = &[$first $(, $rest)*];

        /// The Lua script.
        const LUA_SOURCE: &str = concat!(
            include_str!(concat!("lua/", $first))
            $(, "\n", include_str!(concat!("lua/", $rest)))*
        );
    };
}

lua_files!(
    // What the script does, its arguments and its reply; the arguments
    // decoded, and every key's state read.
    "decode.lua",
    // Token buckets, fixed and calendar windows (algorithm.rs), a key that
    // changed kind brought back, and the reply's buffer.
    "algorithm.lua",
    // Sliding windows (sliding.rs).
    "sliding_window.lua",
    // Sliding logs (sliding.rs's Log), and the records that a log and a
    // key's leases are made of.
    "sliding_log.lua",
    // An op on a sliding limit (a window, a log or concurrency) decided.
    "sliding_op.lua",
    // A transaction's pending writes and what a key holds for it; then
    // settling and concurrency's leases (concurrency.rs), made on the first
    // op that needs them.
    "rare.lua",
    // The batch decided, op by op.
    "batch.lua",
    // Each key written once, with its TTL; the reply.
    "write.lua",
);

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(LUA_SOURCE));

/// The shared script handle: its hash for EVALSHA, its source for reloading
/// it after NOSCRIPT.
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

/// One operation, owned, as the dispatcher needs it (the caller's [`Op`]
/// borrows).
#[derive(Debug)]
pub(crate) struct TxnOp {
    /// The first candidate key.
    key_a: String,
    /// The second candidate key, when the limit is sharded and it differs.
    key_b: Option<String>,
    /// The shard's algorithm.
    alg: Algorithm,
    cost: f64,
    /// The window alignment of a fixed or sliding window, in units.
    origin: i64,
    /// The lease a call on a concurrency limit takes or releases.
    lease: u64,
}

/// One transaction, ready to be batched.
#[derive(Debug)]
pub(crate) struct Txn {
    /// Bit 0: consume; bit 1: reserve; bit 5: a forced charge; bit 6: a
    /// refund (both: a charge unless in debt); bit 7: a release (the
    /// script's `ctl`).
    flags: u8,
    ops: SmallVec<[TxnOp; 1]>,
    unit: TimeUnit,
}

impl Txn {
    /// Encodes `ops` (already validated and not empty) for the script.
    pub(crate) fn encode(
        prefix: &str,
        ops: &[Op<'_>],
        mode: Mode,
        unit: TimeUnit,
    ) -> Result<Txn, StoreError> {
        let mut txn = Txn {
            flags: u8::from(mode.consume) | (u8::from(mode.reserve) << 1),
            ops: SmallVec::with_capacity(ops.len()),
            unit,
        };
        for op in ops {
            txn.push(prefix, op.limit, op.key, op.shards(), op.cost, op.lease)?;
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
            ops: SmallVec::with_capacity(limit.shards() as usize),
            unit,
        };
        for s in 0..limit.shards() {
            txn.push(prefix, limit, key, (s, s), 0.0, 0)?;
        }
        Ok(txn)
    }

    /// A release of lease `id` from every shard of `key` (the one that
    /// took it holds it).
    pub(crate) fn release(
        prefix: &str,
        limit: &Limit,
        key: &str,
        id: u64,
        unit: TimeUnit,
    ) -> Result<Txn, StoreError> {
        let mut txn = Txn {
            flags: 1 | 128,
            ops: SmallVec::with_capacity(limit.shards() as usize),
            unit,
        };
        for s in 0..limit.shards() {
            txn.push(prefix, limit, key, (s, s), 0.0, id)?;
        }
        Ok(txn)
    }

    /// A settlement of every shard of `key`, each an even part of `change`
    /// (already validated): committed whatever the keys hold.
    pub(crate) fn settle(
        prefix: &str,
        limit: &Limit,
        key: &str,
        change: Settle,
        unit: TimeUnit,
    ) -> Result<Txn, StoreError> {
        let part = change.per_shard(limit.shards());
        let mut txn = Txn {
            flags: match change {
                Settle::Charge(_) => 1 | 32,
                Settle::Refund(_) => 1 | 64,
                Settle::ChargeOnce(_) => 1 | 96,
            },
            ops: SmallVec::with_capacity(limit.shards() as usize),
            unit,
        };
        for s in 0..limit.shards() {
            txn.push(prefix, limit, key, (s, s), part.amount(), 0)?;
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
        lease: u64,
    ) -> Result<(), StoreError> {
        let u = self.unit.ns();
        let alg = *limit.shard_algorithm();
        let whole = |ns: i64, what: &str| {
            if ns % u == 0 {
                Ok(ns / u)
            } else {
                Err(StoreError::Unavailable(format!(
                    "limit {:?}: the {} algorithm's {what} must be a whole number of \
                     microseconds on Redis time",
                    limit.name(),
                    alg.name()
                )))
            }
        };
        // The window's alignment: its `start`, or the key's own, rounded to
        // the unit so that the script and the decision agree on it.
        let aligned = |period: Nanos, start: Option<Nanos>| -> Result<i64, StoreError> {
            whole(period.0, "period")?;
            match start {
                Some(start) => whole(start.0, "start"),
                None => Ok(algorithm::key_offset(&alg, key).div_euclid(u)),
            }
        };
        let origin = match &alg {
            Algorithm::TokenBucket(_) => 0,
            Algorithm::FixedWindow(fw) => aligned(fw.period(), fw.start())?,
            Algorithm::SlidingWindow(sw) => aligned(sw.period(), sw.start())?,
            Algorithm::SlidingLog(sl) => {
                whole(sl.period().0, "period")?;
                0
            }
            Algorithm::Concurrency(c) => {
                whole(c.lease().0, "lease")?;
                0
            }
        };
        self.ops.push(TxnOp {
            key_a: keys::shard_key(prefix, limit, key, a),
            key_b: (b != a).then(|| keys::shard_key(prefix, limit, key, b)),
            alg,
            cost,
            origin,
            lease,
        });
        Ok(())
    }

    /// How many operations the transaction has.
    pub(crate) fn len(&self) -> usize {
        self.ops.len()
    }

    /// The window alignment of each operation, in nanoseconds: the `offset`
    /// of `algorithm::evaluate`.
    pub(crate) fn offsets(&self) -> impl Iterator<Item = i64> + '_ {
        let u = self.unit.ns();
        self.ops.iter().map(move |op| op.origin * u)
    }

    /// The Redis key operation `i` used, given the script's `pick`.
    pub(crate) fn key(&self, i: usize, pick: u8) -> Option<&str> {
        let op = self.ops.get(i)?;
        match (pick, &op.key_b) {
            (1, Some(b)) => Some(b),
            _ => Some(&op.key_a),
        }
    }

    /// Each Redis key the transaction may use, with the algorithm it is
    /// read under.
    pub(crate) fn keys(&self) -> impl Iterator<Item = (&str, &Algorithm)> + '_ {
        self.ops.iter().flat_map(|op| {
            std::iter::once(op.key_a.as_str())
                .chain(op.key_b.as_deref())
                .map(move |k| (k, &op.alg))
        })
    }

    /// The Cluster slot of the transaction, or `None` if its keys span slots.
    pub(crate) fn slot(&self) -> Option<u16> {
        let mut slots = self
            .ops
            .iter()
            .flat_map(|op| std::iter::once(&op.key_a).chain(&op.key_b))
            .map(|k| keys::slot(k));
        let first = slots.next()?;
        slots.all(|s| s == first).then_some(first)
    }
}

/// Distinct limit configurations looked for before a batch just repeats one:
/// a batch rarely has more, and repeating is only a few bytes.
const LIMIT_SCAN: usize = 16;

/// Appends a limit record for the script, with times in units of `u` ns.
fn push_limit(out: &mut Vec<u8>, alg: &Algorithm, u: i64) {
    // The script reserves up to this bound, which is never unlimited: see
    // `Algorithm::reservable`.
    let mr = alg.reservable();
    let (kind, p) = match alg {
        Algorithm::TokenBucket(tb) => (
            1u8,
            [
                tb.tokens_per_period(),
                // The same conversion as algorithm.rs's refill, so the
                // script divides by the same double.
                tb.period().0 as f64,
                tb.capacity(),
                mr,
            ],
        ),
        Algorithm::FixedWindow(fw) if fw.calendar().is_some() => (
            6u8,
            [fw.rate(), fw.debt_windows() as f64, fw.capacity(), mr],
        ),
        // Periods are checked to be whole numbers of units in `Txn::push`.
        Algorithm::FixedWindow(fw) => (
            2u8,
            [fw.rate(), (fw.period().0 / u) as f64, fw.capacity(), mr],
        ),
        Algorithm::SlidingWindow(sw) => (3u8, [sw.rate(), (sw.period().0 / u) as f64, 0.0, 0.0]),
        Algorithm::SlidingLog(sl) => (
            4u8,
            [
                sl.rate(),
                (sl.period().0 / u) as f64,
                MAX_LOG_ENTRIES as f64,
                0.0,
            ],
        ),
        Algorithm::Concurrency(c) => (5u8, [c.max(), (c.lease().0 / u) as f64, 0.0, 0.0]),
    };
    out.push(kind);
    for x in p {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Appends a calendar window's boundaries for the script: every one that
/// can matter to a call at `at` (in units of `u` ns), with their count.
///
/// A call rolls a key over the boundaries since its last write, and looks
/// ahead to the one that fills it again (its TTL, and how full a key of
/// another kind comes back): none of them further than the windows a key
/// can be short of full, its capacity and its deepest debt, each at most
/// `CALENDAR_WINDOWS` windows' rate. One more on each side covers a Redis
/// clock on the other side of a boundary from the client's.
fn push_boundaries(out: &mut Vec<u8>, fw: &FixedWindow, cal: Calendar, at: Nanos, u: i64) {
    let short = (fw.capacity() / fw.rate()).ceil() as i64 + fw.debt_windows() + 2;
    let here = cal.index(at);
    let key = (cal, here, short, u);
    // The list changes only when a window passes: each thread keeps the
    // last few it encoded, rather than look up to 133 boundaries in the tz
    // database for every batch.
    BOUNDARIES.with_borrow_mut(|kept| {
        if let Some((_, bytes)) = kept.iter().find(|(k, _)| *k == key) {
            out.extend_from_slice(bytes);
            return;
        }
        let (first, last) = (here.saturating_sub(short), here.saturating_add(short));
        let mut bytes = Vec::with_capacity(8 * (2 * short as usize + 2));
        bytes.extend_from_slice(&((last - first + 1) as f64).to_le_bytes());
        for i in first..=last {
            // Boundaries fall on whole seconds (every offset in the tz
            // database is), so a unit of Redis time divides them.
            let b = cal.start(i).0.div_euclid(u);
            bytes.extend_from_slice(&(b as f64).to_le_bytes());
        }
        out.extend_from_slice(&bytes);
        if kept.len() == KEPT_BOUNDARIES {
            kept.remove(0);
        }
        kept.push((key, bytes));
    });
}

/// A calendar's boundaries as encoded for the script: the calendar, the
/// window of the client's time, how many on each side, the unit of time.
type BoundariesKey = (Calendar, i64, i64, i64);

/// How many boundary lists a thread keeps: a few calendar limits' worth.
const KEPT_BOUNDARIES: usize = 4;

thread_local! {
    static BOUNDARIES: std::cell::RefCell<Vec<(BoundariesKey, Vec<u8>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Builds one script call deciding `txns` in order; `at` is the client's
/// time, which the boundaries of calendar windows are found around.
pub(crate) fn invocation<'a>(
    txns: impl Iterator<Item = &'a Txn> + Clone,
    unit: TimeUnit,
    now: Option<Nanos>,
    at: Nanos,
    min_ttl_ms: u64,
) -> Cmd {
    let u = unit.ns();
    let nops: usize = txns.clone().map(Txn::len).sum();
    // The same key in two transactions of a batch gets one index, so that
    // each sees what the ones before it wrote.
    let mut index: HashMap<&str, u32> = HashMap::with_capacity(nops);
    let mut key_list: Vec<&str> = Vec::with_capacity(nops);
    let mut limits: SmallVec<[&Algorithm; 4]> = SmallVec::new();
    let mut limit_blob: Vec<u8> = Vec::with_capacity(33 * 2);
    let mut op_blob: Vec<u8> = Vec::with_capacity(17 * nops);
    let mut extra_blob: Vec<u8> = Vec::new();
    let mut calendar_blob: Vec<u8> = Vec::new();
    let mut key_bytes = 0;
    let mut key_of = |k: &'a str| -> u32 {
        let next = key_list.len() as u32 + 1;
        *index.entry(k).or_insert_with(|| {
            key_list.push(k);
            key_bytes += k.len();
            next
        })
    };
    for txn in txns {
        let n = txn.ops.len();
        for (i, op) in txn.ops.iter().enumerate() {
            let a = key_of(&op.key_a);
            let b = op.key_b.as_deref().map_or(a, &mut key_of);
            let l = match limits.iter().take(LIMIT_SCAN).position(|&x| *x == op.alg) {
                Some(i) => i + 1,
                None => {
                    limits.push(&op.alg);
                    push_limit(&mut limit_blob, &op.alg, u);
                    if let Algorithm::FixedWindow(fw) = &op.alg
                        && let Some(cal) = fw.calendar()
                    {
                        push_boundaries(&mut calendar_blob, fw, cal, at, u);
                    }
                    limits.len()
                }
            };
            // Only a sharded limit's second key and a window's origin need
            // the extra record; most ops go without.
            let extra = b != a
                || matches!(
                    op.alg,
                    Algorithm::FixedWindow(_)
                        | Algorithm::SlidingWindow(_)
                        | Algorithm::Concurrency(_)
                );
            let ctl = txn.flags
                | (u8::from(i == 0) << 2)
                | (u8::from(i + 1 == n) << 3)
                | (u8::from(extra) << 4);
            op_blob.push(ctl);
            op_blob.extend_from_slice(&a.to_le_bytes());
            op_blob.extend_from_slice(&(l as u32).to_le_bytes());
            op_blob.extend_from_slice(&op.cost.to_le_bytes());
            if extra {
                // A lease id is below 2^53: the double holds it exactly.
                let second = match op.alg {
                    Algorithm::Concurrency(_) => op.lease as f64,
                    _ => op.origin as f64,
                };
                extra_blob.extend_from_slice(&b.to_le_bytes());
                extra_blob.extend_from_slice(&second.to_le_bytes());
            }
        }
    }
    let mut cmd = Cmd::with_capacity(
        10 + key_list.len(),
        96 + key_bytes + limit_blob.len() + op_blob.len() + extra_blob.len() + calendar_blob.len(),
    );
    cmd.arg("EVALSHA")
        .arg(script().get_hash())
        .arg(key_list.len());
    for k in &key_list {
        cmd.arg(*k);
    }
    cmd.arg(u);
    match now {
        Some(now) => cmd.arg(now.0.div_euclid(u)),
        None => cmd.arg(""),
    };
    cmd.arg(min_ttl_ms)
        .arg(limit_blob)
        .arg(op_blob)
        .arg(extra_blob)
        .arg(calendar_blob);
    cmd
}

/// What the script said about one operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Seen {
    /// Which candidate key was used: 0 or 1.
    pub(crate) pick: u8,
    /// A release found the lease it named.
    pub(crate) released: bool,
    /// What the operation saw, with times in nanoseconds.
    pub(crate) state: SeenState,
}

/// What the script said about one transaction.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TxnReply {
    pub(crate) allowed: bool,
    pub(crate) now: Nanos,
    pub(crate) ops: SmallVec<[Seen; 2]>,
}

fn malformed(what: &str) -> StoreError {
    StoreError::Unavailable(format!("unexpected reply from the Redis script: {what}"))
}

/// Reads the script's reply: its time, and the packed decisions, handed out
/// one [`TxnReply`] per transaction, in order, by [`Replies::next_txn`].
pub(crate) fn parse_reply(value: Value, unit: TimeUnit) -> Result<Replies, StoreError> {
    let Value::Array(items) = value else {
        return Err(malformed("not an array"));
    };
    let mut items = items.into_iter();
    let now = match items.next() {
        Some(Value::Int(n)) => Nanos(n.saturating_mul(unit.ns())),
        _ => return Err(malformed("no time")),
    };
    let Some(Value::BulkString(bytes)) = items.next() else {
        return Err(malformed("no decisions"));
    };
    Ok(Replies {
        bytes,
        at: 0,
        now,
        unit,
    })
}

/// The decisions of a batch, read transaction by transaction.
#[derive(Debug)]
pub(crate) struct Replies {
    bytes: Vec<u8>,
    at: usize,
    now: Nanos,
    unit: TimeUnit,
}

impl Replies {
    fn take(&mut self, n: usize) -> Result<&[u8], StoreError> {
        let b = self
            .bytes
            .get(self.at..self.at + n)
            .ok_or_else(|| malformed("too short"))?;
        self.at += n;
        Ok(b)
    }

    /// The next transaction's reply: `txn`'s.
    pub(crate) fn next_txn(&mut self, txn: &Txn) -> Result<TxnReply, StoreError> {
        let allowed = self.take(1)?[0] == 1;
        let unit = self.unit;
        let mut seen = SmallVec::with_capacity(txn.ops.len());
        for op in &txn.ops {
            let tag = self.take(1)?[0];
            let has = tag & 2 != 0;
            let state = match op.alg {
                alg @ (Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_)) => {
                    let state = if has {
                        Some(decode_state(self.take(16)?, unit)?)
                    } else {
                        None
                    };
                    SeenState::Flat(alg, state)
                }
                Algorithm::SlidingWindow(sw) => {
                    let state = if has {
                        let [cur, ws, prev] = doubles(self.take(24)?);
                        Some(WindowState {
                            ws: units(ws, unit),
                            cur,
                            prev,
                        })
                    } else {
                        None
                    };
                    SeenState::Window(sw, state)
                }
                Algorithm::SlidingLog(sl) => SeenState::Log(sl, self.reading(tag, has)?),
                // Leases count as a log whose window is the lease.
                Algorithm::Concurrency(c) => SeenState::Log(c.as_log(), self.reading(tag, has)?),
            };
            seen.push(Seen {
                pick: tag & 1,
                released: tag & 8 != 0,
                state,
            });
        }
        Ok(TxnReply {
            allowed,
            now: self.now,
            ops: seen,
        })
    }

    /// A sliding log's or a concurrency key's reading, which every op on
    /// one carries; `tag` is its op's byte.
    fn reading(&mut self, tag: u8, has: bool) -> Result<LogReading, StoreError> {
        if !has {
            return Err(malformed("a sliding log's reading is missing"));
        }
        let unit = self.unit;
        let [at, used, newest, frees_at] = doubles(self.take(32)?);
        Ok(LogReading {
            at: units(at, unit),
            used,
            newest: (tag & 4 != 0).then(|| units(newest, unit)),
            frees_at: units(frees_at, unit),
        })
    }

    /// Whether every transaction has been read, and nothing is left over.
    pub(crate) fn finished(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// `N` little-endian doubles, from exactly `8 * N` bytes.
fn doubles<const N: usize>(bytes: &[u8]) -> [f64; N] {
    let mut out = [0.0; N];
    for (x, b) in out.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        *x = f64::from_le_bytes(a);
    }
    out
}

/// A time the script sent, in `unit`s: whole numbers below 2⁵³, so the
/// conversion is exact.
fn units(t: f64, unit: TimeUnit) -> Nanos {
    Nanos((t as i64).saturating_mul(unit.ns()))
}

/// A stored state: two little-endian doubles, tokens and time in `unit`s.
pub(crate) fn decode_state(bytes: &[u8], unit: TimeUnit) -> Result<State, StoreError> {
    if bytes.len() != 16 {
        return Err(malformed("state is not 16 bytes"));
    }
    let [tokens, ts] = doubles(bytes);
    Ok(State {
        tokens,
        ts: units(ts, unit),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{SlidingLog, TokenBucket};

    fn txn(limit: &Limit) -> Txn {
        let op = Op::new(limit, "k", 1.0);
        Txn::encode("p:", &[op], Mode::CONSUME, TimeUnit::ClientNanos).unwrap()
    }

    #[test]
    fn states_decode_and_bad_replies_are_errors() {
        let mut b = 2.5f64.to_le_bytes().to_vec();
        b.extend(7.0f64.to_le_bytes());
        let s = decode_state(&b, TimeUnit::RedisMicros).unwrap();
        assert_eq!(s.tokens, 2.5);
        assert_eq!(s.ts, Nanos(7_000));
        assert!(decode_state(&b[..15], TimeUnit::ClientNanos).is_err());

        let bucket = Limit::new("b", TokenBucket::new(1.0, 5.0).unwrap());
        let one = txn(&bucket);
        // Two transactions: one allowed op that saw no state; one denied
        // op that used its second key and saw `b`.
        let mut blob = vec![1, 0, 0, 3];
        blob.extend(&b);
        let ok = Value::Array(vec![Value::Int(5), Value::BulkString(blob)]);
        let mut r = parse_reply(ok, TimeUnit::ClientNanos).unwrap();
        let first = r.next_txn(&one).unwrap();
        assert!(first.allowed);
        assert_eq!(first.now, Nanos(5));
        assert_eq!(first.ops[0].state.flat(), None);
        assert!(!r.finished());
        let second = r.next_txn(&one).unwrap();
        assert!(!second.allowed);
        assert_eq!(second.ops[0].pick, 1);
        let state = State {
            tokens: 2.5,
            ts: Nanos(7),
        };
        assert_eq!(second.ops[0].state.flat(), Some(state));
        assert!(r.finished());
        assert!(r.next_txn(&one).is_err());

        assert!(parse_reply(Value::Int(3), TimeUnit::ClientNanos).is_err());
        let short = Value::Array(vec![Value::Int(5)]);
        assert!(parse_reply(short, TimeUnit::ClientNanos).is_err());
    }

    #[test]
    fn a_sliding_log_reading_decodes_with_and_without_a_newest_entry() {
        let sl = SlidingLog::per_period(3.0, Nanos(Nanos::PER_SEC)).unwrap();
        let log = txn(&Limit::new("l", sl));
        let record = |tag: u8, fields: [f64; 4]| {
            let mut b = vec![tag];
            for x in fields {
                b.extend(x.to_le_bytes());
            }
            b
        };
        let mut blob = vec![1];
        blob.extend(record(6, [9.0, 2.0, 4.0, 9.0]));
        blob.push(1);
        blob.extend(record(2, [9.0, 0.0, 0.0, 9.0]));
        let reply = Value::Array(vec![Value::Int(9), Value::BulkString(blob)]);
        let mut r = parse_reply(reply, TimeUnit::RedisMicros).unwrap();
        let reading = |t: TxnReply| match t.ops[0].state {
            SeenState::Log(_, r) => r,
            other => panic!("not a log reading: {other:?}"),
        };
        let full = reading(r.next_txn(&log).unwrap());
        assert_eq!(
            full,
            LogReading {
                at: Nanos(9_000),
                used: 2.0,
                newest: Some(Nanos(4_000)),
                frees_at: Nanos(9_000),
            }
        );
        assert_eq!(reading(r.next_txn(&log).unwrap()).newest, None);
        assert!(r.finished());

        // A log op always carries its reading.
        let bare = Value::Array(vec![Value::Int(9), Value::BulkString(vec![1, 0])]);
        let mut r = parse_reply(bare, TimeUnit::RedisMicros).unwrap();
        assert!(r.next_txn(&log).is_err());
    }
}
