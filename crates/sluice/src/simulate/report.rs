//! `report.html`: one page holding the summary and every chart inline, so
//! that it opens anywhere, with no network and no other file.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use super::run::Totals;
use super::scenario::Scenario;

/// `text` with the characters HTML gives a meaning escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn table(out: &mut String, caption: &str, rows: &[Totals]) {
    let _ = write!(
        out,
        "<table><caption>{}</caption><thead><tr><th>algorithm</th><th>admitted</th>\
         <th>denied</th><th>peak in one period</th><th>limit + burst</th></tr></thead><tbody>",
        escape(caption)
    );
    for t in rows {
        let over = t.peak as f64 > t.limit + t.burst || (t.burst == 0.0 && t.peak as f64 > t.limit);
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
/// retry) without jitter, and the charts of `dir`, by file name and caption.
pub(crate) fn write(
    path: &Path,
    s: &Scenario,
    with: &[Totals],
    without: &[Totals],
    charts: &[(String, String)],
) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut out = String::with_capacity(1 << 16);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Sluice simulation: {name}</title><style>\
         body{{font-family:sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}}\
         table{{border-collapse:collapse;margin:1rem 0}}td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:right}}\
         td:first-child,th:first-child{{text-align:left}}tr.over td{{background:#fde0dc}}\
         figure{{margin:2rem 0}}figcaption{{color:#555}}</style></head><body>\
         <h1>Simulation: {name}</h1><p>{description}</p>\
         <p>Every algorithm was given the same limit: <strong>{rate} calls per {period} s</strong>, \
         decided by the engine <code>sluice replay</code> runs, in virtual time. \
         <em>Peak</em> is the most calls of one key admitted within any span of one period. \
         A fixed window promises its rate per window, not per span, so a row in red, with a \
         peak above the limit, is the gap a burst on each side of a boundary goes through. \
         The others stay within the limit and what their formula lets through above it: a \
         token bucket its burst, a sliding window (an estimate) up to one more rate's worth \
         in the worst case.</p>",
        name = escape(&s.name),
        description = escape(&s.description),
        rate = s.rate,
        period = s.period,
    );
    table(
        &mut out,
        "Denied clients retry after their Retry-After, with Sluice's jitter",
        with,
    );
    if !without.is_empty() {
        table(&mut out, "The same, without jitter", without);
    }
    for (file, caption) in charts {
        let svg = std::fs::read_to_string(dir.join(file))
            .with_context(|| format!("{file}: cannot read the chart"))?;
        let _ = write!(
            out,
            "<figure id=\"{id}\">{svg}<figcaption>{caption}</figcaption></figure>",
            id = escape(file.trim_end_matches(".svg")),
            caption = escape(caption)
        );
    }
    out.push_str("</body></html>\n");
    std::fs::write(path, out).with_context(|| format!("{}: cannot write", path.display()))
}
