//! Loading whole policies: the example file, the same policy in JSON, and
//! every way of writing a rate.

// Helpers shared by the tests are not `#[test]` functions, so clippy's
// allow-*-in-tests settings do not reach them.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use sluice_core::{
    Algorithm, Calendar, CalendarUnit, FixedWindow, Nanos, SlidingLog, SlidingWindow, TokenBucket,
};
use sluice_policy::{
    Condition, CostSource, Enforcement, LimitKey, OnStoreError, Policy, RequestParts, StoreConfig,
};

fn example_path() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/policy.yaml"
    ))
}

/// Everything a policy compiles to, in a comparable form.
fn summary(p: &Policy) -> String {
    let limits: Vec<_> = p
        .named_limits()
        .iter()
        .map(|l| {
            (
                l.name(),
                *l.limit().algorithm(),
                l.limit().shards(),
                l.enforcement(),
                l.penalty().map(|p| p.duration()),
            )
        })
        .collect();
    let rules: Vec<_> = p
        .rules()
        .iter()
        .map(|r| {
            let l = r.limit();
            let parts = (r.limit_keys(), r.conditions(), r.cost(), r.enforcement());
            (
                r.name(),
                *l.algorithm(),
                l.shards(),
                parts,
                r.on_store_error(),
                r.penalty().map(|p| p.duration()),
            )
        })
        .collect();
    format!("{:?}", (p.store(), p.on_store_error(), limits, rules))
}

const FULL_JSON: &str = r#"{
  "store": {"kind": "memory", "max_keys": 1000000},
  "on_store_error": "open",
  "limits": {
    "sendMessage": {
      "algorithm": "token_bucket",
      "algorithm_config": {"rate": 10, "period": 60, "burst": 20, "max_reserved": 50}
    },
    "llmTokens": {
      "algorithm": "token_bucket",
      "algorithm_config": {"tokens_per_second": 40000, "burst": 400000,
                           "max_reserved": 2000000, "shards": 4}
    },
    "llmTokensMonthly": {
      "algorithm": "fixed_window",
      "algorithm_config": {"rate": 100000000, "calendar": "month",
                           "timezone": "Europe/Berlin", "max_reserved": 2000000}
    },
    "uploads": {
      "algorithm": "concurrency",
      "algorithm_config": {"max": 2, "lease": "5m"}
    }
  },
  "rules": [
    {"name": "per-ip", "limit_keys": ["ip:address"], "algorithm": "token_bucket",
     "algorithm_config": {"rps": 20, "burst": 50}},
    {"name": "per-api-key", "limit_keys": ["header:x-api-key"],
     "match": {"path_prefix": "/api/"}, "algorithm": "token_bucket",
     "algorithm_config": {"rate": 600, "period": "1m",
                          "cost_source": "header:x-request-cost", "default_cost": 1},
     "on_store_error": "closed"},
    {"name": "exports-per-tenant", "limit_keys": ["query:tenant"],
     "match": {"path_prefix": "/api/export", "method": "POST"},
     "algorithm": "fixed_window",
     "algorithm_config": {"rate": 100, "period": "1h", "start": 0}},
    {"name": "login-shadow", "limit_keys": ["ip:address", "path"],
     "match": {"path": "/login", "method": "POST"}, "algorithm": "fixed_window",
     "algorithm_config": {"rate": 5, "period": "1m"}, "penalty": "5m", "mode": "shadow"},
    {"name": "envoy-per-client", "domain": "edge",
     "limit_keys": ["descriptor:remote_address"], "algorithm": "token_bucket",
     "algorithm_config": {"rps": 100, "burst": 200}}
  ]
}"#;

