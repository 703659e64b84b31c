//! Envoy's rate limit service on a real port, asked by a tonic client built
//! from `envoy-types`, with the store on a stopped clock so every number is
//! exact.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice_core::{FakeClock, MemoryStore, Nanos};
use sluice_http::Enforcer;
use sluice_policy::Policy;
use sluice_server::listen::{Limits, Listener};
use sluice_server::serve::{AnyStore, ServerState, serve_grpc};
use tonic::transport::Channel;

const POLICY: &str = r#"
rules:
  - name: per-user
    domain: edge
    limit_keys: ["descriptor:user"]
    algorithm: token_bucket
    algorithm_config: {rate: 10, period: 60, burst: 10}
  - name: per-route
    domain: edge
    limit_keys: ["descriptor:route"]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
  - name: gets
    domain: edge
    limit_keys: ["descriptor:user"]
    match: {"descriptor:method": "GET"}
    algorithm: fixed_window
    algorithm_config: {rate: 3, period: 1h}
  - name: must-have-tenant
    domain: strict
    limit_keys: ["descriptor:tenant"]
    match: {"descriptor:kind": "billing"}
    on_missing: deny
    algorithm: token_bucket
    algorithm_config: {rps: 5, burst: 5}
  - name: shadow-users
    domain: edge
    limit_keys: ["descriptor:user"]
    mode: shadow
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
  - name: room-log
    domain: chat
    limit_keys: ["descriptor:room"]
    algorithm: sliding_log
    algorithm_config: {rate: 3, period: 1m}
  - name: room-posts
    domain: chat
    limit_keys: ["descriptor:room"]
    match: {"descriptor:kind": "post"}
    algorithm: sliding_window
    algorithm_config: {rate: 2, period: 1m, start: 0}
  - name: monthly-tokens
    domain: billing
    limit_keys: ["descriptor:org"]
    algorithm: fixed_window
    algorithm_config: {rate: 100000, calendar: month, timezone: Europe/Berlin}
  - name: yearly-exports
    domain: billing
    limit_keys: ["descriptor:team"]
    algorithm: fixed_window
    algorithm_config: {rate: 12, calendar: year}
  # An HTTP rule (no domain) never answers Envoy.
  - name: http-only
    limit_keys: []
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
"#;

async fn client() -> RateLimitServiceClient<Channel> {
    let policy = Policy::from_str(POLICY, "policy.yaml").unwrap();
    let store = MemoryStore::with_clock(FakeClock::new(Nanos::ZERO));
    let state = Arc::new(ServerState {
        enforcer: Arc::new(Enforcer::new(policy, AnyStore::Memory(store))),
        admin_token: None,
        api_token: None,
        metrics: None,
        reload_error: arc_swap::ArcSwapOption::empty(),
        dashboard: None,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = Listener::new(listener, "grpc", &Limits::default());
    let call_timeout = std::time::Duration::from_secs(60);
    tokio::spawn(serve_grpc(
        listener,
        state,
        call_timeout,
        std::future::pending(),
    ));
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: hits,
    }
}

async fn ask(c: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(r).await.unwrap().into_inner()
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

fn code(s: &DescriptorStatus) -> Code {
    Code::try_from(s.code).unwrap()
}

#[tokio::test]
async fn unknown_domains_and_unmatched_descriptors_are_ok_without_a_limit() {
    let mut c = client().await;
    let r = ask(
        &mut c,
        request("elsewhere", vec![descriptor(&[("user", "u1")])], 0),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 1);
    assert_eq!(code(&r.statuses[0]), Code::Ok);
    assert!(r.statuses[0].current_limit.is_none());
    assert!(r.response_headers_to_add.is_empty());

    // In a known domain, a descriptor no rule keys on is OK with no limit,
    // beside one that is limited.
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![
                descriptor(&[("colour", "blue")]),
                descriptor(&[("user", "u1")]),
            ],
            0,
        ),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(code(&r.statuses[0]), Code::Ok);
    assert!(r.statuses[0].current_limit.is_none());
    assert!(r.statuses[1].current_limit.is_some());
}

#[tokio::test]
async fn a_descriptor_counts_down_then_goes_over_with_headers_to_add() {
    let mut c = client().await;
    for left in (0..10).rev() {
        let r = ask(
            &mut c,
            request("edge", vec![descriptor(&[("user", "u1")])], 0),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        let s = &r.statuses[0];
        assert_eq!(code(s), Code::Ok);
        assert_eq!(s.limit_remaining, left);
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(limit.name, "per-user");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (10, Unit::Minute as i32)
        );
        // Ten tokens short of full at 10 a minute: full again in 6 s each.
        let reset = s.duration_until_reset.unwrap();
        assert_eq!(reset.seconds, 6 * (10 - i64::from(left)));
        assert_eq!(
            header(&r, "ratelimit-policy"),
            Some("\"per-user\";q=10;w=60")
        );
        assert_eq!(
            header(&r, "ratelimit").unwrap(),
            format!("\"per-user\";r={left};t={}", 6 * (10 - left))
        );
        assert!(header(&r, "retry-after").is_none());
    }
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("user", "u1")])], 0),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    // 6 s to the next token, plus at most 50% jitter.
    assert!((6..=9).contains(&retry), "retry-after {retry}");
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
    assert_eq!(body["rule"], "per-user");
    assert_eq!(body["status"], 429);
    // Another user is untouched.
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("user", "u2")])], 0),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
}

