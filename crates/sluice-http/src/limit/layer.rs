//! The tower `Layer` that installs the middleware.

use std::sync::Arc;

use sluice_core::MemoryStore;
use sluice_policy::Policy;
use tower_layer::Layer;

use super::RateLimit;
use sluice_engine::Enforcer;

/// Applies a policy's rules to every request of the wrapped service.
///
/// ```
/// use std::sync::Arc;
/// use axum::{Router, routing::get};
/// use sluice_core::MemoryStore;
/// use sluice_http::{Enforcer, RateLimitLayer};
/// use sluice_policy::Policy;
/// let policy = Policy::from_str(r#"
/// rules:
///   - name: per-ip
///     limit_keys: [ip:address]
///     algorithm: token_bucket
///     algorithm_config: {rps: 10, burst: 20}
/// "#, "policy.yaml").unwrap();
/// let enforcer = Arc::new(Enforcer::new(policy, MemoryStore::new()));
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(RateLimitLayer::new(enforcer));
/// ```
pub struct RateLimitLayer<St> {
    enforcer: Arc<Enforcer<St>>,
}

impl RateLimitLayer<MemoryStore> {
    /// A layer deciding `policy` on an in-memory store of its own: the
    /// usual start for one process.
    ///
    /// ```
    /// use axum::{Router, routing::get};
    /// use sluice_http::RateLimitLayer;
    /// use sluice_policy::{LimitKey, Policy, Rule};
    /// let policy = Policy::builder()
    ///     .rule(Rule::builder("per-ip").key(LimitKey::IpAddress).token_bucket(20.0, 50.0))
    ///     .build()
    ///     .unwrap();
    /// let layer = RateLimitLayer::in_memory(policy);
    /// assert_eq!(layer.enforcer().policy().rules().len(), 1);
    /// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// ```
    pub fn in_memory(policy: Policy) -> Self {
        RateLimitLayer::new(Arc::new(Enforcer::new(policy, MemoryStore::new())))
    }
}

impl<St> RateLimitLayer<St> {
    /// A layer deciding with `enforcer`, which may be shared with other
    /// layers, servers and reloaders.
    pub fn new(enforcer: Arc<Enforcer<St>>) -> Self {
        RateLimitLayer { enforcer }
    }

    /// The enforcer deciding, to reload its policy or read its store.
    pub fn enforcer(&self) -> &Arc<Enforcer<St>> {
        &self.enforcer
    }
}

impl<St> Clone for RateLimitLayer<St> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            enforcer: Arc::clone(&self.enforcer),
        }
    }
}

impl<S, St> Layer<S> for RateLimitLayer<St> {
    type Service = RateLimit<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.enforcer))
    }
}
