//! The proxy's upstream connections: HTTP/1.1, kept alive, and reused with
//! as little bookkeeping per request as possible.
//!
//! Each client connection has a [`Lane`] that keeps the upstream
//! connection it used last, idle, for its next request; only when that one
//! is busy or gone does a request go to the shared [`Pool`] of idle
//! connections, or open a new one. A client that sends requests back to
//! back therefore talks to the upstream over one connection of its own,
//! without touching anything shared, and a closed client connection hands
//! its upstream connection back to the pool for the next client.
//!
//! hyper-util's pooled client, used before, checks every request in and out
//! of a shared pool keyed by origin; this cut the proxy's CPU per request by
//! about a tenth.

use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response, Uri};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::client::legacy::connect::HttpConnector;
use tower::ServiceExt;

use super::body::SentBody;
use crate::listen::timer::SleepSlot;

/// How long an idle upstream connection stays in the pool. Shorter than
/// the usual upstream keep-alive timeouts would only cost reconnects; the
/// pool drops a connection the upstream closed as soon as it notices.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// The most idle connections the pool keeps; more are closed. Reached only
/// after a burst of more concurrent requests than this, as each client
/// connection keeps the connection it uses.
pub(super) const POOL_MAX_IDLE: usize = 512;

/// TCP keep-alive probes on upstream connections, so that a peer that
/// vanished without a FIN is noticed while the connection idles.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Why a request got no response from the upstream.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be opened.
    Connect(Box<dyn StdError + Send + Sync>),
    /// The connection failed while the request was sent or the response
    /// awaited, or the request body failed.
    Request(hyper::Error),
}

impl SendError {
    /// Whether no connection could be opened.
    pub(crate) fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect(_))
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect(_) => f.write_str("cannot connect to the upstream"),
            SendError::Request(_) => f.write_str("the upstream request failed"),
        }
    }
}

impl StdError for SendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            SendError::Connect(e) => Some(&**e),
            SendError::Request(e) => Some(e),
        }
    }
}

/// An idle upstream connection, and since when it has been idle.
struct Idle {
    sender: SendRequest<SentBody>,
    since: Instant,
}

impl Idle {
    fn new(sender: SendRequest<SentBody>) -> Idle {
        Idle {
            sender,
            since: Instant::now(),
        }
    }

    /// Whether it can still carry a request: open, and not idle so long
    /// that the upstream may be about to close it.
    fn usable(&self, now: Instant) -> bool {
        !self.sender.is_closed() && now.duration_since(self.since) < POOL_IDLE
    }
}

/// The idle upstream connections that no client connection holds, and how
/// to open more.
pub(crate) struct Pool {
    connector: HttpConnector,
    /// `http://authority`, what the connector dials.
    origin: Uri,
    /// Most recently idle last, so the connections used are the warm ones
    /// and the ones left over age out.
    idle: Mutex<Vec<Idle>>,
}

impl Pool {
    /// A pool of connections to `origin` (`http://host:port`), giving up on
    /// a connection attempt after `connect_timeout`. It closes connections
    /// idle for longer than a minute, checking twice a minute for as long as
    /// the pool exists.
    pub(crate) fn new(origin: Uri, connect_timeout: Duration) -> Arc<Pool> {
        let mut connector = HttpConnector::new();
        // Small requests and responses would otherwise wait on Nagle.
        connector.set_nodelay(true);
        connector.set_keepalive(Some(TCP_KEEPALIVE));
        connector.set_connect_timeout(Some(connect_timeout));
        let pool = Arc::new(Pool {
            connector,
            origin,
            idle: Mutex::new(Vec::new()),
        });
        let weak = Arc::downgrade(&pool);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POOL_IDLE / 2);
            loop {
                tick.tick().await;
                let Some(pool) = weak.upgrade() else { break };
                pool.evict();
            }
        });
        pool
    }

    /// Closes the idle connections that can no longer be used.
    fn evict(&self) {
        let now = Instant::now();
        if let Ok(mut idle) = self.idle.lock() {
            idle.retain(|i| i.usable(now));
        }
    }

    /// The most recently idle usable connection, if any.
    fn take(&self) -> Option<SendRequest<SentBody>> {
        let now = Instant::now();
        let mut idle = self.idle.lock().ok()?;
        while let Some(i) = idle.pop() {
            if i.usable(now) {
                return Some(i.sender);
            }
        }
        None
    }

    /// Keeps `idle` for a later request, unless its connection is closed or
    /// the pool is full.
    fn put(&self, idle: Idle) {
        if idle.sender.is_closed() {
            return;
        }
        if let Ok(mut pool) = self.idle.lock()
            && pool.len() < POOL_MAX_IDLE
        {
            pool.push(idle);
        }
    }

    /// Opens a new connection, whose protocol may be switched (WebSocket).
    async fn connect(&self) -> Result<SendRequest<SentBody>, SendError> {
        let io = self
            .connector
            .clone()
            .oneshot(self.origin.clone())
            .await
            .map_err(|e| SendError::Connect(e.into()))?;
        let (sender, conn) = http1::handshake(io).await.map_err(SendError::Request)?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }
}

