//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Sluice: exact rate limiting, as a library, a middleware and a server.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Check policy files; prints each error with its file, line and column.
    Validate(ValidateArgs),
    /// Run recorded events through a policy in virtual time, printing one
    /// decision (JSON) per event.
    Replay(ReplayArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ValidateArgs {
    /// Policy files (YAML or JSON).
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// The policy to replay through.
    #[arg(long, short)]
    pub(crate) policy: PathBuf,
    /// Events as JSON Lines sorted by `t`; `-` reads standard input.
    #[arg(long, short)]
    pub(crate) events: PathBuf,
    /// Write decisions here instead of standard output.
    #[arg(long, short)]
    pub(crate) output: Option<PathBuf>,
    /// After the decisions, print per-rule totals: a JSON line
    /// `{"summary": ...}` on the output and a table on standard error.
    #[arg(long)]
    pub(crate) summary: bool,
    /// No progress lines on standard error.
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// Seed for the shard choices of sharded limits, so runs repeat exactly.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
}
