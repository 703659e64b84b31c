//! Every open connection of one listener, so that the listener can keep a
//! cap and close connections from outside: the least recently active one
//! when a new connection needs its place, all of them when a shutdown's
//! deadline passes.
//!
//! A connection is closed by making its socket's reads and writes fail, the
//! one thing both hyper and tonic act on whatever state they are in: they
//! end the connection and drop the socket.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// How many connections are compared to pick the one to close, as Redis
/// samples keys to evict: the least active of a random few is nearly as
/// stale as the least active of all, at a cost that does not grow with the
/// cap. A listener with no more open connections than this compares all.
const SAMPLE: usize = 16;

/// A connection's slot once it is no longer in the table.
const GONE: usize = usize::MAX;

/// The open connections of one listener.
pub(crate) struct Connections {
    /// The `listener` label of the metrics.
    listener: &'static str,
    max: usize,
    /// What the connections' activity times count from.
    epoch: Instant,
    /// Unordered, so that removing one is a swap; each connection knows its
    /// index.
    open: Mutex<Vec<Arc<Conn>>>,
    /// Open connections whose client has sent nothing yet, and the tasks
    /// waiting for there to be none (see [`Connections::heard_from_all`]).
    silent: AtomicUsize,
    none_silent: Notify,
}

/// What a connection's socket and its table share.
struct Conn {
    /// When the client last sent anything, in nanoseconds since the table's
    /// epoch. Only what the client sends counts: what the server writes says
    /// nothing about whether a client is alive, and a client that reads
    /// slowly on purpose must not look busy.
    last_read: AtomicU64,
    /// Whether the client has sent anything yet.
    heard: AtomicBool,
    /// Why the connection was closed from outside, as a [`Closed`], or
    /// [`OPEN`].
    closed: AtomicU8,
    /// Its index in the table, or [`GONE`]; changed only under the table's
    /// lock.
    slot: AtomicUsize,
    /// The tasks to wake when it is closed from outside, so that a read or
    /// write that waits on a silent peer fails at once.
    reader: AtomicWaker,
    writer: AtomicWaker,
}

const OPEN: u8 = 0;

/// Why a connection was closed from outside; its reads and writes fail
/// with this from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Closed {
    /// To make room for a new connection at the cap.
    Shed = 1,
    /// At the shutdown deadline.
    Shutdown = 2,
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Closed::Shed => "closed to make room for a new connection",
            Closed::Shutdown => "closed at the shutdown deadline",
        })
    }
}

impl std::error::Error for Closed {}

impl Conn {
    fn closed(&self) -> Option<Closed> {
        match self.closed.load(Ordering::SeqCst) {
            OPEN => None,
            1 => Some(Closed::Shed),
            _ => Some(Closed::Shutdown),
        }
    }

    fn check(&self) -> io::Result<()> {
        match self.closed() {
            None => Ok(()),
            Some(why) => Err(io::Error::new(io::ErrorKind::ConnectionAborted, why)),
        }
    }

    fn close(&self, why: Closed) {
        self.closed.store(why as u8, Ordering::SeqCst);
        self.reader.wake();
        self.writer.wake();
    }
}

impl Connections {
    /// An empty table for `listener` that keeps at most `max` connections.
    pub(crate) fn new(listener: &'static str, max: usize) -> Arc<Connections> {
        metrics::gauge!("sluice_connections_max", "listener" => listener).set(max as f64);
        metrics::gauge!("sluice_connections_open", "listener" => listener).set(0.0);
        Arc::new(Connections {
            listener,
            max: max.max(1),
            epoch: Instant::now(),
            open: Mutex::new(Vec::with_capacity(max.min(1024))),
            silent: AtomicUsize::new(0),
            none_silent: Notify::new(),
        })
    }

    /// How many connections are open.
    pub(crate) fn len(&self) -> usize {
        self.open.lock().len()
    }

    /// Tracks `io`, a connection just accepted. At the cap, the least
    /// recently active of a sample of open connections is closed first.
    pub(crate) fn admit<T>(self: &Arc<Self>, io: T) -> Tracked<T> {
        let conn = Arc::new(Conn {
            last_read: AtomicU64::new(self.now()),
            heard: AtomicBool::new(false),
            closed: AtomicU8::new(OPEN),
            slot: AtomicUsize::new(GONE),
            reader: AtomicWaker::new(),
            writer: AtomicWaker::new(),
        });
        let mut open = self.open.lock();
        if open.len() >= self.max
            && let Some(victim) = least_active(&open)
        {
            let victim = remove(&mut open, victim);
            victim.close(Closed::Shed);
            metrics::counter!("sluice_connections_shed_total", "listener" => self.listener)
                .increment(1);
        }
        self.silent.fetch_add(1, Ordering::SeqCst);
        conn.slot.store(open.len(), Ordering::Relaxed);
        open.push(Arc::clone(&conn));
        self.publish(open.len());
        drop(open);
        Tracked {
            io,
            conn,
            connections: Arc::clone(self),
            copy_writes: false,
        }
    }

