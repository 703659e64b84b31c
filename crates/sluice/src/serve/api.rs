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
/// use sluice::serve::{AnyStore, ServerState, app};
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
/// use sluice::serve::{AnyStore, Api, ServerState, app};
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
        ("/v1/decide", post(decide::<C>)),
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
/// assert!(sluice::serve::paths().contains(&"/v1/limit"));
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

/// Reads a whole request body of at most [`MAX_BODY`] bytes. A body that
/// arrives in one piece, as a call's JSON does, is passed on without a copy
/// or the buffer list that collecting a body in general needs. A body that
/// misses the server's body timeout is a 408.
// The error is the response that ends the request; boxing it buys nothing.
#[allow(clippy::result_large_err)]
async fn read_body(mut body: Body) -> Result<Bytes, Response> {
    let too_large = || {
        problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {MAX_BODY} bytes"),
        )
    };
    if hyper::body::Body::size_hint(&body).lower() > MAX_BODY as u64 {
        return Err(too_large());
    }
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| match super::body::BodyTimedOut::in_chain(&e) {
            Some(late) => problem(StatusCode::REQUEST_TIMEOUT, late.to_string()),
            None => problem(
                StatusCode::BAD_REQUEST,
                format!("the request body could not be read: {e}"),
            ),
        })?;
        // Trailers carry nothing a call reads.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let held = joined.as_ref().map_or(first.len(), BytesMut::len);
        if held + data.len() > MAX_BODY {
            return Err(too_large());
        }
        match &mut joined {
            Some(buf) => buf.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut buf = BytesMut::with_capacity(held + data.len());
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&data);
                joined = Some(buf);
            }
        }
    }
    Ok(joined.map_or(first, BytesMut::freeze))
}

/// Reads a body that `headers` must announce as JSON (a 415 otherwise: see
/// [`is_json`]), as [`read_body`] does.
#[allow(clippy::result_large_err)]
async fn json_body(headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    if !is_json(headers) {
        return Err(not_json(headers));
    }
    read_body(body).await
}

/// Reads a request's JSON body, turning every way it can be wrong into a
/// problem.
#[allow(clippy::result_large_err)]
async fn json<T: serde::de::DeserializeOwned>(req: Request) -> Result<T, Response> {
    let (parts, body) = req.into_parts();
    parse(&json_body(&parts.headers, body).await?)
}

/// Parses a JSON body that `T` may borrow strings from.
#[allow(clippy::result_large_err)]
fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, Response> {
    serde_json::from_slice(bytes)
        .map_err(|e| problem(StatusCode::BAD_REQUEST, format!("malformed JSON body: {e}")))
}

/// A `/v1/limit` or `/v1/check` body. Its strings borrow from the body
/// unless they hold escapes: a call on a policy's limit allocates nothing
/// to be read. A call that brings its own limit gives its `algorithm` and
/// `algorithm_config`, and `limit` names its state.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Call<'a> {
    #[serde(borrow)]
    limit: Cow<'a, str>,
    #[serde(borrow)]
    key: Cow<'a, str>,
    count: Option<serde_json::Number>,
    #[serde(default)]
    reserve: bool,
    /// Charge whatever the key holds, below zero if need be: a cost
    /// settled after the fact (see [`Settle::Charge`]).
    #[serde(default)]
    force: bool,
    algorithm: Option<serde_json::Value>,
    algorithm_config: Option<serde_json::Value>,
}

impl Call<'_> {
    /// What in the call needs the API token, if anything: what can hold a
    /// key back for others (`force`, and `reserve` on a call that takes),
    /// or define or redefine a limit (`algorithm`, `algorithm_config`).
    /// A check that reserves changes nothing, so it needs none.
    fn privileged(&self, consume: bool) -> Option<&'static str> {
        if self.force {
            Some("`force`")
        } else if consume && self.reserve {
            Some("`reserve`")
        } else if self.algorithm.is_some() || self.algorithm_config.is_some() {
            Some("a limit brought inline (`algorithm`, `algorithm_config`)")
        } else {
            None
        }
    }
}

