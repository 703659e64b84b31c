//! The live dashboard's data, `/v1/stats`, and who may read it: sampled on
//! paused tokio time in process, and served by the real `sluice proxy`'s
//! admin listener.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use base64::Engine;
use http_body_util::BodyExt;
use serde_json::Value;
use sluice_core::{MemoryStore, SystemClock};
use sluice_http::Enforcer;
use sluice_policy::Policy;
use sluice_server::serve::{AnyStore, Dashboard, ServerState, app};
use tower::ServiceExt;

use support::proxy::spawn_proxy;
use support::upstream::start_upstream;
use support::{PATIENCE, eventually, policy_file};

const POLICY: &str = r#"
limits:
  sendMessage:
    algorithm: token_bucket
    algorithm_config: {rate: 10, period: 60, burst: 2}
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
  - name: login-trial
    mode: shadow
    limit_keys: [ip:address]
    algorithm: fixed_window
    algorithm_config: {rate: 1, period: 60}
"#;

/// A server state whose dashboard samples on the test's (paused) clock.
fn state(token: Option<&str>) -> Arc<ServerState> {
    let policy = Policy::from_str(POLICY, "policy.yaml").unwrap();
    let enforcer = Arc::new(Enforcer::new(policy, AnyStore::Memory(MemoryStore::new())));
    Arc::new(ServerState {
        dashboard: Some(Dashboard::start(&enforcer, Some("policy.yaml".into()))),
        enforcer,
        admin_token: token.map(str::to_owned),
        api_token: None,
        metrics: None,
        reload_error: arc_swap::ArcSwapOption::empty(),
    })
}

/// One request through the router: the status, the headers and the body.
async fn send(
    s: &Arc<ServerState<SystemClock>>,
    method: &str,
    uri: &str,
    body: &str,
    auth: Option<&str>,
) -> (u16, http::HeaderMap, Vec<u8>) {
    send_to(s, None, method, uri, body, auth).await
}

/// [`send`], addressed to `host` when given.
async fn send_to(
    s: &Arc<ServerState<SystemClock>>,
    host: Option<&str>,
    method: &str,
    uri: &str,
    body: &str,
    auth: Option<&str>,
) -> (u16, http::HeaderMap, Vec<u8>) {
    let mut req = http::Request::builder().method(method).uri(uri);
    if method == "POST" {
        req = req.header("content-type", "application/json");
    }
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    if let Some(h) = host {
        req = req.header("host", h);
    }
    let res = app(Arc::clone(s))
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, headers, bytes.to_vec())
}

async fn stats(s: &Arc<ServerState>, auth: Option<&str>) -> Value {
    let (status, _, body) = send(s, "GET", "/v1/stats", "", auth).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// Lets paused time pass until the sampler has taken its next sample, which
/// must come within a second and a bit.
async fn next_second(s: &Arc<ServerState>) {
    let samples = async || stats(s, None).await["seconds"].as_array().unwrap().len();
    let before = samples().await;
    for _ in 0..11 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if samples().await > before {
            return;
        }
    }
    panic!("no sample was taken within 1.1 s of paused time");
}

fn event(ip: &str) -> String {
    format!(r#"{{"method": "GET", "path": "/", "ip": "{ip}"}}"#)
}

fn rule<'a>(stats: &'a Value, name: &str, mode: &str) -> &'a Value {
    stats["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == name && r["mode"] == mode)
        .unwrap_or_else(|| panic!("no {name} ({mode}) in {stats}"))
}

