//! A policy built in code is the policy its file would be, and is refused
//! for the same reasons, with the rule at fault named.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use sluice_policy::{
    Condition, Enforcement, ForwardingHeader, LimitKey, OnMissing, OnStoreError, Policy, Rule,
};

const FILE: &str = r#"
on_store_error: closed
trusted_proxies: {cidrs: [10.0.0.0/8], header: forwarded}
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 20, burst: 50, shards: 4}
  - name: per-tenant
    limit_keys: ["header:x-tenant", path]
    match: {path_prefix: /api/, method: POST}
    mode: shadow
    on_missing: deny
    on_store_error: open
    algorithm: fixed_window
    algorithm_config: {rate: 1000, period: 1m}
"#;

fn built() -> Policy {
    Policy::builder()
        .on_store_error(OnStoreError::Closed)
        .trusted_proxies(["10.0.0.0/8"], ForwardingHeader::Forwarded)
        .rule(
            Rule::builder("per-ip")
                .key(LimitKey::IpAddress)
                .token_bucket(20.0, 50.0)
                .shards(4),
        )
        .rule(
            Rule::builder("per-tenant")
                .key(LimitKey::Header("x-tenant".into()))
                .key(LimitKey::Path)
                .when(Condition::PathPrefix("/api/".into()))
                .when(Condition::Method("POST".into()))
                .enforcement(Enforcement::Shadow)
                .on_missing(OnMissing::Deny)
                .on_store_error(OnStoreError::Open)
                .fixed_window(1000.0, Duration::from_secs(60)),
        )
        .build()
        .unwrap()
}

#[test]
fn a_policy_built_in_code_equals_the_same_policy_read_from_a_file() {
    let file = Policy::from_str(FILE, "policy.yaml").unwrap();
    let built = built();
    assert_eq!(
        format!("{:?}", built.rules()),
        format!("{:?}", file.rules())
    );
    assert_eq!(built.on_store_error(), file.on_store_error());
    assert_eq!(
        format!("{:?}", built.trusted_proxies()),
        format!("{:?}", file.trusted_proxies())
    );
    assert!(built.warnings().is_empty());
}

#[test]
fn a_built_policy_is_refused_for_what_a_file_is_with_the_rule_named() {
    let err = Policy::builder()
        .rule(
            Rule::builder("fine")
                .key(LimitKey::IpAddress)
                .token_bucket(1.0, 2.0),
        )
        .rule(Rule::builder("no-limit").key(LimitKey::IpAddress))
        .build()
        .unwrap_err();
    assert_eq!((err.line, err.column), (0, 0));
    assert!(
        err.to_string()
            .starts_with("Policy::builder(): rule \"no-limit\": "),
        "{err}"
    );

    let err = Policy::builder()
        .rule(Rule::builder("a").token_bucket(1.0, 2.0))
        .rule(Rule::builder("a").token_bucket(1.0, 2.0))
        .build()
        .unwrap_err();
    assert!(err.message.starts_with("rule \"a\": "), "{err}");
    assert!(err.message.contains("duplicate rule name"), "{err}");

    let err = Policy::builder()
        .rule(Rule::builder("ok").token_bucket(1.0, 2.0).shards(5000))
        .build()
        .unwrap_err();
    assert!(err.message.starts_with("rule \"ok\": "), "{err}");
    assert!(err.message.contains("shards"), "{err}");

    let err = Policy::builder()
        .rule(Rule::builder("nan").token_bucket(f64::NAN, 2.0))
        .build()
        .unwrap_err();
    assert!(err.message.starts_with("rule \"nan\": "), "{err}");
}
