//! A deadline for a request body to arrive in full, so that a client that
//! sends part of a body and then nothing holds its connection, and the
//! memory behind it, for that long only.

use std::error::Error as StdError;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

type BoxError = Box<dyn StdError + Send + Sync>;

/// A request body that fails with [`BodyTimedOut`] unless it has arrived in
/// full within its timeout, counted from the first time it is waited for:
/// a body that is already there, as a call's small JSON usually is, never
/// touches a timer.
pub(crate) struct Deadline<B> {
    inner: B,
    timeout: Duration,
    /// Armed the first time a frame is not ready, and never reset: the
    /// deadline is for the whole body, not for each pause.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> Deadline<B> {
    /// `inner`, to arrive within `timeout`.
    pub(crate) fn new(inner: B, timeout: Duration) -> Deadline<B> {
        Deadline {
            inner,
            timeout,
            timer: None,
        }
    }
}

/// The request body did not arrive in full within the body timeout.
#[derive(Debug)]
pub(crate) struct BodyTimedOut(Duration);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive in full within {:?}",
            self.0
        )
    }
}

impl StdError for BodyTimedOut {}

impl BodyTimedOut {
    /// The deadline that `error`, or an error it wraps, says passed.
    pub(crate) fn in_chain<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a BodyTimedOut> {
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(late) = e.downcast_ref() {
                return Some(late);
            }
            next = e.source();
        }
        None
    }
}

impl<B> Body for Deadline<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let timeout = this.timeout;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(Some(Err(Box::new(BodyTimedOut(timeout)))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_fails_at_the_deadline_counted_from_the_first_wait() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(4);
        let stream = tokio_stream_of(rx);
        let mut body = Deadline::new(StreamBody::new(stream), Duration::from_secs(10));
        tx.send(Ok(Frame::data(Bytes::from_static(b"{"))))
            .await
            .unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        let started = tokio::time::Instant::now();
        let e = body.frame().await.unwrap().unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        let e: &(dyn StdError + 'static) = &*e;
        assert!(BodyTimedOut::in_chain(e).is_some(), "{e}");
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_add_up_against_one_deadline() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(4);
        let mut body = Deadline::new(
            StreamBody::new(tokio_stream_of(rx)),
            Duration::from_secs(10),
        );
        let started = tokio::time::Instant::now();
        let sender = tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                if tx
                    .send(Ok(Frame::data(Bytes::from_static(b"x"))))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        assert!(body.frame().await.unwrap().is_ok());
        assert!(body.frame().await.unwrap().is_ok());
        assert!(body.frame().await.unwrap().is_err());
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        drop(body);
        sender.await.unwrap();
    }

    #[tokio::test]
    async fn a_whole_body_passes_untouched() {
        let mut body = Deadline::new(Full::new(Bytes::from_static(b"{}")), Duration::from_secs(1));
        let bytes = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&bytes[..], b"{}");
        assert!(body.timer.is_none());
    }

    /// The frames sent on `rx`, as a stream.
    fn tokio_stream_of(
        mut rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    ) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, BoxError>> + Unpin {
        Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}