    /// Completes once every connection's client has sent something (or
    /// gone): once each has had its request read, a graceful shutdown can
    /// answer it before closing, where one that has read nothing would
    /// close the connection with the request unread in it.
    pub(crate) async fn heard_from_all(&self) {
        loop {
            // Made before the count is read, so that a change in between
            // wakes it.
            let changed = self.none_silent.notified();
            if self.silent.load(Ordering::SeqCst) == 0 {
                return;
            }
            changed.await;
        }
    }

    /// Marks `conn` as no longer silent: it sent something, or is gone.
    fn heard(&self, conn: &Conn) {
        if !conn.heard.swap(true, Ordering::SeqCst)
            && self.silent.fetch_sub(1, Ordering::SeqCst) == 1
        {
            self.none_silent.notify_waiters();
        }
    }

    /// Closes every open connection; returns how many there were.
    pub(crate) fn close_all(&self) -> usize {
        let mut open = self.open.lock();
        let n = open.len();
        for conn in open.drain(..) {
            conn.slot.store(GONE, Ordering::Relaxed);
            conn.close(Closed::Shutdown);
        }
        self.publish(0);
        n
    }

    fn forget(&self, conn: &Conn) {
        let mut open = self.open.lock();
        let slot = conn.slot.load(Ordering::Relaxed);
        if slot != GONE {
            remove(&mut open, slot);
            self.publish(open.len());
        }
    }

