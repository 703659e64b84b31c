//! Every rejected policy names the line and column of the value at fault.

// Helpers shared by the tests are not `#[test]` functions, so clippy's
// allow-*-in-tests settings do not reach them.
#![allow(clippy::unwrap_used, clippy::panic)]

use sluice_policy::{Policy, PolicyError};

fn err(text: &str) -> PolicyError {
    match Policy::from_str(text, "policy.yaml") {
        Ok(_) => panic!("policy should have been rejected:\n{text}"),
        Err(e) => e,
    }
}

/// Asserts the position and that the message contains `needle`.
#[track_caller]
fn assert_err(text: &str, line: usize, column: usize, needle: &str) {
    let e = err(text);
    assert_eq!((e.line, e.column), (line, column), "{e}");
    assert!(
        e.message.contains(needle),
        "{e:?} should mention {needle:?}"
    );
    assert_eq!(
        e.to_string(),
        format!("policy.yaml:{line}:{column}: {}", e.message)
    );
}

/// A one-rule policy whose `algorithm_config` block is `config` (6-space indented lines).
fn rule(algorithm: &str, config: &str) -> String {
    format!(
        "rules:\n  - name: r\n    limit_keys: [ip:address]\n    algorithm: {algorithm}\n    \
         algorithm_config:\n{config}"
    )
}

#[test]
fn malformed_yaml() {
    assert_err(
        "rules:\n  - name: r\n    limit_keys: [ip:address\n",
        3,
        17,
        "unclosed bracket",
    );
    assert_err("rules: [\n  {name: r,\n", 2, 3, "unclosed bracket '{'");
}

