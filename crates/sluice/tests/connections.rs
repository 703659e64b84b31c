//! What clients that open connections and then stall can do to the real
//! `serve` and `proxy` binaries: a flood of stalled request bodies against
//! the connection cap, a stalled body against the body timeout, a stalled
//! request against SIGTERM, and the cap on the gRPC and proxy listeners.
//!
//! A test binary of its own: the flood raises this process's limit on open
//! files and holds tens of thousands of sockets, which the other tests need
//! not share. The server, raw HTTP and stalling clients are set up in
//! `support::connections`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::connections::{
    STALLED_CALL, Serve, closed_by_server, file_budget, get, mib, open_files, parse, rss, stall,
};
use support::proxy::spawn_proxy;
use support::{PATIENCE, Process, eventually, metric, policy_file};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The stalled connections of the flood: as many as once used up every
/// file descriptor of a server.
const STALLED: usize = 20_000;

/// The environment variables that make [`stalled_connections_held_for_the_flood`]
/// connect: where, and how many.
const HELPER_ADDR: &str = "SLUICE_TEST_STALL_ADDR";
const HELPER_COUNT: &str = "SLUICE_TEST_STALL_COUNT";

/// Holds stalled connections for the flood in a process of its own, when
/// the flood's process may not open as many files as it needs: started with
/// [`HELPER_ADDR`] and [`HELPER_COUNT`], it connects, says `held` on its
/// standard output, and holds the connections until its standard input
/// closes. Without them it does nothing.
#[test]
#[ignore = "a helper process of the flood"]
fn stalled_connections_held_for_the_flood() {
    use std::io::{Read, Write};
    let (Ok(addr), Ok(count)) = (std::env::var(HELPER_ADDR), std::env::var(HELPER_COUNT)) else {
        return;
    };
    let count: usize = count.parse().unwrap();
    assert!(file_budget(count) >= count, "no room for {count} files");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let held = runtime.block_on(stall(addr.parse().unwrap(), count, STALLED_CALL));
    println!("\nheld {}", held.len());
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(held);
}

