//! The keys of a `jwt` section: shared secrets, PEM public keys and the
//! signing keys of a JWKS document, each read with a size cap and proved
//! usable when the policy loads, never at request time.

use std::collections::HashSet;
use std::fmt;
use std::path::Path;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use serde_saphyr::Spanned;

use super::config::{JwtConfigError, RawJwt, RawJwtKey};

/// RFC 7518 §3.2: an HS256 key must be at least as long as the hash output.
const MIN_HS256_SECRET: usize = 32;

/// One key a token may be verified with.
#[derive(Clone)]
pub(super) struct VerifyKey {
    pub(super) alg: Algorithm,
    pub(super) kid: Option<String>,
    pub(super) key: DecodingKey,
    /// What jsonwebtoken checks: the algorithm and the signature only.
    pub(super) validation: Validation,
}

impl VerifyKey {
    fn new(alg: Algorithm, kid: Option<String>, key: DecodingKey) -> VerifyKey {
        VerifyKey {
            alg,
            kid,
            key,
            validation: signature_only(alg),
        }
    }
}

impl fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("alg", &self.alg)
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

/// Every key of the section: those of `keys`, then those of `jwks_file`.
/// Relative paths are resolved against `base_dir`. Two keys may not share a
/// `kid`, and there must be at least one key.
pub(super) fn load(raw: &RawJwt, base_dir: &Path) -> Result<Vec<VerifyKey>, JwtConfigError> {
    let mut keys = Vec::new();
    let mut kids = HashSet::new();
    for spec in &raw.keys {
        let key = load_key(&spec.value, base_dir)?;
        match &spec.value.kid {
            Some(at) => push_unique(&mut keys, &mut kids, key, at)?,
            None => keys.push(key),
        }
    }
    if let Some(jwks) = &raw.jwks_file {
        for key in load_jwks(jwks, base_dir)? {
            push_unique(&mut keys, &mut kids, key, jwks)?;
        }
    }
    if keys.is_empty() {
        return Err(JwtConfigError::of_section(
            "`jwt` needs at least one key in `keys` or a `jwks_file`; \
             without one no token could ever be verified",
        ));
    }
    Ok(keys)
}

/// Adds `key`, refusing at `at` a `kid` that an earlier key already has:
/// a token naming it could not say which key it means.
fn push_unique(
    keys: &mut Vec<VerifyKey>,
    kids: &mut HashSet<String>,
    key: VerifyKey,
    at: &Spanned<String>,
) -> Result<(), JwtConfigError> {
    if let Some(kid) = &key.kid
        && !kids.insert(kid.clone())
    {
        return Err(JwtConfigError::at(
            at,
            format!("kid {kid:?} names another key too"),
        ));
    }
    keys.push(key);
    Ok(())
}

/// A verification that leaves the registered claims to the verifier:
/// jsonwebtoken checks the algorithm and the signature only.
fn signature_only(alg: Algorithm) -> Validation {
    let mut v = Validation::new(alg);
    v.required_spec_claims = HashSet::new();
    v.validate_exp = false;
    v.validate_nbf = false;
    v.validate_aud = false;
    v.leeway = 0;
    v
}

fn read(path: &Spanned<String>, base_dir: &Path) -> Result<Vec<u8>, JwtConfigError> {
    let full = base_dir.join(&path.value);
    crate::files::read_capped(&full, crate::files::MAX_KEY_FILE_BYTES)
        .map_err(|e| JwtConfigError::at(path, format!("cannot read {}: {e}", full.display())))
}

fn load_key(spec: &RawJwtKey, base_dir: &Path) -> Result<VerifyKey, JwtConfigError> {
    let alg = spec.algorithm()?;
    let kid = spec.key_id()?;
    let key = if alg == Algorithm::HS256 {
        secret_key(spec, base_dir)?
    } else {
        public_key(alg, spec, base_dir)?
    };
    Ok(VerifyKey::new(alg, kid, key))
}

