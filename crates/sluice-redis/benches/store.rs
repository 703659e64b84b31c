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
//!   on), `store.decide(Op::new(&limit, &key, 1.0), Mode::CONSUME)`;
//! - `window` and `log`: the same store and calls with a sliding window and
//!   a sliding log of the same rate per second in place of the token bucket
//!   (no deny cache serves them, so every call goes to Redis).
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
//! duration, 3 s (`SLUICE_BENCH_SECS` overrides it); calls that start in the
//! measured window count. The two sides alternate for 3 rounds
//! (`SLUICE_BENCH_ROUNDS`), so that a slow patch of a shared machine hits
//! both, and the ratio compares each side's median round. Each row has
//! decisions per second, the p50 and p99 latency of single calls, the
//! allowed share, errors, and CPU time per decision over the window: of
//! redis-server (`INFO cpu`), of redis-server inside scripts, nested commands
//! included (`INFO commandstats`), and of this process (Linux
//! `/proc/self/task/*/schedstat`). Then come the ratios sluice/naive, each
//! sliding algorithm's throughput and script time per decision against the
//! token bucket's, and the store's counters over the median round.
//!
//! With `SLUICE_BENCH_HOLD` set, it keeps redis-server up after the report
//! until its standard input closes, for a profiler attached to the server;
//! `SLUICE_BENCH_TIMEOUT_MS` gives the store a longer deadline than its 50 ms
//! for a server slowed by one.
//!
//! Run it with `cargo bench -p sluice-redis --bench store`;
//! `SLUICE_BENCH_ONLY=mixed` (or `mixed/sluice`) runs one scenario (or one
//! side of it). Without `--bench` on its command line (as under `cargo test
//! --benches`) it makes a short smoke pass instead.

// A benchmark binary: a setup failure should abort loudly, and its stdout is
// its report.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use sluice_core::{Limit, Mode, Nanos, Op, SlidingLog, SlidingWindow, Store, TokenBucket};
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

/// One limit as every side sees it.
struct Bucket {
    /// Sluice's limit.
    limit: Limit,
    /// The sliding window and the sliding log of the same rate.
    window: Limit,
    log: Limit,
    /// Tokens per second, for the naive script.
    rate: f64,
    /// Capacity, for the naive script.
    burst: f64,
    /// Seconds until an empty bucket is full, plus one: the naive key's TTL.
    ttl_secs: u64,
}

