//! `sluice proxy` with real sockets: a real upstream (axum) that records
//! what reaches it, the proxy in process on a port-0 listener, a real HTTP
//! client (reqwest, or raw TCP where a client library would tidy up the
//! very headers under test), and once the real binary. The upstream and
//! the proxy's setup live in `support::upstream` and `support::proxy`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::proxy::{
    GENEROUS, Proxy, Raw, THREE, header, noise, pair, spawn_proxy, start_proxy, start_proxy_to,
};
use support::upstream::{one_request_upstream, start_upstream};
use support::{PATIENCE, eventually, get_json, get_text, policy_file};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use sluice_server::proxy::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// The problem document of a response that must be one, with `status`.
async fn problem(res: reqwest::Response, status: u16) -> Value {
    assert_eq!(res.status(), status);
    assert_eq!(header(&res, "content-type"), "application/problem+json");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["status"], status, "{body}");
    body
}

#[tokio::test]
async fn admitted_requests_reach_the_upstream_intact_with_rate_limit_headers() {
    let (up, seen) = start_upstream().await;
    let p = start_proxy(THREE, &format!("http://{up}"), PATIENCE).await;
    let client = reqwest::Client::new();
    let res = client
        .put(p.url("/v1/items/7?tenant=acme&tag=a&tag=b"))
        .header("host", "api.example.test")
        .header("x-api-key", "k1")
        .header("x-multi", "one")
        .header("x-forwarded-for", "203.0.113.5")
        .header("x-forwarded-proto", "https")
        .header("authorization", "Bearer t0ken")
        .body("the body")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // The upstream's own headers come back, plus the limiter's.
    assert_eq!(header(&res, "content-type"), "application/json");
    assert_eq!(header(&res, "ratelimit-policy"), r#""per-ip";q=3;w=10800"#);
    assert!(
        header(&res, "ratelimit").starts_with(r#""per-ip";r=2;t="#),
        "{res:?}"
    );
    assert_eq!(header(&res, "x-ratelimit-limit"), "3");
    assert_eq!(header(&res, "x-ratelimit-remaining"), "2");
    assert!(res.headers().get("retry-after").is_none());

    let got: Value = res.json().await.unwrap();
    assert_eq!(got["method"], "PUT");
    assert_eq!(got["path"], "/v1/items/7");
    assert_eq!(got["query"], "tenant=acme&tag=a&tag=b");
    assert_eq!(got["body"], "the body");
    assert_eq!(got["version"], "HTTP/1.1");
    let h = &got["headers"];
    assert_eq!(h["host"], json!(["api.example.test"]));
    assert_eq!(h["x-api-key"], json!(["k1"]));
    assert_eq!(h["authorization"], json!(["Bearer t0ken"]));
    assert_eq!(h["content-length"], json!(["8"]));
    assert_eq!(h["x-forwarded-for"], json!(["203.0.113.5, 127.0.0.1"]));
    assert_eq!(h["x-forwarded-host"], json!(["api.example.test"]));
    // The client is no trusted proxy: it does not get to say the scheme.
    assert_eq!(h["x-forwarded-proto"], json!(["http"]));
    assert_eq!(seen.hits(), 1);

    // Under a base path, the request's path goes below it.
    let based = start_proxy(GENEROUS, &format!("http://{up}/base/"), PATIENCE).await;
    let got = get_json(&client, based.url("/v1/x?y=1")).await;
    assert_eq!(
        (&got["path"], &got["query"]),
        (&json!("/base/v1/x"), &json!("y=1"))
    );
    // Without a Host of its own choosing, the client's is the proxy's
    // address, and that is what the upstream sees.
    assert_eq!(got["headers"]["host"], json!([based.addr.to_string()]));
}

#[tokio::test]
async fn http2_clients_are_forwarded_as_http1_with_their_authority_as_host() {
    let (p, _) = pair(GENEROUS).await;
    let io = TokioIo::new(TcpStream::connect(p.addr).await.unwrap());
    let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::post("http://api.example.test/h2?x=1")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .header("te", "trailers")
        .body(http_body_util::Full::new(Bytes::from_static(b"over h2")))
        .unwrap();
    let res = send.send_request(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.version(), http::Version::HTTP_2);
    assert!(res.headers().get("ratelimit").is_some());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let got: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(got["version"], "HTTP/1.1");
    assert_eq!(
        (&got["path"], &got["query"]),
        (&json!("/h2"), &json!("x=1"))
    );
    assert_eq!(got["body"], "over h2");
    let h = &got["headers"];
    assert_eq!(h["host"], json!(["api.example.test"]));
    assert_eq!(h["x-forwarded-host"], json!(["api.example.test"]));
    // HTTP/1.1 allows one Cookie field.
    assert_eq!(h["cookie"], json!(["a=1; b=2"]));
    assert!(h.get("te").is_none());
}

#[tokio::test]
async fn denied_requests_get_a_429_problem_and_never_reach_the_upstream() {
    let (p, seen) = pair(THREE).await;
    let client = reqwest::Client::new();
    for remaining in (0..3).rev() {
        let res = client.get(p.url("/a")).send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(header(&res, "x-ratelimit-remaining"), remaining.to_string());
    }
    for _ in 0..2 {
        let res = client.post(p.url("/a")).body("x").send().await.unwrap();
        let retry: u64 = header(&res, "retry-after").parse().unwrap();
        // One token an hour: the wait is most of an hour, plus jitter.
        assert!((3000..=5400).contains(&retry), "retry-after {retry}");
        assert_eq!(header(&res, "x-ratelimit-remaining"), "0");
        assert!(header(&res, "ratelimit").starts_with(r#""per-ip";r=0;"#));
        let body = problem(res, 429).await;
        assert_eq!(body["rule"], "per-ip");
    }
    assert_eq!(
        seen.hits(),
        3,
        "denied requests must not reach the upstream"
    );
}

#[tokio::test]
async fn a_spoofed_x_forwarded_for_does_not_change_the_key() {
    let client = reqwest::Client::new();
    let (p, seen) = pair(THREE).await;
    let statuses = async |p: &Proxy| {
        let mut out = Vec::new();
        for i in 1..=4 {
            let res = client
                .get(p.url("/"))
                .header("x-forwarded-for", format!("198.51.100.{i}"))
                .header("forwarded", format!("for=198.51.100.{i}"))
                .send()
                .await
                .unwrap();
            out.push(res.status().as_u16());
        }
        out
    };
    assert_eq!(statuses(&p).await, [200, 200, 200, 429]);
    assert_eq!(seen.hits(), 3);

    // The control: when the peer is a trusted proxy, the same headers do
    // name four different clients.
    let trusted = format!("trusted_proxies: [127.0.0.1]\n{THREE}");
    let (p, seen) = pair(&trusted).await;
    assert_eq!(statuses(&p).await, [200, 200, 200, 200]);
    assert_eq!(seen.hits(), 4);
}

#[tokio::test]
async fn behind_two_proxies_a_client_cannot_pick_its_key_with_forwarded() {
    // A front proxy that trusts nobody, then the one enforcing, which trusts
    // the front (127.0.0.1, which is also where the client is). The front
    // appends the client to X-Forwarded-For and to the Forwarded the client
    // sent: the client's rotating claim is believed by neither header's
    // walk alone, since the headers disagree, and every request counts
    // under the front's address.
    let (up, seen) = start_upstream().await;
    let back = start_proxy(
        &format!("trusted_proxies: [127.0.0.1]\n{THREE}"),
        &format!("http://{up}"),
        PATIENCE,
    )
    .await;
    let front = start_proxy(GENEROUS, &format!("http://{}", back.addr), PATIENCE).await;
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    let mut last = Value::Null;
    for i in 1..=4 {
        let res = client
            .get(front.url("/"))
            .header("forwarded", format!("for=198.51.100.{i}"))
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
        if res.status() == 200 {
            last = res.json().await.unwrap();
        }
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(seen.hits(), 3);
    let h = &last["headers"];
    assert_eq!(
        h["forwarded"],
        json!(["for=198.51.100.3", "for=127.0.0.1", "for=127.0.0.1"]),
        "{h}"
    );
    assert_eq!(h["x-forwarded-for"], json!(["127.0.0.1, 127.0.0.1"]), "{h}");
}

#[tokio::test]
async fn an_absolute_form_target_is_the_host_the_rules_see_and_the_upstream_gets() {
    let policy = "
rules:
  - name: api-host
    match: {host: api.example.com}
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 3600, burst: 1}
";
    let (p, _) = pair(policy).await;
    let mut raw = Raw::connect(p.addr).await;
    // The target names the host; Host, which a server must then ignore,
    // names another.
    let mut statuses = Vec::new();
    for target in ["http://api.example.com/x", "http://API.example.com./x"] {
        raw.send(format!("GET {target} HTTP/1.1\r\nHost: other.example\r\n\r\n").as_bytes())
            .await;
        let (status, _, body) = raw.response().await;
        statuses.push(status);
        if status == 200 {
            let got: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(got["headers"]["host"], json!(["api.example.com"]));
        }
    }
    assert_eq!(statuses, [200, 429]);
    // And the other way round: the rule's host in Host, another in the
    // target. The rule does not apply, and the upstream is told the
    // target's host, not the one the rule was written for.
    raw.send(b"GET http://other.example/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
        .await;
    let (status, _, body) = raw.response().await;
    assert_eq!(status, 200);
    let got: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(got["headers"]["host"], json!(["other.example"]));
}

#[tokio::test]
async fn large_bodies_pass_both_ways_intact() {
    let (p, seen) = pair(GENEROUS).await;
    let sent = noise(8 << 20);
    let res = reqwest::Client::new()
        .post(p.url("/mirror"))
        .body(sent.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("ratelimit").is_some());
    let got = res.bytes().await.unwrap();
    assert_eq!(got.len(), sent.len());
    assert!(got == sent, "the body came back altered");
    assert_eq!(seen.hits(), 1);
}

#[tokio::test]
async fn bodies_are_streamed_not_buffered() {
    let (p, seen) = pair(GENEROUS).await;

    // Upload: the upstream has the first chunk while the client still
    // holds back the rest, so the proxy cannot be waiting for the whole.
    let (tx, first) = oneshot::channel();
    *seen.first_chunk.lock().unwrap() = Some(tx);
    let mut raw = Raw::connect(p.addr).await;
    raw.send(
        b"POST /stream-in HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    )
    .await;
    let first = tokio::time::timeout(PATIENCE, first)
        .await
        .expect("the first chunk to reach the upstream before the body ends")
        .unwrap();
    assert_eq!(first, "hello");
    raw.send(b"6\r\n world\r\n0\r\n\r\n").await;
    let (status, _, body) = raw.response().await;
    assert_eq!((status, body.as_slice()), (200, &b"hello world"[..]));

    // Download: the client has the first chunk while the upstream still
    // holds back the rest.
    let (tx, rx) = mpsc::channel(1);
    *seen.stream_out.lock().unwrap() = Some(rx);
    let mut res = reqwest::get(p.url("/stream-out")).await.unwrap();
    assert_eq!(res.status(), 200);
    tx.send(Bytes::from_static(b"first")).await.unwrap();
    let chunk = tokio::time::timeout(PATIENCE, res.chunk())
        .await
        .expect("the first chunk to reach the client before the body ends")
        .unwrap()
        .unwrap();
    assert_eq!(chunk, "first");
    tx.send(Bytes::from_static(b" and the rest")).await.unwrap();
    drop(tx);
    let mut rest = Vec::new();
    while let Some(c) = res.chunk().await.unwrap() {
        rest.extend_from_slice(&c);
    }
    assert_eq!(rest, b" and the rest");
}

#[tokio::test]
async fn upstream_connections_are_pooled_and_reused() {
    let (p, seen) = pair(GENEROUS).await;
    let client = reqwest::Client::new();
    for i in 0..20 {
        let res = client
            .post(p.url(&format!("/n/{i}")))
            .body(format!("request {i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let got: Value = res.json().await.unwrap();
        assert_eq!(got["body"], format!("request {i}"));
    }
    assert_eq!(seen.hits(), 20);
    // Sequential requests need one connection; allow for one the upstream
    // might have closed in between.
    assert!(
        seen.ports() <= 2,
        "{} upstream connections for 20 sequential requests",
        seen.ports()
    );
}

#[tokio::test]
async fn a_request_without_host_gets_the_upstreams() {
    let (up, _) = start_upstream().await;
    let p = start_proxy(GENEROUS, &format!("http://{up}"), PATIENCE).await;
    let mut raw = Raw::connect(p.addr).await;
    // HTTP/1.0 does not require Host; the HTTP/1.1 upstream does.
    raw.send(b"GET /x HTTP/1.0\r\n\r\n").await;
    let (status, _, body) = raw.response().await;
    assert_eq!(status, 200);
    let got: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(got["headers"]["host"], json!([up.to_string()]));
    assert_eq!(got["version"], "HTTP/1.1");
}

#[tokio::test]
async fn a_closed_client_connection_leaves_its_upstream_connection_to_the_next() {
    let (p, seen) = pair(GENEROUS).await;
    for i in 0..5 {
        // A client connection per request, each closed by the client.
        let mut raw = Raw::connect(p.addr).await;
        raw.send(
            format!("GET /n/{i} HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        let (status, _, _) = raw.response().await;
        assert_eq!(status, 200);
    }
    assert_eq!(seen.hits(), 5);
    assert!(
        seen.ports() <= 2,
        "{} upstream connections for 5 client connections one after another",
        seen.ports()
    );
}

#[tokio::test]
async fn an_upstream_connection_closed_while_idle_is_replaced_not_a_502() {
    let (closed_tx, mut closed) = mpsc::unbounded_channel();
    let up = one_request_upstream(closed_tx).await;
    let p = start_proxy(GENEROUS, &format!("http://{up}"), PATIENCE).await;
    let mut raw = Raw::connect(p.addr).await;
    for _ in 0..3 {
        raw.send(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").await;
        let (status, _, body) = raw.response().await;
        assert_eq!(status, 200);
        assert_eq!(body, b"once");
        // The upstream has closed the connection the proxy keeps for this
        // client before the client's next request.
        closed.recv().await.unwrap();
    }
}

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_both_ways_and_clients_are_kept_alive() {
    let (p, seen) = pair(GENEROUS).await;
    let mut raw = Raw::connect(p.addr).await;
    // Two requests on one client connection: the proxy keeps it open.
    for i in 0..2 {
        let req = format!(
            "POST /hop-in HTTP/1.1\r\nHost: api.example.test\r\n\
             Connection: keep-alive, X-Secret\r\nConnection: x-other\r\n\
             X-Secret: s\r\nX-Other: o\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n\
             Trailer: x-sum\r\nProxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\n\
             Proxy: http://evil.example\r\nUpgrade: websocket\r\nX-Kept: {i}\r\n\
             Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        );
        raw.send(req.as_bytes()).await;
        let (status, headers, body) = raw.response().await;
        assert_eq!(status, 200);
        assert!(headers.iter().any(|(n, _)| n == "ratelimit"), "{headers:?}");
        let got: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(got["body"], "abc");
        let names: Vec<&str> = got["headers"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        for gone in [
            "x-secret",
            "x-other",
            "keep-alive",
            "te",
            "trailer",
            "proxy-authorization",
            "proxy-connection",
            "proxy",
            "upgrade",
            "connection",
        ] {
            assert!(
                !names.contains(&gone),
                "{gone} reached the upstream: {names:?}"
            );
        }
        // The proxy frames the body its own way on its own connection:
        // one `chunked`, not the client's header passed along as well.
        assert_eq!(got["headers"]["transfer-encoding"], json!(["chunked"]));
        assert_eq!(got["headers"]["x-kept"], json!([i.to_string()]));
    }
    assert_eq!(seen.hits(), 2);

    let res = reqwest::get(p.url("/hop")).await.unwrap();
    assert_eq!(res.status(), 200);
    for gone in [
        "x-secret",
        "keep-alive",
        "proxy-authenticate",
        "trailer",
        "upgrade",
    ] {
        assert!(
            res.headers().get(gone).is_none(),
            "{gone} reached the client"
        );
    }
    assert!(
        res.headers()
            .get_all("connection")
            .iter()
            .all(|v| !v.to_str().unwrap().contains("x-secret")),
        "{:?}",
        res.headers()
    );
    assert_eq!(header(&res, "x-kept"), "yes");
    assert_eq!(res.text().await.unwrap(), "hop");
}

const SWITCH: &[u8] =
    b"GET /switch HTTP/1.1\r\nHost: ws.example.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";

#[tokio::test]
async fn protocol_upgrades_are_tunnelled_and_counted_as_one_request() {
    let (p, seen) = pair(THREE).await;
    let mut tunnels = Vec::new();
    for remaining in [2, 1] {
        let mut raw = Raw::connect(p.addr).await;
        raw.send(SWITCH).await;
        let (status, headers) = raw.head().await;
        assert_eq!(status, 101, "{headers:?}");
        let has = |name: &str, value: &str| {
            headers
                .iter()
                .any(|(n, v)| n == name && v.eq_ignore_ascii_case(value))
        };
        assert!(has("upgrade", "echo"), "{headers:?}");
        assert!(has("connection", "upgrade"), "{headers:?}");
        assert!(
            has("x-ratelimit-remaining", &remaining.to_string()),
            "{headers:?}"
        );
        tunnels.push(raw);
    }
    // Both tunnels carry bytes both ways at once, and independently.
    for (i, raw) in tunnels.iter_mut().enumerate() {
        let msg = format!("frame {i} ").repeat(1000);
        raw.send(msg.as_bytes()).await;
        let mut back = vec![0; msg.len()];
        tokio::time::timeout(PATIENCE, raw.0.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, msg.as_bytes());
    }
    assert_eq!(seen.hits(), 2);

    // The third request spends the last token on a plain request; the
    // fourth, an upgrade, is refused before it reaches the upstream.
    assert_eq!(reqwest::get(p.url("/a")).await.unwrap().status(), 200);
    let mut raw = Raw::connect(p.addr).await;
    raw.send(SWITCH).await;
    let (status, headers, _) = raw.response().await;
    assert_eq!(status, 429, "{headers:?}");
    assert_eq!(seen.hits(), 3);

    // A tunnel ends when the client closes it.
    let mut raw = tunnels.pop().unwrap();
    raw.0.get_mut().shutdown().await.unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(PATIENCE, raw.0.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0, "the upstream's side closed too");
}

#[tokio::test]
async fn an_upgrade_the_upstream_refuses_is_an_ordinary_response() {
    let (p, _) = pair(GENEROUS).await;
    let mut raw = Raw::connect(p.addr).await;
    // HTTP/1.0 cannot switch protocols, so nothing is asked of the upstream.
    raw.send(b"GET /switch HTTP/1.0\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
        .await;
    let (status, headers, body) = raw.response().await;
    assert_eq!(status, 426, "{headers:?}");
    assert_eq!(body, b"ask to upgrade");
    assert!(headers.iter().all(|(n, _)| n != "upgrade"), "{headers:?}");
}

#[tokio::test]
async fn an_unreachable_or_broken_upstream_is_a_502_problem() {
    let client = reqwest::Client::new();
    // Nothing listens on a port just released.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let p = start_proxy(GENEROUS, &format!("http://127.0.0.1:{port}"), PATIENCE).await;
    let res = client.get(p.url("/x")).send().await.unwrap();
    // The limiter still had its say.
    assert!(res.headers().get("ratelimit").is_some());
    let body = problem(res, 502).await;
    assert_eq!(body["title"], "Bad Gateway");

    // An upstream that accepts and hangs up without answering.
    let rude = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rude_addr = rude.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = rude.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            drop(s);
        }
    });
    let p = start_proxy(GENEROUS, &format!("http://{rude_addr}"), PATIENCE).await;
    let res = client.get(p.url("/x")).send().await.unwrap();
    problem(res, 502).await;
}

#[tokio::test]
async fn a_slow_upstream_is_a_504_problem() {
    let (up, seen) = start_upstream().await;
    let timeout = Duration::from_millis(300);
    let p = start_proxy(GENEROUS, &format!("http://{up}"), timeout).await;
    let started = Instant::now();
    let res = reqwest::Client::new()
        .post(p.url("/slow"))
        .body("some body")
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    let body = problem(res, 504).await;
    assert_eq!(body["title"], "Gateway Timeout");
    assert!(
        took >= timeout && took < PATIENCE,
        "answered after {took:?}"
    );
    assert_eq!(seen.hits(), 1);

    // A slow upload is not a slow upstream: the clock starts when the
    // request body has been sent.
    let (tx, first) = oneshot::channel();
    *seen.first_chunk.lock().unwrap() = Some(tx);
    let mut raw = Raw::connect(p.addr).await;
    raw.send(
        b"POST /stream-in HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nslow\r\n",
    )
    .await;
    tokio::time::timeout(PATIENCE, first)
        .await
        .unwrap()
        .unwrap();
    // Not synchronisation: the client really is this slow.
    tokio::time::sleep(timeout * 2).await;
    raw.send(b"7\r\n upload\r\n0\r\n\r\n").await;
    let (status, _, body) = raw.response().await;
    assert_eq!((status, body.as_slice()), (200, &b"slow upload"[..]));
}

#[tokio::test]
async fn a_stalled_request_body_is_a_408_problem_and_breaks_off_upstream() {
    let (up, seen) = start_upstream().await;
    let stall = Duration::from_millis(300);
    let upstream = Upstream::parse(&format!("http://{up}"))
        .unwrap()
        .with_body_timeout(stall);
    let p = start_proxy_to(GENEROUS, upstream).await;

    // A client that pauses for less than the body timeout between chunks
    // is not cut off, however long the whole upload takes.
    let (tx, end) = oneshot::channel();
    *seen.body_end.lock().unwrap() = Some(tx);
    let mut raw = Raw::connect(p.addr).await;
    raw.send(b"POST /stream-in HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await;
    for chunk in ["1\r\na\r\n", "1\r\nb\r\n", "1\r\nc\r\n", "1\r\nd\r\n"] {
        raw.send(chunk.as_bytes()).await;
        // Not synchronisation: the client really is this slow.
        tokio::time::sleep(stall / 2).await;
    }
    raw.send(b"0\r\n\r\n").await;
    let (status, _, body) = raw.response().await;
    assert_eq!((status, body.as_slice()), (200, &b"abcd"[..]));
    assert_eq!(end.await.unwrap().unwrap(), &b"bcd"[..]);

    // One that stops sending gets a 408, and the upstream sees the body
    // break off rather than end: it must not take a truncated body as whole.
    let (tx, end) = oneshot::channel();
    *seen.body_end.lock().unwrap() = Some(tx);
    let mut raw = Raw::connect(p.addr).await;
    let started = Instant::now();
    raw.send(b"POST /stream-in HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nslow")
        .await;
    let (status, headers, body) = tokio::time::timeout(PATIENCE, raw.response())
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(status, 408, "{}", String::from_utf8_lossy(&body));
    assert!(headers.contains(&("content-type".into(), "application/problem+json".into())));
    let problem: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["status"], 408, "{problem}");
    assert!(took >= stall && took < PATIENCE, "answered after {took:?}");
    let upstream_saw = tokio::time::timeout(PATIENCE, end).await.unwrap().unwrap();
    assert!(
        upstream_saw.is_err(),
        "the upstream took {upstream_saw:?} as a whole body"
    );
}

#[tokio::test]
async fn stopping_lets_requests_in_flight_finish() {
    let (mut p, seen) = pair(GENEROUS).await;
    let (open, gate_rx) = oneshot::channel();
    let (arrived_tx, arrived) = oneshot::channel();
    *seen.gate.lock().unwrap() = Some(gate_rx);
    *seen.arrived.lock().unwrap() = Some(arrived_tx);
    let url = p.url("/gate");
    let in_flight = tokio::spawn(async move { reqwest::get(url).await.unwrap().text().await });
    tokio::time::timeout(PATIENCE, arrived)
        .await
        .unwrap()
        .unwrap();

    p.stop.take().unwrap().send(()).unwrap();
    // Once the proxy has stopped accepting, release the upstream.
    let deadline = Instant::now() + PATIENCE;
    while TcpStream::connect(p.addr).await.is_ok() {
        assert!(Instant::now() < deadline, "the proxy kept accepting");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !p.task.is_finished(),
        "the proxy did not wait for the request in flight"
    );
    open.send(()).unwrap();
    let body = tokio::time::timeout(PATIENCE, in_flight)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(body, "through the gate");
    tokio::time::timeout(PATIENCE, &mut p.task)
        .await
        .expect("the proxy to return once idle")
        .unwrap();
}

// ---------------------------------------------------------------------------
// The binary

#[cfg(unix)]
#[tokio::test]
async fn the_binary_proxies_reloads_its_policy_and_stops_on_sigterm() {
    proxies_reloads_and_stops(&[], None).await;
}

/// The same on tokio's single-threaded scheduler, which the proxy runs on
/// when it may use one CPU only.
#[cfg(unix)]
#[tokio::test]
async fn the_binary_on_one_thread_proxies_reloads_its_policy_and_stops_on_sigterm() {
    proxies_reloads_and_stops(
        &[("SLUICE_THREADS", "1")],
        Some(r#"sluice_runtime_workers{scheduler="current_thread"} 1"#),
    )
    .await;
}

/// Runs the proxy binary with `env`; `/metrics` must show `runtime` when
/// given, and some scheduler in any case.
#[cfg(unix)]
async fn proxies_reloads_and_stops(env: &[(&str, &str)], runtime: Option<&str>) {
    let (up, seen) = start_upstream().await;
    let (dir, path) = policy_file(THREE);
    let (mut bin, listen, admin) = spawn_proxy(up, &path, env).await;
    let client = reqwest::Client::new();
    let base = format!("http://{listen}");
    let admin = format!("http://{admin}");
    let ready = client.get(format!("{admin}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);

    let status = async |path: &str| {
        client
            .get(format!("{base}{path}"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(status("/r").await);
    }
    assert_eq!(got, [200, 200, 200, 429]);
    assert_eq!(seen.hits(), 3);

    // A new rule (so a fresh key) with room to spare, swapped in by rename.
    let next = dir.path().join("next.yaml");
    std::fs::write(
        &next,
        THREE
            .replace("per-ip", "per-ip-2")
            .replace("burst: 3", "burst: 50"),
    )
    .unwrap();
    std::fs::rename(&next, &path).unwrap();
    eventually(PATIENCE, "the reloaded policy", async || {
        status("/r").await == 200
    })
    .await;

    let metrics = get_text(&client, &format!("{admin}/metrics")).await;
    assert!(metrics.contains("sluice_decisions_total"), "{metrics}");
    assert!(
        metrics.contains("sluice_proxy_upstream_seconds"),
        "{metrics}"
    );
    assert!(metrics.contains("sluice_policy_reloads_total"), "{metrics}");
    assert!(
        metrics.contains(runtime.unwrap_or("sluice_runtime_workers{scheduler=")),
        "{metrics}"
    );

    bin.terminate(PATIENCE).await;
}

#[test]
fn the_binary_refuses_upstreams_that_are_not_plain_http() {
    let (_dir, path) = policy_file(THREE);
    for bad in ["https://example.com", "example.com:80"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["proxy", "--listen", "127.0.0.1:0", "--upstream", bad])
            .arg("--policy")
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("http://"), "{bad}: {stderr}");
    }
}

/// A concurrency rule of `max: 2` in front of a slow upstream, under 24
/// clients at once: the upstream never answers more than 2 of them at a
/// time, and the proxy holds each slot until the response body has been
/// sent, not just its head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_rule_keeps_the_upstream_to_its_max_in_flight() {
    let policy = "
rules:
  - name: two-at-once
    limit_keys: []
    algorithm: concurrency
    algorithm_config: {max: 2, lease: 1m}
";
    let (proxy, seen) = pair(policy).await;
    let client = reqwest::Client::new();
    let callers: Vec<_> = (0..24)
        .map(|_| {
            let (client, url) = (client.clone(), proxy.url("/busy"));
            tokio::spawn(async move {
                let (mut admitted, mut denied) = (0, 0);
                for _ in 0..10 {
                    let res = client.get(&url).send().await.unwrap();
                    match res.status().as_u16() {
                        200 => {
                            assert_eq!(
                                header(&res, "ratelimit-policy"),
                                r#""two-at-once";q=2;qu="concurrent-requests""#
                            );
                            assert_eq!(res.text().await.unwrap(), "working done");
                            admitted += 1;
                        }
                        429 => denied += 1,
                        other => panic!("{other}"),
                    }
                }
                (admitted, denied)
            })
        })
        .collect();
    let (mut admitted, mut denied) = (0, 0);
    for caller in callers {
        let (a, d) = caller.await.unwrap();
        admitted += a;
        denied += d;
    }
    eprintln!(
        "{admitted} admitted, {denied} denied; at most {} at the upstream at once",
        seen.most_busy()
    );
    assert_eq!(seen.most_busy(), 2, "two at once, and never three");
    assert!(
        admitted >= 2 && denied > 0,
        "{admitted} admitted, {denied} denied"
    );
}

/// One request a second per client, and up to five more held for 10 s.
#[cfg(unix)]
const SHAPED: &str = "
rules:
  - name: shaped
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1, max_reserved: 5}
    on_limit: {delay: {max: 10s}}
";

/// `--max-held` reaches the layer: with `SLUICE_MAX_HELD=1`, a second
/// request over the limit is refused while the first is held, where the
/// default cap would have held it too.
#[cfg(unix)]
#[tokio::test]
async fn the_binary_holds_requests_over_the_limit_up_to_max_held() {
    let (up, seen) = start_upstream().await;
    let (_dir, path) = policy_file(SHAPED);
    let (mut bin, listen, admin) = spawn_proxy(up, &path, &[("SLUICE_MAX_HELD", "1")]).await;
    let client = reqwest::Client::new();
    let url = format!("http://{listen}/r");
    let metrics = format!("http://{admin}/metrics");
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);

    let started = Instant::now();
    let held = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { client.get(&url).send().await.unwrap().status() }
    });
    eventually(PATIENCE, "a request held", async || {
        let text = get_text(&client, &metrics).await;
        support::metric(&text, "sluice_held_requests") == Some(1.0)
    })
    .await;
    let over = client.get(&url).send().await.unwrap();
    assert_eq!(over.status(), 429);
    assert_eq!(seen.hits(), 1, "the held request is not forwarded yet");

    assert_eq!(held.await.unwrap(), 200);
    // Due a second after the first, less what the first took to answer.
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(seen.hits(), 2);
    let text = get_text(&client, &metrics).await;
    assert_eq!(
        support::metric(&text, "sluice_held_over_cap_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        support::metric(&text, "sluice_held_requests"),
        Some(0.0),
        "{text}"
    );
    bin.terminate(PATIENCE).await;
}