#[test]
fn example_policy_file_parses() {
    let p = Policy::from_path(example_path()).unwrap();
    assert_eq!(
        p.store(),
        &StoreConfig::Memory {
            max_keys: Some(1_000_000)
        }
    );
    assert_eq!(p.on_store_error(), OnStoreError::Open);

    let names: Vec<_> = p.named_limits().iter().map(|l| l.name()).collect();
    assert_eq!(
        names,
        ["sendMessage", "llmTokens", "llmTokensMonthly", "uploads"]
    );
    let Algorithm::Concurrency(uploads) = *p.named_limit("uploads").unwrap().limit().algorithm()
    else {
        panic!("uploads should be a concurrency limit")
    };
    assert_eq!(
        (uploads.max(), uploads.lease()),
        (2.0, Nanos(300 * Nanos::PER_SEC))
    );
    let send = p.named_limit("sendMessage").unwrap().limit();
    let Algorithm::TokenBucket(tb) = *send.algorithm() else {
        panic!("sendMessage should be a token bucket")
    };
    assert!((tb.rate() - 10.0 / 60.0).abs() < 1e-12);
    assert_eq!((tb.capacity(), tb.max_reserved()), (20.0, Some(50.0)));
    let llm = p.named_limit("llmTokens").unwrap().limit();
    assert_eq!(llm.shards(), 4);
    assert_eq!(llm.shard_algorithm().capacity(), 100_000.0);
    assert_eq!(llm.algorithm().max_cost(true), 2_400_000.0);

    let rules: Vec<_> = p.rules().iter().map(|r| r.name()).collect();
    assert_eq!(
        rules,
        [
            "per-ip",
            "per-api-key",
            "exports-per-tenant",
            "login-shadow",
            "envoy-per-client"
        ]
    );
    let api = &p.rules()[1];
    assert_eq!(api.limit_keys(), &[LimitKey::Header("x-api-key".into())]);
    assert_eq!(
        api.cost().source(),
        &CostSource::Header("x-request-cost".into())
    );
    assert_eq!(api.on_store_error(), OnStoreError::Closed);
    assert_eq!(p.rules()[0].on_store_error(), OnStoreError::Open);
    let export = &p.rules()[2];
    assert_eq!(
        export.conditions(),
        &[
            Condition::PathPrefix("/api/export".into()),
            Condition::Method("POST".into())
        ]
    );
    let Algorithm::FixedWindow(fw) = *export.limit().algorithm() else {
        panic!("exports should be a fixed window")
    };
    assert_eq!(
        (fw.period(), fw.start()),
        (Nanos(3600 * Nanos::PER_SEC), Some(Nanos(0)))
    );
    assert_eq!(p.rules()[3].enforcement(), Enforcement::Shadow);
    assert_eq!(
        p.rules()[3].penalty().map(|p| p.duration()),
        Some(Nanos(300 * Nanos::PER_SEC))
    );
    assert_eq!(p.rules()[0].enforcement(), Enforcement::Enforce);
}

#[test]
fn json_policy_compiles_like_the_yaml_one() {
    let yaml = Policy::from_path(example_path()).unwrap();
    let json = Policy::from_str(FULL_JSON, "policy.json").unwrap();
    assert_eq!(json.rules().len(), 5);
    assert_eq!(summary(&json), summary(&yaml));
}

#[test]
fn json_policy_is_usable_for_matching() {
    let p = Policy::from_str(FULL_JSON, "policy.json").unwrap();
    let req = RequestParts::new("POST", "/api/export")
        .with_ip([198, 51, 100, 4].into())
        .with_header("X-Api-Key", "k1")
        .with_header("X-Request-Cost", "3")
        .with_query("tenant=acme");
    let hits: Vec<_> = p
        .matching(&req)
        .map(|h| (h.rule.name(), h.key, h.cost))
        .collect();
    assert_eq!(
        hits,
        [
            ("per-ip", "12:198.51.100.4".to_owned(), 1.0),
            ("per-api-key", "2:k1".to_owned(), 3.0),
            ("exports-per-tenant", "4:acme".to_owned(), 1.0),
        ]
    );
}