    /// Set under the table's lock, so that the gauge moves in the table's
    /// order and never shows more than the cap.
    fn publish(&self, open: usize) {
        metrics::gauge!("sluice_connections_open", "listener" => self.listener).set(open as f64);
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The index of the least recently active connection among a sample.
fn least_active(open: &[Arc<Conn>]) -> Option<usize> {
    let last_read = |i: usize| open[i].last_read.load(Ordering::Relaxed);
    if open.len() <= SAMPLE {
        return (0..open.len()).min_by_key(|&i| last_read(i));
    }
    (0..SAMPLE)
        .map(|_| fastrand::usize(..open.len()))
        .min_by_key(|&i| last_read(i))
}

fn remove(open: &mut Vec<Arc<Conn>>, slot: usize) -> Arc<Conn> {
    let conn = open.swap_remove(slot);
    conn.slot.store(GONE, Ordering::Relaxed);
    if let Some(moved) = open.get(slot) {
        moved.slot.store(slot, Ordering::Relaxed);
    }
    conn
}

/// A connection's socket, in its listener's table while it lives: reads
/// record the client's activity, and once the connection is closed from
/// outside, reads and writes fail with [`Closed`].
pub(crate) struct Tracked<T> {
    io: T,
    conn: Arc<Conn>,
    connections: Arc<Connections>,
    /// Whether writers are told that the socket takes no vectored writes;
    /// see [`Tracked::copying_writes`].
    copy_writes: bool,
}

impl<T> Drop for Tracked<T> {
    fn drop(&mut self) {
        self.connections.heard(&self.conn);
        self.connections.forget(&self.conn);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.conn.check()?;
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    let now = this.connections.now();
                    this.conn.last_read.store(now, Ordering::Relaxed);
                    if !this.conn.heard.load(Ordering::Relaxed) {
                        this.connections.heard(&this.conn);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                // Registered only when waiting; checked again after, so that
                // a close between the first check and now is not missed.
                this.conn.reader.register(cx.waker());
                this.conn.check()?;
                Poll::Pending
            }
            failed => failed,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.conn.check()?;
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.pending_write(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.conn.check()?;
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.pending_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        !self.copy_writes && self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.conn.check()?;
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.pending_write(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T> Tracked<T> {
    /// Tells writers that the socket takes no vectored writes, so that they
    /// copy what they send into one buffer rather than hand the socket a
    /// list of buffers.
    ///
    /// For HTTP/2 this decides how many answers share a write. h2 sends a
    /// DATA payload of 256 bytes or more on a vectored socket as a buffer of
    /// its own, and must write it out before it may queue the next frame:
    /// every such answer then costs a write, and its trailers another. An
    /// Envoy RLS denial, with its headers and problem body, is that big. On
    /// a socket without vectored writes h2 copies payloads below 1 KiB into
    /// its buffer instead, and the answers ready at once leave in one write.
    /// A payload of 1 KiB or more then takes two writes rather than one
    /// vectored write: a fair trade for a service whose answers are small.
    pub(crate) fn copying_writes(mut self) -> Self {
        self.copy_writes = true;
        self
    }

    /// A write that waits on the peer is woken when the connection is
    /// closed from outside.
    fn pending_write<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if polled.is_pending() {
            self.conn.writer.register(cx.waker());
            self.conn.check()?;
        }
        polled
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Tracked<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

    /// A tracked server end and the client end of an in-memory connection.
    fn pair(table: &Arc<Connections>) -> (Tracked<DuplexStream>, DuplexStream) {
        let (server, client) = duplex(64);
        (table.admit(server), client)
    }

    fn closed_by(e: &io::Error) -> Option<Closed> {
        e.get_ref()?.downcast_ref::<Closed>().copied()
    }

    #[tokio::test]
    async fn at_the_cap_the_connection_whose_client_was_silent_longest_makes_room() {
        let table = Connections::new("test", 3);
        let (mut first, mut first_client) = pair(&table);
        let (mut second, _second_client) = pair(&table);
        let (mut third, mut third_client) = pair(&table);
        // The first and the third clients speak; the second stays silent.
        let mut byte = [0; 1];
        for (server, client) in [
            (&mut first, &mut first_client),
            (&mut third, &mut third_client),
        ] {
            client.write_all(b"x").await.unwrap();
            server.read_exact(&mut byte).await.unwrap();
        }
        let (_fourth, _fourth_client) = pair(&table);
        assert_eq!(table.len(), 3);
        let e = second.read(&mut byte).await.unwrap_err();
        assert_eq!(closed_by(&e), Some(Closed::Shed));
        let e = second.write(b"y").await.unwrap_err();
        assert_eq!(closed_by(&e), Some(Closed::Shed));
        // The others are untouched.
        first_client.write_all(b"z").await.unwrap();
        first.read_exact(&mut byte).await.unwrap();
        drop(second);
        assert_eq!(table.len(), 3, "a connection shed is no longer counted");
    }

    #[tokio::test]
    async fn a_read_waiting_on_a_silent_client_fails_when_its_connection_is_closed() {
        let table = Connections::new("test", 10);
        let (mut server, _client) = pair(&table);
        let reading = tokio::spawn(async move {
            let mut byte = [0; 1];
            server.read(&mut byte).await
        });
        // However the read and the close interleave, the read ends.
        tokio::task::yield_now().await;
        assert_eq!(table.close_all(), 1);
        let e = reading.await.unwrap().unwrap_err();
        assert_eq!(closed_by(&e), Some(Closed::Shutdown));
        assert_eq!(table.len(), 0);
    }

    #[tokio::test]
    async fn a_write_waiting_on_a_client_that_does_not_read_fails_when_closed() {
        let table = Connections::new("test", 10);
        let (mut server, _client) = pair(&table);
        let writing = tokio::spawn(async move {
            // More than the pipe holds, so the write waits for the client.
            server.write_all(&[0; 1024]).await
        });
        tokio::task::yield_now().await;
        table.close_all();
        let e = writing.await.unwrap().unwrap_err();
        assert_eq!(closed_by(&e), Some(Closed::Shutdown));
    }

    #[tokio::test]
    async fn dropped_connections_leave_the_table_and_the_others_keep_their_places() {
        let table = Connections::new("test", 100);
        let mut held: Vec<_> = (0..40).map(|_| pair(&table)).collect();
        // Drop every third, from the middle out, to move others' slots.
        let mut i = 1;
        while i < held.len() {
            held.remove(i);
            i += 2;
        }
        assert_eq!(table.len(), held.len());
        let open = table.open.lock();
        for (slot, conn) in open.iter().enumerate() {
            assert_eq!(conn.slot.load(Ordering::Relaxed), slot);
        }
        drop(open);
        held.clear();
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn with_more_connections_than_the_sample_the_pick_is_among_the_stalest() {
        let open: Vec<Arc<Conn>> = (0..1000u64)
            .map(|i| {
                Arc::new(Conn {
                    last_read: AtomicU64::new(i),
                    heard: AtomicBool::new(true),
                    closed: AtomicU8::new(OPEN),
                    slot: AtomicUsize::new(GONE),
                    reader: AtomicWaker::new(),
                    writer: AtomicWaker::new(),
                })
            })
            .collect();
        // The least of a few uniform draws is far below the middle on
        // average.
        let picks: u64 = (0..1000).map(|_| least_active(&open).unwrap() as u64).sum();
        assert!(picks / 1000 < 150, "average pick {}", picks / 1000);
    }
}