#[derive(Debug, Serialize)]
struct Answer {
    allowed: bool,
    #[serde(serialize_with = "crate::numbers::number")]
    limit: f64,
    remaining: u64,
    retry_after: Option<f64>,
    reset: f64,
    /// `fail_open` on a decision made without the store; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    degraded: Option<&'static str>,
}

impl From<Decision> for Answer {
    fn from(d: Decision) -> Answer {
        Answer {
            allowed: d.allowed,
            limit: d.capacity,
            remaining: d.remaining,
            retry_after: d.retry_after,
            reset: d.reset,
            degraded: None,
        }
    }
}

impl From<NamedDecision> for Answer {
    fn from(d: NamedDecision) -> Answer {
        Answer {
            degraded: d.without_store.map(degraded),
            ..Answer::from(d.decision)
        }
    }
}

/// 200 when allowed, 429 when not, with the decision as JSON.
fn answer(d: impl Into<Answer>) -> Response {
    let answer = d.into();
    let status = if answer.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    json_response(status, &answer)
}

/// `value` as a JSON response. Written into a `Vec` sized for a decision
/// rather than through `axum::Json`'s growable buffer, whose per-write
/// bookkeeping cost a `/v1/limit` call about 1,600 instructions (callgrind).
fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response {
    let mut body = Vec::with_capacity(128);
    match serde_json::to_writer(&mut body, value) {
        Ok(()) => {
            let mut res = Response::new(Body::from(body));
            *res.status_mut() = status;
            res.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            res
        }
        Err(e) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the answer could not be written: {e}"),
        ),
    }
}

/// The count a body gives (1 when it gives none): a 400 for one below 0,
/// and a 422 for a whole number above 2⁵³, which a double cannot hold
/// exactly and would round into range.
#[allow(clippy::result_large_err)]
fn count_of(count: Option<&serde_json::Number>) -> Result<f64, Response> {
    let Some(n) = count else {
        return Ok(1.0);
    };
    if n.as_u64()
        .is_some_and(|u| u > sluice_core::MAX_EXACT_TOKENS as u64)
    {
        return Err(problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("`count` must be at most 2^53, got {n}"),
        ));
    }
    match n.as_f64() {
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(problem(
            StatusCode::BAD_REQUEST,
            format!("`count` must be a finite number ≥ 0, got {n}"),
        )),
    }
}

fn unknown_limit(name: &str) -> Response {
    problem(
        StatusCode::NOT_FOUND,
        format!("no limit named {name:?} in the policy, nor given inline"),
    )
}

fn store_failed(e: &StoreError) -> Response {
    match e {
        StoreError::Cost(c) => problem(StatusCode::UNPROCESSABLE_ENTITY, c.to_string()),
        other => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store could not decide: {other}"),
        ),
    }
}

async fn call<C: Clock + Send + Sync + 'static>(
    state: &ServerState<C>,
    req: Request,
    consume: bool,
) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match json_body(&parts.headers, body).await {
        Ok(b) => b,
        Err(res) => return res,
    };
    let call: Call<'_> = match parse(&bytes) {
        Ok(c) => c,
        Err(res) => return res,
    };
    if let Some(what) = call.privileged(consume)
        && let Some(refused) = privilege_refusal(state, &parts.headers, what)
    {
        return refused;
    }
    let count = match count_of(call.count.as_ref()) {
        Ok(c) => c,
        Err(res) => return res,
    };
    let policy = state.enforcer.policy();
    let inline;
    let named = match (&call.algorithm, &call.algorithm_config) {
        // A policy's limit first, without the `Arc` an inline one comes in.
        (None, None) => match policy.named_limit(&call.limit) {
            Some(named) => named,
            None => match state.enforcer.limit_named(&policy, &call.limit) {
                Some(limit) => {
                    inline = limit;
                    &*inline
                }
                None => return unknown_limit(&call.limit),
            },
        },
        (Some(algorithm), config) => {
            let config = config.as_ref().unwrap_or(&serde_json::Value::Null);
            match state
                .enforcer
                .inline_limit(&policy, &call.limit, algorithm, config)
            {
                Ok(limit) => {
                    inline = limit;
                    &*inline
                }
                Err(e) => return problem(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
            }
        }
        (None, Some(_)) => {
            return problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "`algorithm_config` needs the `algorithm` it configures".into(),
            );
        }
    };
    if consume && named.limit().takes_leases() {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "limit {:?} counts calls in flight: take a slot with /v1/acquire, which \
                 answers with the lease to release when the call ends",
                named.name()
            ),
        );
    }
    if call.force {
        return match (consume, call.reserve) {
            (true, false) => settled(
                state
                    .enforcer
                    .settle_named(named, &call.key, Settle::Charge(count))
                    .await,
            ),
            (false, _) => problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "a check changes nothing, so it cannot be forced: send `force` to /v1/limit".into(),
            ),
            (true, true) => problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "`force` charges at once whatever the key holds, so it takes no `reserve`".into(),
            ),
        };
    }
    let mode = match (consume, call.reserve) {
        (false, r) => Mode {
            consume: false,
            reserve: r,
        },
        (true, true) => Mode::RESERVE,
        (true, false) => Mode::CONSUME,
    };
    match state
        .enforcer
        .decide_named(named, &call.key, count, mode)
        .await
    {
        Ok(d) => answer(d),
        Err(e) => store_failed(&e),
    }
}

