//! Sluice for HTTP services: a tower [`RateLimitLayer`] for axum, hyper and
//! tonic, and the headers and bodies that tell clients what the
//! [`Enforcer`] of `sluice-engine`, which every front end decides with,
//! decided.
//!
//! ```
//! use std::sync::Arc;
//! use axum::{Router, routing::get};
//! use sluice_core::MemoryStore;
//! use sluice_http::{Enforcer, RateLimitLayer};
//! use sluice_policy::Policy;
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
    PROBLEM_JSON, Problem, QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_LIMIT, RATELIMIT_POLICY,
    RATELIMIT_REMAINING, RATELIMIT_RESET, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, denial,
    grpc_denial, rate_limit_headers, retry_after_secs, set_rate_limit_headers,
};
pub use limit::{RateLimit, RateLimitLayer, ResponseFuture};
pub use request::{HttpRequest, PeerAddr};
/// The engine's types, here too since the layer cannot be built without
/// an [`Enforcer`].
pub use sluice_engine::{Enforcer, Refusal, RuleDecision, ShadowDecision, Verdict};
