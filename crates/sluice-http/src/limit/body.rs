//! The response body of an admitted request, which holds the request's
//! slots on concurrency limits until it ends.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use sluice_engine::HeldLeases;

pin_project_lite::pin_project! {
    /// A response body that holds its request's slots on concurrency limits
    /// (see [`HeldLeases`]) until it has been sent in full, fails, or is dropped
    /// because the client went away: a streaming response holds its slot
    /// for as long as it streams.
    ///
    /// ```
    /// use http_body::Body;
    /// use http_body_util::Full;
    /// use sluice_engine::HeldLeases;
    /// use sluice_http::Leased;
    /// let body = Leased::new(Full::new(bytes::Bytes::from_static(b"hi")), HeldLeases::none());
    /// assert_eq!(body.size_hint().exact(), Some(2));
    /// ```
    pub struct Leased<B> {
        #[pin]
        inner: B,
        slots: Option<HeldLeases>,
    }
}

impl<B> Leased<B> {
    /// `inner`, holding `slots` until it ends.
    pub fn new(inner: B, slots: HeldLeases) -> Leased<B> {
        Leased {
            inner,
            slots: Some(slots),
        }
    }
}

impl<B: Body> Body for Leased<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        let ended = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => this.inner.is_end_stream(),
        };
        if ended {
            // The work is done: the slots go back now, not when the
            // connection gets round to dropping the body.
            this.slots.take();
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
