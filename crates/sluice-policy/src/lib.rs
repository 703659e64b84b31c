//! The Sluice policy file: parsing and validation with line/column errors,
//! rule matching, limit-key extraction and cost sources.
//!
//! A policy names limits that applications call directly (`limits`) and
//! request rules that the middleware, proxy and replay tool apply (`rules`).
//! [`Policy::from_path`] loads one; [`Policy::matching`] says which rules apply
//! to a request, under which key and at what cost.
//!
//! ```
//! use sluice_policy::{Policy, RequestParts};
//! let policy = Policy::from_str(r#"
//! rules:
//!   - name: per-ip
//!     limit_keys: [ip:address]
//!     match: {path_prefix: /api/}
//!     algorithm: token_bucket
//!     algorithm_config: {rps: 10, burst: 20}
//! "#, "policy.yaml")?;
//! let req = RequestParts::new("GET", "/api/items").with_ip([203, 0, 113, 9].into());
//! let hits: Vec<_> = policy.matching(&req).collect();
//! assert_eq!(hits[0].rule.limit().algorithm().capacity(), 20.0);
//! # Ok::<(), sluice_policy::PolicyError>(())
//! ```

mod builder;
mod compile;
mod condition;
mod error;
mod files;
mod identity;
mod inline;
mod keys;
mod load;
mod matching;
mod penalty;
mod policy;
mod request;
mod schema;
mod secs;
mod settings;

pub use builder::{PolicyBuilder, RuleBuilder};
pub use condition::Condition;
pub use error::{PolicyError, PolicyWarning};
pub use files::{MAX_KEY_FILE_BYTES, MAX_POLICY_BYTES, read_capped};
pub use identity::client_ip::{ForwardingHeader, TrustedProxies, TrustedProxiesError};
pub use identity::jwt::{Claims, JwtVerifier, bearer_token};
pub use keys::{
    Cost, CostSource, DEFAULT_IPV6_PREFIX, LimitKey, decode_key, encode_key, readable_key,
};
pub use matching::RuleHit;
pub use penalty::Penalty;
pub use policy::{NamedLimit, Policy, Rule, StoreConfig};
pub use request::{Request, RequestParts};
pub use settings::{Enforcement, OnMissing};
/// Also a rule's and a named limit's setting, so it is at hand here.
pub use sluice_core::OnStoreError;
