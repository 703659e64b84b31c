//! What the unit tests of the `jwt` module share: the key fixtures under
//! `tests/fixtures/jwt`, verifiers loaded beside them, and signed tokens.

use std::path::{Path, PathBuf};

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::Value;

use super::JwtVerifier;

/// The time tokens are checked at, so that no verdict depends on the clock.
pub(super) const NOW: u64 = 1_700_000_000;
pub(super) const SECRET: &str = "test-secret-test-secret-test-secret";

/// The folder of key fixtures, where a test's policy file is taken to be.
pub(super) fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jwt")
}

pub(super) fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(dir().join(name)).unwrap()
}

/// A verifier from a `jwt` section whose paths are relative to the fixtures.
pub(super) fn verifier(yaml: &str) -> JwtVerifier {
    JwtVerifier::from_str(yaml, dir().join("policy.yaml")).unwrap()
}

/// A verifier with the one HS256 key [`SECRET`].
pub(super) fn hs_verifier() -> JwtVerifier {
    verifier(&format!("keys: [{{alg: HS256, secret: {SECRET}}}]"))
}

/// The position and message of the error a `jwt` section fails to load with.
pub(super) fn err(yaml: &str) -> (usize, usize, String) {
    let e = JwtVerifier::from_str(yaml, dir().join("policy.yaml")).unwrap_err();
    (e.line, e.column, e.message)
}

pub(super) fn hs(secret: &str) -> EncodingKey {
    EncodingKey::from_secret(secret.as_bytes())
}

pub(super) fn rsa(name: &str) -> EncodingKey {
    EncodingKey::from_rsa_pem(&fixture(name)).unwrap()
}

pub(super) fn ec(name: &str) -> EncodingKey {
    EncodingKey::from_ec_pem(&fixture(name)).unwrap()
}

pub(super) fn sign(alg: Algorithm, kid: Option<&str>, claims: &Value, key: &EncodingKey) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    encode(&header, claims, key).unwrap()
}
