//! JSON Web Tokens: the policy's `jwt` section (which keys sign the tokens a
//! service accepts) and [`JwtVerifier`], which turns a token into [`Claims`]
//! only once its signature and its time, issuer and audience claims check out.
//!
//! ```yaml
//! jwt:
//!   header: authorization            # default; "Bearer <token>". Any other header holds the bare token
//!   issuer: https://issuer.example   # optional; when set, `iss` must be present and equal
//!   audience: my-api                 # optional; when set, `aud` must be present and name it
//!   leeway: 30                       # seconds of clock skew allowed on exp/nbf, default 0
//!   max_lifetime: 1d                 # optional; when set, `exp` must be present and at most this far ahead
//!   keys:
//!     - {alg: HS256, secret: "at least 32 bytes of shared secret"}   # or secret_file: path
//!     - {alg: RS256, pem_file: keys/rsa.pub.pem, kid: rsa-1}
//!     - {alg: ES256, pem: "-----BEGIN PUBLIC KEY-----\n..."}
//!   jwks_file: keys/jwks.json        # RS256 / ES256 public keys, by kid
//! ```
//!
//! Paths are relative to the policy file's directory. `exp` and `nbf` are
//! checked when a token carries them but are not required, since many
//! internal issuers mint long-lived service tokens without them. A time
//! past the year 9999 is refused as malformed, so `exp: 1e300` does not
//! make a token valid forever; `max_lifetime` caps how far ahead `exp` may
//! be, for issuers whose tokens are all short-lived.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Map, Value};
use serde_saphyr::{Location, Spanned};

use crate::error::{Invalid, PolicyError, Pos, at, from_yaml};

/// Tokens longer than this are refused before any decoding: no sane JWT is
/// this large, and refusing early bounds the work an attacker can cause.
const MAX_TOKEN_LEN: usize = 16 * 1024;

/// RFC 7518 §3.2: an HS256 key must be at least as long as the hash output.
const MIN_HS256_SECRET: usize = 32;

/// The `jwt` section as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwt {
    pub(crate) header: Option<Spanned<String>>,
    pub(crate) issuer: Option<Spanned<String>>,
    pub(crate) audience: Option<Spanned<String>>,
    pub(crate) leeway: Option<Spanned<u64>>,
    pub(crate) max_lifetime: Option<Spanned<crate::secs::Secs>>,
    #[serde(default)]
    pub(crate) keys: Vec<Spanned<RawJwtKey>>,
    pub(crate) jwks_file: Option<Spanned<String>>,
}

/// One entry of `jwt.keys`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwtKey {
    pub(crate) alg: Spanned<String>,
    pub(crate) kid: Option<Spanned<String>>,
    pub(crate) secret: Option<Spanned<String>>,
    pub(crate) secret_file: Option<Spanned<String>>,
    pub(crate) pem: Option<Spanned<String>>,
    pub(crate) pem_file: Option<Spanned<String>>,
}

// Written by hand so that a shared secret never reaches a log line through
// `{:?}` of the raw policy.
impl fmt::Debug for RawJwtKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawJwtKey")
            .field("alg", &self.alg.value)
            .field("kid", &self.kid.as_ref().map(|k| &k.value))
            .field("secret", &self.secret.as_ref().map(|_| "[redacted]"))
            .field("secret_file", &self.secret_file.as_ref().map(|p| &p.value))
            .field("pem", &self.pem.as_ref().map(|_| "[pem]"))
            .field("pem_file", &self.pem_file.as_ref().map(|p| &p.value))
            .finish()
    }
}

/// A `jwt` section that cannot work, with the value responsible.
#[derive(Debug, Clone)]
pub(crate) struct JwtConfigError {
    /// What is wrong, without the position.
    pub(crate) message: String,
    /// Where the offending value is; `None` means the `jwt` section as a
    /// whole (it has no keys at all).
    pub(crate) location: Option<Location>,
}

impl JwtConfigError {
    fn at<T>(value: &Spanned<T>, message: impl fmt::Display) -> JwtConfigError {
        JwtConfigError {
            message: message.to_string(),
            location: Some(value.referenced),
        }
    }

    /// The crate's validation error, placed at the offending value or, for
    /// problems of the whole section, at `section` (the `jwt` value).
    pub(crate) fn into_invalid(self, section: impl Into<Pos>) -> Invalid {
        match self.location {
            Some(loc) => at(Pos::of(loc), self.message),
            None => at(section, self.message),
        }
    }
}

impl fmt::Display for JwtConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.location {
            Some(loc) => write!(f, "{}:{}: {}", loc.line(), loc.column(), self.message),
            None => f.write_str(&self.message),
        }
    }
}

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

