//! `sluice bench`: the real binary loading the real baseline server, a real
//! `sluice serve` (HTTP and Envoy RLS) and misbehaving servers,
//! and refusing bad command lines with a clear message.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{Process as Server, free_port, policy_file, serve_args, sluice};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// Starts `sluice bench baseline` on a free port and returns it with the
/// address it printed.
fn baseline() -> (Server, SocketAddr) {
    bare("baseline", &[])
}

/// Starts the bare server `sluice bench <kind>` with the flags `rest` on a
/// free port and returns it with the address it printed.
fn bare(kind: &str, rest: &[&str]) -> (Server, SocketAddr) {
    let mut child = Command::new(BIN)
        .args(["bench", kind, "--listen", "127.0.0.1:0"])
        .args(rest)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line.trim().parse().unwrap_or_else(|_| panic!("{line:?}"));
    (server, addr)
}

/// Starts `sluice serve` with `policy` on free ports and waits until the
/// listener named by `wait_for` accepts connections. Returns the HTTP and
/// gRPC addresses.
fn serve(policy: &str, wait_for: Listener) -> (Server, tempfile::TempDir, SocketAddr, SocketAddr) {
    serve_with(policy, wait_for, &[])
}

/// [`serve`] with the further flags `rest`.
fn serve_with(
    policy: &str,
    wait_for: Listener,
    rest: &[&str],
) -> (Server, tempfile::TempDir, SocketAddr, SocketAddr) {
    let (dir, path) = policy_file(policy);
    let (args, http, grpc) = serve_args(&path);
    let server = Server(
        sluice()
            .args(args)
            .args(rest)
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let addr = match wait_for {
        Listener::Http => http,
        Listener::Grpc => grpc,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
        assert!(
            Instant::now() < deadline,
            "sluice serve never listened on {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (server, dir, http, grpc)
}

enum Listener {
    Http,
    Grpc,
}

fn bench(args: &[&str]) -> Output {
    Command::new(BIN).arg("bench").args(args).output().unwrap()
}

/// Runs a bench that must succeed and returns its JSON result and stderr.
fn bench_json(args: &[&str]) -> (serde_json::Value, String) {
    let out = bench(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (json, stderr)
}

/// Runs a quiet bench of `kind` against `target` for `duration` seconds,
/// with no warm-up and the other flags in `rest`, and returns its result.
fn quick_json(kind: &str, target: &str, duration: &str, rest: &[&str]) -> serde_json::Value {
    let mut args = vec![kind, "--target", target, "--duration", duration];
    args.extend_from_slice(&["--warmup", "0", "--json", "--quiet"]);
    args.extend_from_slice(rest);
    bench_json(&args).0
}

fn count(j: &serde_json::Value, outcome: &str) -> u64 {
    j["outcomes"][outcome]
        .as_u64()
        .unwrap_or_else(|| panic!("no {outcome} in {j}"))
}

fn assert_percentiles_ordered(j: &serde_json::Value) {
    let l = &j["latency_ms"];
    let (p50, p99, p999) = (
        l["p50"].as_f64().unwrap(),
        l["p99"].as_f64().unwrap(),
        l["p999"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{l}");
    assert!(p999 <= l["max"].as_f64().unwrap(), "{l}");
}

#[test]
fn http_against_the_baseline_is_all_2xx_with_ordered_percentiles() {
    let (_server, addr) = baseline();
    let target = addr.to_string();
    let (j, stderr) = bench_json(&[
        "http",
        "--target",
        &target,
        "--concurrency",
        "4",
        "--duration",
        "1.5",
        "--warmup",
        "0.2",
        "--json",
    ]);
    let requests = j["requests"].as_u64().unwrap();
    assert!(requests > 0, "{j}");
    assert_eq!(count(&j, "status_2xx"), requests, "{j}");
    assert_eq!(count(&j, "transport_errors"), 0, "{j}");
    assert!(j["throughput_rps"].as_f64().unwrap() > 0.0, "{j}");
    assert_eq!(j["concurrency"], 4);
    assert_eq!(j["request"], "POST /v1/limit");
    assert_percentiles_ordered(&j);
    // Standard error is not a terminal here: plain progress lines, one at
    // the first second (0.7 s before the end, for a slow machine).
    assert!(
        stderr.contains("req/s") && !stderr.contains('\r'),
        "{stderr:?}"
    );
}

#[test]
fn http_text_result_and_a_get_with_headers_and_keys_in_the_path() {
    let (_server, addr) = baseline();
    let target = format!("http://{addr}");
    let out = bench(&[
        "http",
        "--target",
        &target,
        "-c",
        "2",
        "--duration",
        "0.3",
        "--warmup",
        "0",
        "--method",
        "GET",
        "--path",
        "/items/{key}?x=1",
        "--header",
        "X-Api-Key: k1",
        "--keys",
        "200000",
        "--quiet",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.is_empty(), "--quiet printed {stderr:?}");
    assert!(stdout.contains("GET /items/{key}?x=1"), "{stdout}");
    assert!(stdout.contains("p99"), "{stdout}");
    assert!(stdout.contains("transport errors 0"), "{stdout}");
}

const TINY_POLICY: &str = r#"
limits:
  sendMessage:
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 60, burst: 2}
rules:
  - name: per-user
    domain: edge
    limit_keys: ["descriptor:user"]
    match: {"descriptor:tenant": acme}
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 60, burst: 2}
"#;

#[test]
fn http_against_serve_counts_429s() {
    let (_server, _dir, http, _) = serve(TINY_POLICY, Listener::Http);
    let target = http.to_string();
    // Three keys with a burst of two each: six calls are admitted, the rest
    // of the second is refused. No warm-up, or it would spend the bursts.
    let j = quick_json("http", &target, "1", &["--concurrency", "4", "--keys", "3"]);
    let requests = j["requests"].as_u64().unwrap();
    let (ok, denied) = (count(&j, "status_2xx"), count(&j, "status_429"));
    assert!(ok > 0 && ok <= 6, "{j}");
    assert!(denied > 0, "{j}");
    assert_eq!(ok + denied, requests, "{j}");
    assert_percentiles_ordered(&j);
}

#[test]
fn grpc_against_serve_counts_over_limit() {
    let (_server, _dir, _, grpc) = serve(TINY_POLICY, Listener::Grpc);
    let target = grpc.to_string();
    // The rule applies only to descriptors carrying tenant=acme, keyed on
    // the user entry: if either entry or the hits were lost on the way, no
    // call would ever be over.
    let j = quick_json(
        "grpc",
        &target,
        "1",
        &[
            "--concurrency",
            "4",
            "--connections",
            "2",
            "--keys",
            "3",
            "--descriptor",
            "tenant=acme",
            "--descriptor",
            "user={key}",
            "--hits",
            "2",
        ],
    );
    let requests = j["requests"].as_u64().unwrap();
    let (ok, over) = (count(&j, "ok"), count(&j, "over_limit"));
    // Burst 2 and 2 hits a call: one call per key is admitted.
    assert!(ok > 0 && ok <= 3, "{j}");
    assert!(over > 0, "{j}");
    assert_eq!(ok + over, requests, "{j}");
    assert_eq!(count(&j, "unknown") + count(&j, "errors"), 0, "{j}");
    assert_eq!(j["connections"], 2);
    assert_percentiles_ordered(&j);
}

#[test]
fn grpc_against_the_rls_baseline_is_all_ok() {
    let (_server, addr) = bare("rls-baseline", &[]);
    let j = quick_json(
        "grpc",
        &addr.to_string(),
        "1",
        &[
            "--concurrency",
            "4",
            "--keys",
            "3",
            "--descriptor",
            "user={key}",
        ],
    );
    let requests = j["requests"].as_u64().unwrap();
    assert!(requests > 0, "{j}");
    assert_eq!(count(&j, "ok"), requests, "{j}");
    assert_percentiles_ordered(&j);
}

/// `--threads 1` puts every server and the client on tokio's
/// single-threaded scheduler: each still answers, and decides, as it does
/// on several threads.
#[test]
fn servers_and_the_client_on_one_thread_answer_as_on_several() {
    let one = ["--threads", "1"];
    let (_serve, _dir, http, grpc) = serve_with(TINY_POLICY, Listener::Grpc, &one);
    let (_baseline, bare_http) = bare("baseline", &one);
    let (_floor, bare_grpc) = bare("rls-baseline", &one);

    let j = quick_json("http", &bare_http.to_string(), "0.5", &one);
    assert_eq!(
        count(&j, "status_2xx"),
        j["requests"].as_u64().unwrap(),
        "{j}"
    );
    assert_eq!(j["client_threads"], 1, "{j}");
    let j = quick_json("grpc", &bare_grpc.to_string(), "0.5", &one);
    assert_eq!(count(&j, "ok"), j["requests"].as_u64().unwrap(), "{j}");

    // As in `http_against_serve_counts_429s`: six admitted over three keys.
    let mut rest = vec!["--concurrency", "4", "--keys", "3"];
    rest.extend_from_slice(&one);
    let j = quick_json("http", &http.to_string(), "0.5", &rest);
    let (ok, denied) = (count(&j, "status_2xx"), count(&j, "status_429"));
    assert!(ok > 0 && ok <= 6, "{j}");
    assert_eq!(ok + denied, j["requests"].as_u64().unwrap(), "{j}");
    // A decision over gRPC on the same single thread, for a rule of its own.
    rest.extend_from_slice(&["--descriptor", "tenant=acme", "--descriptor", "user={key}"]);
    let j = quick_json("grpc", &grpc.to_string(), "0.5", &rest);
    let (ok, over) = (count(&j, "ok"), count(&j, "over_limit"));
    assert!(ok > 0 && ok <= 6, "{j}");
    assert!(over > 0, "{j}");
    // And serve says so.
    let metrics = get(http, "/metrics");
    assert!(
        metrics.contains(r#"sluice_runtime_workers{scheduler="current_thread"} 1"#),
        "{metrics}"
    );
}

/// The body of `GET path` on `addr`, over HTTP/1.0 so that the server
/// closes the connection when it is done.
fn get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// A server on a free port that hands every connection to `handle`, each
/// on a thread of its own.
fn raw_server(handle: fn(TcpStream)) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || handle(stream));
        }
    });
    addr
}

/// Reads one request (head and `Content-Length` body) from `stream`.
fn read_request(stream: &mut TcpStream) -> Option<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        if buf.len() >= end + 4 + length {
            return Some(());
        }
    }
}