#[tokio::test(start_paused = true)]
async fn each_second_counts_every_rules_decisions_and_the_keys_denied_most() {
    let s = state(None);
    for _ in 0..3 {
        send(&s, "POST", "/v1/enforce", &event("192.0.2.7"), None).await;
    }
    send(&s, "POST", "/v1/enforce", &event("192.0.2.8"), None).await;
    for _ in 0..4 {
        send(
            &s,
            "POST",
            "/v1/limit",
            r#"{"limit": "sendMessage", "key": "alice"}"#,
            None,
        )
        .await;
    }
    next_second(&s).await;

    let got = stats(&s, None).await;
    let per_ip = rule(&got, "per-ip", "enforce");
    assert_eq!(per_ip["allowed"].as_array().unwrap().last().unwrap(), 2);
    assert_eq!(per_ip["denied"].as_array().unwrap().last().unwrap(), 2);
    assert_eq!(
        (
            per_ip["allowed_total"].as_u64(),
            per_ip["denied_total"].as_u64()
        ),
        (Some(2), Some(2))
    );
    // A shadow rule's decisions are what it would have done.
    let trial = rule(&got, "login-trial", "shadow");
    assert_eq!(
        (
            trial["allowed_total"].as_u64(),
            trial["denied_total"].as_u64()
        ),
        (Some(2), Some(2))
    );
    let send_message = rule(&got, "sendMessage", "enforce");
    assert_eq!(
        send_message["denied"].as_array().unwrap().last().unwrap(),
        2
    );
    // Every series has one entry per sample.
    let samples = got["seconds"].as_array().unwrap().len();
    assert_eq!(per_ip["allowed"].as_array().unwrap().len(), samples);
    assert_eq!(got["store"]["calls"].as_array().unwrap().len(), samples);
    assert!(
        got["store"]["calls"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .as_u64()
            >= Some(12)
    );
    assert_eq!(
        got["store"]["errors"].as_array().unwrap().last().unwrap(),
        0
    );
    assert!(
        got["store"]["p99_seconds"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .as_f64()
            > Some(0.0)
    );

    let top: Vec<(String, String, String, u64)> = got["top_keys"]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["rule"].as_str().unwrap().to_owned(),
                k["mode"].as_str().unwrap().to_owned(),
                k["key"].as_str().unwrap().to_owned(),
                k["denied"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        top,
        [
            ("login-trial".into(), "shadow".into(), "192.0.2.7".into(), 2),
            ("per-ip".into(), "enforce".into(), "192.0.2.7".into(), 2),
            ("sendMessage".into(), "enforce".into(), "alice".into(), 2),
        ]
    );

    // A quiet second is a zero, not a gap.
    next_second(&s).await;
    let quiet = stats(&s, None).await;
    let per_ip = rule(&quiet, "per-ip", "enforce");
    assert_eq!(per_ip["allowed"].as_array().unwrap().last().unwrap(), 0);
    assert_eq!(per_ip["allowed_total"], 2);
}

#[tokio::test(start_paused = true)]
async fn the_policy_in_force_and_readiness_are_reported() {
    let s = state(None);
    let got = stats(&s, None).await;
    assert_eq!(got["ready"], true);
    assert_eq!(got["not_ready_because"], Value::Null);
    assert_eq!(got["policy"]["file"], "policy.yaml");
    assert_eq!(got["policy"]["reload_error"], Value::Null);
    let rules: Vec<&str> = got["policy"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["per-ip", "login-trial"]);
    let trial = &got["policy"]["rules"][1];
    assert_eq!(
        (trial["mode"].as_str(), trial["algorithm"].as_str()),
        (Some("shadow"), Some("fixed_window"))
    );
    assert_eq!(
        (trial["limit"].as_f64(), trial["window_seconds"].as_f64()),
        (Some(1.0), Some(60.0))
    );
    let limit = &got["policy"]["limits"][0];
    assert_eq!(
        (limit["limit"].as_f64(), limit["window_seconds"].as_f64()),
        (Some(2.0), Some(12.0))
    );

    // A reload that failed leaves the server unready, and says why.
    s.reload_error.store(Some(Arc::new("line 3: bad".into())));
    let got = stats(&s, None).await;
    assert_eq!(got["ready"], false);
    assert_eq!(got["policy"]["reload_error"], "line 3: bad");
    assert!(
        got["not_ready_because"]
            .as_str()
            .unwrap()
            .contains("line 3: bad")
    );
}

#[tokio::test(start_paused = true)]
async fn with_an_admin_token_the_dashboard_wants_it_as_a_bearer_token_or_a_browsers_password() {
    let s = state(Some("s3cret"));
    let basic = |credentials: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(credentials)
        )
    };
    for path in ["/ui", "/v1/stats"] {
        let (status, headers, _) = send(&s, "GET", path, "", None).await;
        assert_eq!(status, 401, "{path}");
        assert_eq!(
            headers["www-authenticate"],
            r#"Basic realm="sluice", charset="UTF-8""#
        );
        for wrong in [basic("admin:guess"), basic("s3cret"), "Bearer guess".into()] {
            assert_eq!(
                send(&s, "GET", path, "", Some(&wrong)).await.0,
                401,
                "{path} {wrong}"
            );
        }
        for right in [
            basic("any-user:s3cret"),
            basic(":s3cret"),
            "Bearer s3cret".into(),
        ] {
            assert_eq!(
                send(&s, "GET", path, "", Some(&right)).await.0,
                200,
                "{path} {right}"
            );
        }
    }
    // Basic authentication is for reading only: a browser would send it
    // with a request another site made it send.
    let reset = r#"{"limit": "sendMessage", "key": "alice"}"#;
    let (status, ..) = send(&s, "POST", "/v1/reset", reset, Some(&basic("u:s3cret"))).await;
    assert_eq!(status, 401);
    let (status, ..) = send(&s, "POST", "/v1/reset", reset, Some("Bearer s3cret")).await;
    assert_eq!(status, 200);
}

