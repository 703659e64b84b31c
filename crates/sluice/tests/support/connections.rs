//! The connection tests' setup: `sluice serve` started with a policy of
//! its own, raw HTTP/1.1 over fresh connections, clients that stall, and
//! readings of a process's memory and open files.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{PATIENCE, Process, eventually, policy_file, serve_args, sluice_through};

/// A call whose body starts, in chunks, and never ends.
pub(crate) const STALLED_CALL: &[u8] = b"POST /v1/limit HTTP/1.1\r\nhost: sluice\r\n\
content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
10\r\n{\"limit\": \"send\"\r\n";

/// A named limit for HTTP calls and a rule for gRPC calls, both roomy.
const POLICY: &str = "
limits:
  send:
    algorithm: token_bucket
    algorithm_config: {rate: 10, period: 60, burst: 10}
rules:
  - name: per-client
    domain: edge
    limit_keys: [\"descriptor:client\"]
    algorithm: token_bucket
    algorithm_config: {rps: 100, burst: 100}
";

/// A running `sluice serve` on free ports.
pub(crate) struct Serve {
    pub(crate) process: Process,
    pub(crate) http: SocketAddr,
    pub(crate) grpc: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Serve {
    /// Starts `sluice serve` with `args` and `env`, through `wrapper` (a
    /// command that runs the rest of its line) if given, and waits until it
    /// answers.
    pub(crate) async fn start(wrapper: &[String], args: &[&str], env: &[(&str, &str)]) -> Serve {
        let (dir, policy) = policy_file(POLICY);
        let (serve, http, grpc) = serve_args(&policy);
        let mut command = sluice_through(wrapper);
        command.args(serve).args(args);
        for (k, v) in env {
            command.env(k, v);
        }
        let serve = Serve {
            process: Process(command.spawn().unwrap()),
            http,
            grpc,
            _dir: dir,
        };
        eventually(PATIENCE, "the server to start", async || {
            get(serve.http, "/healthz")
                .await
                .is_some_and(|r| r.status == 200)
        })
        .await;
        serve
    }

    pub(crate) fn pid(&self) -> u32 {
        self.process.0.id()
    }

    pub(crate) async fn metrics(&self) -> String {
        get(self.http, "/metrics")
            .await
            .expect("/metrics answers")
            .body
    }
}

/// A response read off a raw connection.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: String,
}

/// Parses a whole HTTP/1.1 response that ended with its connection.
pub(crate) fn parse(raw: &[u8]) -> Option<Answer> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some(Answer {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    })
}

/// GETs `path` over a new connection, as a health probe does; `None` if
/// there is no whole answer within [`PATIENCE`].
pub(crate) async fn get(addr: SocketAddr, path: &str) -> Option<Answer> {
    let exchange = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nhost: sluice\r\nconnection: close\r\n\r\n");
        s.write_all(request.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        parse(&raw)
    };
    tokio::time::timeout(PATIENCE, exchange)
        .await
        .ok()
        .flatten()
}

/// A process's resident memory, in bytes.
pub(crate) fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// How many files a process has open.
pub(crate) fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Bytes in MiB, for reports.
pub(crate) fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Whether the server closed `stream`: a read ends at once, with an end of
/// file or a reset, instead of waiting for data that never comes.
pub(crate) async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0; 256];
    loop {
        match tokio::time::timeout(PATIENCE, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            // A response before the close (the 408 of a stalled body).
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// Opens `n` connections that each send `bytes` and then nothing, a
/// batch at a time so that connects overlap.
pub(crate) async fn stall(addr: SocketAddr, n: usize, bytes: &'static [u8]) -> Vec<TcpStream> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        set.spawn(async move {
            let mut s = TcpStream::connect(addr).await?;
            s.write_all(bytes).await?;
            Ok::<_, std::io::Error>(s)
        });
    }
    let mut open = Vec::with_capacity(n);
    while let Some(s) = set.join_next().await {
        open.push(s.unwrap().expect("a stalled client connects"));
    }
    open
}

/// How many files this process may still open for stalled clients, after
/// raising its limit as far as it may.
pub(crate) fn file_budget(wanted: usize) -> usize {
    use rlimit::Resource;
    let spare = 512;
    let (soft, hard) = Resource::NOFILE.get().unwrap();
    let want = (wanted + spare) as u64;
    if Resource::NOFILE.set(want.max(soft), want.max(hard)).is_ok() {
        return wanted;
    }
    let raised = rlimit::increase_nofile_limit(want).unwrap_or(soft);
    usize::try_from(raised).unwrap().saturating_sub(spare)
}
