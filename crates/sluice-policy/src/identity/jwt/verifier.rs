//! Verifying tokens with the keys of a `jwt` section, and reading the claims
//! of those that pass.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::Algorithm;
use serde_json::{Map, Value};
use serde_saphyr::Spanned;

use super::config::{JwtConfigError, RawJwt};
use super::keys::{self, VerifyKey};
use crate::error::{PolicyError, from_yaml};

/// Tokens longer than this are refused before any decoding: no sane JWT is
/// this large, and refusing early bounds the work an attacker can cause.
const MAX_TOKEN_LEN: usize = 16 * 1024;

/// Checks JSON Web Tokens against the keys of a policy's `jwt` section.
///
/// Only HS256, RS256 and ES256 are accepted, and a token is tried only
/// against keys configured for the algorithm its header names, so an RSA
/// public key can never be used as an HMAC secret. A token whose `kid` names
/// a configured key is tried against that key alone; otherwise every key of
/// its algorithm is tried. Cloning is cheap (the keys are shared).
///
/// ```
/// use jsonwebtoken::{EncodingKey, Header, encode};
/// use sluice_policy::JwtVerifier;
///
/// let secret = "a shared secret of at least 32 bytes";
/// let verifier = JwtVerifier::from_str(
///     &format!("{{issuer: https://issuer.example, keys: [{{alg: HS256, secret: {secret:?}}}]}}"),
///     "policy.yaml",
/// )?;
/// let claims = serde_json::json!({"iss": "https://issuer.example", "sub": "user-1"});
/// let token = encode(&Header::default(), &claims, &EncodingKey::from_secret(secret.as_bytes())).unwrap();
///
/// let header_value = format!("Bearer {token}");
/// let token = verifier.token_from_header(&header_value).unwrap();
/// assert_eq!(verifier.verify(token).unwrap().get("sub").as_deref(), Some("user-1"));
/// assert!(verifier.verify(&token.replace('.', "x")).is_none());
/// # Ok::<(), sluice_policy::PolicyError>(())
/// ```
#[derive(Clone)]
pub struct JwtVerifier {
    inner: Arc<Inner>,
}

struct Inner {
    header: String,
    bearer: bool,
    issuer: Option<String>,
    audience: Option<String>,
    leeway: u64,
    /// Seconds `exp` may be ahead of now; `None` when not configured.
    max_lifetime: Option<f64>,
    keys: Vec<VerifyKey>,
}

impl fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("JwtVerifier")
            .field("header", &i.header)
            .field("issuer", &i.issuer)
            .field("audience", &i.audience)
            .field("leeway", &i.leeway)
            .field("keys", &i.keys)
            .finish()
    }
}

impl JwtVerifier {
    /// Loads a `jwt` section given on its own (the mapping under `jwt:`),
    /// for services that verify tokens without a whole policy; `file` names
    /// the text in errors, and key paths are relative to its directory.
    ///
    /// ```
    /// use sluice_policy::JwtVerifier;
    /// let v = JwtVerifier::from_str("keys: [{alg: HS256, secret: 0123456789abcdef0123456789abcdef}]", "p.yaml")?;
    /// assert_eq!(v.header(), "authorization");
    /// let err = JwtVerifier::from_str("keys: [{alg: RS256, pem_file: missing.pem}]", "p.yaml").unwrap_err();
    /// assert_eq!((err.line, err.column), (1, 31));
    /// # Ok::<(), sluice_policy::PolicyError>(())
    /// ```
    pub fn from_str(text: &str, file: impl AsRef<Path>) -> Result<JwtVerifier, PolicyError> {
        let file: PathBuf = file.as_ref().to_owned();
        let options = serde_saphyr::options! {
            with_snippet: false,
            strict_booleans: true,
        };
        let raw: Spanned<RawJwt> = serde_saphyr::from_str_with_options(text, options)
            .map_err(|e| from_yaml(&e, file.clone()))?;
        let base_dir = file.parent().unwrap_or(Path::new(""));
        JwtVerifier::build(&raw.value, base_dir)
            .map_err(|e| e.into_invalid(&raw).into_error(file.clone()))
    }

