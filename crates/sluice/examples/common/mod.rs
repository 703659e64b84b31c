//! What the examples that run `sluice serve` processes on a real
//! `redis-server` share: starting them, waiting for them, stopping them,
//! and the percentiles of what they answered.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A child process, killed when dropped.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn start_redis(port: u16, dir: &Path) -> anyhow::Result<Proc> {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("redis-server must be installed")?;
    let proc = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let mut buf = [0u8; 7];
            if s.write_all(b"PING\r\n").is_ok()
                && s.read_exact(&mut buf).is_ok()
                && &buf == b"+PONG\r\n"
            {
                return Ok(proc);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("redis-server did not answer on port {port}")
}

/// Starts `sluice serve` on `policy` with its log in `dir`, and returns it
/// with the base URL of its HTTP API once `/readyz` answers 200.
pub(crate) async fn start_serve(
    sluice: &Path,
    policy: &Path,
    dir: &Path,
    name: &str,
    client: &reqwest::Client,
) -> anyhow::Result<(Proc, String)> {
    let (http, grpc) = (free_port(), free_port());
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let child = Command::new(sluice)
        .args(["serve", "--http", &format!("127.0.0.1:{http}")])
        .args(["--grpc", &format!("127.0.0.1:{grpc}"), "--policy"])
        .arg(policy)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot run {}", sluice.display()))?;
    let proc = Proc(child);
    let base = format!("http://127.0.0.1:{http}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ok = client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if ok {
            return Ok((proc, base));
        }
        if Instant::now() > deadline {
            bail!("{base} did not become ready");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `p` quantile of `sorted`, by nearest rank.
pub(crate) fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// `d` in milliseconds, to a tenth.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}
