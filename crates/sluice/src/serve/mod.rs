//! `sluice serve`: the HTTP decision API and metrics on one port, the
//! policy reloaded when its file changes or on SIGHUP, and a graceful stop
//! on SIGTERM or Ctrl-C.

mod api;
mod metrics;
mod store;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sluice_http::Enforcer;
use sluice_policy::Policy;
use tokio::net::TcpListener;

pub use api::{AppState, MAX_BODY, app};
pub use metrics::Metrics;
pub use store::AnyStore;

use crate::cli::ServeArgs;

/// The policy `sluice serve` runs without `--policy`.
pub const EXAMPLE_POLICY: &str = include_str!("../../../../examples/policy.yaml");

/// How often the policy file is looked at for changes.
const WATCH_EVERY: Duration = Duration::from_secs(1);

pub(crate) fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_logs();
    let (policy, text) = match &args.policy {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("{}: cannot read the policy file", path.display()))?;
            (Policy::from_str(&text, path)?, text)
        }
        None => (
            Policy::from_str(EXAMPLE_POLICY, "examples/policy.yaml")?,
            EXAMPLE_POLICY.to_owned(),
        ),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let store = AnyStore::open(args.store.as_deref(), policy.store())?;
        let state = Arc::new(AppState {
            enforcer: Arc::new(Enforcer::new(policy, store)),
            admin_token: args.admin_token.filter(|t| !t.is_empty()),
            metrics: Metrics::global(),
            reload_error: arc_swap::ArcSwapOption::empty(),
        });
        if let Some(path) = args.policy.clone() {
            tokio::spawn(watch(path, text, Arc::clone(&state)));
        }
        let listener = TcpListener::bind(args.http)
            .await
            .with_context(|| format!("cannot listen on {}", args.http))?;
        tracing::info!(addr = %listener.local_addr()?, "serving the decision API");
        serve(listener, state, shutdown_signal()).await
    })
}

/// Serves the API on `listener` until `stop` completes, then lets requests
/// in flight finish.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = app(state).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
        .context("the HTTP server failed")
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second initialisation (tests) is harmless; the first one stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("stopping: finishing requests in flight");
}

/// Reloads the policy when the file's contents change, and on SIGHUP.
///
/// The file is read by path each time, so in-place writes, atomic renames
/// and Kubernetes' ConfigMap symlink swaps all show up as new contents; the
/// contents, not timestamps, decide whether anything changed.
async fn watch(path: PathBuf, mut current: String, state: Arc<AppState>) {
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let forced = {
            let hup_recv = async {
                match hup.as_mut() {
                    Some(h) => {
                        h.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep(WATCH_EVERY) => false,
                () = hup_recv => true,
            }
        };
        #[cfg(not(unix))]
        let forced = {
            tokio::time::sleep(WATCH_EVERY).await;
            false
        };
        let Ok(text) = tokio::fs::read_to_string(&path).await else {
            // Mid-swap, or gone: keep serving, and look again shortly.
            continue;
        };
        if text == current && !forced {
            continue;
        }
        reload(&path, &text, &state);
        current = text;
    }
}

/// Puts `text` in force if it is a valid policy; otherwise keeps the old
/// one and says why on `/readyz`, in the logs and in a metric.
pub fn reload<C: sluice_core::Clock>(path: &Path, text: &str, state: &AppState<C>) {
    match Policy::from_str(text, path) {
        Ok(policy) => {
            state.enforcer.replace(policy);
            state.reload_error.store(None);
            ::metrics::counter!("sluice_policy_reloads_total", "result" => "ok").increment(1);
            ::metrics::gauge!("sluice_policy_reload_failed").set(0.0);
            tracing::info!(path = %path.display(), "policy reloaded");
        }
        Err(e) => {
            ::metrics::counter!("sluice_policy_reloads_total", "result" => "error").increment(1);
            ::metrics::gauge!("sluice_policy_reload_failed").set(1.0);
            tracing::error!(error = %e, "policy reload failed; the previous policy stays in force");
            state.reload_error.store(Some(Arc::new(e.to_string())));
        }
    }
}
