//! The upstream the proxy tests forward to: a real axum server that
//! records what reaches it and answers in the ways the tests need (echoing
//! a request, streaming, waiting at a gate, switching protocols), and one
//! that closes each connection after a single answer.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

/// What the upstream saw, and the hooks tests use to pace it.
#[derive(Default)]
pub(crate) struct Seen {
    hits: AtomicUsize,
    ports: Mutex<HashSet<u16>>,
    /// Receives the first chunk of a `/stream-in` body.
    pub(crate) first_chunk: Mutex<Option<oneshot::Sender<Bytes>>>,
    /// Receives how a `/stream-in` body ended: whole, or broken off.
    pub(crate) body_end: Mutex<Option<oneshot::Sender<Result<Bytes, String>>>>,
    /// The body `/stream-out` answers with.
    pub(crate) stream_out: Mutex<Option<mpsc::Receiver<Bytes>>>,
    /// `/gate` answers once this resolves; `arrived` says it is waiting.
    pub(crate) gate: Mutex<Option<oneshot::Receiver<()>>>,
    pub(crate) arrived: Mutex<Option<oneshot::Sender<()>>>,
    /// `/busy` requests being answered now, and the most there ever were.
    busy: AtomicUsize,
    most_busy: AtomicUsize,
    /// Each request's path and when it arrived, in order of arrival.
    arrivals: Mutex<Vec<(String, Instant)>>,
}

impl Seen {
    pub(crate) fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub(crate) fn ports(&self) -> usize {
        self.ports.lock().unwrap().len()
    }

    /// The most `/busy` requests the upstream was ever answering at once.
    pub(crate) fn most_busy(&self) -> usize {
        self.most_busy.load(Ordering::SeqCst)
    }

    /// Each request's path and when it arrived, in order of arrival.
    pub(crate) fn arrivals(&self) -> Vec<(String, Instant)> {
        self.arrivals.lock().unwrap().clone()
    }
}

/// A slow endpoint: each request takes 20 ms of the upstream's time (its
/// work, not a wait for anything), counted while it lasts. The response
/// streams a first chunk, then the rest once the work is done, so that the
/// request is in flight until its body ends.
async fn busy(State(seen): State<Arc<Seen>>) -> Response {
    let now = seen.busy.fetch_add(1, Ordering::SeqCst) + 1;
    seen.most_busy.fetch_max(now, Ordering::SeqCst);
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        let _ = tx.send(Bytes::from_static(b"working ")).await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        seen.busy.fetch_sub(1, Ordering::SeqCst);
        let _ = tx.send(Bytes::from_static(b"done")).await;
    });
    Response::new(Body::new(ChannelBody(rx)))
}

/// Counts each request, and the connection it came on, and notes when it
/// arrived, before it is answered.
async fn record(
    State(seen): State<Arc<Seen>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path().to_owned();
    seen.arrivals.lock().unwrap().push((path, Instant::now()));
    seen.hits.fetch_add(1, Ordering::SeqCst);
    seen.ports.lock().unwrap().insert(peer.port());
    next.run(req).await
}

/// Answers with everything it received, as JSON.
async fn echo(req: Request) -> axum::Json<Value> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let mut headers = serde_json::Map::new();
    for name in parts.headers.keys() {
        let values: Vec<Value> = parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| Value::from(v.to_str().unwrap()))
            .collect();
        headers.insert(name.as_str().to_owned(), Value::Array(values));
    }
    axum::Json(json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "version": format!("{:?}", parts.version),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    }))
}

/// Streams the request body straight back.
async fn mirror(req: Request) -> Response {
    Response::new(req.into_body())
}