#[test]
fn wrong_type() {
    let text = rule("token_bucket", "      rate: fast\n");
    assert_err(&text, 6, 13, r#"expected a number, got "fast""#);
    assert_err(
        "rules:\n  - name: r\n    limit_keys: ip:address\n",
        3,
        17,
        "expected sequence start",
    );
}

#[test]
fn negative_or_zero_rate() {
    let text = rule("token_bucket", "      rate: -5\n");
    assert_err(&text, 6, 13, "`rate` must be a positive number, got -5");
    let text = rule("fixed_window", "      rps: 0\n");
    assert_err(&text, 6, 12, "`rps` must be a positive number, got 0");
    let text = rule("token_bucket", "      rate: 1\n      period: -1\n");
    assert_err(&text, 7, 15, "`period` must be positive");
    let text = rule("token_bucket", "      rate: 1\n      period: 0s\n");
    assert_err(&text, 7, 15, "`period` must be positive");
}

#[test]
fn non_finite_numbers_are_rejected() {
    let text = rule("token_bucket", "      rps: .inf\n");
    assert_err(&text, 6, 12, "non-finite");
    let text = rule("token_bucket", "      rps: 1\n      burst: .nan\n");
    assert_err(&text, 7, 14, "non-finite");
}

#[test]
fn unknown_top_level_field() {
    assert_err(
        "store: {kind: memory}\nrulez: []\n",
        2,
        1,
        "unknown field `rulez`",
    );
}

#[test]
fn unknown_field_in_algorithm_config() {
    let text = rule("token_bucket", "      rps: 5\n      burts: 10\n");
    assert_err(&text, 7, 7, "unknown field `burts`");
}

#[test]
fn unknown_field_in_rule_and_limit() {
    assert_err(
        "rules:\n  - name: r\n    limit_key: []\n",
        3,
        5,
        "unknown field `limit_key`",
    );
    assert_err(
        "limits:\n  a:\n    algorithm: token_bucket\n    limit_keys: []\n",
        4,
        5,
        "unknown field `limit_keys`",
    );
}

/// A complete one-rule policy whose rule ends with `rest` (4-space indented lines).
fn rule_with(rest: &str) -> String {
    format!(
        "rules:\n  - name: r\n    algorithm: token_bucket\n    algorithm_config: {{rps: 1}}\n\
         {rest}"
    )
}

#[test]
fn unknown_limit_key_kind() {
    for (rest, line, column, message) in [
        (
            "    limit_keys:\n      - ip:address\n      - cookie:session\n",
            7,
            9,
            "unknown limit key `cookie:session`",
        ),
        (
            "    limit_keys: [ip:address, 'jwt:']\n",
            5,
            30,
            "a name is missing after `jwt:`",
        ),
        (
            "    limit_keys: ['descriptor:']\n",
            5,
            18,
            "a name is missing after `descriptor:`",
        ),
        (
            "    limit_keys: [ip:port]\n",
            5,
            18,
            "unknown limit key `ip:port`",
        ),
        (
            "    limit_keys: ['header:']\n",
            5,
            18,
            "header name is missing",
        ),
        (
            "    limit_keys: ['header:x api']\n",
            5,
            18,
            "not a valid header name",
        ),
    ] {
        assert_err(&rule_with(rest), line, column, message);
    }
}

#[test]
fn unknown_match_condition() {
    for (rest, line, column, message) in [
        (
            "    limit_keys: []\n    match:\n      path: /a\n      cookie:x: y\n",
            8,
            7,
            "unknown match condition `cookie:x`",
        ),
        (
            "    limit_keys: []\n    match: {'jwt:': x}\n",
            6,
            13,
            "a name is missing after `jwt:`",
        ),
        (
            "    limit_keys: []\n    match: {'descriptor:': x}\n",
            6,
            13,
            "a name is missing after `descriptor:`",
        ),
    ] {
        assert_err(&rule_with(rest), line, column, message);
    }
}

#[test]
fn missing_required_field() {
    // The parser places it at the end of the rule's mapping.
    assert_err(
        "rules:\n  - name: r\n    limit_keys: []\n",
        3,
        5,
        "missing field `algorithm`",
    );
}

#[test]
fn duplicate_rule_name() {
    let one = "    limit_keys: []\n    algorithm: token_bucket\n    algorithm_config: {rps: 1}\n";
    let text = format!("rules:\n  - name: same\n{one}  - name: other\n{one}  - name: same\n{one}");
    assert_err(
        &text,
        10,
        11,
        "duplicate rule name `same`; it is first used at line 2, column 11",
    );
}

#[test]
fn duplicate_limit_name() {
    let text = "limits:\n  a: {algorithm: token_bucket, algorithm_config: {rps: 1}}\n  \
                a: {algorithm: token_bucket, algorithm_config: {rps: 2}}\n";
    assert_err(text, 3, 3, "duplicate mapping key");
}

#[test]
fn rule_and_limit_names_share_a_namespace() {
    let text = "limits:\n  a: {algorithm: token_bucket, algorithm_config: {rps: 1}}\nrules:\n  \
                - {name: a, limit_keys: [], algorithm: token_bucket, algorithm_config: {rps: 1}}\n";
    assert_err(
        text,
        4,
        12,
        "rule name `a` is already the name of a limit at line 2, column 3",
    );
}

#[test]
fn empty_rule_name() {
    let text = "rules:\n  - {name: '', limit_keys: [], algorithm: token_bucket, \
                algorithm_config: {rps: 1}}\n";
    assert_err(text, 2, 12, "must not be empty");
}

#[test]
fn burst_smaller_than_fixed_cost() {
    let text = rule(
        "token_bucket",
        "      rps: 5\n      burst: 1\n      fixed_cost: 2\n",
    );
    assert_err(
        &text,
        7,
        14,
        "`burst` 1 is less than the rule's fixed_cost 2: no request could ever pass",
    );
    // With a header cost the baseline is default_cost.
    let text = rule(
        "token_bucket",
        "      rps: 5\n      burst: 3\n      cost_source: header:x-cost\n      default_cost: 4\n",
    );
    assert_err(&text, 7, 14, "less than the rule's default_cost 4");
    // The default burst is the rate, so the rate is to blame.
    let text = rule("token_bucket", "      rps: 0.5\n");
    assert_err(
        &text,
        6,
        12,
        "the burst (by default the `rps`) 0.5 is less than",
    );
    let text = rule("fixed_window", "      rate: 10\n      capacity: 0\n");
    assert_err(
        &text,
        7,
        17,
        "`capacity` 0 is less than the rule's fixed_cost 1",
    );
}

#[test]
fn shards_that_leave_too_little_per_shard() {
    let text = rule(
        "token_bucket",
        "      rps: 8\n      burst: 4\n      shards: 8\n",
    );
    assert_err(
        &text,
        7,
        14,
        "`burst` 4 split over 8 shards leaves 0.5 per shard",
    );
    let text = rule("token_bucket", "      rps: 8\n      shards: 0\n");
    assert_err(&text, 7, 15, "shards must be at least 1");
}

#[test]
fn period_with_rps() {
    let text = rule("token_bucket", "      rps: 5\n      period: 60\n");
    assert_err(&text, 7, 15, "`period` cannot be combined with `rps`");
    let text = rule(
        "fixed_window",
        "      tokens_per_second: 5\n      period: 1m\n",
    );
    assert_err(
        &text,
        7,
        15,
        "`period` cannot be combined with `tokens_per_second`",
    );
}

#[test]
fn two_ways_of_giving_the_rate() {
    let text = rule("token_bucket", "      rps: 5\n      rate: 5\n");
    assert_err(
        &text,
        7,
        13,
        "`rate` and `rps` both set the rate; give only one of them",
    );
    let text = rule("token_bucket", "      {tokens_per_second: 5, rps: 5}\n");
    assert_err(
        &text,
        6,
        35,
        "`rps` and `tokens_per_second` both set the rate",
    );
    let text = rule("token_bucket", "      burst: 5\n");
    assert_err(&text, 6, 7, "algorithm_config needs a rate");
}

#[test]
fn burst_and_capacity_conflicts() {
    let text = rule(
        "token_bucket",
        "      rps: 5\n      burst: 5\n      capacity: 6\n",
    );
    assert_err(&text, 8, 17, "`capacity` and `burst` both set the burst");
    let text = rule("fixed_window", "      rps: 5\n      burst: 5\n");
    assert_err(
        &text,
        7,
        14,
        "a fixed_window has no `burst`; use `capacity`",
    );
    let text = rule("token_bucket", "      rps: 5\n      start: 0\n");
    assert_err(&text, 7, 14, "`start` aligns fixed windows");
    let text = rule("fixed_window", "      rps: 5\n      start: -1\n");
    assert_err(&text, 7, 14, "`start` must not be negative");
}

#[test]
fn bad_duration_string() {
    let text = rule("fixed_window", "      rate: 5\n      period: 5 parsecs\n");
    assert_err(&text, 7, 15, r#"invalid duration "5 parsecs""#);
    let text = rule("fixed_window", "      rate: 5\n      period: \"\"\n");
    assert_err(&text, 7, 15, "invalid duration");
}

#[test]
fn bad_costs() {
    let text = rule("token_bucket", "      rps: 5\n      fixed_cost: 0\n");
    assert_err(
        &text,
        7,
        19,
        "`fixed_cost` must be a positive number, got 0",
    );
    let text = rule("token_bucket", "      rps: 5\n      default_cost: -2\n");
    assert_err(
        &text,
        7,
        21,
        "`default_cost` must be a positive number, got -2",
    );
    let text = rule(
        "token_bucket",
        "      rps: 5\n      cost_source: body:tokens\n",
    );
    assert_err(&text, 7, 20, "unknown cost_source `body:tokens`");
    let text = "limits:\n  a:\n    algorithm: token_bucket\n    algorithm_config:\n      \
                rps: 5\n      cost_source: header:x-cost\n";
    assert_err(text, 6, 20, "`cost_source` applies to rules");
}

#[test]
fn named_limit_that_never_admits() {
    let text = "limits:\n  a:\n    algorithm: token_bucket\n    algorithm_config:\n      \
                rps: 5\n      burst: 0\n      max_reserved: 0\n";
    assert_err(text, 7, 21, "can never admit anything");
    let text = "limits:\n  a:\n    algorithm: token_bucket\n    algorithm_config:\n      \
                rps: 5\n      max_reserved: -1\n";
    assert_err(text, 6, 21, "`max_reserved` must be a number >= 0, got -1");
}

#[test]
fn bad_enum_values() {
    let text = rule("leaky_bucket", "      rps: 5\n");
    assert_err(&text, 4, 16, "unknown variant `leaky_bucket`");
    let text = "rules:\n  - name: r\n    mode: dry-run\n";
    assert_err(text, 3, 11, "unknown variant `dry-run`");
}

#[test]
fn bad_store() {
    assert_err("store: {kind: disk}\n", 1, 15, "unknown variant `disk`");
    assert_err(
        "store:\n  kind: redis\n",
        2,
        3,
        "a redis store needs a `url`",
    );
    assert_err(
        "store: {kind: redis, url: 'http://x'}\n",
        1,
        27,
        "must start with redis://",
    );
    assert_err(
        "store: {kind: memory, url: 'redis://x'}\n",
        1,
        28,
        "`url` applies to the redis or postgres store only",
    );
    assert_err(
        "store: {kind: postgres, url: 'redis://x'}\n",
        1,
        30,
        "must start with postgres://",
    );
    assert_err(
        "store: {kind: postgres, url: 'postgres://db/app', schema: 'x; drop table t'}\n",
        1,
        59,
        "`schema` must be 1 to 63 lowercase",
    );
    assert_err(
        "store: {kind: redis, url: 'redis://x', durable: false}\n",
        1,
        49,
        "`durable` applies to the postgres store only",
    );
    assert_err("store: {kind: memory, max_keys: 0}\n", 1, 33, "at least 1");
    assert_err("store: {kind: memory, max_keys: -3}\n", 1, 33, "invalid");
}

#[test]
fn json_errors_have_positions() {
    let text = "{\n  \"rules\": [\n    {\"name\": \"r\", \"limit_keys\": [],\n     \
                \"algorithm\": \"token_bucket\",\n     \"algorithm_config\": {\"rps\": -3}}\n  ]\n}\n";
    assert_err(text, 5, 34, "`rps` must be a positive number, got -3");
    let text = "{\n  \"rules\": [],\n  \"limitz\": {}\n}\n";
    assert_err(text, 3, 3, "unknown field `limitz`");
    let text = "{\"rules\": [\n  {\"name\": \"r\", \"limit_keys\": [\"jwt:\"], \
                \"algorithm\": \"fixed_window\", \"algorithm_config\": {\"rps\": 1}}\n]}\n";
    assert_err(text, 2, 32, "a name is missing after `jwt:`");
    assert_err("{\"rules\": [}\n", 1, 11, "mismatched bracket");
}

/// A named limit `l` whose `algorithm_config` is the flow map `config`.
fn named(config: &str) -> String {
    format!("limits:\n  l:\n    algorithm: token_bucket\n    algorithm_config: {config}\n")
}

/// The absurd values a hostile or careless policy held, each refused where
/// it stands.
#[test]
fn absurd_values_are_refused_at_their_position() {
    let cases = [
        // So many shards that a value or reset would walk them for minutes.
        (
            "{rps: 5, shards: 4294967295}",
            40,
            "`shards` must be at most 1024",
        ),
        // Nothing could pass without reserving, and no reservation is bounded.
        (
            "{rps: 5, burst: 0}",
            39,
            "`burst` is 0 and there is no `max_reserved`",
        ),
        // A rate whose one token takes longer than ten years.
        ("{rps: 5e-324}", 29, "one token in ten years"),
        ("{rate: 1, period: 1ns}", 41, "at least 1ms"),
        // Finer than Redis's clock can keep.
        (
            "{rate: 1, period: 1000001ns}",
            41,
            "`period` must be a whole number of microseconds",
        ),
        // More tokens than a double counts exactly.
        ("{rps: 5, burst: 1e300}", 39, "counted exactly"),
        ("{rps: 5, max_reserved: 1e17}", 46, "counted exactly"),
    ];
    for (config, column, needle) in cases {
        assert_err(&named(config), 4, column, needle);
    }
    let window = "limits:\n  l:\n    algorithm: fixed_window\n    \
                  algorithm_config: {rate: 1, period: 1s, start: 1500ns}\n";
    assert_err(
        window,
        4,
        52,
        "`start` must be a whole number of microseconds",
    );
}

#[test]
fn an_ipv6_prefix_that_is_no_prefix_length_is_refused_at_its_position() {
    for bad in ["0", "129", "4294967296"] {
        assert_err(
            &format!("ipv6_prefix: {bad}\n"),
            1,
            14,
            "must be a prefix length from 1 to 128",
        );
    }
    assert_err("ipv6_prefix: /64\n", 1, 14, "invalid u64");
}

#[test]
fn rules_that_could_never_match_as_meant_are_refused() {
    let keyed = |keys: &str, matches: &str| {
        format!(
            "rules:\n  - name: r\n    limit_keys: {keys}\n    match: {matches}\n    \
             algorithm: token_bucket\n    algorithm_config: {{rps: 1}}\n"
        )
    };
    let cases = [
        (
            "[ip:address, path, ip:address]",
            "{}",
            (3, 36),
            "already one of the rule's limit_keys",
        ),
        ("[path]", "{method: GE T}", (4, 13), "not an HTTP method"),
        (
            "[path]",
            "{path_prefix: api/}",
            (4, 13),
            "must start with `/`",
        ),
        ("[path]", "{path: login}", (4, 13), "must start with `/`"),
        // Claims are read only from verified tokens; with no keys to verify
        // them, a jwt: key or match would silently never apply.
        ("[\"jwt:sub\"]", "{}", (3, 18), "no `jwt` section"),
        ("[path]", "{\"jwt:plan\": pro}", (4, 13), "no `jwt` section"),
    ];
    for (keys, matches, (line, column), needle) in cases {
        assert_err(&keyed(keys, matches), line, column, needle);
    }
}

/// What a sliding algorithm has no use for is refused where it is written,
/// and so is a cost it could never admit.
#[test]
fn sliding_algorithms_refuse_what_they_cannot_mean() {
    let cases = [
        (
            "sliding_log",
            "      rate: 5\n      period: 1m\n      burst: 10\n",
            (8, 14),
            "a sliding_log has no `burst`",
        ),
        (
            "sliding_window",
            "      rps: 5\n      capacity: 10\n",
            (7, 17),
            "a sliding_window has no `capacity`",
        ),
        (
            "sliding_window",
            "      rps: 5\n      max_reserved: 3\n",
            (7, 21),
            "a sliding_window takes no reservations",
        ),
        (
            "sliding_log",
            "      rps: 5\n      max_reserved: 0\n",
            (7, 21),
            "a sliding_log takes no reservations",
        ),
        (
            "sliding_log",
            "      rps: 5\n      start: 10s\n",
            (7, 14),
            "a sliding_log has none",
        ),
        (
            "sliding_window",
            "      rps: 5\n      start: -1\n",
            (7, 14),
            "`start` must not be negative",
        ),
        // A fixed or default cost above the rate could never pass.
        (
            "sliding_log",
            "      rate: 5\n      period: 1m\n      fixed_cost: 6\n",
            (6, 13),
            "`rate` 5 is less than the rule's fixed_cost 6",
        ),
        (
            "sliding_window",
            "      rps: 4\n      cost_source: query:n\n      default_cost: 4.5\n",
            (6, 12),
            "`rps` 4 is less than the rule's default_cost 4.5",
        ),
        (
            "sliding_window",
            "      rps: 4\n      shards: 8\n",
            (6, 12),
            "`rps` 4 split over 8 shards leaves 0.5 per shard",
        ),
    ];
    for (algorithm, config, (line, column), needle) in cases {
        assert_err(&rule(algorithm, config), line, column, needle);
    }
}

/// Legal, but almost surely not what was meant: the policy loads, and the
/// warning says where and why.
#[test]
fn likely_mistakes_are_warned_about_with_their_position() {
    let warnings = |text: &str| -> Vec<String> {
        let p = Policy::from_str(text, "policy.yaml").unwrap_or_else(|e| panic!("{e}"));
        p.warnings().iter().map(ToString::to_string).collect()
    };
    let w = warnings(&named("{rps: 5, burst: 0.5, max_reserved: 2}"));
    assert_eq!(
        w,
        [
            "policy.yaml:4:39: warning: `burst` 0.5 is less than 1: a call that costs 1 can never pass"
        ]
    );
    let w = warnings(&named("{rate: 5}"));
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].starts_with("policy.yaml:2:3: warning: limit `l` has no `max_reserved`"));
    assert!(w[0].contains("157680000 tokens"), "{}", w[0]);
    assert!(
        w[1].starts_with("policy.yaml:4:30: warning: `rate` without `period` counts per second")
    );
    let w = warnings(
        "rules:\n  - name: everyone\n    limit_keys: []\n    algorithm: token_bucket\n    \
         algorithm_config: {rps: 1000}\n",
    );
    assert_eq!(
        w,
        [
            "policy.yaml:2:11: warning: rule `everyone` has no limit_keys: every request it matches shares one bucket"
        ]
    );
    // A sliding limit cannot reserve, so it needs no `max_reserved`; a log
    // long enough to be merged is pointed out.
    let sliding = |alg: &str, config: &str| {
        warnings(&format!(
            "limits:\n  l:\n    algorithm: {alg}\n    algorithm_config: {config}\n"
        ))
    };
    assert_eq!(
        sliding("sliding_window", "{rate: 5, period: 1s}"),
        Vec::<String>::new()
    );
    let w = sliding("sliding_log", "{rate: 100000, period: 1h}");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("policy.yaml:4:30: warning: a key of this sliding_log may log 100000"),
        "{}",
        w[0]
    );
    // The bundled example is clean.
    let example = include_str!("../../../examples/policy.yaml");
    assert_eq!(warnings(example), Vec::<String>::new());
}

