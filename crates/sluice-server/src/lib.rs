//! Sluice's servers, the two long-running commands of the `sluice` binary:
//!
//! - [`serve`]: the HTTP decision API, Envoy's rate limit service (gRPC,
//!   RLS v3), metrics and the dashboard;
//! - [`proxy`]: a reverse proxy that enforces a policy's rules in front of
//!   any HTTP upstream.
//!
//! Both run on what this crate keeps once: the store chosen at start-up
//! ([`StoreChoice`], [`AnyStore`]), the policy put in force and reloaded,
//! the listener with its connection limits and graceful stop ([`listen`]),
//! the operational endpoints and the runtime ([`runtime`]). The flags the
//! commands share are in [`flags`], so that the binary's offline commands
//! (`bench`, `replay`, `migrate`) take them with the same names.
//!
//! The routers are public so that tests, fuzz targets and benchmarks drive
//! a server without a socket: [`serve::app`] over a [`serve::ServerState`],
//! and [`serve::Rls`] for the gRPC service.

mod base;
mod dashboard;
pub mod duration;
pub mod flags;
pub mod listen;
pub mod numbers;
pub mod openapi;
mod ops;
pub mod proxy;
pub mod serve;

pub use base::{AnyStore, Metrics, StoreChoice, runtime};
