//! `sluice bench grpc`: Envoy RLS v3 `ShouldRateLimit` calls, N in flight,
//! spread over C HTTP/2 connections (tonic channels) that the workers share.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::time::{Instant, sleep_until, timeout_at};
use tonic::transport::{Channel, Endpoint};

use super::report::{Protocol, Tally};
use super::template::{Template, key};
use super::{LoadArgs, Seat, Window};

/// How long a worker waits after the channel reported the server
/// unavailable, so that a server that is down is not hammered.
const UNAVAILABLE_PAUSE: Duration = Duration::from_millis(100);

/// Arguments of `sluice bench grpc`.
#[derive(Debug, Args)]
pub(super) struct GrpcArgs {
    #[command(flatten)]
    pub(super) load: LoadArgs,
    /// The rate limit domain of every call (the bundled example policy's
    /// Envoy rule is in `edge`).
    #[arg(long, default_value = "edge")]
    domain: String,
    /// A descriptor entry, as `key=value`; `{key}` in the value is replaced
    /// by a key. Repeatable: the entries form one descriptor, in order.
    /// Defaults to `remote_address={key}`, what the example policy keys on.
    #[arg(long = "descriptor", value_name = "KEY=VALUE")]
    descriptors: Vec<String>,
    /// HTTP/2 connections the calls are spread over.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    connections: u32,
    /// The hits each call adds (`hits_addend`).
    #[arg(long, default_value_t = 1)]
    hits: u32,
}

/// Everything a worker needs to make calls, computed once.
#[derive(Debug)]
struct Plan {
    domain: String,
    entries: Vec<(String, Template)>,
    hits: u32,
    keys: u64,
}

impl Plan {
    fn new(args: &GrpcArgs) -> anyhow::Result<Self> {
        let given: Vec<&str> = if args.descriptors.is_empty() {
            vec!["remote_address={key}"]
        } else {
            args.descriptors.iter().map(String::as_str).collect()
        };
        let entries = given
            .into_iter()
            .map(|d| {
                let (k, v) = d
                    .split_once('=')
                    .filter(|(k, _)| !k.is_empty())
                    .with_context(|| format!("--descriptor {d:?}: expected KEY=VALUE"))?;
                Ok((k.to_owned(), Template::new(v)))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Plan {
            domain: args.domain.clone(),
            entries,
            hits: args.hits,
            keys: args.load.keys,
        })
    }

    /// A call for a random key. Protobuf messages own their strings, so
    /// each call renders its own; that costs little next to HTTP/2 framing.
    fn request(&self, rng: &mut fastrand::Rng) -> RateLimitRequest {
        let key = key(rng.u64(..self.keys));
        let entries = self
            .entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.clone(),
                value: v.render_with(&key),
            })
            .collect();
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries,
                ..Default::default()
            }],
            hits_addend: self.hits,
        }
    }

    /// How the calls look, for the report.
    fn describe(&self) -> String {
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|(k, v)| format!("{k}={}", v.render_with("{key}")))
            .collect();
        format!(
            "ShouldRateLimit domain={} descriptor=[{}]",
            self.domain,
            entries.join(",")
        )
    }
}

/// Runs the load and prints the result.
pub(super) async fn run(args: &GrpcArgs) -> anyhow::Result<()> {
    let load = &args.load;
    let plan = Arc::new(Plan::new(args)?);
    let addr = load.target.resolve().await?;
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .with_context(|| format!("{addr} makes no URI"))?
        .tcp_nodelay(true);
    // More connections than calls in flight would leave some idle.
    let connections = args.connections.min(load.concurrency);
    let mut channels = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        // Connecting eagerly makes an unreachable target one clear error.
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("cannot connect to {} ({addr})", load.target.authority))?;
        channels.push(channel);
    }
    let window = Window::new(load);
    let tally = super::drive(load, window, |i, seat| {
        let client = RateLimitServiceClient::new(channels[i % channels.len()].clone());
        worker(client, Arc::clone(&plan), seat)
    })
    .await?;
    super::print(
        load,
        Protocol::Grpc,
        &plan.describe(),
        connections,
        window,
        &tally,
    )
}

/// The outcome index of an answer: OK, OVER_LIMIT, anything else.
fn outcome(res: &RateLimitResponse) -> usize {
    match Code::try_from(res.overall_code) {
        Ok(Code::Ok) => 0,
        Ok(Code::OverLimit) => 1,
        _ => 2,
    }
}

/// Makes calls back to back until the window ends.
async fn worker(
    mut client: RateLimitServiceClient<Channel>,
    plan: Arc<Plan>,
    mut seat: Seat,
) -> Tally {
    let mut rng = fastrand::Rng::new();
    while let Some(deadline) = seat.deadline() {
        let req = plan.request(&mut rng);
        let t0 = Instant::now();
        let status = match timeout_at(deadline, client.should_rate_limit(req)).await {
            Ok(Ok(res)) => {
                let t1 = Instant::now();
                let o = outcome(res.get_ref());
                if seat.window.measures(t1) {
                    seat.tally.answer(o, t1 - t0);
                    if o >= 2 {
                        seat.tally.problem(&"answered overall_code UNKNOWN");
                    }
                }
                seat.live.add(o >= 2);
                continue;
            }
            Ok(Err(status)) => status,
            Err(_) => {
                // Abandoned at the end of the run, or an error after
                // --seat.timeout; the channel reconnects by itself.
                if Instant::now() >= seat.window.end {
                    break;
                }
                tonic::Status::deadline_exceeded(format!("no answer within {:?}", seat.timeout))
            }
        };
        if seat.window.measures(Instant::now()) {
            seat.tally.error();
            seat.tally
                .problem(&format_args!("{:?}: {}", status.code(), status.message()));
        }
        let unavailable = status.code() == tonic::Code::Unavailable;
        seat.live.add(true);
        if unavailable {
            sleep_until((Instant::now() + UNAVAILABLE_PAUSE).min(seat.window.end)).await;
        }
    }
    seat.tally
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: GrpcArgs,
    }

    fn plan(argv: &[&str]) -> anyhow::Result<Plan> {
        let mut all = vec!["x", "--target", "h:1"];
        all.extend_from_slice(argv);
        Plan::new(&Cli::try_parse_from(all)?.args)
    }

    #[test]
    fn descriptors_become_one_descriptor_with_keys_substituted() {
        let p = plan(&["--descriptor", "tenant=acme", "--descriptor", "user={key}"]).unwrap();
        let req = p.request(&mut fastrand::Rng::with_seed(1));
        assert_eq!(req.domain, "edge");
        assert_eq!(req.hits_addend, 1);
        let e = &req.descriptors[0].entries;
        assert_eq!((e[0].key.as_str(), e[0].value.as_str()), ("tenant", "acme"));
        assert!(e[1].value.starts_with("user:"), "{}", e[1].value);
        assert_eq!(
            p.describe(),
            "ShouldRateLimit domain=edge descriptor=[tenant=acme,user={key}]"
        );
        assert_eq!(plan(&[]).unwrap().entries[0].0, "remote_address");
        assert!(plan(&["--descriptor", "novalue"]).is_err());
        assert!(plan(&["--descriptor", "=v"]).is_err());
    }
}