    /// Validates a `jwt` section and loads its keys; relative paths are
    /// resolved against `base_dir`, the policy file's directory. Unreadable
    /// files and malformed keys are refused here, never at request time.
    pub(crate) fn build(raw: &RawJwt, base_dir: &Path) -> Result<JwtVerifier, JwtConfigError> {
        let header = raw.header_name()?;
        let keys = keys::load(raw, base_dir)?;
        Ok(JwtVerifier {
            inner: Arc::new(Inner {
                bearer: header == "authorization",
                header,
                issuer: raw.issuer()?,
                audience: raw.audience()?,
                leeway: raw.leeway(),
                max_lifetime: raw.max_lifetime()?,
                keys,
            }),
        })
    }

    /// The lowercase name of the header that carries the token.
    ///
    /// ```
    /// use sluice_policy::JwtVerifier;
    /// let v = JwtVerifier::from_str(
    ///     "{header: X-Token, keys: [{alg: HS256, secret: 0123456789abcdef0123456789abcdef}]}",
    ///     "p.yaml",
    /// )?;
    /// assert_eq!(v.header(), "x-token");
    /// # Ok::<(), sluice_policy::PolicyError>(())
    /// ```
    pub fn header(&self) -> &str {
        &self.inner.header
    }

    /// The token in a value of [`header`](Self::header): after a `Bearer`
    /// scheme (any case) for `authorization`, the whole trimmed value for any
    /// other header. `None` when there is no single token to take.
    ///
    /// ```
    /// use sluice_policy::JwtVerifier;
    /// let v = JwtVerifier::from_str("keys: [{alg: HS256, secret: 0123456789abcdef0123456789abcdef}]", "p")?;
    /// assert_eq!(v.token_from_header("bearer  abc.def.ghi "), Some("abc.def.ghi"));
    /// assert_eq!(v.token_from_header("Basic dXNlcjpwdw=="), None);
    /// # Ok::<(), sluice_policy::PolicyError>(())
    /// ```
    pub fn token_from_header<'a>(&self, value: &'a str) -> Option<&'a str> {
        if self.inner.bearer {
            return bearer_token(value);
        }
        let token = value.trim();
        (!token.is_empty() && !token.contains(char::is_whitespace)).then_some(token)
    }

    /// The claims of `token` if it is a valid JWT now (system clock), else
    /// `None`: see [`verify_at`](Self::verify_at).
    ///
    /// ```
    /// use jsonwebtoken::{EncodingKey, Header, encode, get_current_timestamp};
    /// use sluice_policy::JwtVerifier;
    /// let secret = "0123456789abcdef0123456789abcdef";
    /// let v = JwtVerifier::from_str(&format!("keys: [{{alg: HS256, secret: {secret}}}]"), "p")?;
    /// let key = EncodingKey::from_secret(secret.as_bytes());
    /// let live = serde_json::json!({"sub": "u1", "exp": get_current_timestamp() + 60});
    /// let dead = serde_json::json!({"sub": "u1", "exp": get_current_timestamp() - 60});
    /// assert!(v.verify(&encode(&Header::default(), &live, &key).unwrap()).is_some());
    /// assert!(v.verify(&encode(&Header::default(), &dead, &key).unwrap()).is_none());
    /// # Ok::<(), sluice_policy::PolicyError>(())
    /// ```
    pub fn verify(&self, token: &str) -> Option<Claims> {
        // A clock before 1970 is broken; time 0 then makes every `nbf` in the
        // future, which fails closed.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.verify_at(token, now)
    }

    /// The claims of `token` if it is valid at `now` (seconds since the Unix
    /// epoch), else `None`.
    ///
    /// Valid means: a JWS in compact form no longer than 16 KiB, with alg
    /// HS256, RS256 or ES256, no `crit` header, signed by a configured key of
    /// that algorithm, whose payload is a JSON object; `exp` (if present)
    /// after `now - leeway`; `nbf` (if present) no later than
    /// `now + leeway`; `iss` equal to the configured issuer and `aud` naming
    /// the configured audience, when those are configured. Keys named in the
    /// token header (`jwk`, `jku`, `x5u`, `x5c`) are never used.
    ///
    /// ```
    /// use jsonwebtoken::{EncodingKey, Header, encode};
    /// use sluice_policy::JwtVerifier;
    /// let secret = "0123456789abcdef0123456789abcdef";
    /// let v = JwtVerifier::from_str(&format!("{{leeway: 30, keys: [{{alg: HS256, secret: {secret}}}]}}"), "p")?;
    /// let claims = serde_json::json!({"sub": "u1", "exp": 1_000});
    /// let token = encode(&Header::default(), &claims, &EncodingKey::from_secret(secret.as_bytes())).unwrap();
    /// assert!(v.verify_at(&token, 1_029).is_some());
    /// assert!(v.verify_at(&token, 1_030).is_none());
    /// # Ok::<(), sluice_policy::PolicyError>(())
    /// ```
    pub fn verify_at(&self, token: &str, now: u64) -> Option<Claims> {
        if token.len() > MAX_TOKEN_LEN {
            return None;
        }
        let header = jsonwebtoken::decode_header(token).ok()?;
        // We implement no JWS extensions, and RFC 7515 §4.1.11 requires
        // rejecting a token that says it depends on one.
        if header.crit.is_some() {
            return None;
        }
        if !matches!(
            header.alg,
            Algorithm::HS256 | Algorithm::RS256 | Algorithm::ES256
        ) {
            return None;
        }
        let keys = &self.inner.keys;
        let kid = header
            .kid
            .as_deref()
            .filter(|kid| keys.iter().any(|k| k.kid.as_deref() == Some(kid)));
        let candidates = keys
            .iter()
            .filter(|k| k.alg == header.alg && (kid.is_none() || k.kid.as_deref() == kid));
        for key in candidates {
            let Ok(data) =
                jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &key.validation)
            else {
                continue;
            };
            return self
                .claims_hold(&data.claims, now)
                .then_some(Claims(data.claims));
        }
        None
    }

    /// The registered claims, checked here rather than by jsonwebtoken so that
    /// time is an argument (replays run in virtual time), `exp` stays optional
    /// and no arithmetic on token values can overflow.
    fn claims_hold(&self, claims: &Map<String, Value>, now: u64) -> bool {
        let i = &self.inner;
        let now = now as f64;
        let leeway = i.leeway as f64;
        // RFC 7519's NumericDate, within what a calendar can name: a time
        // past the year 9999 is no date but a way to never expire.
        const LAST_DATE: f64 = 253_402_300_799.0;
        let time = |name: &str| match claims.get(name) {
            None => Some(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .filter(|t| (-LAST_DATE..=LAST_DATE).contains(t))
                .map(Some),
            Some(_) => None,
        };
        // A present but non-numeric `exp`/`nbf` is refused rather than ignored:
        // ignoring it would turn a malformed limit into no limit.
        let (Some(exp), Some(nbf)) = (time("exp"), time("nbf")) else {
            return false;
        };
        // RFC 7519 §4.1.4: the current time must be before `exp`.
        if exp.is_some_and(|exp| now >= exp + leeway) {
            return false;
        }
        if let Some(max) = i.max_lifetime
            && exp.is_none_or(|exp| exp - now > max)
        {
            return false;
        }
        // RFC 7519 §4.1.5: the current time must be at or after `nbf`.
        if nbf.is_some_and(|nbf| now + leeway < nbf) {
            return false;
        }
        if let Some(iss) = &i.issuer
            && claims.get("iss").and_then(Value::as_str) != Some(iss)
        {
            return false;
        }
        if let Some(aud) = &i.audience {
            let named = match claims.get("aud") {
                Some(Value::String(s)) => s == aud,
                Some(Value::Array(list)) => list.iter().any(|v| v.as_str() == Some(aud)),
                _ => false,
            };
            if !named {
                return false;
            }
        }
        true
    }
}

