//! Who may call what on `sluice serve`'s decision API, against the real
//! binary on a real port with a real HTTP client: a web page of another
//! site cannot make its visitors' browsers change anything (the attack of
//! issue 36), services and curl are not taken for such a page, and the
//! privileged parts of a call need the API token when the server has one.
//! Each refused call is followed by reading the state back.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::io::Read;
use std::process::Stdio;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use support::serve::spawn_serve_with;
use support::{PATIENCE, Process, eventually, policy_file, serve_args, sluice};

/// Ten messages a key, refilled at one a year, so that what a test reads
/// back after a refused call is what the call left, to a billionth of a
/// token; two upload slots a key; a rule keyed on the client address.
const POLICY: &str = r#"
limits:
  messages:
    algorithm: token_bucket
    algorithm_config: {rate: 10, period: 3650d, max_reserved: 10}
  uploads:
    algorithm: concurrency
    algorithm_config: {max: 2, lease: 1h}
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rate: 10, period: 3650d}
"#;

const ADMIN_TOKEN: &str = "admin-s3cret";
const API_TOKEN: &str = "api-s3cret";

/// A running `sluice serve` and a client for it.
struct Server {
    _process: Process,
    _policy: tempfile::TempDir,
    base: String,
    /// `host:port`, as a browser writes it in `Host` and `Origin`.
    authority: String,
    client: reqwest::Client,
}

impl Server {
    /// Starts the binary over [`POLICY`] with `env` (its tokens).
    async fn start(env: &[(&str, &str)]) -> Server {
        let (dir, path) = policy_file(POLICY);
        let (process, base, _) = spawn_serve_with(&path, &[], env, "/readyz").await;
        Server {
            _process: process,
            _policy: dir,
            authority: base.trim_start_matches("http://").to_owned(),
            base,
            client: reqwest::Client::new(),
        }
    }

    /// `POST path` with `body` and exactly the headers `headers`.
    async fn post(&self, path: &str, body: &Value, headers: HeaderMap) -> (u16, HeaderMap, Value) {
        let res = self
            .client
            .post(format!("{}{path}", self.base))
            .headers(headers)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        (status, headers, res.json().await.unwrap_or(Value::Null))
    }

    /// `POST path` as a service sends it: JSON, with `auth` if given.
    async fn call(&self, path: &str, body: &Value, auth: Option<&str>) -> (u16, Value) {
        let mut headers = headers(&[("content-type", "application/json")]);
        if let Some(auth) = auth {
            headers.insert("authorization", HeaderValue::from_str(auth).unwrap());
        }
        let (status, _, answer) = self.post(path, body, headers).await;
        (status, answer)
    }

    /// `GET /v1/value` of `key` of `limit`: the status and the answer.
    async fn value(&self, limit: &str, key: &str) -> (u16, Value) {
        let res = self
            .client
            .get(format!("{}/v1/value?limit={limit}&key={key}", self.base))
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.json().await.unwrap())
    }

    /// Takes one of the victim's upload slots, as a service does; its lease.
    async fn take_upload(&self) -> String {
        let take = json!({"limit": "uploads", "key": "victim"});
        let (status, held) = self.call("/v1/acquire", &take, None).await;
        assert_eq!(status, 200, "{held}");
        held["lease"].as_str().unwrap().to_owned()
    }

    /// The tokens `key` of `messages` holds now.
    async fn messages(&self, key: &str) -> f64 {
        let (status, answer) = self.value("messages", key).await;
        assert_eq!(status, 200, "{answer}");
        answer["tokens"].as_f64().unwrap()
    }
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(name, value)| {
            (
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            )
        })
        .collect()
}

/// Asserts that `key` of `messages` holds `tokens` (a year's refill is one
/// token: a test's few seconds add less than a millionth).
async fn assert_messages(server: &Server, key: &str, tokens: f64, after: &str) {
    let now = server.messages(key).await;
    assert!(
        (now - tokens).abs() < 1e-6,
        "{now} tokens, not {tokens}, after {after}"
    );
}

/// A body that spends `count` of the victim's messages.
fn spend(count: u32) -> Value {
    json!({"limit": "messages", "key": "victim", "count": count})
}

