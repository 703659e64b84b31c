//! Fat keys: two `sluice serve` processes sharing one real `redis-server`.
//! Through server A, clients hammer a concurrency key holding every slot
//! its limit allows and a sliding log holding every entry a key keeps;
//! through server B, other clients call other keys. Each round has three
//! phases: B alone, A's clients making the same calls on keys that hold
//! next to nothing, and on the fat keys, so that B's latencies under each
//! come from the same run, side by side. Prints one Markdown report.
//!
//! Run it through `scripts/fat-key`, which builds the binary and this
//! example in release mode and writes the report to `docs/fat-keys.md`.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use common::{free_port, ms, pct, start_redis, start_serve};
use sluice_core::MAX_SLOTS;
use sluice_core::sliding::MAX_LOG_ENTRIES;

/// Options; the defaults run in about half a minute.
#[derive(Debug, Parser)]
struct Args {
    /// The `sluice` binary to run.
    #[arg(long, default_value = "target/release/sluice")]
    sluice: PathBuf,
    /// Clients hammering the fat keys through server A.
    #[arg(long, default_value_t = 16)]
    fat_clients: usize,
    /// Clients calling other keys through server B.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// The store deadline (`timeout_ms` in the policy).
    #[arg(long, default_value_t = 50)]
    timeout_ms: u64,
    /// Rounds of three phases: quiet, thin keys, fat keys.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// How long each phase lasts, in seconds.
    #[arg(long, default_value_t = 3.0)]
    phase: f64,
    /// Also write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What the clients of one server saw in one phase.
#[derive(Default)]
struct Seen {
    latencies: Vec<Duration>,
    /// Answers other than the ones their call expects (200 or 429), and
    /// calls that got no answer.
    failed: usize,
}

impl Seen {
    fn add(&mut self, other: Seen) {
        self.latencies.extend(other.latencies);
        self.failed += other.failed;
    }
}

/// One client's calls until `stop`: each the call `next` makes of the
/// answer to the one before (`None` at first), answered 200 or 429.
async fn client_loop(
    client: reqwest::Client,
    stop: Arc<AtomicBool>,
    mut next: impl FnMut(Option<serde_json::Value>) -> (String, String) + Send + 'static,
) -> Seen {
    let mut seen = Seen::default();
    let mut last = None;
    while !stop.load(Ordering::Relaxed) {
        let (url, body) = next(last.take());
        let sent = Instant::now();
        let answer = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await;
        let status = answer.as_ref().map_or(0, |r| r.status().as_u16());
        if let Ok(r) = answer {
            last = r.json().await.ok();
        }
        seen.latencies.push(sent.elapsed());
        if !matches!(status, 200 | 429) {
            seen.failed += 1;
        }
    }
    seen
}

/// What one of A's clients calls on `key` of both limits: client `i`
/// makes one kind of call of four, by `i`: a lease given back and taken
/// again (the key written whole), every slot asked for (a wait that walks
/// every lease), a call logged (the log written whole), a check. `mine` is
/// a lease it holds to begin with.
fn hammer(
    a: &str,
    key: &'static str,
    i: usize,
    mut mine: Option<String>,
) -> impl FnMut(Option<serde_json::Value>) -> (String, String) + Send + 'static {
    let a = a.to_owned();
    move |last| {
        let (path, body) = match i % 4 {
            0 => {
                if let Some(lease) = last.as_ref().and_then(|j| j["lease"].as_str()) {
                    mine = Some(lease.to_owned());
                }
                match mine.take() {
                    Some(lease) => (
                        "release",
                        format!(r#"{{"limit": "fat", "key": "{key}", "lease": "{lease}"}}"#),
                    ),
                    None => ("acquire", format!(r#"{{"limit": "fat", "key": "{key}"}}"#)),
                }
            }
            1 => (
                "acquire",
                format!(r#"{{"limit": "fat", "key": "{key}", "count": {MAX_SLOTS}}}"#),
            ),
            2 => ("limit", format!(r#"{{"limit": "log", "key": "{key}"}}"#)),
            _ => ("check", format!(r#"{{"limit": "fat", "key": "{key}"}}"#)),
        };
        (format!("{a}/v1/{path}"), body)
    }
}

/// What A's clients do in a phase.
#[derive(Clone, Copy, PartialEq)]
enum Load {
    /// Nothing: B's clients alone.
    Quiet,
    /// The same calls as on the fat keys, on keys that hold next to
    /// nothing: what the load costs whatever the keys hold.
    Thin,
    /// The calls on the fat keys.
    Fat,
}

impl Load {
    fn key(self) -> Option<&'static str> {
        match self {
            Load::Quiet => None,
            Load::Thin => Some("thin"),
            Load::Fat => Some("fat"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Load::Quiet => "quiet",
            Load::Thin => "thin keys",
            Load::Fat => "fat keys",
        }
    }
}

async fn post(client: &reqwest::Client, url: &str, body: String) -> serde_json::Value {
    client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let redis_port = free_port();
    let _redis = start_redis(redis_port, dir.path())?;
    // Every slot and every entry a key may hold, each under a lease or at
    // a moment of its own, none leaving within the run.
    let policy = format!(
        "store: {{kind: redis, url: \"redis://127.0.0.1:{redis_port}\", timeout_ms: {}}}\n\
         on_store_error: closed\n\
         limits:\n\
         \x20 fat: {{algorithm: concurrency, algorithm_config: {{max: {MAX_SLOTS}, lease: 1h}}}}\n\
         \x20 log: {{algorithm: sliding_log, algorithm_config: {{rate: 1000000000, period: 1h}}}}\n\
         \x20 other: {{algorithm: token_bucket, algorithm_config: {{rate: 1000000000, period: 1s}}}}\n",
        args.timeout_ms
    );
    let policy_path = dir.path().join("policy.yaml");
    std::fs::write(&policy_path, policy)?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(64)
        .build()?;
    let (_a, a) = start_serve(&args.sluice, &policy_path, dir.path(), "a", &client).await?;
    let (_b, b) = start_serve(&args.sluice, &policy_path, dir.path(), "b", &client).await?;

    // Fill the fat keys through A.
    let mut leases = Vec::new();
    for _ in 0..MAX_SLOTS as usize {
        let j = post(
            &client,
            &format!("{a}/v1/acquire"),
            r#"{"limit": "fat", "key": "fat"}"#.into(),
        )
        .await;
        match j["lease"].as_str() {
            Some(lease) => leases.push(lease.to_owned()),
            None => bail!("filling the concurrency key was refused: {j}"),
        }
    }
    for _ in 0..MAX_LOG_ENTRIES + 100 {
        post(
            &client,
            &format!("{a}/v1/limit"),
            r#"{"limit": "log", "key": "fat"}"#.into(),
        )
        .await;
    }
    let held = redis_strlen(redis_port, "sluice:{fat}:fat")?;
    let logged = redis_strlen(redis_port, "sluice:{fat}:log")?;

    let phase = Duration::from_secs_f64(args.phase);
    let mut rows = Vec::new();
    for round in 0..args.rounds {
        for load in [Load::Quiet, Load::Thin, Load::Fat] {
            let stop = Arc::new(AtomicBool::new(false));
            let mut on_a = Vec::new();
            if let Some(key) = load.key() {
                for i in 0..args.fat_clients {
                    // Only the fat key holds the leases the fill took.
                    let mine = leases.get(i).filter(|_| key == "fat").cloned();
                    let call = hammer(&a, key, i, mine);
                    on_a.push(tokio::spawn(client_loop(
                        client.clone(),
                        Arc::clone(&stop),
                        call,
                    )));
                }
            }
            let mut on_b = Vec::new();
            for i in 0..args.clients {
                let b = b.clone();
                let mut n = 0u64;
                let call = move |_| {
                    n += 1;
                    (
                        format!("{b}/v1/limit"),
                        format!(r#"{{"limit": "other", "key": "o{i}-{}"}}"#, n % 1000),
                    )
                };
                on_b.push(tokio::spawn(client_loop(
                    client.clone(),
                    Arc::clone(&stop),
                    call,
                )));
            }
            redis_command(redis_port, &["CONFIG", "RESETSTAT"])?;
            tokio::time::sleep(phase).await;
            stop.store(true, Ordering::Relaxed);
            let (mut seen_a, mut seen_b) = (Seen::default(), Seen::default());
            for h in on_a {
                seen_a.add(h.await?);
            }
            for h in on_b {
                seen_b.add(h.await?);
            }
            let script = redis_command(redis_port, &["INFO", "commandstats"])?;
            if std::env::var_os("FAT_KEY_COMMANDSTATS").is_some() {
                eprintln!("{}:\n{script}", load.name());
            }
            rows.push(Row {
                round: round + 1,
                load,
                on_a: seen_a,
                on_b: seen_b,
                script_us: usec_per_call(&script, "evalsha"),
            });
        }
    }
    let report = report(&args, held, logged, &mut rows);
    print!("{report}");
    if let Some(out) = &args.out {
        std::fs::write(out, &report)?;
    }
    Ok(())
}

struct Row {
    round: usize,
    load: Load,
    on_a: Seen,
    on_b: Seen,
    /// Redis's mean time per script call in the phase, in microseconds.
    script_us: Option<f64>,
}

fn report(args: &Args, held: usize, logged: usize, rows: &mut [Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Two `sluice serve` processes on one redis-server, store deadline {} ms, failing closed. \
         Through server A, {} clients hammer a concurrency key holding all {MAX_SLOTS} slots \
         under leases of their own ({held} bytes in Redis) and a sliding log holding \
         {MAX_LOG_ENTRIES} entries ({logged} bytes), a quarter each releasing and taking \
         leases again, asking for every slot, logging calls and checking. Through server B, \
         {} clients call other keys. Each round has three phases of {} s: B alone (quiet), A's \
         clients making the same calls on keys that hold next to nothing (thin), and on the \
         fat keys (fat).\n",
        args.timeout_ms, args.fat_clients, args.clients, args.phase
    );
    let _ = writeln!(
        out,
        "| round | phase | B: calls | B: failed | B: p50 ms | B: p99 ms | B: max ms | A: calls | A: failed | Redis µs a script call |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    for row in rows.iter_mut() {
        row.on_b.latencies.sort();
        let lat = &row.on_b.latencies;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.round,
            row.load.name(),
            lat.len(),
            row.on_b.failed,
            ms(pct(lat, 0.5)),
            ms(pct(lat, 0.99)),
            ms(lat.last().copied().unwrap_or_default()),
            row.on_a.latencies.len(),
            row.on_a.failed,
            row.script_us.map_or("?".into(), |us| format!("{us:.0}"))
        );
    }
    // B's p99 in each phase of a kind, sorted, and per round the ratio of
    // the fat phase's to the thin phase's beside it.
    let p99 = |load: Load| -> Vec<Duration> {
        let mut v: Vec<Duration> = rows
            .iter()
            .filter(|r| r.load == load)
            .map(|r| pct(&r.on_b.latencies, 0.99))
            .collect();
        v.sort();
        v
    };
    let mut ratios: Vec<f64> = rows
        .chunks(3)
        .filter_map(|round| {
            let of = |load| round.iter().find(|r| r.load == load);
            let (thin, fat) = (of(Load::Thin)?, of(Load::Fat)?);
            let t = pct(&thin.on_b.latencies, 0.99).as_secs_f64();
            (t > 0.0).then(|| pct(&fat.on_b.latencies, 0.99).as_secs_f64() / t)
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let failed: usize = rows.iter().map(|r| r.on_b.failed).sum();
    let summary = |load| {
        let v = p99(load);
        format!(
            "median {} ms, worst {} ms",
            ms(pct(&v, 0.5)),
            ms(v.last().copied().unwrap_or_default())
        )
    };
    let _ = writeln!(
        out,
        "\nB's p99: quiet {}; thin keys {}; fat keys {}. Fat over thin, round by round: median \
         {:.2}, range {:.2}–{:.2}. {failed} of B's calls failed.",
        summary(Load::Quiet),
        summary(Load::Thin),
        summary(Load::Fat),
        ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN),
        ratios.first().copied().unwrap_or(f64::NAN),
        ratios.last().copied().unwrap_or(f64::NAN),
    );
    out
}

/// The `usec_per_call` of `command` in an `INFO commandstats` reply.
fn usec_per_call(info: &str, command: &str) -> Option<f64> {
    let line = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))?;
    let from = line.find("usec_per_call=")? + "usec_per_call=".len();
    line[from..].split(',').next()?.parse().ok()
}

fn redis_strlen(port: u16, key: &str) -> anyhow::Result<usize> {
    let reply = redis_command(port, &["STRLEN", key])?;
    Ok(reply.trim().trim_start_matches(':').parse()?)
}

/// Sends one command to the Redis on `port` and returns its raw reply.
fn redis_command(port: u16, args: &[&str]) -> anyhow::Result<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        let _ = write!(request, "${}\r\n{arg}\r\n", arg.len());
    }
    stream.write_all(request.as_bytes())?;
    // A simple string, an integer or an error ends with its first line; a
    // bulk string's first line says how many bytes follow it.
    let mut reply = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            bail!("Redis closed the connection mid-reply");
        }
        reply.extend_from_slice(&buf[..n]);
        let Some(eol) = reply.windows(2).position(|w| w == b"\r\n") else {
            continue;
        };
        if reply[0] != b'$' {
            break;
        }
        let len: i64 = std::str::from_utf8(&reply[1..eol])?.parse()?;
        if len < 0 || reply.len() >= eol + 2 + len as usize + 2 {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}