/// The token of an `Authorization: Bearer <token>` value: the scheme in
/// any case (RFC 9110 §11.1), then one token with no white space in it.
///
/// ```
/// use sluice_policy::bearer_token;
/// assert_eq!(bearer_token("bearer  abc.def "), Some("abc.def"));
/// assert_eq!(bearer_token("BEARER s3cret"), Some("s3cret"));
/// assert_eq!(bearer_token("Basic dXNlcjpwdw=="), None);
/// assert_eq!(bearer_token("Bearer a b"), None);
/// ```
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim().split_once([' ', '\t'])?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = rest.trim_start();
    (!token.is_empty() && !token.contains(char::is_whitespace)).then_some(token)
}

/// The payload of a verified token.
///
/// ```
/// use sluice_policy::Claims;
/// let c = Claims::from_verified_json(r#"{"sub": "u1", "org": {"id": 7}}"#).unwrap();
/// assert_eq!(c.get("org.id").as_deref(), Some("7"));
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Claims(Map<String, Value>);

impl Claims {
    /// Claims from JSON text that the caller has already verified, such as a
    /// payload an upstream gateway checked and forwarded, or a test's.
    /// Nothing is verified here. `None` unless the text is a JSON object.
    ///
    /// ```
    /// use sluice_policy::Claims;
    /// assert!(Claims::from_verified_json(r#"{"sub": "u1"}"#).is_some());
    /// assert!(Claims::from_verified_json("[1, 2]").is_none());
    /// ```
    pub fn from_verified_json(json: &str) -> Option<Claims> {
        serde_json::from_str(json).ok().map(Claims)
    }