#[tokio::test]
async fn all_descriptors_are_one_transaction() {
    let mut c = client().await;
    let both = || {
        request(
            "edge",
            vec![
                descriptor(&[("user", "u1")]),
                descriptor(&[("route", "/pay")]),
            ],
            0,
        )
    };
    let r = ask(&mut c, both()).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 9);
    assert_eq!(r.statuses[1].limit_remaining, 0);
    // The route is over, so the user's quota is not spent either.
    for _ in 0..3 {
        let r = ask(&mut c, both()).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(code(&r.statuses[0]), Code::Ok);
        assert_eq!(code(&r.statuses[1]), Code::OverLimit);
        assert_eq!(r.statuses[0].limit_remaining, 9);
    }
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("user", "u1")])], 0),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 8);
}

#[tokio::test]
async fn hits_addend_is_the_cost() {
    let mut c = client().await;
    let user = |u: &str| descriptor(&[("user", u)]);
    // The request's hits_addend; 0 means 1.
    let r = ask(&mut c, request("edge", vec![user("a")], 3)).await;
    assert_eq!(r.statuses[0].limit_remaining, 7);
    let r = ask(&mut c, request("edge", vec![user("a")], 0)).await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
    // A descriptor's own hits_addend overrides the request's.
    let mut own = user("b");
    own.hits_addend = Some(UInt64Value { value: 4 });
    let r = ask(&mut c, request("edge", vec![own, user("c")], 2)).await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
    assert_eq!(r.statuses[1].limit_remaining, 8);
    // A descriptor-level 0 spends nothing: it only asks.
    let mut ask_only = user("b");
    ask_only.hits_addend = Some(UInt64Value { value: 0 });
    let r = ask(&mut c, request("edge", vec![ask_only], 5)).await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
    // More than the bucket can ever hold is over, and spends nothing.
    let r = ask(&mut c, request("edge", vec![user("a")], 11)).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    let r = ask(&mut c, request("edge", vec![user("a")], 0)).await;
    assert_eq!(r.statuses[0].limit_remaining, 5);
    // Negative hits give tokens back: the descriptor is OK, and says what
    // the key holds after the refund.
    let mut refund = user("a");
    refund.hits_addend = Some(UInt64Value { value: 3 });
    refund.is_negative_hits = true;
    let r = ask(&mut c, request("edge", vec![refund.clone()], 0)).await;
    assert_eq!(code(&r.statuses[0]), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 8);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "per-user"
    );
    let r = ask(&mut c, request("edge", vec![user("a")], 0)).await;
    assert_eq!(r.statuses[0].limit_remaining, 7);
    // Never above the capacity, and a refund beside a call in one request
    // is made first, so the call may use it.
    let r = ask(&mut c, request("edge", vec![refund.clone(), refund], 0)).await;
    assert_eq!(r.statuses[1].limit_remaining, 10);
    let mut spend_all = user("a");
    spend_all.hits_addend = Some(UInt64Value { value: 10 });
    let r = ask(&mut c, request("edge", vec![spend_all.clone()], 0)).await;
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let mut back = user("a");
    back.hits_addend = Some(UInt64Value { value: 10 });
    back.is_negative_hits = true;
    let r = ask(&mut c, request("edge", vec![spend_all, back], 0)).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
}

#[tokio::test]
async fn matches_on_descriptor_values_pick_the_tightest_rule() {
    let mut c = client().await;
    let get = || descriptor(&[("user", "u1"), ("method", "GET")]);
    // Both per-user (10) and gets (3 an hour) apply; gets speaks.
    for left in [2, 1, 0] {
        let r = ask(&mut c, request("edge", vec![get()], 0)).await;
        assert_eq!(code(&r.statuses[0]), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, left);
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(limit.name, "gets");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (3, Unit::Hour as i32)
        );
    }
    let r = ask(&mut c, request("edge", vec![get()], 0)).await;
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "gets");
    // A POST is not a GET: only per-user applies. It had 7 left, since the
    // denied GET spent nothing.
    let post = descriptor(&[("user", "u1"), ("method", "POST")]);
    let r = ask(&mut c, request("edge", vec![post], 0)).await;
    assert_eq!(code(&r.statuses[0]), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 6);
}

