//! The proxy's optional admin listener: `/metrics`, `/healthz` and
//! `/readyz`, on their own address so that they are never proxied and
//! never rate limited.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use sluice_engine::Enforcer;

use crate::server::{AnyStore, Metrics, metrics_page, readiness};

/// What the admin endpoints look at, and where a policy reload goes.
pub(crate) struct Admin {
    pub(crate) enforcer: Arc<Enforcer<AnyStore>>,
    pub(crate) reload_error: ArcSwapOption<String>,
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
    metrics_page(s.metrics.as_ref(), s.enforcer.store())
}

async fn readyz(State(s): State<Arc<Admin>>) -> Response {
    readiness(s.enforcer.store(), &s.reload_error)
}
