//! One contender of `scripts/postgres-bench`: CALLERS concurrent callers
//! deciding for a while on one store, printing one JSON line of what they
//! decided and what the server's processes spent doing it.
//!
//! - `--side fixed` and `--side bucket`: Sluice's store, a fixed window or
//!   a token bucket, through the public API (`Store::transact` of one op,
//!   [`Mode::CONSUME`]). `--store` picks the store: `postgres://…` is
//!   [`PostgresStore`], `redis://…` is `RedisStore` (its deny cache off,
//!   so that every decision reaches the server, as on PostgreSQL), for the
//!   server CPU a decision costs on each.
//! - `--side naive`: seed 003's transaction, one decision per transaction:
//!   `BEGIN`; `SELECT value, ts … FOR UPDATE`; the token bucket computed
//!   here; an `INSERT … ON CONFLICT DO UPDATE` when allowed (the seed writes
//!   nothing on a denial); `COMMIT`. Its clock is this process's, as the
//!   seed's is the application's, which spares it a round trip.
//!
//! Every caller picks a key uniformly from `--keys` (1 is one hot key) and
//! calls again as soon as its call returns. Calls that return within the
//! measured window count, allowed, denied or failed; the server's CPU is
//! read from `/proc` (utime + stime of `--server-pid` and its children,
//! ended ones included: the postmaster and every backend, or redis-server) as the window opens
//! and closes, in clock ticks, as is this process's own.
//!
//! The driver runs on one thread, as the Node.js driver of
//! rate-limiter-flexible does. Built and run by `scripts/postgres-bench`.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use sluice_core::{FixedWindow, Limit, Mode, Nanos, Op, Store, TokenBucket};
use sluice_postgres::{PostgresConfig, PostgresStore};
use sluice_redis::{RedisConfig, RedisStore};
use sqlx::postgres::PgPoolOptions;

/// What to run, on what, for how long.
#[derive(Debug, Parser)]
struct Args {
    /// `postgres://…` or `redis://…` (`naive` takes only `postgres://`).
    #[arg(long)]
    store: String,
    /// The contender.
    #[arg(long, value_enum)]
    side: Side,
    /// Keys drawn uniformly; 1 is one hot key.
    #[arg(long, default_value_t = 10_000)]
    keys: usize,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 32)]
    callers: usize,
    /// Connections to PostgreSQL, at most (the store's pool, or the naive
    /// side's).
    #[arg(long, default_value_t = 16)]
    pool: u32,
    /// The deadline of a call, in milliseconds: long enough that a call
    /// queued behind the others on a hot key is decided rather than failed.
    #[arg(long, default_value_t = 1_000)]
    timeout_ms: u64,
    /// Batches in flight at once on the PostgreSQL store (its default
    /// unless given).
    #[arg(long)]
    in_flight: Option<usize>,
    /// The fixed window: this many calls a window ...
    #[arg(long, default_value_t = 2.0)]
    window_calls: f64,
    /// ... of this many seconds.
    #[arg(long, default_value_t = 10)]
    window_secs: i64,
    /// The token bucket (and the naive one): tokens a second ...
    #[arg(long, default_value_t = 0.2)]
    rate: f64,
    /// ... and its capacity.
    #[arg(long, default_value_t = 2.0)]
    burst: f64,
    /// The limit's name (and so its rows), one per scenario.
    #[arg(long, default_value = "bench")]
    name: String,
    /// Seconds of calls before the window, not counted.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Seconds measured.
    #[arg(long, default_value_t = 5.0)]
    secs: f64,
    /// The server's process, whose CPU (with its children's) is counted.
    #[arg(long)]
    server_pid: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Side {
    Fixed,
    Bucket,
    Naive,
}

