//! `on_limit: {delay: {max}}`: which rules may hold a request over their
//! limit, and what `validate` says about the ones that hold it badly.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use sluice_policy::{Policy, PolicyError};

/// A one-rule policy: `algorithm`, its config, and the rule's other fields.
fn rule(algorithm: &str, config: &str, extra: &str) -> String {
    format!(
        "rules:\n  - name: r\n    limit_keys: [ip:address]\n    algorithm: {algorithm}\n    \
         algorithm_config: {config}\n{extra}"
    )
}

fn err(text: &str) -> PolicyError {
    match Policy::from_str(text, "policy.yaml") {
        Ok(_) => panic!("policy should have been rejected:\n{text}"),
        Err(e) => e,
    }
}

fn warnings(text: &str) -> Vec<String> {
    let p = Policy::from_str(text, "policy.yaml").unwrap();
    p.warnings().iter().map(|w| w.message.clone()).collect()
}

#[test]
fn a_delay_is_read_in_the_units_durations_are_written_in_elsewhere() {
    for (max, want) in [
        ("2s", Duration::from_secs(2)),
        ("500ms", Duration::from_millis(500)),
        ("1.5", Duration::from_millis(1500)),
        ("1h", Duration::from_secs(3600)),
    ] {
        let text = rule(
            "token_bucket",
            "{rps: 10, burst: 1, max_reserved: 5}",
            &format!("    on_limit: {{delay: {{max: {max}}}}}\n"),
        );
        let p = Policy::from_str(&text, "p").unwrap();
        assert_eq!(p.rules()[0].delay(), Some(want), "{max}");
    }
}

#[test]
fn a_rule_without_on_limit_or_without_delay_refuses() {
    let plain = rule("token_bucket", "{rps: 10}", "");
    assert_eq!(
        Policy::from_str(&plain, "p").unwrap().rules()[0].delay(),
        None
    );
    let empty = rule("token_bucket", "{rps: 10}", "    on_limit: {}\n");
    assert_eq!(
        Policy::from_str(&empty, "p").unwrap().rules()[0].delay(),
        None
    );
}

#[test]
fn a_delay_of_zero_or_above_an_hour_is_refused_at_its_max() {
    for max in ["0", "0s", "-1", "3601s", "2h"] {
        let text = rule(
            "token_bucket",
            "{rps: 10, max_reserved: 5}",
            &format!("    on_limit: {{delay: {{max: {max}}}}}\n"),
        );
        let e = err(&text);
        assert_eq!((e.line, e.column), (6, 29), "{max}: {e}");
        assert!(e.message.contains("at most an hour"), "{e}");
    }
}

#[test]
fn an_algorithm_without_reservations_cannot_delay() {
    for (alg, config) in [
        ("sliding_window", "{rate: 10, period: 1s}"),
        ("sliding_log", "{rate: 10, period: 1s}"),
        ("concurrency", "{max: 2}"),
    ] {
        let e = err(&rule(alg, config, "    on_limit: {delay: {max: 1s}}\n"));
        assert!(e.message.contains("cannot delay"), "{alg}: {e}");
        assert_eq!(e.line, 6, "{e}");
    }
    let fw = rule(
        "fixed_window",
        "{rate: 10, period: 1s, max_reserved: 10}",
        "    on_limit: {delay: {max: 1s}}\n",
    );
    assert!(warnings(&fw).is_empty(), "{:?}", warnings(&fw));
}

#[test]
fn an_unknown_field_of_on_limit_or_delay_is_refused() {
    let e = err(&rule(
        "token_bucket",
        "{rps: 1}",
        "    on_limit: {queue: 1}\n",
    ));
    assert!(e.message.contains("unknown field"), "{e}");
    let e = err(&rule(
        "token_bucket",
        "{rps: 1}",
        "    on_limit: {delay: {max: 1s, min: 1s}}\n",
    ));
    assert!(e.message.contains("unknown field"), "{e}");
    let e = err(&rule(
        "token_bucket",
        "{rps: 1}",
        "    on_limit: {delay: {}}\n",
    ));
    assert!(e.message.contains("max"), "{e}");
}

#[test]
fn a_delay_without_max_reserved_is_warned_of_with_what_max_can_hold() {
    let w = warnings(&rule(
        "token_bucket",
        "{rps: 10}",
        "    on_limit: {delay: {max: 2s}}\n",
    ));
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("no `max_reserved`") && w[0].contains("to 20"),
        "{w:?}"
    );
}

#[test]
fn a_max_shorter_than_max_reserved_waits_is_warned_of() {
    // 50 reserved at 10 a second wait up to 5 s, longer than the 2 s held.
    let w = warnings(&rule(
        "token_bucket",
        "{rps: 10, max_reserved: 50}",
        "    on_limit: {delay: {max: 2s}}\n",
    ));
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("shorter than the 5 s") && w[0].contains("to 20"),
        "{w:?}"
    );
    // A fixed window waits for whole windows: 15 reserved at 10 a minute
    // wait for the second window after this one.
    let w = warnings(&rule(
        "fixed_window",
        "{rate: 10, period: 1m, max_reserved: 15}",
        "    on_limit: {delay: {max: 1m}}\n",
    ));
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("shorter than the 120 s"), "{w:?}");
}

#[test]
fn an_envoy_rule_with_a_delay_is_warned_of_by_name() {
    let text = "rules:\n  - name: edge-ip\n    domain: edge\n    limit_keys: ['descriptor:remote_address']\n    \
                algorithm: token_bucket\n    algorithm_config: {rps: 10, max_reserved: 10}\n    \
                on_limit: {delay: {max: 1s}}\n";
    let w = warnings(text);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("rule `edge-ip` answers Envoy"), "{w:?}");
    // It is kept, for the front ends that can hold.
    let p = Policy::from_str(text, "p").unwrap();
    assert_eq!(p.rules()[0].delay(), Some(Duration::from_secs(1)));
}

#[test]
fn the_builder_writes_a_delay_as_the_file_does() {
    use sluice_policy::Rule;
    let built = Policy::builder()
        .rule(
            Rule::builder("r")
                .key(sluice_policy::LimitKey::IpAddress)
                .token_bucket(10.0, 1.0)
                .max_reserved(10.0)
                .delay(Duration::from_secs(1)),
        )
        .build()
        .unwrap();
    assert_eq!(built.rules()[0].delay(), Some(Duration::from_secs(1)));
    assert_eq!(
        built.rules()[0].limit().algorithm().max_reserved(),
        Some(10.0)
    );
    assert!(built.warnings().is_empty(), "{:?}", built.warnings());
}
