//! The request body on its way upstream: what the forwarder hands the
//! upstream connection, and the error that ends it when the client stalls.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::oneshot;

/// A request body on its way upstream, which says when it has all been
/// sent (or abandoned), so that the upstream's time to answer is counted
/// from then and a slow upload is never mistaken for a slow upstream; and
/// which fails with [`BodyStalled`] when the client pauses too long.
pub(crate) struct SentBody {
    inner: Incoming,
    /// Dropped, waking the receiver, once the body is finished.
    sent: Option<oneshot::Sender<()>>,
    /// The longest pause allowed between two frames.
    idle: Duration,
    /// Armed while a frame is awaited.
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// The client sent no request body data for the body timeout.
#[derive(Debug)]
pub(crate) struct BodyStalled(Duration);

impl std::fmt::Display for BodyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no request body data for {:?}", self.0)
    }
}

impl std::error::Error for BodyStalled {}

impl SentBody {
    pub(super) fn new(inner: Incoming, idle: Duration) -> (SentBody, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        // An empty body may never be polled at all.
        let sent = (!inner.is_end_stream()).then_some(tx);
        let body = SentBody {
            inner,
            sent,
            idle,
            stall: None,
        };
        (body, rx)
    }
}

impl Body for SentBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) else {
            let idle = this.idle;
            let stall = this
                .stall
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
            ready!(stall.as_mut().poll(cx));
            this.stall = None;
            this.sent = None;
            return Poll::Ready(Some(Err(Box::new(BodyStalled(idle)))));
        };
        this.stall = None;
        // A body of known length ends with its last frame: hyper does not
        // poll it again for the `None`.
        if !matches!(frame, Some(Ok(_))) || this.inner.is_end_stream() {
            this.sent = None;
        }
        Poll::Ready(frame.map(|f| f.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
