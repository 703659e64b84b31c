//! Command-line arguments.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

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
    Proxy(crate::proxy::ProxyArgs),
    /// Load-test a running `sluice serve`, `sluice proxy` or any HTTP or
    /// gRPC rate limit service.
    Bench(crate::bench::BenchArgs),
    /// Check policy files; prints each error with its file, line and column.
    Validate(ValidateArgs),
    /// Run recorded events through a policy in virtual time, printing one
    /// decision (JSON) per event.
    Replay(ReplayArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ValidateArgs {
    /// Policy files (YAML or JSON).
    #[arg(required = true, env = "SLUICE_POLICY", value_delimiter = ',')]
    pub(crate) files: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// The policy to replay through.
    #[arg(long, short, env = "SLUICE_POLICY")]
    pub(crate) policy: PathBuf,
    /// Events as JSON Lines sorted by `t`; `-` reads standard input.
    #[arg(long, short, env = "SLUICE_EVENTS")]
    pub(crate) events: PathBuf,
    /// Write decisions here instead of standard output.
    #[arg(long, short, env = "SLUICE_OUTPUT")]
    pub(crate) output: Option<PathBuf>,
    /// After the decisions, print per-rule totals: a JSON line
    /// `{"summary": ...}` on the output and a table on standard error.
    #[arg(long, env = "SLUICE_SUMMARY")]
    pub(crate) summary: bool,
    /// No progress lines on standard error.
    #[arg(long, short, env = "SLUICE_QUIET")]
    pub(crate) quiet: bool,
    /// Seed for the shard choices of sharded limits, so runs repeat exactly.
    #[arg(long, default_value_t = 0, env = "SLUICE_SEED")]
    pub(crate) seed: u64,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The policy; without one, the bundled example policy is served.
    #[arg(long, short, env = "SLUICE_POLICY")]
    pub(crate) policy: Option<PathBuf>,
    /// Where the HTTP decision API, /metrics, /healthz and /readyz listen.
    #[arg(long, default_value = "127.0.0.1:8080", env = "SLUICE_HTTP")]
    pub(crate) http: SocketAddr,
    /// Where Envoy's rate limit service (gRPC, RLS v3) listens.
    #[arg(long, default_value = "127.0.0.1:8081", env = "SLUICE_GRPC")]
    pub(crate) grpc: SocketAddr,
    /// The store, overriding the policy's: `memory`, or a `redis://`,
    /// `rediss://` or `redis+cluster://` URL.
    #[arg(long, env = "SLUICE_STORE")]
    pub(crate) store: Option<String>,
    /// The bearer token that admin endpoints (`/v1/reset`) require. Without
    /// one they are disabled.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub(crate) admin_token: Option<String>,
    /// How long a request body may take to arrive in full, e.g. `10s`; past
    /// it the request gets a 408. For a gRPC call, how long the whole call
    /// may take.
    #[arg(long, env = "SLUICE_BODY_TIMEOUT", default_value = "10s", value_parser = crate::duration::parse)]
    pub(crate) body_timeout: Duration,
    #[command(flatten)]
    pub(crate) limits: crate::listen::Limits,
}
