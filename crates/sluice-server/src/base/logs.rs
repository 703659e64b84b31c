//! Logging: one subscriber per process, writing to standard error, its
//! level set by `RUST_LOG`.

use std::io::IsTerminal;

/// Installs the process's subscriber, at `info` unless `RUST_LOG` says
/// otherwise. Levels are coloured only on a terminal: in a file or a log
/// collector the escape codes would be noise around every level name.
pub(crate) fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second initialisation (tests) is harmless; the first one stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
