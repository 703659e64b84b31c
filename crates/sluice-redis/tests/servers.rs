//! Smoke tests of the test harness itself: real redis-server processes start,
//! die and come back on their port, and real clusters come up healthy.

// Test helpers outside #[test] functions fail loudly on purpose.
#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::net::{Ipv4Addr, TcpStream};

use support::{RedisCluster, RedisServer, command};

#[test]
fn a_server_answers_dies_and_comes_back_on_the_same_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}/"));
    assert_eq!(command(port, &["PING"]).unwrap(), "+PONG\r\n");
    assert_eq!(command(port, &["SET", "k", "v"]).unwrap(), "+OK\r\n");
    assert_eq!(command(port, &["GET", "k"]).unwrap(), "$1\r\nv\r\n");
    assert!(server.is_running());

    server.kill();
    assert!(!server.is_running());
    assert!(
        TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err(),
        "a killed server still accepts connections on {port}"
    );
    assert!(command(port, &["PING"]).is_err());

    server.restart();
    assert_eq!(server.port(), port);
    assert!(server.is_running());
    assert_eq!(command(port, &["PING"]).unwrap(), "+PONG\r\n");
    // Nothing is persisted, so the restarted server is empty.
    assert_eq!(command(port, &["GET", "k"]).unwrap(), "$-1\r\n");
    assert_eq!(command(port, &["DBSIZE"]).unwrap(), ":0\r\n");
}

#[test]
fn extra_arguments_reach_the_server() {
    let server = RedisServer::start_with(&["--maxmemory", "10mb"]);
    assert_eq!(
        command(server.port(), &["CONFIG", "GET", "maxmemory"]).unwrap(),
        "*2\r\n$9\r\nmaxmemory\r\n$8\r\n10485760\r\n"
    );
    assert_eq!(
        command(server.port(), &["CONFIG", "GET", "save"]).unwrap(),
        "*2\r\n$4\r\nsave\r\n$0\r\n\r\n"
    );
}

#[test]
fn three_masters_form_a_healthy_cluster() {
    let cluster = RedisCluster::start(RedisCluster::DEFAULT_MASTERS);
    let ports = cluster.ports();
    assert_eq!(ports.len(), 3);
    assert_eq!(
        cluster.urls(),
        ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect::<Vec<_>>()
    );

    for &port in &ports {
        let info = command(port, &["CLUSTER", "INFO"]).unwrap();
        assert!(info.contains("cluster_state:ok\r\n"), "node {port}: {info}");
        assert!(
            info.contains("cluster_known_nodes:3\r\n"),
            "node {port}: {info}"
        );
        assert!(
            info.contains("cluster_slots_assigned:16384\r\n"),
            "node {port}: {info}"
        );
    }

    // The slots are split: exactly one master owns a key, the others redirect.
    let replies: Vec<String> = ports
        .iter()
        .map(|&p| command(p, &["SET", "some-key", "1"]).unwrap())
        .collect();
    assert_eq!(
        replies.iter().filter(|r| *r == "+OK\r\n").count(),
        1,
        "{replies:?}"
    );
    assert_eq!(
        replies.iter().filter(|r| r.starts_with("-MOVED ")).count(),
        2,
        "{replies:?}"
    );
}
