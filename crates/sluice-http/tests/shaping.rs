//! Rules that delay, in the middleware: a request over the limit that a
//! reservation admits within `max` is held and passed on when it is due,
//! one beyond gets the 429, a client that goes away while held gives its
//! reservation back, and a layer holds at most its cap at once. On a
//! single-threaded runtime with paused time, which the store's clock
//! follows, so that the instants are exact.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::convert::Infallible;

use http::{HeaderMap, Request, Response, StatusCode};
use sluice_core::{Clock, MemoryStore, Nanos};
use sluice_http::{Enforcer, PeerAddr, RATELIMIT, RateLimitLayer};
use sluice_policy::Policy;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

/// 10 a second, a bucket of 1, and up to 3 more held for at most 1 s.
const POLICY: &str = r#"
rules:
  - name: shaped
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rps: 10, burst: 1, max_reserved: 3}
    on_limit: {delay: {max: 1s}}
"#;

/// The store's clock, following Tokio's.
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        Nanos(i64::try_from(self.0.elapsed().as_nanos()).unwrap())
    }
}

/// When, after the start, each request reached the inner service.
type Arrivals = Arc<Mutex<Vec<Duration>>>;

fn layer() -> RateLimitLayer<MemoryStore<TokioClock>> {
    let store = MemoryStore::with_clock(TokioClock(Instant::now()));
    let policy = Policy::from_str(POLICY, "policy.yaml").unwrap();
    RateLimitLayer::new(Arc::new(Enforcer::new(policy, store)))
}

/// What a client gets back: the status and headers.
type Answer = (StatusCode, HeaderMap);
type Stack = BoxCloneService<Request<()>, Answer, Infallible>;

/// The layer over a service that records when each request arrives.
fn stack(layer: &RateLimitLayer<MemoryStore<TokioClock>>, arrivals: &Arrivals) -> Stack {
    let (start, arrivals) = (Instant::now(), Arc::clone(arrivals));
    let inner = tower::service_fn(move |_req: Request<()>| {
        arrivals.lock().unwrap().push(start.elapsed());
        async { Ok::<_, Infallible>(Response::new(())) }
    });
    BoxCloneService::new(
        layer
            .layer(inner)
            .map_response(|res| (res.status(), res.headers().clone())),
    )
}

fn request() -> Request<()> {
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(PeerAddr("192.0.2.1:5000".parse().unwrap()));
    req
}

/// Sends `n` requests at once, each on a task of its own, and returns the
/// tasks in the order sent.
fn burst(svc: &Stack, n: usize) -> Vec<JoinHandle<Answer>> {
    (0..n)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(request()).await.unwrap() })
        })
        .collect()
}

/// The statuses of `tasks`, in order.
async fn statuses(tasks: Vec<JoinHandle<Answer>>) -> Vec<StatusCode> {
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap().0);
    }
    out
}

const MS: fn(u64) -> Duration = Duration::from_millis;

#[tokio::test(start_paused = true)]
async fn a_burst_beyond_the_bucket_is_held_and_passed_on_at_the_exact_due_instants() {
    let arrivals = Arrivals::default();
    let layer = layer();
    let svc = stack(&layer, &arrivals);
    let mut statuses = Vec::new();
    let mut headers = Vec::new();
    for task in burst(&svc, 6) {
        let (status, h) = task.await.unwrap();
        statuses.push(status);
        headers.push(h);
    }
    let ok = StatusCode::OK;
    let refused = StatusCode::TOO_MANY_REQUESTS;
    assert_eq!(statuses, [ok, ok, ok, ok, refused, refused]);
    assert_eq!(
        *arrivals.lock().unwrap(),
        [MS(0), MS(100), MS(200), MS(300)]
    );
    // A held request passed on carries the headers of its decision.
    assert!(headers[3].contains_key(RATELIMIT), "{:?}", headers[3]);
    // Beyond max_reserved: refused at once, told when a token frees up.
    assert_eq!(headers[4]["retry-after"], "1");
    assert_eq!(layer.enforcer().activity().held, 0);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_goes_away_while_held_gives_its_reservation_back() {
    let arrivals = Arrivals::default();
    let layer = layer();
    let svc = stack(&layer, &arrivals);
    let first = burst(&svc, 1).pop().unwrap();
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    // Held for 100 ms; its client goes away after 10.
    let held = burst(&svc, 1).pop().unwrap();
    tokio::time::sleep(MS(10)).await;
    assert_eq!(layer.enforcer().activity().held, 1);
    held.abort();
    assert!(held.await.unwrap_err().is_cancelled());
    assert_eq!(layer.enforcer().activity().held, 0);
    // The refund is a task of its own: let it run.
    tokio::task::yield_now().await;
    // The next request takes the abandoned one's place, due at 100 ms, not 200.
    let next = burst(&svc, 1).pop().unwrap();
    assert_eq!(next.await.unwrap().0, StatusCode::OK);
    assert_eq!(*arrivals.lock().unwrap(), [MS(0), MS(100)]);
}

#[tokio::test(start_paused = true)]
async fn a_layer_holds_at_most_its_cap_and_refuses_beyond_as_without_delay() {
    let arrivals = Arrivals::default();
    let layer = layer().with_max_held(2);
    let svc = stack(&layer, &arrivals);
    let first = burst(&svc, 1).pop().unwrap();
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    let held = burst(&svc, 2);
    tokio::task::yield_now().await;
    assert_eq!(layer.holding().held(), 2);
    // Room for one more in max_reserved, but none in the layer.
    let over = burst(&svc, 1).pop().unwrap();
    assert_eq!(over.await.unwrap().0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses(held).await, [StatusCode::OK, StatusCode::OK]);
    assert_eq!(*arrivals.lock().unwrap(), [MS(0), MS(100), MS(200)]);
    assert_eq!(layer.holding().held(), 0);
    // With room again, a request is held once more.
    let again = burst(&svc, 1).pop().unwrap();
    assert_eq!(again.await.unwrap().0, StatusCode::OK);
    assert_eq!(arrivals.lock().unwrap().last(), Some(&MS(300)));
}

#[tokio::test(start_paused = true)]
async fn a_layer_with_no_room_to_hold_refuses_as_without_delay() {
    let arrivals = Arrivals::default();
    let layer = layer().with_max_held(0);
    let svc = stack(&layer, &arrivals);
    assert_eq!(
        statuses(burst(&svc, 2)).await,
        [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]
    );
    assert!(arrivals.lock().unwrap().len() == 1);
}

#[tokio::test(start_paused = true)]
async fn a_flood_on_one_key_holds_at_most_max_reserved_and_refuses_the_rest_at_once() {
    let arrivals = Arrivals::default();
    let layer = layer();
    let svc = stack(&layer, &arrivals);
    let flood = burst(&svc, 2_000);
    // Every request decided; none yet due.
    tokio::task::yield_now().await;
    assert_eq!(layer.enforcer().activity().held, 3);
    assert_eq!(layer.holding().held(), 3);
    let got = statuses(flood).await;
    let ok = got.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!((ok, got.len() - ok), (4, 1_996));
    assert_eq!(
        *arrivals.lock().unwrap(),
        [MS(0), MS(100), MS(200), MS(300)]
    );
}