/// The shared secret of an HS256 key, given inline or in a file.
fn secret_key(spec: &RawJwtKey, base_dir: &Path) -> Result<DecodingKey, JwtConfigError> {
    if let Some(p) = spec.pem.as_ref().or(spec.pem_file.as_ref()) {
        return Err(JwtConfigError::at(
            p,
            "HS256 keys are shared secrets: give `secret` or `secret_file`, not a PEM",
        ));
    }
    let secret = match (&spec.secret, &spec.secret_file) {
        (Some(s), None) => s.value.as_bytes().to_vec(),
        (None, Some(path)) => {
            let mut bytes = read(path, base_dir)?;
            // Files written by `echo` or editors end in a newline that is
            // not part of the secret.
            if bytes.ends_with(b"\n") {
                bytes.pop();
                if bytes.ends_with(b"\r") {
                    bytes.pop();
                }
            }
            bytes
        }
        (Some(_), Some(f)) => {
            return Err(JwtConfigError::at(
                f,
                "give `secret` or `secret_file`, not both",
            ));
        }
        (None, None) => {
            return Err(JwtConfigError::at(
                &spec.alg,
                "an HS256 key needs `secret` or `secret_file`",
            ));
        }
    };
    if secret.len() < MIN_HS256_SECRET {
        let at = spec.secret.as_ref().or(spec.secret_file.as_ref());
        let message = format!(
            "an HS256 secret must be at least {MIN_HS256_SECRET} bytes (RFC 7518 §3.2), \
             this one has {}",
            secret.len()
        );
        return Err(match at {
            Some(at) => JwtConfigError::at(at, message),
            None => JwtConfigError::at(&spec.alg, message),
        });
    }
    Ok(DecodingKey::from_secret(&secret))
}

/// The public key of an RS256 or ES256 key, given inline or in a file.
fn public_key(
    alg: Algorithm,
    spec: &RawJwtKey,
    base_dir: &Path,
) -> Result<DecodingKey, JwtConfigError> {
    if let Some(s) = spec.secret.as_ref().or(spec.secret_file.as_ref()) {
        return Err(JwtConfigError::at(
            s,
            format!("{alg:?} keys are public keys: give `pem` or `pem_file`, not a secret"),
        ));
    }
    let (pem, at, what) = match (&spec.pem, &spec.pem_file) {
        (Some(p), None) => (p.value.as_bytes().to_vec(), p, "`pem`".to_owned()),
        (None, Some(f)) => (read(f, base_dir)?, f, f.value.clone()),
        (Some(_), Some(f)) => {
            return Err(JwtConfigError::at(f, "give `pem` or `pem_file`, not both"));
        }
        (None, None) => {
            return Err(JwtConfigError::at(
                &spec.alg,
                format!("an {alg:?} key needs `pem` or `pem_file`"),
            ));
        }
    };
    pem_key(alg, &pem).map_err(|why| JwtConfigError::at(at, format!("{what}: {why}")))
}

/// Parses a public key and proves it usable now, so that a wrong file fails
/// the load instead of silently failing every request.
fn pem_key(alg: Algorithm, pem: &[u8]) -> Result<DecodingKey, String> {
    let (key, kind) = match alg {
        Algorithm::RS256 => (DecodingKey::from_rsa_pem(pem), "an RSA"),
        _ => (DecodingKey::from_ec_pem(pem), "a P-256 EC"),
    };
    let not_public = || {
        format!(
            "not {kind} public key in PEM form (-----BEGIN PUBLIC KEY-----); \
             `openssl pkey -in key.pem -pubout` prints the public key of a private one"
        )
    };
    let key = key.map_err(|_| not_public())?;
    usable(alg, &key).then_some(key).ok_or_else(not_public)
}

/// Whether the crypto backend accepts `key` for `alg`. jsonwebtoken parses
/// keys lazily, at each verification; these calls make it parse now.
fn usable(alg: Algorithm, key: &DecodingKey) -> bool {
    match alg {
        // Converting to a JWK decodes the PKCS#1 public key (and fails for a
        // private key, which `from_rsa_pem` lets through).
        Algorithm::RS256 => Jwk::from_decoding_key(key, Some(alg)).is_ok(),
        // Building an ES256 verifier decodes the curve point; the signature
        // check itself failing is expected and fine.
        _ => jsonwebtoken::crypto::verify("", b"", key, alg).is_ok(),
    }
}

