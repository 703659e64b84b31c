//! `sluice simulate`: a scenario of calls run through each algorithm at
//! the same limit, in virtual time, on the engine `sluice replay` decides
//! with, and what each did, as numbers (`summary.json`), charts (SVG) and
//! one self-contained page (`report.html`).

mod report;
mod run;
mod scenario;

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use crate::chart::{self, Series};
use crate::html::Figure;
use run::{ALGORITHMS, CallRecord, Run, Totals};
use scenario::Scenario;

/// `sluice simulate`.
#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// A built-in scenario: double-window, burst-then-steady, many-clients,
    /// thundering-herd or shaped-vs-refused. Not with --file.
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    pub(crate) scenario: Option<String>,
    /// A scenario of one's own, as JSON: {"name", "rate", "period",
    /// "waves": [{"at", "count", "over", "key"}], "retries"}, or with
    /// "shaping": {"burst", "max_reserved", "max"} instead of "retries".
    #[arg(long, env = "SLUICE_SCENARIO")]
    pub(crate) file: Option<PathBuf>,
    /// Where the report, the charts and summary.json go (made if missing).
    #[arg(long, short, env = "SLUICE_OUT")]
    pub(crate) out: PathBuf,
}

/// What `summary.json` holds.
#[derive(Debug, Serialize)]
struct Summary<'a> {
    scenario: &'a str,
    description: &'a str,
    rate: f64,
    period: f64,
    /// Each algorithm's totals; denied clients retry with Sluice's jitter.
    algorithms: Vec<Totals>,
    /// The same without jitter, for a scenario whose clients retry.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    without_jitter: Vec<Totals>,
}

pub(crate) fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    let scenario = match (&args.scenario, &args.file) {
        (_, Some(file)) => Scenario::from_file(file)?,
        (Some(name), None) => Scenario::built_in(name)?,
        (None, None) => anyhow::bail!("name a scenario, or give --file"),
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("{}: cannot make the directory", args.out.display()))?;
    // The in-memory store answers at once, so one thread runs the engine.
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let (with, without) = runtime.block_on(async {
        let mut with = Vec::new();
        let mut without = Vec::new();
        if scenario.shaping.is_some() {
            for delay in [true, false] {
                with.push(run::shaped(&scenario, delay).await?);
            }
            return anyhow::Ok((with, without));
        }
        for alg in ALGORITHMS {
            with.push(run::run(alg, &scenario, true).await?);
            if scenario.retries > 0 {
                without.push(run::run(alg, &scenario, false).await?);
            }
        }
        anyhow::Ok((with, without))
    })?;
    let summary = Summary {
        scenario: &scenario.name,
        description: &scenario.description,
        rate: scenario.rate,
        period: scenario.period,
        algorithms: with.iter().map(|r| r.totals.clone()).collect(),
        without_jitter: without.iter().map(|r| r.totals.clone()).collect(),
    };
    let json = serde_json::to_vec_pretty(&summary)?;
    let summary_path = args.out.join("summary.json");
    std::fs::write(&summary_path, json)
        .with_context(|| format!("{}: cannot write", summary_path.display()))?;
    let charts = if scenario.shaping.is_some() {
        shaping_charts(&scenario, &with)?
    } else {
        charts(&scenario, &with, &without)?
    };
    for f in &charts {
        let path = args.out.join(format!("{}.svg", f.id));
        std::fs::write(&path, &f.svg)
            .with_context(|| format!("{}: cannot write", path.display()))?;
    }
    report::write(
        &args.out.join("report.html"),
        &scenario,
        &summary.algorithms,
        &summary.without_jitter,
        &charts,
    )?;
    eprintln!(
        "{}: report.html, summary.json and {} charts in {}",
        scenario.name,
        charts.len(),
        args.out.display()
    );
    Ok(())
}

/// The width of a chart's time bins: the first of 1, 2 and 5 times a power
/// of ten that makes about `bins` bins across `(start, end)`, or fewer.
fn bin_width((start, end): (f64, f64), bins: usize) -> f64 {
    let raw = ((end - start) / bins as f64).max(0.001);
    // Counted in whole milliseconds, so that 0.05 is 50 / 1000, exactly
    // what a reader expects to see.
    let mut scale: u64 = 1;
    loop {
        for step in [1, 2, 5] {
            let ms = step * scale;
            if ms as f64 / 1000.0 >= raw || scale > 1 << 40 {
                return ms as f64 / 1000.0;
            }
        }
        scale *= 10;
    }
}

/// The times of the first and the last of `calls` (0 and 0 for none).
fn span(calls: &[CallRecord]) -> (f64, f64) {
    let start = calls.iter().map(|c| c.t).fold(f64::INFINITY, f64::min);
    let end = calls.iter().map(|c| c.t).fold(0.0, f64::max);
    (start.min(end), end)
}