/// The calls an attacker would have a victim's browser make, on every
/// endpoint that changes something: the year-long lockout of issue 36
/// (`force` with 2^53), a plain spend, a reservation, a limit brought
/// inline (by `/v1/limit` and by `/v1/check`), a refund, a slot taken,
/// the victim's lease released, a reset and a request decided.
fn attacks(lease: &str) -> Vec<(&'static str, Value)> {
    let inline = json!({"limit": "stolen", "key": "victim", "algorithm": "token_bucket",
        "algorithm_config": {"rate": 1, "period": "3650d"}});
    vec![
        (
            "/v1/limit",
            json!({"limit": "messages", "key": "victim", "count": 9_007_199_254_740_992_u64, "force": true}),
        ),
        ("/v1/limit", spend(6)),
        (
            "/v1/limit",
            json!({"limit": "messages", "key": "victim", "count": 10, "reserve": true}),
        ),
        ("/v1/limit", inline.clone()),
        ("/v1/check", inline),
        (
            "/v1/refund",
            json!({"limit": "messages", "key": "victim", "count": 4}),
        ),
        ("/v1/acquire", json!({"limit": "uploads", "key": "victim"})),
        (
            "/v1/release",
            json!({"limit": "uploads", "key": "victim", "lease": lease}),
        ),
        ("/v1/reset", json!({"limit": "messages", "key": "victim"})),
        ("/v1/enforce", json!({"ip": "192.0.2.66", "path": "/"})),
    ]
}

