//! What `serve` and the proxy's admin listener answer alike: `/metrics`,
//! `/readyz`, and the problem-details body every error of theirs takes.

use std::borrow::Cow;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sluice_core::Clock;
use sluice_http::{PROBLEM_JSON, Problem};

use super::metrics::Metrics;
use super::store::AnyStore;

/// A problem-details response. Its detail quotes at most a short prefix of
/// each value in it (see [`clip`]): they are often what a client sent.
pub(crate) fn problem(status: StatusCode, detail: String) -> Response {
    let detail = clip(&detail).into_owned();
    let mut res = (status, Problem::new(status, detail).to_json()).into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, PROBLEM_JSON);
    res
}

/// The Prometheus exposition, with the store's key count brought up to date.
pub(crate) fn metrics_page<C: Clock>(metrics: Option<&Metrics>, store: &AnyStore<C>) -> Response {
    let Some(m) = metrics else {
        return problem(StatusCode::NOT_FOUND, "metrics are not enabled".into());
    };
    if let Some(n) = store.keys_held() {
        ::metrics::gauge!("sluice_keys").set(n as f64);
    }
    if let Some(s) = store.redis_stats() {
        ::metrics::counter!("sluice_redis_transactions_total", "decided_by" => "redis")
            .absolute(s.remote);
        ::metrics::counter!("sluice_redis_transactions_total", "decided_by" => "deny_cache")
            .absolute(s.local_denials);
        ::metrics::counter!("sluice_redis_script_calls_total").absolute(s.script_calls);
        ::metrics::counter!("sluice_redis_invalidations_total").absolute(s.invalidations);
        ::metrics::counter!("sluice_redis_subscription_losses_total")
            .absolute(s.subscription_losses);
    }
    if let Some(s) = store.postgres_stats() {
        ::metrics::counter!("sluice_postgres_transactions_total").absolute(s.decided);
        ::metrics::counter!("sluice_postgres_batches_total", "result" => "committed")
            .absolute(s.batches);
        ::metrics::counter!("sluice_postgres_batches_total", "result" => "error")
            .absolute(s.errors);
        ::metrics::counter!("sluice_postgres_batches_total", "result" => "timeout")
            .absolute(s.timeouts);
        ::metrics::counter!("sluice_postgres_pool_acquires_total").absolute(s.pool_acquires);
        // Whole microseconds: a counter here counts in integers.
        ::metrics::counter!("sluice_postgres_pool_wait_microseconds_total")
            .absolute(s.pool_wait_micros);
        ::metrics::counter!("sluice_postgres_swept_rows_total").absolute(s.swept);
        ::metrics::gauge!("sluice_postgres_queued").set(s.queued as f64);
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        m.render(),
    )
        .into_response()
}

/// Ready when the store answers and the policy in force is the file's;
/// otherwise, why not.
pub(crate) fn ready<C: Clock>(
    store: &AnyStore<C>,
    reload_error: &arc_swap::ArcSwapOption<String>,
) -> Result<(), String> {
    if !store.is_ready() {
        return Err("the store is not answering".into());
    }
    if let Some(e) = reload_error.load_full() {
        return Err(format!(
            "the last policy reload failed, the previous policy serves: {e}"
        ));
    }
    Ok(())
}