    /// A claim as a string for limit keys and `match` values: strings as
    /// they are, numbers and booleans in their JSON text, members of nested
    /// objects by dotted name (`org.id`). A claim whose own name contains dots
    /// (`https://example.com/roles`) is found by that name first. Arrays,
    /// objects, `null` and absent claims give `None`.
    ///
    /// ```
    /// use sluice_policy::Claims;
    /// let c = Claims::from_verified_json(
    ///     r#"{"sub": "u1", "n": 42, "admin": true, "org": {"id": "acme"}, "roles": ["a"]}"#,
    /// ).unwrap();
    /// assert_eq!(c.get("sub").as_deref(), Some("u1"));
    /// assert_eq!(c.get("n").as_deref(), Some("42"));
    /// assert_eq!(c.get("admin").as_deref(), Some("true"));
    /// assert_eq!(c.get("org.id").as_deref(), Some("acme"));
    /// assert_eq!(c.get("org"), None);
    /// assert_eq!(c.get("roles"), None);
    /// ```
    pub fn get(&self, name: &str) -> Option<Cow<'_, str>> {
        match lookup(&self.0, name)? {
            Value::String(s) => Some(Cow::Borrowed(s)),
            Value::Number(n) => Some(Cow::Owned(n.to_string())),
            Value::Bool(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
            Value::Null | Value::Array(_) | Value::Object(_) => None,
        }
    }
}

