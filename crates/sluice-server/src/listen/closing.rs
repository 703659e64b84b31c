//! What a stopping server tells HTTP/1 clients: `connection: close` on
//! every answer from the moment it stops, so that a client that keeps
//! connections alive sends its next request elsewhere rather than on a
//! connection about to close.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::FutureExt;
use futures_util::future::Map;
use http::header::{CONNECTION, HeaderValue};
use http::{Request, Response, Version};
use hyper::service::Service;

/// `inner`, with `connection: close` on the HTTP/1 answers to requests
/// that arrive once `stopping` is set.
pub(crate) struct Closing<S> {
    pub(crate) inner: S,
    pub(crate) stopping: Arc<AtomicBool>,
}

/// What a response goes through: unchanged, or marked to close.
type Finish<B, E> = fn(Result<Response<B>, E>) -> Result<Response<B>, E>;

impl<S, ReqB, B> Service<Request<ReqB>> for Closing<S>
where
    S: Service<Request<ReqB>, Response = Response<B>>,
{
    type Response = Response<B>;
    type Error = S::Error;
    // A function pointer chosen per request, so that no answer is boxed.
    type Future = Map<S::Future, Finish<B, S::Error>>;

    fn call(&self, req: Request<ReqB>) -> Self::Future {
        let http1 = req.version() <= Version::HTTP_11;
        let finish: Finish<B, S::Error> = if http1 && self.stopping.load(Ordering::Relaxed) {
            close
        } else {
            keep
        };
        self.inner.call(req).map(finish)
    }
}

fn keep<B, E>(res: Result<Response<B>, E>) -> Result<Response<B>, E> {
    res
}

fn close<B, E>(res: Result<Response<B>, E>) -> Result<Response<B>, E> {
    res.map(|mut res| {
        res.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        res
    })
}
