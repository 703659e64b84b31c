//! `sluice serve` on a real PostgreSQL: servers that share a database share
//! one limit, chosen by `--store postgres://` or by the policy; a database
//! that stops is answered as each limit's `on_store_error` says, `/readyz`
//! says so, and decisions resume when it is back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

#[path = "../../sluice-postgres/tests/support/mod.rs"]
mod postgres;

use std::time::Duration;

use support::serve::spawn_serve_with;
use support::{eventually, policy_file};

const POLICY: &str = "limits:\n  send:\n    algorithm: token_bucket\n    \
    algorithm_config: {rate: 1, period: 1h, burst: 3}\n    on_store_error: closed\n";

async fn limit(client: &reqwest::Client, base: &str) -> u16 {
    client
        .post(format!("{base}/v1/limit"))
        .header("content-type", "application/json")
        .body(r#"{"limit": "send", "key": "alice"}"#)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_database_share_one_limit() {
    let db = postgres::PostgresServer::start();
    let (_dir, path) = policy_file(POLICY);
    let url = db.url();
    let (_a, a, _) = spawn_serve_with(&path, &["--store", &url], &[], "/readyz").await;
    // The other chooses the store in its policy.
    let (_dir2, path2) = policy_file(&format!(
        "store: {{kind: postgres, url: \"{url}\", schema: sluice}}\n{POLICY}"
    ));
    let (_b, b, _) = spawn_serve_with(&path2, &[], &[], "/readyz").await;
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for base in [&a, &b, &a, &b, &a] {
        statuses.push(limit(&client, base).await);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_is_answered_as_the_limit_says_and_calls_resume_when_it_is_back() {
    // Durable, as a database a quota must survive is: what was committed
    // before the crash is there after it.
    let mut db = postgres::PostgresServer::start_with(&[]);
    let (_dir, path) = policy_file(POLICY);
    let (_server, base, _) = spawn_serve_with(&path, &["--store", &db.url()], &[], "/readyz").await;
    let client = reqwest::Client::new();
    assert_eq!(limit(&client, &base).await, 200);

    db.stop_immediate();
    // A limit that fails closed answers 503, and /readyz stops being 200.
    assert_eq!(limit(&client, &base).await, 503);
    let readyz = format!("{base}/readyz");
    eventually(Duration::from_secs(10), "/readyz to say 503", async || {
        client.get(&readyz).send().await.unwrap().status() == 503
    })
    .await;

    db.restart(&[]);
    eventually(
        Duration::from_secs(10),
        "a decision after the restart",
        async || limit(&client, &base).await == 200,
    )
    .await;
    // The database kept what was spent: one token of three before, one now.
    assert_eq!(limit(&client, &base).await, 200);
    assert_eq!(limit(&client, &base).await, 429);
}
