//! The HTTP decision API: named-limit calls, checks, resets and values,
//! request decisions for proxies in any language, and the operational
//! endpoints. Every error is a problem-details body with a 4xx status.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use bytes::BytesMut;
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use sluice_core::{Algorithm, Clock, Decision, Mode, Settle, Store, StoreError, SystemClock};
use sluice_engine::{NamedDecision, Verdict};
use sluice_http::{PROBLEM_JSON, Problem, degraded, each_rate_limit_header};
use sluice_policy::RequestParts;
use tower::{Service, ServiceExt};

use crate::base::{clip, foreign_page, holds_token, is_json, not_json, problem};
use crate::dashboard;
use crate::ops::ServerState;

/// The largest request body accepted; a decision needs far less.
pub const MAX_BODY: usize = 64 * 1024;

/// The server's routes, as one service.
///
/// ```
/// # use std::sync::Arc;
/// use axum::body::Body;
/// use sluice_server::serve::{AnyStore, ServerState, app};
/// # use sluice_core::MemoryStore;
/// # use sluice_http::Enforcer;
/// # use sluice_policy::Policy;
/// use tower::ServiceExt;
///
/// let policy = Policy::from_str(
///     "limits: {login: {algorithm: token_bucket, algorithm_config: {rate: 1, period: 60, burst: 1}}}",
///     "policy.yaml",
/// )?;
/// let state = Arc::new(ServerState {
///     enforcer: Arc::new(Enforcer::new(policy, AnyStore::Memory(MemoryStore::new()))),
///     admin_token: None,
///     api_token: None,
///     metrics: None,
///     reload_error: Default::default(),
///     dashboard: None,
/// });
/// let call = || {
///     http::Request::post("/v1/limit")
///         .header("content-type", "application/json")
///         .body(Body::from(r#"{"limit": "login", "key": "alice"}"#))
/// };
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let first = app(Arc::clone(&state)).oneshot(call()?).await?;
/// let second = app(state).oneshot(call()?).await?;
/// assert_eq!((first.status().as_u16(), second.status().as_u16()), (200, 429));
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
pub fn app<C: Clock + Send + Sync + 'static>(state: Arc<ServerState<C>>) -> Api<C> {
    Api {
        router: router(Arc::clone(&state)),
        state,
    }
}

/// The decision API: `POST /v1/limit` and `POST /v1/check`, the calls that
/// carry a deployment's traffic, go straight to their handler; every other
/// request goes through the router, which holds those two routes as well.
/// The router's matching, boxed services and request extensions cost about
/// 2,800 instructions of the 23,000 a `/v1/limit` call took (callgrind).
///
/// ```
/// # use std::sync::Arc;
/// use axum::body::Body;
/// use sluice_server::serve::{AnyStore, Api, ServerState, app};
/// # use sluice_core::MemoryStore;
/// # use sluice_http::Enforcer;
/// # use sluice_policy::Policy;
/// use tower::ServiceExt;
///
/// let api: Api = app(Arc::new(ServerState {
///     enforcer: Arc::new(Enforcer::new(Policy::default(), AnyStore::Memory(MemoryStore::new()))),
///     admin_token: None,
///     api_token: None,
///     metrics: None,
///     reload_error: Default::default(),
///     dashboard: None,
/// }));
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let get = |path| http::Request::get(path).body(Body::empty());
/// let health = api.clone().oneshot(get("/healthz")?).await?;
/// let limit = api.oneshot(get("/v1/limit")?).await?;
/// assert_eq!((health.status().as_u16(), limit.status().as_u16()), (200, 405));
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
pub struct Api<C = SystemClock> {
    state: Arc<ServerState<C>>,
    router: Router,
}

// By hand: a derive would ask for `C: Clone`, which a clock need not be.
impl<C> Clone for Api<C> {
    fn clone(&self) -> Self {
        Api {
            state: Arc::clone(&self.state),
            router: self.router.clone(),
        }
    }
}

impl<C, B> Service<Request<B>> for Api<C>
where
    C: Clock + Send + Sync + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let req = req.map(Body::new);
        if let Some(refused) = page_refusal(&self.state, &req) {
            return Box::pin(std::future::ready(Ok(refused)));
        }
        let consume = match (req.method(), req.uri().path()) {
            (&Method::POST, "/v1/limit") => true,
            (&Method::POST, "/v1/check") => false,
            _ => return Box::pin(self.router.clone().oneshot(req)),
        };
        let state = Arc::clone(&self.state);
        Box::pin(async move { Ok(call(&state, req, consume).await) })
    }
}

/// Every route of the router. `/openapi.json` must describe each path,
/// which the tests check against [`paths`].
fn routes<C: Clock + Send + Sync + 'static>()
-> Vec<(&'static str, MethodRouter<Arc<ServerState<C>>>)> {
    let api = [
        ("/v1/limit", post(limit::<C>)),
        ("/v1/check", post(check::<C>)),
        ("/v1/refund", post(refund::<C>)),
        ("/v1/acquire", post(acquire::<C>)),
        ("/v1/release", post(release::<C>)),
        ("/v1/reset", post(reset::<C>)),
        ("/v1/value", get(value::<C>)),
        ("/v1/enforce", post(enforce::<C>)),
        // The old name of /v1/enforce, kept for the clients that use it
        // and marked deprecated in the OpenAPI description.
        ("/v1/decide", post(enforce::<C>)),
        (
            "/openapi.json",
            get(|| async { crate::openapi::response(crate::openapi::SERVE) }),
        ),
    ];
    api.into_iter().chain(crate::ops::routes::<C>()).collect()
}

/// The paths the decision API answers.
///
/// ```
/// assert!(sluice_server::serve::paths().contains(&"/v1/limit"));
/// ```
pub fn paths() -> Vec<&'static str> {
    routes::<SystemClock>()
        .into_iter()
        .map(|(path, _)| path)
        .collect()
}

fn router<C: Clock + Send + Sync + 'static>(state: Arc<ServerState<C>>) -> Router {
    routes::<C>()
        .into_iter()
        .fold(Router::new(), |router, (path, method)| {
            router.route(path, method)
        })
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "no such endpoint".into()) })
        .method_not_allowed_fallback(|| async {
            problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "the endpoint does not take this method".into(),
            )
        })
        .with_state(state)
}

mod access;
mod answer;
mod calls;
mod enforce;
mod keys;
mod leases;
mod reading;

use self::access::*;
use self::answer::*;
use self::calls::*;
use self::enforce::*;
use self::keys::*;
use self::leases::*;
use self::reading::*;
