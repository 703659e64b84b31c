//! `sluice bench http`: N workers, each on its own keep-alive HTTP/1.1
//! connection, each sending its next request when the previous answer has
//! been read in full.

use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use http::header::{CONTENT_TYPE, HOST};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep, sleep_until, timeout_at};

use super::report::{Protocol, Tally};
use super::template::{Keyed, Template};
use super::{LoadArgs, Seat, Window};

/// The body sent by default: one call of the example policy's limit, on a
/// random key.
const DEFAULT_BODY: &str = r#"{"limit":"sendMessage","key":"{key}"}"#;

/// How long a worker waits before connecting again after a failed connect,
/// so that a server that is down is not hammered with connects.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

/// Arguments of `sluice bench http`.
#[derive(Debug, Args)]
pub(super) struct HttpArgs {
    #[command(flatten)]
    pub(super) load: LoadArgs,
    /// The request method.
    #[arg(long, short = 'X', default_value = "POST")]
    method: String,
    /// The request path (and query); `{key}` is replaced by a key.
    #[arg(long, default_value = "/v1/limit")]
    path: String,
    /// The request body; `{key}` is replaced by a key. Defaults to
    /// `{"limit":"sendMessage","key":"{key}"}` for methods that carry a
    /// body, and to none for GET, HEAD, DELETE and OPTIONS.
    #[arg(long)]
    body: Option<String>,
    /// An extra request header, as `Name: value`; repeatable.
    #[arg(long = "header", short = 'H', value_name = "NAME:VALUE")]
    headers: Vec<String>,
}

/// Everything a worker needs to make requests, computed once.
#[derive(Debug)]
struct Plan {
    method: Method,
    paths: Keyed<Uri>,
    bodies: Keyed<Bytes>,
    headers: HeaderMap,
    keys: u64,
}

impl Plan {
    fn new(args: &HttpArgs) -> anyhow::Result<Self> {
        let method = Method::from_bytes(args.method.to_ascii_uppercase().as_bytes())
            .with_context(|| format!("--method {:?} is not an HTTP method", args.method))?;
        if !args.path.starts_with('/') {
            anyhow::bail!("--path {:?} must start with /", args.path);
        }
        let keys = args.load.keys;
        let paths = Keyed::new(&Template::new(&args.path), keys, |p| {
            Uri::try_from(p.as_str()).with_context(|| format!("--path {p:?} is not a valid path"))
        })?;
        let bodyless = [Method::GET, Method::HEAD, Method::DELETE, Method::OPTIONS];
        let body = match &args.body {
            Some(b) => b.as_str(),
            None if bodyless.contains(&method) => "",
            None => DEFAULT_BODY,
        };
        let bodies = Keyed::new(&Template::new(body), keys, |b| Ok(Bytes::from(b)))?;
        let mut headers = HeaderMap::new();
        for h in &args.headers {
            let (name, value) = parse_header(h)?;
            headers.append(name, value);
        }
        if !headers.contains_key(HOST) {
            let host = &args.load.target.authority;
            headers.insert(HOST, HeaderValue::from_str(host).context("a bad host")?);
        }
        if !body.is_empty() && !headers.contains_key(CONTENT_TYPE) {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        Ok(Plan {
            method,
            paths,
            bodies,
            headers,
            keys,
        })
    }

    /// A request for a random key.
    fn request(&self, rng: &mut fastrand::Rng) -> anyhow::Result<Request<Full<Bytes>>> {
        let k = rng.u64(..self.keys);
        let uri = self.paths.get(k, |p| Ok(Uri::try_from(p)?))?;
        let body = self.bodies.get(k, |b| Ok(Bytes::from(b)))?;
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = self.headers.clone();
        Ok(req)
    }
}

/// Parses `Name: value`.
fn parse_header(h: &str) -> anyhow::Result<(HeaderName, HeaderValue)> {
    let (name, value) = h
        .split_once(':')
        .with_context(|| format!("--header {h:?}: expected NAME:VALUE"))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .with_context(|| format!("--header {h:?}: {:?} is not a header name", name.trim()))?;
    let value = HeaderValue::from_str(value.trim())
        .with_context(|| format!("--header {h:?}: not a valid header value"))?;
    Ok((name, value))
}

/// Runs the load and prints the result.
pub(super) async fn run(args: &HttpArgs) -> anyhow::Result<()> {
    let load = &args.load;
    let plan = Arc::new(Plan::new(args)?);
    let addr = load.target.resolve().await?;
    // One connection up front: an unreachable target is one clear error,
    // not a run full of transport errors.
    connect(addr)
        .await
        .with_context(|| format!("cannot connect to {} ({addr})", load.target.authority))?;
    let window = Window::new(load);
    let tally = super::drive(load, window, |_, seat| {
        worker(Arc::clone(&plan), addr, seat)
    })
    .await?;
    let what = format!("{} {}", plan.method, args.path);
    super::print(
        load,
        Protocol::Http,
        &what,
        load.concurrency,
        window,
        &tally,
    )
}

/// A keep-alive HTTP/1.1 connection: the handle requests are sent on, and
/// the connection's I/O, which the worker polls itself while it waits for an
/// answer. Driving both from one task, instead of spawning the connection as
/// a task of its own, saves two cross-task wake-ups per request, which is a
/// good part of the client's cost on a fast server.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    io: Pin<Box<Connection<TokioIo<TcpStream>, Full<Bytes>>>>,
}

