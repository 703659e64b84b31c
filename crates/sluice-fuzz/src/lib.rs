//! The bodies of Sluice's fuzz targets, one public function per target.
//!
//! Each function takes the fuzzer's bytes, drives one parser or service of
//! the real crates with them, and panics when a property it checks fails, so
//! that libFuzzer records the input. The cargo-fuzz crate in `fuzz/` calls
//! these functions and nothing else, and `tests/corpus.rs` replays the seed
//! corpus and every recorded crash through them, so a fixed crash stays fixed
//! under `cargo test`.
//!
//! | target      | function          | input                                             |
//! |-------------|-------------------|---------------------------------------------------|
//! | `policy`    | [`policy`]        | policy text, YAML or JSON                         |
//! | `client_ip` | [`client_ip`]     | a peer address, then forwarding header lines      |
//! | `jwt`       | [`jwt`]           | an `Authorization` value or a bare token          |
//! | `api`       | [`api`]           | an endpoint digit, then a JSON body or a query    |
//! | `api_calls` | [`api_calls`]     | lines: endpoint, caller, then a body or a query   |
//! | `rls`       | [`rls`]           | a protobuf `RateLimitRequest`                     |

// A harness reports a broken property by panicking: that is how libFuzzer
// learns that an input is a crash.
#![allow(clippy::panic, clippy::expect_used)]

mod api;
mod api_calls;
mod client_ip;
mod jwt;
mod policy;
mod rls;
mod service;

pub use api::api;
pub use api_calls::api_calls;
pub use client_ip::client_ip;
pub use jwt::jwt;
pub use policy::policy;
pub use rls::rls;

/// The body of a fuzz target.
pub type Target = fn(&[u8]);

/// The targets by name, as cargo-fuzz and the corpus directories name them.
pub const TARGETS: [(&str, Target); 6] = [
    ("policy", policy),
    ("client_ip", client_ip),
    ("jwt", jwt),
    ("api", api),
    ("api_calls", api_calls),
    ("rls", rls),
];
