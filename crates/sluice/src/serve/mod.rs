//! `sluice serve`: the HTTP decision API and metrics on one port, the
//! policy reloaded when its file changes or on SIGHUP, and a graceful stop
//! on SIGTERM or Ctrl-C.

pub(crate) mod api;
mod body;
mod metrics;
mod rls;
mod store;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use http::Request;
use hyper::body::Incoming;
use sluice_core::Clock;
use sluice_engine::Enforcer;
use sluice_policy::Policy;
use tokio::net::TcpListener;
use tower::ServiceExt;

pub use api::{Api, AppState, MAX_BODY, app, paths};
pub use metrics::Metrics;
pub use rls::{Rls, serve_grpc};
pub use store::AnyStore;

use crate::cli::ServeArgs;
use crate::listen::Listener;

/// The policy `sluice serve` runs without `--policy`.
pub const EXAMPLE_POLICY: &str = include_str!("../../../../examples/policy.yaml");

pub(crate) fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    init_logs();
    // Both listeners may be at their cap at once.
    args.limits.fit_fd_limit(2, crate::listen::OTHER_FDS);
    let (policy, text) = match &args.policy {
        Some(path) => crate::reload::load(path)?,
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
        // What a reloaded policy's `store` is compared with.
        let running = args.store.is_none().then(|| policy.store().clone());
        let state = Arc::new(AppState {
            enforcer: Arc::new(Enforcer::new(policy, store)),
            admin_token: args.admin_token.filter(|t| !t.is_empty()),
            metrics: Metrics::global(),
            reload_error: arc_swap::ArcSwapOption::empty(),
        });
        if let Some(path) = args.policy.clone() {
            let state = Arc::clone(&state);
            tokio::spawn(crate::reload::watch(path, text, move |path, text| {
                let running = running.as_ref();
                crate::reload::reload(path, text, &state.enforcer, &state.reload_error, running);
            }));
        }
        let listener = TcpListener::bind(args.http)
            .await
            .with_context(|| format!("cannot listen on {}", args.http))?;
        let grpc = TcpListener::bind(args.grpc)
            .await
            .with_context(|| format!("cannot listen on {}", args.grpc))?;
        tracing::info!(addr = %listener.local_addr()?, "serving the decision API");
        tracing::info!(addr = %grpc.local_addr()?, "serving Envoy's rate limit service");
        let listener = Listener::new(listener, "http", &args.limits);
        let grpc = Listener::new(grpc, "grpc", &args.limits);
        // One signal stops both servers; each lets its requests finish.
        let (stop, stopped) = tokio::sync::watch::channel(());
        let on_stop = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.changed().await;
            }
        };
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = stop.send(());
        });
        // If either server fails, the other is dropped with it.
        tokio::try_join!(
            serve(listener, Arc::clone(&state), args.body_timeout, on_stop()),
            serve_grpc(grpc, state, args.body_timeout, on_stop()),
        )
        .map(|_| ())
    })
}

/// Serves the API on `listener` until `stop` completes, then lets requests
/// in flight finish within the listener's shutdown timeout. A client has 30
/// seconds to send a request's headers and `body_timeout` to send its body.
pub async fn serve<C: Clock + Send + Sync + 'static>(
    listener: Listener,
    state: Arc<AppState<C>>,
    body_timeout: Duration,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = app(state);
    let per_connection = move |_| {
        let app = app.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let req = req.map(|body| body::Deadline::new(body, body_timeout));
            app.clone().oneshot(req)
        })
    };
    crate::listen::serve_connections(listener, per_connection, stop).await;
    Ok(())
}

pub(crate) fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second initialisation (tests) is harmless; the first one stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub(crate) async fn shutdown_signal() {
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