/// Counts per bin of the calls `keep` picks, from the bin of the first
/// call to that of the last, as points at each bin's start.
fn per_bin(
    calls: &[CallRecord],
    width: f64,
    keep: impl Fn(&CallRecord) -> bool,
) -> Vec<(f64, f64)> {
    let times = calls.iter().filter(|c| keep(c)).map(|c| c.t);
    counts(times, width, span(calls))
}

/// How many of `times` fall in each bin of `width`, from the bin of
/// `start` to that of `end`, as points at each bin's start; a time
/// outside counts in the first or the last bin. A time on a bin's edge
/// (to the microsecond) is in the bin it starts.
fn counts(
    times: impl Iterator<Item = f64>,
    width: f64,
    (start, end): (f64, f64),
) -> Vec<(f64, f64)> {
    let bin = |t: f64| (run::micros(t) as f64 / run::micros(width).max(1) as f64).floor();
    let first = bin(start);
    let bins = (bin(end) - first).max(0.0) as usize + 1;
    let mut counts = vec![0.0; bins];
    for t in times {
        let i = (bin(t) - first).max(0.0) as usize;
        counts[i.min(bins - 1)] += 1.0;
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(i, n)| ((first + i as f64) * width, n))
        .collect()
}

/// [`per_bin`] added up: from 0 at the start of the first bin, the total
/// at the end of each.
fn running_total(
    calls: &[CallRecord],
    width: f64,
    keep: impl Fn(&CallRecord) -> bool,
) -> Vec<(f64, f64)> {
    let bins = per_bin(calls, width, keep);
    let mut total = 0.0;
    let start = bins.first().map_or(0.0, |&(t, _)| t);
    std::iter::once((start, 0.0))
        .chain(bins.into_iter().map(|(t, n)| {
            total += n;
            (t + width, total)
        }))
        .collect()
}

/// Draws every chart of a scenario that compares the algorithms.
fn charts(s: &Scenario, with: &[Run], without: &[Run]) -> anyhow::Result<Vec<Figure>> {
    let by_algorithm = |points: &dyn Fn(&Run) -> Vec<(f64, f64)>| -> Vec<Series> {
        with.iter()
            .map(|r| Series {
                name: r.totals.algorithm.to_owned(),
                points: points(r),
            })
            .collect()
    };
    let width = with.first().map_or(1.0, |r| bin_width(span(&r.calls), 100));
    let mut drawn = vec![
        Figure {
            id: "admitted".to_owned(),
            svg: chart::lines(
                "Calls admitted so far",
                ("seconds", "admitted"),
                &by_algorithm(&|r| running_total(&r.calls, width, |c| c.allowed)),
            )?,
            caption: format!(
                "Calls admitted from the first call on, by algorithm, counted every {width} s; \
                 the limit is {} per {} s, so a line that climbs more than {} within {} s \
                 admitted a burst above it",
                s.rate, s.period, s.rate, s.period
            ),
        },
        Figure {
            id: "remaining".to_owned(),
            svg: chart::lines(
                "What the first key has left",
                ("seconds", "remaining"),
                &by_algorithm(&|r| {
                    r.calls
                        .iter()
                        .filter(|c| c.key == 0)
                        .filter_map(|c| Some((c.t, c.remaining? as f64)))
                        .collect()
                }),
            )?,
            caption:
                "Tokens (or room in the window) the first key has left after each of its calls"
                    .to_owned(),
        },
        Figure {
            id: "retry_after".to_owned(),
            svg: chart::lines(
                "How long denied calls were told to wait",
                ("retry_after (s)", "denials"),
                &by_algorithm(&|r| {
                    histogram(
                        r.calls
                            .iter()
                            .filter_map(|c| c.retry_after.filter(|_| !c.allowed)),
                    )
                }),
            )?,
            caption: "Denials by the exact retry_after they were told, in twenty bins".to_owned(),
        },
    ];
    if let (Some(w), Some(wo)) = (with.first(), without.first()) {
        // Seconds, to show each second's herd, unless that would make more
        // bins than a line is drawn with (a scenario may last a year).
        let (a, b) = (span(&w.calls), span(&wo.calls));
        let both = (a.0.min(b.0), a.1.max(b.1));
        let width = bin_width(both, 100)
            .min(1.0)
            .max(bin_width(both, chart::MOST_POINTS));
        let herd = [
            Series {
                name: "with jitter".to_owned(),
                points: per_bin(&w.calls, width, |c| c.attempt > 0),
            },
            Series {
                name: "without jitter".to_owned(),
                points: per_bin(&wo.calls, width, |c| c.attempt > 0),
            },
        ];
        drawn.push(Figure {
            id: "herd".to_owned(),
            svg: chart::lines("Retries over time", ("seconds", "retries"), &herd)?,
            caption: format!(
                "Retries every {width} s under the {}, with Sluice's per-key Retry-After \
                 jitter and without it",
                w.totals.algorithm
            ),
        });
    }
    Ok(drawn)
}

