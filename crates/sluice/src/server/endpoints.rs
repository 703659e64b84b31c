//! What `serve` and the proxy's admin listener answer alike: `/metrics`,
//! `/readyz`, and the problem-details body every error of theirs takes.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sluice_core::Clock;
use sluice_http::{PROBLEM_JSON, Problem};

use super::metrics::Metrics;
use super::store::AnyStore;

/// A problem-details response.
pub(crate) fn problem(status: StatusCode, detail: String) -> Response {
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
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        m.render(),
    )
        .into_response()
}

/// Ready when the store answers and the policy in force is the file's.
pub(crate) fn readiness<C: Clock>(
    store: &AnyStore<C>,
    reload_error: &arc_swap::ArcSwapOption<String>,
) -> Response {
    if !store.is_ready() {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the store is not answering".into(),
        );
    }
    if let Some(e) = reload_error.load_full() {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the last policy reload failed, the previous policy serves: {e}"),
        );
    }
    "ready\n".into_response()
}
