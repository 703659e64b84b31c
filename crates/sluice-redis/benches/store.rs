//! Decisions per second and per-call latency of [`RedisStore`] next to a
//! naive Redis rate limiter, in the same run against the same `redis-server`.
//!
//! The benchmark starts its own `redis-server` on a free loopback port (the
//! integration tests' harness; it must be on `PATH`) and runs each scenario
//! once per side, with `FLUSHALL` in between:
//!
//! - `naive`: one `EVALSHA` per decision of a classic token-bucket script
//!   (`HMGET` tokens and last refill, refill by the elapsed time the client
//!   passes, take one token if there is one, `HMSET`, `EXPIRE`), over one
//!   shared multiplexed connection that every task clones, so concurrent
//!   calls are pipelined on it;
//! - `sluice`: [`RedisStore`] with its defaults (batching and the deny cache
//!   on), `store.decide(Op::new(&limit, &key, 1.0), Mode::CONSUME)`.
//!
//! Scenarios, each with 64 concurrent tasks on a 2-worker Tokio runtime:
//!
//! - `mixed`: keys `user:%08d` drawn uniformly from 10 000, limit 100/s with a
//!   burst of 100, so nearly every call is allowed;
//! - `abuse`: 90% of calls go to 100 abusive keys limited to 1/s with a burst
//!   of 1, so nearly all of those are denied; 10% go to the 10 000 normal
//!   keys of `mixed`, which are allowed.
//!
//! Every task calls in a loop for a warm-up of 0.5 s and then for the measured
//! duration, 3 s (`SLUICE_BENCH_SECS` overrides it). Calls that start in the
//! measured window count: the report has decisions per second, the p50 and
//! p99 latency of single calls, the allowed share, errors, the throughput
//! ratio sluice/naive per scenario, and the store's counters over the window.
//!
//! Run it with `cargo bench -p sluice-redis --bench store`. Without `--bench`
//! on its command line (as under `cargo test --benches`) it makes a short
//! smoke pass instead.

// A benchmark binary: a setup failure should abort loudly, and its stdout is
// its report.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use sluice_core::{Limit, Mode, Op, Store, TokenBucket};
use sluice_redis::{RedisConfig, RedisStats, RedisStore};

/// Concurrent callers per scenario and side.
const TASKS: usize = 64;
/// Tokio worker threads (the machine has two cores; redis-server shares them).
const WORKERS: usize = 2;
/// Calls before the measured window, not counted.
const WARM_UP: Duration = Duration::from_millis(500);
/// The measured window unless `SLUICE_BENCH_SECS` says otherwise.
const DEFAULT_SECS: f64 = 3.0;
/// The measured window of a smoke pass (no `--bench` argument).
const SMOKE_SECS: f64 = 0.2;
/// Normal keys, in both scenarios.
const NORMAL_KEYS: usize = 10_000;
/// Abusive keys in the `abuse` scenario.
const HOT_KEYS: usize = 100;
/// The share of `abuse` calls that go to an abusive key.
const HOT_SHARE: f64 = 0.9;

/// The classic per-call token bucket: the baseline. Written for this
/// benchmark; state is a hash with the tokens and the last refill time in
/// seconds, as the client's clock reported it.
const NAIVE_SCRIPT: &str = r"
-- KEYS[1]: the bucket. ARGV: capacity, rate (tokens/s), now (s), ttl (s).
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'last_refill')
local tokens = tonumber(state[1])
local last = tonumber(state[2])
if tokens == nil or last == nil then
  tokens = capacity
  last = now
end
local elapsed = now - last
if elapsed < 0 then elapsed = 0 end
tokens = math.min(capacity, tokens + elapsed * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HMSET', KEYS[1], 'tokens', tokens, 'last_refill', now)
redis.call('EXPIRE', KEYS[1], ttl)
return {allowed, math.floor(tokens)}
";

/// One limit as both sides see it.
struct Bucket {
    /// Sluice's limit.
    limit: Limit,
    /// Tokens per second, for the naive script.
    rate: f64,
    /// Capacity, for the naive script.
    burst: f64,
    /// Seconds until an empty bucket is full, plus one: the naive key's TTL.
    ttl_secs: u64,
}

impl Bucket {
    fn new(name: &str, rate: f64, burst: f64) -> Bucket {
        Bucket {
            limit: Limit::new(name, TokenBucket::new(rate, burst).unwrap()),
            rate,
            burst,
            ttl_secs: (burst / rate).ceil() as u64 + 1,
        }
    }
}

/// Which keys a scenario calls, and under which limits.
struct Workload {
    name: &'static str,
    normal_keys: Vec<String>,
    normal: Bucket,
    hot_keys: Vec<String>,
    hot: Bucket,
    /// The share of calls that go to a hot key.
    hot_share: f64,
}

impl Workload {
    fn mixed() -> Workload {
        Workload {
            name: "mixed",
            hot_share: 0.0,
            ..Workload::abuse()
        }
    }

    fn abuse() -> Workload {
        Workload {
            name: "abuse",
            normal_keys: (0..NORMAL_KEYS).map(|i| format!("user:{i:08}")).collect(),
            normal: Bucket::new("api", 100.0, 100.0),
            hot_keys: (0..HOT_KEYS).map(|i| format!("abuser:{i:08}")).collect(),
            hot: Bucket::new("abuse", 1.0, 1.0),
            hot_share: HOT_SHARE,
        }
    }

    /// The next call's key and limit.
    fn pick(&self, rng: &mut fastrand::Rng) -> (&str, &Bucket) {
        if self.hot_share > 0.0 && rng.f64() < self.hot_share {
            (&self.hot_keys[rng.usize(..self.hot_keys.len())], &self.hot)
        } else {
            (
                &self.normal_keys[rng.usize(..self.normal_keys.len())],
                &self.normal,
            )
        }
    }
}

/// The two contestants.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Naive,
    Sluice,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Naive => "naive",
            Side::Sluice => "sluice",
        }
    }
}

