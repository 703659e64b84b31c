//! Files named on the command line or in a policy that are not regular
//! files: a FIFO, a socket, a device. Each command refuses one at once with
//! a clear message, and a running server whose policy becomes one keeps
//! serving, says why its reload failed, and still stops on time.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::serve::{POLICY, check_send_message, spawn_serve_with};
use support::{PATIENCE, eventually, free_port, sluice};

/// A FIFO at `dir/name`, made as a user would with `mkfifo`.
fn fifo(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success());
    path
}

/// Runs `sluice args` to its end, killing it if it runs past [`PATIENCE`]:
/// a command waiting on a FIFO would otherwise hang the test. Returns the
/// exit status, standard error and how long it ran.
fn run_within(args: &[&OsStr]) -> (std::process::ExitStatus, String, Duration) {
    let started = Instant::now();
    let mut child = sluice()
        .args(args)
        .env("RUST_LOG", "error")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`sluice {args:?}` was still running after {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let ran = started.elapsed();
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
        ran,
    )
}

#[cfg(unix)]
#[test]
fn validate_refuses_a_fifo_a_socket_and_devices_at_once_and_says_what_each_is() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = fifo(dir.path(), "policy.fifo");
    let socket = dir.path().join("policy.sock");
    let _listening = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    // A key file is read the same way as the policy.
    let key_pipe = fifo(dir.path(), "key.fifo");
    let with_key = dir.path().join("jwt.yaml");
    std::fs::write(
        &with_key,
        format!(
            "jwt:\n  keys:\n    - {{alg: RS256, pem_file: {}}}\n{POLICY}",
            key_pipe.display()
        ),
    )
    .unwrap();
    let cases = [
        (pipe.as_path(), "a FIFO (named pipe), not a regular file"),
        (socket.as_path(), "a socket, not a regular file"),
        (
            Path::new("/dev/zero"),
            "a character device, not a regular file",
        ),
        (
            Path::new("/dev/null"),
            "a character device, not a regular file",
        ),
        (
            with_key.as_path(),
            "a FIFO (named pipe), not a regular file",
        ),
    ];
    for (file, says) in cases {
        let (status, stderr, ran) = run_within(&[OsStr::new("validate"), file.as_os_str()]);
        assert!(!status.success(), "{}: {stderr}", file.display());
        assert!(
            stderr.contains(&format!("{}", file.display())) && stderr.contains(says),
            "{}: {stderr}",
            file.display()
        );
        eprintln!("validate {}: refused in {ran:?}", file.display());
    }
}

#[cfg(unix)]
#[test]
fn every_command_refuses_a_fifo_where_it_reads_a_policy_or_a_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = fifo(dir.path(), "input.fifo");
    let pipe = pipe.to_str().unwrap();
    let port = || format!("127.0.0.1:{}", free_port());
    let out = dir.path().join("out");
    let (http, grpc, listen) = (port(), port(), port());
    let commands: [&[&str]; 4] = [
        &["serve", "--policy", pipe, "--http", &http, "--grpc", &grpc],
        &[
            "proxy",
            "--policy",
            pipe,
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            &listen,
        ],
        &["replay", "--policy", pipe, "--events", "/dev/null"],
        &["simulate", "--file", pipe, "--out", out.to_str().unwrap()],
    ];
    for args in commands {
        let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        let (status, stderr, ran) = run_within(&args);
        assert!(!status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains("a FIFO (named pipe), not a regular file"),
            "{args:?}: {stderr}"
        );
        eprintln!("{:?}: refused in {ran:?}", args[0]);
    }
}

/// Kubernetes swaps a ConfigMap's files by renaming a symlink. Here the
/// policy's link is swapped first to a file that is not there, then to a
/// FIFO that nothing writes to. Reading the FIFO must not hold any thread
/// the server answers on, nor its stop; and what `/readyz` says must be the
/// second reason, not the first.
#[cfg(unix)]
#[tokio::test]
async fn a_server_whose_policy_goes_missing_then_becomes_a_fifo_answers_says_why_and_stops_on_time()
{
    const SHUTDOWN: Duration = Duration::from_secs(3);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("v1.yaml"), POLICY).unwrap();
    let policy = dir.path().join("policy.yaml");
    std::os::unix::fs::symlink("v1.yaml", &policy).unwrap();
    fifo(dir.path(), "v3.fifo");
    let swap = |to: &str| {
        std::os::unix::fs::symlink(to, dir.path().join("next")).unwrap();
        std::fs::rename(dir.path().join("next"), &policy).unwrap();
    };

    let (mut server, base, _) =
        spawn_serve_with(&policy, &["--shutdown-timeout", "3s"], &[], "/readyz").await;
    // A server that stopped answering fails the test instead of hanging it.
    let client = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let readyz = async || {
        let r = client.get(format!("{base}/readyz")).send().await.unwrap();
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        (
            status,
            body["detail"].as_str().unwrap_or_default().to_owned(),
        )
    };
    let reported = async |why: &str| {
        eventually(PATIENCE, why, async || {
            let (status, detail) = readyz().await;
            status == 503 && detail.contains(why)
        })
        .await;
    };

    swap("v2-missing.yaml");
    reported("No such file").await;
    swap("v3.fifo");
    reported("a FIFO (named pipe), not a regular file").await;
    // The FIFO has been looked at twice by now, and the server answers.
    let healthz = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(healthz.status(), 200);
    assert_eq!(check_send_message(&client, &base).await.status(), 200);

    server.terminate(SHUTDOWN).await;
}
