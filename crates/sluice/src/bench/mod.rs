//! `sluice bench`: a closed-loop load generator for HTTP and gRPC rate
//! limit services.

use clap::Args;

/// Arguments of `sluice bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {}

pub(crate) fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("sluice bench is not implemented yet")
}