/// What one task calls through.
#[derive(Clone)]
enum Caller {
    Naive {
        conn: MultiplexedConnection,
        script: Arc<redis::Script>,
    },
    Sluice(Arc<RedisStore>),
}

impl Caller {
    /// One decision: whether it was allowed, or `None` on an error.
    async fn decide(&mut self, key: &str, bucket: &Bucket) -> Option<bool> {
        match self {
            Caller::Naive { conn, script } => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_secs_f64();
                let reply: redis::RedisResult<(i64, i64)> = script
                    .key(format!("naive:{key}:{}", bucket.limit.name()))
                    .arg(bucket.burst)
                    .arg(bucket.rate)
                    .arg(now)
                    .arg(bucket.ttl_secs)
                    .invoke_async(conn)
                    .await;
                reply.ok().map(|(allowed, _remaining)| allowed == 1)
            }
            Caller::Sluice(store) => store
                .decide(Op::new(&bucket.limit, key, 1.0), Mode::CONSUME)
                .await
                .ok()
                .map(|d| d.allowed),
        }
    }
}

/// What one task saw in the measured window.
#[derive(Default)]
struct Tally {
    allowed: u64,
    denied: u64,
    errors: u64,
    /// The latency of every successful call, in microseconds.
    latencies_us: Vec<u32>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.errors += other.errors;
        self.latencies_us.extend(other.latencies_us);
    }
}

/// One task: calls until `end`, tallying the calls that start at or after
/// `measure_from`.
async fn worker(
    mut caller: Caller,
    work: Arc<Workload>,
    seed: u64,
    measure_from: Instant,
    end: Instant,
) -> Tally {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut tally = Tally {
        latencies_us: Vec::with_capacity(1 << 14),
        ..Tally::default()
    };
    loop {
        let start = Instant::now();
        if start >= end {
            return tally;
        }
        let (key, bucket) = work.pick(&mut rng);
        let result = caller.decide(key, bucket).await;
        if start < measure_from {
            continue;
        }
        let us = u32::try_from(start.elapsed().as_micros()).unwrap_or(u32::MAX);
        match result {
            Some(true) => tally.allowed += 1,
            Some(false) => tally.denied += 1,
            None => {
                tally.errors += 1;
                continue;
            }
        }
        tally.latencies_us.push(us);
    }
}

/// One row of the report.
struct Row {
    scenario: &'static str,
    side: Side,
    per_sec: f64,
    p50_us: u32,
    p99_us: u32,
    allowed: u64,
    denied: u64,
    errors: u64,
    /// The store's counters over the measured window (sluice only).
    stats: Option<RedisStats>,
}

/// The nearest-rank percentile `p` (0 to 100) of sorted values.
fn percentile(sorted: &[u32], p: usize) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// `after - before`, counter by counter.
fn stats_delta(before: RedisStats, after: RedisStats) -> RedisStats {
    let mut d = after;
    d.remote -= before.remote;
    d.local_denials -= before.local_denials;
    d.script_calls -= before.script_calls;
    d.errors -= before.errors;
    d.timeouts -= before.timeouts;
    d
}

