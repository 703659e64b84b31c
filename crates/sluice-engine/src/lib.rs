//! The one Sluice decision. Every front end — the tower middleware, the
//! reverse proxy, `serve`'s HTTP API and Envoy RLS, and `replay` — hands a
//! request (or a named-limit call) to an [`Enforcer`] and gets back a
//! [`Verdict`]: allowed or not, each enforced rule's decision, the shadow
//! rules' results, and why a request was refused outright. How a verdict is
//! told to a client (headers, a 429 body, a gRPC status, a replay line) is
//! each front end's business; what the verdict is, is decided only here.
//!
//! A crate of its own, not a module of `sluice-policy` or `sluice-http`:
//! the policy crate parses and matches and knows no store, and the HTTP
//! crate speaks HTTP, which replay and Envoy RLS do not. The engine needs
//! both a policy and a [`Store`](sluice_core::Store), and nothing of any
//! protocol.
//!
//! ```
//! use sluice_core::MemoryStore;
//! use sluice_engine::Enforcer;
//! use sluice_policy::{Policy, RequestParts};
//! let policy = Policy::from_str(r#"
//! rules:
//!   - name: per-ip
//!     limit_keys: [ip:address]
//!     algorithm: token_bucket
//!     algorithm_config: {rps: 1, burst: 1}
//! "#, "policy.yaml").unwrap();
//! let enforcer = Enforcer::new(policy, MemoryStore::new());
//! let req = RequestParts::new("GET", "/").with_ip([192, 0, 2, 1].into());
//! let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! assert!(rt.block_on(enforcer.enforce(&req)).allowed);
//! assert_eq!(rt.block_on(enforcer.enforce(&req)).denied_by(), Some("per-ip"));
//! ```

mod activity;
mod enforcer;
mod give_back;
mod inline;
mod leases;
mod meters;
mod reservation;
mod store_errors;
mod top_keys;
mod verdict;
mod verified;

pub use activity::{Activity, LATENCY_BUCKETS, RuleActivity, StoreActivity};
pub use enforcer::{Enforcer, NotReady};
pub use inline::{DEFAULT_MAX_INLINE_LIMITS, InlineError, MAX_INLINE_NAME};
pub use leases::{HeldLease, HeldLeases};
pub use reservation::{Reservation, Reserved};
pub use top_keys::{MAX_KEY_BYTES, MINUTES, TopKey, TopKeys};
pub use verdict::{NamedDecision, Refusal, RuleDecision, ShadowDecision, Verdict};
pub use verified::Verified;
