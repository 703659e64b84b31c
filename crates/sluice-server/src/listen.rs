//! The accept loop that `serve` and `proxy` share: HTTP/1.1 (kept alive)
//! or cleartext HTTP/2 on each connection, a deadline for a request's
//! headers, a cap on open connections, and a drain with a deadline when
//! told to stop. The gRPC server takes its connections from the same
//! [`Listener`], so the cap and the deadline hold there too.

mod closing;
mod connections;
pub(crate) mod timer;

use std::convert::Infallible;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use futures_util::{FutureExt, Stream};
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use self::closing::Closing;
use self::connections::{Connections, Tracked};
use self::timer::ConnectionTimer;

/// How long a client has to send a request's headers; a connection that
/// idles longer mid-request is closed (slowloris).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The queue of connections the kernel keeps for a listening socket until
/// the server accepts them; the kernel caps it at `net.core.somaxconn`.
/// Tokio's own `bind` asks for 128, the standard library's value. A burst
/// of connects beyond the queue has its handshakes dropped, and each of
/// those clients then waits out SYN retransmissions, a second and then
/// longer, before the server sees it.
const LISTEN_BACKLOG: u32 = 4096;

/// A listening socket at `addr`, as `serve` and `proxy` bind theirs: with
/// room for 4,096 connections waiting to be accepted (as the kernel
/// allows), where tokio's `bind` leaves 128. The address is reused, as by
/// tokio's `bind`, so that a restarted server need not wait for its last
/// connections' `TIME_WAIT` to pass; not on Windows, where reuse would let
/// another socket take the port. Call it within a tokio runtime, which the
/// socket registers with.
///
/// ```
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let tcp = sluice_server::listen::bind("127.0.0.1:0".parse().unwrap())?;
/// assert!(tcp.local_addr()?.port() > 0);
/// # Ok::<_, std::io::Error>(())
/// # })?;
/// # Ok::<_, std::io::Error>(())
/// ```
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    #[cfg(not(windows))]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The pause after a failed `accept` (out of file descriptors, usually),
/// so that the loop does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// The default of `--shutdown-timeout`.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// File descriptors a process needs besides its client connections: the
/// standard streams, the runtime's, the listening sockets, store
/// connections, the policy file.
pub(crate) const OTHER_FDS: usize = 256;

/// The connection flags `serve` and `proxy` share.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct Limits {
    /// The most connections each listener keeps open [default: 10000]. A
    /// connection that arrives when as many are open closes the one whose
    /// client has sent nothing for longest, so that stalled clients cannot
    /// lock out new ones. Lowered at start to what the limit on open files
    /// can hold; with a warning when the value was given.
    #[arg(
        long,
        env = "SLUICE_MAX_CONNECTIONS",
        value_name = "N",
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..),
    )]
    pub max_connections: Option<usize>,
    /// On SIGTERM, how long requests in flight may take to finish, e.g.
    /// `10s`; then every connection is closed and the process exits.
    #[arg(
        long,
        env = "SLUICE_SHUTDOWN_TIMEOUT",
        default_value = "10s",
        value_parser = crate::duration::parse,
    )]
    pub shutdown_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: None,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }
}

impl Limits {
    /// The cap on each listener's connections: the one given, or
    /// [`DEFAULT_MAX_CONNECTIONS`].
    ///
    /// ```
    /// use sluice_server::listen::{DEFAULT_MAX_CONNECTIONS, Limits};
    /// assert_eq!(Limits::default().max_connections(), DEFAULT_MAX_CONNECTIONS);
    /// let given = Limits { max_connections: Some(64), ..Limits::default() };
    /// assert_eq!(given.max_connections(), 64);
    /// ```
    pub fn max_connections(&self) -> usize {
        self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS)
    }

    /// Raises the process's soft limit on open files to its hard limit, as
    /// a server that holds thousands of sockets needs, then lowers
    /// `max_connections` until every listener at its cap fits: each
    /// connection slot takes `fds_per_connection` descriptors over all the
    /// listeners, and `reserved` are needed besides.
    pub(crate) fn fit_fd_limit(&mut self, fds_per_connection: usize, reserved: usize) {
        let limit = match rlimit::increase_nofile_limit(u64::MAX) {
            Ok(limit) => limit,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the limit on open files");
                return;
            }
        };
        let fits = connections_that_fit(limit, fds_per_connection, reserved);
        let cap = self.max_connections();
        if fits < cap {
            // Fitting the default to the machine is routine; falling short
            // of a value someone chose deserves their attention.
            if self.max_connections.is_some() {
                tracing::warn!(
                    asked = cap,
                    allowed = fits,
                    open_files = limit,
                    "lowering --max-connections to what the limit on open files holds"
                );
            } else {
                tracing::info!(
                    default = cap,
                    allowed = fits,
                    open_files = limit,
                    "lowering --max-connections from its default to what the limit on open \
                     files holds"
                );
            }
            self.max_connections = Some(fits);
        }
    }
}

