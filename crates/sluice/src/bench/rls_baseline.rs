//! `sluice bench rls-baseline`: the fastest Envoy rate limit service the
//! gRPC stack allows, for `sluice serve`'s RLS to be measured against, as
//! `sluice bench baseline` is for its HTTP API.
//!
//! It runs what `sluice serve` runs for RLS (serve's listener, and tonic's
//! server with the same call timeout and HTTP/2 keep-alive, on the runtime
//! serve builds for the same `--threads`) and answers every
//! `ShouldRateLimit` with `OK` and one `OK` status per descriptor, without
//! deciding anything. The difference between the two
//! is then what a decision costs: matching the rules, the limiter, and the
//! statuses and headers of the answer.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use sluice_server::listen::{Limits, Listener};
use sluice_server::serve::serve_rate_limit_service;

/// Arguments of `sluice bench rls-baseline`.
#[derive(Debug, Args)]
// A benchmark's threads are its own: `SLUICE_THREADS`, set for a server,
// does not reach it.
#[command(mut_arg("threads", |a| a.env(None::<&'static str>)))]
pub(super) struct RlsBaselineArgs {
    /// Where to listen; port 0 picks a free one. The address bound is
    /// printed on standard output once the server accepts connections.
    #[arg(long, default_value = "127.0.0.1:8091")]
    listen: SocketAddr,
    #[command(flatten)]
    threads: sluice_server::flags::Threads,
}

/// Answers every call with `OK`.
struct AlwaysOk;

#[tonic::async_trait]
impl RateLimitService for AlwaysOk {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let statuses = request
            .into_inner()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok.into(),
                ..DescriptorStatus::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

/// Serves until the process is stopped (SIGTERM, SIGINT: nothing to clean
/// up, so the default action is right).
pub(super) fn run(args: &RlsBaselineArgs) -> anyhow::Result<()> {
    super::runtime(&args.threads)?.block_on(async {
        let tcp = super::announce(args.listen)?;
        // `sluice serve`'s listener, with its default limits, and its
        // server, with its default call timeout. Serve's server can be
        // shut down, and tonic then checks for the signal each time it
        // polls a connection; the floor does that work too, though nothing
        // ever signals it.
        let listener = Listener::new(tcp, "grpc", &Limits::default());
        serve_rate_limit_service(
            listener,
            AlwaysOk,
            Duration::from_secs(10),
            std::future::pending(),
        )
        .await
    })
}
