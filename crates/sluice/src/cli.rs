//! Command-line arguments: the commands, each with the arguments its own
//! module declares.

use clap::{Parser, Subcommand};

use crate::bench::BenchArgs;
use crate::proxy::ProxyArgs;
use crate::replay::ReplayArgs;
use crate::serve::ServeArgs;
use crate::validate::ValidateArgs;

/// Sluice: exact rate limiting, as a library, a middleware and a server.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Serve the HTTP decision API, Envoy's rate limit service (gRPC) and
    /// Prometheus metrics.
    Serve(ServeArgs),
    /// Enforce a policy's rules in front of any HTTP upstream.
    Proxy(ProxyArgs),
    /// Load-test a running `sluice serve`, `sluice proxy` or any HTTP or
    /// gRPC rate limit service.
    Bench(BenchArgs),
    /// Check policy files; prints each error with its file, line and column.
    Validate(ValidateArgs),
    /// Run recorded events through a policy in virtual time, printing one
    /// decision (JSON) per event.
    Replay(ReplayArgs),
}
