//! Applying rules to requests: conditions, keys and costs.

// Helpers shared by the tests are not `#[test]` functions, so clippy's
// allow-*-in-tests settings do not reach them.
#![allow(clippy::unwrap_used, clippy::panic)]

use sluice_policy::{Policy, Request, RequestParts};

/// A policy of one rule per `(name, limit_keys, match, extra algorithm_config)`.
fn policy(rules: &[(&str, &str, &str, &str)]) -> Policy {
    let mut text = String::from("rules:\n");
    for (name, keys, conditions, extra) in rules {
        text.push_str(&format!(
            "  - name: {name}\n    limit_keys: {keys}\n    match: {conditions}\n    \
             algorithm: token_bucket\n    algorithm_config: {{rps: 100{extra}}}\n"
        ));
    }
    Policy::from_str(&text, "p.yaml").unwrap_or_else(|e| panic!("{e}"))
}

/// The names of the rules that apply to `req`, with their keys.
fn hits(p: &Policy, req: &RequestParts) -> Vec<(String, String)> {
    p.matching(req)
        .map(|h| (h.rule.name().to_owned(), h.key))
        .collect()
}

fn names(p: &Policy, req: &RequestParts) -> Vec<String> {
    hits(p, req).into_iter().map(|(n, _)| n).collect()
}

fn get(path: &str) -> RequestParts {
    RequestParts::new("GET", path)
}

#[test]
fn composite_keys_do_not_collide() {
    let p = policy(&[("pair", "['header:a', 'header:b']", "{}", "")]);
    let one = get("/").with_header("a", "a:b").with_header("b", "c");
    let two = get("/").with_header("a", "a").with_header("b", "b:c");
    let k1 = &hits(&p, &one)[0].1;
    let k2 = &hits(&p, &two)[0].1;
    assert_eq!(k1, "3:a:b1:c");
    assert_eq!(k2, "1:a3:b:c");
    // Values that look like an encoding do not fool it either.
    let three = get("/").with_header("a", "1:a").with_header("b", "");
    let four = get("/").with_header("a", "").with_header("b", "1:a");
    assert_ne!(hits(&p, &three)[0].1, hits(&p, &four)[0].1);
}

#[test]
fn key_parts_of_every_kind() {
    let keys = "[ip:address, method, path, 'query:tenant', 'header:x-api-key']";
    let p = policy(&[("all", keys, "{}", "")]);
    let req = RequestParts::new("POST", "/v1/chat")
        .with_ip("2001:0db8:0000::0001".parse().unwrap())
        .with_header("X-Api-Key", "k-1")
        .with_query("tenant=acme");
    assert_eq!(
        hits(&p, &req)[0].1,
        "13:2001:db8::/644:POST8:/v1/chat4:acme3:k-1"
    );
}

#[test]
fn ipv4_mapped_addresses_share_the_ipv4_key() {
    let p = policy(&[("per-ip", "[ip:address]", "{}", "")]);
    let v4 = get("/").with_ip("192.0.2.1".parse().unwrap());
    let mapped = get("/").with_ip("::ffff:192.0.2.1".parse().unwrap());
    assert_eq!(hits(&p, &v4), hits(&p, &mapped));
    assert_eq!(hits(&p, &v4)[0].1, "9:192.0.2.1");
}

