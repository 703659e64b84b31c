//! Flags that several commands share, declared once so that each keeps one
//! name, one environment variable and one type wherever it appears. A
//! command takes them with `#[command(flatten)]`, as `serve` and `proxy`
//! take the connection flags of `listen::Limits`; one whose use of a flag
//! differs says so with `#[command(mut_arg(..))]`.

use std::path::PathBuf;

use clap::Args;

/// `--policy`: the policy file a command runs.
///
/// `serve` takes it as `Option<PolicyFile>` and makes the flag optional,
/// since without one it serves the bundled example.
#[derive(Debug, Args)]
pub(crate) struct PolicyFile {
    /// The policy file, YAML or JSON.
    #[arg(
        id = "policy",
        long = "policy",
        short = 'p',
        value_name = "POLICY",
        env = "SLUICE_POLICY"
    )]
    pub(crate) path: PathBuf,
}

/// `--store`: the store a server opens instead of the one its policy names.
#[derive(Debug, Args)]
pub(crate) struct StoreFlag {
    /// The store, overriding the policy's: `memory`, or a `redis://`,
    /// `rediss://` or `redis+cluster://` URL.
    #[arg(
        id = "store",
        long = "store",
        value_name = "STORE",
        env = "SLUICE_STORE"
    )]
    pub(crate) choice: Option<String>,
}