#[test]
fn connections_the_server_closes_are_replaced_without_errors() {
    // One answer per connection, then `Connection: close`, as a server
    // shedding keep-alive connections does.
    let addr = raw_server(|mut stream| {
        if read_request(&mut stream).is_some() {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    let target = addr.to_string();
    let j = quick_json("http", &target, "0.5", &["-c", "2"]);
    let requests = j["requests"].as_u64().unwrap();
    assert!(requests > 0, "{j}");
    assert_eq!(count(&j, "status_2xx"), requests, "{j}");
    assert_eq!(j["first_problem"], serde_json::Value::Null, "{j}");
}

#[test]
fn a_server_that_never_answers_times_out_and_the_run_still_ends_on_time() {
    let addr = raw_server(|mut stream| {
        // Reads the request and holds the connection open, answering
        // nothing, until the client gives up.
        let _ = read_request(&mut stream);
        let _ = stream.read(&mut [0u8; 1]);
    });
    let target = addr.to_string();
    let started = Instant::now();
    let j = quick_json("http", &target, "1", &["-c", "2", "--timeout", "0.2"]);
    assert!(started.elapsed() < Duration::from_secs(5), "{j}");
    assert!(count(&j, "transport_errors") >= 2, "{j}");
    assert_eq!(count(&j, "status_2xx"), 0, "{j}");
    let why = j["first_problem"].as_str().unwrap();
    assert!(why.contains("no answer within"), "{why}");
    // Nothing answered, so nothing per second either.
    assert_eq!(j["throughput_rps"], 0.0);
}

/// Runs a bench that must fail and returns its standard error.
fn refused(args: &[&str]) -> String {
    let out = bench(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?} printed a result");
    stderr
}

#[test]
fn bad_command_lines_fail_with_a_clear_message() {
    let e = refused(&["http", "--target", "127.0.0.1:9", "--concurrency", "0"]);
    assert!(e.contains("--concurrency"), "{e}");
    let e = refused(&["http", "--target", "127.0.0.1:9", "--threads", "0"]);
    assert!(e.contains("--threads"), "{e}");
    let e = refused(&["http", "--target", "not a target", "--duration", "0.1"]);
    assert!(e.contains("not a target"), "{e}");
    let e = refused(&["grpc", "--target", "https://h:1", "--duration", "0.1"]);
    assert!(e.contains("not supported"), "{e}");
    let e = refused(&["http", "--target", "127.0.0.1:9", "--duration", "0"]);
    assert!(e.contains("more than zero"), "{e}");
    let e = refused(&["http", "--target", "127.0.0.1:9", "--header", "nocolon"]);
    assert!(e.contains("NAME:VALUE"), "{e}");
    // Nothing listens on a port just freed: one clear error, no run.
    let nobody = format!("127.0.0.1:{}", free_port());
    let e = refused(&["http", "--target", &nobody, "--duration", "0.1"]);
    assert!(e.contains("cannot connect"), "{e}");
    let e = refused(&["grpc", "--target", &nobody, "--duration", "0.1"]);
    assert!(e.contains("cannot connect"), "{e}");
}
