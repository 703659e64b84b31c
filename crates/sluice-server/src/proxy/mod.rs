//! `sluice proxy`: a reverse proxy that enforces a policy's rules in front
//! of any HTTP upstream.
//!
//! Each request passes [`sluice_http::RateLimitLayer`] first, exactly as
//! with the middleware: the client address is the socket peer unless the
//! peer is one of the policy's `trusted_proxies`, admitted responses carry
//! the `RateLimit-Policy`/`RateLimit` and legacy headers, and denied
//! requests get a 429 problem+json with `Retry-After` without the upstream
//! ever seeing them. Admitted requests are forwarded over a pool of
//! kept-alive HTTP/1.1 connections, bodies streamed both ways.
//!
//! What the upstream sees:
//! - the method, path and query (under the upstream's base path, if it has
//!   one), headers and body as the client sent them;
//! - `Host` as the client sent it (proxied services usually route, link and
//!   rate limit by it), or the request target's authority when it has one,
//!   as the rules saw it; with `X-Forwarded-Host` the same and
//!   `X-Forwarded-Proto: http`, both kept as received only from trusted
//!   proxies;
//! - `X-Forwarded-For` with the peer address appended, and the same for
//!   `Forwarded` when the client sent one;
//! - no hop-by-hop headers: `Connection` and the headers it names,
//!   `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade` and
//!   `Proxy-*` are removed from requests and from responses;
//! - except a protocol switch: an HTTP/1.1 request with `Connection:
//!   upgrade` keeps its `Upgrade` header, and if the upstream answers `101
//!   Switching Protocols` the client gets that answer (with the rate limit
//!   headers) and then a byte tunnel to the upstream, so WebSockets work.
//!   The request that opens a tunnel is what the rules count; a tunnel stays
//!   open until either side closes it or the proxy stops.
//!
//! A request whose rules all delay (`on_limit: {delay}`) and that is over
//! its limit is held until its reservation is due, then forwarded; at most
//! `--max-held` at once (see [`sluice_http::RateLimit`]).
//!
//! When the upstream refuses connections or breaks off, the client gets a
//! 502; when it takes longer than the timeout to start its response, a
//! 504; when the client stops sending a request body for longer than the
//! body timeout, a 408; all as `application/problem+json`.

mod admin;
mod body;
mod forward;
mod pool;
mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use http::Request;
use hyper::body::Incoming;
use sluice_core::Store;
use sluice_engine::Enforcer;
use sluice_http::{PeerAddr, RateLimitLayer};
use tower::{Layer, ServiceExt};

pub use admin::paths as admin_paths;
pub use upstream::{DEFAULT_BODY_TIMEOUT, DEFAULT_TIMEOUT, Upstream, UpstreamError};

use crate::base::{Loaded, Stop};
use crate::dashboard::Dashboard;
use crate::flags::{PolicyFile, StoreFlag, Threads};
use crate::listen::{Limits, Listener};
use crate::ops::ServerState;

/// Arguments of `sluice proxy`.
#[derive(Debug, Args)]
#[command(mut_arg("policy", |policy| policy
    .help("The policy whose rules are enforced; reloaded when the file changes and on SIGHUP")))]
pub struct ProxyArgs {
    #[command(flatten)]
    pub(crate) policy: PolicyFile,
    /// The upstream every admitted request goes to, as `http://host:port`,
    /// optionally with a base path (`http://host:port/api`).
    #[arg(long, env = "SLUICE_UPSTREAM")]
    pub(crate) upstream: String,
    /// Where the proxy listens.
    #[arg(long, default_value = "127.0.0.1:8000", env = "SLUICE_LISTEN")]
    pub(crate) listen: SocketAddr,
    #[command(flatten)]
    pub(crate) store: StoreFlag,
    /// How long the upstream has to start its response once the request is
    /// sent (and to accept a connection), e.g. `30s`, `500ms`, `2m`; past
    /// it the client gets a 504.
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse, env = "SLUICE_UPSTREAM_TIMEOUT")]
    pub(crate) upstream_timeout: Duration,
    /// How long a client may pause while sending a request body, e.g.
    /// `60s`; past it the request is abandoned with a 408, so that a slow
    /// sender cannot hold an upstream connection indefinitely.
    #[arg(long, default_value = "60s", value_parser = crate::duration::parse, env = "SLUICE_BODY_TIMEOUT")]
    pub(crate) body_timeout: Duration,
    /// Where `/metrics`, `/healthz`, `/readyz` and the dashboard (`/ui`)
    /// listen; without it there is no admin listener.
    #[arg(long, env = "SLUICE_ADMIN")]
    pub(crate) admin: Option<SocketAddr>,
    /// The token that the dashboard (`/ui`, `/v1/stats`) requires, as a
    /// bearer token or a browser's password; without one it is open to
    /// whoever reaches the admin listener.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub(crate) admin_token: Option<String>,
    /// The most requests held at once, over all clients and keys, by rules
    /// that delay (`on_limit: {delay}`); while that many are held, a
    /// request over its limit is refused as without the delay. Each held
    /// request keeps its connection and a task.
    #[arg(long, default_value_t = sluice_http::DEFAULT_MAX_HELD, env = "SLUICE_MAX_HELD")]
    pub(crate) max_held: usize,
    #[command(flatten)]
    pub(crate) limits: Limits,
    #[command(flatten)]
    pub(crate) threads: Threads,
}

