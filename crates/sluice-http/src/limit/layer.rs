//! The tower `Layer` that installs the middleware.

use std::sync::Arc;

use sluice_core::MemoryStore;
use sluice_policy::Policy;
use tower_layer::Layer;

use super::{Holding, RateLimit};
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
    holding: Holding,
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
        RateLimitLayer {
            enforcer,
            holding: Holding::default(),
        }
    }

    /// The same layer, holding at most `max` requests at once over every
    /// service it makes (see [`RateLimit`]); [`DEFAULT_MAX_HELD`] unless
    /// told otherwise. Past it, requests are decided as if their rules had
    /// no delay.
    ///
    /// [`DEFAULT_MAX_HELD`]: crate::DEFAULT_MAX_HELD
    ///
    /// ```
    /// use sluice_http::RateLimitLayer;
    /// use sluice_policy::Policy;
    /// let layer = RateLimitLayer::in_memory(Policy::default()).with_max_held(100);
    /// assert_eq!(layer.holding().max(), 100);
    /// ```
    #[must_use]
    pub fn with_max_held(self, max: usize) -> Self {
        RateLimitLayer {
            holding: Holding::new(max),
            ..self
        }
    }

    /// The cap on held requests, and how many are held now.
    pub fn holding(&self) -> &Holding {
        &self.holding
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
            holding: self.holding.clone(),
        }
    }
}

impl<S, St> Layer<S> for RateLimitLayer<St> {
    type Service = RateLimit<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::with_holding(inner, Arc::clone(&self.enforcer), self.holding.clone())
    }
}
