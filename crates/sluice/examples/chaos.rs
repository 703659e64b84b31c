//! Chaos run: several `sluice serve` processes sharing one real
//! `redis-server`, under load, while Redis is paused (SIGSTOP), resumed,
//! killed (SIGKILL) and restarted. Prints one Markdown report: admitted
//! calls against the exact bound, every answer's latency against the store
//! deadline, recovery times and `/readyz` transitions.
//!
//! Run it through `scripts/chaos`, which builds the binary and this example
//! in release mode and writes the report to `docs/chaos.md`.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use common::{free_port, ms, pct, start_redis, start_serve};

/// Options; every one has a default that runs in about 20 seconds.
#[derive(Debug, Parser)]
struct Args {
    /// The `sluice` binary to run.
    #[arg(long, default_value = "target/release/sluice")]
    sluice: PathBuf,
    /// `sluice serve` processes sharing the one Redis.
    #[arg(long, default_value_t = 4)]
    servers: usize,
    /// Concurrent callers per server.
    #[arg(long, default_value_t = 8)]
    callers: usize,
    /// The store deadline (`timeout_ms` in the policy).
    #[arg(long, default_value_t = 50)]
    timeout_ms: u64,
    /// How long each phase lasts, in seconds.
    #[arg(long, default_value_t = 3.0)]
    phase: f64,
    /// The limit's rate per second, and its burst.
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    #[arg(long, default_value_t = 100.0)]
    burst: f64,
    /// Also write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One answer, as a caller saw it.
#[derive(Clone, Copy)]
struct Answer {
    server: usize,
    /// Which limit: 0 fails closed, 1 fails open.
    limit: usize,
    sent: Duration,
    latency: Duration,
    /// 200, 429, 503, or 0 when no answer came.
    status: u16,
}

/// A phase of the run and when it began.
struct Phase {
    name: &'static str,
    start: Duration,
}

fn signal(child: &std::process::Child, which: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([which, &child.id().to_string()])
        .status()?;
    if !status.success() {
        bail!("kill {which} failed");
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let redis_port = free_port();
    let mut redis = Some(start_redis(redis_port, dir.path())?);
    let limit = |fail: &str| {
        format!(
            "    algorithm: token_bucket\n    algorithm_config: {{rps: {}, burst: {}, max_reserved: 1}}\n    on_store_error: {fail}\n",
            args.rate, args.burst
        )
    };
    let policy = format!(
        "store: {{kind: redis, url: \"redis://127.0.0.1:{redis_port}\", timeout_ms: {}}}\nlimits:\n  closed:\n{}  open:\n{}",
        args.timeout_ms,
        limit("closed"),
        limit("open")
    );
    let policy_path = dir.path().join("policy.yaml");
    std::fs::write(&policy_path, policy)?;

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(64)
        .build()?;
    let mut servers = Vec::new();
    let mut bases = Vec::new();
    for i in 0..args.servers {
        let name = format!("serve-{i}");
        let (server, base) =
            start_serve(&args.sluice, &policy_path, dir.path(), &name, &client).await?;
        servers.push(server);
        bases.push(base);
    }

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::new();
    for (server, base) in bases.iter().enumerate() {
        for c in 0..args.callers {
            let (client, stop) = (client.clone(), stop.clone());
            let limit = c % 2;
            let url = format!("{base}/v1/limit");
            let body = if limit == 0 {
                r#"{"limit": "closed", "key": "shared"}"#
            } else {
                r#"{"limit": "open", "key": "shared"}"#
            };
            callers.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let sent = start.elapsed();
                    let call = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body);
                    let status = match call.send().await {
                        Ok(r) => r.status().as_u16(),
                        Err(_) => 0,
                    };
                    let latency = start.elapsed() - sent;
                    seen.push(Answer {
                        server,
                        limit,
                        sent,
                        latency,
                        status,
                    });
                }
                seen
            }));
        }
    }
    // /readyz of every server, every 25 ms: its transitions.
    let probes: Vec<_> = bases
        .iter()
        .enumerate()
        .map(|(server, base)| {
            let (client, stop, url) = (client.clone(), stop.clone(), format!("{base}/readyz"));
            tokio::spawn(async move {
                let mut flips: Vec<(Duration, u16)> = Vec::new();
                let mut last = 200;
                while !stop.load(Ordering::Relaxed) {
                    let at = start.elapsed();
                    let status = client
                        .get(&url)
                        .send()
                        .await
                        .map_or(0, |r| r.status().as_u16());
                    if status != last {
                        flips.push((at, status));
                        last = status;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                (server, flips)
            })
        })
        .collect();

    let phase = Duration::from_secs_f64(args.phase);
    let mut phases = vec![Phase {
        name: "steady",
        start: Duration::ZERO,
    }];
    let mark = |name, phases: &mut Vec<Phase>| {
        phases.push(Phase {
            name,
            start: start.elapsed(),
        })
    };
    tokio::time::sleep(phase).await;
    let r = redis.as_ref().expect("redis runs");
    signal(&r.0, "-STOP")?;
    mark("redis paused (SIGSTOP)", &mut phases);
    tokio::time::sleep(phase).await;
    signal(&r.0, "-CONT")?;
    mark("resumed", &mut phases);
    tokio::time::sleep(phase).await;
    drop(redis.take());
    mark("redis killed (SIGKILL)", &mut phases);
    tokio::time::sleep(phase).await;
    redis = Some(start_redis(redis_port, dir.path())?);
    mark("restarted, empty", &mut phases);
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    let end = start.elapsed();

    let mut answers: Vec<Answer> = Vec::new();
    for c in callers {
        answers.extend(c.await?);
    }
    let mut flips = Vec::new();
    for p in probes {
        flips.push(p.await?);
    }
    drop(redis);
    drop(servers);
    let report = report(&args, &phases, end, &answers, &flips);
    print!("{report}");
    if let Some(out) = &args.out {
        std::fs::write(out, &report)?;
    }
    Ok(())
}

fn report(
    args: &Args,
    phases: &[Phase],
    end: Duration,
    answers: &[Answer],
    flips: &[(usize, Vec<(Duration, u16)>)],
) -> String {
    let deadline = Duration::from_millis(args.timeout_ms);
    // What an answer may take beyond the store's deadline: the HTTP round
    // trip on a loaded 2-core machine.
    let slack = Duration::from_millis(25);
    let bound_of =
        |from: Duration, to: Duration| args.burst + args.rate * (to - from).as_secs_f64();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} `sluice serve` processes on one redis-server, {} callers each (half on a limit that \
         fails closed, half on one that fails open, both {} a second with a burst of {} on one \
         shared key), store deadline {} ms, phases of {} s.\n",
        args.servers, args.callers, args.rate, args.burst, args.timeout_ms, args.phase
    );
    let _ = writeln!(
        out,
        "| phase | from (s) | answers | closed: admitted / exact bound | closed: 503 | open: admitted | p50 ms | p99 ms | max ms | over {} ms | no answer |",
        (deadline + slack).as_millis()
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    let bounds: Vec<Duration> = phases.iter().map(|p| p.start).chain([end]).collect();
    for (i, p) in phases.iter().enumerate() {
        let (from, to) = (bounds[i], bounds[i + 1]);
        let inside: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.sent >= from && a.sent < to)
            .collect();
        let mut lat: Vec<Duration> = inside.iter().map(|a| a.latency).collect();
        lat.sort();
        let admitted = |limit| {
            inside
                .iter()
                .filter(|a| a.limit == limit && a.status == 200)
                .count()
        };
        let closed_503 = inside
            .iter()
            .filter(|a| a.limit == 0 && a.status == 503)
            .count();
        let late = inside
            .iter()
            .filter(|a| a.latency > deadline + slack)
            .count();
        let lost = inside.iter().filter(|a| a.status == 0).count();
        let _ = writeln!(
            out,
            "| {} | {:.2} | {} | {} / {:.0} | {} | {} | {} | {} | {} | {} | {} |",
            p.name,
            from.as_secs_f64(),
            inside.len(),
            admitted(0),
            bound_of(from, to),
            closed_503,
            admitted(1),
            ms(pct(&lat, 0.5)),
            ms(pct(&lat, 0.99)),
            ms(lat.last().copied().unwrap_or_default()),
            late,
            lost
        );
    }
    // Redis keeps the bucket across a pause but loses it when killed, so the
    // exact bound holds over each of Redis's lifetimes: burst + rate x time.
    let restart = phases
        .iter()
        .find(|p| p.name.starts_with("restarted"))
        .map_or(end, |p| p.start);
    let _ = writeln!(
        out,
        "\n| Redis lifetime | closed: admitted | exact bound | within |"
    );
    let _ = writeln!(out, "|---|---|---|---|");
    for (name, from, to) in [
        ("first (start to kill)", Duration::ZERO, restart),
        ("second (restart to end)", restart, end),
    ] {
        let admitted = answers
            .iter()
            .filter(|a| a.limit == 0 && a.status == 200 && a.sent >= from && a.sent < to)
            .count();
        // An admission sent just before `to` may land after it: the bound
        // takes the latest answer of the span as its end.
        let last = answers
            .iter()
            .filter(|a| a.sent >= from && a.sent < to)
            .map(|a| a.sent + a.latency)
            .max()
            .unwrap_or(to);
        let bound = bound_of(from, last);
        let _ = writeln!(
            out,
            "| {name} | {admitted} | {bound:.0} | {} |",
            if admitted as f64 <= bound {
                "yes"
            } else {
                "**NO**"
            }
        );
    }
    // Recovery: from Redis coming back to each server's first decided answer
    // on the limit that fails closed (a 200 on the other may be a fail-open).
    let _ = writeln!(
        out,
        "\n| Redis back at | server | first decision after (ms) | /readyz 200 after (ms) |"
    );
    let _ = writeln!(out, "|---|---|---|---|");
    for back in phases
        .iter()
        .filter(|p| p.name == "resumed" || p.name.starts_with("restarted"))
    {
        for server in 0..args.servers {
            let first = answers
                .iter()
                .filter(|a| {
                    a.server == server
                        && a.limit == 0
                        && a.sent >= back.start
                        && matches!(a.status, 200 | 429)
                })
                .map(|a| a.sent + a.latency)
                .min();
            let ready = flips
                .iter()
                .find(|(s, _)| *s == server)
                .and_then(|(_, f)| f.iter().find(|(at, st)| *at >= back.start && *st == 200))
                .map(|(at, _)| *at);
            let after = |t: Option<Duration>| {
                t.map_or("never".into(), |t| ms(t.saturating_sub(back.start)))
            };
            let _ = writeln!(
                out,
                "| {} ({:.2} s) | {server} | {} | {} |",
                back.name,
                back.start.as_secs_f64(),
                after(first),
                after(ready)
            );
        }
    }
    let _ = writeln!(out, "\n/readyz transitions (polled every 25 ms):\n");
    let _ = writeln!(out, "| server | transitions (s → status) |");
    let _ = writeln!(out, "|---|---|");
    let by_server: BTreeMap<usize, &Vec<(Duration, u16)>> =
        flips.iter().map(|(s, f)| (*s, f)).collect();
    for (server, f) in by_server {
        let list: Vec<String> = f
            .iter()
            .map(|(at, st)| format!("{:.2} → {st}", at.as_secs_f64()))
            .collect();
        let _ = writeln!(
            out,
            "| {server} | {} |",
            if list.is_empty() {
                "none".into()
            } else {
                list.join(", ")
            }
        );
    }
    out
}
