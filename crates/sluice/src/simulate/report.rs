//! `report.html` of a simulation: the summary and every chart on one page.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use super::run::Totals;
use super::scenario::Scenario;
use crate::html::{Figure, escape, figures, page};

fn table(out: &mut String, caption: &str, rows: &[Totals]) {
    // A shaped scenario's rows say how much was held, too.
    let shaped = rows.iter().any(|t| t.most_held.is_some());
    let _ = write!(
        out,
        "<table><caption>{}</caption><thead><tr><th>algorithm</th><th>admitted</th>\
         <th>denied</th><th>peak in one period</th><th>limit + burst</th>{}</tr></thead><tbody>",
        escape(caption),
        if shaped {
            "<th>most held at once</th><th>longest held (s)</th>"
        } else {
            ""
        }
    );
    for t in rows {
        // Above the limit, and as far above it as the formula allows (or,
        // were the formula broken, further): the scenario went all the way
        // through this algorithm's gap.
        let peak = t.peak as f64;
        let over = peak > t.limit && peak >= t.limit + t.burst;
        let _ = write!(
            out,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            if over { " class=\"over\"" } else { "" },
            t.algorithm,
            t.admitted,
            t.denied,
            t.peak,
            t.limit + t.burst
        );
        if shaped {
            let _ = write!(
                out,
                "<td>{}</td><td>{:.3}</td>",
                t.most_held.unwrap_or(0),
                t.longest_delay.unwrap_or(0.0)
            );
        }
        out.push_str("</tr>");
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
        "<h1>Simulation: {}</h1><p>{}</p>",
        escape(&s.name),
        escape(&s.description)
    );
    if let Some(shaping) = &s.shaping {
        let _ = write!(
            out,
            "<p>The same calls went twice through one token bucket of <strong>{rate} calls \
             per {period} s</strong> with a burst of {burst}, decided by the engine \
             <code>sluice replay</code> runs, in virtual time. <em>Delayed</em>, a call over \
             the limit reserves, as a rule with <code>on_limit: {{delay: {{max: {max}s}}}}\
             </code> does: it is held until the bucket has room for it, up to {max} s and at \
             most {max_reserved} at once, then reaches the upstream; beyond that it is \
             refused. <em>Refused</em>, every call over the limit is refused at once. \
             <em>Peak</em> is the most calls reaching the upstream within any span of one \
             period: neither run lets more than the limit + burst through.</p>",
            rate = s.rate,
            period = s.period,
            burst = shaping.burst,
            max = shaping.max,
            max_reserved = shaping.max_reserved,
        );
        table(&mut out, "Delayed against refused", with);
    } else {
        algorithms(&mut out, s, with, without);
    }
    figures(&mut out, charts);
    let title = format!("Sluice simulation: {}", s.name);
    std::fs::write(path, page(&title, &out))
        .with_context(|| format!("{}: cannot write", path.display()))
}

/// The introduction and the tables of a scenario run through every
/// algorithm.
fn algorithms(out: &mut String, s: &Scenario, with: &[Totals], without: &[Totals]) {
    let _ = write!(
        out,
        "<p>Every algorithm was given the same limit: <strong>{rate} calls per {period} s</strong>, \
         decided by the engine <code>sluice replay</code> runs, in virtual time. \
         <em>Peak</em> is the most calls of one key admitted within any span of one period; \
         <em>burst</em> is how far above the limit the algorithm's formula lets such a span \
         go: a token bucket its burst, a sliding window (an estimate) up to one more rate's \
         worth in the worst case, a sliding log nothing. A fixed window promises its rate \
         per window, not per span, so a span across a boundary may hold a whole rate more: \
         its burst is the rate. A row in red reached its limit + burst: the scenario went \
         all the way through that algorithm's gap, as a burst on each side of a boundary \
         does through a fixed window's.</p>",
        rate = s.rate,
        period = s.period,
    );
    let caption = if s.retries > 0 {
        "Denied clients retry after their Retry-After, with Sluice's jitter"
    } else {
        "Totals: denied calls are not tried again"
    };
    table(out, caption, with);
    if !without.is_empty() {
        table(out, "The same, without jitter", without);
    }
}
