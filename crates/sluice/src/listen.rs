//! The accept loop that `serve` and `proxy` share: HTTP/1.1 (kept alive)
//! or cleartext HTTP/2 on each connection, a deadline for a request's
//! headers, and a graceful drain when told to stop.

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

/// How long a client has to send a request's headers; a connection that
/// idles longer mid-request is closed (slowloris).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The pause after a failed `accept` (out of file descriptors, usually),
/// so that the loop does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves every connection accepted on `listener` with the service
/// `service` makes for its peer, until `stop` completes; then stops
/// accepting, closes idle connections, and returns once the requests in
/// flight have been answered.
pub(crate) async fn serve_connections<S, B>(
    listener: TcpListener,
    service: impl Fn(SocketAddr) -> S,
    stop: impl Future<Output = ()>,
) where
    S: Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // Small responses (429s above all) would otherwise wait on Nagle.
        let _ = stream.set_nodelay(true);
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service(peer))
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                // Clients hanging up mid-request are routine.
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tracing::debug!(connections = graceful.count(), "draining connections");
    graceful.shutdown().await;
}
