//! `sluice bench`: a closed-loop load generator for HTTP and gRPC rate
//! limit services.
//!
//! Each worker sends its next request as soon as the previous answer has
//! arrived (like `wrk`), so the numbers are what the server sustains at that
//! concurrency. A closed loop hides the requests a stalled server would have
//! received meanwhile (coordinated omission): the tail latencies are the
//! latencies of the requests that were sent, not of an open arrival stream.
//!
//! The run has a warm-up, whose requests count in the progress lines but not
//! in the result, then the measured window. Every worker keeps its own
//! latency histogram and counters, merged once at the end, so workers share
//! nothing on the hot path but a relaxed atomic counter of their own.

mod baseline;
mod grpc;
mod http;
mod report;
mod rls_baseline;
mod template;

use std::io::{IsTerminal, Write};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use tokio::time::Instant;

use report::{Protocol, Tally};

use sluice_server::flags::Threads;

/// Arguments of `sluice bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Load an HTTP endpoint (by default `sluice serve`'s `POST /v1/limit`)
    /// over N keep-alive HTTP/1.1 connections, one request in flight on each.
    Http(http::HttpArgs),
    /// Load an Envoy rate limit service (RLS v3 `ShouldRateLimit`) with N
    /// calls in flight over a few HTTP/2 connections.
    Grpc(grpc::GrpcArgs),
    /// A bare hyper server answering every request with a fixed decision:
    /// the baseline `sluice serve` is compared with, and a trivial upstream
    /// for `sluice proxy`.
    #[command(hide = true)]
    Baseline(baseline::BaselineArgs),
    /// A bare tonic server answering every Envoy `ShouldRateLimit` with
    /// OK: the baseline `sluice serve`'s rate limit service is compared
    /// with.
    #[command(hide = true)]
    RlsBaseline(rls_baseline::RlsBaselineArgs),
}

/// The options every load run has.
#[derive(Debug, Args)]
// A benchmark's threads are its own: `SLUICE_THREADS`, set for a server,
// does not reach it.
#[command(mut_arg("threads", |a| a.env(None::<&'static str>)))]
struct LoadArgs {
    /// The server, as `host:port` or `http://host:port`.
    #[arg(long, short)]
    target: Target,
    /// Requests in flight at any time (workers, each sending back to back).
    #[arg(long, short, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    concurrency: u32,
    /// Seconds measured, after the warm-up.
    #[arg(long, short, default_value = "10", value_parser = positive_secs)]
    duration: Secs,
    /// Seconds of load before the measured window, left out of the result.
    #[arg(long, default_value = "1", value_parser = non_negative_secs)]
    warmup: Secs,
    /// A request not answered within this many seconds counts as an error
    /// and its connection is replaced.
    #[arg(long, default_value = "10", value_parser = positive_secs)]
    timeout: Secs,
    /// How many distinct keys `{key}` ranges over: each request substitutes
    /// `user:%08d` with a random index below this.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    keys: u64,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// No progress lines on standard error.
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    threads: Threads,
}

/// A number of seconds from the command line.
#[derive(Debug, Clone, Copy)]
struct Secs(Duration);

fn parse_secs(s: &str, allow_zero: bool) -> Result<Secs, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    let ok = v.is_finite() && (v > 0.0 || (allow_zero && v == 0.0));
    if !ok {
        let want = if allow_zero {
            "zero or more"
        } else {
            "more than zero"
        };
        return Err(format!("{s:?}: seconds must be {want}"));
    }
    Duration::try_from_secs_f64(v)
        .map(Secs)
        .map_err(|e| format!("{s:?}: {e}"))
}

fn positive_secs(s: &str) -> Result<Secs, String> {
    parse_secs(s, false)
}

fn non_negative_secs(s: &str) -> Result<Secs, String> {
    parse_secs(s, true)
}

/// Milliseconds, finite and not negative, below a minute.
fn non_negative_ms(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(ms) if ms.is_finite() && (0.0..60_000.0).contains(&ms) => Ok(ms),
        _ => Err(format!(
            "{s:?} is not a number of milliseconds from 0 to 60000"
        )),
    }
}

/// Where the load goes: a host (name or address) and a port.
#[derive(Debug, Clone)]
struct Target {
    /// `host:port`, as the `Host` header and HTTP/2 authority carry it.
    authority: String,
}

impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("{s:?} is not a target: {why}; expected host:port or http://host:port")
        };
        let rest = match s.split_once("://") {
            Some(("http", rest)) => rest,
            Some((scheme, _)) => {
                return Err(bad(&format!("the scheme {scheme:?} is not supported")));
            }
            None => s,
        };
        // A trailing slash is harmless; any other path belongs in --path.
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') {
            return Err(bad("give the path with --path, not in the target"));
        }
        let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        let port: u16 = port.parse().map_err(|_| bad("the port is not a number"))?;
        if port == 0 {
            return Err(bad("the port is 0"));
        }
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let valid = !bare.is_empty()
            && bare
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
        if !valid {
            return Err(bad(
                "the host is empty or has characters a host name cannot",
            ));
        }
        // An IPv6 address needs its brackets back in an authority.
        let authority = if bare.contains(':') {
            format!("[{bare}]:{port}")
        } else {
            format!("{bare}:{port}")
        };
        Ok(Target { authority })
    }
}

