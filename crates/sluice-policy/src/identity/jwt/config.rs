//! The `jwt` section as written, the checks on its settings, and the error
//! that places a mistake at the value responsible.

use std::fmt;

use jsonwebtoken::Algorithm;
use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use crate::error::{Invalid, Pos, at};

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

impl RawJwt {
    /// The lowercase name of the header that carries the token.
    pub(super) fn header_name(&self) -> Result<String, JwtConfigError> {
        let Some(h) = &self.header else {
            return Ok("authorization".to_owned());
        };
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

    /// The issuer `iss` must equal, if one is configured.
    pub(super) fn issuer(&self) -> Result<Option<String>, JwtConfigError> {
        non_empty(&self.issuer, "issuer")
    }

    /// The audience `aud` must name, if one is configured.
    pub(super) fn audience(&self) -> Result<Option<String>, JwtConfigError> {
        non_empty(&self.audience, "audience")
    }

    /// Seconds of clock skew allowed on `exp` and `nbf`.
    pub(super) fn leeway(&self) -> u64 {
        self.leeway.as_ref().map_or(0, |l| l.value)
    }

    /// Seconds `exp` may be ahead of now; `None` when not configured.
    pub(super) fn max_lifetime(&self) -> Result<Option<f64>, JwtConfigError> {
        match &self.max_lifetime {
            Some(m) if m.value.0.0 <= 0 => {
                Err(JwtConfigError::at(m, "`max_lifetime` must be positive"))
            }
            Some(m) => Ok(Some(m.value.0.as_secs_f64())),
            None => Ok(None),
        }
    }
}

impl RawJwtKey {
    /// The algorithm the key verifies; only those Sluice accepts.
    pub(super) fn algorithm(&self) -> Result<Algorithm, JwtConfigError> {
        let alg = &self.alg;
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

    /// The key's id, which tokens name in their `kid` header.
    pub(super) fn key_id(&self) -> Result<Option<String>, JwtConfigError> {
        match &self.kid {
            Some(k) if k.value.is_empty() => Err(JwtConfigError::at(k, "`kid` must not be empty")),
            k => Ok(k.as_ref().map(|k| k.value.clone())),
        }
    }
}

fn non_empty(s: &Option<Spanned<String>>, what: &str) -> Result<Option<String>, JwtConfigError> {
    match s {
        Some(v) if v.value.is_empty() => {
            Err(JwtConfigError::at(v, format!("`{what}` must not be empty")))
        }
        Some(v) => Ok(Some(v.value.clone())),
        None => Ok(None),
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
    pub(super) fn at<T>(value: &Spanned<T>, message: impl fmt::Display) -> JwtConfigError {
        JwtConfigError {
            message: message.to_string(),
            location: Some(value.referenced),
        }
    }

    /// A problem of the section as a whole rather than of one value in it.
    pub(super) fn of_section(message: impl fmt::Display) -> JwtConfigError {
        JwtConfigError {
            message: message.to_string(),
            location: None,
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::identity::jwt::JwtVerifier;
    use crate::identity::jwt::test_fixtures::{SECRET, err};

    #[test]
    fn section_mistakes_are_placed() {
        let e = err;
        let (l, c, m) = e("keys: [{alg: HS512, secret: x}]");
        assert_eq!((l, c), (1, 14));
        assert!(m.contains("HS256, RS256 and ES256"), "{m}");
        let (_, c, m) = e("keys: [{alg: none}]");
        assert_eq!(c, 14);
        assert!(m.contains("unsupported algorithm"), "{m}");
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
    fn raw_debug_output_hides_secrets() {
        let raw: RawJwt =
            serde_saphyr::from_str(&format!("keys: [{{alg: HS256, secret: {SECRET}}}]")).unwrap();
        let shown = format!("{raw:?}");
        assert!(
            shown.contains("redacted") && !shown.contains(SECRET),
            "{shown}"
        );
    }
}
