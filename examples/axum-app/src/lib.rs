//! An axum service behind Sluice's [`RateLimitLayer`]: every route shares
//! the per-address rule, and `/search` is also charged per API key by the
//! cost its caller declares. `main.rs` serves it; the tests drive it with
//! `oneshot`.

use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use sluice_core::Store;
use sluice_http::{Enforcer, RateLimitLayer};
use sluice_policy::Policy;

/// The example's policy, compiled into the binary so it runs from anywhere.
pub const POLICY: &str = include_str!("../policy.yaml");

/// The policy, parsed; errors name the line and column.
///
/// ```
/// assert_eq!(axum_app::policy().unwrap().rules().len(), 2);
/// ```
pub fn policy() -> Result<Policy, sluice_policy::PolicyError> {
    Policy::from_str(POLICY, "examples/axum-app/policy.yaml")
}

/// The routes, with every request decided by `enforcer` first.
///
/// ```
/// use std::sync::Arc;
/// use sluice_core::MemoryStore;
/// use sluice_http::Enforcer;
/// let enforcer = Arc::new(Enforcer::new(axum_app::policy().unwrap(), MemoryStore::new()));
/// let _router = axum_app::app(enforcer);
/// ```
pub fn app<S: Store + Send + Sync + 'static>(enforcer: Arc<Enforcer<S>>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route(
            "/search",
            get(|| async { axum::Json(serde_json::json!({"results": []})) }),
        )
        .layer(RateLimitLayer::new(enforcer))
}
