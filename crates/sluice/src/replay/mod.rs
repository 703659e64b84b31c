//! `sluice replay`: events in, one decision per event out, in virtual time.
//!
//! Time comes from each event's `t`, so a day of traffic replays in as long
//! as it takes to compute the decisions.

#[cfg(test)]
mod agreement;
mod event;
mod line;
mod replayer;
mod report;
mod summary;

pub(crate) use event::{Call, Hold};
pub(crate) use replayer::Replayer;

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use sluice_policy::Policy;

use event::{Event, EventLines};
use line::Line;
use sluice_core::Store;
use sluice_server::flags::PolicyFile;

/// Arguments of `sluice replay`.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    #[command(flatten)]
    pub(crate) policy: PolicyFile,
    /// Events as JSON Lines sorted by `t`; `-` reads standard input.
    #[arg(long, short, env = "SLUICE_EVENTS")]
    pub(crate) events: PathBuf,
    /// Write decisions here instead of standard output.
    #[arg(long, short, env = "SLUICE_OUTPUT")]
    pub(crate) output: Option<PathBuf>,
    /// After the decisions, print per-rule totals: a JSON line
    /// `{"summary": ...}` on the output and a table on standard error.
    #[arg(long, env = "SLUICE_SUMMARY")]
    pub(crate) summary: bool,
    /// No progress lines on standard error.
    #[arg(long, short, env = "SLUICE_QUIET")]
    pub(crate) quiet: bool,
    /// Seed for the shard choices of sharded limits, so runs repeat exactly.
    #[arg(long, default_value_t = 0, env = "SLUICE_SEED")]
    pub(crate) seed: u64,
    /// Also write a report for people to this HTML file: each rule's
    /// decisions over time, what shadow rules would have denied, the top
    /// denied keys and the waits denials were told. One file, with its
    /// charts inline.
    #[arg(long, env = "SLUICE_REPORT")]
    pub(crate) report: Option<PathBuf>,
}

/// How often, at most, a progress line is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

pub(crate) fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    let policy = Policy::from_path(&args.policy.path)?;
    let events_name = args.events.display().to_string();
    let input: Box<dyn BufRead> = if args.events.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let file = File::open(&args.events)
            .with_context(|| format!("{events_name}: cannot open the events file"))?;
        Box::new(BufReader::with_capacity(1 << 16, file))
    };
    let output: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(
            File::create(path).with_context(|| format!("{}: cannot create", path.display()))?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = BufWriter::with_capacity(1 << 16, output);
    let mut report = args.report.as_ref().map(|_| report::Report::new(&policy));
    let mut replayer = Replayer::new(policy, args.seed);
    let progress = (!args.quiet).then(Progress::new);
    // The in-memory store answers at once, so one thread runs the engine.
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    runtime.block_on(replay(
        input,
        &mut out,
        &mut replayer,
        &events_name,
        progress,
        report.as_mut(),
    ))?;
    if let (Some(path), Some(report)) = (&args.report, &report) {
        report.write(path, &replayer.summary.finished_json())?;
    }
    if args.summary {
        replayer
            .summary
            .write(&mut out, &mut std::io::stderr().lock())?;
    }
    out.flush()?;
    Ok(())
}

async fn replay<S: Store + 'static>(
    input: impl BufRead,
    out: &mut impl Write,
    replayer: &mut Replayer<S>,
    events_name: &str,
    mut progress: Option<Progress>,
    mut report: Option<&mut report::Report>,
) -> anyhow::Result<()> {
    let mut last_t = f64::NEG_INFINITY;
    let mut count = 0u64;
    let mut lines = EventLines::new(input, events_name);
    while let Some((n, line)) = lines.next_line()? {
        if line.trim().is_empty() {
            continue;
        }
        let (t_raw, event) =
            event::parse(line).with_context(|| format!("{events_name}:{n}: bad event"))?;
        let t = t_raw.as_f64().unwrap_or(f64::NAN);
        if t < last_t {
            anyhow::bail!(
                "{events_name}:{n}: events out of time order: t = {t} comes after t = {last_t}"
            );
        }
        last_t = t;
        replayer
            .set_time(t)
            .await
            .with_context(|| format!("{events_name}:{n}"))?;
        match event {
            Event::Request(req, duration) => {
                // `ip` is the peer, as for /v1/enforce and the middleware.
                let req = req.with_client_behind(replayer.trusted_proxies());
                let verdict = replayer.request(&req, duration).await;
                if let Some(r) = report.as_deref_mut() {
                    r.verdict(t, &verdict);
                }
                let line = Line::request(&t_raw, &verdict, replayer.policy());
                serde_json::to_writer(&mut *out, &line)?;
            }
            Event::Release { limit, key, lease } => {
                let line = replayer
                    .release(&t_raw, &limit, &key, &lease)
                    .await
                    .with_context(|| format!("{events_name}:{n}"))?;
                serde_json::to_writer(&mut *out, &line)?;
            }
            Event::Call(call) => {
                let line = replayer
                    .call(&t_raw, &call)
                    .await
                    .with_context(|| format!("{events_name}:{n}"))?;
                if let Some(r) = report.as_deref_mut() {
                    r.call(t, &call.limit, line.allowed, line.retry_after);
                }
                serde_json::to_writer(&mut *out, &line)?;
            }
        }
        out.write_all(b"\n")?;
        count += 1;
        if let Some(p) = progress.as_mut() {
            p.tick(count, t);
        }
    }
    if let Some(p) = progress.as_mut() {
        p.done(count, last_t);
    }
    Ok(())
}

/// Progress lines on standard error, at most one every [`PROGRESS_EVERY`].
struct Progress {
    started: Instant,
    last: Instant,
}

impl Progress {
    fn new() -> Self {
        let now = Instant::now();
        Progress {
            started: now,
            last: now,
        }
    }

    fn tick(&mut self, count: u64, t: f64) {
        // Reading the clock every event would cost more than deciding it.
        if count.is_multiple_of(4096) && self.last.elapsed() >= PROGRESS_EVERY {
            self.last = Instant::now();
            self.report("replaying", count, t);
        }
    }

    fn done(&self, count: u64, t: f64) {
        if self.started.elapsed() >= PROGRESS_EVERY {
            self.report("replayed", count, t);
        }
    }

    fn report(&self, what: &str, count: u64, t: f64) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        eprintln!(
            "{what}: {count} events, virtual t = {t:.3} s, {:.0} events/s",
            count as f64 / secs
        );
    }
}