/// Runs `work` for one side against the server on `port`, from an empty
/// database.
async fn run(
    server: &support::RedisServer,
    work: &Arc<Workload>,
    side: Side,
    measure: Duration,
) -> Row {
    let reply = support::command(server.port(), &["FLUSHALL"]).unwrap();
    assert!(reply.starts_with("+OK"), "FLUSHALL answered {reply:?}");

    let (caller, store) = match side {
        Side::Naive => {
            let client = redis::Client::open(server.url()).unwrap();
            let conn = client.get_multiplexed_async_connection().await.unwrap();
            let script = Arc::new(redis::Script::new(NAIVE_SCRIPT));
            // Load the script before timing anything.
            let mut c = conn.clone();
            script.prepare_invoke().load_async(&mut c).await.unwrap();
            (Caller::Naive { conn, script }, None)
        }
        Side::Sluice => {
            let config = RedisConfig::from_url(&server.url()).unwrap();
            let store = Arc::new(RedisStore::new(config).unwrap());
            // Connect (and load the script) before timing anything.
            let probe = Limit::new("probe", TokenBucket::new(1.0, 1.0).unwrap());
            store
                .decide(Op::new(&probe, "probe", 1.0), Mode::CONSUME)
                .await
                .unwrap();
            (Caller::Sluice(store.clone()), Some(store))
        }
    };

    let begin = Instant::now();
    let measure_from = begin + WARM_UP;
    let end = measure_from + measure;
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            tokio::spawn(worker(
                caller.clone(),
                work.clone(),
                0x5eed_0000 + i as u64,
                measure_from,
                end,
            ))
        })
        .collect();

    tokio::time::sleep_until(measure_from.into()).await;
    let stats_from = store.as_ref().map(|s| s.stats());
    tokio::time::sleep_until(end.into()).await;
    let stats_to = store.as_ref().map(|s| s.stats());

    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.unwrap());
    }
    tally.latencies_us.sort_unstable();
    Row {
        scenario: work.name,
        side,
        per_sec: (tally.allowed + tally.denied + tally.errors) as f64 / measure.as_secs_f64(),
        p50_us: percentile(&tally.latencies_us, 50),
        p99_us: percentile(&tally.latencies_us, 99),
        allowed: tally.allowed,
        denied: tally.denied,
        errors: tally.errors,
        stats: stats_from.zip(stats_to).map(|(a, b)| stats_delta(a, b)),
    }
}

/// The measured window: `SLUICE_BENCH_SECS`, else 3 s under `cargo bench`
/// and a short smoke pass otherwise.
fn measured_window() -> Duration {
    let secs = match std::env::var("SLUICE_BENCH_SECS") {
        Ok(s) => s
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .expect("SLUICE_BENCH_SECS must be a positive number of seconds"),
        Err(_) if std::env::args().any(|a| a == "--bench") => DEFAULT_SECS,
        Err(_) => SMOKE_SECS,
    };
    Duration::from_secs_f64(secs)
}

fn print_row(row: &Row) {
    let decided = row.allowed + row.denied;
    let allowed_pct = if decided == 0 {
        0.0
    } else {
        100.0 * row.allowed as f64 / decided as f64
    };
    println!(
        "{:<8} {:<7} {:>12.0} {:>8} {:>8} {:>9.1} {:>10} {:>10} {:>7}",
        row.scenario,
        row.side.name(),
        row.per_sec,
        row.p50_us,
        row.p99_us,
        allowed_pct,
        row.allowed,
        row.denied,
        row.errors,
    );
}

fn main() {
    let measure = measured_window();
    let server = support::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .unwrap();

    println!(
        "sluice-redis store benchmark: redis-server on port {}, {TASKS} tasks, {WORKERS} \
         workers, {:.1} s warm-up + {:.1} s measured per row",
        server.port(),
        WARM_UP.as_secs_f64(),
        measure.as_secs_f64(),
    );
    println!();
    println!(
        "{:<8} {:<7} {:>12} {:>8} {:>8} {:>9} {:>10} {:>10} {:>7}",
        "scenario",
        "side",
        "decisions/s",
        "p50 µs",
        "p99 µs",
        "allowed%",
        "allowed",
        "denied",
        "errors"
    );

    let mut summary = Vec::new();
    for work in [Workload::mixed(), Workload::abuse()] {
        let work = Arc::new(work);
        let naive = runtime.block_on(run(&server, &work, Side::Naive, measure));
        print_row(&naive);
        let sluice = runtime.block_on(run(&server, &work, Side::Sluice, measure));
        print_row(&sluice);
        summary.push((naive, sluice));
    }

    println!();
    for (naive, sluice) in &summary {
        let ratio = if naive.per_sec > 0.0 {
            sluice.per_sec / naive.per_sec
        } else {
            f64::NAN
        };
        println!(
            "{}: ratio sluice/naive = {ratio:.2}× (decisions/s)",
            sluice.scenario
        );
    }
    println!();
    for (_, sluice) in &summary {
        let Some(s) = sluice.stats else { continue };
        let per_call = if s.script_calls == 0 {
            0.0
        } else {
            s.remote as f64 / s.script_calls as f64
        };
        println!(
            "{} sluice stats (measured window): local_denials={} remote={} script_calls={} \
             ({per_call:.1} decisions per script call) errors={} timeouts={}",
            sluice.scenario, s.local_denials, s.remote, s.script_calls, s.errors, s.timeouts,
        );
    }
}
