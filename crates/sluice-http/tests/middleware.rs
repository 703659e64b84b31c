//! The layer in an axum app, driven with `oneshot` on a fake clock: the
//! headers it sets and their syntax, its 429s, shadow mode, client
//! addresses through proxies, and JWT claims. The app, its policy and
//! signed tokens are set up in `support`.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use sluice_core::{FakeClock, Nanos};
use support::{SECRET, app, far, header, req, send, three, token};

/// Checks a field value against the draft's grammar: a list of
/// `"name";key=integer` items, with exactly the given keys.
fn assert_sf_list(value: &str, keys: &[&str]) {
    for item in value.split(", ") {
        let mut params = item.split(';');
        let name = params.next().unwrap();
        assert!(
            name.len() >= 2 && name.starts_with('"') && name.ends_with('"'),
            "{value}: item name {name} is not a string"
        );
        let got: Vec<&str> = params
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap();
                assert!(
                    !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()),
                    "{value}: {k} is not a non-negative integer"
                );
                k
            })
            .collect();
        assert_eq!(got, keys, "{value}");
    }
}

#[tokio::test]
async fn allowed_and_denied_responses_carry_well_formed_headers() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    let first = send(&app, req("/ip", "192.0.2.1")).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "ratelimit-policy"), r#""per-ip";q=2;w=2"#);
    assert_eq!(header(&first, "ratelimit"), r#""per-ip";r=1;t=1"#);
    assert_eq!(header(&first, "ratelimit-limit"), "2");
    assert_eq!(header(&first, "ratelimit-remaining"), "1");
    assert_eq!(header(&first, "x-ratelimit-limit"), "2");
    assert_eq!(header(&first, "x-ratelimit-remaining"), "1");
    assert!(first.headers().get("retry-after").is_none());

    send(&app, req("/ip", "192.0.2.1")).await;
    let denied = send(&app, req("/ip", "192.0.2.1")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_sf_list(header(&denied, "ratelimit-policy"), &["q", "w"]);
    assert_sf_list(header(&denied, "ratelimit"), &["r", "t"]);
    assert_eq!(header(&denied, "ratelimit-remaining"), "0");
    // The exact wait is 1 s; jitter adds at most half of it, rounded down.
    assert_eq!(header(&denied, "retry-after"), "1");
    assert_eq!(header(&denied, "content-type"), "application/problem+json");
    let body = denied.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["rule"], "per-ip");
    assert_eq!(body["retry_after"], 1.0);

    // Another client is not affected, and a second later this one is back.
    assert_eq!(
        send(&app, req("/ip", "192.0.2.2")).await.status(),
        StatusCode::OK
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        send(&app, req("/ip", "192.0.2.1")).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_sliding_log_states_its_period_as_the_window() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    let first = send(&app, req("/sliding", "192.0.2.1")).await;
    assert_eq!(header(&first, "ratelimit-policy"), r#""sliding";q=2;w=60"#);
    // Empty again a period after the newest logged call.
    assert_eq!(header(&first, "ratelimit"), r#""sliding";r=1;t=60"#);
    clock.advance(Duration::from_secs(20));
    send(&app, req("/sliding", "192.0.2.1")).await;
    let denied = send(&app, req("/sliding", "192.0.2.1")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // The first call leaves the window 40 s from now; jitter adds at most half.
    let retry: u64 = header(&denied, "retry-after").parse().unwrap();
    assert!((40..=60).contains(&retry), "{retry}");
    assert_eq!(header(&denied, "ratelimit"), r#""sliding";r=0;t=60"#);
}

#[tokio::test]
async fn several_rules_are_one_transaction_and_the_slowest_speaks() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    let ok = send(&app, req("/both", "192.0.2.1")).await;
    assert_eq!(
        header(&ok, "ratelimit-policy"),
        r#""tight";q=1;w=10, "loose";q=5;w=1"#
    );
    // The most restrictive allowing rule fills the legacy headers.
    assert_eq!(header(&ok, "ratelimit-limit"), "1");
    let denied = send(&app, req("/both", "192.0.2.1")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = header(&denied, "retry-after").parse().unwrap();
    assert!((10..=15).contains(&retry), "retry-after {retry}");
    // The draft's problem type, naming the rule that denied and not the one
    // that would have admitted.
    let body = denied.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], sluice_http::QUOTA_EXCEEDED);
    assert_eq!(problem["violated-policies"], serde_json::json!(["tight"]));
    assert_eq!(problem["rule"], "tight");
}

#[tokio::test]
async fn retry_after_jitter_is_per_client_and_at_most_half() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    let mut seen = std::collections::HashSet::new();
    for i in 0..40 {
        let ip = format!("192.0.2.{i}");
        send(&app, req("/both", &ip)).await;
        let a = send(&app, req("/both", &ip)).await;
        let b = send(&app, req("/both", &ip)).await;
        let (a, b) = (header(&a, "retry-after"), header(&b, "retry-after"));
        assert_eq!(a, b, "the same client hears the same wait");
        let secs: u64 = a.parse().unwrap();
        assert!((10..=15).contains(&secs), "{secs}");
        seen.insert(secs);
    }
    assert!(seen.len() > 1, "jitter spreads clients: {seen:?}");
}

#[tokio::test]
async fn shadow_rules_report_but_never_deny() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    for _ in 0..5 {
        let res = send(&app, req("/shadow", "192.0.2.1")).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit").is_none());
    }
}

#[tokio::test]
async fn a_spoofed_forwarded_for_from_an_untrusted_peer_changes_nothing() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    // An attacker rotates X-Forwarded-For to get fresh buckets.
    assert_eq!(
        three(&app, |i| {
            let spoof = format!("198.51.100.{i}");
            req("/ip", "203.0.113.7")
                .header("x-forwarded-for", &spoof)
                .header("forwarded", format!("for={spoof}"))
        })
        .await,
        BURST_OF_TWO
    );
}