/// The most connections per listener that `fd_limit` holds; at least one.
fn connections_that_fit(fd_limit: u64, fds_per_connection: usize, reserved: usize) -> usize {
    let limit = usize::try_from(fd_limit).unwrap_or(usize::MAX);
    (limit.saturating_sub(reserved) / fds_per_connection.max(1)).max(1)
}

/// A listening socket whose connections are counted, capped at
/// `--max-connections` and closed at the shutdown deadline. Its metrics
/// are `sluice_connections_open`, `sluice_connections_max` and
/// `sluice_connections_shed_total`, labelled `listener` with its name.
///
/// ```
/// use sluice_server::listen::{Limits, Listener};
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let tcp = sluice_server::listen::bind("127.0.0.1:0".parse().unwrap())?;
/// let listener = Listener::new(tcp, "http", &Limits::default());
/// assert!(listener.local_addr()?.port() > 0);
/// # Ok::<_, std::io::Error>(())
/// # })?;
/// # Ok::<_, std::io::Error>(())
/// ```
pub struct Listener {
    tcp: TcpListener,
    drain: Drain,
}

/// What is left of a listener once it stops accepting: its connections,
/// and how long they may take to finish.
pub(crate) struct Drain {
    connections: Arc<Connections>,
    within: Duration,
}

