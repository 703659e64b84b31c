//! A request never leaks a slot of a concurrency limit, even when its store
//! call fails after the store took the lease (a reply that missed its
//! deadline), or is abandoned while the store decides: the leases it may
//! have taken are released, and releasing one never taken changes nothing.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sluice_core::{
    Decision, FakeClock, Limit, MemoryStore, Mode, Nanos, Op, Outcome, Settle, Store, StoreError,
    Value,
};
use sluice_engine::Enforcer;
use sluice_policy::{Policy, RequestParts};
use tokio::sync::Notify;

const POLICY: &str = r#"
on_store_error: closed
rules:
  - name: uploads
    limit_keys: [ip:address]
    algorithm: concurrency
    algorithm_config: {max: 1, lease: 1h}
limits:
  jobs:
    algorithm: concurrency
    algorithm_config: {max: 1, lease: 1h}
"#;

/// The memory store, except that while `broken` it decides a transaction
/// (taking what it takes) and then answers with a timeout, and while
/// `stalled` it decides and then waits for `resume` before answering.
struct Unreliable {
    inner: MemoryStore<FakeClock>,
    broken: AtomicBool,
    stalled: AtomicBool,
    resume: Notify,
}

impl Store for Unreliable {
    async fn transact(&self, ops: &[Op<'_>], mode: Mode) -> Result<Outcome, StoreError> {
        let out = self.inner.transact_now(ops, mode);
        if self.stalled.load(Ordering::SeqCst) {
            self.resume.notified().await;
        }
        if self.broken.load(Ordering::SeqCst) {
            return Err(StoreError::Timeout);
        }
        out
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        self.inner.reset(limit, key).await
    }

    async fn value(&self, limit: &Limit, key: &str) -> Result<Value, StoreError> {
        self.inner.value(limit, key).await
    }

    async fn settle(
        &self,
        limit: &Limit,
        key: &str,
        change: Settle,
    ) -> Result<Decision, StoreError> {
        self.inner.settle(limit, key, change).await
    }

    async fn release(&self, limit: &Limit, key: &str, id: u64) -> Result<bool, StoreError> {
        self.inner.release(limit, key, id).await
    }
}

fn enforcer() -> Arc<Enforcer<Unreliable>> {
    let store = Unreliable {
        inner: MemoryStore::with_clock(FakeClock::new(Nanos::ZERO)),
        broken: AtomicBool::new(false),
        stalled: AtomicBool::new(false),
        resume: Notify::new(),
    };
    Arc::new(Enforcer::new(Policy::from_str(POLICY, "p").unwrap(), store))
}

fn upload() -> RequestParts {
    RequestParts::new("POST", "/upload").with_ip([192, 0, 2, 1].into())
}

/// Lets the releases just started finish: a yield on a current-thread
/// runtime runs every ready task, and the memory store releases in one
/// poll.
async fn released() {
    tokio::task::yield_now().await;
}

#[tokio::test]
async fn a_store_call_that_fails_after_taking_a_lease_gives_it_back() {
    let e = enforcer();
    let policy = e.policy();
    e.store().broken.store(true, Ordering::SeqCst);
    let v = e.enforce_with(&policy, &upload()).await;
    assert!(!v.allowed, "the rule fails closed");
    assert!(v.leases.is_empty());
    let jobs = policy.named_limit("jobs").unwrap();
    assert!(e.acquire_named(jobs, "k", 1.0).await.is_err());
    released().await;
    e.store().broken.store(false, Ordering::SeqCst);
    // Both slots came back: without the release, each would be held for
    // the hour of its lease.
    assert!(e.enforce_with(&policy, &upload()).await.allowed);
    assert!(
        e.acquire_named(jobs, "k", 1.0)
            .await
            .unwrap()
            .0
            .decision
            .allowed
    );
}

#[tokio::test]
async fn a_request_abandoned_while_the_store_decides_gives_its_lease_back() {
    let e = enforcer();
    let policy = e.policy();
    e.store().stalled.store(true, Ordering::SeqCst);
    {
        let req = upload();
        let decision = e.enforce_with(&policy, &req);
        let mut decision = std::pin::pin!(decision);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        assert!(
            decision.as_mut().poll(&mut cx).is_pending(),
            "the store is deciding"
        );
        // The client goes away: the decision is dropped mid-call.
    }
    released().await;
    e.store().stalled.store(false, Ordering::SeqCst);
    assert!(e.enforce_with(&policy, &upload()).await.allowed);
}
