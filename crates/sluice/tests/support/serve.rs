//! The serve tests' setup: the decision API in process on a stopped clock,
//! called through `app().oneshot`, and the real `sluice serve` binary.

use std::path::Path;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use http_body_util::BodyExt;
use http_body_util::channel::Channel;
use hyper::body::Frame;
use sluice_core::{FakeClock, MemoryStore, Nanos};
use sluice_http::Enforcer;
use sluice_policy::Policy;
use sluice_server::serve::{AnyStore, ServerState, app};
use tower::ServiceExt;

use super::{PATIENCE, Process, eventually, serve_args, sluice};

/// Two tokens of `sendMessage` at a time, five more reservable; one request
/// a second per client address.
pub(crate) const POLICY: &str = r#"
limits:
  sendMessage:
    algorithm: token_bucket
    algorithm_config: {rate: 10, period: 60, burst: 2, max_reserved: 5}
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
"#;

/// A server state on a stopped clock: every call happens at the same
/// instant, so the numbers the tests expect are exact.
pub(crate) fn state(token: Option<&str>) -> Arc<ServerState<FakeClock>> {
    state_of(POLICY, token)
}

/// [`state`] with another policy.
pub(crate) fn state_of(policy: &str, token: Option<&str>) -> Arc<ServerState<FakeClock>> {
    let policy = Policy::from_str(policy, "policy.yaml").unwrap();
    let store = MemoryStore::with_clock(FakeClock::new(Nanos::ZERO));
    Arc::new(ServerState {
        enforcer: Arc::new(Enforcer::new(policy, AnyStore::Memory(store))),
        admin_token: token.map(str::to_owned),
        api_token: None,
        metrics: None,
        reload_error: arc_swap::ArcSwapOption::empty(),
        dashboard: None,
    })
}

/// `GET uri` without credentials: [`call`]'s status, content type and body.
pub(crate) async fn get<C: sluice_core::Clock + Send + Sync + 'static>(
    s: &Arc<ServerState<C>>,
    uri: &str,
) -> (u16, String, serde_json::Value) {
    call(s, "GET", uri, Body::empty(), None).await
}

/// Sends one request to the API of `s` and returns the status, the
/// content type and the body as JSON (`null` when it is none). A POST's
/// body is sent as `application/json`.
pub(crate) async fn call<C: sluice_core::Clock + Send + Sync + 'static>(
    s: &Arc<ServerState<C>>,
    method: &str,
    uri: &str,
    body: impl Into<Body>,
    auth: Option<&str>,
) -> (u16, String, serde_json::Value) {
    let mut req = http::Request::builder().method(method).uri(uri);
    // Every body the API takes is JSON, and must say so.
    if method == "POST" {
        req = req.header("content-type", "application/json");
    }
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let res = app(Arc::clone(s))
        .oneshot(req.body(body.into()).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let ctype = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, ctype, json)
}

/// A body of `pieces`, sent one after another with no length announced, as
/// a client streaming a chunked body does.
pub(crate) fn in_pieces(pieces: Vec<Vec<u8>>) -> Body {
    let (mut tx, body) = Channel::<Bytes, std::io::Error>::new(pieces.len().max(1));
    for piece in pieces {
        assert!(tx.try_send(Frame::data(Bytes::from(piece))).is_ok());
    }
    Body::new(body)
}

/// Starts `sluice serve` on free ports and waits until it is ready; returns
/// the process, the HTTP base URL and the gRPC address.
pub(crate) async fn spawn_serve(policy: &Path) -> (Process, String, String) {
    spawn_serve_with(policy, &[], &[], "/readyz").await
}

/// [`spawn_serve`] with `args` on its command line and `env` in its
/// environment, waiting until `probe` answers 200 (`/healthz` for a server
/// that cannot be ready).
pub(crate) async fn spawn_serve_with(
    policy: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    probe: &str,
) -> (Process, String, String) {
    let (serve, http, grpc) = serve_args(policy);
    let mut command = sluice();
    command.args(serve).args(args).envs(env.iter().copied());
    let server = Process(command.spawn().unwrap());
    let base = format!("http://{http}");
    let client = reqwest::Client::new();
    eventually(PATIENCE, "the server to start", async || {
        let r = client.get(format!("{base}{probe}")).send().await;
        r.is_ok_and(|r| r.status() == 200)
    })
    .await;
    (server, base, grpc.to_string())
}

/// `POST /v1/check` of `sendMessage` for key `k` on the server at `base`.
pub(crate) async fn check_send_message(client: &reqwest::Client, base: &str) -> reqwest::Response {
    client
        .post(format!("{base}/v1/check"))
        .header("content-type", "application/json")
        .body(r#"{"limit": "sendMessage", "key": "k"}"#)
        .send()
        .await
        .unwrap()
}