#[test]
fn ipv6_clients_are_keyed_by_their_64_unless_the_policy_says_otherwise() {
    let p = policy(&[("per-ip", "[ip:address]", "{}", "")]);
    let key = |p: &Policy, ip: &str| hits(p, &get("/").with_ip(ip.parse().unwrap()))[0].1.clone();
    // One client rotating through the addresses of its /64 has one bucket.
    let home = key(&p, "2001:db8:aa:bb::1");
    assert_eq!(home, "19:2001:db8:aa:bb::/64");
    assert_eq!(key(&p, "2001:db8:aa:bb:ffff:ffff:ffff:ffff"), home);
    // The next /64 is another client.
    assert_ne!(key(&p, "2001:db8:aa:bc::1"), home);
    // IPv4 is as it was.
    assert_eq!(key(&p, "192.0.2.1"), "9:192.0.2.1");

    let text = |prefix: u8| {
        format!(
            "ipv6_prefix: {prefix}
rules: [{{name: per-ip, limit_keys: [ip:address], \
             algorithm: token_bucket, algorithm_config: {{rps: 1}}}}]
"
        )
    };
    let wide = Policy::from_str(&text(48), "p.yaml").unwrap();
    assert_eq!(
        key(&wide, "2001:db8:aa:bb::1"),
        key(&wide, "2001:db8:aa:ff::1")
    );
    let each = Policy::from_str(&text(128), "p.yaml").unwrap();
    assert_eq!(key(&each, "2001:db8:aa:bb::1"), "17:2001:db8:aa:bb::1");
    assert_ne!(
        key(&each, "2001:db8:aa:bb::2"),
        key(&each, "2001:db8:aa:bb::1")
    );
}

#[test]
fn empty_limit_keys_share_one_bucket() {
    let p = policy(&[("global", "[]", "{}", "")]);
    assert_eq!(hits(&p, &get("/a")), [("global".to_owned(), String::new())]);
    assert_eq!(hits(&p, &get("/b")), hits(&p, &get("/a")));
}

#[test]
fn missing_key_part_skips_the_rule() {
    let p = policy(&[
        ("per-ip", "[ip:address]", "{}", ""),
        ("per-key", "['header:x-api-key']", "{}", ""),
        ("per-tenant", "['query:tenant']", "{}", ""),
    ]);
    assert_eq!(names(&p, &get("/")), Vec::<String>::new());
    let req = get("/").with_ip([10, 0, 0, 1].into());
    assert_eq!(names(&p, &req), ["per-ip"]);
    let req = get("/").with_header("x-api-key", "k").with_query("other=1");
    assert_eq!(names(&p, &req), ["per-key"]);
}

#[test]
fn header_names_ignore_case() {
    let p = policy(&[(
        "per-key",
        "['header:X-Api-Key']",
        "{'header:X-Tier': free}",
        "",
    )]);
    let req = get("/")
        .with_header("x-API-key", "k1")
        .with_header("X-TIER", "free");
    assert_eq!(hits(&p, &req), [("per-key".to_owned(), "2:k1".to_owned())]);
    // Values, unlike names, are compared exactly.
    let req = get("/")
        .with_header("x-api-key", "k1")
        .with_header("x-tier", "Free");
    assert!(hits(&p, &req).is_empty());
}

#[test]
fn query_values_are_decoded() {
    let p = policy(&[(
        "per-tenant",
        "['query:tenant']",
        "{'query:plan': pro plus}",
        "",
    )]);
    let encoded = get("/").with_query("plan=pro%20plus&tenant=acme%2Fcorp");
    let plus = get("/").with_query("tenant=acme/corp&plan=pro+plus");
    assert_eq!(
        hits(&p, &encoded),
        [("per-tenant".to_owned(), "9:acme/corp".to_owned())]
    );
    assert_eq!(hits(&p, &plus), hits(&p, &encoded));
    // The first value of a repeated parameter counts.
    let repeated = get("/").with_query("tenant=a&tenant=b&plan=pro+plus");
    assert_eq!(hits(&p, &repeated)[0].1, "1:a");
    assert_eq!(
        get("/").with_query("?x=%E2%9C%93").query("x").as_deref(),
        Some("\u{2713}")
    );
}

