//! Flags that several commands share, declared once so that each keeps one
//! name, one environment variable and one type wherever it appears. A
//! command takes them with `#[command(flatten)]`, as `serve` and `proxy`
//! take the connection flags of `listen::Limits`; one whose use of a flag
//! differs says so with `#[command(mut_arg(..))]`.

use std::num::NonZeroUsize;
use std::path::PathBuf;

use clap::Args;

/// `--policy`: the policy file a command runs.
///
/// `serve` takes it as `Option<PolicyFile>` and makes the flag optional,
/// since without one it serves the bundled example.
#[derive(Debug, Args)]
pub struct PolicyFile {
    /// The policy file, YAML or JSON.
    #[arg(
        id = "policy",
        long = "policy",
        short = 'p',
        value_name = "POLICY",
        env = "SLUICE_POLICY"
    )]
    pub path: PathBuf,
}

/// `--store`: the store a server opens instead of the one its policy names.
#[derive(Debug, Args)]
pub struct StoreFlag {
    /// The store, overriding the policy's: `memory`, a `redis://`,
    /// `rediss://` or `redis+cluster://` URL, or a `postgres://` or
    /// `postgresql://` URL.
    #[arg(
        id = "store",
        long = "store",
        value_name = "STORE",
        env = "SLUICE_STORE"
    )]
    pub choice: Option<String>,
    /// How long each call to a Redis or PostgreSQL store may take before
    /// it counts as failed (and each rule's `on_store_error` applies),
    /// e.g. `200ms`; over the policy's `timeout_ms`. The memory store has
    /// none.
    #[arg(
        id = "store-timeout",
        long = "store-timeout",
        value_name = "DURATION",
        env = "SLUICE_STORE_TIMEOUT",
        value_parser = crate::duration::parse,
    )]
    pub timeout: Option<std::time::Duration>,
}

/// `--threads`: how many threads a server, or a benchmark's client, runs
/// its connections on.
#[derive(Debug, Default, Args)]
pub struct Threads {
    /// Worker threads; one for each CPU this process may use unless given.
    /// On one thread the process runs tokio's single-threaded scheduler,
    /// which answers the same and costs less per request than a
    /// multi-threaded one with a single worker.
    #[arg(
        id = "threads",
        long = "threads",
        value_name = "N",
        env = "SLUICE_THREADS",
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024),
    )]
    pub count: Option<usize>,
}

impl Threads {
    /// The number given, or the CPUs this process may use (its affinity
    /// mask and CPU quota), or one when that cannot be read.
    pub fn get(&self) -> usize {
        self.count
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, NonZeroUsize::get))
    }
}
