use sluice_engine::Verified;
use sluice_policy::{Policy, RequestParts};

/// Parses `data` (lossily decoded as UTF-8) as a policy file with
/// [`Policy::from_str`], YAML or JSON alike.
///
/// Checks that parsing never panics; that an error's line lies inside the
/// text; and that a policy that loads can be used: a few typical requests
/// and Envoy descriptors are matched against its rules and their keys and
/// costs computed, with claims from its `jwt` section where it has one.
pub fn policy(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match Policy::from_str(&text, "fuzz.yaml") {
        Ok(policy) => exercise(&policy),
        Err(e) => {
            // YAML 1.1 counts NEL, LS and PS as line breaks too, and a lone
            // CR; any of them may have moved the parser to a new line.
            let breaks = text
                .chars()
                .filter(|c| matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}'))
                .count();
            assert!(
                e.line <= breaks + 1,
                "error line {} beyond the text's {} lines: {e}",
                e.line,
                breaks + 1
            );
            assert!(!e.to_string().is_empty());
        }
    }
}

fn exercise(policy: &Policy) {
    let requests = [
        RequestParts::new("GET", "/"),
        RequestParts::new("POST", "/api/export")
            .with_ip([203, 0, 113, 9].into())
            .with_host("api.example")
            .with_query("tenant=acme&n=3&tenant=other")
            .with_header("x-api-key", "k1")
            .with_header("x-request-cost", "2.5")
            .with_header("authorization", "Bearer a.b.c"),
        RequestParts::new("GET", "/login")
            .with_ip("2001:db8::1".parse().expect("a literal address"))
            .with_claim("sub", "u1"),
    ];
    for req in &requests {
        let verified = Verified::new(req, policy);
        for hit in policy.matching(&verified) {
            assert!(hit.cost.is_finite() && hit.cost >= 0.0, "cost {}", hit.cost);
        }
    }
    let descriptor = RequestParts::default()
        .with_descriptor("remote_address", "192.0.2.1")
        .with_descriptor("user", "u1");
    for rule in policy.rules() {
        if let Some(domain) = rule.domain() {
            policy.matching_domain(domain, &descriptor).for_each(drop);
        }
    }
}