/// The charts of a shaped scenario, whose runs are the delaying one and
/// the refusing one: what reaches the upstream, per second, beside what
/// was sent; and how many calls the delaying run held.
fn shaping_charts(s: &Scenario, runs: &[Run]) -> anyhow::Result<Vec<Figure>> {
    let end = runs
        .iter()
        .flat_map(|r| r.calls.iter().filter_map(CallRecord::forwarded))
        .chain(runs.iter().map(|r| span(&r.calls).1))
        .fold(0.0, f64::max);
    let start = runs.iter().map(|r| span(&r.calls).0).fold(end, f64::min);
    let width = bin_width((start, end), 60);
    let per_second = |times: &mut dyn Iterator<Item = f64>| -> Vec<(f64, f64)> {
        counts(times, width, (start, end))
            .into_iter()
            .map(|(t, n)| (t, n / width))
            .collect()
    };
    let mut upstream = Vec::new();
    if let Some(r) = runs.first() {
        upstream.push(Series {
            name: "sent".to_owned(),
            points: per_second(&mut r.calls.iter().map(|c| c.t)),
        });
    }
    for r in runs {
        upstream.push(Series {
            name: format!("reaching the upstream, {}", r.totals.algorithm),
            points: per_second(&mut r.calls.iter().filter_map(CallRecord::forwarded)),
        });
    }
    let shaping = s.shaping.as_ref();
    let (burst, max) = shaping.map_or((0.0, 0.0), |sh| (sh.burst, sh.max));
    let mut drawn = vec![Figure {
        id: "upstream".to_owned(),
        svg: chart::lines(
            "What reaches the upstream",
            ("seconds", "calls per second"),
            &upstream,
        )?,
        caption: format!(
            "Calls sent and calls reaching the upstream, per second over each {width} s, under \
             a token bucket of {} per {} s with a burst of {burst}: delayed, each call over the \
             limit is held until the bucket has room for it (up to {max} s), so the upstream \
             gets the whole rate; refused, it gets what the bucket held when the calls came",
            s.rate, s.period
        ),
    }];
    if let Some(r) = runs.iter().find(|r| r.totals.algorithm == "delayed") {
        drawn.push(Figure {
            id: "held".to_owned(),
            svg: chart::lines(
                "Calls held",
                ("seconds", "held"),
                &[Series {
                    name: "held, delayed".to_owned(),
                    points: held_over_time(&r.calls),
                }],
            )?,
            caption: format!(
                "Calls held at once in the delaying run: never more than max_reserved ({})",
                shaping.map_or(0.0, |sh| sh.max_reserved)
            ),
        });
    }
    Ok(drawn)
}

/// The number of calls held, as a step at each arrival and forwarding.
fn held_over_time(calls: &[CallRecord]) -> Vec<(f64, f64)> {
    let mut before = 0.0;
    let mut points = vec![(span(calls).0, 0.0)];
    for (t, n) in run::held(calls) {
        points.push((t, before));
        before = n as f64;
        points.push((t, before));
    }
    points
}

/// Twenty equal bins from 0 to the largest value, as (bin start, count).
fn histogram(values: impl Iterator<Item = f64>) -> Vec<(f64, f64)> {
    let values: Vec<f64> = values.collect();
    let most = values.iter().copied().fold(0.0, f64::max).max(1e-9);
    let width = most / 20.0;
    let mut counts = [0.0; 21];
    for v in values {
        counts[((v / width).floor() as usize).min(20)] += 1.0;
    }
    counts
        .iter()
        .enumerate()
        .map(|(i, &n)| (i as f64 * width, n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: f64) -> CallRecord {
        CallRecord {
            t,
            key: 0,
            allowed: true,
            retry_after: None,
            remaining: None,
            attempt: 0,
            delay: 0.0,
        }
    }

    #[test]
    fn bins_are_round_and_about_a_hundred_across_the_calls() {
        let width = |calls: &[CallRecord]| bin_width(span(calls), 100);
        assert_eq!(width(&[at(0.0), at(100.0)]), 1.0);
        assert_eq!(width(&[at(0.0), at(150.0)]), 2.0);
        assert_eq!(width(&[at(0.0), at(3.0)]), 0.05);
        // Only the span of the calls counts, wherever it starts.
        assert_eq!(width(&[at(59.0), at(61.0)]), 0.02);
        assert_eq!(width(&[]), 0.001);
        assert_eq!(bin_width((0.0, 86_400.0 * 366.0), 1440), 50_000.0);
        let points = per_bin(&[at(0.0), at(0.4), at(1.0)], 0.5, |c| c.allowed);
        assert_eq!(points, [(0.0, 2.0), (0.5, 0.0), (1.0, 1.0)]);
    }

    #[test]
    fn the_running_total_starts_at_the_first_calls_bin_and_rises_by_each_bin() {
        let calls = [at(10.1), at(10.4), at(11.2)];
        let points = running_total(&calls, 0.5, |c| c.allowed);
        assert_eq!(points, [(10.0, 0.0), (10.5, 2.0), (11.0, 2.0), (11.5, 3.0)]);
    }
}