#[test]
fn from_path_reports_the_path_in_errors() {
    let dir = std::env::temp_dir().join(format!("sluice-policy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(&file, "on_store_error: sometimes\n").unwrap();
    let err = Policy::from_path(&file).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(err.file, file);
    assert_eq!((err.line, err.column), (1, 17));
    assert!(
        err.to_string().starts_with(&format!(
            "{}:1:17: unknown variant `sometimes`",
            file.display()
        )),
        "{err}"
    );

    let missing = dir.join("missing.yaml");
    let err = Policy::from_path(&missing).unwrap_err();
    assert_eq!((err.line, err.column), (0, 0));
    assert!(
        err.message.starts_with("cannot read the policy file"),
        "{err}"
    );
}

#[test]
fn empty_policy_is_valid_and_limits_nothing() {
    let p = Policy::from_str("# nothing yet\n", "p.yaml").unwrap();
    assert!(p.rules().is_empty() && p.named_limits().is_empty());
    assert_eq!(p.store(), &StoreConfig::default());
    assert_eq!(p.matching(&RequestParts::new("GET", "/")).count(), 0);
}

#[test]
fn redis_store_is_parsed() {
    let p = Policy::from_str(
        "store: {kind: redis, url: 'redis://cache:6379/0', timeout_ms: 50}\n",
        "p.yaml",
    )
    .unwrap();
    assert_eq!(
        p.store(),
        &StoreConfig::Redis {
            url: "redis://cache:6379/0".into(),
            timeout: Some(Duration::from_millis(50))
        }
    );
}

#[test]
fn postgres_store_is_parsed() {
    let p = Policy::from_str(
        "store: {kind: postgres, url: 'postgres://app@db/app', timeout_ms: 200, schema: limits, durable: false}\n",
        "p.yaml",
    )
    .unwrap();
    assert_eq!(
        p.store(),
        &StoreConfig::Postgres {
            url: "postgres://app@db/app".into(),
            timeout: Some(Duration::from_millis(200)),
            schema: Some("limits".into()),
            durable: false,
        }
    );
    let p = Policy::from_str(
        "store: {kind: postgres, url: 'postgresql://db/app'}\n",
        "p.yaml",
    )
    .unwrap();
    assert!(matches!(
        p.store(),
        StoreConfig::Postgres {
            schema: None,
            durable: true,
            ..
        }
    ));
}

/// The algorithm of a named limit `l` configured with `config` (a flow map).
fn algorithm(kind: &str, config: &str) -> Algorithm {
    let yaml = format!("limits:\n  l:\n    algorithm: {kind}\n    algorithm_config: {config}\n");
    let p = Policy::from_str(&yaml, "p.yaml").unwrap_or_else(|e| panic!("{e}"));
    *p.named_limit("l").unwrap().limit().algorithm()
}

fn tb(rate: f64, burst: f64) -> Algorithm {
    TokenBucket::new(rate, burst).unwrap().into()
}

fn secs(s: i64) -> Nanos {
    Nanos(s * Nanos::PER_SEC)
}

#[test]
fn token_bucket_rate_forms() {
    assert_eq!(algorithm("token_bucket", "{rps: 5}"), tb(5.0, 5.0));
    assert_eq!(
        algorithm("token_bucket", "{tokens_per_second: 5}"),
        tb(5.0, 5.0)
    );
    assert_eq!(algorithm("token_bucket", "{rate: 3}"), tb(3.0, 3.0));
    // rate per period: the burst defaults to the tokens of one period.
    let per_minute = tb(10.0 / 60.0, 10.0);
    assert_eq!(
        algorithm("token_bucket", "{rate: 10, period: 60}"),
        per_minute
    );
    assert_eq!(
        algorithm("token_bucket", "{rate: 10, period: 1m}"),
        per_minute
    );
    assert_eq!(
        algorithm("token_bucket", "{rate: 10, period: '1m'}"),
        per_minute
    );
    assert_eq!(
        algorithm("token_bucket", "{rate: 1, period: 500ms}"),
        tb(2.0, 1.0)
    );
    assert_eq!(
        algorithm("token_bucket", "{rate: 1, period: 0.25}"),
        tb(4.0, 1.0)
    );
    assert_eq!(
        algorithm("token_bucket", "{rate: 24, period: 1d}"),
        tb(24.0 / 86400.0, 24.0)
    );
}

#[test]
fn token_bucket_burst_and_its_capacity_alias() {
    assert_eq!(
        algorithm("token_bucket", "{rps: 5, burst: 12.5}"),
        tb(5.0, 12.5)
    );
    assert_eq!(
        algorithm("token_bucket", "{rps: 5, capacity: 12}"),
        tb(5.0, 12.0)
    );
    let reserving = TokenBucket::new(5.0, 10.0)
        .unwrap()
        .with_max_reserved(30.0)
        .unwrap();
    assert_eq!(
        algorithm("token_bucket", "{rps: 5, burst: 10, max_reserved: 30}"),
        reserving.into()
    );
    // A named limit may have no capacity of its own when it may reserve.
    let Algorithm::TokenBucket(t) =
        algorithm("token_bucket", "{rps: 5, burst: 0, max_reserved: 10}")
    else {
        panic!()
    };
    assert_eq!(t.capacity(), 0.0);
}

#[test]
fn fixed_window_forms_and_capacity_default() {
    let fw = |rate, period| -> FixedWindow { FixedWindow::new(rate, period).unwrap() };
    assert_eq!(
        algorithm("fixed_window", "{rate: 100, period: 1h}"),
        fw(100.0, secs(3600)).into()
    );
    let Algorithm::FixedWindow(w) = algorithm("fixed_window", "{rate: 100, period: 1h}") else {
        panic!()
    };
    assert_eq!((w.capacity(), w.start()), (100.0, None));
    assert_eq!(
        algorithm("fixed_window", "{rps: 7}"),
        fw(7.0, secs(1)).into()
    );
    assert_eq!(
        algorithm("fixed_window", "{tokens_per_second: 7}"),
        fw(7.0, secs(1)).into()
    );
    let rolled = fw(10.0, secs(60))
        .with_capacity(25.0)
        .unwrap()
        .with_start(secs(30));
    assert_eq!(
        algorithm(
            "fixed_window",
            "{rate: 10, period: 60, capacity: 25, start: 30s}"
        ),
        rolled.into()
    );
}

#[test]
fn a_start_in_fractional_epoch_seconds_is_the_instant_it_says() {
    for (start, ns) in [
        ("1795820513.25", 1_795_820_513_250_000_000),
        ("1795820513.000001", 1_795_820_513_000_001_000),
        ("1795820513", 1_795_820_513_000_000_000),
    ] {
        let config = format!("{{rate: 10, period: 60, start: {start}}}");
        let Algorithm::FixedWindow(w) = algorithm("fixed_window", &config) else {
            panic!()
        };
        assert_eq!(w.start(), Some(Nanos(ns)), "{start}");
    }
}

#[test]
fn sliding_window_and_sliding_log_forms() {
    let window = |rate, period| SlidingWindow::per_period(rate, period).unwrap();
    assert_eq!(
        algorithm("sliding_window", "{rate: 100, period: 1m}"),
        window(100.0, secs(60)).into()
    );
    assert_eq!(
        algorithm("sliding_window", "{rps: 7, start: 0.5}"),
        window(7.0, secs(1)).with_start(Nanos(500_000_000)).into()
    );
    let log = |rate, period| SlidingLog::per_period(rate, period).unwrap();
    assert_eq!(
        algorithm("sliding_log", "{rate: 10, period: 1h}"),
        log(10.0, secs(3600)).into()
    );
    assert_eq!(
        algorithm("sliding_log", "{tokens_per_second: 2.5}"),
        log(2.5, secs(1)).into()
    );
    let p = Policy::from_str(
        "rules:\n  - name: hot\n    limit_keys: [path]\n    algorithm: sliding_log\n    \
         algorithm_config: {rate: 64, period: 1m, shards: 4, cost_source: header:x-cost, \
         default_cost: 2}\n",
        "p.yaml",
    )
    .unwrap();
    let rule = &p.rules()[0];
    assert_eq!(rule.limit().shards(), 4);
    assert_eq!(rule.limit().shard_algorithm(), &log(16.0, secs(60)).into());
    assert_eq!(rule.cost().default_cost(), 2.0);
}

#[test]
fn shards_are_applied_and_rule_limits_are_named_after_rules() {
    let p = Policy::from_str(
        "rules:\n  - name: hot\n    limit_keys: []\n    algorithm: token_bucket\n    \
         algorithm_config: {rps: 100, burst: 40, shards: 4}\n",
        "p.yaml",
    )
    .unwrap();
    let limit = p.rules()[0].limit();
    assert_eq!((limit.name(), limit.shards()), ("hot", 4));
    assert_eq!(limit.algorithm(), &tb(100.0, 40.0));
    assert_eq!(limit.shard_algorithm(), &tb(25.0, 10.0));
}

#[test]
fn compact_json_and_empty_sections() {
    let compact = r#"{"rules":[{"name":"r","limit_keys":[],"match":{"method":"GET"},"algorithm":"token_bucket","algorithm_config":{"rps":1}}]}"#;
    let p = Policy::from_str(compact, "p.json").unwrap();
    assert_eq!(
        p.rules()[0].conditions(),
        &[Condition::Method("GET".into())]
    );

    let text = "limits:\nrules:\n  - name: r\n    limit_keys: []\n    match:\n    \
                algorithm: token_bucket\n    algorithm_config: {rps: 1}\n";
    let p = Policy::from_str(text, "p.yaml").unwrap();
    assert!(p.named_limits().is_empty());
    assert!(p.rules()[0].conditions().is_empty());
}

#[test]
fn a_catch_all_after_a_matching_rule_on_the_same_keys_warns_of_the_tier_mistake() {
    let tiers = |group: &str| {
        format!(
            "rules:\n\
             \x20 - name: gold\n{group}\
             \x20   limit_keys: [\"header:x-api-key\"]\n\
             \x20   match: {{\"header:x-plan\": gold}}\n\
             \x20   algorithm: token_bucket\n\
             \x20   algorithm_config: {{rps: 100}}\n\
             \x20 - name: free\n{group}\
             \x20   limit_keys: [\"header:x-api-key\"]\n\
             \x20   algorithm: token_bucket\n\
             \x20   algorithm_config: {{rps: 1}}\n"
        )
    };
    let p = Policy::from_str(&tiers(""), "p.yaml").unwrap();
    let w: Vec<_> = p
        .warnings()
        .iter()
        .filter(|w| w.message.contains("group"))
        .collect();
    assert_eq!(w.len(), 1, "{:?}", p.warnings());
    // At the catch-all's name, naming both rules.
    assert_eq!((w[0].line, w[0].column), (7, 11), "{}", w[0]);
    assert_eq!(
        w[0].message,
        "rule `free` has no `match` and the same limit_keys as rule `gold` above, so it also \
         limits every request that `gold` matches; if they are tiers, give both the same \
         `group`, and only the first that matches applies"
    );

    let p = Policy::from_str(&tiers("    group: tier\n"), "p.yaml").unwrap();
    assert!(
        p.warnings().iter().all(|w| !w.message.contains("group")),
        "{:?}",
        p.warnings()
    );
}

#[test]
fn of_a_group_only_the_first_rule_whose_match_holds_applies() {
    let p = Policy::from_str(
        r#"
rules:
  - {name: gold, group: tier, limit_keys: [], match: {"header:x-plan": gold}, algorithm: token_bucket, algorithm_config: {rps: 100}}
  - {name: silver, group: tier, limit_keys: [], match: {"header:x-plan": silver}, algorithm: token_bucket, algorithm_config: {rps: 10}}
  - {name: free, group: tier, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1}}
  - {name: everyone, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1000}}
  - {name: per-path, group: paths, limit_keys: [path], algorithm: token_bucket, algorithm_config: {rps: 5}}
"#,
        "p.yaml",
    )
    .unwrap();
    let applied = |plan: &str| {
        let req = RequestParts::new("GET", "/").with_header("x-plan", plan);
        p.matching(&req)
            .map(|h| h.rule.name().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(applied("gold"), ["gold", "everyone", "per-path"]);
    assert_eq!(applied("silver"), ["silver", "everyone", "per-path"]);
    assert_eq!(applied("bronze"), ["free", "everyone", "per-path"]);
}

#[test]
fn a_fixed_window_opens_on_the_calendar_in_its_time_zone() {
    let month = Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap();
    assert_eq!(
        algorithm(
            "fixed_window",
            "{rate: 100000, calendar: month, timezone: Europe/Berlin, max_reserved: 500}"
        ),
        FixedWindow::on_calendar(100_000.0, month)
            .unwrap()
            .with_max_reserved(500.0)
            .unwrap()
            .into()
    );
    let Algorithm::FixedWindow(w) = algorithm("fixed_window", "{rate: 3, calendar: week}") else {
        panic!()
    };
    assert_eq!(w.calendar(), Some(Calendar::utc(CalendarUnit::Week)));
    assert_eq!(w.calendar().unwrap().zone_name(), "UTC");
    assert_eq!(w.period(), CalendarUnit::Week.nominal());
}

/// Every policy the README and the docs show in a `yaml` block parses (a
/// block that is a list of rules, as a fragment, under `rules:`), warnings
/// and all, so that no page shows a field that does not exist.
#[test]
fn every_policy_the_docs_show_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut pages = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut blocks = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "```yaml" {
                continue;
            }
            let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            let first = block.first().copied().unwrap_or_default();
            let yaml = if first.starts_with("- ") {
                let indented: Vec<String> = block.iter().map(|l| format!("  {l}")).collect();
                format!("rules:\n{}\n", indented.join("\n"))
            } else if first.trim_start().starts_with("- ") {
                format!("rules:\n{}\n", block.join("\n"))
            } else {
                block.join("\n")
            };
            if let Err(e) = Policy::from_str(&yaml, "block.yaml") {
                panic!(
                    "{}: a policy that does not parse: {e}\n{yaml}",
                    page.display()
                );
            }
            blocks += 1;
        }
    }
    assert!(blocks >= 5, "only {blocks} policies found in the docs");
}
