//! The tower `Service` that decides each request before passing it on.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use sluice_core::Store;
use sluice_policy::Policy;
use tower_service::Service;

use super::{Leased, ResponseFuture};
use crate::headers::{
    denial, grpc_denial_headers, is_grpc, set_problem_type, set_rate_limit_headers,
};
use crate::request::{HttpRequest, peer};
use sluice_engine::Enforcer;

/// The policy an allowed request was decided by, in the request's
/// extensions for the service behind the layer: a reload while the request
/// is on its way does not change which policy it was seen through.
///
/// ```
/// use std::sync::Arc;
/// use sluice_http::PolicySnapshot;
/// use sluice_policy::Policy;
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(PolicySnapshot(Arc::new(Policy::default())));
/// assert!(req.extensions().get::<PolicySnapshot>().is_some());
/// ```
#[derive(Debug, Clone)]
pub struct PolicySnapshot(pub Arc<Policy>);

/// A service whose requests pass a policy's rules first.
///
/// Allowed requests reach the inner service and come back with the
/// rate-limit headers of every enforced rule that applied. Denied ones are
/// answered here: 429 with `Retry-After` and a problem-details body (503
/// when the store failed and a rule fails closed). A denied gRPC call gets
/// a gRPC status instead (see [`crate::grpc_denial`]), with the same
/// headers as metadata. Shadow rules only count. Either way the response
/// carries the [`Verdict`](sluice_engine::Verdict) in its extensions, for
/// the layers outside to log or test.
///
/// A rule with `algorithm: concurrency` holds its slot from the moment the
/// request is admitted until its response body has been sent in full (see
/// [`Leased`]), fails, or is dropped with a client that went away.
pub struct RateLimit<S, St> {
    inner: S,
    enforcer: Arc<Enforcer<St>>,
}

impl<S, St> RateLimit<S, St> {
    /// Wraps `inner`; [`super::RateLimitLayer`] is the usual way in.
    pub fn new(inner: S, enforcer: Arc<Enforcer<St>>) -> Self {
        RateLimit { inner, enforcer }
    }
}

impl<S: Clone, St> Clone for RateLimit<S, St> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            enforcer: Arc::clone(&self.enforcer),
        }
    }
}

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    St: Store + 'static,
    ReqB: Send + 'static,
{
    type Response = Response<Either<Leased<ResB>, Full<Bytes>>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        // The service that was polled ready is the one that must be called;
        // a fresh clone stays behind for the next request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let enforcer = Arc::clone(&self.enforcer);
        Box::pin(async move {
            let policy = enforcer.policy();
            let mut verdict = {
                let view = HttpRequest::new(&req, peer(&req), &policy);
                enforcer.enforce(&policy, &view).await
            };
            // The request's slots on concurrency limits, given back when the
            // response body ends, or when this future or the body is
            // dropped (a client that went away, a failed inner service).
            let slots = enforcer.hold(&mut verdict);
            if !verdict.allowed {
                let mut res = if is_grpc(req.headers()) {
                    let mut res = Response::new(Either::Right(Full::new(Bytes::new())));
                    set_rate_limit_headers(&verdict, res.headers_mut());
                    grpc_denial_headers(&verdict, res.headers_mut());
                    res
                } else {
                    let (status, body) = denial(&verdict);
                    let mut res = Response::new(Either::Right(Full::new(Bytes::from(body))));
                    *res.status_mut() = status;
                    set_rate_limit_headers(&verdict, res.headers_mut());
                    set_problem_type(res.headers_mut());
                    res
                };
                res.extensions_mut().insert(verdict);
                return Ok(res);
            }
            // What the request was decided by, for the service behind to
            // use the same policy (the proxy's forwarding headers).
            req.extensions_mut().insert(PolicySnapshot(policy));
            let res = inner.call(req).await?;
            let mut res = res.map(|body| Either::Left(Leased::new(body, slots)));
            set_rate_limit_headers(&verdict, res.headers_mut());
            res.extensions_mut().insert(verdict);
            Ok(res)
        })
    }
}