#[tokio::test(start_paused = true)]
async fn without_a_token_the_dashboard_answers_only_requests_addressed_to_an_ip_or_localhost() {
    let s = state(None);
    for path in ["/ui", "/v1/stats"] {
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:8080",
            "192.0.2.1",
        ] {
            let (status, ..) = send_to(&s, Some(host), "GET", path, "", None).await;
            assert_eq!(status, 200, "{path} {host}");
        }
        // A page elsewhere that points its own name at this server (DNS
        // rebinding) sends its name.
        for host in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "[::1]x",
        ] {
            let (status, _, body) = send_to(&s, Some(host), "GET", path, "", None).await;
            assert_eq!(status, 403, "{path} {host}");
            assert!(String::from_utf8_lossy(&body).contains("--admin-token"));
        }
    }
    // With a token, the name does not matter.
    let s = state(Some("t"));
    let (status, ..) = send_to(
        &s,
        Some("sluice.internal"),
        "GET",
        "/v1/stats",
        "",
        Some("Bearer t"),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test(start_paused = true)]
async fn the_page_is_one_self_contained_document_that_loads_nothing_from_elsewhere() {
    let s = state(None);
    let (status, headers, body) = send(&s, "GET", "/ui", "", None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.starts_with("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    let page = String::from_utf8(body).unwrap();
    assert!(page.contains("/v1/stats"));
    for outside in ["http://", "https://", "src=", "href="] {
        // The SVG namespace is a name, not a location.
        let found = page
            .match_indices(outside)
            .filter(|(i, _)| !page[*i..].starts_with("http://www.w3.org/2000/svg"))
            .count();
        assert_eq!(
            found, 0,
            "the page refers to something outside it: {outside}"
        );
    }
}

#[tokio::test]
async fn the_proxys_admin_listener_serves_the_dashboard_behind_its_token() {
    let (upstream, _) = start_upstream().await;
    let (_dir, path) = policy_file(
        "rules:\n  - name: per-ip\n    limit_keys: [ip:address]\n    \
         algorithm: token_bucket\n    algorithm_config: {rps: 1, burst: 1}\n",
    );
    let (_proxy, listen, admin) =
        spawn_proxy(upstream, &path, &[("SLUICE_ADMIN_TOKEN", "t0ken")]).await;
    let client = reqwest::Client::new();
    for _ in 0..3 {
        client
            .get(format!("http://{listen}/"))
            .send()
            .await
            .unwrap();
    }
    let stats = format!("http://{admin}/v1/stats");
    let refused = client.get(&stats).send().await.unwrap();
    assert_eq!(refused.status(), 401);
    let ui = client
        .get(format!("http://{admin}/ui"))
        .bearer_auth("t0ken")
        .send()
        .await
        .unwrap();
    assert_eq!(ui.status(), 200);
    // The sampler takes a sample a second: the three requests show up in one.
    eventually(PATIENCE, "the proxy's decisions in /v1/stats", async || {
        let got: Value = client
            .get(&stats)
            .bearer_auth("t0ken")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        got["policy"]["file"] == path.display().to_string()
            && got["decisions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["rule"] == "per-ip" && r["allowed_total"] == 1 && r["denied_total"] == 2)
    })
    .await;
}
