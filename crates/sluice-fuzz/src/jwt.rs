use std::sync::OnceLock;

use sluice_policy::{Claims, JwtVerifier};

/// The time tokens are checked at, so that a verdict never depends on when
/// the fuzzer runs (2023-11-14).
const NOW: u64 = 1_700_000_000;

const ISSUER: &str = "https://issuer.example";

/// Two HS256 keys, one named by `kid`, with an issuer, an audience and a
/// leeway, read from the `authorization` header (`Bearer <token>`) or from a
/// header that holds the bare token.
const CONFIG: &str = r#"
issuer: https://issuer.example
audience: sluice
leeway: 30
keys:
  - {alg: HS256, kid: fuzz-1, secret: "fuzzing-secret-of-at-least-32-bytes!"}
  - {alg: HS256, secret: "another-fuzzing-secret-32-bytes-long"}
"#;

/// Reads a token from a header value with [`JwtVerifier::token_from_header`]
/// and verifies it with [`JwtVerifier::verify_at`] at a fixed time; the whole
/// input (lossily decoded as UTF-8) is also verified as a bare token and read
/// as claims JSON.
///
/// Checks that nothing panics; that a token taken from a header is a
/// non-empty part of it without whitespace; and that claims only come back
/// from a token that names the configured issuer.
pub fn jwt(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (bearer, bare) = verifiers();
    for verifier in [bearer, bare] {
        if let Some(token) = verifier.token_from_header(&text) {
            assert!(!token.is_empty(), "an empty token from {text:?}");
            assert!(
                !token.contains(char::is_whitespace),
                "{token:?} holds a space"
            );
            assert!(text.contains(token), "{token:?} is not part of {text:?}");
            check(verifier.verify_at(token, NOW));
        }
    }
    check(bearer.verify_at(&text, NOW));
    if let Some(claims) = Claims::from_verified_json(&text) {
        for name in [
            "sub",
            "org.id",
            "a.b.c",
            ".",
            "a..b",
            "https://example.com/roles",
        ] {
            let _ = claims.get(name);
        }
    }
}

fn check(claims: Option<Claims>) {
    if let Some(claims) = claims {
        assert_eq!(claims.get("iss").as_deref(), Some(ISSUER), "{claims:?}");
    }
}

fn verifiers() -> &'static (JwtVerifier, JwtVerifier) {
    static VERIFIERS: OnceLock<(JwtVerifier, JwtVerifier)> = OnceLock::new();
    VERIFIERS.get_or_init(|| {
        let load =
            |text: &str| JwtVerifier::from_str(text, "jwt.yaml").expect("a valid jwt section");
        (load(CONFIG), load(&format!("header: X-Token\n{CONFIG}")))
    })
}
