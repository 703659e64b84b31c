//! Logging: one subscriber per process, writing to standard error, its
//! level set by `RUST_LOG`.

/// Installs the process's subscriber, at `info` unless `RUST_LOG` says
/// otherwise.
pub(crate) fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second initialisation (tests) is harmless; the first one stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