/// Starts a helper process that holds `count` stalled connections to
/// `addr`, and waits until they are open.
fn stall_elsewhere(addr: SocketAddr, count: usize) -> Process {
    use std::io::BufRead;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "stalled_connections_held_for_the_flood"])
        .args(["--ignored", "--nocapture", "--test-threads", "1"])
        .env(HELPER_ADDR, addr.to_string())
        .env(HELPER_COUNT, count.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let held = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line == format!("held {count}"));
    assert!(held, "the helper did not hold its {count} connections");
    Process(child)
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_stalled_request_bodies_leave_healthz_answering_and_memory_stops_growing_at_the_cap_and_returns_after()
 {
    let (soft, hard) = rlimit::Resource::NOFILE.get().unwrap();
    let own = file_budget(STALLED).min(STALLED);
    if own < STALLED {
        eprintln!(
            "this process may open {own} files: {} of the {STALLED} stalled connections \
             are held by helper processes",
            STALLED - own
        );
    }
    // The server gets the limit this machine gives a process, not the one
    // this test may have raised for itself. A long body timeout leaves the
    // cap alone to hold the flood.
    let wrapper = [
        "prlimit".to_owned(),
        format!("--nofile={soft}:{hard}"),
        "--".to_owned(),
    ];
    let server = Serve::start(&wrapper, &["--body-timeout", "10m"], &[]).await;
    let pid = server.pid();
    let http = "{listener=\"http\"}";
    let cap = metric(
        &server.metrics().await,
        &format!("sluice_connections_max{http}"),
    )
    .expect("the cap is published");
    assert!(
        cap < soft as f64,
        "the cap {cap} leaves no descriptor spare"
    );
    let baseline = rss(pid);

    let mut stalled = Vec::with_capacity(own);
    let mut helpers = Vec::new();
    let (mut peak_rss, mut peak_files, mut peak_open) = (baseline, 0, 0.0_f64);
    // The memory in use when the cap was first reached.
    let mut at_cap = None;
    let mut latencies = Vec::new();
    let mut held = 0;
    while held < STALLED {
        let more = 2_000.min(STALLED - held);
        if stalled.len() + more <= own {
            stalled.extend(stall(server.http, more, STALLED_CALL).await);
        } else {
            let addr = server.http;
            helpers.push(
                tokio::task::spawn_blocking(move || stall_elsewhere(addr, more))
                    .await
                    .unwrap(),
            );
        }
        held += more;
        // Once the server has taken every connection off its accept queue,
        // as a server under a standing flood has: a burst of connects can
        // fill that queue, and a probe's connect waits out a SYN retry then.
        eventually(
            Duration::from_secs(60),
            "the server to accept them all",
            async || {
                let metrics = server.metrics().await;
                let open = metric(&metrics, &format!("sluice_connections_open{http}")).unwrap();
                let shed = metric(&metrics, &format!("sluice_connections_shed_total{http}"));
                // The scrape's own connection is one of those open.
                open + shed.unwrap_or(0.0) > held as f64
            },
        )
        .await;

        let started = Instant::now();
        let health = get(server.http, "/healthz").await;
        let took = started.elapsed();
        assert_eq!(
            health.map(|h| h.status),
            Some(200),
            "/healthz with {held} stalled connections"
        );
        latencies.push(took);
        let metrics = server.metrics().await;
        let open = metric(&metrics, &format!("sluice_connections_open{http}")).unwrap();
        assert!(open <= cap, "{open} connections open, over the cap {cap}");
        peak_open = peak_open.max(open);
        let files = open_files(pid);
        peak_files = peak_files.max(files);
        let now = rss(pid);
        peak_rss = peak_rss.max(now);
        if open >= cap && at_cap.is_none() {
            at_cap = Some(now);
        }
        eprintln!(
            "{held:>6} stalled: /healthz in {took:?}, {open} open, {files} files, {:.1} MiB",
            mib(now)
        );
    }
    assert!(
        peak_files < soft as usize,
        "the server had {peak_files} files open of its {soft}"
    );
    let shed = metric(
        &server.metrics().await,
        &format!("sluice_connections_shed_total{http}"),
    )
    .unwrap_or(0.0);
    assert!(
        shed >= STALLED as f64 - cap,
        "{shed} connections shed for {STALLED} stalled with a cap of {cap}"
    );
    let slowest = latencies.iter().max().copied().unwrap_or_default();
    // Generous: only a server that stops answering fails this.
    assert!(
        slowest < Duration::from_secs(5),
        "/healthz took {slowest:?}"
    );

    // More stalled clients than the cap cost no more memory: the ones
    // shed took theirs with them.
    let at_cap = at_cap.expect("the cap was reached");
    assert!(
        peak_rss - at_cap < (at_cap - baseline) / 2,
        "RSS went on growing past the cap: {:.1} MiB at the cap, {:.1} MiB at the end",
        mib(at_cap),
        mib(peak_rss)
    );

    drop(stalled);
    drop(helpers);
    eventually(
        Duration::from_secs(30),
        "the stalled connections to be gone",
        async || {
            let metrics = server.metrics().await;
            // The scrape's own connection is open while it is answered.
            metric(&metrics, &format!("sluice_connections_open{http}")) == Some(1.0)
        },
    )
    .await;
    // The allocator gives what the connections freed back to the system on
    // a timer of its own, so the memory comes down soon after they close.
    let near_baseline = baseline + (peak_rss - baseline) / 10;
    eventually(
        Duration::from_secs(60),
        "RSS to come back within a tenth of the flood's growth",
        async || rss(pid) <= near_baseline,
    )
    .await;
    let after = rss(pid);
    eprintln!(
        "{STALLED} stalled connections, cap {cap}: /healthz in {latencies:?}; \
         at most {peak_open} open, {peak_files} files; RSS {:.1} MiB before, \
         {:.1} MiB at the cap, {:.1} MiB at peak, {:.1} MiB after",
        mib(baseline),
        mib(at_cap),
        mib(peak_rss),
        mib(after)
    );
}

