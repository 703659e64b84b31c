//! What `serve` and the proxy's admin listener answer alike: `/metrics`,
//! `/readyz`, and the problem-details body every error of theirs takes.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::{Digest, Sha256};
use sluice_core::Clock;
use sluice_http::{PROBLEM_JSON, Problem};

use super::metrics::Metrics;
use super::store::AnyStore;

/// Whether `headers` carry the admin token `token` as a bearer token, or,
/// when `basic` allows it, as the password of HTTP basic authentication
/// (which browsers prompt for; any user name). Their SHA-256 digests are
/// compared in constant time, so that response times say nothing about
/// how much of a guess was right, or how long the token is.
///
/// Basic authentication suits only what is safe to read: a browser sends
/// credentials it has cached with requests that other sites make it send.
pub(crate) fn holds_admin_token(token: &str, headers: &HeaderMap, basic: bool) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    // Digests first: equal lengths, so that not even the token's length
    // shows in the time a comparison takes.
    let same = |given: &[u8]| {
        constant_time_eq::constant_time_eq(&Sha256::digest(given), &Sha256::digest(token))
    };
    if let Some(bearer) = sluice_policy::bearer_token(given) {
        return same(bearer.as_bytes());
    }
    let Some((scheme, encoded)) = given.trim().split_once(' ') else {
        return false;
    };
    if !basic || !scheme.eq_ignore_ascii_case("basic") {
        return false;
    }
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    decoded
        .iter()
        .position(|&b| b == b':')
        .is_some_and(|colon| same(&decoded[colon + 1..]))
}

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
