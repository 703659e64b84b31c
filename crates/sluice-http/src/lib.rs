//! Sluice for HTTP services: a tower [`RateLimitLayer`] for axum, hyper and
//! tonic, and the headers and bodies that tell clients what the
//! [`Enforcer`] of `sluice-engine`, which every front end decides with,
//! decided.
//!
//! A policy built in code: every client address gets 20 requests a second
//! with bursts of 50, and `/api/` is also limited per API key.
//!
//! ```
//! use axum::{Router, routing::get};
//! use sluice_http::{Condition, LimitKey, Policy, RateLimitLayer, Rule};
//! let policy = Policy::builder()
//!     .rule(Rule::builder("per-ip").key(LimitKey::IpAddress).token_bucket(20.0, 50.0))
//!     .rule(
//!         Rule::builder("per-api-key")
//!             .key(LimitKey::Header("x-api-key".into()))
//!             .when(Condition::PathPrefix("/api/".into()))
//!             .token_bucket(10.0, 20.0),
//!     )
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/api/items", get(|| async { "[]" }))
//!     .layer(RateLimitLayer::in_memory(policy));
//! # Ok::<(), sluice_http::PolicyError>(())
//! ```
//!
//! The same from a policy file, with the enforcer shared (with a reloader,
//! or another layer):
//!
//! ```
//! use std::sync::Arc;
//! use axum::{Router, routing::get};
//! use sluice_http::{Enforcer, MemoryStore, Policy, RateLimitLayer};
//! let policy = Policy::from_str(r#"
//! rules:
//!   - name: per-ip
//!     limit_keys: [ip:address]
//!     algorithm: token_bucket
//!     algorithm_config: {rps: 10, burst: 20}
//! "#, "policy.yaml").unwrap();
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(Arc::new(Enforcer::new(policy, MemoryStore::new()))));
//! ```

mod headers;
mod limit;
mod request;

pub use headers::{
    FieldValue, PROBLEM_JSON, Problem, QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_LIMIT,
    RATELIMIT_POLICY, RATELIMIT_REMAINING, RATELIMIT_RESET, SLUICE_DEGRADED, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, degraded, denial, each_rate_limit_header, grpc_denial,
    rate_limit_headers, retry_after_secs, set_rate_limit_headers,
};
pub use limit::{
    DEFAULT_MAX_HELD, Holding, Leased, PolicySnapshot, RateLimit, RateLimitLayer, ResponseFuture,
};
pub use request::{HttpRequest, PeerAddr};
/// What a service behind the layer needs besides it, so that this crate is
/// its one dependency on Sluice: a policy, from a file or built in code,
/// and the in-memory store. Other stores and the rest of the policy's
/// types are in their own crates.
pub use sluice_core::{MemoryStore, Store};
/// The engine's types, here too since the layer cannot be built without
/// an [`Enforcer`].
pub use sluice_engine::{Enforcer, NamedDecision, Refusal, RuleDecision, ShadowDecision, Verdict};
pub use sluice_policy::{Condition, LimitKey, Policy, PolicyError, Rule};
