//! The image the Containerfile makes, built by `scripts/image` from the
//! debug binary (the users' build differs only in its build arguments),
//! run with podman as a platform runs it: as its non-root user, on a
//! read-only root filesystem, configured by `SLUICE_*` variables; three of
//! them on one Redis, one stopped under load, and a policy swapped as a
//! Kubernetes ConfigMap is.
//!
//! podman is Debian's, which `scripts/test` installs with runc; without it
//! the tests say they are skipped, unless CI is set, where they fail.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::Value;
use support::measure::{Seen, hammer, most_in_one_period};
use support::podman::{Container, image, podman_output};
use support::{PATIENCE, eventually, free_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One test at a time: the hammer's lower bound needs callers that are
/// never stalled for longer than the burst takes to refill (0.4 s), and the
/// other test's podman work, on 2 CPUs, stalls them.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a container may take from `podman run` to ready: starting a
/// container costs far more than starting the binary.
const START: Duration = Duration::from_secs(30);

/// `POST /v1/limit` of `limit` for `key` on `base`: the status, or the
/// error when no answer came.
async fn limit(
    client: &reqwest::Client,
    base: &str,
    limit: &str,
    key: &str,
) -> Result<u16, reqwest::Error> {
    let res = client
        .post(format!("{base}/v1/limit"))
        .header("content-type", "application/json")
        .body(format!(r#"{{"limit": "{limit}", "key": "{key}"}}"#))
        .send()
        .await?;
    Ok(res.status().as_u16())
}

/// Waits until `/readyz` on each of `bases` answers 200.
async fn ready(client: &reqwest::Client, bases: &[String]) {
    for base in bases {
        eventually(START, &format!("{base}/readyz"), async || {
            let r = client.get(format!("{base}/readyz")).send().await;
            r.is_ok_and(|r| r.status() == 200)
        })
        .await;
    }
}

/// The line of `/proc/PID/status` that starts with `field`, its values.
fn status_field(proc: &Path, field: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(proc.join("status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    line.split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_serves_as_a_non_root_user_on_a_read_only_root_and_decides_over_http_and_grpc() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(image) = image() else { return };

    // What the image says of itself.
    let config: Value = serde_json::from_str(&podman_output(&[
        "image",
        "inspect",
        "--format",
        "{{json .Config}}",
        image,
    ]))
    .unwrap();
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert_eq!(config["StopSignal"], "SIGTERM", "{config}");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/sluice"])
    );
    assert_eq!(config["Cmd"], serde_json::json!(["serve"]));
    for port in ["8080/tcp", "8081/tcp"] {
        assert!(config["ExposedPorts"].get(port).is_some(), "{config}");
    }
    let env: Vec<&str> = config["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for set in [
        "SLUICE_HTTP=0.0.0.0:8080",
        "SLUICE_GRPC=0.0.0.0:8081",
        "SLUICE_POLICY=/etc/sluice/policy.yaml",
    ] {
        assert!(env.contains(&set), "{set} not in {env:?}");
    }
    let labels = &config["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap();
    assert!(
        revision.len() >= 40 && revision.chars().take(40).all(|c| c.is_ascii_hexdigit()),
        "{labels}"
    );
    assert!(
        labels["org.opencontainers.image.source"]
            .as_str()
            .is_some_and(|s| s.contains("://")),
        "{labels}"
    );

    // What it holds: the binary, its libraries, the certificates, the
    // policy; no shell.
    let [created] = &Container::start_all(image, &[(vec![], vec!["--version".into()])])[..] else {
        unreachable!()
    };
    let files = {
        let mut export = support::podman::podman()
            .args(["export", &created.name])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let listed = std::process::Command::new("tar")
            .arg("-t")
            .stdin(export.stdout.take().unwrap())
            .output()
            .unwrap();
        assert!(export.wait().unwrap().success() && listed.status.success());
        String::from_utf8(listed.stdout).unwrap()
    };
    for needed in [
        "usr/local/bin/sluice",
        "etc/sluice/policy.yaml",
        "etc/ssl/certs/ca-certificates.crt",
        "etc/passwd",
    ] {
        assert!(
            files.lines().any(|f| f.trim_start_matches("./") == needed),
            "{needed} missing: {files}"
        );
    }
    let shells: Vec<&str> = files
        .lines()
        .filter(|f| {
            ["sh", "bash", "dash", "busybox"]
                .iter()
                .any(|s| f.ends_with(&format!("/{s}")))
        })
        .collect();
    assert!(shells.is_empty(), "{shells:?}");

    // Run as a user would: the image's user and defaults, the ports
    // published on loopback, the bundled example policy.
    let (http, grpc) = (free_port(), free_port());
    let publish = vec![
        "--publish".into(),
        format!("127.0.0.1:{http}:8080"),
        "--publish".into(),
        format!("127.0.0.1:{grpc}:8081"),
    ];
    let [server] = &Container::start_all(image, &[(publish, vec![])])[..] else {
        unreachable!()
    };
    let base = format!("http://127.0.0.1:{http}");
    let client = reqwest::Client::new();
    ready(&client, std::slice::from_ref(&base)).await;

    let proc = server.proc();
    for field in ["Uid:", "Gid:"] {
        assert_eq!(status_field(&proc, field), [65532; 4], "{field}");
    }
    assert_eq!(
        std::fs::read_to_string(proc.join("status"))
            .unwrap()
            .lines()
            .find(|l| l.starts_with("CapEff:")),
        Some("CapEff:\t0000000000000000")
    );
    let mounts = std::fs::read_to_string(proc.join("mountinfo")).unwrap();
    let root = mounts
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f[4] == "/")
        .unwrap();
    assert!(
        root[5].split(',').any(|o| o == "ro"),
        "/ mounted {}",
        root[5]
    );
    assert_eq!(server.inspect("{{.HostConfig.ReadonlyRootfs}}"), "true");

    // Decisions over HTTP: the example's sendMessage has a burst of 20.
    for _ in 0..20 {
        assert_eq!(
            limit(&client, &base, "sendMessage", "u1").await.unwrap(),
            200
        );
    }
    assert_eq!(
        limit(&client, &base, "sendMessage", "u1").await.unwrap(),
        429
    );

    // And over gRPC, as Envoy asks: the edge rule allows a burst of 200.
    let envoy = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();
    let request = |hits: u32| RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: "192.0.2.7".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: hits,
    };
    let code = |hits| {
        let mut envoy = envoy.clone();
        async move {
            envoy
                .should_rate_limit(request(hits))
                .await
                .unwrap()
                .into_inner()
                .overall_code
        }
    };
    // 1 = OK, 2 = OVER_LIMIT.
    assert_eq!(code(200).await, 1);
    assert_eq!(code(1).await, 2);
}

/// A container is configured through its environment, so every flag of
/// the servers it runs must have a `SLUICE_*` variable.
#[test]
fn every_flag_of_serve_and_proxy_has_a_sluice_variable() {
    for command in ["serve", "proxy"] {
        let help = support::sluice()
            .args([command, "--help"])
            .stdout(std::process::Stdio::piped())
            .output()
            .unwrap();
        let help = String::from_utf8(help.stdout).unwrap();
        // Each option's block: its line, then its description up to the next.
        let mut blocks: Vec<String> = Vec::new();
        for line in help.lines() {
            if line.trim_start().starts_with('-') {
                blocks.push(String::new());
            }
            if let Some(block) = blocks.last_mut() {
                block.push_str(line);
            }
        }
        let flags: Vec<&String> = blocks.iter().filter(|b| !b.contains("--help")).collect();
        assert!(flags.len() >= 10, "{command}: {help}");
        for flag in flags {
            assert!(flag.contains("[env: SLUICE_"), "{command}: {flag}");
        }
    }
}

/// The longest time during which none of `seen`'s calls was on its way:
/// when no server could have been deciding any.
fn longest_idle(seen: &[Seen]) -> Duration {
    let mut calls: Vec<&Seen> = seen.iter().collect();
    calls.sort_by_key(|s| s.sent);
    let mut longest = Duration::ZERO;
    let mut busy_until = calls.first().map(|s| s.answered);
    for call in calls {
        if let Some(until) = busy_until {
            longest = longest.max(call.sent.saturating_duration_since(until));
            busy_until = Some(until.max(call.answered));
        }
    }
    longest
}

/// Where one container listens, on the host's network: each its own
/// loopback ports, set through the variables the image reads.
struct Listening {
    http: SocketAddr,
    grpc: SocketAddr,
}

impl Listening {
    fn new() -> Listening {
        let addr = || SocketAddr::from(([127, 0, 0, 1], free_port()));
        Listening {
            http: addr(),
            grpc: addr(),
        }
    }

    fn base(&self) -> String {
        format!("http://{}", self.http)
    }
}

/// A directory laid out as the kubelet mounts a ConfigMap:
/// `policy.yaml -> ..data/policy.yaml`, `..data -> ..<version>`; an update
/// writes a new version and swaps `..data` by renaming a fresh symlink
/// over it. Readable by the container's user, as the kubelet's are.
struct ConfigMap {
    dir: tempfile::TempDir,
    versions: usize,
}

impl ConfigMap {
    fn new(policy: &str) -> ConfigMap {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut map = ConfigMap { dir, versions: 0 };
        map.update(policy);
        std::os::unix::fs::symlink("..data/policy.yaml", map.path().join("policy.yaml")).unwrap();
        map
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn update(&mut self, policy: &str) {
        use std::os::unix::fs::PermissionsExt;
        self.versions += 1;
        let version = format!("..2026_01_01_00_00_0{}.000000001", self.versions);
        let dir = self.path().join(&version);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("policy.yaml"), policy).unwrap();
        std::fs::set_permissions(
            dir.join("policy.yaml"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        std::os::unix::fs::symlink(&version, self.path().join("..data_tmp")).unwrap();
        std::fs::rename(self.path().join("..data_tmp"), self.path().join("..data")).unwrap();
    }
}

/// How one caller's calls in the stop phase went.
#[derive(Default)]
struct Tally {
    answered: usize,
    /// Calls a stopped container refused, sent again to the next one.
    refused: usize,
    /// What went wrong, with the container and when.
    failed: Vec<(Instant, String)>,
}

/// One call as a load balancer makes it: to `bases[first]`, and on to the
/// next when a container refuses the connection.
async fn balanced(
    client: &reqwest::Client,
    bases: &[String],
    first: usize,
    key: &str,
    tally: &mut Tally,
) {
    for attempt in 0..bases.len() {
        let at = (first + attempt) % bases.len();
        match limit(client, &bases[at], "shared", key).await {
            Ok(200 | 429) => {
                tally.answered += 1;
                return;
            }
            Ok(status) => {
                tally
                    .failed
                    .push((Instant::now(), format!("container {at}: status {status}")));
                return;
            }
            Err(e) if e.is_connect() => tally.refused += 1,
            Err(e) => {
                tally
                    .failed
                    .push((Instant::now(), format!("container {at}: {e:?}")));
                return;
            }
        }
    }
    tally
        .failed
        .push((Instant::now(), "every container refused".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_containers_on_one_redis_hold_one_exact_limit_stop_gracefully_under_load_and_reload_a_swapped_configmap()
 {
    const RATE: f64 = 50.0;
    const BURST: f64 = 20.0;
    const HAMMER: Duration = Duration::from_secs(5);
    const CALLERS_PER_CONTAINER: usize = 3;
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(image) = image() else { return };

    let redis = redis::RedisServer::start();
    let policy = format!(
        "limits:\n  shared:\n    algorithm: token_bucket\n    \
         algorithm_config: {{rps: {RATE}, burst: {BURST}}}\n"
    );
    let mut config_map = ConfigMap::new(&policy);
    let listening: Vec<Listening> = (0..3).map(|_| Listening::new()).collect();
    let runs: Vec<_> = listening
        .iter()
        .map(|l| {
            let flags = vec![
                "--network=host".into(),
                format!("--volume={}:/etc/sluice:ro", config_map.path().display()),
                format!("--env=SLUICE_HTTP={}", l.http),
                format!("--env=SLUICE_GRPC={}", l.grpc),
                format!("--env=SLUICE_STORE={}", redis.url()),
                // The default 50 ms, on a machine this busy, would fail
                // open now and then and admit past the bound.
                "--env=SLUICE_STORE_TIMEOUT=2s".into(),
                // Time for the stop phase's slow request, with room.
                "--env=SLUICE_SHUTDOWN_TIMEOUT=20s".into(),
            ];
            (flags, vec![])
        })
        .collect();
    let containers = Container::start_all(image, &runs);
    let bases: Vec<String> = listening.iter().map(Listening::base).collect();
    let client = reqwest::Client::new();
    ready(&client, &bases).await;

    // One key, hammered through all three for HAMMER.
    let until = Instant::now() + HAMMER;
    let seen = hammer(
        &client,
        &bases,
        CALLERS_PER_CONTAINER,
        r#"{"limit": "shared", "key": "one-key"}"#,
        until,
    )
    .await;
    let admitted: Vec<&Seen> = seen.iter().filter(|s| s.allowed).collect();
    // Every admission was decided between the first one's sending and the
    // last one's answer: a bucket that starts full admits at most its
    // burst and the rate over that span.
    let span = admitted.iter().map(|s| s.answered).max().unwrap()
        - admitted.iter().map(|s| s.sent).min().unwrap();
    let bound = BURST + RATE * span.as_secs_f64();
    let most = most_in_one_period(&seen, Duration::from_secs(1));
    eprintln!(
        "{} calls through 3 containers; {} admitted over {span:?}, of a bound of {bound:.1} \
         ({:.2}%); at most {most} proven within one second",
        seen.len(),
        admitted.len(),
        admitted.len() as f64 * 100.0 / bound
    );
    assert!(
        admitted.len() as f64 <= bound,
        "{} admitted",
        admitted.len()
    );
    // The bucket gives the bound only to callers that keep asking: one
    // that no call reached for longer than its burst takes to refill
    // (0.4 s) was full, and lost what came meanwhile.
    assert!(
        admitted.len() as f64 >= bound * 0.98,
        "{} admitted; no call was waiting for {:?} at once",
        admitted.len(),
        longest_idle(&seen)
    );
    assert!(most as f64 <= BURST + RATE, "{most} within one second");

    // SIGTERM to the first container under load. A request already in
    // flight there, its body half sent, must still be answered; callers
    // whose connection it refuses go on to the next container.
    let mut in_flight = tokio::net::TcpStream::connect(listening[0].http)
        .await
        .unwrap();
    let body = br#"{"limit": "shared", "key": "in-flight"}"#;
    let (head, rest) = body.split_at(body.len() / 2);
    in_flight
        .write_all(
            format!(
                "POST /v1/limit HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\n\
                 connection: close\r\ncontent-length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    in_flight.write_all(head).await.unwrap();

    // A connection for each call, asked with `connection: close`: without
    // it the client hands a connection that has just answered to a call
    // still waiting for its own to connect, and on a kept-alive connection
    // a call can cross the server's close of it whatever the server does
    // (from the stop on it answers `connection: close`, but the next call
    // may be on its way). What this checks is that every connection the
    // server let a client establish is answered.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .default_headers(
            [(
                reqwest::header::CONNECTION,
                reqwest::header::HeaderValue::from_static("close"),
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..3 * CALLERS_PER_CONTAINER)
        .map(|i| {
            let (client, bases, stop, answers) =
                (client.clone(), bases.clone(), stop.clone(), answers.clone());
            tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut next = i;
                while !stop.load(Ordering::Relaxed) {
                    balanced(&client, &bases, next, &format!("caller-{i}"), &mut tally).await;
                    answers.fetch_add(1, Ordering::Relaxed);
                    next += 1;
                }
                tally
            })
        })
        .collect();
    let answered_by = async |n: usize| {
        let from = answers.load(Ordering::Relaxed);
        eventually(PATIENCE, "calls answered", async || {
            answers.load(Ordering::Relaxed) >= from + n
        })
        .await;
    };
    answered_by(50).await;
    let stopping = &containers[0];
    let terminated = Instant::now();
    podman_output(&["kill", "--signal", "TERM", &stopping.name]);
    // Stopped accepting: the listener is closed.
    eventually(PATIENCE, "the stopped container to refuse", async || {
        tokio::net::TcpStream::connect(listening[0].http)
            .await
            .is_err()
    })
    .await;
    in_flight.write_all(rest).await.unwrap();
    let mut answer = String::new();
    in_flight.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Go on until the other two have answered plenty more.
    answered_by(100).await;
    stop.store(true, Ordering::Relaxed);
    let mut tally = Tally::default();
    for caller in callers {
        let t = caller.await.unwrap();
        tally.answered += t.answered;
        tally.refused += t.refused;
        tally.failed.extend(t.failed);
    }
    let exit = podman_output(&["wait", &stopping.name]);
    eprintln!(
        "stop under load: {} calls answered, {} refused and sent on to another container, {} \
         failed; the stopped container exited with {}",
        tally.answered,
        tally.refused,
        tally.failed.len(),
        exit.trim()
    );
    let failed: Vec<String> = tally
        .failed
        .iter()
        .map(|(at, what)| {
            let since = at.saturating_duration_since(terminated);
            format!("{since:?} after the SIGTERM, {what}")
        })
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(tally.refused > 0, "no call reached the stopped container");
    assert_eq!(exit.trim(), "0");

    // A ConfigMap update, seen through the mount by the two left.
    for base in &bases[1..] {
        assert_eq!(limit(&client, base, "swapped", "k").await.unwrap(), 404);
    }
    config_map.update(&format!(
        "{policy}  swapped:\n    algorithm: token_bucket\n    \
         algorithm_config: {{rps: 1, burst: 1}}\n"
    ));
    for base in &bases[1..] {
        eventually(Duration::from_secs(10), "the swapped policy", async || {
            limit(&client, base, "swapped", "k").await.unwrap() == 200
        })
        .await;
    }
}
