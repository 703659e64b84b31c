//! The response future of [`super::RateLimit`].

use std::future::Future;
use std::pin::Pin;

/// The future of a rate-limited call: the decision, then (if allowed) the
/// inner service's response with the rate-limit headers added.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;