impl Listener {
    /// Applies `limits` to `tcp`; `name` labels its metrics.
    pub fn new(tcp: TcpListener, name: &'static str, limits: &Limits) -> Listener {
        Listener {
            tcp,
            drain: Drain {
                connections: Connections::new(name, limits.max_connections()),
                within: limits.shutdown_timeout,
            },
        }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// The next connection, admitted to the table. Cancel-safe.
    async fn accept(&self) -> (Tracked<TcpStream>, SocketAddr) {
        loop {
            match self.tcp.accept().await {
                Ok((stream, peer)) => {
                    // Small responses (429s above all) would otherwise wait
                    // on Nagle.
                    let _ = stream.set_nodelay(true);
                    return (self.drain.connections.admit(stream), peer);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }

    /// The connections as a stream for tonic, which owns the listening
    /// socket and closes it when it stops accepting; and the drain for
    /// when it has. Their writes are copied into one buffer
    /// ([`Tracked::copying_writes`]), so that HTTP/2 answers share writes.
    pub(crate) fn incoming(
        self,
    ) -> (
        impl Stream<Item = Result<Tracked<TcpStream>, Infallible>> + Send + 'static,
        Drain,
    ) {
        let drain = Drain {
            connections: Arc::clone(&self.drain.connections),
            within: self.drain.within,
        };
        let stream = futures_util::stream::unfold(self, |listener| async move {
            let (io, _) = listener.accept().await;
            Some((Ok(io.copying_writes()), listener))
        });
        (stream, drain)
    }
}

impl Drain {
    /// Waits for `finished`, the requests in flight ending, for at most the
    /// shutdown timeout; then closes every connection left.
    pub(crate) async fn finish(self, finished: impl Future<Output = ()>) {
        let open = self.connections.len();
        if open > 0 {
            tracing::debug!(connections = open, "draining connections");
        }
        if tokio::time::timeout(self.within, finished).await.is_err() {
            let cut = self.connections.close_all();
            tracing::warn!(
                connections = cut,
                "the shutdown timeout passed: closing connections with requests in flight"
            );
        }
    }
}

/// How long a stopping listener goes on accepting the connections whose
/// handshakes were under way when it stopped taking new ones: a round trip
/// or two, with room for a busy machine.
const SETTLE: Duration = Duration::from_millis(50);

/// How long, at most, a stopping server waits for the clients of the
/// connections it accepted to send their requests, before it closes those
/// that have sent nothing (never beyond `--shutdown-timeout`).
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// Serves every connection accepted on `listener` with the service
/// `service` makes for its peer, until `stop` completes; then stops
/// accepting, answers what it accepted, and returns once the requests in
/// flight have been answered or the shutdown timeout has passed.
///
/// No connection a client saw established is closed with its request
/// unread, so that a client or balancer may send a refused connect
/// elsewhere and needs to retry nothing else. In order:
/// - new connects are no longer answered (on Linux: a filter on the socket
///   drops their SYNs, and the client's retransmission a second later
///   finds the port closed and is refused);
/// - connections whose handshake was under way are accepted for
///   [`SETTLE`], then those left in the listen queue; then the socket is
///   closed (where the kernel would reset the queue's connections);
/// - connections whose client has sent nothing yet get up to
///   [`FIRST_REQUEST_GRACE`] to send it: hyper closes a connection that has
///   read nothing at once when told to shut down;
/// - from the stop on, HTTP/1 answers say `connection: close`; once the
///   clients have been heard from, every connection finishes the request
///   it has and closes (HTTP/2 sends GOAWAY), until the shutdown timeout.
pub(crate) async fn serve_connections<S, B>(
    listener: Listener,
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
    builder.http1().header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = GracefulShutdown::new();
    let stopping = Arc::new(AtomicBool::new(false));
    let serve = |(stream, peer): (Tracked<TcpStream>, SocketAddr)| {
        // Each connection's wait for a request head reuses the last one's
        // timer (see `timer`).
        let mut per_connection = builder.clone();
        per_connection.http1().timer(ConnectionTimer::new());
        let conn = per_connection
            .serve_connection_with_upgrades(
                TokioIo::new(stream),
                Closing {
                    inner: service(peer),
                    stopping: Arc::clone(&stopping),
                },
            )
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                // Clients hanging up mid-request are routine.
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => serve(accepted),
        }
    }
    let stopped = tokio::time::Instant::now();
    stopping.store(true, Ordering::Relaxed);
    if let Err(e) = refuse_connects(&listener.tcp) {
        tracing::warn!(error = %e, "cannot stop answering connects before closing the listener");
    }
    let settled = tokio::time::sleep(SETTLE);
    tokio::pin!(settled);
    loop {
        tokio::select! {
            () = &mut settled => break,
            accepted = listener.accept() => serve(accepted),
        }
    }
    while let Some(accepted) = listener.accept().now_or_never() {
        serve(accepted);
    }
    let Listener { tcp, drain } = listener;
    drop(tcp);
    let grace = drain.within.saturating_sub(stopped.elapsed());
    let _ = tokio::time::timeout(
        grace.min(FIRST_REQUEST_GRACE),
        drain.connections.heard_from_all(),
    )
    .await;
    let within = drain.within.saturating_sub(stopped.elapsed());
    Drain { within, ..drain }.finish(graceful.shutdown()).await;
}

/// Makes the kernel stop answering connects to `tcp` while it still
/// listens: a socket filter that drops every SYN. Handshakes already under
/// way complete, and their connections wait to be accepted.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn refuse_connects(tcp: &TcpListener) -> std::io::Result<()> {
    use socket2::{SockFilter, SockRef};
    // Classic BPF as the kernel runs it on a TCP socket's packets, which
    // start at the TCP header: byte 13 holds the flags, 0x02 is SYN.
    const LD_B_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
    const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    let program = [
        SockFilter::new(LD_B_ABS, 0, 0, 13),
        SockFilter::new(JSET_K, 0, 1, 0x02),
        SockFilter::new(RET_K, 0, 0, 0),
        SockFilter::new(RET_K, 0, 0, u32::MAX),
    ];
    SockRef::from(tcp).attach_filter(&program)
}

/// Elsewhere connects are answered until the socket closes, and those
/// that complete in the last moment are reset.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn refuse_connects(_: &TcpListener) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        limits: Limits,
    }

