//! The pages of `simulate` and `replay --report`: one file each, with the
//! charts inline and no script, font or stylesheet from elsewhere, so that
//! they open anywhere without a network.

use std::fmt::Write as _;

/// `text` with the characters HTML gives a meaning escaped.
pub(crate) fn escape(text: &str) -> String {
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

/// A whole page titled `title` around `body`.
pub(crate) fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>\
         body{{font-family:sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}}\
         table{{border-collapse:collapse;margin:1rem 0}}\
         td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:right}}\
         td:first-child,th:first-child{{text-align:left}}tr.over td{{background:#fde0dc}}\
         figure{{margin:2rem 0}}figcaption{{color:#555}}</style></head><body>{body}</body></html>\n",
        escape(title)
    )
}

/// A chart of a report: its id, its SVG and its caption.
pub(crate) struct Figure {
    pub(crate) id: String,
    pub(crate) svg: String,
    pub(crate) caption: String,
}

/// Appends each chart to `out`, inline.
pub(crate) fn figures(out: &mut String, charts: &[Figure]) {
    for f in charts {
        let _ = write!(
            out,
            "<figure id=\"{id}\">{svg}<figcaption>{caption}</figcaption></figure>",
            id = escape(&f.id),
            svg = f.svg,
            caption = escape(&f.caption)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_a_page_needs_nothing_from_elsewhere() {
        assert_eq!(
            escape("<a & \"b\" 'c'>"),
            "&lt;a &amp; &quot;b&quot; &#39;c&#39;&gt;"
        );
        let p = page("a <title>", "<p>body</p>");
        assert!(p.contains("<title>a &lt;title&gt;</title>") && p.contains("<p>body</p>"));
        for outside in ["<script", "<link", "src=", "url("] {
            assert!(!p.contains(outside));
        }
    }
}
