//! The plain choices a rule or named limit makes: whether it enforces, and
//! what it does with a request that lacks a key part. (What it does when
//! the store fails, [`sluice_core::OnStoreError`], is the store's to define.)

use serde::Deserialize;

/// Whether a rule or limit denies requests or only reports what it would do.
///
/// ```
/// use sluice_policy::Enforcement;
/// assert_eq!(Enforcement::default(), Enforcement::Enforce);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// Denials are enforced.
    #[default]
    Enforce,
    /// Decisions are computed and reported, but requests always pass.
    Shadow,
}

impl Enforcement {
    /// The mode as a policy file writes it.
    ///
    /// ```
    /// use sluice_policy::Enforcement;
    /// assert_eq!(Enforcement::Shadow.as_str(), "shadow");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Enforce => "enforce",
            Enforcement::Shadow => "shadow",
        }
    }
}

/// What a rule does with a request that lacks one of its key parts
/// (`on_missing`).
///
/// ```
/// use sluice_policy::{OnMissing, Policy, RequestParts};
/// let p = Policy::from_str(r#"
/// rules:
///   - name: per-user
///     limit_keys: ["header:x-user"]
///     on_missing: shared
///     algorithm: token_bucket
///     algorithm_config: {rps: 1}
/// "#, "p.yaml").unwrap();
/// assert_eq!(p.rules()[0].on_missing(), OnMissing::Shared);
/// // Anonymous requests share one bucket, apart from every user's.
/// let anonymous = RequestParts::new("GET", "/");
/// let hit = p.matching(&anonymous).next().unwrap();
/// assert_eq!(hit.key, "-:");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMissing {
    /// The rule does not apply.
    #[default]
    Skip,
    /// Such requests share one bucket, apart from every real key's.
    Shared,
    /// Such requests are denied.
    Deny,
}
