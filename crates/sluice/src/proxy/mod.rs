//! `sluice proxy`: a reverse proxy that enforces a policy's rules in front
//! of any HTTP upstream.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

/// Arguments of `sluice proxy`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// The policy whose rules are enforced.
    #[arg(long, short)]
    pub(crate) policy: PathBuf,
    /// The upstream every admitted request goes to, as `http://host:port`.
    #[arg(long)]
    pub(crate) upstream: String,
    /// Where the proxy listens.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub(crate) listen: SocketAddr,
    /// The store, overriding the policy's: `memory`, or a Redis URL.
    #[arg(long)]
    pub(crate) store: Option<String>,
}

pub(crate) fn run(_args: ProxyArgs) -> anyhow::Result<()> {
    anyhow::bail!("sluice proxy is not implemented yet")
}
