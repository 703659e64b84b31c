//! The proxy's optional admin listener: `/metrics`, `/healthz`, `/readyz`,
//! `/openapi.json` and the dashboard, on their own address so that they are
//! never proxied and never rate limited.

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{MethodRouter, get};

use crate::base::problem;
use crate::ops::ServerState;

/// Every route of the admin router. `/openapi.json` must describe each
/// path, which the tests check against [`paths`].
fn routes() -> Vec<(&'static str, MethodRouter<Arc<ServerState>>)> {
    let own = [("/openapi.json", get(openapi))];
    own.into_iter().chain(crate::ops::routes()).collect()
}

/// The paths the proxy's admin listener answers.
///
/// ```
/// assert!(sluice_server::proxy::admin_paths().contains(&"/readyz"));
/// ```
pub fn paths() -> Vec<&'static str> {
    routes().into_iter().map(|(path, _)| path).collect()
}

pub(crate) fn router(admin: Arc<ServerState>) -> Router {
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
