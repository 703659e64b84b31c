//! `sluice replay --report FILE.html`: what the rules did to the replayed
//! traffic, over time, for people to read before they switch a rule from
//! shadow to enforce.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use sluice_engine::Verdict;
use sluice_policy::Policy;

use crate::chart::{self, Series};
use crate::html::{Figure, escape, figures, page};

/// The most time bins kept per rule: past it, bins merge pairwise, so a
/// replay of any length takes bounded memory.
const MAX_BINS: usize = 2_000;

/// The longest `retry_after` counted in its own whole-second bin; longer
/// waits share the last.
const MAX_WAIT: usize = 3_600;

/// What happened to one rule's hits in one time bin.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    allowed: u64,
    denied: u64,
    shadow_allowed: u64,
    shadow_denied: u64,
}

/// Counts kept while replaying, for the report.
pub(crate) struct Report {
    names: Vec<String>,
    shadow: Vec<bool>,
    /// Seconds a bin spans: 1, doubled each time the bins would pass
    /// [`MAX_BINS`].
    width: f64,
    bins: BTreeMap<i64, Vec<Counts>>,
    /// Denials by their `retry_after` in whole seconds (rounded up).
    waits: Vec<u64>,
}

impl Report {
    pub(crate) fn new(policy: &Policy) -> Report {
        let rules = policy.rules().iter().map(|r| (r.name(), r.enforcement()));
        let limits = policy
            .named_limits()
            .iter()
            .map(|l| (l.name(), l.enforcement()));
        let (names, shadow) = rules
            .chain(limits)
            .map(|(n, m)| (n.to_owned(), m == sluice_policy::Enforcement::Shadow))
            .unzip();
        Report {
            names,
            shadow,
            width: 1.0,
            bins: BTreeMap::new(),
            waits: vec![0; MAX_WAIT + 1],
        }
    }

    fn counts(&mut self, t: f64, name: &str) -> Option<&mut Counts> {
        let i = self.names.iter().position(|n| n == name)?;
        let bin = (t / self.width).floor() as i64;
        if !self.bins.contains_key(&bin) && self.bins.len() >= MAX_BINS {
            self.coarsen();
            return self.counts(t, name);
        }
        let n = self.names.len();
        self.bins
            .entry(bin)
            .or_insert_with(|| vec![Counts::default(); n])
            .get_mut(i)
    }

    /// Doubles the width of every bin, merging them pairwise.
    fn coarsen(&mut self) {
        self.width *= 2.0;
        let old = std::mem::take(&mut self.bins);
        for (bin, counts) in old {
            let merged = self
                .bins
                .entry(bin.div_euclid(2))
                .or_insert_with(|| vec![Counts::default(); counts.len()]);
            for (m, c) in merged.iter_mut().zip(counts) {
                m.allowed += c.allowed;
                m.denied += c.denied;
                m.shadow_allowed += c.shadow_allowed;
                m.shadow_denied += c.shadow_denied;
            }
        }
    }

    fn wait(&mut self, retry_after: Option<f64>) {
        if let Some(w) = retry_after.filter(|w| w.is_finite() && *w >= 0.0) {
            let i = (w.ceil() as usize).min(MAX_WAIT);
            self.waits[i] += 1;
        }
    }

    /// Counts a request's verdict at `t`.
    pub(crate) fn verdict(&mut self, t: f64, v: &Verdict) {
        for d in &v.rules {
            if let Some(c) = self.counts(t, &d.rule) {
                if d.decision.allowed {
                    c.allowed += 1;
                } else {
                    c.denied += 1;
                }
            }
        }
        for s in &v.shadow {
            if let Some(c) = self.counts(t, &s.rule) {
                if s.allowed {
                    c.shadow_allowed += 1;
                } else {
                    c.shadow_denied += 1;
                }
            }
        }
        if !v.allowed {
            self.wait(v.retry_after);
        }
    }