#[tokio::test]
async fn a_request_body_that_stalls_gets_a_408_problem_once_the_body_timeout_passes() {
    let server = Serve::start(&[], &["--body-timeout", "300ms"], &[]).await;
    let mut stream = TcpStream::connect(server.http).await.unwrap();
    let started = Instant::now();
    stream.write_all(STALLED_CALL).await.unwrap();
    let mut raw = Vec::new();
    // The server answers, then closes: the body it gave up on is unread.
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut raw))
        .await
        .expect("the server neither answered nor closed")
        .unwrap();
    let waited = started.elapsed();
    let answer = parse(&raw).expect("a whole response");
    assert_eq!(answer.status, 408, "{}", answer.head);
    assert!(
        answer.head.contains("application/problem+json"),
        "{}",
        answer.head
    );
    let problem: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(problem["status"], 408);
    assert!(
        problem["detail"].as_str().unwrap().contains("300ms"),
        "{problem}"
    );
    assert!(
        (Duration::from_millis(300)..PATIENCE).contains(&waited),
        "answered after {waited:?}"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn sigterm_with_a_stalled_request_in_flight_exits_once_the_shutdown_timeout_passes() {
    // The body timeout is long, so that only the shutdown timeout can end
    // the request.
    let mut server = Serve::start(
        &[],
        &["--body-timeout", "60s"],
        &[("SLUICE_SHUTDOWN_TIMEOUT", "1s")],
    )
    .await;
    let mut stream = TcpStream::connect(server.http).await.unwrap();
    stream
        .write_all(
            b"POST /v1/limit HTTP/1.1\r\nhost: sluice\r\nexpect: 100-continue\r\n\
              content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
        )
        .await
        .unwrap();
    // hyper sends the 100 once the handler reads the body: from then on the
    // request is in flight.
    let mut interim = [0; 25];
    tokio::time::timeout(PATIENCE, stream.read_exact(&mut interim))
        .await
        .expect("no 100 Continue")
        .unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream
        .write_all(b"10\r\n{\"limit\": \"send\"\r\n")
        .await
        .unwrap();

    let started = Instant::now();
    server.process.terminate(PATIENCE).await;
    let took = started.elapsed();
    eprintln!("exited {took:?} after SIGTERM with a request in flight");
    assert!(
        took >= Duration::from_secs(1),
        "exited after {took:?}, without waiting for the request in flight"
    );
    assert!(closed_by_server(&mut stream).await);
}

#[tokio::test]
async fn the_grpc_listener_keeps_its_cap_and_a_new_call_still_gets_an_answer() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let server = Serve::start(&[], &["--max-connections", "8"], &[]).await;
    let grpc = "{listener=\"grpc\"}";
    // One at a time, so that the first is the one silent longest.
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(TcpStream::connect(server.grpc).await.unwrap());
    }
    let shed = async |want: f64| {
        let text = server.metrics().await;
        metric(&text, &format!("sluice_connections_shed_total{grpc}")) == Some(want)
    };
    eventually(PATIENCE, "12 connections shed", async || shed(12.0).await).await;

    let mut envoy = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let answer = envoy
        .should_rate_limit(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "client".into(),
                    value: "a".into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, 1, "OK");
    let metrics = server.metrics().await;
    assert_eq!(
        metric(&metrics, &format!("sluice_connections_open{grpc}")),
        Some(8.0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, &format!("sluice_connections_shed_total{grpc}")),
        Some(13.0)
    );
    assert!(
        closed_by_server(&mut silent[0]).await,
        "the stalest was shed"
    );
}

#[tokio::test]
async fn the_proxy_keeps_its_cap_and_a_new_request_still_gets_through() {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let app = axum::Router::new().fallback(|| async { "through\n" });
    tokio::spawn(async move { axum::serve(upstream, app).await });
    let (_dir, policy) = policy_file(
        "rules:\n  - name: all\n    limit_keys: []\n    algorithm: token_bucket\n    algorithm_config: {rps: 1000, burst: 1000}\n",
    );
    let max_connections = [("SLUICE_MAX_CONNECTIONS", "8")];
    let (_proxy, listen, admin) = spawn_proxy(upstream_addr, &policy, &max_connections).await;
    let proxy = "{listener=\"proxy\"}";
    let shed = async || {
        let text = get(admin, "/metrics").await.unwrap().body;
        metric(&text, &format!("sluice_connections_shed_total{proxy}"))
    };
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(TcpStream::connect(listen).await.unwrap());
    }
    eventually(PATIENCE, "12 connections shed", async || {
        shed().await == Some(12.0)
    })
    .await;

    let answer = get(listen, "/anything").await.expect("an answer");
    assert_eq!((answer.status, answer.body.as_str()), (200, "through\n"));
    assert_eq!(shed().await, Some(13.0));
    // The request's connection closes after its answer; the others stay.
    eventually(PATIENCE, "7 connections open", async || {
        let text = get(admin, "/metrics").await.unwrap().body;
        metric(&text, &format!("sluice_connections_open{proxy}")) == Some(7.0)
    })
    .await;
    assert!(
        closed_by_server(&mut silent[0]).await,
        "the stalest was shed"
    );
}