#[test]
fn cost_from_a_header_falls_back_to_default_cost() {
    let p = policy(&[(
        "llm",
        "[]",
        "{}",
        ", burst: 1000, cost_source: 'header:X-Tokens', default_cost: 3",
    )]);
    let cost = |value: Option<&str>| {
        let mut req = get("/");
        if let Some(v) = value {
            req = req.with_header("x-tokens", v);
        }
        p.matching(&req).next().unwrap().cost
    };
    for bad in [
        "abc", "-1", "0", "-0", "NaN", "inf", "-inf", "infinity", "", "1e400",
    ] {
        assert_eq!(cost(Some(bad)), 3.0, "{bad:?}");
    }
    assert_eq!(cost(None), 3.0);
    assert_eq!(cost(Some("2.5")), 2.5);
    assert_eq!(cost(Some(" 7 ")), 7.0);
    // Above the burst: passed on for the store to report.
    assert_eq!(cost(Some("5000")), 5000.0);
}

#[test]
fn cost_from_a_query_parameter_and_fixed_cost() {
    let p = policy(&[
        ("q", "[]", "{}", ", burst: 10, cost_source: 'query:n'"),
        ("fixed", "[]", "{}", ", fixed_cost: 4"),
    ]);
    let costs = |req: &RequestParts| p.matching(req).map(|h| h.cost).collect::<Vec<_>>();
    assert_eq!(costs(&get("/").with_query("n=2.5")), [2.5, 4.0]);
    assert_eq!(costs(&get("/").with_query("n=abc")), [1.0, 4.0]);
    assert_eq!(costs(&get("/")), [1.0, 4.0]);
}

#[test]
fn path_exact_versus_prefix() {
    let p = policy(&[
        ("exact", "[]", "{path: /api}", ""),
        ("prefix", "[]", "{path_prefix: /api}", ""),
    ]);
    assert_eq!(names(&p, &get("/api")), ["exact", "prefix"]);
    assert_eq!(names(&p, &get("/api/items")), ["prefix"]);
    assert_eq!(names(&p, &get("/apiary")), ["prefix"]);
    assert_eq!(names(&p, &get("/API")), Vec::<String>::new());
    assert_eq!(names(&p, &get("/v1/api")), Vec::<String>::new());
}

#[test]
fn method_host_header_and_query_conditions() {
    let p = policy(&[
        ("post", "[]", "{method: POST}", ""),
        ("host", "[]", "{host: api.example.com}", ""),
        ("beta", "[]", "{'header:x-beta': '1'}", ""),
        ("debug", "[]", "{'query:debug': 'true'}", ""),
    ]);
    assert_eq!(names(&p, &RequestParts::new("POST", "/")), ["post"]);
    assert_eq!(
        names(&p, &RequestParts::new("post", "/")),
        Vec::<String>::new()
    );
    assert_eq!(names(&p, &get("/").with_host("api.example.com")), ["host"]);
    // Without an explicit host, the Host header is used.
    assert_eq!(
        names(&p, &get("/").with_header("Host", "api.example.com")),
        ["host"]
    );
    assert_eq!(
        names(&p, &get("/").with_host("example.com")),
        Vec::<String>::new()
    );
    assert_eq!(names(&p, &get("/").with_header("X-Beta", "1")), ["beta"]);
    assert_eq!(
        names(&p, &get("/").with_header("X-Beta", "2")),
        Vec::<String>::new()
    );
    assert_eq!(names(&p, &get("/").with_query("debug=true")), ["debug"]);
    assert_eq!(
        names(&p, &get("/").with_query("debug=1")),
        Vec::<String>::new()
    );
}

#[test]
fn all_conditions_must_hold() {
    let p = policy(&[(
        "strict",
        "[]",
        "{method: POST, path_prefix: /api/, 'header:x-tier': free, 'query:v': '2'}",
        "",
    )]);
    let full = RequestParts::new("POST", "/api/send")
        .with_header("x-tier", "free")
        .with_query("v=2");
    assert_eq!(names(&p, &full), ["strict"]);
    let mut wrong_method = full.clone();
    wrong_method.method = "GET".into();
    let mut wrong_path = full.clone();
    wrong_path.path = "/web/send".into();
    let mut no_header = full.clone();
    no_header.headers.clear();
    let mut wrong_query = full.clone();
    wrong_query.query = "v=3".into();
    for req in [wrong_method, wrong_path, no_header, wrong_query] {
        assert!(names(&p, &req).is_empty(), "{req:?}");
    }
}