/// Runs `sluice proxy` with `args` until a signal stops it.
pub fn run(mut args: ProxyArgs) -> anyhow::Result<()> {
    crate::base::init_logs();
    // A client connection may hold an upstream connection, and an admin
    // listener has its own cap.
    let per_connection = 2 + usize::from(args.admin.is_some());
    args.limits.fit_fd_limit(
        per_connection,
        crate::listen::OTHER_FDS + pool::POOL_MAX_IDLE,
    );
    let upstream = Upstream::parse(&args.upstream)?
        .with_timeout(args.upstream_timeout)
        .with_body_timeout(args.body_timeout);
    let loaded = Loaded::read(&args.policy.path)?;
    crate::base::block_on(&args.threads, async move {
        let (enforcer, reloads, store) = loaded.enforce(&args.store)?;
        let enforcer = Arc::new(enforcer);
        // Sampled only when there is a listener to show it on.
        let dashboard = args
            .admin
            .map(|_| Dashboard::start(&enforcer, Some(args.policy.path.clone())));
        let tokens = (args.admin_token, None);
        let status = ServerState::start(enforcer, store, reloads, dashboard, tokens);
        let listener = crate::listen::bind(args.listen)
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let listener = Listener::new(listener, "proxy", &args.limits);

        // One stop for every listener: the first signal drains them all.
        let stop = Stop::on_signal();
        let admin = match args.admin {
            Some(addr) => {
                let admin_listener = crate::listen::bind(addr)
                    .with_context(|| format!("cannot listen on {addr} (admin)"))?;
                tracing::info!(addr = %admin_listener.local_addr()?, "admin endpoints");
                let admin_listener = Listener::new(admin_listener, "admin", &args.limits);
                let router = admin::router(Arc::clone(&status));
                let per_connection =
                    move |_| hyper_util::service::TowerToHyperService::new(router.clone());
                Some(tokio::spawn(crate::listen::serve_connections(
                    admin_listener,
                    per_connection,
                    stop.stopped(),
                )))
            }
            None => None,
        };
        tracing::info!(addr = %listener.local_addr()?, %upstream, "proxying");
        let limit = RateLimitLayer::new(Arc::clone(&status.enforcer)).with_max_held(args.max_held);
        let server = tokio::spawn(proxy_with(listener, limit, upstream, stop.stopped()));

        stop.stopped().await;
        // Requests in flight may finish until the shutdown timeout; a second
        // signal cuts them short.
        let drain = async {
            let _ = server.await;
            if let Some(admin) = admin {
                let _ = admin.await;
            }
        };
        tokio::select! {
            () = drain => {}
            () = crate::base::shutdown_signal() => {
                tracing::warn!("second signal: stopping without waiting for requests in flight");
            }
        }
        Ok(())
    })?
}

/// Proxies connections accepted on `listener` to `upstream`, applying the
/// policy of `enforcer` to every request, until `stop` completes; then
/// stops accepting, closes idle connections, and returns once the requests
/// in flight have been answered or the listener's shutdown timeout has
/// passed.
///
/// Clients may speak HTTP/1.1 (kept alive) or HTTP/2 without TLS; the
/// upstream is spoken to in HTTP/1.1 over pooled connections.
///
/// ```no_run
/// use std::sync::Arc;
/// use sluice_server::listen::{Limits, Listener};
/// use sluice_server::proxy::{Upstream, proxy};
/// use sluice_core::MemoryStore;
/// use sluice_http::Enforcer;
/// use sluice_policy::Policy;
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let policy = Policy::from_str(r#"
/// rules:
///   - name: per-ip
///     limit_keys: [ip:address]
///     algorithm: token_bucket
///     algorithm_config: {rps: 10, burst: 20}
/// "#, "policy.yaml")?;
/// let enforcer = Arc::new(Enforcer::new(policy, MemoryStore::new()));
/// let listener = sluice_server::listen::bind("127.0.0.1:8000".parse()?)?;
/// let listener = Listener::new(listener, "proxy", &Limits::default());
/// let upstream = Upstream::parse("http://127.0.0.1:9000")?;
/// proxy(listener, enforcer, upstream, async {
///     let _ = tokio::signal::ctrl_c().await;
/// })
/// .await;
/// # Ok(())
/// # }
/// ```
pub async fn proxy<S: Store + 'static>(
    listener: Listener,
    enforcer: Arc<Enforcer<S>>,
    upstream: Upstream,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    proxy_with(listener, RateLimitLayer::new(enforcer), upstream, stop).await;
}

/// [`proxy`], deciding with `limit`: its enforcer, and its cap on held
/// requests ([`RateLimitLayer::with_max_held`]).
pub async fn proxy_with<S: Store + 'static>(
    listener: Listener,
    limit: RateLimitLayer<S>,
    upstream: Upstream,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let forward = forward::Forward::new(upstream, Arc::clone(limit.enforcer()));
    let per_connection = move |peer: SocketAddr| {
        // Requests on one client connection reuse one upstream connection.
        let service = limit.layer(forward.for_connection());
        hyper::service::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(PeerAddr(peer));
            service.clone().oneshot(req)
        })
    };
    crate::listen::serve_connections(listener, per_connection, stop).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use clap::Parser;
    use clap::error::ErrorKind;

    use super::ProxyArgs;

    #[derive(Debug, Parser)]
    struct Proxy {
        #[command(flatten)]
        args: ProxyArgs,
    }

    fn parse(args: &[&str]) -> Result<ProxyArgs, clap::Error> {
        Proxy::try_parse_from(std::iter::once("proxy").chain(args.iter().copied())).map(|p| p.args)
    }

    #[test]
    fn proxy_needs_a_policy_and_takes_its_store_from_it_unless_told() {
        let err = parse(&["--upstream", "http://u"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
        let args = parse(&["--upstream", "http://u", "--policy", "b.yaml"]).unwrap();
        assert_eq!(args.policy.path, Path::new("b.yaml"));
        assert!(args.store.choice.is_none());
    }
}