async fn limit<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    call(&s, req, true).await
}

async fn check<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    call(&s, req, false).await
}

/// A settlement's answer: the key as it stands, always 200.
fn settled(result: Result<Decision, StoreError>) -> Response {
    match result {
        Ok(d) => answer(d),
        Err(e) => store_failed(&e),
    }
}

/// A `/v1/refund` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Refund {
    limit: String,
    key: String,
    count: serde_json::Number,
}

/// Gives `count` tokens back to a key of a policy's limit, or of an inline
/// limit the server knows, never above its capacity. A refund can fill a
/// key that others emptied, so it is privileged; the token is checked
/// before the body is read.
async fn refund<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    if let Some(refused) = privilege_refusal(&s, req.headers(), "/v1/refund") {
        return refused;
    }
    let r: Refund = match json(req).await {
        Ok(r) => r,
        Err(res) => return res,
    };
    let count = match count_of(Some(&r.count)) {
        Ok(c) => c,
        Err(res) => return res,
    };
    let policy = s.enforcer.policy();
    let Some(named) = s.enforcer.limit_named(&policy, &r.limit) else {
        return unknown_limit(&r.limit);
    };
    settled(
        s.enforcer
            .settle_named(&named, &r.key, Settle::Refund(count))
            .await,
    )
}

/// A `/v1/acquire` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Acquire {
    limit: String,
    key: String,
    count: Option<serde_json::Number>,
}

/// What `/v1/acquire` answers: the decision, and the lease when admitted.
#[derive(Debug, Serialize)]
struct Acquired {
    #[serde(flatten)]
    decision: Answer,
    /// The lease's id, as a string (it is a 53-bit number, which not every
    /// JSON reader keeps exact); null when denied.
    lease: Option<String>,
    /// Seconds until the lease expires if it is never released; null when
    /// denied.
    expires: Option<f64>,
}

/// Takes `count` slots (1 by default) of a key of a concurrency limit under
/// a new lease: 200 with the lease, or 429 when the key's slots are taken.
async fn acquire<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    let a: Acquire = match json(req).await {
        Ok(a) => a,
        Err(res) => return res,
    };
    let count = match count_of(a.count.as_ref()) {
        Ok(c) => c,
        Err(res) => return res,
    };
    let policy = s.enforcer.policy();
    let Some(named) = s.enforcer.limit_named(&policy, &a.limit) else {
        return unknown_limit(&a.limit);
    };
    let Algorithm::Concurrency(c) = named.limit().algorithm() else {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "limit {:?} is a {}, which holds no leases: call /v1/limit",
                named.name(),
                named.limit().algorithm().name()
            ),
        );
    };
    let lease_secs = c.lease().as_secs_f64();
    match s.enforcer.acquire_named(&named, &a.key, count).await {
        Ok((d, held)) => {
            let status = if d.decision.allowed {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            let answer = Acquired {
                decision: Answer::from(d),
                lease: held.as_ref().map(|h| h.lease.to_string()),
                expires: held.map(|_| lease_secs),
            };
            json_response(status, &answer)
        }
        Err(e) => store_failed(&e),
    }
}

