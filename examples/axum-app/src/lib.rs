//! An axum service behind Sluice's [`RateLimitLayer`]: every route shares
//! the per-address rule, and `/search` is also charged per API key by the
//! cost its caller declares. `main.rs` serves it; the tests drive it with
//! `oneshot`. [`policy_in_code`] builds a policy in Rust instead of YAML,
//! for [`api`].

use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use sluice_http::{
    Condition, Enforcer, LimitKey, Policy, PolicyError, RateLimitLayer, Rule, Store,
};

/// The example's policy, compiled into the binary so it runs from anywhere.
pub const POLICY: &str = include_str!("../policy.yaml");

/// The policy, parsed; errors name the line and column.
///
/// ```
/// assert_eq!(axum_app::policy().unwrap().rules().len(), 2);
/// ```
pub fn policy() -> Result<Policy, PolicyError> {
    Policy::from_str(POLICY, "examples/axum-app/policy.yaml")
}

/// The routes, with every request decided by `enforcer` first.
///
/// ```
/// use std::sync::Arc;
/// use sluice_http::{Enforcer, MemoryStore};
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

/// A policy built in code, no YAML: every client address gets 20 requests a
/// second with bursts of 50, and `/api/` is also limited to 10 a second
/// (bursts of 20) per API key.
///
/// ```
/// let policy = axum_app::policy_in_code().unwrap();
/// assert_eq!(policy.rules()[1].name(), "per-api-key");
/// ```
pub fn policy_in_code() -> Result<Policy, PolicyError> {
    Policy::builder()
        .rule(
            Rule::builder("per-ip")
                .key(LimitKey::IpAddress)
                .token_bucket(20.0, 50.0),
        )
        .rule(
            Rule::builder("per-api-key")
                .key(LimitKey::Header("x-api-key".into()))
                .when(Condition::PathPrefix("/api/".into()))
                .token_bucket(10.0, 20.0),
        )
        .build()
}

/// An API whose routes `enforcer` limits: wrap any router the same way.
///
/// ```
/// use axum_app::{api, policy_in_code};
/// use sluice_http::RateLimitLayer;
/// let _router = api().layer(RateLimitLayer::in_memory(policy_in_code().unwrap()));
/// ```
pub fn api() -> Router {
    Router::new().route("/", get(|| async { "hello\n" })).route(
        "/api/items",
        get(|| async { axum::Json(serde_json::json!([])) }),
    )
}