/// What three requests from one client get under a burst of two.
const BURST_OF_TWO: [StatusCode; 3] = [
    StatusCode::OK,
    StatusCode::OK,
    StatusCode::TOO_MANY_REQUESTS,
];

#[tokio::test]
async fn a_trusted_proxy_forwards_its_clients_addresses() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    // Behind the proxy 10.0.0.1, each client has its own bucket...
    assert_eq!(
        three(&app, |i| {
            req("/ip", "10.0.0.1").header("x-forwarded-for", format!("198.51.100.{i}, 10.0.0.2"))
        })
        .await,
        [StatusCode::OK; 3]
    );
    // ...and the client's own left-most claim does not move it.
    assert_eq!(
        three(&app, |i| {
            req("/ip", "10.0.0.1").header("x-forwarded-for", format!("1.1.1.{i}, 198.51.100.9"))
        })
        .await,
        BURST_OF_TWO
    );
}

#[tokio::test]
async fn a_client_behind_a_trusted_proxy_cannot_pick_its_key_with_the_other_header() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    // The proxy appends to X-Forwarded-For; the client rotates a Forwarded
    // of its own, which the proxy passes on untouched.
    assert_eq!(
        three(&app, |i| {
            req("/ip", "10.0.0.1")
                .header("x-forwarded-for", "198.51.100.20")
                .header("forwarded", format!("for=192.0.2.{i}"))
        })
        .await,
        BURST_OF_TWO
    );
    // A byte that is not text, ahead of the entry a proxy appended, spoils
    // only the client's own entry: the line is not dropped, so the client's
    // rotating X-Forwarded-For does not take over (the two disagree, and the
    // requests count against the proxy, 10.0.0.5).
    let forwarded = http::HeaderValue::from_bytes(b"for=\xff, for=198.51.100.30").unwrap();
    assert_eq!(
        three(&app, |i| {
            req("/ip", "10.0.0.5")
                .header("forwarded", forwarded.clone())
                .header("x-forwarded-for", format!("192.0.2.{i}"))
        })
        .await,
        BURST_OF_TWO
    );
}

#[tokio::test]
async fn only_verified_tokens_give_claims() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    let bearer = |t: &str| format!("Bearer {t}");
    let good = token(serde_json::json!({"sub": "alice", "exp": far()}), SECRET);
    let forged = token(
        serde_json::json!({"sub": "alice", "exp": far()}),
        "another-secret-another-secret-123",
    );
    let expired = token(serde_json::json!({"sub": "bob", "exp": 1_000}), SECRET);
    // alg none: a header and claims with no signature at all.
    let none = {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.",
            b64.encode(r#"{"alg":"none","typ":"JWT"}"#),
            b64.encode(format!(r#"{{"sub":"mallory","exp":{}}}"#, far()))
        )
    };
    // No verified `sub`: the rule denies (on_missing: deny).
    for t in [forged.as_str(), expired.as_str(), none.as_str(), "garbage"] {
        let res = send(
            &app,
            req("/user", "192.0.2.1").header("authorization", bearer(t)),
        )
        .await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "token {t}");
        assert!(res.headers().get("retry-after").is_none());
    }
    let res = send(&app, req("/user", "192.0.2.1")).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // A verified token has its own bucket of 1.
    let ok = send(
        &app,
        req("/user", "192.0.2.1").header("authorization", bearer(&good)),
    )
    .await;
    assert_eq!(ok.status(), StatusCode::OK);
    let again = send(
        &app,
        req("/user", "192.0.2.1").header("authorization", bearer(&good)),
    )
    .await;
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&again, "retry-after"), "1");
}

#[tokio::test]
async fn jwt_match_conditions_hold_only_for_verified_claims() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    let claims = serde_json::json!({"sub": "carol", "plan": "enterprise", "exp": far()});
    let good = format!("Bearer {}", token(claims.clone(), SECRET));
    let forged = format!(
        "Bearer {}",
        token(claims, "another-secret-another-secret-123")
    );
    // The forged token's plan doesn't match, so no rule applies to it.
    for _ in 0..3 {
        let res = send(
            &app,
            req("/plan", "192.0.2.1").header("authorization", &forged),
        )
        .await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit").is_none());
    }
    let res = send(
        &app,
        req("/plan", "192.0.2.1").header("authorization", &good),
    )
    .await;
    assert_eq!(header(&res, "ratelimit"), r#""enterprise";r=0;t=60"#);
    let res = send(
        &app,
        req("/plan", "192.0.2.1").header("authorization", &good),
    )
    .await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn ipv6_clients_of_one_64_share_a_bucket_and_the_next_64_has_its_own() {
    let clock = FakeClock::new(Nanos::ZERO);
    let app = app(&clock);
    // Three addresses of one /64, as one client rotating through them.
    let rotating = [
        "[2001:db8:1:2::1]",
        "[2001:db8:1:2::beef]",
        "[2001:db8:1:2:ffff::9]",
    ];
    let statuses = three(&app, |i| req("/ip", rotating[i])).await;
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let next = send(&app, req("/ip", "[2001:db8:1:3::1]")).await;
    assert_eq!(next.status(), StatusCode::OK);
}
