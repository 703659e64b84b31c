//! What the binary's tests share: a child process that cannot outlive its
//! test, free ports, and polling with a deadline instead of sleeping.

// Each test crate uses its own subset.
#![allow(dead_code, clippy::unwrap_used, clippy::panic)]

use std::process::Child;
use std::time::{Duration, Instant};

/// A child process, killed and reaped when dropped, however the test ends.
pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    /// Sends SIGTERM and waits, up to `within`, for a clean exit.
    #[cfg(unix)]
    pub(crate) async fn terminate(&mut self, within: Duration) {
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "the process ignored SIGTERM");
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        assert!(status.success(), "{status:?}");
    }
}

/// Starts the `sluice` binary with `args`, its output discarded and its
/// log quiet but for warnings.
pub(crate) fn spawn_sluice<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
) -> Process {
    Process(
        std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
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
    policy: &std::path::Path,
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

/// The body of a GET, as text; the request must succeed.
pub(crate) async fn get_text(client: &reqwest::Client, url: &str) -> String {
    client.get(url).send().await.unwrap().text().await.unwrap()
}