/// The RS256 and ES256 signing keys of a JWKS document. Keys for other uses or
/// algorithms are skipped, since real issuers publish those alongside; a key
/// we would use but cannot decode is an error.
fn load_jwks(path: &Spanned<String>, base_dir: &Path) -> Result<Vec<VerifyKey>, JwtConfigError> {
    let bytes = read(path, base_dir)?;
    let fail = |why: String| JwtConfigError::at(path, format!("{}: {why}", path.value));
    let mut doc: Value =
        serde_json::from_slice(&bytes).map_err(|e| fail(format!("not JSON ({e})")))?;
    // The entries stay JSON until each is read as a key on its own: reading
    // the whole document as a `JwkSet` would refuse it for one entry that
    // jsonwebtoken cannot read, and issuers add new kinds of keys over time.
    let Some(Value::Array(entries)) = doc.get_mut("keys").map(Value::take) else {
        return Err(fail(
            "a JWKS document is an object with a `keys` array".to_owned(),
        ));
    };
    let mut keys = Vec::new();
    for (n, entry) in entries.into_iter().enumerate() {
        // An entry that is no JWK jsonwebtoken can read is a kind of key we
        // do not use, like those `signing_algorithm` passes over.
        let Ok(jwk) = serde_json::from_value::<Jwk>(entry) else {
            continue;
        };
        let Some(alg) = signing_algorithm(&jwk) else {
            continue;
        };
        let kid = jwk.common.key_id.clone();
        let key = DecodingKey::from_jwk(&jwk)
            .ok()
            .filter(|key| usable(alg, key))
            .ok_or_else(|| {
                let name = kid
                    .as_ref()
                    .map_or_else(|| format!("key {n}"), |k| format!("key {k:?}"));
                fail(format!("{name} is not a valid {alg:?} public key"))
            })?;
        keys.push(VerifyKey::new(alg, kid, key));
    }
    if keys.is_empty() {
        return Err(fail("no RS256 or ES256 signing key in it".to_owned()));
    }
    Ok(keys)
}