/// A `/v1/release` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Release {
    limit: String,
    key: String,
    lease: String,
}

/// Gives a lease's slots back. Releasing a lease that is unknown, expired
/// or released already is no error: the answer says it released nothing.
async fn release<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    let r: Release = match json(req).await {
        Ok(r) => r,
        Err(res) => return res,
    };
    let policy = s.enforcer.policy();
    let Some(named) = s.enforcer.limit_named(&policy, &r.limit) else {
        return unknown_limit(&r.limit);
    };
    // Not a lease this server could have handed out: nothing to release.
    let released = match r.lease.parse::<u64>() {
        Ok(lease) if lease > 0 => {
            let held = sluice_engine::HeldLease {
                limit: named.limit().clone(),
                key: r.key,
                lease,
            };
            match s.enforcer.release(&held).await {
                Ok(released) => released,
                Err(e) => return store_failed(&e),
            }
        }
        _ => false,
    };
    json_response(StatusCode::OK, &serde_json::json!({ "released": released }))
}

/// Whether `headers` carry the admin token as a bearer token.
fn is_admin<C>(state: &ServerState<C>, headers: &HeaderMap) -> bool {
    state
        .admin_token
        .as_deref()
        .is_some_and(|token| holds_token(token, headers, false))
}

/// Whether `headers` carry the API token or the admin token as a bearer
/// token. The admin token does whatever the API token does: whoever holds
/// it may reset any key, more than a privileged call can do.
fn carries_a_token<C>(state: &ServerState<C>, headers: &HeaderMap) -> bool {
    let api = state
        .api_token
        .as_deref()
        .is_some_and(|token| holds_token(token, headers, false));
    api || is_admin(state, headers)
}

/// The 401 for `what`, a privileged part of a call, without the token;
/// none when the call carries it or the server has no API token, which
/// leaves privileged calls open to every caller (the server says so when
/// it starts).
fn privilege_refusal<C>(
    state: &ServerState<C>,
    headers: &HeaderMap,
    what: &str,
) -> Option<Response> {
    if state.api_token.is_none() || carries_a_token(state, headers) {
        return None;
    }
    Some(bearer_needed(format!(
        "{what} needs the API token: `Authorization: Bearer <token>`"
    )))
}

