//! The proxy under test: `sluice proxy` in process on a port-0 listener,
//! or as the real binary; the policies the tests give it; and a raw
//! HTTP/1.1 client for headers a client library would not send as written.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::MemoryStore;
use sluice_http::Enforcer;
use sluice_policy::Policy;
use sluice_server::listen::{Limits, Listener};
use sluice_server::proxy::{Upstream, proxy};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::upstream::{Seen, start_upstream};
use super::{PATIENCE, Process, eventually, free_port, sluice};

/// Three requests per client address, refilling too slowly to matter
/// within a test.
pub(crate) const THREE: &str = "
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 3600, burst: 3}
";

/// Enough for every test that is not about limits.
pub(crate) const GENEROUS: &str = "
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rate: 1000, period: 1, burst: 1000}
";

/// A proxy running in process, stopped by sending on `stop`.
pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    pub(crate) stop: Option<oneshot::Sender<()>>,
    pub(crate) task: JoinHandle<()>,
}

impl Proxy {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// A proxy in process to `upstream`, a URL, with `timeout` for its answers.
pub(crate) async fn start_proxy(policy: &str, upstream: &str, timeout: Duration) -> Proxy {
    let upstream = Upstream::parse(upstream).unwrap().with_timeout(timeout);
    start_proxy_to(policy, upstream).await
}

/// A proxy in process to `upstream`.
pub(crate) async fn start_proxy_to(policy: &str, upstream: Upstream) -> Proxy {
    let policy = Policy::from_str(policy, "policy.yaml").unwrap();
    let enforcer = Arc::new(Enforcer::new(policy, MemoryStore::new()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = Listener::new(listener, "proxy", &Limits::default());
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(proxy(listener, enforcer, upstream, async move {
        let _ = rx.await;
    }));
    Proxy {
        addr,
        stop: Some(tx),
        task,
    }
}

/// An upstream and a proxy in front of it.
pub(crate) async fn pair(policy: &str) -> (Proxy, Arc<Seen>) {
    let (up, seen) = start_upstream().await;
    let proxy = start_proxy(policy, &format!("http://{up}"), PATIENCE).await;
    (proxy, seen)
}

/// The value of the header `name`, which the response must have.
pub(crate) fn header<'a>(res: &'a reqwest::Response, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", res.headers()))
        .to_str()
        .unwrap()
}

/// Deterministic bytes that are not a repeating pattern a broken proxy
/// could reproduce by accident.
pub(crate) fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A client connection that speaks HTTP/1.1 byte by byte.
pub(crate) struct Raw(pub(crate) BufReader<TcpStream>);

impl Raw {
    pub(crate) async fn connect(addr: SocketAddr) -> Raw {
        Raw(BufReader::new(TcpStream::connect(addr).await.unwrap()))
    }

    pub(crate) async fn send(&mut self, bytes: &[u8]) {
        self.0.get_mut().write_all(bytes).await.unwrap();
    }

    /// One response with a `Content-Length` body: status, lower-cased
    /// headers, body.
    pub(crate) async fn response(&mut self) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let (status, headers) = self.head().await;
        let len: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map(|(_, v)| v.parse().unwrap())
            .expect("a content-length");
        let mut body = vec![0; len];
        self.0.read_exact(&mut body).await.unwrap();
        (status, headers, body)
    }

    /// A response's status line and lower-cased headers.
    pub(crate) async fn head(&mut self) -> (u16, Vec<(String, String)>) {
        let mut line = String::new();
        self.0.read_line(&mut line).await.unwrap();
        let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.0.read_line(&mut line).await.unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (n, v) = l.split_once(':').unwrap();
            headers.push((n.to_ascii_lowercase(), v.trim().to_owned()));
        }
        (status, headers)
    }
}

/// Starts the `sluice proxy` binary in front of `upstream` with the policy
/// at `policy` and the environment `env`, on free loopback ports, and waits
/// until it is up (its admin listener, bound after the proxy's, answers).
/// Returns the process, the proxy's address and the admin address.
pub(crate) async fn spawn_proxy(
    upstream: SocketAddr,
    policy: &Path,
    env: &[(&str, &str)],
) -> (Process, SocketAddr, SocketAddr) {
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut command = sluice();
    command
        .args(["proxy", "--upstream", &format!("http://{upstream}")])
        .args(["--listen", &listen.to_string()])
        .args(["--admin", &admin.to_string()])
        .arg("--policy")
        .arg(policy);
    for (k, v) in env {
        command.env(k, v);
    }
    let process = Process(command.spawn().unwrap());
    let client = reqwest::Client::new();
    let healthz = format!("http://{admin}/healthz");
    eventually(PATIENCE, "the proxy to start", async || {
        let r = client.get(&healthz).send().await;
        r.is_ok_and(|r| r.status() == 200)
    })
    .await;
    (process, listen, admin)
}