/// Reports the first chunk as soon as it arrives, then answers with the
/// whole body.
async fn stream_in(State(seen): State<Arc<Seen>>, req: Request) -> String {
    let mut body = req.into_body();
    let first = loop {
        let frame = body.frame().await.unwrap().unwrap();
        if let Ok(data) = frame.into_data() {
            break data;
        }
    };
    if let Some(tx) = seen.first_chunk.lock().unwrap().take() {
        let _ = tx.send(first.clone());
    }
    let rest = body.collect().await.map(|b| b.to_bytes());
    let end = seen.body_end.lock().unwrap().take();
    let rest = match (rest, end) {
        (Ok(rest), end) => {
            if let Some(tx) = end {
                let _ = tx.send(Ok(rest.clone()));
            }
            rest
        }
        (Err(e), Some(tx)) => {
            let _ = tx.send(Err(e.to_string()));
            return String::new();
        }
        (Err(e), None) => panic!("a /stream-in body broke off: {e}"),
    };
    format!(
        "{}{}",
        String::from_utf8_lossy(&first),
        String::from_utf8_lossy(&rest)
    )
}

/// A body fed by a channel, chunk by chunk, as the test decides.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

async fn stream_out(State(seen): State<Arc<Seen>>) -> Response {
    let rx = seen.stream_out.lock().unwrap().take().unwrap();
    Response::new(Body::new(ChannelBody(rx)))
}

async fn gate(State(seen): State<Arc<Seen>>) -> &'static str {
    let rx = seen.gate.lock().unwrap().take().unwrap();
    if let Some(tx) = seen.arrived.lock().unwrap().take() {
        let _ = tx.send(());
    }
    rx.await.unwrap();
    "through the gate"
}

/// A response with every kind of hop-by-hop header.
async fn hop() -> Response {
    (
        [
            ("connection", "x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-authenticate", "Basic realm=x"),
            ("trailer", "x-sum"),
            ("upgrade", "h2c"),
            ("x-kept", "yes"),
        ],
        "hop",
    )
        .into_response()
}

/// Switches to an echo protocol when asked to, as a WebSocket server
/// switches to WebSocket: `101` with the protocol asked for, then every
/// byte received is sent back. Without `Connection: upgrade` it refuses
/// with 426, so a proxy that dropped the hop-by-hop request fails here.
async fn switch(mut req: Request) -> Response {
    let asks = req
        .headers()
        .get("connection")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("upgrade"));
    let Some(protocol) = req.headers().get("upgrade").cloned().filter(|_| asks) else {
        return (http::StatusCode::UPGRADE_REQUIRED, "ask to upgrade").into_response();
    };
    let on = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let upgraded = TokioIo::new(on.await.unwrap());
        let (mut rx, mut tx) = tokio::io::split(upgraded);
        tokio::io::copy(&mut rx, &mut tx).await.unwrap();
    });
    Response::builder()
        .status(http::StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "upgrade")
        .header("upgrade", protocol)
        .body(Body::empty())
        .unwrap()
}

/// Starts the recording upstream on a free loopback port.
pub(crate) async fn start_upstream() -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let app = Router::new()
        .route("/mirror", post(mirror))
        .route("/stream-in", post(stream_in))
        .route("/stream-out", get(stream_out))
        .route("/gate", get(gate))
        .route("/hop", get(hop))
        .route("/switch", get(switch))
        .route("/slow", any(std::future::pending::<&'static str>))
        .route("/busy", get(busy))
        .fallback(echo)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&seen),
            record,
        ))
        .with_state(Arc::clone(&seen));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    (addr, seen)
}

/// An upstream that answers one request per connection and then closes it
/// without saying so first, as a server whose keep-alive timeout has run
/// out does. Sends on `closed` after each close.
pub(crate) async fn one_request_upstream(closed: mpsc::UnboundedSender<()>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let mut stream = BufReader::new(stream);
            let mut line = String::new();
            loop {
                line.clear();
                if stream.read_line(&mut line).await.unwrap() == 0 || line == "\r\n" {
                    break;
                }
            }
            let res = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nonce";
            stream.get_mut().write_all(res).await.unwrap();
            stream.get_mut().shutdown().await.unwrap();
            drop(stream);
            let _ = closed.send(());
        }
    });
    addr
}