/// A 401 that asks for a bearer token.
fn bearer_needed(detail: String) -> Response {
    let mut res = problem(StatusCode::UNAUTHORIZED, detail);
    res.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

/// The 403 for a request to a decision endpoint that a browser sent for a
/// web page other than the server's own (see [`foreign_page`]), unless it
/// carries a token: a page can have its visitors' browsers call whatever
/// address they reach. The dashboard's paths answer by a rule of their
/// own, and the operational endpoints, which change nothing and name no
/// key, answer anyone.
fn page_refusal<C>(state: &ServerState<C>, req: &Request) -> Option<Response> {
    let path = req.uri().path();
    if !path.starts_with("/v1/") || path == dashboard::STATS {
        return None;
    }
    let why = foreign_page(req.uri(), req.headers())?;
    if carries_a_token(state, req.headers()) {
        return None;
    }
    Some(problem(
        StatusCode::FORBIDDEN,
        format!(
            "the decision API answers no web page but the server's own, opened by address: \
             {why}. Call it from a service, or with the API token"
        ),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyRef {
    limit: String,
    key: String,
}

async fn reset<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    if !is_admin(&s, req.headers()) {
        let detail = if s.admin_token.is_some() {
            "resetting a key needs the admin token: `Authorization: Bearer <token>`"
        } else {
            "admin endpoints are disabled: start the server with --admin-token"
        };
        return bearer_needed(detail.into());
    }
    let r: KeyRef = match json(req).await {
        Ok(r) => r,
        Err(res) => return res,
    };
    let policy = s.enforcer.policy();
    let Some(named) = s.enforcer.limit_named(&policy, &r.limit) else {
        return unknown_limit(&r.limit);
    };
    match s.enforcer.reset_named(&named, &r.key).await {
        Ok(()) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({"reset": true})),
        )
            .into_response(),
        Err(e) => store_failed(&e),
    }
}

async fn value<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    query: Result<Query<KeyRef>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(r) = match query {
        Ok(q) => q,
        Err(e) => return problem(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let policy = s.enforcer.policy();
    let Some(named) = s.enforcer.limit_named(&policy, &r.limit) else {
        return unknown_limit(&r.limit);
    };
    let limit = named.limit();
    match s.enforcer.store().value(limit, &r.key).await {
        Ok(v) => axum::Json(serde_json::json!({
            "limit": limit.algorithm().capacity(),
            "tokens": v.tokens,
            "remaining": if v.tokens > 0.0 { v.tokens.floor() } else { 0.0 },
        }))
        .into_response(),
        Err(e) => store_failed(&e),
    }
}

/// A request to decide, in the shape `sluice replay` reads.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Event {
    /// The time replay would decide it at. The server decides at its own
    /// time; a `t` is taken so that replay's lines can be sent as they are.
    #[serde(rename = "t")]
    _t: Option<serde_json::Number>,
    ip: Option<IpAddr>,
    #[serde(default = "get_method")]
    method: String,
    #[serde(default = "root")]
    path: String,
    host: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    query: String,
}

fn get_method() -> String {
    "GET".into()
}

fn root() -> String {
    "/".into()
}

#[derive(Debug, Serialize)]
struct DecideAnswer {
    allowed: bool,
    rule: Option<String>,
    limit: Option<f64>,
    remaining: Option<u64>,
    retry_after: Option<f64>,
    reset: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    shadow_denied: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// `fail_open` or `fail_closed` on a verdict made without the store;
    /// absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    degraded: Option<&'static str>,
    headers: BTreeMap<String, String>,
}

async fn decide<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    let e: Event = match json(req).await {
        Ok(e) => e,
        Err(res) => return res,
    };
    let policy = s.enforcer.policy();
    let parts = RequestParts {
        ip: e.ip,
        method: e.method,
        path: e.path,
        host: e.host,
        headers: e.headers.into_iter().collect(),
        query: e.query,
        ..RequestParts::default()
    }
    // `ip` is the peer the request came from, as a socket reports it.
    .with_client_behind(policy.trusted_proxies());
    let mut verdict = s.enforcer.enforce_with(&policy, &parts).await;
    // Nothing here learns when the request's work ends: slots it took on
    // concurrency rules are released right after it is decided (use /v1/acquire
    // and /v1/release, the middleware or the proxy to hold one).
    let _slots = s.enforcer.hold(&mut verdict);
    decided(&verdict)
}

fn decided(v: &Verdict) -> Response {
    let mut headers = BTreeMap::new();
    each_rate_limit_header(v, |name, value| {
        headers.insert(name.as_str().to_owned(), value.into());
    });
    let (status, error) = if v.allowed {
        (StatusCode::OK, None)
    } else {
        let problem = Problem::denial(v);
        headers.insert(
            header::CONTENT_TYPE.as_str().to_owned(),
            PROBLEM_JSON.to_str().unwrap_or_default().to_owned(),
        );
        (problem.status(), Some(problem.detail().to_owned()))
    };
    let d = v.deciding();
    let answer = DecideAnswer {
        allowed: v.allowed,
        rule: v
            .denied_by()
            .map(str::to_owned)
            .or_else(|| d.map(|d| d.rule.clone())),
        limit: d.map(|d| d.decision.capacity),
        remaining: d.map(|d| d.decision.remaining),
        retry_after: v.retry_after,
        reset: d.map(|d| d.decision.reset),
        shadow_denied: v.shadow_denied().map(str::to_owned).collect(),
        error: error
            .filter(|_| v.refusal.is_some())
            .map(|e| clip(&e).into_owned()),
        degraded: v.without_store.map(degraded),
        headers,
    };
    (status, axum::Json(answer)).into_response()
}
