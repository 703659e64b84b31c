//! The store conformance suite (the one the memory store and Redis pass) on
//! a real PostgreSQL, through the `Store` trait, on a fake clock: every
//! algorithm, transactions, settling, leases, and the long trace decided
//! side by side with the memory store.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use sluice_core::{FakeClock, Nanos, conformance};
use sluice_postgres::{PostgresConfig, PostgresStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_conforms() {
    let server = support::PostgresServer::start();
    let clock = FakeClock::new(Nanos(1_000 * Nanos::PER_SEC));
    // The suite checks what is decided, not how fast.
    let config = PostgresConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(Duration::from_secs(5));
    let store = PostgresStore::with_clock(config, clock.clone()).unwrap();
    conformance::run_all(&store, &clock).await;
}
