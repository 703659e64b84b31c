//! `sluice bench baseline`: the fastest server the HTTP stack allows, for
//! `sluice serve` to be measured against, and a trivial upstream for
//! `sluice proxy`.
//!
//! It runs what `sluice serve` runs under its router (the runtime serve
//! builds for the same `--threads`, hyper-util's HTTP/1 + HTTP/2 auto
//! builder, and connections with `TCP_NODELAY`, as serve's listener sets
//! them) and answers every request, whatever its method and path, with a
//! fixed body shaped like `/v1/limit`'s answer. The difference
//! between the two is then what a decision costs: routing, parsing the
//! call, the limiter and serializing the answer.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

/// The answer to every request: an allowed `/v1/limit` decision.
const ANSWER: &str = r#"{"allowed":true,"limit":20,"remaining":19,"retry_after":null,"reset":0.3}"#;

/// Arguments of `sluice bench baseline`.
#[derive(Debug, Args)]
// A benchmark's threads are its own: `SLUICE_THREADS`, set for a server,
// does not reach it.
#[command(mut_arg("threads", |a| a.env(None::<&'static str>)))]
pub(super) struct BaselineArgs {
    /// Where to listen; port 0 picks a free one. The address bound is
    /// printed on standard output once the server accepts connections.
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// Milliseconds each answer waits before it is sent, to stand for an
    /// upstream that does real work (a proxy's overhead is measured against
    /// the service it fronts, not against an empty one).
    #[arg(long, default_value_t = 0.0, value_parser = super::non_negative_ms)]
    delay_ms: f64,
    #[command(flatten)]
    threads: sluice_server::flags::Threads,
}

/// Serves until the process is stopped (SIGTERM, SIGINT: nothing to clean
/// up, so the default action is right).
pub(super) fn run(args: &BaselineArgs) -> anyhow::Result<()> {
    super::runtime(&args.threads)?.block_on(async {
        let listener = super::announce(args.listen)?;
        let builder = auto::Builder::new(TokioExecutor::new());
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    stream
                }
                Err(e) => {
                    // Out of file descriptors, most likely: wait for
                    // connections to close rather than spin.
                    eprintln!("sluice bench baseline: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let builder = builder.clone();
            let delay = Duration::from_secs_f64(args.delay_ms / 1e3);
            tokio::spawn(async move {
                // A client going away mid-request is not the server's
                // problem; there is nothing to report.
                let _ = builder
                    .serve_connection(
                        TokioIo::new(stream),
                        service_fn(move |req| answer(req, delay)),
                    )
                    .await;
            });
        }
    })
}

/// Reads and discards the request body, waits `delay`, then answers with
/// [`ANSWER`].
async fn answer(
    req: Request<Incoming>,
    delay: Duration,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut res = Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(res)
}