impl Target {
    /// Resolves the target to a socket address once, so that workers
    /// connecting (and reconnecting) do not each ask the resolver.
    async fn resolve(&self) -> anyhow::Result<std::net::SocketAddr> {
        tokio::net::lookup_host(&self.authority)
            .await
            .with_context(|| format!("cannot resolve {}", self.authority))?
            .next()
            .with_context(|| format!("{} resolves to no address", self.authority))
    }
}

pub(crate) fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Http(a) => runtime(&a.load.threads)?.block_on(http::run(&a)),
        BenchCommand::Grpc(a) => runtime(&a.load.threads)?.block_on(grpc::run(&a)),
        BenchCommand::Baseline(a) => baseline::run(&a),
        BenchCommand::RlsBaseline(a) => rls_baseline::run(&a),
    }
}

/// Binds a baseline server's listener as `serve` binds its own, and
/// prints the address it got on standard output, for the script that
/// started it (port 0 picks one). Within a tokio runtime, as
/// [`sluice_server::listen::bind`].
fn announce(listen: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = sluice_server::listen::bind(listen)
        .with_context(|| format!("cannot listen on {listen}"))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", listener.local_addr()?)?;
    out.flush()?;
    Ok(listener)
}

/// The runtime a client or a bare server runs on: the same as `serve`'s,
/// so that the two sides of a comparison schedule alike.
fn runtime(threads: &Threads) -> anyhow::Result<tokio::runtime::Runtime> {
    sluice_server::runtime(threads).context("cannot start the async runtime")
}

/// When the run's phases start and end.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// The run's start, when the warm-up begins.
    start: Instant,
    /// The measured window's start: answers arriving from here on count.
    measure_from: Instant,
    /// The end of the run: no request is sent from here on and the ones in
    /// flight are abandoned.
    end: Instant,
}

impl Window {
    fn new(load: &LoadArgs) -> Self {
        let start = Instant::now();
        let measure_from = start + load.warmup.0;
        Window {
            start,
            measure_from,
            end: measure_from + load.duration.0,
        }
    }

    /// Whether an answer arriving at `t` belongs to the result.
    fn measures(&self, t: Instant) -> bool {
        t >= self.measure_from && t < self.end
    }
}

/// A worker's running totals, read by the progress line. Each worker owns
/// one, aligned to its own cache line pair, so that workers on different
/// cores never write the same line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Live {
    requests: AtomicU64,
    errors: AtomicU64,
}

impl Live {
    fn add(&self, error: bool) {
        // Only this worker writes; a load and a store are enough, and
        // cheaper than a read-modify-write.
        let r = self.requests.load(Ordering::Relaxed);
        self.requests.store(r + 1, Ordering::Relaxed);
        if error {
            let e = self.errors.load(Ordering::Relaxed);
            self.errors.store(e + 1, Ordering::Relaxed);
        }
    }
}

/// What one worker runs with: the run's window, the time it gives each
/// request, its live counters, and the empty tally it fills and returns.
struct Seat {
    window: Window,
    timeout: Duration,
    live: Arc<Live>,
    tally: Tally,
}

impl Seat {
    /// When the next request must be answered by, or `None` once the run
    /// is over.
    fn deadline(&self) -> Option<Instant> {
        let now = Instant::now();
        (now < self.window.end).then(|| (now + self.timeout).min(self.window.end))
    }

    /// Counts a request that failed before any answer, and why.
    fn failed(&mut self, why: &dyn std::fmt::Display) {
        if self.window.measures(Instant::now()) {
            self.tally.error();
            self.tally.problem(why);
        }
        self.live.add(true);
    }
}

/// Runs `--concurrency` workers made by `worker` (given their index and
/// their seat) to the end of `window`, with a progress line, then merges
/// what they measured.
async fn drive<F, Fut>(load: &LoadArgs, window: Window, mut worker: F) -> anyhow::Result<Tally>
where
    F: FnMut(usize, Seat) -> Fut,
    Fut: Future<Output = Tally> + Send + 'static,
{
    let lives: Vec<Arc<Live>> = (0..load.concurrency).map(|_| Arc::default()).collect();
    let mut handles = Vec::with_capacity(lives.len());
    for (i, live) in lives.iter().enumerate() {
        let seat = Seat {
            window,
            timeout: load.timeout.0,
            live: Arc::clone(live),
            tally: Tally::new()?,
        };
        handles.push(tokio::spawn(worker(i, seat)));
    }
    let progress = (!load.quiet).then(|| tokio::spawn(progress(window, lives.clone())));
    let cpu = tokio::spawn(client_cpu(window));
    let mut total = Tally::new()?;
    for h in handles {
        let tally = h.await.context("a worker failed")?;
        total.merge(&tally)?;
    }
    total.client_cpu = cpu.await.ok().flatten();
    if let Some(p) = progress {
        p.abort();
        let _ = p.await;
        // On a terminal, ends the line the progress kept overwriting, if
        // the run was long enough to print one.
        let printed = window.start + Duration::from_secs(1) < window.end;
        if printed && std::io::stderr().is_terminal() {
            let _ = writeln!(std::io::stderr().lock());
        }
    }
    Ok(total)
}

