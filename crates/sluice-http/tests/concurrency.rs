//! A concurrency rule in the middleware: a request holds its slot from
//! admission until its response body has been sent, fails, or is dropped,
//! and a request abandoned before its response never leaks one. The inner
//! service's responses are released by the test, one frame at a time, on a
//! single-threaded runtime with paused time.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use sluice_core::{FakeClock, MemoryStore, Nanos};
use sluice_http::{Enforcer, PeerAddr, RateLimitLayer};
use sluice_policy::Policy;
use tokio::sync::{Notify, oneshot};
use tower::{Layer, Service, ServiceExt};

const POLICY: &str = r#"
rules:
  - name: uploads
    limit_keys: [ip:address]
    algorithm: concurrency
    algorithm_config: {max: 2, lease: 1m}
"#;

/// A response body of one frame, sent when the test says so, or an error.
struct Gated(Option<oneshot::Receiver<Result<Bytes, ()>>>);

impl Body for Gated {
    type Data = Bytes;
    type Error = &'static str;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, &'static str>>> {
        let Some(rx) = self.0.as_mut() else {
            return Poll::Ready(None);
        };
        let sent = std::task::ready!(Pin::new(rx).poll(cx));
        self.0 = None;
        Poll::Ready(Some(match sent {
            Ok(Ok(bytes)) => Ok(Frame::data(bytes)),
            Ok(Err(())) | Err(_) => Err("the upstream broke off"),
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }
}

/// What the test holds of the inner service: a sender per response body,
/// and, for requests to `/hang`, the signal that lets them be answered.
#[derive(Default)]
struct Upstream {
    bodies: Mutex<Vec<oneshot::Sender<Result<Bytes, ()>>>>,
    answer: Notify,
}

/// The layer over a service whose responses the test controls.
fn stack(
    upstream: Arc<Upstream>,
) -> impl Service<
    Request<()>,
    Response = Response<impl Body<Data = Bytes, Error: std::fmt::Debug>>,
    Error = std::convert::Infallible,
> + Clone {
    let policy = Policy::from_str(POLICY, "policy.yaml").unwrap();
    let store = MemoryStore::with_clock(FakeClock::new(Nanos::ZERO));
    let enforcer = Arc::new(Enforcer::new(policy, store));
    let inner = tower::service_fn(move |req: Request<()>| {
        let upstream = Arc::clone(&upstream);
        async move {
            if req.uri().path() == "/hang" {
                upstream.answer.notified().await;
            }
            let (tx, rx) = oneshot::channel();
            upstream.bodies.lock().unwrap().push(tx);
            Ok::<_, std::convert::Infallible>(Response::new(Gated(Some(rx))))
        }
    });
    RateLimitLayer::new(enforcer).layer(inner)
}

fn req(path: &str) -> Request<()> {
    let mut r = Request::builder().uri(path).body(()).unwrap();
    r.extensions_mut()
        .insert(PeerAddr("192.0.2.1:5000".parse().unwrap()));
    r
}

/// Lets a release that was just started finish. A dropped request's slots
/// go back in a task of their own; on a current-thread runtime, a yield
/// runs every task that is ready, and on the memory store a release is
/// done in one poll.
async fn released() {
    tokio::task::yield_now().await;
}

#[tokio::test(start_paused = true)]
async fn a_slot_is_held_until_the_response_body_ends() {
    let upstream = Arc::new(Upstream::default());
    let svc = stack(Arc::clone(&upstream));
    let a = svc.clone().oneshot(req("/a")).await.unwrap();
    let b = svc.clone().oneshot(req("/b")).await.unwrap();
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    assert_eq!(
        a.headers()["ratelimit-policy"],
        r#""uploads";q=2;qu="concurrent-requests""#
    );
    // Both bodies are still streaming: a third request waits its turn.
    let c = svc.clone().oneshot(req("/c")).await.unwrap();
    assert_eq!(c.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        upstream.bodies.lock().unwrap().len(),
        2,
        "c never reached it"
    );

    // a's body ends: its slot comes back.
    let tx = upstream.bodies.lock().unwrap().remove(0);
    tx.send(Ok(Bytes::from_static(b"done"))).unwrap();
    let body = a.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "done");
    released().await;
    let d = svc.clone().oneshot(req("/d")).await.unwrap();
    assert_eq!(d.status(), StatusCode::OK);
    assert!(
        svc.clone().oneshot(req("/e")).await.unwrap().status() == StatusCode::TOO_MANY_REQUESTS,
        "b and d hold both slots"
    );

    // A body that fails gives its slot back too.
    let tx = upstream.bodies.lock().unwrap().remove(0);
    tx.send(Err(())).unwrap();
    assert!(b.into_body().collect().await.is_err());
    released().await;
    let f = svc.clone().oneshot(req("/f")).await.unwrap();
    assert_eq!(f.status(), StatusCode::OK);

    // A client that goes away drops the body mid-stream.
    drop(d);
    released().await;
    assert_eq!(
        svc.clone().oneshot(req("/g")).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_abandoned_before_its_response_never_leaks_its_slot() {
    let upstream = Arc::new(Upstream::default());
    let svc = stack(Arc::clone(&upstream));
    // Two requests admitted, each waiting on the upstream, then abandoned.
    for _ in 0..2 {
        let pending = svc.clone().oneshot(req("/hang"));
        let mut pending = Box::pin(pending);
        let waker = std::task::Waker::noop();
        assert!(
            pending
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_pending()
        );
        drop(pending);
    }
    released().await;
    assert!(upstream.bodies.lock().unwrap().is_empty());
    // Both slots came back.
    let a = svc.clone().oneshot(req("/a")).await.unwrap();
    let b = svc.clone().oneshot(req("/b")).await.unwrap();
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
}