#[test]
fn penalties_out_of_range_or_finer_than_a_microsecond() {
    for (rest, needle) in [
        ("    limit_keys: []\n    penalty: 0\n", "from 1ms to a year"),
        (
            "    limit_keys: []\n    penalty: 400d\n",
            "from 1ms to a year",
        ),
        (
            "    limit_keys: []\n    penalty: -5\n",
            "from 1ms to a year",
        ),
        (
            "    limit_keys: []\n    penalty: 0.0100000005\n",
            "whole number of microseconds",
        ),
        (
            "    limit_keys: []\n    penalty: soon\n",
            "invalid duration",
        ),
    ] {
        assert_err(&rule_with(rest), 6, 14, needle);
    }
}

#[test]
fn a_penalty_keeps_its_state_name_from_every_other_rule_and_limit() {
    let text = "limits:\n  a: {algorithm: token_bucket, algorithm_config: {rps: 1}, penalty: 1m}\n  \
                'a:penalty': {algorithm: token_bucket, algorithm_config: {rps: 1}}\n";
    assert_err(
        text,
        3,
        3,
        "limit name `a:penalty` is already the name of a penalty state at line 2, column 3",
    );
}

#[test]
fn concurrency_limits_take_whole_slots_and_no_rate() {
    let limit = |config: &str| {
        format!("limits:\n  jobs:\n    algorithm: concurrency\n    algorithm_config: {config}\n")
    };
    assert_err(&limit("{max: 4, shards: 2}"), 4, 40, "no `shards`");
    assert_err(&limit("{max: 1.5}"), 4, 29, "whole number");
    assert_err(&limit("{max: 2, rps: 3}"), 4, 37, "no `rps`");
    assert_err(&limit("{lease: 1s}"), 4, 23, "needs `max`");
    assert_err(&limit("{max: 2, lease: 0.5ms}"), 4, 39, "at least 1ms");
    let text = "rules:\n  - name: r\n    domain: edge\n    limit_keys: []\n    \
                algorithm: concurrency\n    algorithm_config: {max: 2}\n";
    assert_err(text, 3, 13, "cannot answer Envoy");
    let tokens =
        "limits:\n  t:\n    algorithm: token_bucket\n    algorithm_config: {rps: 1, max: 2}\n";
    assert_err(tokens, 4, 37, "belongs to a concurrency limit");
}