impl Bucket {
    fn new(name: &str, rate: f64, burst: f64) -> Bucket {
        let second = Nanos(Nanos::PER_SEC);
        Bucket {
            limit: Limit::new(name, TokenBucket::new(rate, burst).unwrap()),
            window: Limit::new(name, SlidingWindow::per_period(rate, second).unwrap()),
            log: Limit::new(name, SlidingLog::per_period(rate, second).unwrap()),
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
    /// The throughput ratio sluice/naive the store aims for here.
    target: f64,
}

impl Workload {
    /// The `mixed` scenario (`hot_share` 0) or the `abuse` scenario.
    fn new(name: &'static str, hot_share: f64, target: f64) -> Workload {
        Workload {
            name,
            normal_keys: (0..NORMAL_KEYS).map(|i| format!("user:{i:08}")).collect(),
            normal: Bucket::new("api", 100.0, 100.0),
            hot_keys: (0..HOT_KEYS).map(|i| format!("abuser:{i:08}")).collect(),
            hot: Bucket::new("abuse", 1.0, 1.0),
            hot_share,
            target,
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

/// The contestants: the naive script, and sluice with each algorithm.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Naive,
    Sluice,
    Window,
    Log,
}

impl Side {
    const ALL: [Side; 4] = [Side::Naive, Side::Sluice, Side::Window, Side::Log];

    fn name(self) -> &'static str {
        match self {
            Side::Naive => "naive",
            Side::Sluice => "sluice",
            Side::Window => "window",
            Side::Log => "log",
        }
    }

    /// The limit this side decides `bucket`'s calls under.
    fn limit(self, bucket: &Bucket) -> &Limit {
        match self {
            Side::Naive | Side::Sluice => &bucket.limit,
            Side::Window => &bucket.window,
            Side::Log => &bucket.log,
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
    Sluice(Arc<RedisStore>, Side),
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
            Caller::Sluice(store, side) => store
                .decide(Op::new(side.limit(bucket), key, 1.0), Mode::CONSUME)
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
    target: f64,
    side: Side,
    per_sec: f64,
    p50_us: u32,
    p99_us: u32,
    allowed: u64,
    denied: u64,
    errors: u64,
    /// redis-server CPU per decision in the measured window, in µs.
    server_us: Option<f64>,
    /// redis-server time inside the script per decision, in µs.
    script_us: Option<f64>,
    /// This process's CPU per decision in the measured window, in µs.
    client_us: Option<f64>,
    /// The store's counters over the measured window (sluice only).
    stats: Option<RedisStats>,
    /// The decisions the store sent to Redis over the whole run, warm-up
    /// included (sluice only): what `scripts/redis-instructions` divides
    /// redis-server's instructions by.
    remote_all: Option<u64>,
}

/// redis-server's CPU time so far (user + system, all threads), from `INFO`.
fn server_cpu(port: u16) -> Option<Duration> {
    let info = support::command(port, &["INFO", "cpu"]).ok()?;
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    };
    let secs = field("used_cpu_user")? + field("used_cpu_sys")?;
    Some(Duration::from_secs_f64(secs))
}

/// The time redis-server spent inside `EVALSHA` so far, nested commands
/// included (`INFO commandstats`): the scripts' share of its CPU.
fn script_time(port: u16) -> Option<Duration> {
    let info = support::command(port, &["INFO", "commandstats"]).ok()?;
    let usec = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))?
        .split(',')
        .find_map(|f| f.strip_prefix("usec="))?
        .parse::<u64>()
        .ok()?;
    Some(Duration::from_micros(usec))
}

/// This process's CPU time so far, summed over its threads from
/// `/proc/self/task/*/schedstat` (Linux; `None` elsewhere).
fn client_cpu() -> Option<Duration> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(ns))
}

/// `to - from` in microseconds per decision, if both were measured.
fn cpu_per_decision(from: Option<Duration>, to: Option<Duration>, decisions: u64) -> Option<f64> {
    let (from, to) = (from?, to?);
    (decisions > 0).then(|| to.saturating_sub(from).as_secs_f64() * 1e6 / decisions as f64)
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

/// Runs `work` for one side against `server`, from an empty
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
        Side::Sluice | Side::Window | Side::Log => {
            let mut config = RedisConfig::from_url(&server.url()).unwrap();
            if let Some(ms) = std::env::var("SLUICE_BENCH_TIMEOUT_MS")
                .ok()
                .and_then(|ms| ms.parse().ok())
            {
                // A redis-server under a profiler answers far slower than the
                // store's default deadline allows.
                config = config.with_timeout(Duration::from_millis(ms));
            }
            let store = Arc::new(RedisStore::new(config).unwrap());
            // Connect (and load the script) before timing anything.
            let probe = Limit::new("probe", TokenBucket::new(1.0, 1.0).unwrap());
            store
                .decide(Op::new(&probe, "probe", 1.0), Mode::CONSUME)
                .await
                .unwrap();
            (Caller::Sluice(store.clone(), side), Some(store))
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
    let (server_from, client_from) = (server_cpu(server.port()), client_cpu());
    let script_from = script_time(server.port());
    tokio::time::sleep_until(end.into()).await;
    let stats_to = store.as_ref().map(|s| s.stats());
    let (server_to, client_to) = (server_cpu(server.port()), client_cpu());
    let script_to = script_time(server.port());

    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.unwrap());
    }
    tally.latencies_us.sort_unstable();
    let calls = tally.allowed + tally.denied + tally.errors;
    Row {
        scenario: work.name,
        target: work.target,
        side,
        per_sec: calls as f64 / measure.as_secs_f64(),
        p50_us: percentile(&tally.latencies_us, 50),
        p99_us: percentile(&tally.latencies_us, 99),
        allowed: tally.allowed,
        denied: tally.denied,
        errors: tally.errors,
        server_us: cpu_per_decision(server_from, server_to, calls),
        script_us: cpu_per_decision(script_from, script_to, calls),
        client_us: cpu_per_decision(client_from, client_to, calls),
        stats: stats_from.zip(stats_to).map(|(a, b)| stats_delta(a, b)),
        remote_all: stats_to.map(|s| s.remote),
    }
}

