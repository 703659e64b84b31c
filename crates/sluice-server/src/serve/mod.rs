//! `sluice serve`: the HTTP decision API and metrics on one port, the
//! policy reloaded when its file changes or on SIGHUP, and a graceful stop
//! on SIGTERM or Ctrl-C.

mod api;
mod body;
mod rls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use http::Request;
use hyper::body::Incoming;
use sluice_core::Clock;
use sluice_policy::Policy;
use tower::ServiceExt;

pub use api::{Api, MAX_BODY, app, paths};
pub use rls::{Rls, serve_grpc, serve_rate_limit_service};
// What a `ServerState` is made of, so that one can be built from here alone.
pub use crate::base::{AnyStore, Metrics};
pub use crate::dashboard::Dashboard;
pub use crate::ops::ServerState;

use crate::base::{Loaded, Stop};
use crate::flags::{PolicyFile, StoreFlag, Threads};
use crate::listen::{Limits, Listener};

/// The policy `sluice serve` runs without `--policy`.
pub const EXAMPLE_POLICY: &str = include_str!("../../../../examples/policy.yaml");

/// Arguments of `sluice serve`.
#[derive(Debug, Args)]
#[command(mut_arg("policy", |policy| policy
    .required(false)
    .help("The policy; without one, the bundled example policy is served")))]
pub struct ServeArgs {
    #[command(flatten)]
    pub(crate) policy: Option<PolicyFile>,
    /// Where the HTTP decision API, /metrics, /healthz, /readyz and the
    /// dashboard (/ui) listen.
    #[arg(long, default_value = "127.0.0.1:8080", env = "SLUICE_HTTP")]
    pub(crate) http: SocketAddr,
    /// Where Envoy's rate limit service (gRPC, RLS v3) listens.
    #[arg(long, default_value = "127.0.0.1:8081", env = "SLUICE_GRPC")]
    pub(crate) grpc: SocketAddr,
    #[command(flatten)]
    pub(crate) store: StoreFlag,
    /// The bearer token that admin endpoints (`/v1/reset`) require; without
    /// one they are disabled. The dashboard (`/ui`, `/v1/stats`) requires it
    /// too when it is set.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub(crate) admin_token: Option<String>,
    /// The bearer token that the privileged parts of a call need: `force`,
    /// `reserve` on /v1/limit, a limit brought inline, and /v1/refund (the
    /// admin token will do too). Without one they are open to every caller
    /// that reaches the API.
    #[arg(long, env = "SLUICE_API_TOKEN", hide_env_values = true)]
    pub(crate) api_token: Option<String>,
    /// How long a request body may take to arrive in full, e.g. `10s`; past
    /// it the request gets a 408. For a gRPC call, how long the whole call
    /// may take.
    #[arg(long, env = "SLUICE_BODY_TIMEOUT", default_value = "10s", value_parser = crate::duration::parse)]
    pub(crate) body_timeout: Duration,
    /// The most names of limits that calls bring with them (`algorithm` and
    /// `algorithm_config` on `/v1/limit`) this server keeps; a call naming
    /// another gets a 422.
    #[arg(long, env = "SLUICE_MAX_INLINE_LIMITS", default_value_t = sluice_engine::DEFAULT_MAX_INLINE_LIMITS)]
    pub(crate) max_inline_limits: usize,
    #[command(flatten)]
    pub(crate) limits: Limits,
    #[command(flatten)]
    pub(crate) threads: Threads,
}

/// Runs `sluice serve` with `args` until a signal stops it.
pub fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    crate::base::init_logs();
    // Both listeners may be at their cap at once.
    args.limits.fit_fd_limit(2, crate::listen::OTHER_FDS);
    let loaded = match &args.policy {
        Some(file) => Loaded::read(&file.path)?,
        None => Loaded::fixed(
            Policy::from_str(EXAMPLE_POLICY, "examples/policy.yaml")?,
            "the bundled example (examples/policy.yaml); --policy serves another",
        ),
    };
    crate::base::block_on(&args.threads, async move {
        let (enforcer, reloads, store) = loaded.enforce(&args.store)?;
        let enforcer = Arc::new(enforcer.with_max_inline_limits(args.max_inline_limits));
        let policy_file = args.policy.as_ref().map(|f| f.path.clone());
        let dashboard = Dashboard::start(&enforcer, policy_file);
        let tokens = (args.admin_token, args.api_token);
        let state = ServerState::start(enforcer, store, reloads, Some(dashboard), tokens);
        if state.api_token.is_none() {
            tracing::warn!(
                "no --api-token: force, reserve, refunds and limits brought inline are open \
                 to any caller who can reach the decision API"
            );
        }
        let listener = crate::listen::bind(args.http)
            .with_context(|| format!("cannot listen on {}", args.http))?;
        let grpc = crate::listen::bind(args.grpc)
            .with_context(|| format!("cannot listen on {}", args.grpc))?;
        tracing::info!(addr = %listener.local_addr()?, "serving the decision API");
        tracing::info!(addr = %grpc.local_addr()?, "serving Envoy's rate limit service");
        let listener = Listener::new(listener, "http", &args.limits);
        let grpc = Listener::new(grpc, "grpc", &args.limits);
        let stop = Stop::on_signal();
        // If either server fails, the other is dropped with it.
        tokio::try_join!(
            serve(
                listener,
                Arc::clone(&state),
                args.body_timeout,
                stop.stopped()
            ),
            serve_grpc(grpc, state, args.body_timeout, stop.stopped()),
        )
        .map(|_| ())
    })?
}

/// Serves the API on `listener` until `stop` completes, then lets requests
/// in flight finish within the listener's shutdown timeout. A client has 30
/// seconds to send a request's headers and `body_timeout` to send its body.
pub async fn serve<C: Clock + Send + Sync + 'static>(
    listener: Listener,
    state: Arc<ServerState<C>>,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use clap::Parser;

    use super::ServeArgs;

    #[derive(Debug, Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn parse(args: &[&str]) -> ServeArgs {
        Serve::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn serve_takes_the_shared_policy_flag_but_may_go_without_it() {
        assert!(parse(&[]).policy.is_none());
        let args = parse(&["-p", "a.yaml", "--store", "memory"]);
        assert_eq!(args.policy.unwrap().path, Path::new("a.yaml"));
        assert_eq!(args.store.choice.as_deref(), Some("memory"));
    }
}