/// The attack of issue 36: a page on another site has its visitors'
/// browsers POST to the API. A browser sends a `text/plain`, form or
/// untyped body without asking the server first (no CORS preflight), and
/// marks what a page sends with `Origin` and `Sec-Fetch-Site`; a page that
/// points a name of its own at the server (DNS rebinding) sends JSON to
/// what the browser takes for the page's own origin. On a server without
/// an API token, none of it changes anything, on any endpoint.
#[tokio::test]
async fn a_web_page_of_another_site_changes_nothing_through_any_endpoint() {
    let server = Server::start(&[("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)]).await;
    // The victim has spent 4 of 10 messages and holds one of two upload slots.
    assert_eq!(server.call("/v1/limit", &spend(4), None).await.0, 200);
    let lease = server.take_upload().await;

    let json = "application/json";
    let rebound = format!(
        "evil.example:{}",
        server.authority.rsplit(':').next().unwrap()
    );
    let rebound_origin = format!("http://{rebound}");
    // What a browser sends for the page, and whether it marks it as the page's.
    let pages: [(&str, HeaderMap, bool); 9] = [
        (
            "a text/plain body",
            headers(&[("content-type", "text/plain;charset=UTF-8")]),
            false,
        ),
        (
            "a form",
            headers(&[("content-type", "application/x-www-form-urlencoded")]),
            false,
        ),
        (
            "a multipart form",
            headers(&[("content-type", "multipart/form-data; boundary=x")]),
            false,
        ),
        (
            "a body with no content type (fetch of an ArrayBuffer)",
            HeaderMap::new(),
            false,
        ),
        (
            "a text/plain body, marked as a cross-site page's",
            headers(&[
                ("content-type", "text/plain;charset=UTF-8"),
                ("origin", "https://evil.example"),
                ("sec-fetch-site", "cross-site"),
            ]),
            true,
        ),
        (
            "JSON from a page of another origin",
            headers(&[("content-type", json), ("origin", "https://evil.example")]),
            true,
        ),
        (
            "JSON a browser marks as cross-site",
            headers(&[("content-type", json), ("sec-fetch-site", "cross-site")]),
            true,
        ),
        (
            "JSON from an opaque origin (a sandboxed frame)",
            headers(&[("content-type", json), ("origin", "null")]),
            true,
        ),
        (
            "JSON from a page on a name pointed at the server (DNS rebinding)",
            headers(&[
                ("content-type", json),
                ("host", rebound.as_str()),
                ("origin", rebound_origin.as_str()),
                ("sec-fetch-site", "same-origin"),
            ]),
            true,
        ),
    ];
    for (path, body) in attacks(&lease) {
        for (page, sent, marked) in &pages {
            let (status, answer_headers, answer) = server.post(path, &body, sent.clone()).await;
            // A page's request is refused for where it comes from; a reset
            // for its missing token; any other body for not being JSON.
            let want = match (marked, path) {
                (true, _) => 403,
                (false, "/v1/reset") => 401,
                (false, _) => 415,
            };
            assert_eq!(status, want, "{page}: {path} {body} answered {answer}");
            assert_eq!(
                answer_headers["content-type"], "application/problem+json",
                "{page}: {path}"
            );
            assert_eq!(answer["status"], want, "{page}: {path}");
        }
    }

    // Nothing changed: the victim's messages, the name the attacker would
    // have brought, the victim's lease and slots, the rule's key.
    assert_messages(&server, "victim", 6.0, "the attacks").await;
    assert_eq!(server.value("stolen", "victim").await.0, 404);
    let release = json!({"limit": "uploads", "key": "victim", "lease": lease});
    assert_eq!(
        server.call("/v1/release", &release, None).await,
        (200, json!({"released": true}))
    );
    let take = json!({"limit": "uploads", "key": "victim"});
    for _ in 0..2 {
        assert_eq!(server.call("/v1/acquire", &take, None).await.0, 200);
    }
    let event = |ip: &str| json!({"ip": ip, "path": "/"});
    let (_, fresh) = server.call("/v1/enforce", &event("192.0.2.67"), None).await;
    let (_, attacked) = server.call("/v1/enforce", &event("192.0.2.66"), None).await;
    assert_eq!(attacked["remaining"], fresh["remaining"], "{attacked}");
}

/// Services call the API with no `Origin`, often through a load balancer
/// that addresses it by name; curl sends JSON with a charset or in capitals;
/// a page the server itself serves, opened by address, is its own origin;
/// and a caller with a token is known whatever its headers say.
#[tokio::test]
async fn services_curl_and_the_servers_own_pages_are_not_taken_for_a_foreign_page() {
    let server = Server::start(&[("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)]).await;
    let own = format!("http://{}", server.authority);
    let admin = format!("Bearer {ADMIN_TOKEN}");
    let callers: [(&str, Vec<(&str, &str)>); 6] = [
        (
            "a service, through a load balancer that uses a name",
            vec![
                ("content-type", "application/json"),
                ("host", "sluice.internal"),
            ],
        ),
        (
            "curl --json",
            vec![
                ("content-type", "application/json"),
                ("accept", "application/json"),
            ],
        ),
        (
            "a charset",
            vec![("content-type", "application/json; charset=utf-8")],
        ),
        ("capitals", vec![("content-type", "Application/JSON")]),
        (
            "the server's own page, opened by address",
            vec![
                ("content-type", "application/json"),
                ("origin", own.as_str()),
                ("sec-fetch-site", "same-origin"),
            ],
        ),
        (
            "a page's request that carries the admin token",
            vec![
                ("content-type", "application/json"),
                ("origin", "https://elsewhere.example"),
                ("sec-fetch-site", "cross-site"),
                ("authorization", admin.as_str()),
            ],
        ),
    ];
    for (n, (caller, sent)) in callers.iter().enumerate() {
        let (status, _, answer) = server.post("/v1/limit", &spend(1), headers(sent)).await;
        assert_eq!(status, 200, "{caller}: {answer}");
        assert_messages(&server, "victim", 9.0 - n as f64, caller).await;
    }
    // Someone who types the address of a read into a browser.
    let typed = server
        .client
        .get(format!(
            "{}/v1/value?limit=messages&key=victim",
            server.base
        ))
        .header("sec-fetch-site", "none")
        .send()
        .await
        .unwrap();
    assert_eq!(typed.status(), 200);
}

/// With an API token, `force`, `reserve`, a limit brought inline and
/// `/v1/refund` need it (or the admin token) as a bearer token: without,
/// with a wrong one, or with it in any other form, they are a 401 that
/// changes nothing. The calls that only spend what a key holds need none.
/// The token is set through the environment, as a container sets it.
#[tokio::test]
async fn with_an_api_token_privileged_calls_need_it_and_one_without_changes_nothing() {
    let server = Server::start(&[
        ("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN),
        ("SLUICE_API_TOKEN", API_TOKEN),
    ])
    .await;
    assert_eq!(server.call("/v1/limit", &spend(4), None).await.0, 200);
    // In the order that lets each be made on a fresh key: a reservation
    // that the key can still pay, then a refund, then the lockout.
    let privileged = |key: &str| {
        let inline = |limit: &str| {
            json!({"limit": limit, "key": key, "algorithm": "token_bucket",
                "algorithm_config": {"rate": 1, "period": "3650d"}})
        };
        [
            (
                "/v1/limit",
                json!({"limit": "messages", "key": key, "count": 6, "reserve": true}),
            ),
            ("/v1/limit", inline("brought")),
            ("/v1/check", inline("asked")),
            (
                "/v1/refund",
                json!({"limit": "messages", "key": key, "count": 4}),
            ),
            (
                "/v1/limit",
                json!({"limit": "messages", "key": key, "count": 9_007_199_254_740_992_u64, "force": true}),
            ),
        ]
    };
    let basic = format!("Basic {}", base64_of(&format!("anyone:{API_TOKEN}")));
    for (path, body) in &privileged("victim") {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some(API_TOKEN),
            Some(basic.as_str()),
        ] {
            let mut sent = headers(&[("content-type", "application/json")]);
            if let Some(auth) = auth {
                sent.insert("authorization", HeaderValue::from_str(auth).unwrap());
            }
            let (status, answer_headers, answer) = server.post(path, body, sent).await;
            assert_eq!(status, 401, "{path} {body} with {auth:?}: {answer}");
            assert_eq!(answer_headers["www-authenticate"], "Bearer", "{path}");
            assert_eq!(answer_headers["content-type"], "application/problem+json");
        }
    }
    assert_messages(&server, "victim", 6.0, "the refused calls").await;
    for limit in ["brought", "asked"] {
        assert_eq!(server.value(limit, "victim").await.0, 404, "{limit}");
    }

    // With the API token, or the admin token, each is made.
    let api = format!("Bearer {API_TOKEN}");
    let admin = format!("Bearer {ADMIN_TOKEN}");
    for (key, auth) in [("api", &api), ("admin", &admin)] {
        for (path, body) in &privileged(key) {
            let (status, answer) = server.call(path, body, Some(auth)).await;
            assert_eq!(status, 200, "{path} {body}: {answer}");
        }
        assert_messages(&server, key, -1.0, "the lockout, a year's refill deep").await;
    }
    assert_eq!(server.value("brought", "api").await.0, 200);

    // What only spends what a key holds, or asks, needs no token.
    let lease = server.take_upload().await;
    let free = [
        ("/v1/limit", json!({"limit": "messages", "key": "other"})),
        (
            "/v1/check",
            json!({"limit": "messages", "key": "other", "count": 2, "reserve": true}),
        ),
        ("/v1/check", json!({"limit": "brought", "key": "other"})),
        (
            "/v1/release",
            json!({"limit": "uploads", "key": "victim", "lease": lease}),
        ),
        ("/v1/enforce", json!({"ip": "192.0.2.1"})),
    ];
    for (path, body) in free {
        let (status, answer) = server.call(path, &body, None).await;
        assert_eq!(status, 200, "{path} {body}: {answer}");
    }
}

/// Without an API token the privileged calls are open to any caller who
/// reaches the API, as before the token existed; the server says so once
/// when it starts, and says nothing of it when it has one.
#[cfg(unix)]
#[tokio::test]
async fn without_an_api_token_the_server_says_at_start_that_privileged_calls_are_open() {
    let (_dir, path) = policy_file(POLICY);
    let logs = async |env: &[(&str, &str)]| {
        let (args, http, _) = serve_args(&path);
        let mut command = sluice();
        command
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped());
        let mut server = Process(command.spawn().unwrap());
        let client = reqwest::Client::new();
        eventually(PATIENCE, "the server to start", async || {
            let r = client.get(format!("http://{http}/readyz")).send().await;
            r.is_ok_and(|r| r.status() == 200)
        })
        .await;
        server.terminate(PATIENCE).await;
        let mut text = String::new();
        server
            .0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text
    };
    let open = logs(&[]).await;
    let said = open.lines().filter(|l| l.contains("--api-token")).count();
    assert_eq!(said, 1, "{open}");
    assert!(open.contains("WARN"), "{open}");
    let closed = logs(&[("SLUICE_API_TOKEN", API_TOKEN)]).await;
    assert!(!closed.contains("--api-token"), "{closed}");
    assert!(
        !closed.contains(API_TOKEN),
        "the token is never logged: {closed}"
    );
}

/// `text` in standard base64, as HTTP basic authentication writes it.
fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}