/// The rows to run: `SLUICE_BENCH_ONLY` is `scenario` or `scenario/side`
/// (`mixed/sluice`, say, to profile one side alone); unset, every row runs.
struct Only(Option<String>);

impl Only {
    fn from_env() -> Only {
        Only(
            std::env::var("SLUICE_BENCH_ONLY")
                .ok()
                .filter(|s| !s.is_empty()),
        )
    }

    fn runs(&self, scenario: &str, side: Side) -> bool {
        let Some(only) = &self.0 else { return true };
        match only.split_once('/') {
            Some((s, d)) => s == scenario && d == side.name(),
            None => only == scenario,
        }
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

/// Rounds per scenario: `SLUICE_BENCH_ROUNDS`, else 3 under `cargo bench`
/// and 1 for a smoke pass.
fn rounds() -> usize {
    match std::env::var("SLUICE_BENCH_ROUNDS") {
        Ok(s) => s
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .expect("SLUICE_BENCH_ROUNDS must be a positive whole number"),
        Err(_) if std::env::args().any(|a| a == "--bench") => 3,
        Err(_) => 1,
    }
}

/// The round with the median throughput (the lower middle one of an even
/// number), if there was any.
fn median(mut rows: Vec<Row>) -> Option<Row> {
    if rows.is_empty() {
        return None;
    }
    rows.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
    let mid = (rows.len() - 1) / 2;
    Some(rows.swap_remove(mid))
}

/// A CPU cost column: µs per decision, or `-` when unmeasured.
fn cpu(us: Option<f64>) -> String {
    us.map_or_else(|| "-".to_owned(), |us| format!("{us:.2}"))
}

impl Row {
    /// The share of decisions that were allowed, in percent.
    fn allowed_pct(&self) -> f64 {
        let decided = self.allowed + self.denied;
        if decided == 0 {
            0.0
        } else {
            100.0 * self.allowed as f64 / decided as f64
        }
    }
}

fn print_row(row: &Row) {
    println!(
        "{:<8} {:<7} {:>12.0} {:>7} {:>7} {:>9.1} {:>10} {:>10} {:>7} {:>9} {:>9} {:>9}",
        row.scenario,
        row.side.name(),
        row.per_sec,
        row.p50_us,
        row.p99_us,
        row.allowed_pct(),
        row.allowed,
        row.denied,
        row.errors,
        cpu(row.server_us),
        cpu(row.script_us),
        cpu(row.client_us),
    );
}

fn main() {
    let measure = measured_window();
    let rounds = rounds();
    let only = Only::from_env();
    let server = support::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .unwrap();

    println!(
        "sluice-redis store benchmark: redis-server on port {}, {TASKS} tasks, {WORKERS} \
         workers, {:.1} s warm-up + {:.1} s measured per row, {rounds} round(s)",
        server.port(),
        WARM_UP.as_secs_f64(),
        measure.as_secs_f64(),
    );
    println!();
    println!(
        "{:<8} {:<7} {:>12} {:>7} {:>7} {:>9} {:>10} {:>10} {:>7} {:>9} {:>9} {:>9}",
        "scenario",
        "side",
        "decisions/s",
        "p50 µs",
        "p99 µs",
        "allowed%",
        "allowed",
        "denied",
        "errors",
        "srv µs/d",
        "lua µs/d",
        "cli µs/d",
    );

    // Per scenario, each side's median round: naive, sluice, window, log.
    let mut medians: Vec<[Option<Row>; 4]> = Vec::new();
    for work in [
        Workload::new("mixed", 0.0, 3.0),
        Workload::new("abuse", HOT_SHARE, 10.0),
    ] {
        let work = Arc::new(work);
        // Sides alternate, round by round, and each side's median round is
        // compared: this machine's speed drifts, and a slow patch should hit
        // both sides alike rather than whichever ran in it.
        let mut rows: [Vec<Row>; 4] = Default::default();
        for _ in 0..rounds {
            for (i, side) in Side::ALL.into_iter().enumerate() {
                if only.runs(work.name, side) {
                    let row = runtime.block_on(run(&server, &work, side, measure));
                    print_row(&row);
                    rows[i].push(row);
                }
            }
        }
        medians.push(rows.map(median));
    }

    println!();
    if rounds > 1 {
        println!("medians of {rounds} rounds:");
        for row in medians.iter().flatten().flatten() {
            print_row(row);
        }
        println!();
    }
    for [naive, sluice, ..] in &medians {
        let (Some(naive), Some(sluice)) = (naive, sluice) else {
            continue;
        };
        let ratio = if naive.per_sec > 0.0 {
            sluice.per_sec / naive.per_sec
        } else {
            f64::NAN
        };
        println!(
            "{}: ratio sluice/naive = {ratio:.2}× (decisions/s; target ≥ {}×)",
            sluice.scenario, sluice.target
        );
        // Both sides enforce the same limits, so they should allow about as
        // much; a gap means one of them is not limiting what it should.
        let gap = (sluice.allowed_pct() - naive.allowed_pct()).abs();
        if gap > 2.0 {
            println!(
                "  warning: the allowed shares differ by {gap:.1} points ({:.1}% vs {:.1}%)",
                naive.allowed_pct(),
                sluice.allowed_pct()
            );
        }
    }
    // The sliding algorithms against the token bucket, on the same store.
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "-".to_owned(),
    };
    for [_, bucket, window, log] in &medians {
        let Some(bucket) = bucket else { continue };
        for row in [window, log].into_iter().flatten() {
            println!(
                "{}: {} against the token bucket: decisions/s {}, lua µs/d {}",
                row.scenario,
                row.side.name(),
                ratio(Some(row.per_sec), Some(bucket.per_sec)),
                ratio(row.script_us, bucket.script_us),
            );
        }
    }
    println!();
    for row in medians.iter().flat_map(|m| &m[1..]).flatten() {
        let (Some(s), Some(all)) = (row.stats, row.remote_all) else {
            continue;
        };
        let per_call = if s.script_calls == 0 {
            0.0
        } else {
            s.remote as f64 / s.script_calls as f64
        };
        println!(
            "{}/{} stats (measured window): local_denials={} remote={} script_calls={} \
             ({per_call:.1} decisions per script call) errors={} timeouts={}; \
             remote_all={all}",
            row.scenario,
            row.side.name(),
            s.local_denials,
            s.remote,
            s.script_calls,
            s.errors,
            s.timeouts,
        );
    }
    if std::env::var_os("SLUICE_BENCH_HOLD").is_some() {
        // For a profiler attached to redis-server: it outlives the run until
        // whoever reads this line has taken what it needs (see
        // scripts/redis-instructions).
        println!(
            "hold: redis-server on port {} stays up until standard input closes",
            server.port()
        );
        std::io::stdout().flush().unwrap();
        std::io::copy(&mut std::io::stdin(), &mut std::io::sink()).unwrap();
    }
}