/// Prints a progress line on standard error about once a second: elapsed
/// time, requests so far, the rate over the last second and errors so far.
async fn progress(window: Window, lives: Vec<Arc<Live>>) {
    let tty = std::io::stderr().is_terminal();
    let mut tick = tokio::time::interval_at(
        window.start + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_n, mut last_t) = (0u64, window.start);
    loop {
        let now = tick.tick().await;
        if now >= window.end {
            break;
        }
        let n: u64 = lives
            .iter()
            .map(|l| l.requests.load(Ordering::Relaxed))
            .sum();
        let e: u64 = lives.iter().map(|l| l.errors.load(Ordering::Relaxed)).sum();
        let rate = (n - last_n) as f64 / (now - last_t).as_secs_f64().max(1e-9);
        (last_n, last_t) = (n, now);
        // The phase of the second that just ended.
        let phase = if now <= window.measure_from {
            "warmup"
        } else {
            "measuring"
        };
        let line = format!(
            "{:>6.1} s  {phase:<9}  {n:>10} requests  {rate:>9.0} req/s  {e} errors",
            (now - window.start).as_secs_f64()
        );
        let mut err = std::io::stderr().lock();
        let _ = if tty {
            // \x1b[K clears what a longer previous line left behind.
            write!(err, "\r{line}\x1b[K")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }
}

/// The CPU time this process used during the measured window, in cores
/// (CPU seconds per second). A load generator that is itself at the limit
/// of the CPUs it has measures its own speed, not the server's; this says
/// whether it was. `None` where `/proc/self/stat` is not readable.
async fn client_cpu(window: Window) -> Option<f64> {
    tokio::time::sleep_until(window.measure_from).await;
    let (t0, c0) = (Instant::now(), process_cpu()?);
    tokio::time::sleep_until(window.end).await;
    let (t1, c1) = (Instant::now(), process_cpu()?);
    Some(c1.saturating_sub(c0).as_secs_f64() / (t1 - t0).as_secs_f64().max(1e-9))
}

/// User plus system CPU time of this process so far, from Linux's
/// `/proc/self/stat` (fields 14 and 15, in clock ticks of 1/100 s: USER_HZ
/// is 100 on every Linux architecture Rust targets, and reading the real
/// value would take `sysconf`, which is unsafe code).
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name, in parentheses, may contain spaces: count fields
    // from after its closing one, where the process state is field 3.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Prints the result on standard output, as text or JSON.
fn print(
    load: &LoadArgs,
    protocol: Protocol,
    what: &str,
    connections: u32,
    window: Window,
    tally: &Tally,
) -> anyhow::Result<()> {
    let result = report::Report {
        protocol,
        target: &load.target.authority,
        what,
        concurrency: load.concurrency,
        connections,
        client_threads: tokio::runtime::Handle::current().metrics().num_workers(),
        warmup: load.warmup.0,
        window: window.end - window.measure_from,
        tally,
    };
    let mut out = std::io::stdout().lock();
    if load.json {
        serde_json::to_writer(&mut out, &result.json())?;
        writeln!(out)?;
    } else {
        result.write_text(&mut out)?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn targets_parse_with_or_without_a_scheme() {
        for (s, want) in [
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://localhost:80/", "localhost:80"),
            ("[::1]:9000", "[::1]:9000"),
            ("http://[::1]:9000", "[::1]:9000"),
        ] {
            assert_eq!(s.parse::<Target>().unwrap().authority, want, "{s}");
        }
        for s in [
            "",
            "localhost",
            "http://",
            "https://a:1",
            "a:0",
            "a:99999",
            "a:1/v1",
            "not a target:1",
            ":80",
        ] {
            assert!(s.parse::<Target>().is_err(), "{s:?} parsed");
        }
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        if cfg!(target_os = "linux") {
            let spin = std::time::Instant::now();
            while spin.elapsed() < Duration::from_millis(30) {}
            assert!(process_cpu().unwrap() > Duration::ZERO);
        }
    }

    #[test]
    fn seconds_may_be_fractional_but_not_negative() {
        assert_eq!(positive_secs("0.25").unwrap().0, Duration::from_millis(250));
        assert!(positive_secs("0").is_err());
        assert!(non_negative_secs("0").is_ok());
        for s in ["-1", "nan", "inf", "1e300", "x"] {
            assert!(non_negative_secs(s).is_err(), "{s}");
        }
    }
}