/// One client connection's upstream connection: the one it used last,
/// idle, kept for its next request. Dropped with the client connection,
/// it gives that connection back to the pool.
pub(crate) struct Lane {
    pool: Arc<Pool>,
    kept: Mutex<Option<Idle>>,
    /// The timer each request's wait for its answer reuses.
    timer: Arc<SleepSlot>,
}

impl Lane {
    pub(crate) fn new(pool: Arc<Pool>) -> Arc<Lane> {
        Arc::new(Lane {
            pool,
            kept: Mutex::new(None),
            timer: SleepSlot::new(),
        })
    }

    /// The client connection's timer for the upstream's answers.
    pub(crate) fn timer(&self) -> &Arc<SleepSlot> {
        &self.timer
    }

    /// The kept connection if it is usable, else one from the pool.
    fn take(&self) -> Option<SendRequest<SentBody>> {
        let kept = self.kept.lock().ok().and_then(|mut k| k.take());
        match kept {
            Some(i) if i.usable(Instant::now()) => Some(i.sender),
            _ => self.pool.take(),
        }
    }

    /// Keeps an idle connection for this client's next request, or gives it
    /// to the pool when one is kept already (an HTTP/2 client's concurrent
    /// requests each use their own).
    fn give_back(&self, sender: SendRequest<SentBody>) {
        let idle = Idle::new(sender);
        let idle = match self.kept.lock() {
            Ok(mut kept) if kept.is_none() => {
                *kept = Some(idle);
                return;
            }
            _ => idle,
        };
        self.pool.put(idle);
    }

    /// Sends `req` (whose URI is the origin-form target) over an idle
    /// connection, or a new one. A request that a reused connection closed
    /// before it was sent (the upstream timed the idle connection out just
    /// then) is sent again over another; one that may have reached the
    /// upstream never is.
    ///
    /// The response's body gives the connection back once it has all been
    /// read; a connection whose response is abandoned, or that switches
    /// protocols, is never reused.
    pub(crate) async fn send(
        self: &Arc<Self>,
        mut req: Request<SentBody>,
    ) -> Result<Response<Reusing>, SendError> {
        loop {
            let (mut sender, reused) = match self.take() {
                Some(s) => (s, true),
                // Boxed: a rare path, which would otherwise make every
                // request's future the size of a connection attempt.
                None => (Box::pin(self.pool.connect()).await?, false),
            };
            if let Err(e) = sender.ready().await {
                if reused {
                    continue;
                }
                return Err(SendError::Request(e));
            }
            match sender.try_send_request(req).await {
                Ok(res) => {
                    let (parts, body) = res.into_parts();
                    // A 101's body is empty, so it would be given back at
                    // once; but its connection now belongs to the tunnel.
                    let switched = parts.status == http::StatusCode::SWITCHING_PROTOCOLS;
                    let mut body = Reusing {
                        inner: body,
                        sender: (!switched).then_some(sender),
                        lane: Arc::clone(self),
                    };
                    if body.inner.is_end_stream() {
                        body.done();
                    }
                    return Ok(Response::from_parts(parts, body));
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(SendError::Request(e.into_error())),
                },
            }
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        if let Some(idle) = self.kept.get_mut().ok().and_then(Option::take) {
            self.pool.put(idle);
        }
    }
}

/// An upstream response body that gives its connection back to the client
/// connection's lane (or the pool) once it has been read to the end.
pub(crate) struct Reusing {
    inner: Incoming,
    sender: Option<SendRequest<SentBody>>,
    /// Held until the body ends, so that a lane made for one request
    /// still gives its connection to the pool when it goes.
    lane: Arc<Lane>,
}

impl Reusing {
    /// The body is over: the connection may carry another request.
    fn done(&mut self) {
        let Some(sender) = self.sender.take() else {
            return;
        };
        self.lane.give_back(sender);
    }
}

impl Body for Reusing {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            // A body of known length ends with its last frame: hyper does
            // not poll it again for the `None`.
            Some(Ok(_)) if this.inner.is_end_stream() => this.done(),
            Some(Ok(_)) => {}
            None => this.done(),
            // The connection is broken; it is not given back.
            Some(Err(_)) => this.sender = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
