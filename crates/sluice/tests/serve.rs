//! `sluice serve`: the decision API through `app().oneshot`, then the real
//! binary on a real port, with a real HTTP client, through a policy reload.
//! Both are set up in `support::serve`.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use sluice_http::Enforcer;
use sluice_policy::Policy;
use sluice_server::listen::{Limits, Listener};
use sluice_server::serve::{AnyStore, MAX_BODY, ServerState};
use support::serve::{
    POLICY, call, check_send_message, get, in_pieces, spawn_serve, state, state_of,
};
#[cfg(unix)]
use support::signal;
use support::{
    Process as Server, eventually, free_port, get_json, get_text, metric, policy_file, sluice,
};

#[tokio::test]
async fn named_limits_consume_check_reserve_reset_and_read() {
    let s = state(Some("s3cret"));
    let body = |count: f64, reserve: bool| {
        serde_json::json!({"limit": "sendMessage", "key": "u1", "count": count, "reserve": reserve})
            .to_string()
    };
    let (st, _, j) = call(&s, "POST", "/v1/limit", body(2.0, false), None).await;
    assert_eq!(
        (st, &j["allowed"], &j["remaining"]),
        (200, &true.into(), &0.into())
    );
    assert_eq!(j["limit"], 2);
    // A check reports the denial without consuming.
    let (st, _, j) = call(&s, "POST", "/v1/check", body(1.0, false), None).await;
    assert_eq!((st, &j["allowed"]), (429, &false.into()));
    assert_eq!(j["retry_after"], 6.0);
    // A reservation is allowed with the wait to honour.
    let (st, _, j) = call(&s, "POST", "/v1/limit", body(3.0, true), None).await;
    assert_eq!((st, &j["allowed"]), (200, &true.into()));
    assert_eq!(j["retry_after"], 18.0);
    let (st, _, j) = get(&s, "/v1/value?limit=sendMessage&key=u1").await;
    assert_eq!(st, 200);
    assert!(j["tokens"].as_f64().unwrap() < -2.9);
    let reset = serde_json::json!({"limit": "sendMessage", "key": "u1"}).to_string();
    let (st, _, _) = call(&s, "POST", "/v1/reset", reset, Some("Bearer s3cret")).await;
    assert_eq!(st, 200);
    let (st, _, j) = get(&s, "/v1/value?limit=sendMessage&key=u1").await;
    assert_eq!((st, &j["tokens"]), (200, &2.0.into()));
}

#[tokio::test]
async fn a_sliding_log_limit_counts_every_call_in_its_window_and_refuses_reservations() {
    let s = state_of(
        "limits: {chat: {algorithm: sliding_log, algorithm_config: {rate: 3, period: 1m}}}",
        None,
    );
    let body = |count: f64, reserve: bool| {
        serde_json::json!({"limit": "chat", "key": "room", "count": count, "reserve": reserve})
            .to_string()
    };
    let (st, _, j) = call(&s, "POST", "/v1/limit", body(2.0, false), None).await;
    assert_eq!(
        (st, &j["remaining"], &j["reset"]),
        (200, &1.into(), &60.0.into())
    );
    let (st, _, j) = call(&s, "POST", "/v1/limit", body(2.0, false), None).await;
    // Denied until the two logged calls leave the window, a minute on.
    assert_eq!(
        (st, &j["allowed"], &j["retry_after"]),
        (429, &false.into(), &60.0.into())
    );
    let (st, ctype, j) = call(&s, "POST", "/v1/limit", body(1.0, true), None).await;
    assert_eq!((st, ctype.as_str()), (422, "application/problem+json"));
    assert!(j["detail"].as_str().unwrap().contains("reserv"), "{j}");
    let (st, _, j) = get(&s, "/v1/value?limit=chat&key=room").await;
    assert_eq!((st, &j["tokens"]), (200, &1.0.into()));
}

/// The LLM gateway's round: reserve the estimate, then settle the real
/// cost, by a refund when it was less and a forced charge when it was more.
#[tokio::test]
async fn a_call_settles_its_real_cost_by_refund_or_forced_charge() {
    let s = state_of(
        "limits:\n  llm:\n    algorithm: token_bucket\n    algorithm_config: {rate: 1000, period: 1m}\n",
        None,
    );
    let post = |uri: &'static str, body: serde_json::Value| {
        let s = Arc::clone(&s);
        async move { call(&s, "POST", uri, body.to_string(), None).await }
    };
    let tokens = || async { get(&s, "/v1/value?limit=llm&key=team").await.2["tokens"].clone() };
    let (status, _, d) = post(
        "/v1/limit",
        serde_json::json!({"limit": "llm", "key": "team", "count": 1000}),
    )
    .await;
    assert_eq!((status, d["remaining"].as_u64()), (200, Some(0)));
    let (status, _, d) = post(
        "/v1/refund",
        serde_json::json!({"limit": "llm", "key": "team", "count": 600}),
    )
    .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(
        d,
        serde_json::json!({"allowed": true, "limit": 1000, "remaining": 600, "retry_after": null, "reset": 24.0})
    );
    assert_eq!(tokens().await, 600.0);
    // Never above the capacity.
    let (_, _, d) = post(
        "/v1/refund",
        serde_json::json!({"limit": "llm", "key": "team", "count": 1e6}),
    )
    .await;
    assert_eq!(d["remaining"], 1000);
    // A call that cost more than the key held goes into debt...
    let (status, _, d) = post(
        "/v1/limit",
        serde_json::json!({"limit": "llm", "key": "team", "count": 1300, "force": true}),
    )
    .await;
    assert_eq!(
        (status, d["allowed"].as_bool(), d["remaining"].as_u64()),
        (200, Some(true), Some(0))
    );
    assert_eq!(tokens().await, -300.0);
    // ...and later calls wait for it to be repaid: 301 tokens at 1000 a minute.
    let (status, _, d) = post(
        "/v1/limit",
        serde_json::json!({"limit": "llm", "key": "team"}),
    )
    .await;
    assert_eq!((status, d["retry_after"].as_f64()), (429, Some(18.06)));

    for (uri, body, want) in [
        (
            "/v1/check",
            serde_json::json!({"limit": "llm", "key": "team", "force": true}),
            422,
        ),
        (
            "/v1/limit",
            serde_json::json!({"limit": "llm", "key": "team", "force": true, "reserve": true}),
            422,
        ),
        (
            "/v1/limit",
            serde_json::json!({"limit": "llm", "key": "team", "force": true, "count": 1e300}),
            422,
        ),
        (
            "/v1/refund",
            serde_json::json!({"limit": "llm", "key": "team", "count": -1}),
            400,
        ),
        (
            "/v1/refund",
            serde_json::json!({"limit": "llm", "key": "team", "count": 1e300}),
            422,
        ),
        // One past 2^53, which a double would round into range.
        (
            "/v1/refund",
            serde_json::json!({"limit": "llm", "key": "team", "count": 9_007_199_254_740_993_u64}),
            422,
        ),
        (
            "/v1/limit",
            serde_json::json!({"limit": "llm", "key": "team", "force": true, "count": 9_007_199_254_740_993_u64}),
            422,
        ),
        (
            "/v1/refund",
            serde_json::json!({"limit": "llm", "key": "team"}),
            400,
        ),
        (
            "/v1/refund",
            serde_json::json!({"limit": "nope", "key": "team", "count": 1}),
            404,
        ),
    ] {
        let (status, ctype, d) = post(uri, body.clone()).await;
        assert_eq!(status, want, "{uri} {body}: {d}");
        assert_eq!(ctype, "application/problem+json", "{uri} {body}");
    }
    // None of those changed anything.
    assert_eq!(tokens().await, -300.0);
}