/// Finds `name` in `obj`, preferring the literal name, then descending into
/// nested objects at each dot in turn.
fn lookup<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    if let Some(v) = obj.get(name) {
        return Some(v);
    }
    name.match_indices('.')
        .find_map(|(i, _)| match obj.get(&name[..i]) {
            Some(Value::Object(inner)) => lookup(inner, &name[i + 1..]),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::jwt::test_fixtures::{
        NOW, SECRET, ec, fixture, hs, hs_verifier, rsa, sign, verifier,
    };
    use jsonwebtoken::{EncodingKey, Header, encode};
    use proptest::prelude::*;
    use serde_json::json;

    /// Unpadded base64url, enough to hand-craft hostile tokens.
    fn base64url(bytes: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..=chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    }

    #[test]
    fn valid_hs256_rs256_es256_tokens_give_their_claims() {
        let claims = json!({"sub": "user-1", "exp": NOW + 60});
        let v = hs_verifier();
        let t = sign(Algorithm::HS256, None, &claims, &hs(SECRET));
        assert_eq!(
            v.verify_at(&t, NOW).unwrap().get("sub").as_deref(),
            Some("user-1")
        );

        let v = verifier("keys: [{alg: RS256, pem_file: rsa.pub.pem}]");
        let t = sign(Algorithm::RS256, None, &claims, &rsa("rsa.pem"));
        assert_eq!(
            v.verify_at(&t, NOW).unwrap().get("sub").as_deref(),
            Some("user-1")
        );

        // An inline PEM, as a YAML block scalar.
        let pem = String::from_utf8(fixture("ec.pub.pem")).unwrap();
        let indented: String = pem.lines().map(|l| format!("      {l}\n")).collect();
        let v = verifier(&format!("keys:\n  - alg: ES256\n    pem: |\n{indented}"));
        let t = sign(Algorithm::ES256, None, &claims, &ec("ec.pem"));
        assert_eq!(
            v.verify_at(&t, NOW).unwrap().get("sub").as_deref(),
            Some("user-1")
        );
    }

    #[test]
    fn claims_render_numbers_bools_and_nested_members() {
        let claims = json!({
            "sub": "u", "n": 42, "neg": -7, "f": 1.5, "yes": true, "no": false, "nul": null,
            "org": {"id": "acme", "tier": 3, "deep": {"x": "y"}}, "roles": ["a", "b"],
            "https://example.com/team": "blue", "a.b": "literal", "a": {"b": "nested"},
        });
        let t = sign(Algorithm::HS256, None, &claims, &hs(SECRET));
        let c = hs_verifier().verify_at(&t, NOW).unwrap();
        let get = |n: &str| c.get(n).map(Cow::into_owned);
        assert_eq!(get("n").as_deref(), Some("42"));
        assert_eq!(get("neg").as_deref(), Some("-7"));
        assert_eq!(get("f").as_deref(), Some("1.5"));
        assert_eq!(get("yes").as_deref(), Some("true"));
        assert_eq!(get("no").as_deref(), Some("false"));
        assert_eq!(get("org.id").as_deref(), Some("acme"));
        assert_eq!(get("org.tier").as_deref(), Some("3"));
        assert_eq!(get("org.deep.x").as_deref(), Some("y"));
        assert_eq!(get("https://example.com/team").as_deref(), Some("blue"));
        assert_eq!(get("a.b").as_deref(), Some("literal"));
        for absent in [
            "nul", "org", "org.deep", "roles", "roles.0", "org.nope", "missing", "",
        ] {
            assert_eq!(get(absent), None, "{absent}");
        }
    }

    #[test]
    fn alg_none_is_refused() {
        let v = hs_verifier();
        let payload = base64url(br#"{"sub":"admin"}"#);
        for alg in ["none", "None", "NONE", "nOnE"] {
            let header = base64url(format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#).as_bytes());
            for sig in ["", "AAAA"] {
                assert!(
                    v.verify_at(&format!("{header}.{payload}.{sig}"), NOW)
                        .is_none()
                );
            }
        }
        // Stripping the signature of a genuine token does not help either.
        let t = sign(Algorithm::HS256, None, &json!({"sub": "x"}), &hs(SECRET));
        let unsigned = &t[..=t.rfind('.').unwrap()];
        assert!(v.verify_at(unsigned, NOW).is_none());
    }

    #[test]
    fn algorithms_without_a_configured_key_are_refused() {
        let claims = json!({"sub": "x"});
        // Only an HS256 key: a perfectly good RS256 token has nothing to verify it.
        let v = hs_verifier();
        assert!(
            v.verify_at(&sign(Algorithm::RS256, None, &claims, &rsa("rsa.pem")), NOW)
                .is_none()
        );
        // The same secret under HS384/HS512 is not HS256.
        for alg in [Algorithm::HS384, Algorithm::HS512] {
            assert!(
                v.verify_at(&sign(alg, None, &claims, &hs(SECRET)), NOW)
                    .is_none()
            );
        }
        // An RS256 key does not verify RS512 or PS256 tokens from the same key pair.
        let v = verifier("keys: [{alg: RS256, pem_file: rsa.pub.pem}]");
        for alg in [Algorithm::RS512, Algorithm::PS256] {
            assert!(
                v.verify_at(&sign(alg, None, &claims, &rsa("rsa.pem")), NOW)
                    .is_none()
            );
        }
        let t = sign(Algorithm::ES256, None, &claims, &ec("ec.pem"));
        assert!(v.verify_at(&t, NOW).is_none());
    }

    #[test]
    fn hs256_signed_with_the_rsa_public_key_is_refused() {
        let claims = json!({"sub": "admin"});
        let public = fixture("rsa.pub.pem");
        let forged = sign(
            Algorithm::HS256,
            None,
            &claims,
            &EncodingKey::from_secret(&public),
        );
        let v = verifier("keys: [{alg: RS256, pem_file: rsa.pub.pem}]");
        assert!(v.verify_at(&forged, NOW).is_none());
        // Also when an HS256 key is configured next to it, and with the kid of
        // the RSA key in the header.
        let v = verifier(&format!(
            "keys: [{{alg: RS256, pem_file: rsa.pub.pem, kid: r}}, {{alg: HS256, secret: {SECRET}}}]"
        ));
        assert!(v.verify_at(&forged, NOW).is_none());
        let forged = sign(
            Algorithm::HS256,
            Some("r"),
            &claims,
            &EncodingKey::from_secret(&public),
        );
        assert!(v.verify_at(&forged, NOW).is_none());
        // Likewise through the JWKS.
        let v = verifier("jwks_file: jwks.json");
        let forged = sign(
            Algorithm::HS256,
            Some("rsa-jwks"),
            &claims,
            &EncodingKey::from_secret(&public),
        );
        assert!(v.verify_at(&forged, NOW).is_none());
    }

    #[test]
    fn forged_and_tampered_tokens_are_refused() {
        let claims = json!({"sub": "user-1"});
        let v = hs_verifier();
        let other = "another-secret-another-secret-another";
        assert!(
            v.verify_at(&sign(Algorithm::HS256, None, &claims, &hs(other)), NOW)
                .is_none()
        );

        let v = verifier(
            "keys: [{alg: RS256, pem_file: rsa.pub.pem}, {alg: ES256, pem_file: ec.pub.pem}]",
        );
        assert!(
            v.verify_at(
                &sign(Algorithm::RS256, None, &claims, &rsa("rsa2.pem")),
                NOW
            )
            .is_none()
        );
        assert!(
            v.verify_at(&sign(Algorithm::ES256, None, &claims, &ec("ec2.pem")), NOW)
                .is_none()
        );

        // A genuine signature over different claims.
        let good = sign(Algorithm::RS256, None, &claims, &rsa("rsa.pem"));
        assert!(v.verify_at(&good, NOW).is_some());
        let mut parts: Vec<&str> = good.split('.').collect();
        let admin = base64url(br#"{"sub":"admin"}"#);
        parts[1] = &admin;
        assert!(v.verify_at(&parts.join("."), NOW).is_none());
        // A flipped signature character.
        let mut bad = good.clone().into_bytes();
        let last = bad.len() - 5;
        bad[last] = if bad[last] == b'A' { b'B' } else { b'A' };
        assert!(
            v.verify_at(std::str::from_utf8(&bad).unwrap(), NOW)
                .is_none()
        );
    }

    #[test]
    fn expired_tokens_are_refused_within_the_leeway() {
        let v = hs_verifier();
        let at = |exp: Value| sign(Algorithm::HS256, None, &json!({"exp": exp}), &hs(SECRET));
        assert!(v.verify_at(&at(json!(NOW + 1)), NOW).is_some());
        assert!(v.verify_at(&at(json!(NOW)), NOW).is_none());
        assert!(v.verify_at(&at(json!(NOW - 1)), NOW).is_none());
        assert!(v.verify_at(&at(json!(NOW as f64 + 0.5)), NOW).is_some());
        for junk in [
            json!("tomorrow"),
            json!(null),
            json!([NOW + 9]),
            json!({"t": 1}),
        ] {
            assert!(v.verify_at(&at(junk), NOW).is_none());
        }
        let v = verifier(&format!(
            "{{leeway: 30, keys: [{{alg: HS256, secret: {SECRET}}}]}}"
        ));
        assert!(v.verify_at(&at(json!(NOW - 29)), NOW).is_some());
        assert!(v.verify_at(&at(json!(NOW - 30)), NOW).is_none());
        // Without `exp` a token does not expire.
        let forever = sign(Algorithm::HS256, None, &json!({"sub": "svc"}), &hs(SECRET));
        assert!(v.verify_at(&forever, u64::MAX).is_some());
        // Extreme values neither overflow nor pass: a time past the year
        // 9999 is malformed, not a token that never expires.
        assert!(v.verify_at(&at(json!(1e300)), NOW).is_none());
        assert!(v.verify_at(&at(json!(253_402_300_800_u64)), NOW).is_none());
        assert!(v.verify_at(&at(json!(253_402_300_799_u64)), NOW).is_some());
        assert!(v.verify_at(&at(json!(-1e300)), NOW).is_none());
        assert!(v.verify_at(&at(json!(i64::MIN)), NOW).is_none());
        let huge = verifier(&format!(
            "{{leeway: {}, keys: [{{alg: HS256, secret: {SECRET}}}]}}",
            u64::MAX
        ));
        assert!(huge.verify_at(&at(json!(0)), NOW).is_some());
        assert!(huge.verify_at(&at(json!(0)), u64::MAX).is_none());
    }

    #[test]
    fn max_lifetime_caps_how_far_ahead_exp_may_be_and_requires_it() {
        let v = verifier(&format!(
            "{{max_lifetime: 1h, keys: [{{alg: HS256, secret: {SECRET}}}]}}"
        ));
        let at = |claims: Value| sign(Algorithm::HS256, None, &claims, &hs(SECRET));
        assert!(v.verify_at(&at(json!({"exp": NOW + 3_600})), NOW).is_some());
        assert!(v.verify_at(&at(json!({"exp": NOW + 3_601})), NOW).is_none());
        assert!(v.verify_at(&at(json!({"sub": "svc"})), NOW).is_none());
    }

    #[test]
    fn not_yet_valid_tokens_are_refused_within_the_leeway() {
        let v = hs_verifier();
        let at = |nbf: Value| sign(Algorithm::HS256, None, &json!({"nbf": nbf}), &hs(SECRET));
        assert!(v.verify_at(&at(json!(NOW)), NOW).is_some());
        assert!(v.verify_at(&at(json!(NOW - 5)), NOW).is_some());
        assert!(v.verify_at(&at(json!(NOW + 1)), NOW).is_none());
        assert!(v.verify_at(&at(json!("now")), NOW).is_none());
        let v = verifier(&format!(
            "{{leeway: 30, keys: [{{alg: HS256, secret: {SECRET}}}]}}"
        ));
        assert!(v.verify_at(&at(json!(NOW + 30)), NOW).is_some());
        assert!(v.verify_at(&at(json!(NOW + 31)), NOW).is_none());
    }

    #[test]
    fn verify_uses_the_system_clock() {
        let v = hs_verifier();
        let now = jsonwebtoken::get_current_timestamp();
        let t = |exp: u64| sign(Algorithm::HS256, None, &json!({"exp": exp}), &hs(SECRET));
        assert!(v.verify(&t(now + 120)).is_some());
        assert!(v.verify(&t(now - 120)).is_none());
    }

    #[test]
    fn issuer_and_audience_are_required_when_configured() {
        let v = verifier(&format!(
            "{{issuer: https://issuer.example, audience: my-api, keys: [{{alg: HS256, secret: {SECRET}}}]}}"
        ));
        let ok = |claims: Value| {
            v.verify_at(&sign(Algorithm::HS256, None, &claims, &hs(SECRET)), NOW)
                .is_some()
        };
        let iss = "https://issuer.example";
        assert!(ok(json!({"iss": iss, "aud": "my-api"})));
        assert!(ok(json!({"iss": iss, "aud": ["other", "my-api"]})));
        assert!(!ok(json!({"iss": "https://evil.example", "aud": "my-api"})));
        assert!(!ok(json!({"iss": iss, "aud": "other-api"})));
        assert!(!ok(json!({"iss": iss, "aud": ["other"]})));
        assert!(!ok(json!({"aud": "my-api"})));
        assert!(!ok(json!({"iss": iss})));
        assert!(!ok(json!({"iss": [iss], "aud": "my-api"})));
        // Unconfigured, they are not checked.
        let v = hs_verifier();
        let t = sign(
            Algorithm::HS256,
            None,
            &json!({"iss": "x", "aud": "y"}),
            &hs(SECRET),
        );
        assert!(v.verify_at(&t, NOW).is_some());
    }

    #[test]
    fn kid_selects_the_key() {
        let v = verifier(
            "keys: [{alg: RS256, pem_file: rsa.pub.pem, kid: one}, {alg: RS256, pem_file: rsa2.pub.pem, kid: two}]",
        );
        let claims = json!({"sub": "x"});
        let by_one = |kid| sign(Algorithm::RS256, kid, &claims, &rsa("rsa.pem"));
        assert!(v.verify_at(&by_one(Some("one")), NOW).is_some());
        // Naming the other key means only the other key is tried.
        assert!(v.verify_at(&by_one(Some("two")), NOW).is_none());
        // No kid, or one that names no key: every key of the algorithm.
        assert!(v.verify_at(&by_one(None), NOW).is_some());
        assert!(v.verify_at(&by_one(Some("rotated-away")), NOW).is_some());
        let by_two = sign(Algorithm::RS256, None, &claims, &rsa("rsa2.pem"));
        assert!(v.verify_at(&by_two, NOW).is_some());
        // A kid naming a key of another algorithm gives no key to try.
        let v = verifier(
            "keys: [{alg: ES256, pem_file: ec.pub.pem, kid: e}, {alg: RS256, pem_file: rsa.pub.pem}]",
        );
        assert!(v.verify_at(&by_one(Some("e")), NOW).is_none());
    }

    #[test]
    fn headers_claiming_other_keys_or_extensions_are_refused() {
        let v = hs_verifier();
        let claims = json!({"sub": "x"});
        let mut header = Header::new(Algorithm::HS256);
        header.crit = Some(vec!["exp".to_owned()]);
        assert!(
            v.verify_at(&encode(&header, &claims, &hs(SECRET)).unwrap(), NOW)
                .is_none()
        );
        // An attacker-supplied key in the header is ignored, not trusted.
        let mut header = Header::new(Algorithm::RS256);
        header.jku = Some("https://evil.example/jwks.json".to_owned());
        let t = encode(&header, &claims, &rsa("rsa2.pem")).unwrap();
        let v = verifier("keys: [{alg: RS256, pem_file: rsa.pub.pem}]");
        assert!(v.verify_at(&t, NOW).is_none());
    }

    #[test]
    fn garbage_is_refused() {
        let v = verifier(&format!(
            "{{jwks_file: jwks.json, keys: [{{alg: HS256, secret: {SECRET}}}]}}"
        ));
        let good = sign(Algorithm::HS256, None, &json!({"sub": "x"}), &hs(SECRET));
        let header = good.split('.').next().unwrap();
        let long = format!("{good}{}", "A".repeat(MAX_TOKEN_LEN));
        let array_payload = format!("{header}.{}.sig", base64url(b"[1,2]"));
        for junk in [
            "",
            ".",
            "..",
            "...",
            "a.b.c",
            "a.b.c.d.e",
            "not a token",
            "Bearer x",
            "\0\0",
            "eyJ.eyJ.eyJ",
            "ééé.ééé.ééé",
            &long,
            &array_payload,
            &good[1..],
            &format!("{good}.extra"),
            &format!("{header}..{}", "A".repeat(40)),
        ] {
            assert!(v.verify_at(junk, NOW).is_none(), "{junk:?}");
        }
        // Signed non-object payloads.
        let t = encode(&Header::default(), &json!([1, 2]), &hs(SECRET)).unwrap();
        assert!(v.verify_at(&t, NOW).is_none());
        let t = encode(&Header::default(), &json!("s"), &hs(SECRET)).unwrap();
        assert!(v.verify_at(&t, NOW).is_none());
    }

    #[test]
    fn token_from_header_takes_bearer_or_raw_tokens() {
        let v = hs_verifier();
        assert_eq!(v.header(), "authorization");
        assert_eq!(v.token_from_header("Bearer a.b.c"), Some("a.b.c"));
        assert_eq!(v.token_from_header(" BEARER\ta.b.c "), Some("a.b.c"));
        for none in [
            "Bearer",
            "Bearer ",
            "Basic a.b.c",
            "a.b.c",
            "Bearer a b",
            "Bearera.b.c",
            "",
        ] {
            assert_eq!(v.token_from_header(none), None, "{none:?}");
        }
        let v = verifier(&format!(
            "{{header: X-JWT, keys: [{{alg: HS256, secret: {SECRET}}}]}}"
        ));
        assert_eq!(v.header(), "x-jwt");
        assert_eq!(v.token_from_header(" a.b.c "), Some("a.b.c"));
        assert_eq!(v.token_from_header("Bearer a.b.c"), None);
        assert_eq!(v.token_from_header("  "), None);
    }

    #[test]
    fn debug_output_hides_secrets() {
        let v = hs_verifier();
        let shown = format!("{v:?}");
        assert!(
            shown.contains("HS256") && !shown.contains(SECRET),
            "{shown}"
        );
    }

    #[test]
    fn verifier_is_cheap_to_clone_and_shares_keys() {
        let v = hs_verifier();
        let w = v.clone();
        assert!(Arc::ptr_eq(&v.inner, &w.inner));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_tokens_never_panic_or_pass(token in ".{0,300}", dots in "[A-Za-z0-9_.-]{0,200}") {
            let v = verifier(&format!(
                "{{jwks_file: jwks.json, keys: [{{alg: HS256, secret: {SECRET}}}]}}"
            ));
            prop_assert!(v.verify_at(&token, NOW).is_none());
            prop_assert!(v.verify_at(&dots, NOW).is_none());
            let _ = v.token_from_header(&token);
        }

        #[test]
        fn arbitrary_signed_headers_never_panic(alg in "[A-Za-z0-9]{0,8}", kid in ".{0,20}", body in ".{0,80}") {
            let v = hs_verifier();
            let header = json!({"alg": alg, "kid": kid}).to_string();
            let token = format!("{}.{}.{}", base64url(header.as_bytes()), base64url(body.as_bytes()), base64url(b"sig"));
            prop_assert!(v.verify_at(&token, NOW).is_none());
        }

        #[test]
        fn arbitrary_claims_are_returned_intact(sub in ".{0,40}", n in any::<i64>(), b in any::<bool>()) {
            let claims = json!({"sub": sub, "n": n, "o": {"b": b}});
            let t = sign(Algorithm::HS256, None, &claims, &hs(SECRET));
            let c = hs_verifier().verify_at(&t, NOW).unwrap();
            let get = |name: &str| c.get(name).map(Cow::into_owned);
            prop_assert_eq!(get("sub"), Some(sub));
            prop_assert_eq!(get("n"), Some(n.to_string()));
            prop_assert_eq!(get("o.b"), Some(b.to_string()));
        }
    }
}