#[derive(Clone)]
struct VerifyKey {
    alg: Algorithm,
    kid: Option<String>,
    key: DecodingKey,
    validation: Validation,
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

impl fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("alg", &self.alg)
            .field("kid", &self.kid)
            .finish_non_exhaustive()
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
        let header = match &raw.header {
            Some(h) => header_name(h)?,
            None => "authorization".to_owned(),
        };
        let mut keys = Vec::new();
        let mut kids = HashSet::new();
        for spec in &raw.keys {
            let key = load_key(&spec.value, base_dir)?;
            if let (Some(kid), Some(at)) = (&key.kid, &spec.value.kid)
                && !kids.insert(kid.clone())
            {
                return Err(JwtConfigError::at(
                    at,
                    format!("kid {kid:?} names another key too"),
                ));
            }
            keys.push(key);
        }
        if let Some(jwks) = &raw.jwks_file {
            for key in load_jwks(jwks, base_dir)? {
                if let Some(kid) = &key.kid
                    && !kids.insert(kid.clone())
                {
                    return Err(JwtConfigError::at(
                        jwks,
                        format!("kid {kid:?} names another key too"),
                    ));
                }
                keys.push(key);
            }
        }
        if keys.is_empty() {
            return Err(JwtConfigError {
                message: "`jwt` needs at least one key in `keys` or a `jwks_file`; \
                          without one no token could ever be verified"
                    .to_owned(),
                location: None,
            });
        }
        let non_empty = |s: &Option<Spanned<String>>, what: &str| match s {
            Some(v) if v.value.is_empty() => {
                Err(JwtConfigError::at(v, format!("`{what}` must not be empty")))
            }
            Some(v) => Ok(Some(v.value.clone())),
            None => Ok(None),
        };
        Ok(JwtVerifier {
            inner: Arc::new(Inner {
                bearer: header == "authorization",
                header,
                issuer: non_empty(&raw.issuer, "issuer")?,
                audience: non_empty(&raw.audience, "audience")?,
                leeway: raw.leeway.as_ref().map_or(0, |l| l.value),
                max_lifetime: match &raw.max_lifetime {
                    Some(m) if m.value.0.0 <= 0 => {
                        return Err(JwtConfigError::at(m, "`max_lifetime` must be positive"));
                    }
                    Some(m) => Some(m.value.0.as_secs_f64()),
                    None => None,
                },
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

fn header_name(h: &Spanned<String>) -> Result<String, JwtConfigError> {
    // RFC 9110 §5.1: a field name is a token.
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if h.value.is_empty() || !h.value.chars().all(tchar) {
        return Err(JwtConfigError::at(
            h,
            format!("{:?} is not an HTTP header name", h.value),
        ));
    }
    Ok(h.value.to_ascii_lowercase())
}

fn parse_alg(alg: &Spanned<String>) -> Result<Algorithm, JwtConfigError> {
    match alg.value.to_ascii_uppercase().as_str() {
        "HS256" => Ok(Algorithm::HS256),
        "RS256" => Ok(Algorithm::RS256),
        "ES256" => Ok(Algorithm::ES256),
        _ => Err(JwtConfigError::at(
            alg,
            format!(
                "unsupported algorithm {:?}: Sluice accepts HS256, RS256 and ES256",
                alg.value
            ),
        )),
    }
}

/// A verification that leaves the registered claims to
/// [`JwtVerifier::claims_hold`]: jsonwebtoken checks the algorithm and the
/// signature only.
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
    let alg = parse_alg(&spec.alg)?;
    let kid = match &spec.kid {
        Some(k) if k.value.is_empty() => {
            return Err(JwtConfigError::at(k, "`kid` must not be empty"));
        }
        k => k.as_ref().map(|k| k.value.clone()),
    };
    let key = if alg == Algorithm::HS256 {
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
        DecodingKey::from_secret(&secret)
    } else {
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
        pem_key(alg, &pem).map_err(|why| JwtConfigError::at(at, format!("{what}: {why}")))?
    };
    Ok(VerifyKey {
        alg,
        kid,
        key,
        validation: signature_only(alg),
    })
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
        Algorithm::RS256 => jsonwebtoken::jwk::Jwk::from_decoding_key(key, Some(alg)).is_ok(),
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
    let doc: Value = serde_json::from_slice(&bytes).map_err(|e| fail(format!("not JSON ({e})")))?;
    let Some(entries) = doc.get("keys").and_then(Value::as_array) else {
        return Err(fail(
            "a JWKS document is an object with a `keys` array".to_owned(),
        ));
    };
    let mut keys = Vec::new();
    for (n, jwk) in entries.iter().enumerate() {
        let field = |name: &str| jwk.get(name).and_then(Value::as_str);
        if field("use").is_some_and(|u| u != "sig") {
            continue;
        }
        let alg = match (field("kty"), field("crv"), field("alg")) {
            (Some("RSA"), _, None | Some("RS256")) => Algorithm::RS256,
            (Some("EC"), Some("P-256"), None | Some("ES256")) => Algorithm::ES256,
            _ => continue,
        };
        let name = field("kid").map_or_else(|| format!("key {n}"), |k| format!("key {k:?}"));
        let key = match alg {
            Algorithm::RS256 => field("n")
                .zip(field("e"))
                .and_then(|(n, e)| DecodingKey::from_rsa_components(n, e).ok()),
            _ => field("x")
                .zip(field("y"))
                .and_then(|(x, y)| DecodingKey::from_ec_components(x, y).ok())
                .filter(|k| usable(alg, k)),
        }
        .ok_or_else(|| fail(format!("{name} is not a valid {alg:?} public key")))?;
        keys.push(VerifyKey {
            alg,
            kid: field("kid").map(str::to_owned),
            key,
            validation: signature_only(alg),
        });
    }
    if keys.is_empty() {
        return Err(fail("no RS256 or ES256 signing key in it".to_owned()));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use proptest::prelude::*;
    use serde_json::json;

    const NOW: u64 = 1_700_000_000;
    const SECRET: &str = "test-secret-test-secret-test-secret";

    fn dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jwt")
    }

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(dir().join(name)).unwrap()
    }

    /// A verifier from a `jwt` section whose paths are relative to the fixtures.
    fn verifier(yaml: &str) -> JwtVerifier {
        JwtVerifier::from_str(yaml, dir().join("policy.yaml")).unwrap()
    }

    fn config_error(yaml: &str) -> PolicyError {
        JwtVerifier::from_str(yaml, dir().join("policy.yaml")).unwrap_err()
    }

    fn hs(secret: &str) -> EncodingKey {
        EncodingKey::from_secret(secret.as_bytes())
    }
    fn rsa(name: &str) -> EncodingKey {
        EncodingKey::from_rsa_pem(&fixture(name)).unwrap()
    }
    fn ec(name: &str) -> EncodingKey {
        EncodingKey::from_ec_pem(&fixture(name)).unwrap()
    }

    fn sign(alg: Algorithm, kid: Option<&str>, claims: &Value, key: &EncodingKey) -> String {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_owned);
        encode(&header, claims, key).unwrap()
    }

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

    fn hs_verifier() -> JwtVerifier {
        verifier(&format!("keys: [{{alg: HS256, secret: {SECRET}}}]"))
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
        let raw: RawJwt =
            serde_saphyr::from_str(&format!("keys: [{{alg: HS256, secret: {SECRET}}}]")).unwrap();
        let shown = format!("{raw:?}");
        assert!(
            shown.contains("redacted") && !shown.contains(SECRET),
            "{shown}"
        );
    }

    /// The error's position and message.
    fn err(yaml: &str) -> (usize, usize, String) {
        let e = config_error(yaml);
        (e.line, e.column, e.message)
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
    fn section_mistakes_are_placed() {
        let e = err;
        let (l, c, m) = e("keys: [{alg: HS512, secret: x}]");
        assert_eq!((l, c), (1, 14));
        assert!(m.contains("HS256, RS256 and ES256"), "{m}");
        let (_, c, m) = e("keys: [{alg: none}]");
        assert_eq!(c, 14);
        assert!(m.contains("unsupported algorithm"), "{m}");
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
        let (_, _, m) = e("keys: [{alg: RS256, pem_file: rsa.pub.pem, kid: ''}]");
        assert!(m.contains("must not be empty"), "{m}");
        let (_, c, m) = e("{header: 'x token', keys: [{alg: RS256, pem_file: rsa.pub.pem}]}");
        assert_eq!(c, 10);
        assert!(m.contains("not an HTTP header name"), "{m}");
        let (_, _, m) = e("{issuer: '', keys: [{alg: RS256, pem_file: rsa.pub.pem}]}");
        assert!(m.contains("`issuer` must not be empty"), "{m}");
        let (l, c, m) = e("issuer: x\n");
        assert_eq!((l, c), (1, 1));
        assert!(m.contains("at least one key"), "{m}");
        let (_, _, m) = e("keys: []");
        assert!(m.contains("at least one key"), "{m}");
        // Parse errors: unknown fields and negative leeway.
        let (_, _, m) = e("{keys: [{alg: RS256, pem_file: rsa.pub.pem}], audiences: [a]}");
        assert!(m.contains("audiences"), "{m}");
        let (_, _, m) = e("keys: [{alg: RS256, pem_file: rsa.pub.pem, secrets: x}]");
        assert!(m.contains("secrets"), "{m}");
        let (l, c, _) = e("leeway: -1\nkeys: [{alg: RS256, pem_file: rsa.pub.pem}]");
        assert_eq!((l, c), (1, 9));
    }

    #[test]
    fn config_error_converts_with_the_section_as_fallback() {
        let raw: Spanned<RawJwt> = serde_saphyr::from_str("\n\n  issuer: x\n").unwrap();
        let e = JwtVerifier::build(&raw.value, Path::new(".")).unwrap_err();
        assert!(e.location.is_none());
        assert!(e.to_string().contains("at least one key"));
        let invalid = e.into_invalid(&raw);
        assert_eq!(invalid.pos, Pos::from(&raw));
        let raw: Spanned<RawJwt> =
            serde_saphyr::from_str("keys: [{alg: RS256, pem_file: nope.pem}]").unwrap();
        let e = JwtVerifier::build(&raw.value, Path::new(".")).unwrap_err();
        assert!(e.to_string().starts_with("1:31: cannot read"), "{e}");
        assert_eq!(
            e.into_invalid(&raw).pos,
            Pos {
                line: 1,
                column: 31
            }
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