#[test]
fn hits_come_in_file_order_with_indices() {
    let p = policy(&[
        ("c", "[]", "{}", ""),
        ("a", "[]", "{method: PUT}", ""),
        ("b", "[path]", "{}", ""),
    ]);
    let req = get("/x");
    let got: Vec<_> = p.matching(&req).map(|h| (h.index, h.rule.name())).collect();
    assert_eq!(got, [(0, "c"), (2, "b")]);
}

#[test]
fn the_example_policy_routes_requests() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/policy.yaml");
    let p = Policy::from_path(path.as_ref()).unwrap();
    let login = RequestParts::new("POST", "/login").with_ip([203, 0, 113, 9].into());
    let got: Vec<_> = p.matching(&login).map(|h| (h.rule.name(), h.key)).collect();
    assert_eq!(
        got,
        [
            ("per-ip", "11:203.0.113.9".to_owned()),
            ("login-shadow", "11:203.0.113.96:/login".to_owned()),
        ]
    );
}

/// The attack from the hardening review: the trusted proxy keeps
/// `X-Forwarded-For`, and a client adds a `Forwarded` of its own that
/// disagrees. Without a header named, neither is believed and the request
/// is keyed on the proxy's address, a bucket every unattributable client
/// shares; with the header named, the client's addition is not read.
#[test]
fn a_client_cannot_push_its_requests_onto_its_proxys_bucket_once_the_header_is_named() {
    use std::net::IpAddr;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let request = RequestParts::new("GET", "/")
        .with_ip(ip("10.0.0.1"))
        .with_header("x-forwarded-for", "192.0.2.7")
        .with_header("forwarded", "for=_hidden");
    let both = Policy::from_str("trusted_proxies: [10.0.0.0/8]", "p.yaml").unwrap();
    assert_eq!(
        request
            .clone()
            .with_client_behind(both.trusted_proxies())
            .ip(),
        Some(ip("10.0.0.1"))
    );
    assert_eq!(both.warnings().len(), 1, "{:?}", both.warnings());
    let named = Policy::from_str(
        "trusted_proxies: {cidrs: [10.0.0.0/8], header: X-Forwarded-For}",
        "p.yaml",
    )
    .unwrap();
    assert!(named.warnings().is_empty());
    assert_eq!(
        request.with_client_behind(named.trusted_proxies()).ip(),
        Some(ip("192.0.2.7"))
    );
    let forwarded_only = Policy::from_str(
        "trusted_proxies: {cidrs: [10.0.0.0/8], header: forwarded}",
        "p.yaml",
    )
    .unwrap();
    let via = RequestParts::new("GET", "/")
        .with_ip(ip("10.0.0.1"))
        .with_header("x-forwarded-for", "198.51.100.1")
        .with_header("forwarded", "for=192.0.2.8");
    assert_eq!(
        via.with_client_behind(forwarded_only.trusted_proxies())
            .ip(),
        Some(ip("192.0.2.8"))
    );
    let err = Policy::from_str(
        "trusted_proxies: {cidrs: [10.0.0.0/8], header: x-real-ip}",
        "p.yaml",
    )
    .unwrap_err();
    assert_eq!((err.line, err.column), (1, 48), "{err}");
    assert!(err.message.contains("not a forwarding header"), "{err}");
    let err = Policy::from_str("trusted_proxies: {cidrs: [10.0.0.0/33]}", "p.yaml").unwrap_err();
    assert_eq!((err.line, err.column), (1, 27), "{err}");
}
