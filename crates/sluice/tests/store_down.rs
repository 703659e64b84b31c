//! `sluice serve` and `sluice proxy` started on a Redis that is not there
//! (a port nothing listens on, as `--store redis://127.0.0.1:1` was in the
//! attack that found this): every answer made without the store says so,
//! in the decision API's body, the headers, Envoy's answer, and the
//! metrics.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use support::proxy::spawn_proxy;
use support::serve::spawn_serve_with;
use support::upstream::start_upstream;
use support::{Process, free_port, get_text, metric, policy_file};

const POLICY: &str = r#"
limits:
  open-limit:
    algorithm: token_bucket
    algorithm_config: {rps: 10}
    on_store_error: open
  closed-limit:
    algorithm: token_bucket
    algorithm_config: {rps: 10}
    on_store_error: closed
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 10}
    on_store_error: open
  - name: edge-open
    domain: edge
    limit_keys: ["descriptor:user"]
    algorithm: token_bucket
    algorithm_config: {rps: 10}
    on_store_error: open
  - name: edge-closed
    domain: strict
    limit_keys: ["descriptor:user"]
    algorithm: token_bucket
    algorithm_config: {rps: 10}
    on_store_error: closed
"#;

/// `sluice serve` on a Redis URL whose port nothing listens on, once it
/// answers `/healthz` (it is never ready); its HTTP base URL and its gRPC
/// address.
async fn serve_without_redis() -> (Process, tempfile::TempDir, String, String) {
    let (dir, path) = policy_file(POLICY);
    let store = format!("redis://127.0.0.1:{}", free_port());
    let (server, base, grpc) = spawn_serve_with(&path, &["--store", &store], &[], "/healthz").await;
    (server, dir, base, grpc)
}

async fn post(
    client: &reqwest::Client,
    url: String,
    body: impl Into<reqwest::Body>,
) -> (u16, serde_json::Value) {
    let res = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.json().await.unwrap())
}

async fn rls(grpc: &str, domain: &str) -> RateLimitResponse {
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "u1".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    };
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

fn metadata(r: &RateLimitResponse) -> Option<&str> {
    match &r.dynamic_metadata.as_ref()?.fields.get("degraded")?.kind {
        Some(Kind::StringValue(s)) => Some(s),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_made_without_the_store_say_so_and_are_counted() {
    let (_server, _dir, base, grpc) = serve_without_redis().await;
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );

    let call = |limit: &str| {
        let body = format!(r#"{{"limit": "{limit}", "key": "k"}}"#);
        post(&client, format!("{base}/v1/limit"), body)
    };
    // A named limit that fails open admits, and says how.
    let (status, body) = call("open-limit").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["allowed"], true, "{body}");
    assert_eq!(body["degraded"], "fail_open", "{body}");
    // One that fails closed answers 503, as before.
    let (status, body) = call("closed-limit").await;
    assert_eq!(status, 503, "{body}");

    // A request decision, with the header the middleware would set.
    let (status, body) = post(
        &client,
        format!("{base}/v1/enforce"),
        r#"{"ip": "192.0.2.1", "path": "/"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["degraded"], "fail_open", "{body}");
    assert_eq!(body["headers"]["sluice-degraded"], "fail_open", "{body}");

    // Envoy hears it in a header for the client and in dynamic metadata.
    let open = rls(&grpc, "edge").await;
    assert_eq!(open.overall_code, Code::Ok as i32);
    assert_eq!(header(&open, "sluice-degraded"), Some("fail_open"));
    assert_eq!(metadata(&open), Some("fail_open"));
    let closed = rls(&grpc, "strict").await;
    assert_eq!(closed.overall_code, Code::OverLimit as i32);
    assert_eq!(header(&closed, "sluice-degraded"), Some("fail_closed"));
    assert_eq!(metadata(&closed), Some("fail_closed"));

    let text = get_text(&client, &format!("{base}/metrics")).await;
    for (rule, fail) in [
        ("open-limit", "open"),
        ("closed-limit", "closed"),
        ("per-ip", "open"),
        ("edge-open", "open"),
        ("edge-closed", "closed"),
    ] {
        let series =
            format!("sluice_decisions_without_store_total{{rule=\"{rule}\",fail=\"{fail}\"}}");
        assert_eq!(metric(&text, &series), Some(1.0), "{series} in:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_says_when_it_let_a_request_through_without_the_store() {
    let (upstream, seen) = start_upstream().await;
    let (_dir, path) = policy_file(&format!(
        "store: {{kind: redis, url: \"redis://127.0.0.1:{}\"}}\n{POLICY}",
        free_port()
    ));
    let (_proxy, listen, _admin) = spawn_proxy(upstream, &path, &[]).await;
    let res = reqwest::get(format!("http://{listen}/")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(seen.hits(), 1);
    assert_eq!(res.headers().get("sluice-degraded").unwrap(), "fail_open");
}