/// Opens a connection.
async fn connect(addr: SocketAddr) -> anyhow::Result<Conn> {
    let stream = TcpStream::connect(addr).await?;
    // Requests are written whole; waiting for more to coalesce only adds
    // latency.
    stream.set_nodelay(true)?;
    let (sender, io) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    Ok(Conn {
        sender,
        io: Box::pin(io),
    })
}

/// How one request ended.
enum Exchange {
    /// Answered, the answer read to the end.
    Answered(StatusCode),
    /// The connection had been closed by the server before the request was
    /// sent (`Connection: close`, an idle timeout): not the request's fault.
    Closed,
    /// The request failed.
    Failed(anyhow::Error),
    /// No answer by the deadline.
    TimedOut,
}

/// Sends `req` on `conn` and reads the answer, unless `deadline` comes
/// first. `watchdog` is the worker's one timer: it is re-armed only when
/// it fires early, so that a request does not cost a timer registration.
async fn exchange(
    conn: &mut Conn,
    req: Request<Full<Bytes>>,
    watchdog: &mut Pin<&mut Sleep>,
    deadline: Instant,
) -> (Exchange, bool) {
    let sender = &mut conn.sender;
    let send = async move {
        if sender.ready().await.is_err() {
            return Exchange::Closed;
        }
        let res = match sender.send_request(req).await {
            Ok(res) => res,
            Err(e) => return Exchange::Failed(e.into()),
        };
        let status = res.status();
        let mut body = res.into_body();
        while let Some(frame) = body.frame().await {
            if let Err(e) = frame {
                return Exchange::Failed(e.into());
            }
        }
        Exchange::Answered(status)
    };
    let mut send = pin!(send);
    let mut io_done = false;
    let outcome = loop {
        tokio::select! {
            biased;
            outcome = &mut send => break outcome,
            // Once the connection has ended the request resolves too (its
            // channel is gone); it is polled alone until then.
            _ = &mut conn.io, if !io_done => io_done = true,
            () = watchdog.as_mut() => {
                if Instant::now() >= deadline {
                    break Exchange::TimedOut;
                }
                watchdog.as_mut().reset(deadline);
            }
        }
    };
    (outcome, io_done)
}

/// The outcome index of a status: 2xx, 429, other.
fn outcome(status: StatusCode) -> usize {
    if status.is_success() {
        0
    } else if status == StatusCode::TOO_MANY_REQUESTS {
        1
    } else {
        2
    }
}

/// Sends requests back to back on one connection until the window ends.
async fn worker(plan: Arc<Plan>, addr: SocketAddr, mut seat: Seat) -> Tally {
    let mut rng = fastrand::Rng::new();
    let mut conn: Option<Conn> = None;
    // Fires no later than the end, so that a request stuck then is
    // abandoned on time.
    let watchdog = sleep_until((seat.window.start + seat.timeout).min(seat.window.end));
    let mut watchdog = pin!(watchdog);
    while let Some(deadline) = seat.deadline() {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match timeout_at(deadline, connect(addr)).await {
                Ok(Ok(c)) => conn.insert(c),
                res => {
                    if Instant::now() >= seat.window.end {
                        break;
                    }
                    let why = match res {
                        Ok(Err(e)) => format!("cannot connect: {e:#}"),
                        _ => "cannot connect: timed out".to_owned(),
                    };
                    seat.failed(&why);
                    sleep_until((Instant::now() + RECONNECT_PAUSE).min(seat.window.end)).await;
                    continue;
                }
            },
        };
        let req = match plan.request(&mut rng) {
            Ok(req) => req,
            Err(e) => {
                seat.failed(&format_args!("cannot make a request: {e:#}"));
                continue;
            }
        };
        let t0 = Instant::now();
        let (result, io_done) = exchange(c, req, &mut watchdog, deadline).await;
        if io_done {
            conn = None;
        }
        match result {
            Exchange::Answered(status) => {
                let t1 = Instant::now();
                let o = outcome(status);
                if seat.window.measures(t1) {
                    seat.tally.answer(o, t1 - t0);
                    if o >= 2 {
                        seat.tally.problem(&format_args!("answered {status}"));
                    }
                }
                seat.live.add(o >= 2);
            }
            // Reconnects without counting an error: only requests fail.
            Exchange::Closed => conn = None,
            Exchange::Failed(e) => {
                conn = None;
                seat.failed(&format_args!("{e:#}"));
            }
            Exchange::TimedOut => {
                // A request still in flight when the run ends is abandoned,
                // not counted; one that took longer than --seat.timeout is an
                // error, and its connection is no longer usable.
                conn = None;
                if Instant::now() >= seat.window.end {
                    break;
                }
                let why = format!("no answer within {:?}", seat.timeout);
                seat.failed(&why);
            }
        }
    }
    seat.tally
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn headers_parse_and_bad_ones_are_refused() {
        let (n, v) = parse_header("X-Api-Key: abc:def").unwrap();
        assert_eq!((n.as_str(), v.to_str().unwrap()), ("x-api-key", "abc:def"));
        assert!(parse_header("no colon").is_err());
        assert!(parse_header("bad name: v").is_err());
        assert!(parse_header("x: bad\nvalue").is_err());
    }

    #[test]
    fn statuses_are_sorted_into_outcomes() {
        assert_eq!(outcome(StatusCode::OK), 0);
        assert_eq!(outcome(StatusCode::NO_CONTENT), 0);
        assert_eq!(outcome(StatusCode::TOO_MANY_REQUESTS), 1);
        assert_eq!(outcome(StatusCode::NOT_FOUND), 2);
        assert_eq!(outcome(StatusCode::SERVICE_UNAVAILABLE), 2);
    }
}