    /// Counts a named limit's call at `t`.
    pub(crate) fn call(&mut self, t: f64, limit: &str, allowed: bool, retry_after: Option<f64>) {
        if let Some(c) = self.counts(t, limit) {
            if allowed {
                c.allowed += 1;
            } else {
                c.denied += 1;
            }
        }
        if !allowed {
            self.wait(retry_after);
        }
    }

    /// One line per rule of `pick`'s count in each bin.
    fn series(&self, pick: impl Fn(&Counts) -> u64, only: impl Fn(usize) -> bool) -> Vec<Series> {
        let first = self.bins.keys().next().copied().unwrap_or(0);
        (0..self.names.len())
            .filter(|&i| only(i))
            .map(|i| Series {
                name: self.names[i].clone(),
                points: self
                    .bins
                    .iter()
                    .map(|(&bin, counts)| {
                        ((bin - first) as f64 * self.width, pick(&counts[i]) as f64)
                    })
                    .collect(),
            })
            .filter(|s| s.points.iter().any(|p| p.1 > 0.0))
            .collect()
    }

    /// Writes the page: `summary` (the replay's totals, as `--summary`
    /// prints them), then the charts.
    pub(crate) fn write(&self, path: &Path, summary: &serde_json::Value) -> anyhow::Result<()> {
        let width = self.width;
        let enforced = |i: usize| !self.shadow[i];
        let shadowed = |i: usize| self.shadow[i];
        let waits: Vec<(f64, f64)> = self
            .waits
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(s, n)| (s as f64, *n as f64))
            .collect();
        let figures_list = [
            Figure {
                id: "denied".to_owned(),
                svg: chart::lines(
                    "Denied, by enforced rule",
                    ("seconds", "denied"),
                    &self.series(|c| c.denied, enforced),
                )?,
                caption: format!("Requests and calls each enforced rule denied, every {width} s"),
            },
            Figure {
                id: "allowed".to_owned(),
                svg: chart::lines(
                    "Allowed, by enforced rule",
                    ("seconds", "allowed"),
                    &self.series(|c| c.allowed, enforced),
                )?,
                caption: format!("What each enforced rule let through, every {width} s"),
            },
            Figure {
                id: "shadow".to_owned(),
                svg: chart::lines(
                    "What shadow rules would have denied",
                    ("seconds", "would deny"),
                    &self.series(|c| c.shadow_denied, shadowed),
                )?,
                caption: format!(
                    "Requests each shadow rule would have denied had it been enforced, every \
                     {width} s: read this before switching it to enforce"
                ),
            },
            Figure {
                id: "retry_after".to_owned(),
                svg: chart::lines(
                    "How long denied requests were told to wait",
                    ("retry_after (s, rounded up)", "denials"),
                    &[Series {
                        name: "denials".to_owned(),
                        points: waits,
                    }],
                )?,
                caption: "Denials by retry_after, in whole seconds (an hour or more in the last)"
                    .to_owned(),
            },
        ];
        let mut out = String::with_capacity(1 << 16);
        let _ = write!(
            out,
            "<h1>Replay report</h1><p>{} events: {} allowed, {} denied, {} matched no rule.</p>\
             <table><thead><tr><th>rule</th><th>mode</th><th>hits</th><th>allowed</th>\
             <th>denied</th><th>rolled back</th><th>top denied keys</th></tr></thead><tbody>",
            summary["events"], summary["allowed"], summary["denied"], summary["unmatched"]
        );
        let rows = summary["rules"]
            .as_array()
            .into_iter()
            .chain(summary["limits"].as_array())
            .flatten();
        for r in rows {
            let top: Vec<String> = r["top_denied_keys"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|k| format!("{} ({})", k[0].as_str().unwrap_or(""), k[1]))
                .collect();
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(r["name"].as_str().unwrap_or("")),
                escape(r["mode"].as_str().unwrap_or("")),
                r["hits"],
                r["allowed"],
                r["denied"],
                r["rolled_back"],
                escape(&top.join(", "))
            );
        }
        out.push_str("</tbody></table>");
        figures(&mut out, &figures_list);
        std::fs::write(path, page("Sluice replay report", &out))
            .with_context(|| format!("{}: cannot write the report", path.display()))
    }
}