/// A concurrency limit through the API: slots taken with leases, given
/// back by releasing them, each release answered once.
#[tokio::test]
async fn a_concurrency_limit_hands_out_leases_and_takes_them_back() {
    let s = state_of(
        "limits:\n  uploads:\n    algorithm: concurrency\n    algorithm_config: {max: 2, lease: 30s}\n  \
         send:\n    algorithm: token_bucket\n    algorithm_config: {rps: 1}\n",
        None,
    );
    let post = |uri: &'static str, body: serde_json::Value| {
        let s = Arc::clone(&s);
        async move { call(&s, "POST", uri, body.to_string(), None).await }
    };
    let take = || {
        post(
            "/v1/acquire",
            serde_json::json!({"limit": "uploads", "key": "alice"}),
        )
    };
    let (status, _, first) = take().await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["remaining"], 1);
    assert_eq!(first["expires"], 30.0);
    let lease = first["lease"].as_str().unwrap().to_owned();
    assert!(lease.parse::<u64>().unwrap() > 0);
    let (status, _, second) = take().await;
    assert_eq!((status, second["remaining"].as_u64()), (200, Some(0)));
    let (status, _, full) = take().await;
    assert_eq!(status, 429, "{full}");
    assert_eq!(
        full,
        serde_json::json!({"allowed": false, "limit": 2, "remaining": 0, "retry_after": 30.0,
            "reset": 30.0, "lease": null, "expires": null})
    );
    // Another key has slots of its own.
    let (status, _, _) = post(
        "/v1/acquire",
        serde_json::json!({"limit": "uploads", "key": "bob"}),
    )
    .await;
    assert_eq!(status, 200);

    let release = |lease: &str| {
        post(
            "/v1/release",
            serde_json::json!({"limit": "uploads", "key": "alice", "lease": lease}),
        )
    };
    let (status, _, r) = release(&lease).await;
    assert_eq!((status, r), (200, serde_json::json!({"released": true})));
    let (status, _, r) = release(&lease).await;
    assert_eq!(
        (status, r),
        (200, serde_json::json!({"released": false})),
        "only once"
    );
    for nonsense in ["0", "abc", "-1", "99999999999999999999999"] {
        assert_eq!(
            release(nonsense).await.2,
            serde_json::json!({"released": false})
        );
    }
    assert_eq!(take().await.0, 200, "the released slot is free again");

    for (uri, body, want) in [
        (
            "/v1/limit",
            serde_json::json!({"limit": "uploads", "key": "alice"}),
            422,
        ),
        (
            "/v1/acquire",
            serde_json::json!({"limit": "send", "key": "alice"}),
            422,
        ),
        (
            "/v1/acquire",
            serde_json::json!({"limit": "uploads", "key": "alice", "count": 1.5}),
            422,
        ),
        (
            "/v1/acquire",
            serde_json::json!({"limit": "uploads", "key": "alice", "count": 3}),
            422,
        ),
        (
            "/v1/acquire",
            serde_json::json!({"limit": "nope", "key": "alice"}),
            404,
        ),
        (
            "/v1/release",
            serde_json::json!({"limit": "uploads", "key": "alice"}),
            400,
        ),
    ] {
        let (status, ctype, d) = post(uri, body.clone()).await;
        assert_eq!(status, want, "{uri} {body}: {d}");
        assert_eq!(ctype, "application/problem+json", "{uri} {body}");
    }
    // A check asks without taking.
    let (status, _, d) = post(
        "/v1/check",
        serde_json::json!({"limit": "uploads", "key": "alice"}),
    )
    .await;
    assert_eq!((status, d["allowed"].as_bool()), (429, Some(false)));
}