#[test]
fn calendar_windows_refuse_what_the_calendar_says_itself() {
    let fixed = |config: &str| rule("fixed_window", config);
    assert_err(
        &fixed("      rate: 10\n      calendar: fortnight\n"),
        7,
        17,
        "calendar must be one of day, week, month, year",
    );
    assert_err(
        &fixed("      rate: 10\n      calendar: day\n      timezone: Europe/Atlantis\n"),
        8,
        17,
        "not in the tz database",
    );
    assert_err(
        &fixed("      rate: 10\n      period: 30d\n      calendar: month\n"),
        7,
        15,
        "`period` cannot be combined with `calendar`",
    );
    assert_err(
        &fixed("      rate: 10\n      start: 0\n      calendar: month\n"),
        7,
        14,
        "`start` cannot be combined with `calendar`",
    );
    assert_err(
        &fixed("      rps: 10\n      calendar: month\n"),
        6,
        12,
        "`rps` cannot be combined with `calendar`",
    );
    assert_err(
        &fixed("      rate: 10\n      timezone: UTC\n"),
        7,
        17,
        "give `calendar`",
    );
    assert_err(
        &fixed("      rate: 10\n      calendar: day\n      capacity: 1000\n"),
        8,
        17,
        "at most 32 times its rate",
    );
    assert_err(
        &rule("token_bucket", "      rps: 10\n      calendar: month\n"),
        7,
        17,
        "only a fixed_window opens on the calendar",
    );
}
