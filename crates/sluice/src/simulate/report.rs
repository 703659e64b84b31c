//! `report.html` of a simulation: the summary and every chart on one page.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use super::run::Totals;
use super::scenario::Scenario;
use crate::html::{Figure, escape, figures, page};

fn table(out: &mut String, caption: &str, rows: &[Totals]) {
    let _ = write!(
        out,
        "<table><caption>{}</caption><thead><tr><th>algorithm</th><th>admitted</th>\
         <th>denied</th><th>peak in one period</th><th>limit + burst</th></tr></thead><tbody>",
        escape(caption)
    );
    for t in rows {
        // Above the limit, and as far above it as the formula allows (or,
        // were the formula broken, further): the scenario went all the way
        // through this algorithm's gap.
        let peak = t.peak as f64;
        let over = peak > t.limit && peak >= t.limit + t.burst;
        let _ = write!(
            out,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if over { " class=\"over\"" } else { "" },
            t.algorithm,
            t.admitted,
            t.denied,
            t.peak,
            t.limit + t.burst
        );
    }
    out.push_str("</tbody></table>");
}

/// Writes the report of `s` to `path`: the totals with and (when clients
/// retry) without jitter, and the charts beside it, by file name and
/// caption.
pub(crate) fn write(
    path: &Path,
    s: &Scenario,
    with: &[Totals],
    without: &[Totals],
    charts: &[Figure],
) -> anyhow::Result<()> {
    let mut out = String::with_capacity(1 << 16);
    let _ = write!(
        out,
        "<h1>Simulation: {name}</h1><p>{description}</p>\
         <p>Every algorithm was given the same limit: <strong>{rate} calls per {period} s</strong>, \
         decided by the engine <code>sluice replay</code> runs, in virtual time. \
         <em>Peak</em> is the most calls of one key admitted within any span of one period; \
         <em>burst</em> is how far above the limit the algorithm's formula lets such a span \
         go: a token bucket its burst, a sliding window (an estimate) up to one more rate's \
         worth in the worst case, a sliding log nothing. A fixed window promises its rate \
         per window, not per span, so a span across a boundary may hold a whole rate more: \
         its burst is the rate. A row in red reached its limit + burst: the scenario went \
         all the way through that algorithm's gap, as a burst on each side of a boundary \
         does through a fixed window's.</p>",
        name = escape(&s.name),
        description = escape(&s.description),
        rate = s.rate,
        period = s.period,
    );
    let caption = if s.retries > 0 {
        "Denied clients retry after their Retry-After, with Sluice's jitter"
    } else {
        "Totals: denied calls are not tried again"
    };
    table(&mut out, caption, with);
    if !without.is_empty() {
        table(&mut out, "The same, without jitter", without);
    }
    figures(&mut out, charts);
    let title = format!("Sluice simulation: {}", s.name);
    std::fs::write(path, page(&title, &out))
        .with_context(|| format!("{}: cannot write", path.display()))
}
