//! The proxy's optional admin listener: `/metrics`, `/healthz` and
//! `/readyz`, on their own address so that they are never proxied and
//! never rate limited.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sluice_http::{Enforcer, PROBLEM_JSON};

use crate::serve::{AnyStore, Metrics};

/// What the admin endpoints look at.
pub(crate) struct Admin {
    pub(crate) enforcer: Arc<Enforcer<AnyStore>>,
    pub(crate) reload_error: Arc<ArcSwapOption<String>>,
    pub(crate) metrics: Option<Metrics>,
}

pub(crate) fn router(admin: Arc<Admin>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(admin)
}

async fn metrics(State(s): State<Arc<Admin>>) -> Response {
    let Some(m) = &s.metrics else {
        return problem(StatusCode::NOT_FOUND, "metrics are not enabled".into());
    };
    if let Some(n) = s.enforcer.store().keys_held() {
        ::metrics::gauge!("sluice_keys").set(n as f64);
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
async fn readyz(State(s): State<Arc<Admin>>) -> Response {
    if !s.enforcer.store().is_ready() {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the store is not answering".into(),
        );
    }
    if let Some(e) = s.reload_error.load_full() {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the last policy reload failed, the previous policy serves: {e}"),
        );
    }
    "ready\n".into_response()
}

fn problem(status: StatusCode, detail: String) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or(""),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(header::CONTENT_TYPE, PROBLEM_JSON)],
        body.to_string(),
    )
        .into_response()
}