/// The algorithm a JWKS entry is a signing key for, when it is one Sluice
/// takes: an RSA key for RS256 or a P-256 key for ES256, whose `use` (if
/// given) is `sig` and whose `alg` (if given) is that algorithm.
fn signing_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    let common = &jwk.common;
    if common
        .public_key_use
        .as_ref()
        .is_some_and(|u| *u != PublicKeyUse::Signature)
    {
        return None;
    }
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        // jsonwebtoken reads an RSA or P-256 key that lacks a member it needs
        // (or has one of the wrong type) as a key of unknown kind. It is still
        // a key the issuer meant us to use, so it must fail the load rather
        // than vanish.
        AlgorithmParameters::Other(other) => {
            let member = |name: &str| other.fields.get(name).and_then(Value::as_str);
            match (member("kty"), member("crv")) {
                (Some("RSA"), _) => Algorithm::RS256,
                (Some("EC"), Some("P-256")) => Algorithm::ES256,
                _ => return None,
            }
        }
        _ => return None,
    };
    match common.key_algorithm {
        None => Some(alg),
        Some(named) => (named == KeyAlgorithm::from(alg)).then_some(alg),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::PolicyError;
    use crate::identity::jwt::JwtVerifier;
    use crate::identity::jwt::test_fixtures::{
        NOW, SECRET, dir, ec, err, fixture, hs, rsa, sign, verifier,
    };

    #[test]
    fn secret_file_is_read_without_its_trailing_newline() {
        let v = verifier("keys: [{alg: HS256, secret_file: hs256.secret}]");
        let secret = String::from_utf8(fixture("hs256.secret")).unwrap();
        let claims = json!({"sub": "s"});
        let t = sign(Algorithm::HS256, None, &claims, &hs(secret.trim_end()));
        assert!(v.verify_at(&t, NOW).is_some());
        let t = sign(Algorithm::HS256, None, &claims, &hs(&secret));
        assert!(v.verify_at(&t, NOW).is_none());
    }

    #[test]
    fn jwks_keys_verify_by_kid() {
        let v = verifier("jwks_file: jwks.json");
        let claims = json!({"sub": "x"});
        let rs = |kid, key: &str| sign(Algorithm::RS256, kid, &claims, &rsa(key));
        let es = |kid, key: &str| sign(Algorithm::ES256, kid, &claims, &ec(key));
        assert!(v.verify_at(&rs(Some("rsa-jwks"), "rsa.pem"), NOW).is_some());
        assert!(v.verify_at(&es(Some("ec-jwks"), "ec.pem"), NOW).is_some());
        assert!(v.verify_at(&rs(None, "rsa.pem"), NOW).is_some());
        assert!(
            v.verify_at(&rs(Some("rsa-jwks"), "rsa2.pem"), NOW)
                .is_none()
        );
        assert!(v.verify_at(&es(Some("ec-jwks"), "ec2.pem"), NOW).is_none());
        assert!(v.verify_at(&es(Some("rsa-jwks"), "ec.pem"), NOW).is_none());
        // JWKS keys and configured keys together.
        let v = verifier(&format!(
            "{{jwks_file: jwks.json, keys: [{{alg: HS256, secret: {SECRET}, kid: h}}]}}"
        ));
        assert!(v.verify_at(&rs(Some("rsa-jwks"), "rsa.pem"), NOW).is_some());
        let t = sign(Algorithm::HS256, Some("h"), &claims, &hs(SECRET));
        assert!(v.verify_at(&t, NOW).is_some());
    }

    #[test]
    fn missing_or_bad_key_files_fail_the_load() {
        let (line, col, msg) = err("keys:\n  - {alg: RS256, pem_file: nowhere.pem}\n");
        assert_eq!((line, col), (2, 28));
        assert!(
            msg.contains("cannot read") && msg.contains("nowhere.pem"),
            "{msg}"
        );
        let (line, col, msg) = err("keys: [{alg: HS256, secret_file: nowhere}]");
        assert_eq!((line, col), (1, 34));
        assert!(msg.contains("cannot read"), "{msg}");
        let (line, col, msg) = err("jwks_file: nowhere.json");
        assert_eq!((line, col), (1, 12));
        assert!(msg.contains("cannot read"), "{msg}");
        // The error names the file resolved against the policy's directory.
        assert!(
            msg.contains(&dir().join("nowhere.json").display().to_string()),
            "{msg}"
        );
    }

    #[test]
    fn unusable_keys_fail_the_load() {
        let cases = [
            // Not PEM at all.
            (
                "keys: [{alg: RS256, pem: garbage}]",
                "not an RSA public key",
            ),
            // A private key where the public one belongs.
            (
                "keys: [{alg: RS256, pem_file: rsa.pem}]",
                "not an RSA public key",
            ),
            (
                "keys: [{alg: ES256, pem_file: ec.pem}]",
                "not a P-256 EC public key",
            ),
            // The other family's key.
            (
                "keys: [{alg: RS256, pem_file: ec.pub.pem}]",
                "not an RSA public key",
            ),
            (
                "keys: [{alg: ES256, pem_file: rsa.pub.pem}]",
                "not a P-256 EC public key",
            ),
            (
                "keys: [{alg: ES256, pem_file: jwks.json}]",
                "not a P-256 EC public key",
            ),
            ("jwks_file: rsa.pub.pem", "not JSON"),
            ("jwks_file: hs256.secret", "not JSON"),
        ];
        for (yaml, want) in cases {
            let (_, _, msg) = err(yaml);
            assert!(msg.contains(want), "{yaml}: {msg}");
        }
    }

    #[test]
    fn bad_jwks_documents_fail_the_load() {
        let tmp = std::env::temp_dir().join(format!("sluice-jwks-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let write = |name: &str, body: &Value| {
            std::fs::write(tmp.join(name), body.to_string()).unwrap();
            JwtVerifier::from_str(&format!("jwks_file: {name}"), tmp.join("p.yaml"))
        };
        let msg = |r: Result<JwtVerifier, PolicyError>| r.unwrap_err().message;
        assert!(msg(write("a.json", &json!({"keys": []}))).contains("no RS256 or ES256"));
        assert!(msg(write("b.json", &json!([]))).contains("`keys` array"));
        let enc_only = json!({"keys": [
            {"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"},
            {"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"},
            {"kty": "oct", "k": "c2VjcmV0"},
            {"kty": "RSA", "alg": "RS512", "n": "AQAB", "e": "AQAB"},
        ]});
        assert!(msg(write("c.json", &enc_only)).contains("no RS256 or ES256"));
        let broken =
            json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1", "x": "AAAA", "y": "AAAA"}]});
        assert!(msg(write("d.json", &broken)).contains(r#"key "k1" is not a valid ES256"#));
        let no_n = json!({"keys": [{"kty": "RSA", "e": "AQAB"}]});
        assert!(msg(write("e.json", &no_n)).contains("key 0 is not a valid RS256"));
        // Unsupported keys next to a good one are skipped.
        let mut mixed: Value = serde_json::from_slice(&fixture("jwks.json")).unwrap();
        mixed["keys"]
            .as_array_mut()
            .unwrap()
            .extend(enc_only["keys"].as_array().unwrap().clone());
        assert!(write("f.json", &mixed).is_ok());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn key_mistakes_are_placed() {
        let e = err;
        let (_, c, m) = e("keys: [{alg: HS256, secret: short}]");
        assert_eq!(c, 29);
        assert!(m.contains("at least 32 bytes"), "{m}");
        let (_, c, m) = e(&format!("keys: [{{alg: HS256, secret: {SECRET}, pem: x}}]"));
        assert_eq!(c, 71);
        assert!(m.contains("not a PEM"), "{m}");
        let (_, _, m) = e("keys: [{alg: RS256, secret: x}]");
        assert!(m.contains("not a secret"), "{m}");
        let (_, c, m) = e("keys: [{alg: RS256}]");
        assert_eq!(c, 14);
        assert!(m.contains("needs `pem` or `pem_file`"), "{m}");
        let (_, _, m) = e("keys: [{alg: HS256}]");
        assert!(m.contains("needs `secret` or `secret_file`"), "{m}");
        let (_, _, m) = e(&format!(
            "keys: [{{alg: HS256, secret: {SECRET}, secret_file: hs256.secret}}]"
        ));
        assert!(m.contains("not both"), "{m}");
        let (_, _, m) = e("keys: [{alg: RS256, pem_file: rsa.pub.pem, pem: x}]");
        assert!(m.contains("not both"), "{m}");
        let (l, c, m) = e(
            "keys: [{alg: RS256, pem_file: rsa.pub.pem, kid: a}, {alg: ES256, pem_file: ec.pub.pem, kid: a}]",
        );
        assert_eq!((l, c), (1, 93));
        assert!(m.contains("another key"), "{m}");
        let (_, _, m) =
            e("{jwks_file: jwks.json, keys: [{alg: ES256, pem_file: ec.pub.pem, kid: ec-jwks}]}");
        assert!(m.contains("another key"), "{m}");
    }

    /// Loads a `jwt` section whose only keys are those of the JWKS `doc`.
    fn load_jwks_doc(doc: &Value) -> Result<JwtVerifier, PolicyError> {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("jwks.json"), doc.to_string()).unwrap();
        JwtVerifier::from_str("jwks_file: jwks.json", tmp.path().join("p.yaml"))
    }

    /// The entry of the fixture JWKS document whose `kid` is `kid`.
    fn fixture_jwk(kid: &str) -> Value {
        let doc: Value = serde_json::from_slice(&fixture("jwks.json")).unwrap();
        let keys = doc["keys"].as_array().unwrap();
        keys.iter().find(|k| k["kid"] == kid).unwrap().clone()
    }

    /// An RS256 and an ES256 token signed with the private halves of the
    /// fixture JWKS keys, each naming its key.
    fn fixture_jwks_tokens() -> (String, String) {
        let claims = json!({"sub": "x"});
        let rs = sign(Algorithm::RS256, Some("rsa-jwks"), &claims, &rsa("rsa.pem"));
        let es = sign(Algorithm::ES256, Some("ec-jwks"), &claims, &ec("ec.pem"));
        (rs, es)
    }

    #[test]
    fn jwks_with_an_ed25519_key_beside_an_rsa_one_loads_and_verifies_with_the_rsa_key() {
        let ed25519 = json!({"kty": "OKP", "crv": "Ed25519", "kid": "ed", "use": "sig",
                             "alg": "EdDSA", "x": "A".repeat(43)});
        let v = load_jwks_doc(&json!({"keys": [ed25519, fixture_jwk("rsa-jwks")]})).unwrap();
        let (rs, _) = fixture_jwks_tokens();
        assert_eq!(
            v.verify_at(&rs, NOW).unwrap().get("sub").as_deref(),
            Some("x")
        );
        assert!(format!("{v:?}").contains("rsa-jwks"));
        assert!(!format!("{v:?}").contains("\"ed\""));
    }

    #[test]
    fn jwks_entries_no_jwk_reader_knows_are_skipped_not_fatal() {
        let doc = json!({"keys": [
            {"kty": "XYZ", "kid": "future", "use": "sig", "q": "AQAB"},
            "not a key",
            7,
            null,
            [],
            // A member of the wrong JSON type makes the entry no JWK at all
            // (RFC 7517 §5 asks for such entries to be ignored), even when
            // the rest would name a key of ours.
            {"kty": "EC", "crv": "P-256", "kid": "odd", "key_ops": "verify", "x": "AA", "y": "AA"},
            fixture_jwk("ec-jwks"),
        ]});
        let v = load_jwks_doc(&doc).unwrap();
        let (_, es) = fixture_jwks_tokens();
        assert!(v.verify_at(&es, NOW).is_some());
        // With nothing else in it, such a document has no usable key.
        let only_strange = json!({"keys": [{"kty": "XYZ", "use": "sig"}, "not a key"]});
        let msg = load_jwks_doc(&only_strange).unwrap_err().message;
        assert!(msg.contains("no RS256 or ES256 signing key"), "{msg}");
    }

    #[test]
    fn jwks_keys_for_other_uses_or_algorithms_are_not_used_even_when_valid() {
        let mut enc = fixture_jwk("rsa-jwks");
        enc["use"] = json!("enc");
        let mut rs512 = fixture_jwk("rsa-jwks");
        rs512["alg"] = json!("RS512");
        rs512["kid"] = json!("rsa-512");
        let mut es384 = fixture_jwk("ec-jwks");
        es384["alg"] = json!("ES384");
        let mut other_use = fixture_jwk("ec-jwks");
        other_use["use"] = json!("tls");
        for skipped in [&enc, &rs512, &es384, &other_use] {
            let doc = json!({"keys": [skipped]});
            let msg = load_jwks_doc(&doc).unwrap_err().message;
            assert!(
                msg.contains("no RS256 or ES256 signing key"),
                "{skipped}: {msg}"
            );
        }
        // Beside a good key, a valid one for another use verifies nothing.
        let v = load_jwks_doc(&json!({"keys": [enc, fixture_jwk("ec-jwks")]})).unwrap();
        let (rs, es) = fixture_jwks_tokens();
        assert!(v.verify_at(&rs, NOW).is_none());
        assert!(v.verify_at(&es, NOW).is_some());
    }

    #[test]
    fn jwks_keys_without_use_or_alg_are_taken() {
        let mut bare_rsa = fixture_jwk("rsa-jwks");
        let mut bare_ec = fixture_jwk("ec-jwks");
        for key in [&mut bare_rsa, &mut bare_ec] {
            let members = key.as_object_mut().unwrap();
            members.remove("use");
            members.remove("alg");
        }
        let v = load_jwks_doc(&json!({"keys": [bare_rsa, bare_ec]})).unwrap();
        let (rs, es) = fixture_jwks_tokens();
        assert!(v.verify_at(&rs, NOW).is_some());
        assert!(v.verify_at(&es, NOW).is_some());
    }

    #[test]
    fn jwks_keys_missing_a_member_fail_the_load_by_name() {
        let mut no_y = fixture_jwk("ec-jwks");
        no_y.as_object_mut().unwrap().remove("y");
        let msg = load_jwks_doc(&json!({"keys": [fixture_jwk("rsa-jwks"), no_y]}))
            .unwrap_err()
            .message;
        assert!(
            msg.contains(r#"key "ec-jwks" is not a valid ES256"#),
            "{msg}"
        );
        let mut bad_e = fixture_jwk("rsa-jwks");
        bad_e["e"] = json!(65537);
        bad_e.as_object_mut().unwrap().remove("kid");
        let msg = load_jwks_doc(&json!({"keys": [fixture_jwk("ec-jwks"), bad_e]}))
            .unwrap_err()
            .message;
        assert!(msg.contains("key 1 is not a valid RS256"), "{msg}");
    }

    #[test]
    fn jwks_errors_are_placed_at_the_jwks_file_value() {
        let tmp = tempfile::tempdir().unwrap();
        let broken = json!({"keys": [{"kty": "RSA", "kid": "k", "e": "AQAB"}]});
        std::fs::write(tmp.path().join("jwks.json"), broken.to_string()).unwrap();
        let yaml = format!("keys: [{{alg: HS256, secret: {SECRET}}}]\njwks_file: jwks.json\n");
        let e = JwtVerifier::from_str(&yaml, tmp.path().join("p.yaml")).unwrap_err();
        assert_eq!((e.line, e.column), (2, 12));
        assert!(
            e.to_string()
                .ends_with(r#"p.yaml:2:12: jwks.json: key "k" is not a valid RS256 public key"#),
            "{e}"
        );
    }
}
