//! What `serve` and `proxy` both run on: the store chosen at start-up, the
//! policy put in force over it and reloaded, the metrics recorder, the
//! operational endpoints, logging, and the signal that stops a server.
//! Neither command imports the other; both import this.

mod endpoints;
mod logs;
mod metrics;
mod reload;
mod signals;
mod store;

pub use metrics::Metrics;
pub use store::AnyStore;

pub(crate) use endpoints::{holds_admin_token, metrics_page, problem, readiness, ready};
pub(crate) use logs::init_logs;
pub(crate) use reload::Loaded;
pub(crate) use signals::{Stop, shutdown_signal};

/// The multi-threaded runtime a server runs on.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}