/// The calls that returned within the window.
#[derive(Default)]
struct Counts {
    measuring: AtomicBool,
    stop: AtomicBool,
    allowed: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let keys: Arc<[String]> = (0..args.keys).map(|i| format!("user:{i:08}")).collect();
    let timeout = Duration::from_millis(args.timeout_ms);
    let measured = match args.side {
        Side::Naive => {
            anyhow::ensure!(
                args.store.starts_with("postgres"),
                "the naive side runs on PostgreSQL only"
            );
            let naive = Arc::new(Naive::connect(&args, timeout).await?);
            let name: Arc<str> = args.name.as_str().into();
            drive(&args, keys, move |key| {
                let (naive, name) = (naive.clone(), name.clone());
                async move { naive.decide(&name, &key).await.map_err(|e| e.to_string()) }
            })
            .await
        }
        side => {
            let limit = Arc::new(match side {
                Side::Fixed => Limit::new(
                    args.name.as_str(),
                    FixedWindow::new(args.window_calls, Nanos(args.window_secs * Nanos::PER_SEC))?,
                ),
                _ => Limit::new(args.name.as_str(), TokenBucket::new(args.rate, args.burst)?),
            });
            if args.store.starts_with("redis") {
                let config = RedisConfig::from_url(&args.store)?
                    .with_timeout(timeout)
                    .with_deny_cache(0);
                let store = Arc::new(RedisStore::new(config)?);
                drive(&args, keys, decide_on(store, limit)).await
            } else {
                let mut config = PostgresConfig::from_url(&args.store)?
                    .with_pool_size(args.pool)
                    .with_timeout(timeout);
                if let Some(n) = args.in_flight {
                    let max = config.max_batch();
                    config = config.with_batching(max, n);
                }
                let store = Arc::new(PostgresStore::new(config)?);
                // The tables are made before the first call, not in the
                // warm-up's first deadline.
                store.migrate().await?;
                drive(&args, keys, decide_on(store, limit)).await
            }
        }
    }?;
    let Measured {
        counts,
        window,
        server_ticks,
        client_ticks,
    } = measured;
    let error = counts.first_error.lock().unwrap().take();
    println!(
        "{}",
        serde_json::json!({
            "allowed": counts.allowed.load(Ordering::Relaxed),
            "denied": counts.denied.load(Ordering::Relaxed),
            "errors": counts.errors.load(Ordering::Relaxed),
            "first_error": error,
            "secs": window.as_secs_f64(),
            "server_ticks": server_ticks,
            "client_ticks": client_ticks,
            "pool": args.pool,
            "callers": args.callers,
        })
    );
    Ok(())
}

/// A call of Sluice's store: one op of cost 1 on `key`.
fn decide_on<S: Store + 'static>(
    store: Arc<S>,
    limit: Arc<Limit>,
) -> impl Fn(String) -> std::pin::Pin<Box<dyn Future<Output = Result<bool, String>> + Send>>
+ Send
+ Sync
+ 'static {
    move |key| {
        let (store, limit) = (store.clone(), limit.clone());
        Box::pin(async move {
            store
                .transact(&[Op::new(&limit, &key, 1.0)], Mode::CONSUME)
                .await
                .map(|out| out.allowed)
                .map_err(|e| e.to_string())
        })
    }
}

/// What the window saw: the calls, its length, and the CPU spent in it.
struct Measured {
    counts: Arc<Counts>,
    window: Duration,
    server_ticks: u64,
    client_ticks: u64,
}

