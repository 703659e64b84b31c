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
//!
//! The parts depend on each other in one direction: `verifier` checks tokens
//! with the keys that `keys` loads from the section that `config` describes
//! and validates.

mod config;
mod keys;
#[cfg(test)]
mod test_fixtures;
mod verifier;

pub(crate) use config::RawJwt;
pub use verifier::{Claims, JwtVerifier, bearer_token};