/// `/readyz`: [`ready`] as a 200 or a 503.
pub(crate) fn readiness<C: Clock>(
    store: &AnyStore<C>,
    reload_error: &arc_swap::ArcSwapOption<String>,
) -> Response {
    match ready(store, reload_error) {
        Ok(()) => "ready\n".into_response(),
        Err(why) => problem(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// The most characters of one value that an error quotes.
pub(crate) const MAX_QUOTED: usize = 64;

/// The most characters of an error's detail.
const MAX_DETAIL: usize = 1024;

/// `detail` with each value in it cut to its first [`MAX_QUOTED`]
/// characters and a `…`, and the whole to [`MAX_DETAIL`]. A value is a
/// string in double quotes as `{:?}` writes it, escapes and all, one in
/// backquotes, as serde names a field, or a run of characters without a
/// space, such as a number written out in full. An error says what was
/// wrong with a call; echoing a 64 KiB name or a 300-digit count whole
/// says nothing more, and makes every error as large as the largest input.
pub(crate) fn clip(detail: &str) -> Cow<'_, str> {
    if detail.len() <= MAX_QUOTED {
        return Cow::Borrowed(detail);
    }
    let mut out = String::new();
    let mut rest = detail;
    let mut cut = false;
    while let Some(first) = rest.chars().next() {
        let (span, after) = rest.split_at(span_len(rest, first));
        cut |= shorten_into(&mut out, span);
        rest = after;
    }
    if let Some((end, _)) = out.char_indices().nth(MAX_DETAIL) {
        out.truncate(end);
        out.push('…');
        cut = true;
    }
    if cut {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(detail)
    }
}

/// The length in bytes of the span `rest` starts with, whose first
/// character is `first`: a quoted value with its quotes, a run of
/// characters up to the next space, or one space.
fn span_len(rest: &str, first: char) -> usize {
    match first {
        '"' => {
            let mut escaped = false;
            for (i, c) in rest.char_indices().skip(1) {
                match c {
                    '\\' if !escaped => escaped = true,
                    '"' if !escaped => return i + 1,
                    _ => escaped = false,
                }
            }
            rest.len()
        }
        '`' => rest[1..].find('`').map_or(rest.len(), |i| i + 2),
        c if c.is_whitespace() => c.len_utf8(),
        _ => rest.find(char::is_whitespace).unwrap_or(rest.len()),
    }
}

/// Appends `span`, cut to [`MAX_QUOTED`] characters and a `…` when longer,
/// keeping the closing quote of a quoted one; whether it was cut.
fn shorten_into(out: &mut String, span: &str) -> bool {
    let Some((end, _)) = span.char_indices().nth(MAX_QUOTED) else {
        out.push_str(span);
        return false;
    };
    out.push_str(&span[..end]);
    out.push('…');
    let mut chars = span.chars();
    if let (Some(open @ ('"' | '`')), Some(close)) = (chars.next(), chars.next_back())
        && open == close
    {
        out.push(close);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_detail_is_left_as_it_is() {
        let detail = "no limit named \"nope\" in the policy, nor given inline; see `limits` in the policy file";
        assert!(matches!(clip(detail), Cow::Borrowed(d) if d == detail));
    }

    #[test]
    fn each_long_value_is_cut_and_the_words_around_it_kept() {
        let name = "x y \\\" z ".repeat(40);
        let detail = format!("no limit named {name:?} in the policy, nor given inline");
        let clipped = clip(&detail);
        let prefix: String = format!("{name:?}").chars().take(MAX_QUOTED).collect();
        assert_eq!(
            clipped,
            format!("no limit named {prefix}…\" in the policy, nor given inline")
        );

        let field = "a b".repeat(50);
        let detail = format!("unknown field `{field}`, expected `limit` or `key`");
        let prefix: String = format!("`{field}").chars().take(MAX_QUOTED).collect();
        assert_eq!(
            clip(&detail),
            format!("unknown field {prefix}…`, expected `limit` or `key`")
        );

        let digits = "7".repeat(300);
        let detail = format!("cost {digits} can never succeed on limit \"llm\"");
        let clipped = clip(&detail);
        assert_eq!(
            clipped,
            format!(
                "cost {}… can never succeed on limit \"llm\"",
                &digits[..MAX_QUOTED]
            )
        );
    }

    #[test]
    fn many_values_are_held_to_the_bound_of_a_whole_detail() {
        let detail = "word ".repeat(1000);
        let clipped = clip(&detail);
        assert_eq!(clipped.chars().count(), MAX_DETAIL + 1);
        assert!(clipped.ends_with('…'));
        // An unclosed quote runs to the end, and is cut like any value.
        let open = format!("bad \"{}", "é".repeat(500));
        assert_eq!(clip(&open).chars().count(), 4 + MAX_QUOTED + 1);
    }
}
