//! The layer in front of a real tonic server, called by a real tonic
//! client: a denied call is a gRPC `RESOURCE_EXHAUSTED` status carrying the
//! rate-limit metadata, and the client address comes from tonic's
//! connection info.

#![cfg(feature = "tonic")]
#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;

use sluice_core::{FakeClock, MemoryStore, Nanos, Store};
use sluice_http::{Enforcer, RateLimitLayer};
use sluice_policy::Policy;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const POLICY: &str = r#"
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 10, burst: 2}
"#;

#[tokio::test]
async fn a_denied_grpc_call_is_resource_exhausted_with_metadata() {
    let policy = Policy::from_str(POLICY, "policy.yaml").unwrap();
    let store = MemoryStore::with_clock(FakeClock::new(Nanos::ZERO));
    let enforcer = Arc::new(Enforcer::new(policy, store));
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(RateLimitLayer::new(Arc::clone(&enforcer)))
            .add_service(health)
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let check = || HealthCheckRequest {
        service: String::new(),
    };
    for left in ["1", "0"] {
        let res = client.check(check()).await.unwrap();
        assert_eq!(res.metadata().get("ratelimit-remaining").unwrap(), left);
    }
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("per-ip"), "{status:?}");
    let meta = status.metadata();
    // 10 s to the next token, plus at most 50% jitter.
    let retry: u64 = meta
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((10..=15).contains(&retry), "{retry}");
    assert_eq!(
        meta.get("ratelimit").unwrap(),
        "\"per-ip\";r=0;t=20",
        "{meta:?}"
    );
    // The key was the client's loopback address, read from the connection.
    let policy = enforcer.policy();
    assert_eq!(
        enforcer
            .store()
            .value(
                policy.rules()[0].limit(),
                &policy.rules()[0].key(&peer()).unwrap()
            )
            .await
            .unwrap()
            .tokens,
        0.0
    );
}

fn peer() -> sluice_policy::RequestParts {
    sluice_policy::RequestParts::new("POST", "/").with_ip([127, 0, 0, 1].into())
}