#[tokio::test]
async fn a_missing_key_under_on_missing_deny_is_over_limit() {
    let mut c = client().await;
    let r = ask(
        &mut c,
        request(
            "strict",
            vec![
                descriptor(&[("kind", "billing")]),
                descriptor(&[("x", "y")]),
            ],
            0,
        ),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    assert_eq!(code(&r.statuses[1]), Code::Ok);
    let r = ask(
        &mut c,
        request(
            "strict",
            vec![descriptor(&[("kind", "billing"), ("tenant", "t1")])],
            0,
        ),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 4);
}

#[tokio::test]
async fn requests_without_a_domain_or_descriptors_are_invalid() {
    let mut c = client().await;
    let err = c
        .should_rate_limit(request("", vec![descriptor(&[("user", "u")])], 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = c
        .should_rate_limit(request("edge", vec![], 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn sliding_rules_answer_envoy_with_their_window_and_decide_as_one_transaction() {
    let mut c = client().await;
    let call = |kind: &str| {
        request(
            "chat",
            vec![descriptor(&[("room", "r1"), ("kind", kind)])],
            0,
        )
    };
    // Two posts: both rules admit; the window's two are spent.
    for left in [1, 0] {
        let r = ask(&mut c, call("post")).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        let s = &r.statuses[0];
        assert_eq!(s.limit_remaining, left);
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(limit.name, "room-posts", "the tighter rule decides");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (2, Unit::Minute as i32)
        );
        assert!(
            header(&r, "ratelimit-policy")
                .unwrap()
                .contains("\"room-log\";q=3;w=60"),
            "{:?}",
            r.response_headers_to_add
        );
    }
    // A third post is over the window's rate, so the log spends nothing.
    let r = ask(&mut c, call("post")).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "room-posts"
    );
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    // The two posts weigh in until half the next window has passed: then
    // 2 × (60 − 30) / 60 + 1 ≤ 2, 90 s from now; plus at most 50% jitter.
    assert!((90..=135).contains(&retry), "retry-after {retry}");
    // The log still has the one left, which a read takes; then it is over,
    // until the first call leaves its window a minute after it was logged.
    let r = ask(&mut c, call("read")).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let s = &r.statuses[0];
    assert_eq!(s.limit_remaining, 0);
    assert_eq!(s.current_limit.as_ref().unwrap().name, "room-log");
    assert_eq!(s.duration_until_reset.unwrap().seconds, 60);
    let r = ask(&mut c, call("read")).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(header(&r, "ratelimit"), Some("\"room-log\";r=0;t=60"));
}

#[tokio::test]
async fn a_descriptors_limit_override_takes_the_rules_place_for_that_descriptor() {
    let mut c = client().await;
    let with_override = |user: &str, per_minute: u32| {
        let mut d = descriptor(&[("user", user)]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: per_minute,
            unit: RateLimitUnit::Minute as i32,
        });
        request("edge", vec![d], 0)
    };
    // per-user is 10 a minute; this descriptor says 2.
    for left in [1, 0] {
        let r = ask(&mut c, with_override("u1", 2)).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        let s = &r.statuses[0];
        assert_eq!(s.limit_remaining, left);
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("per-user", 2, Unit::Minute as i32)
        );
        assert_eq!(
            header(&r, "ratelimit-policy"),
            Some("\"per-user\";q=2;w=60")
        );
    }
    let r = ask(&mut c, with_override("u1", 2)).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // The override keeps its own state: the rule's own limit for u1 is
    // untouched.
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("user", "u1")])], 0),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    // An override the server cannot use (no unit; a count of 0, which no
    // algorithm takes) leaves the rule's own limit in force.
    for (count, unit) in [(5, RateLimitUnit::Unknown), (0, RateLimitUnit::Minute)] {
        let mut bad = descriptor(&[("user", "u1")]);
        bad.limit = Some(RateLimitOverride {
            requests_per_unit: count,
            unit: unit as i32,
        });
        let r = ask(&mut c, request("edge", vec![bad], 0)).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (10, Unit::Minute as i32)
        );
    }
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("user", "u1")])], 0),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
}

#[tokio::test]
async fn an_override_per_month_or_year_is_reported_per_month_or_year() {
    let mut c = client().await;
    for (unit, reported) in [
        (RateLimitUnit::Month, Unit::Month),
        (RateLimitUnit::Year, Unit::Year),
    ] {
        for count in [1, 100] {
            let mut d = descriptor(&[("user", &format!("{unit:?}-{count}"))]);
            d.limit = Some(RateLimitOverride {
                requests_per_unit: count,
                unit: unit as i32,
            });
            let r = ask(&mut c, request("edge", vec![d], 0)).await;
            assert_eq!(r.overall_code, Code::Ok as i32);
            let s = &r.statuses[0];
            assert_eq!(s.limit_remaining, count - 1, "{unit:?}");
            let limit = s.current_limit.as_ref().unwrap();
            assert_eq!(
                (limit.name.as_str(), limit.requests_per_unit, limit.unit),
                ("per-user", count, reported as i32),
                "{count} per {unit:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_calendar_quota_is_reported_per_month_or_year() {
    let mut c = client().await;
    for (key, name, count, unit) in [
        ("org", "monthly-tokens", 100_000, Unit::Month),
        ("team", "yearly-exports", 12, Unit::Year),
    ] {
        let r = ask(
            &mut c,
            request("billing", vec![descriptor(&[(key, "acme")])], 0),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        let s = &r.statuses[0];
        assert_eq!(s.limit_remaining, count - 1);
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            (name, count, unit as i32)
        );
    }
}