    /// A burst of connects that the server has not yet accepted waits in the
    /// listening socket's queue, all of it: none has to wait out a SYN
    /// retransmission, as the connects past tokio's 128 would. Up to 2,000
    /// connects, as many as the kernel's cap on the queue and this
    /// process's open files allow (Linux only: the cap is read from
    /// `/proc`).
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_burst_of_two_thousand_connects_waits_in_the_listen_queue() {
        const WANTED: usize = 2000;
        /// Files besides the connections' that the test process has open.
        const OTHER_FILES: usize = 64;
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .expect("the kernel's cap on a listen queue");
        // Both ends of every connection are this process's files.
        let files = rlimit::increase_nofile_limit((2 * WANTED + OTHER_FILES) as u64)
            .expect("the limit on open files");
        let burst = WANTED.min(somaxconn).min(
            usize::try_from(files)
                .unwrap_or(usize::MAX)
                .saturating_sub(OTHER_FILES)
                / 2,
        );
        let tcp = bind("127.0.0.1:0".parse().expect("address")).expect("bind");
        let addr = tcp.local_addr().expect("address");
        let mut connects = tokio::task::JoinSet::new();
        for _ in 0..burst {
            connects.spawn(TcpStream::connect(addr));
        }
        let mut clients = Vec::with_capacity(burst);
        let connected = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(c) = connects.join_next().await {
                clients.push(c.expect("task").expect("connect"));
            }
        })
        .await;
        assert!(
            connected.is_ok(),
            "{} of {burst} connects done in 10 s: the rest wait out SYN retransmissions",
            clients.len()
        );
        // Queued connections are accepted at once; one whose handshake was
        // dropped comes a second later at the earliest.
        let mut accepted = Vec::with_capacity(burst);
        while accepted.len() < burst {
            match tokio::time::timeout(Duration::from_millis(500), tcp.accept()).await {
                Ok(a) => accepted.push(a.expect("accept")),
                Err(_) => break,
            }
        }
        assert_eq!(accepted.len(), burst, "connections queued of {burst}");
    }

    /// The wait for a request head runs on a timer the connection reuses
    /// (see `timer`): the second head's wait must end as the first's would.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_request_head_is_cut_off_on_a_connection_that_already_served_one() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("address");
        let listener = Listener::new(tcp, "test", &Limits::default());
        let ok = |_| {
            hyper::service::service_fn(|_: Request<Incoming>| async {
                Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(b"ok"),
                )))
            })
        };
        tokio::spawn(serve_connections(listener, ok, std::future::pending()));

        let mut client = TcpStream::connect(addr).await.expect("connect");
        for round in 0..2 {
            client
                .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                .await
                .expect("write");
            let mut answer = Vec::new();
            while !answer.ends_with(b"ok") {
                let mut buf = [0; 1024];
                let n = client.read(&mut buf).await.expect("read");
                assert!(n > 0, "closed before answering: {answer:?}");
                answer.extend_from_slice(&buf[..n]);
            }
            assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
            if round == 0 {
                // The next head's wait starts later than the last one's
                // did, so a timer reused without its new deadline would
                // end early.
                tokio::time::advance(HEADER_READ_TIMEOUT * 2 / 3).await;
            }
        }

        // Half a head, then nothing.
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n")
            .await
            .expect("write");
        let stalled = tokio::time::Instant::now();
        let mut rest = Vec::new();
        let read =
            tokio::time::timeout(HEADER_READ_TIMEOUT * 3, client.read_to_end(&mut rest)).await;
        assert!(
            read.is_ok(),
            "the connection outlived three header timeouts"
        );
        let waited = stalled.elapsed();
        assert!(
            (HEADER_READ_TIMEOUT..HEADER_READ_TIMEOUT * 2).contains(&waited),
            "closed after {waited:?}"
        );
    }

    /// A service answering every request with "ok".
    fn ok(
        _: SocketAddr,
    ) -> impl Service<
        Request<Incoming>,
        Response = Response<http_body_util::Full<bytes::Bytes>>,
        Error = Infallible,
        Future = impl Send,
    > + Send
    + 'static {
        hyper::service::service_fn(|_: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                bytes::Bytes::from_static(b"ok"),
            )))
        })
    }

    /// Sends a request on `client`.
    async fn ask(client: &mut TcpStream) {
        use tokio::io::AsyncWriteExt;
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .expect("write");
    }

    /// The answer on `client`, read to the close.
    async fn answer(client: &mut TcpStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer));
        match read.await {
            Ok(Ok(_)) => String::from_utf8_lossy(&answer).into_owned(),
            Ok(Err(e)) => format!("failed: {e}"),
            Err(_) => "no answer in 10 s".to_owned(),
        }
    }

    /// Connections whose handshakes completed before the server stopped
    /// wait in the listen queue, where closing the socket would reset them:
    /// a stopping server accepts and answers every one.
    #[tokio::test]
    async fn a_stopping_server_answers_the_connections_waiting_in_its_listen_queue() {
        let tcp = bind("127.0.0.1:0".parse().expect("address")).expect("bind");
        let addr = tcp.local_addr().expect("address");
        let mut queued = Vec::new();
        for _ in 0..32 {
            let mut client = TcpStream::connect(addr).await.expect("connect");
            ask(&mut client).await;
            queued.push(client);
        }
        let listener = Listener::new(tcp, "test", &Limits::default());
        // Told to stop before it has accepted anything.
        let server = tokio::spawn(serve_connections(listener, ok, std::future::ready(())));
        for (i, client) in queued.iter_mut().enumerate() {
            let answer = answer(client).await;
            assert!(
                answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
                "connection {i}: {answer}"
            );
        }
        server.await.expect("the server");
    }

    /// A client that connected before the stop and sends its request just
    /// after it is answered, where hyper alone would close the connection
    /// unread; meanwhile a new connect is not answered, and once the
    /// socket is closed it is refused, which a client may send elsewhere.
    #[tokio::test]
    async fn a_stopping_server_answers_a_request_sent_after_the_stop_on_a_connection_it_accepted() {
        let tcp = bind("127.0.0.1:0".parse().expect("address")).expect("bind");
        let addr = tcp.local_addr().expect("address");
        let listener = Listener::new(tcp, "test", &Limits::default());
        let table = Arc::clone(&listener.drain.connections);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_connections(listener, ok, async {
            let _ = stopped.await;
        }));
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let accepted = async {
            while table.len() == 0 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), accepted)
            .await
            .expect("the connection accepted within 10 s");

        stop.send(()).expect("the server is running");
        let mut late = tokio::spawn(TcpStream::connect(addr));
        let answered = tokio::time::timeout(Duration::from_millis(300), &mut late).await;
        assert!(
            answered.is_err(),
            "a connect after the stop was answered: {answered:?}"
        );

        ask(&mut silent).await;
        let answer = answer(&mut silent).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
        // The SYN retransmitted after a second finds the socket closed.
        let late = tokio::time::timeout(Duration::from_secs(10), late)
            .await
            .expect("the late connect to end")
            .expect("the connect task");
        assert_eq!(
            late.map_err(|e| e.kind()).err(),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
        server.await.expect("the server");
    }

    #[test]
    fn the_flags_defaults_are_the_defaults() {
        let parsed = Flags::try_parse_from(["sluice"]).map(|f| f.limits);
        assert_eq!(parsed.ok(), Some(Limits::default()));
    }

    #[test]
    fn a_zero_cap_is_refused() {
        assert!(Flags::try_parse_from(["sluice", "--max-connections", "0"]).is_err());
    }

    /// h2 batches the answers of concurrent calls into one write only on
    /// a socket that says it takes no vectored writes (see
    /// `Tracked::copying_writes`).
    #[tokio::test]
    async fn grpc_connections_tell_writers_to_copy_rather_than_write_vectored() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("address");
        let (incoming, _drain) = Listener::new(tcp, "test", &Limits::default()).incoming();
        let _client = TcpStream::connect(addr).await.expect("connect");
        futures_util::pin_mut!(incoming);
        let accepted = futures_util::StreamExt::next(&mut incoming).await;
        let Some(Ok(io)) = accepted else {
            panic!("no connection accepted")
        };
        let plain = TcpStream::connect(addr).await.expect("connect");
        assert!(
            tokio::io::AsyncWrite::is_write_vectored(&plain),
            "a plain socket takes vectored writes"
        );
        assert!(!tokio::io::AsyncWrite::is_write_vectored(&io));
    }

    #[test]
    fn the_cap_leaves_room_for_the_other_descriptors_and_every_listener() {
        assert_eq!(connections_that_fit(20_000, 2, 256), 9_872);
        assert_eq!(connections_that_fit(1_024, 1, 256), 768);
        assert_eq!(connections_that_fit(100, 2, 256), 1);
        assert_eq!(connections_that_fit(u64::MAX, 0, 0), usize::MAX);
    }
}
