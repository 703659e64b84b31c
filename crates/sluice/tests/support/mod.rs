//! What the binary's tests share: a child process that cannot outlive its
//! test, the `sluice` command, free ports, policy files, and polling with a
//! deadline instead of sleeping. The submodules hold the setup of one test
//! file each: `serve`, `proxy` and `upstream`, `connections`; `measure`
//! counts admissions for the load tests on a shared store, `podman` runs
//! the image.

// Each test crate uses its own subset.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub(crate) mod connections;
pub(crate) mod measure;
pub(crate) mod podman;
pub(crate) mod proxy;
pub(crate) mod serve;
pub(crate) mod upstream;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The longest any test waits for something that should be prompt. Far
/// above what the binary needs, as a loaded machine stalls at times.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// A child process, killed and reaped when dropped, however the test ends.
pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    /// Sends SIGTERM and waits, up to `within`, for a clean exit; a failure
    /// shows what the process wrote to its stderr.
    #[cfg(unix)]
    pub(crate) async fn terminate(&mut self, within: Duration) {
        // Opened while the process lives: its stderr is an unnamed file
        // (see `sluice_through`), reachable only through the process.
        let log = std::fs::File::open(format!("/proc/{}/fd/2", self.0.id())).ok();
        signal(self, "TERM");
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "the process ignored SIGTERM");
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        assert!(status.success(), "{status:?}; it wrote:\n{}", written(log));
    }
}

/// What a process wrote to `log`, its stderr, from the start.
fn written(log: Option<std::fs::File>) -> String {
    use std::io::{Read, Seek};
    let mut text = String::new();
    if let Some(mut file) = log {
        let _ = file.rewind();
        let _ = file.read_to_string(&mut text);
    }
    text
}

/// Sends the signal `name` (`HUP`, `TERM`…) to `process`.
#[cfg(unix)]
pub(crate) fn signal(process: &Process, name: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &process.0.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// The `sluice` binary as the tests run it: logging warnings only, its
/// output discarded and its stderr kept in an unnamed temporary file, for
/// [`Process::terminate`] to show when the process fails.
pub(crate) fn sluice() -> Command {
    sluice_through(&[])
}

/// [`sluice`] run through `wrapper`, a command that runs the rest of its
/// line (such as `prlimit --nofile=… --`); an empty wrapper runs it directly.
pub(crate) fn sluice_through(wrapper: &[String]) -> Command {
    let mut command = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(env!("CARGO_BIN_EXE_sluice"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_sluice")),
    };
    command
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(tempfile::tempfile().map_or_else(|_| Stdio::null(), Stdio::from));
    command
}

/// `text` written as `policy.yaml` in a fresh directory, which lives as
/// long as the returned handle; and the file's path.
pub(crate) fn policy_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// Starts the `sluice` binary with `args`, as [`sluice`] runs it.
pub(crate) fn spawn_sluice<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
) -> Process {
    Process(sluice().args(args).spawn().unwrap())
}

/// A loopback port that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The arguments of `sluice serve` with the policy at `policy`, listening
/// on two free loopback ports; and those addresses, HTTP then gRPC.
pub(crate) fn serve_args(
    policy: &Path,
) -> (
    Vec<std::ffi::OsString>,
    std::net::SocketAddr,
    std::net::SocketAddr,
) {
    let addr = || std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let (http, grpc) = (addr(), addr());
    let args = [
        "serve".into(),
        "--http".into(),
        http.to_string().into(),
        "--grpc".into(),
        grpc.to_string().into(),
        "--policy".into(),
        policy.as_os_str().to_owned(),
    ];
    (args.into(), http, grpc)
}

/// Polls `check` until it holds, failing the test after `within`.
pub(crate) async fn eventually(within: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The body of a GET, as JSON; the request must succeed.
#[allow(dead_code)]
pub(crate) async fn get_json(
    client: &reqwest::Client,
    url: impl reqwest::IntoUrl,
) -> serde_json::Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

/// The body of a GET, as text; the request must succeed.
pub(crate) async fn get_text(client: &reqwest::Client, url: &str) -> String {
    client.get(url).send().await.unwrap().text().await.unwrap()
}

/// A metric's value in a Prometheus exposition, if present.
pub(crate) fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}
