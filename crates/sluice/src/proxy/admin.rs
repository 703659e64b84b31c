//! The proxy's optional admin listener: `/metrics`, `/healthz`, `/readyz`,
//! `/openapi.json` and the dashboard, on their own address so that they are
//! never proxied and never rate limited.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{MethodRouter, get};
use sluice_engine::Enforcer;

use crate::dashboard::{self, Dashboard};
use crate::server::{AnyStore, Metrics, metrics_page, problem, readiness};

/// What the admin endpoints look at, and where a policy reload goes.
pub(crate) struct Admin {
    pub(crate) enforcer: Arc<Enforcer<AnyStore>>,
    pub(crate) reload_error: ArcSwapOption<String>,
    pub(crate) metrics: Option<Metrics>,
    /// The live dashboard.
    pub(crate) dashboard: Option<Arc<Dashboard>>,
    /// The token the dashboard requires, if any.
    pub(crate) admin_token: Option<String>,
}

/// Every route of the admin router. `/openapi.json` must describe each
/// path, which the tests check against [`paths`].
fn routes() -> [(&'static str, MethodRouter<Arc<Admin>>); 6] {
    [
        ("/metrics", get(metrics)),
        ("/healthz", get(|| async { "ok\n" })),
        ("/readyz", get(readyz)),
        ("/openapi.json", get(openapi)),
        (dashboard::UI, get(ui)),
        (dashboard::STATS, get(stats)),
    ]
}

/// The paths the proxy's admin listener answers.
///
/// ```
/// assert!(sluice::proxy::admin_paths().contains(&"/readyz"));
/// ```
pub fn paths() -> Vec<&'static str> {
    routes().map(|(path, _)| path).into()
}

pub(crate) fn router(admin: Arc<Admin>) -> Router {
    routes()
        .into_iter()
        .fold(Router::new(), |router, (path, method)| {
            router.route(path, method)
        })
        .with_state(admin)
}

/// `serve`'s description, narrowed to the admin listener's paths. Built
/// per request: it is asked for rarely, and a static would buy nothing.
async fn openapi() -> Response {
    let description = "The admin listener of `sluice proxy` (`--admin`): metrics, health, readiness and the live dashboard, on their own address so that they are never proxied and never rate limited. A path not described here is a 404, and a method a path does not take a 405 with `Allow`; both have empty bodies.";
    match crate::openapi::narrowed(&paths(), "Sluice proxy admin port", description) {
        Ok(doc) => crate::openapi::response(doc),
        Err(e) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the description could not be built: {e}"),
        ),
    }
}

async fn metrics(State(s): State<Arc<Admin>>) -> Response {
    metrics_page(s.metrics.as_ref(), s.enforcer.store())
}

async fn readyz(State(s): State<Arc<Admin>>) -> Response {
    readiness(s.enforcer.store(), &s.reload_error)
}

async fn ui(State(s): State<Arc<Admin>>, headers: HeaderMap) -> Response {
    dashboard::page(s.dashboard.as_deref(), s.admin_token.as_deref(), &headers)
}

async fn stats(State(s): State<Arc<Admin>>, headers: HeaderMap) -> Response {
    dashboard::stats(
        s.dashboard.as_deref(),
        s.admin_token.as_deref(),
        &headers,
        &s.enforcer,
        &s.reload_error,
    )
}