#[tokio::test]
async fn a_limit_brought_inline_decides_as_the_same_limit_in_a_policy() {
    let configs = [
        (
            "token_bucket",
            r#"{"rate": 3, "period": 60, "burst": 4, "max_reserved": 2}"#,
        ),
        ("fixed_window", r#"{"rate": 3, "period": "1m", "start": 0}"#),
        (
            "sliding_window",
            r#"{"rate": 3, "period": "1m", "start": 0}"#,
        ),
        ("sliding_log", r#"{"rate": 3, "period": "1m"}"#),
    ];
    for (algorithm, config) in configs {
        let policy =
            format!("limits: {{q: {{algorithm: {algorithm}, algorithm_config: {config}}}}}");
        let named = state_of(&policy, None);
        let inline = state_of("limits: {}", None);
        let body = |count: f64, reserve: bool, inline: bool| {
            let mut b = serde_json::json!({"limit": "q", "key": "org-7", "count": count, "reserve": reserve});
            if inline {
                b["algorithm"] = algorithm.into();
                b["algorithm_config"] = serde_json::from_str(config).unwrap();
            }
            b.to_string()
        };
        for (count, reserve) in [
            (2.0, false),
            (1.0, false),
            (1.5, false),
            (0.0, false),
            (2.0, true),
            (9.0, false),
        ] {
            let want = call(
                &named,
                "POST",
                "/v1/limit",
                body(count, reserve, false),
                None,
            )
            .await;
            let got = call(
                &inline,
                "POST",
                "/v1/limit",
                body(count, reserve, true),
                None,
            )
            .await;
            assert_eq!(
                got, want,
                "{algorithm} {config}: count {count}, reserve {reserve}"
            );
        }
        let want = get(&named, "/v1/value?limit=q&key=org-7").await;
        assert_eq!(
            get(&inline, "/v1/value?limit=q&key=org-7").await,
            want,
            "{algorithm}"
        );
    }
}

#[tokio::test]
async fn a_limit_brought_inline_is_checked_as_a_policy_file_is_and_bounded() {
    let policy = Policy::from_str(POLICY, "policy.yaml").unwrap();
    let store = AnyStore::Memory(sluice_core::MemoryStore::new());
    let s = Arc::new(ServerState {
        enforcer: Arc::new(Enforcer::new(policy, store).with_max_inline_limits(2)),
        admin_token: None,
        api_token: None,
        metrics: None,
        reload_error: arc_swap::ArcSwapOption::empty(),
        dashboard: None,
    });
    // A token bucket brought inline as `limit`, through `path`: the status
    // and the problem's detail (or the answer).
    let bring = async |path: &str, limit: &str, config: serde_json::Value| {
        let body = serde_json::json!({"limit": limit, "key": "k", "algorithm": "token_bucket", "algorithm_config": config});
        let (st, _, j) = call(&s, "POST", path, body.to_string(), None).await;
        let detail = j["detail"].as_str().unwrap_or_default().to_owned();
        (st, detail, j)
    };
    // The policy file's own message for the same entry.
    let (st, detail, _) = bring("/v1/limit", "a", serde_json::json!({"rps": 1, "burst": 0})).await;
    let file = "limits: {a: {algorithm: token_bucket, algorithm_config: {rps: 1, burst: 0}}}";
    assert_eq!(
        (st, detail),
        (422, Policy::from_str(file, "p").unwrap_err().message)
    );
    // A name of the policy's is not taken over.
    let (st, detail, _) = bring("/v1/limit", "sendMessage", serde_json::json!({"rps": 1})).await;
    assert_eq!(st, 422);
    assert!(
        detail.contains("is a limit or rule of the policy"),
        "{detail}"
    );
    // A name that could spell another limit's state in a store (a sharded
    // limit's `sendMessage:0`, an Envoy override's `rule@2/hour`) is
    // refused, as are a log too long to keep and an empty name.
    for name in ["sendMessage:0", "per-ip@2/hour", "", "a b"] {
        let (st, detail, _) = bring("/v1/limit", name, serde_json::json!({"rps": 1})).await;
        assert_eq!(st, 422, "{name:?}");
        assert!(detail.contains("an inline limit's name is"), "{detail}");
    }
    let long_log = serde_json::json!({"limit": "l", "key": "k", "algorithm": "sliding_log", "algorithm_config": {"rate": 100000, "period": "1h"}});
    let (st, _, j) = call(&s, "POST", "/v1/limit", long_log.to_string(), None).await;
    assert_eq!(st, 422);
    assert!(
        j["detail"].as_str().unwrap().contains("logs at most 1024"),
        "{j}"
    );
    // Settings without the algorithm they configure.
    let orphan = r#"{"limit": "a", "key": "k", "algorithm_config": {"rps": 1}}"#;
    assert_eq!(call(&s, "POST", "/v1/limit", orphan, None).await.0, 422);
    // Two names are kept; a third is refused, and a kept one still serves.
    for name in ["a", "b"] {
        let five = serde_json::json!({"rps": 1, "burst": 5});
        assert_eq!(bring("/v1/limit", name, five).await.0, 200, "{name}");
    }
    let (st, detail, _) = bring("/v1/limit", "c", serde_json::json!({"rps": 1})).await;
    assert_eq!(st, 422);
    assert!(
        detail.contains("already keeps 2 inline limit names"),
        "{detail}"
    );
    // A kept name given a smaller burst keeps its key's state, capped: four
    // tokens left of five, now at most two, so a check of one leaves one.
    let (st, _, j) = bring("/v1/check", "a", serde_json::json!({"rps": 1, "burst": 2})).await;
    assert_eq!(
        (st, &j["remaining"], &j["limit"]),
        (200, &1.into(), &2.into())
    );
    let (st, _, j) = get(&s, "/v1/value?limit=a&key=k").await;
    assert_eq!((st, &j["tokens"]), (200, &2.0.into()));
}

#[tokio::test]
async fn reset_without_the_admin_token_is_refused_and_changes_nothing_and_the_scheme_is_any_case() {
    let s = state(Some("s3cret"));
    let spend = serde_json::json!({"limit": "sendMessage", "key": "u1", "count": 2}).to_string();
    call(&s, "POST", "/v1/limit", spend, None).await;
    let reset = serde_json::json!({"limit": "sendMessage", "key": "u1"}).to_string();
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("s3cret"),
        Some("Bearer s3cre"),
    ] {
        let (st, ctype, j) = call(&s, "POST", "/v1/reset", reset.clone(), auth).await;
        assert_eq!(st, 401, "{auth:?}");
        assert_eq!(ctype, "application/problem+json");
        assert_eq!(j["status"], 401);
    }
    let (_, _, j) = get(&s, "/v1/value?limit=sendMessage&key=u1").await;
    assert_eq!(j["tokens"], 0.0);
    // The scheme is case-insensitive (RFC 9110 §11.1); the token is not.
    for auth in ["bearer s3cret", "BEARER  s3cret"] {
        let (st, _, _) = call(&s, "POST", "/v1/reset", reset.clone(), Some(auth)).await;
        assert_eq!(st, 200, "{auth}");
    }
    let (st, _, _) = call(
        &s,
        "POST",
        "/v1/reset",
        reset.clone(),
        Some("bearer S3CRET"),
    )
    .await;
    assert_eq!(st, 401);
    // With no token configured, admin endpoints are off altogether.
    let off = state(None);
    let (st, _, _) = call(&off, "POST", "/v1/reset", reset, Some("Bearer ")).await;
    assert_eq!(st, 401);
}

#[tokio::test]
async fn bad_input_gets_a_4xx_problem() {
    let s = state(None);
    let cases: Vec<(&str, String, u16)> = vec![
        ("/v1/limit", "{not json".into(), 400),
        ("/v1/limit", r#"{"limit": "sendMessage"}"#.into(), 400),
        ("/v1/limit", r#"{"limit": "nope", "key": "k"}"#.into(), 404),
        (
            "/v1/limit",
            r#"{"limit": "sendMessage", "key": "k", "count": -1}"#.into(),
            400,
        ),
        (
            "/v1/limit",
            r#"{"limit": "sendMessage", "key": "k", "count": 1e999}"#.into(),
            400,
        ),
        (
            "/v1/limit",
            r#"{"limit": "sendMessage", "key": "k", "count": "3"}"#.into(),
            400,
        ),
        (
            "/v1/limit",
            r#"{"limit": "sendMessage", "key": "k", "count": 100}"#.into(),
            422,
        ),
        (
            "/v1/limit",
            r#"{"limit": "sendMessage", "key": "k", "extra": 1}"#.into(),
            400,
        ),
        ("/v1/limit", "x".repeat(MAX_BODY + 1), 413),
        ("/v1/enforce", r#"{"ip": "not-an-ip"}"#.into(), 400),
        ("/v1/nothing", "{}".into(), 404),
    ];
    for (uri, body, want) in cases {
        let (st, ctype, j) = call(&s, "POST", uri, body.clone(), None).await;
        let shown = &body[..body.len().min(60)];
        assert_eq!(st, want, "{uri} {shown}");
        assert_eq!(ctype, "application/problem+json", "{uri} {shown}");
        assert_eq!(j["status"], want, "{uri} {shown}");
    }
    let (st, _, _) = get(&s, "/v1/value?limit=sendMessage").await;
    assert_eq!(st, 400);
    // A method an endpoint does not take is a problem too, on the decision
    // calls (answered before the router) as on the others.
    for uri in ["/v1/reset", "/v1/limit", "/v1/check"] {
        let (st, ctype, j) = call(&s, "GET", uri, Body::empty(), None).await;
        assert_eq!(
            (st, ctype.as_str()),
            (405, "application/problem+json"),
            "{uri}"
        );
        assert_eq!(j["status"], 405, "{uri}: {j}");
    }
    let (st, _, _) = call(&s, "POST", "/v1/limit/", "{}", None).await;
    assert_eq!(st, 404);
}

#[tokio::test]
async fn a_body_in_pieces_is_read_whole_and_held_to_the_limit() {
    let s = state(None);
    let call_json = br#"{"limit": "sendMessage", "key": "pieces", "count": 2}"#;
    let pieces = call_json.chunks(7).map(<[u8]>::to_vec).collect();
    let (st, _, j) = call(&s, "POST", "/v1/limit", in_pieces(pieces), None).await;
    assert_eq!((st, &j["remaining"]), (200, &0.into()), "{j}");
    // Over the limit only in total, and with no length to refuse it by.
    let chunk = vec![b' '; MAX_BODY / 4];
    for uri in ["/v1/limit", "/v1/enforce"] {
        let (st, ctype, j) = call(&s, "POST", uri, in_pieces(vec![chunk.clone(); 5]), None).await;
        assert_eq!(
            (st, ctype.as_str()),
            (413, "application/problem+json"),
            "{uri}"
        );
        assert_eq!(j["status"], 413, "{uri}: {j}");
    }
    // Exactly at the limit is still read: blanks, then the call.
    let mut exact = vec![b' '; MAX_BODY - call_json.len()];
    exact.extend_from_slice(call_json);
    let pieces = exact.chunks(MAX_BODY / 3).map(<[u8]>::to_vec).collect();
    let (st, _, j) = call(&s, "POST", "/v1/check", in_pieces(pieces), None).await;
    assert_eq!((st, &j["allowed"]), (429, &false.into()), "{j}");
}

#[tokio::test]
async fn enforce_answers_with_the_headers_the_middleware_would_set() {
    let s = state(None);
    let event = serde_json::json!({"ip": "203.0.113.9", "method": "GET", "path": "/x"}).to_string();
    let (st, _, j) = call(&s, "POST", "/v1/enforce", event.clone(), None).await;
    assert_eq!(st, 200);
    assert_eq!(j["rule"], "per-ip");
    assert_eq!(j["headers"]["ratelimit"], r#""per-ip";r=0;t=1"#);
    let (st, _, j) = call(&s, "POST", "/v1/enforce", event, None).await;
    assert_eq!(st, 429);
    assert_eq!(j["allowed"], false);
    assert_eq!(j["retry_after"], 1.0);
    assert_eq!(j["headers"]["retry-after"], "1");
    // No rule applies without an address.
    let (st, _, j) = call(&s, "POST", "/v1/enforce", "{}", None).await;
    assert_eq!((st, &j["rule"]), (200, &serde_json::Value::Null));
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stalls_mid_headers_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = Listener::new(listener, "http", &Limits::default());
    tokio::spawn(sluice_server::serve::serve(
        listener,
        state(None),
        Duration::from_secs(60),
        std::future::pending(),
    ));
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /v1/limit HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // Paused time moves on while both sides wait, so the server's deadline
    // for the rest of the headers passes without the test waiting for it.
    let started = tokio::time::Instant::now();
    let mut rest = Vec::new();
    // Closed, by a FIN (Ok) or a reset (Err): either way the read ends.
    let _ = tokio::time::timeout(Duration::from_secs(300), stream.read_to_end(&mut rest))
        .await
        .expect("the server never closed the connection");
    let waited = started.elapsed();
    assert!(
        (Duration::from_secs(30)..Duration::from_secs(31)).contains(&waited),
        "closed after {waited:?}"
    );
}

#[tokio::test]
async fn the_binary_serves_on_a_real_port_and_keeps_the_old_policy_when_a_reload_is_bad() {
    let (dir, path) = policy_file(POLICY);
    let (_server, base, _) = spawn_serve(&path).await;
    let client = reqwest::Client::new();
    let ready = || async {
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    };

    let limit = |key: &str, count: u32| {
        client
            .post(format!("{base}/v1/limit"))
            .header("content-type", "application/json")
            .body(format!(
                r#"{{"limit": "sendMessage", "key": "{key}", "count": {count}}}"#
            ))
            .send()
    };
    assert_eq!(limit("k", 2).await.unwrap().status(), 200);
    assert_eq!(limit("k", 1).await.unwrap().status(), 429);

    // An invalid policy, written in place: the old one keeps serving and
    // /readyz says why.
    std::fs::write(
        &path,
        "limits: {sendMessage: {algorithm: token_bucket, algorithm_config: {rps: -1}}}",
    )
    .unwrap();
    eventually(
        Duration::from_secs(10),
        "the bad reload to show",
        async || ready().await == Some(503),
    )
    .await;
    let why = get_json(&client, format!("{base}/readyz")).await;
    assert!(why["detail"].as_str().unwrap().contains("rps"), "{why}");
    assert_eq!(limit("k", 1).await.unwrap().status(), 429);

    // A valid one, swapped in by rename: a bigger burst takes effect.
    let next = dir.path().join("next.yaml");
    std::fs::write(
        &next,
        POLICY.replace("burst: 2, max_reserved: 5", "burst: 50"),
    )
    .unwrap();
    std::fs::rename(&next, &path).unwrap();
    eventually(Duration::from_secs(10), "the good reload", async || {
        ready().await == Some(200)
    })
    .await;
    let res = limit("fresh", 40).await.unwrap();
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["limit"], 50);

    let metrics = get_text(&client, &format!("{base}/metrics")).await;
    assert_eq!(
        metric(&metrics, "sluice_policy_store_restart_pending"),
        Some(0.0),
        "{metrics}"
    );

    // A policy naming another store: its limits take effect, the store in
    // use stays, and a gauge says a restart is pending until a policy names
    // the running store again.
    let pending = async |want: f64| {
        let text = get_text(&client, &format!("{base}/metrics")).await;
        metric(&text, "sluice_policy_store_restart_pending") == Some(want)
    };
    let elsewhere = format!(
        "store: {{kind: redis, url: \"redis://127.0.0.1:{}\"}}\n{}",
        free_port(),
        POLICY.replace("burst: 2, max_reserved: 5", "burst: 60")
    );
    std::fs::write(&path, elsewhere).unwrap();
    eventually(
        Duration::from_secs(10),
        "the store change to show",
        async || pending(1.0).await,
    )
    .await;
    assert_eq!(ready().await, Some(200));
    let res = limit("newer", 55).await.unwrap();
    assert_eq!(res.status(), 200, "the memory store answers");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        (body["limit"].as_f64(), body["remaining"].as_f64()),
        (Some(60.0), Some(5.0))
    );
    std::fs::write(&path, POLICY).unwrap();
    eventually(
        Duration::from_secs(10),
        "the pending restart to clear",
        async || pending(0.0).await,
    )
    .await;

    let metrics = get_text(&client, &format!("{base}/metrics")).await;
    assert!(
        metrics.contains("sluice_policy_reloads_total{result=\"error\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "sluice_decisions_total{rule=\"sendMessage\",outcome=\"denied\",mode=\"enforce\"} 2"
        ),
        "{metrics}"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn the_binary_reloads_on_sighup_and_configmap_swaps_answers_envoy_and_stops_on_sigterm() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    // Kubernetes mounts a ConfigMap as symlinks: policy.yaml -> ..data/policy.yaml,
    // ..data -> ..<timestamp>, and an update swaps ..data atomically.
    let envoy_rule = |burst: u32| {
        format!(
            "{POLICY}  - name: per-client\n    domain: edge\n    limit_keys: [\"descriptor:remote_address\"]\n    algorithm: token_bucket\n    algorithm_config: {{rps: 1, burst: {burst}}}\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path();
    let version = |name: &str, text: &str| {
        std::fs::create_dir(mount.join(name)).unwrap();
        std::fs::write(mount.join(name).join("policy.yaml"), text).unwrap();
    };
    version("..v1", &envoy_rule(1));
    std::os::unix::fs::symlink("..v1", mount.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/policy.yaml", mount.join("policy.yaml")).unwrap();

    let (server, base, grpc) = spawn_serve(&mount.join("policy.yaml")).await;
    let client = reqwest::Client::new();
    let metrics_url = format!("{base}/metrics");
    let metrics = || get_text(&client, &metrics_url);
    let reloads = async || {
        metric(
            &metrics().await,
            "sluice_policy_reloads_total{result=\"ok\"}",
        )
    };

    let mut envoy = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let mut ask = async |addr: &str| {
        let req = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".into(),
                    value: addr.into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        };
        envoy
            .should_rate_limit(req)
            .await
            .unwrap()
            .into_inner()
            .overall_code
    };
    // Burst 1: the second call is over (1 = OK, 2 = OVER_LIMIT).
    assert_eq!(ask("10.0.0.1").await, 1);
    assert_eq!(ask("10.0.0.1").await, 2);

    // SIGHUP reloads even when the file is unchanged.
    let before = reloads().await.unwrap_or(0.0);
    signal(&server, "HUP");
    eventually(Duration::from_secs(10), "the SIGHUP reload", async || {
        reloads().await.unwrap_or(0.0) > before
    })
    .await;

    // A ConfigMap update: a new version directory, then ..data swapped by
    // an atomic rename of a fresh symlink over it.
    version("..v2", &envoy_rule(5));
    std::os::unix::fs::symlink("..v2", mount.join("..data_tmp")).unwrap();
    std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
    // Burst 5: a fresh client's second call passes too.
    let mut fresh = 0;
    eventually(Duration::from_secs(10), "the swapped policy", async || {
        fresh += 1;
        let addr = format!("10.0.1.{fresh}");
        ask(&addr).await == 1 && ask(&addr).await == 1
    })
    .await;

    // SIGTERM: a graceful stop, with a clean exit.
    let mut server = server;
    server.terminate(Duration::from_secs(10)).await;
}

/// A reload must not trust what it reads: an emptied or truncated file
/// would drop every limit, and a key file that never ends would hold the
/// reload forever. Each is refused, the old policy keeps serving, and
/// `/readyz` says why; so is a policy file that was deleted.
#[tokio::test]
async fn a_reload_that_would_drop_every_limit_or_read_without_end_is_refused() {
    let (_dir, path) = policy_file(POLICY);
    let (_server, base, _) = spawn_serve(&path).await;
    let client = reqwest::Client::new();
    let readyz = async || -> (u16, String) {
        let r = client.get(format!("{base}/readyz")).send().await.unwrap();
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        (
            status,
            body["detail"].as_str().unwrap_or_default().to_owned(),
        )
    };
    let refused = async |text: Option<&str>, why: &str| {
        match text {
            Some(t) => std::fs::write(&path, t).unwrap(),
            None => std::fs::remove_file(&path).unwrap(),
        }
        eventually(Duration::from_secs(10), why, async || {
            let (status, detail) = readyz().await;
            status == 503 && detail.contains(why)
        })
        .await;
        // The old policy is still in force.
        let res = check_send_message(&client, &base).await;
        assert_eq!(res.status(), 200, "after {why}");
        // Back to the good policy in between, so that each case starts from
        // a successful reload.
        std::fs::write(&path, POLICY).unwrap();
        eventually(Duration::from_secs(10), "the good policy", async || {
            readyz().await.0 == 200
        })
        .await;
    };
    refused(Some(""), "no rules and no limits").await;
    refused(Some("limits:\n"), "no rules and no limits").await;
    let endless = format!("jwt:\n  keys:\n    - {{alg: RS256, pem_file: /dev/zero}}\n{POLICY}");
    refused(Some(&endless), "not a regular file").await;
    refused(None, "cannot read the policy file").await;

    // Said on purpose, an empty policy is put in force.
    std::fs::write(&path, "rules: []\n").unwrap();
    eventually(Duration::from_secs(10), "the empty policy", async || {
        let res = check_send_message(&client, &base).await;
        res.status() == 404
    })
    .await;
    assert_eq!(readyz().await.0, 200);
}

/// Named limits choose how a store failure answers, as rules do: `open`
/// lets the call through, `closed` is a 503; either way the failure is
/// counted.
#[tokio::test]
async fn a_named_limit_fails_open_or_closed_as_it_says() {
    let policy = Policy::from_str(
        r#"
on_store_error: closed
limits:
  lenient:
    algorithm: token_bucket
    algorithm_config: {rps: 1, max_reserved: 1}
    on_store_error: open
  strict:
    algorithm: token_bucket
    algorithm_config: {rps: 1, max_reserved: 1}
"#,
        "policy.yaml",
    )
    .unwrap();
    // Nothing listens there: every store call fails.
    let url = format!("redis://127.0.0.1:{}", free_port());
    let store = AnyStore::open(Some(&url), policy.store()).unwrap();
    let s = Arc::new(ServerState {
        enforcer: Arc::new(Enforcer::new(policy, store)),
        admin_token: None,
        api_token: None,
        metrics: None,
        reload_error: arc_swap::ArcSwapOption::empty(),
        dashboard: None,
    });
    let ask = |limit: &str| serde_json::json!({"limit": limit, "key": "k"}).to_string();
    let (st, _, j) = call(&s, "POST", "/v1/limit", ask("lenient"), None).await;
    assert_eq!((st, &j["allowed"]), (200, &true.into()));
    let (st, ctype, _) = call(&s, "POST", "/v1/limit", ask("strict"), None).await;
    assert_eq!((st, ctype.as_str()), (503, "application/problem+json"));
}

/// One caller must not freeze a shared key with an absurd reservation.
#[tokio::test]
async fn a_reservation_beyond_the_horizon_is_refused_and_the_key_still_serves() {
    // No max_reserved: only the one-year horizon bounds a reservation.
    let s = state_of(
        "limits: {sendMessage: {algorithm: token_bucket, algorithm_config: {rps: 1, burst: 2}}}",
        None,
    );
    let huge = serde_json::json!({"limit": "sendMessage", "key": "shared", "count": 1e300, "reserve": true});
    let (st, ctype, j) = call(&s, "POST", "/v1/limit", huge.to_string(), None).await;
    assert_eq!((st, ctype.as_str()), (422, "application/problem+json"));
    assert!(
        j["detail"].as_str().unwrap().contains("can never succeed"),
        "{j}"
    );
    let one = serde_json::json!({"limit": "sendMessage", "key": "shared"});
    let (st, _, j) = call(&s, "POST", "/v1/limit", one.to_string(), None).await;
    assert_eq!((st, &j["remaining"]), (200, &1.into()));
}

/// `/v1/enforce` takes `ip` as the peer, and applies `trusted_proxies` to
/// the headers it is given, as the middleware does to a live request.
#[tokio::test]
async fn enforce_reads_forwarding_headers_only_from_trusted_proxies() {
    let s = state_of(
        r#"
trusted_proxies: {cidrs: [10.0.0.0/8], header: x-forwarded-for}
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
"#,
        None,
    );
    let enforce = async |ip: &str, xff: &str| {
        let body = serde_json::json!({"ip": ip, "headers": {"X-Forwarded-For": xff, "Forwarded": "for=_hidden"}});
        let (st, _, _) = call(&s, "POST", "/v1/enforce", body.to_string(), None).await;
        st
    };
    // Two clients behind one proxy each get their own bucket.
    assert_eq!(enforce("10.0.0.1", "192.0.2.1").await, 200);
    assert_eq!(enforce("10.0.0.1", "192.0.2.2").await, 200);
    assert_eq!(enforce("10.0.0.1", "192.0.2.1").await, 429);
    // An untrusted peer is the client, whatever it claims.
    assert_eq!(enforce("203.0.113.5", "192.0.2.3").await, 200);
    assert_eq!(enforce("203.0.113.5", "192.0.2.4").await, 429);
}

/// A container sets flags through the environment: `SLUICE_HTTP`,
/// `SLUICE_GRPC` and `SLUICE_POLICY` do what `--http`, `--grpc` and
/// `--policy` do.
#[tokio::test]
async fn flags_can_be_set_through_the_environment() {
    let (_dir, path) = policy_file(POLICY);
    let (http, grpc) = (free_port(), free_port());
    let _server = Server(
        sluice()
            .arg("serve")
            .env("SLUICE_HTTP", format!("127.0.0.1:{http}"))
            .env("SLUICE_GRPC", format!("127.0.0.1:{grpc}"))
            .env("SLUICE_POLICY", &path)
            .spawn()
            .unwrap(),
    );
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{http}");
    eventually(
        Duration::from_secs(10),
        "serve on SLUICE_HTTP",
        async || {
            let r = client.get(format!("{base}/healthz")).send().await;
            r.is_ok_and(|r| r.status() == 200)
        },
    )
    .await;
    // The policy is the one SLUICE_POLICY names, not the bundled example.
    let res = check_send_message(&client, &base).await;
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["limit"], 2);
    assert!(std::net::TcpStream::connect(("127.0.0.1", grpc)).is_ok());
}

/// A limit brought inline is, once brought, known by its name to every
/// call: `/v1/check` found only the policy's (a 404), while `/v1/value`,
/// `/v1/reset` and `/v1/refund` found it.
#[tokio::test]
async fn a_limit_brought_inline_is_known_by_name_to_check_limit_value_and_refund() {
    let s = state_of("limits: {}", Some("s3cret"));
    let bring = serde_json::json!({"limit": "monthly", "key": "org-7", "count": 3,
        "algorithm": "fixed_window", "algorithm_config": {"rate": 10, "period": "30d", "start": 0}});
    let (status, _, d) = call(&s, "POST", "/v1/limit", bring.to_string(), None).await;
    assert_eq!((status, d["remaining"].as_u64()), (200, Some(7)), "{d}");
    let by_name = |count: u32| {
        serde_json::json!({"limit": "monthly", "key": "org-7", "count": count}).to_string()
    };
    let (status, _, d) = call(&s, "POST", "/v1/check", by_name(2), None).await;
    assert_eq!((status, d["remaining"].as_u64()), (200, Some(5)), "{d}");
    let (status, _, d) = call(&s, "POST", "/v1/limit", by_name(2), None).await;
    assert_eq!((status, d["remaining"].as_u64()), (200, Some(5)), "{d}");
    let (status, _, d) = call(&s, "POST", "/v1/refund", by_name(1), None).await;
    assert_eq!((status, d["remaining"].as_u64()), (200, Some(6)), "{d}");
    let (status, _, d) = get(&s, "/v1/value?limit=monthly&key=org-7").await;
    assert_eq!((status, &d["tokens"]), (200, &6.0.into()), "{d}");
    // A name no call has brought is still unknown.
    let nope = serde_json::json!({"limit": "yearly", "key": "org-7"}).to_string();
    assert_eq!(call(&s, "POST", "/v1/check", nope, None).await.0, 404);
}

/// `/v1/check` answers what `/v1/limit` would: `remaining` is what the key
/// would hold had the call been taken, and the key is left as it was.
#[tokio::test]
async fn a_check_reports_what_would_remain_were_the_call_taken_and_takes_nothing() {
    let s = state(None);
    let ask = serde_json::json!({"limit": "sendMessage", "key": "u1", "count": 1}).to_string();
    let (status, _, d) = call(&s, "POST", "/v1/check", ask, None).await;
    assert_eq!(
        (status, &d["limit"], &d["remaining"]),
        (200, &2.into(), &1.into())
    );
    let (_, _, v) = get(&s, "/v1/value?limit=sendMessage&key=u1").await;
    assert_eq!((&v["tokens"], &v["remaining"]), (&2.0.into(), &2.0.into()));
}

/// `/v1/enforce` takes a request event as `sluice replay` reads it: the
/// replay page's own line, `t` and all (the server decides at its own time).
#[tokio::test]
async fn enforce_takes_a_request_event_as_the_replay_docs_write_it() {
    let page = include_str!("../../../docs/replay.md");
    let event = page
        .lines()
        .find(|l| l.starts_with(r#"{"t":"#) && l.contains(r#""ip":"#))
        .expect("docs/replay.md shows a request event");
    let s = state(None);
    let (status, ctype, d) = call(&s, "POST", "/v1/enforce", event.to_owned(), None).await;
    assert_eq!(
        (status, ctype.as_str()),
        (200, "application/json"),
        "{event}: {d}"
    );
    assert_eq!(d["rule"], "per-ip", "{d}");
    // `t` is a time: a number, as replay reads it.
    let mut wrong: serde_json::Value = serde_json::from_str(event).unwrap();
    wrong["t"] = "soon".into();
    let (status, _, d) = call(&s, "POST", "/v1/enforce", wrong.to_string(), None).await;
    assert_eq!(status, 400, "{d}");
    // Nothing here learns when the request's work ends, so no slot is held
    // for a `duration`: one is refused rather than ignored.
    let mut held: serde_json::Value = serde_json::from_str(event).unwrap();
    held["duration"] = 2.5.into();
    let (status, _, d) = call(&s, "POST", "/v1/enforce", held.to_string(), None).await;
    assert_eq!(status, 400, "{d}");
    assert!(d["detail"].as_str().unwrap().contains("duration"), "{d}");
}

/// `/v1/decide`, the old name of `/v1/enforce`, still answers as it does,
/// on the same counts: clients written against it keep working.
#[tokio::test]
async fn the_old_name_of_enforce_answers_as_enforce_on_the_same_counts() {
    // A burst of one on a stopped clock: whichever name a key's first
    // request uses takes its only token, and the other name is denied.
    let s = state(None);
    for (ip, first, then) in [
        ("192.0.2.77", "/v1/enforce", "/v1/decide"),
        ("192.0.2.78", "/v1/decide", "/v1/enforce"),
    ] {
        let event = format!(r#"{{"ip": "{ip}", "path": "/"}}"#);
        let (status, _, d) = call(&s, "POST", first, event.clone(), None).await;
        assert_eq!(
            (status, &d["rule"]),
            (200, &"per-ip".into()),
            "{first}: {d}"
        );
        let (status, _, d) = call(&s, "POST", then, event, None).await;
        assert_eq!((status, &d["rule"]), (429, &"per-ip".into()), "{then}: {d}");
        assert_eq!(d["remaining"], 0, "{d}");
    }
}

/// An error names what was wrong with a call, but quotes at most a short
/// prefix of any value the client sent: a 300-digit count, a name or a
/// field of thousands of characters, come back cut, wherever they are
/// quoted (the API's own messages, the JSON parser's, the store's, the
/// query's, a decision's).
#[tokio::test]
async fn an_error_quotes_only_a_bounded_prefix_of_what_the_client_sent() {
    let s = state_of(
        "limits:\n  llm:\n    algorithm: token_bucket\n    algorithm_config: {rate: 1000, period: 1m}\n\
         rules:\n  - name: per-key\n    limit_keys: [\"header:x-key\"]\n    algorithm: token_bucket\n    \
         algorithm_config: {rps: 1, cost_source: \"header:x-cost\"}\n",
        Some("s3cret"),
    );
    let digits = format!("1{}", "0".repeat(299));
    let long = "a".repeat(5000);
    let spaced = "a ".repeat(5000);
    let cases: Vec<(&str, &str, String)> = vec![
        (
            "POST",
            "/v1/limit",
            format!(r#"{{"limit": "{long}", "key": "k"}}"#),
        ),
        (
            "POST",
            "/v1/limit",
            format!(r#"{{"limit": "{spaced}", "key": "k"}}"#),
        ),
        (
            "POST",
            "/v1/check",
            format!(r#"{{"limit": "llm", "key": "k", "{spaced}": 1}}"#),
        ),
        (
            "POST",
            "/v1/limit",
            format!(r#"{{"limit": "llm", "key": "k", "count": "{spaced}"}}"#),
        ),
        (
            "POST",
            "/v1/limit",
            format!(
                r#"{{"limit": "{long}", "key": "k", "algorithm": "token_bucket", "algorithm_config": {{"rps": 1}}}}"#
            ),
        ),
        (
            "POST",
            "/v1/limit",
            format!(r#"{{"limit": "x", "key": "k", "algorithm": "{long}"}}"#),
        ),
        (
            "POST",
            "/v1/acquire",
            format!(r#"{{"limit": "{long}", "key": "k"}}"#),
        ),
        (
            "POST",
            "/v1/reset",
            format!(r#"{{"limit": "{spaced}", "key": "k"}}"#),
        ),
        ("GET", "/v1/value", format!("limit={long}&key=k")),
        ("GET", "/v1/value", format!("limit=llm&key=k&{long}=1")),
    ];
    for (method, path, input) in cases {
        let (uri, body) = match method {
            "GET" => (format!("{path}?{input}"), String::new()),
            _ => (path.to_owned(), input.clone()),
        };
        let (status, ctype, d) = call(&s, method, &uri, body, Some("Bearer s3cret")).await;
        let shown = &input[..input.len().min(80)];
        assert!((400..500).contains(&status), "{path} {shown}: {status}");
        assert_eq!(ctype, "application/problem+json", "{path} {shown}");
        let detail = d["detail"].as_str().unwrap();
        assert!(detail.chars().count() <= 400, "{path} {shown}: {detail}");
        assert!(
            detail.contains('…'),
            "{path} {shown}: the cut is shown: {detail}"
        );
        for value in [&digits, &long, &spaced] {
            assert!(!detail.contains(&value[..80]), "{path} {shown}: {detail}");
        }
    }
    // A count, or a request's cost, refused as a number: a float's Display
    // would write it out in full, 300 digits; the error writes 1e299.
    for (path, count) in [
        (
            "/v1/limit",
            format!(r#"{{"limit": "llm", "key": "k", "count": {digits}.0}}"#),
        ),
        (
            "/v1/limit",
            format!(r#"{{"limit": "llm", "key": "k", "count": {digits}, "force": true}}"#),
        ),
        (
            "/v1/refund",
            format!(r#"{{"limit": "llm", "key": "k", "count": {digits}.5}}"#),
        ),
    ] {
        let (status, _, d) = call(&s, "POST", path, count, Some("Bearer s3cret")).await;
        assert_eq!(status, 422, "{path}: {d}");
        let detail = d["detail"].as_str().unwrap();
        assert!(
            detail.contains(" 1e299") && !detail.contains(&digits[..20]),
            "{detail}"
        );
    }
    let event = serde_json::json!({"headers": {"x-key": "k", "x-cost": format!("{digits}.0")}});
    let (status, _, d) = call(&s, "POST", "/v1/enforce", event.to_string(), None).await;
    assert_eq!(status, 400, "{d}");
    let error = d["error"].as_str().unwrap();
    assert!(
        error.contains(" 1e299") && !error.contains(&digits[..20]),
        "{error}"
    );
}
