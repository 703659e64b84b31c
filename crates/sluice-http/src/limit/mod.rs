//! The rate-limiting middleware: [`RateLimitLayer`] wraps a service in
//! [`RateLimit`], which decides each request with an [`crate::Enforcer`]
//! before the inner service sees it.

mod body;
mod future;
mod layer;
mod service;

pub use body::Leased;
pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use service::{DEFAULT_MAX_HELD, Holding, PolicySnapshot, RateLimit};
