//! The tower `Service` that decides each request before passing it on.

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use sluice_core::Store;
use sluice_policy::Policy;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
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
///
/// A request whose enforced rules all delay (`on_limit: {delay}`) and that
/// a reservation admits is held here until it is due (see
/// [`Enforcer::enforce_shaped`]), then passed on with the rate-limit headers
/// of its decision, as an admitted request's; one whose wait would be
/// longer than a rule's `max` gets the 429 as without the delay. A client
/// that goes away while its request is held gives its reservation back. At
/// most [`Holding::max`] requests are held at once over all the services
/// of one layer; while that many are, the next is decided as if its rules
/// had no delay, refused over the limit.
pub struct RateLimit<S, St> {
    inner: S,
    enforcer: Arc<Enforcer<St>>,
    holding: Holding,
}

/// How many requests may be held at once by default: each held request is
/// a task, a connection and a buffered request head, a few kilobytes, so
/// ten thousand are some tens of megabytes at most.
pub const DEFAULT_MAX_HELD: usize = 10_000;

/// The cap on requests held at once, shared by every service of a layer.
///
/// ```
/// use sluice_http::{DEFAULT_MAX_HELD, Holding};
/// assert_eq!(Holding::default().max(), DEFAULT_MAX_HELD);
/// let none = Holding::new(0);
/// assert_eq!((none.max(), none.held()), (0, 0));
/// ```
#[derive(Debug, Clone)]
pub struct Holding {
    permits: Arc<Semaphore>,
    max: usize,
}

impl Holding {
    /// A cap of `max` held requests (0 holds none: every rule refuses).
    /// At most [`Semaphore::MAX_PERMITS`].
    pub fn new(max: usize) -> Holding {
        let max = max.min(Semaphore::MAX_PERMITS);
        Holding {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// The most requests held at once.
    pub fn max(&self) -> usize {
        self.max
    }

    /// How many are held now (or being decided with room to be held).
    pub fn held(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    /// Room for one more, or `None` when the cap is reached (counted in
    /// `sluice_held_over_cap_total`).
    fn room(&self) -> Option<OwnedSemaphorePermit> {
        static OVER_CAP: OnceLock<metrics::Counter> = OnceLock::new();
        let room = Arc::clone(&self.permits).try_acquire_owned().ok();
        if room.is_none() {
            OVER_CAP
                .get_or_init(|| metrics::counter!("sluice_held_over_cap_total"))
                .increment(1);
        }
        room
    }
}

impl Default for Holding {
    /// [`DEFAULT_MAX_HELD`].
    fn default() -> Self {
        Holding::new(DEFAULT_MAX_HELD)
    }
}

impl<S, St> RateLimit<S, St> {
    /// Wraps `inner`, holding at most [`DEFAULT_MAX_HELD`] requests of its
    /// own; [`super::RateLimitLayer`] is the usual way in.
    pub fn new(inner: S, enforcer: Arc<Enforcer<St>>) -> Self {
        RateLimit::with_holding(inner, enforcer, Holding::default())
    }

    /// Wraps `inner`, holding requests within `holding`'s cap, which may be
    /// shared with other services.
    pub fn with_holding(inner: S, enforcer: Arc<Enforcer<St>>, holding: Holding) -> Self {
        RateLimit {
            inner,
            enforcer,
            holding,
        }
    }
}

impl<S: Clone, St> Clone for RateLimit<S, St> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            enforcer: Arc::clone(&self.enforcer),
            holding: self.holding.clone(),
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
        let holding = self.holding.clone();
        Box::pin(async move {
            let policy = enforcer.policy();
            // Room to hold the request is taken before deciding, so that a
            // request is never admitted to wait with nowhere to wait.
            let room = if policy.delays() {
                holding.room()
            } else {
                None
            };
            let mut verdict = {
                let view = HttpRequest::new(&req, peer(&req), &policy);
                match room {
                    Some(_) => enforcer.enforce_shaped_with(&policy, &view).await,
                    None => enforcer.enforce_with(&policy, &view).await,
                }
            };
            if verdict.delay.is_some() {
                // Dropped with this future (a client that went away), it
                // gives the reservation back.
                enforcer.reservation(&mut verdict).until_due().await;
            }
            drop(room);
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