/// Runs `args.callers` callers of `call` through the warm-up and the
/// window, and returns what returned within the window.
async fn drive<F, Fut>(args: &Args, keys: Arc<[String]>, call: F) -> anyhow::Result<Measured>
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, String>> + Send + 'static,
{
    let counts = Arc::new(Counts::default());
    let call = Arc::new(call);
    let mut callers = Vec::with_capacity(args.callers);
    for seed in 0..args.callers {
        let (counts, call, keys) = (counts.clone(), call.clone(), keys.clone());
        callers.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed as u64);
            while !counts.stop.load(Ordering::Relaxed) {
                let key = keys[rng.usize(..keys.len())].clone();
                let result = call(key).await;
                if !counts.measuring.load(Ordering::Relaxed) {
                    continue;
                }
                match result {
                    Ok(true) => counts.allowed.fetch_add(1, Ordering::Relaxed),
                    Ok(false) => counts.denied.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        counts.first_error.lock().unwrap().get_or_insert(e);
                        counts.errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await;
    let (server0, client0) = (tree_ticks(args.server_pid)?, own_ticks()?);
    let started = Instant::now();
    counts.measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(args.secs)).await;
    counts.measuring.store(false, Ordering::Relaxed);
    let window = started.elapsed();
    let (server1, client1) = (tree_ticks(args.server_pid)?, own_ticks()?);
    counts.stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await?;
    }
    Ok(Measured {
        counts,
        window,
        server_ticks: server1.saturating_sub(server0),
        client_ticks: client1.saturating_sub(client0),
    })
}

/// From a `/proc/<pid>/stat` line: the parent's pid, the process's own
/// utime + stime, and the cutime + cstime of its children that have ended,
/// in clock ticks.
fn stat_ticks(stat: &str) -> Option<(u32, u64, u64)> {
    // The command name, in parentheses, may hold spaces: the fields that
    // follow start after its last `)`.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let ppid = fields.get(1)?.parse().ok()?;
    Some((ppid, number(11)? + number(12)?, number(13)? + number(14)?))
}

/// The CPU of `root` and of its children, in clock ticks: those running,
/// and those that have ended (autovacuum's workers, say), which `root` has
/// reaped. PostgreSQL's backends and helpers are all children of the
/// postmaster.
fn tree_ticks(root: u32) -> anyhow::Result<u64> {
    let own = std::fs::read_to_string(format!("/proc/{root}/stat"))?;
    let (_, ticks, reaped) =
        stat_ticks(&own).ok_or_else(|| anyhow::anyhow!("unreadable /proc/{root}/stat"))?;
    let mut total = ticks + reaped;
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        // A process that ended since the listing is skipped.
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            && let Some((ppid, ticks, _)) = stat_ticks(&stat)
            && ppid == root
        {
            total += ticks;
        }
    }
    Ok(total)
}

fn own_ticks() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    stat_ticks(&stat)
        .map(|t| t.1)
        .ok_or_else(|| anyhow::anyhow!("unreadable /proc/self/stat"))
}

/// Seed 003's token bucket, one transaction a decision.
struct Naive {
    pool: sqlx::PgPool,
    rate: f64,
    burst: f64,
}

impl Naive {
    async fn connect(args: &Args, timeout: Duration) -> anyhow::Result<Naive> {
        let pool = PgPoolOptions::new()
            .max_connections(args.pool)
            .acquire_timeout(timeout)
            .connect(&args.store)
            .await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS naive_limits (name text NOT NULL, key text NOT NULL, \
             value float8 NOT NULL, ts float8 NOT NULL, PRIMARY KEY (name, key))",
        )
        .execute(&pool)
        .await?;
        Ok(Naive {
            pool,
            rate: args.rate,
            burst: args.burst,
        })
    }

    async fn decide(&self, name: &str, key: &str) -> Result<bool, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let state: Option<(f64, f64)> = sqlx::query_as(
            "SELECT value, ts FROM naive_limits WHERE name = $1 AND key = $2 FOR UPDATE",
        )
        .bind(name)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let (value, ts) = state.unwrap_or((self.burst, now));
        let value = (value + (now - ts).max(0.0) * self.rate).min(self.burst) - 1.0;
        let allowed = value >= 0.0;
        if allowed {
            sqlx::query(
                "INSERT INTO naive_limits (name, key, value, ts) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (name, key) DO UPDATE SET value = excluded.value, ts = excluded.ts",
            )
            .bind(name)
            .bind(key)
            .bind(value)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(allowed)
    }
}
