//! Real `redis-server` processes for integration tests: single servers and
//! small clusters on free loopback ports, each in its own temporary directory.

// Not every test crate uses every helper; `pub` marks the harness API even
// though the module is private to each test crate; helpers fail loudly.
#![allow(dead_code, unreachable_pub, clippy::panic)]

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long one server may take to answer PING after being spawned.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many fresh ports `start` tries when redis-server cannot bind one.
const START_ATTEMPTS: usize = 5;
/// How long a cluster may take to be created and report `cluster_state:ok`.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// The pause between readiness polls.
const POLL: Duration = Duration::from_millis(15);
/// Connect timeout of [`command`].
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Read and write timeout of [`command`].
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// The name of each server's log file inside its temporary directory.
const LOG_FILE: &str = "redis.log";

/// Returns a loopback port that was free a moment ago (bind port 0, read it,
/// release it). Another process may take it before it is used again.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to find a free port: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read the port bound on 127.0.0.1:0: {e}"))
        .port()
}

/// Sends one command as a RESP array to `127.0.0.1:port` on a fresh
/// connection and returns the whole raw reply (e.g. `"+PONG\r\n"`, or
/// `"$5\r\nhello\r\n"`). Error replies (`-ERR ...`) are returned as text, not
/// as `Err`. Connecting, reading and writing all time out, so it never hangs.
pub fn command(port: u16, args: &[&str]) -> io::Result<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.set_nodelay(true)?;

    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request)?;

    let mut reader = BufReader::new(stream);
    let mut reply = Vec::new();
    read_reply(&mut reader, &mut reply)?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Reads one complete RESP2 reply, appending its raw bytes to `out`.
fn read_reply(reader: &mut impl BufRead, out: &mut Vec<u8>) -> io::Result<()> {
    let start = out.len();
    if reader.read_until(b'\n', out)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a reply",
        ));
    }
    let line = &out[start..];
    let kind = line[0];
    let length = || -> io::Result<i64> {
        std::str::from_utf8(&line[1..])
            .ok()
            .and_then(|s| s.trim_end().parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad RESP length line {:?}", String::from_utf8_lossy(line)),
                )
            })
    };
    match kind {
        b'+' | b'-' | b':' => Ok(()),
        b'$' => {
            let n = length()?;
            if n >= 0 {
                // The payload and its trailing CRLF.
                let len = usize::try_from(n).unwrap_or(0) + 2;
                let mut payload = vec![0; len];
                reader.read_exact(&mut payload)?;
                out.extend_from_slice(&payload);
            }
            Ok(())
        }
        b'*' => {
            for _ in 0..length()?.max(0) {
                read_reply(reader, out)?;
            }
            Ok(())
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected RESP reply {:?}", String::from_utf8_lossy(line)),
        )),
    }
}

/// True when the server on `port` answers PING with PONG.
pub fn pings(port: u16) -> bool {
    command(port, &["PING"]).is_ok_and(|reply| reply.starts_with("+PONG"))
}

/// Spawns `program`, panicking with a pointer to `scripts/test` when it is not
/// installed.
fn spawn(command: &mut Command, program: &str) -> Child {
    command.spawn().unwrap_or_else(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            panic!(
                "`{program}` is not on PATH; run `scripts/test`, which installs redis-server \
                 (and redis-cli), or install it yourself"
            )
        }
        panic!("cannot spawn `{program}`: {e}")
    })
}

/// Kills a child (SIGKILL) and reaps it, ignoring an already-exited child.
fn kill_and_wait(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// What became of a freshly spawned server.
enum Startup {
    /// It answers PING, and it is our process that answers.
    Ready,
    /// It exited, most likely because it could not bind its port.
    Exited,
    /// Another process answers on the port, so ours cannot have bound it.
    PortTaken,
    /// The deadline passed with the process alive but not answering.
    TimedOut,
}

/// Polls until the server `child` on `port` answers PING, exits or the
/// deadline passes.
fn wait_ready(child: &mut Child, port: u16, deadline: Instant) -> Startup {
    loop {
        if !matches!(child.try_wait(), Ok(None)) {
            return Startup::Exited;
        }
        if pings(port) {
            // Make sure the PONG came from our process and not from another
            // server that won the race for this port.
            let info = command(port, &["INFO", "server"]).unwrap_or_default();
            let ours = format!("process_id:{}\r\n", child.id());
            if info.contains(&ours) {
                return Startup::Ready;
            }
            if info.contains("process_id:") {
                return Startup::PortTaken;
            }
            // No INFO yet (e.g. still loading): poll again.
        }
        if Instant::now() >= deadline {
            return Startup::TimedOut;
        }
        thread::sleep(POLL);
    }
}

/// A `redis-server` child process listening on a free `127.0.0.1` port, with
/// its own temporary directory, no persistence, and its output in a log file
/// there. Dropping it kills the process.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    /// Panics, with the server log, if it cannot within about 10 seconds.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Like [`RedisServer::start`], with extra `redis-server` arguments
    /// appended (e.g. `&["--maxmemory", "10mb"]`).
    pub fn start_with(args: &[&str]) -> RedisServer {
        RedisServer::launch(args, false)
    }

    /// Starts a server in cluster mode (not yet part of any cluster), with its
    /// cluster bus on a second free port, and `extra` arguments.
    pub fn start_cluster_node_with(extra: &[&str]) -> RedisServer {
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        args.extend_from_slice(extra);
        RedisServer::launch(&args, true)
    }

    /// Spawns until a server is up, with a new port (and directory) whenever
    /// redis-server exits early because another process took its port.
    fn launch(extra: &[&str], cluster_bus: bool) -> RedisServer {
        let mut last_log = String::new();
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::Builder::new()
                .prefix("sluice-redis-")
                .tempdir()
                .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
            let port = free_port();
            let mut args = vec![
                "--port".to_owned(),
                port.to_string(),
                "--bind".to_owned(),
                "127.0.0.1".to_owned(),
                "--dir".to_owned(),
                dir.path().display().to_string(),
                "--save".to_owned(),
                String::new(),
                "--appendonly".to_owned(),
                "no".to_owned(),
                "--daemonize".to_owned(),
                "no".to_owned(),
            ];
            if cluster_bus {
                // The default bus port, port + 10000, may not exist or be free.
                let bus = loop {
                    let bus = free_port();
                    if bus != port {
                        break bus;
                    }
                };
                args.extend(["--cluster-port".to_owned(), bus.to_string()]);
            }
            args.extend(extra.iter().map(|&a| a.to_owned()));

            let mut server = RedisServer {
                child: None,
                port,
                args,
                dir,
            };
            let mut child = server.spawn();
            match wait_ready(&mut child, port, Instant::now() + START_TIMEOUT) {
                Startup::Ready => {
                    server.child = Some(child);
                    return server;
                }
                Startup::Exited | Startup::PortTaken => {
                    kill_and_wait(&mut child);
                    last_log = server.log();
                }
                Startup::TimedOut => {
                    kill_and_wait(&mut child);
                    panic!(
                        "redis-server on port {port} did not answer PING within {START_TIMEOUT:?}; \
                         its log:\n{}",
                        server.log()
                    );
                }
            }
        }
        panic!(
            "redis-server could not start in {START_ATTEMPTS} attempts on fresh ports (it \
             exited, or another process held its port); the last log:\n{last_log}"
        )
    }

    /// Spawns redis-server with this server's arguments, appending its output
    /// to the log file.
    fn spawn(&self) -> Child {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.log_path().display()));
        let stderr = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone a log file handle: {e}"));
        spawn(
            Command::new("redis-server")
                .args(&self.args)
                .current_dir(self.dir.path())
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(stderr),
            "redis-server",
        )
    }

    /// The port the server listens on (the same after [`RedisServer::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connection URL, `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's temporary working directory (`--dir`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The path of the server's log file (its stdout and stderr).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// Everything the server has logged so far, across restarts.
    pub fn log(&self) -> String {
        let mut text = String::new();
        match File::open(self.log_path()) {
            Ok(mut file) => {
                let mut bytes = Vec::new();
                let _ = file.read_to_end(&mut bytes);
                text.push_str(&String::from_utf8_lossy(&bytes));
            }
            Err(e) => text.push_str(&format!("<no log: {e}>")),
        }
        text
    }

    /// True while the process is alive (neither killed nor exited).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills the process with SIGKILL and waits for it to exit, so the port
    /// stops answering at once. Does nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_wait(&mut child);
        }
    }

    /// Stops the process without ending it (SIGSTOP): its socket stays
    /// open and connected clients get no answer, as from a Redis that hangs.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused process run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        let Some(child) = &self.child else {
            panic!("kill {which}: the server is not running");
        };
        let pid = child.id();
        let status = Command::new("kill")
            .args([which, &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("cannot run kill {which} {pid}: {e}"));
        assert!(status.success(), "kill {which} {pid} failed");
    }

    /// Starts the server again (killing it first if it runs) with the same
    /// port, directory and arguments, and waits until it answers PING.
    /// Panics, with the log, if it cannot within about 10 seconds.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let mut child = self.spawn();
            match wait_ready(&mut child, self.port, deadline) {
                Startup::Ready => {
                    self.child = Some(child);
                    return;
                }
                Startup::Exited | Startup::PortTaken if Instant::now() < deadline => {
                    // The old socket or another process still holds the port.
                    kill_and_wait(&mut child);
                    thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    kill_and_wait(&mut child);
                    panic!(
                        "redis-server did not come back on port {} within {START_TIMEOUT:?}; \
                         its log:\n{}",
                        self.port,
                        self.log()
                    );
                }
            }
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of masters only (no replicas), each a [`RedisServer`],
/// covering all 16384 slots. Dropping it kills every node.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// The usual number of masters in tests.
    pub const DEFAULT_MASTERS: usize = 3;

    /// Starts `masters` (at least 3) cluster-enabled servers, joins them with
    /// `redis-cli --cluster create`, and waits until every node reports
    /// `cluster_state:ok`, knows all the others, and sees all slots assigned.
    pub fn start(masters: usize) -> RedisCluster {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters, not {masters}"
        );
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| RedisServer::start_cluster_node_with(&[]))
            .collect();
        let cluster = RedisCluster { nodes };
        cluster.create();
        cluster.wait_healthy();
        cluster
    }

    /// Runs `redis-cli --cluster create` over all nodes, with a deadline.
    fn create(&self) {
        let log_path = self.nodes[0].dir().join("cluster-create.log");
        let log = File::create(&log_path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log_path.display()));
        let stderr = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone a log file handle: {e}"));
        let mut cli = Command::new("redis-cli");
        cli.arg("--cluster").arg("create");
        cli.args(self.ports().iter().map(|p| format!("127.0.0.1:{p}")));
        cli.args(["--cluster-replicas", "0", "--cluster-yes"]);
        cli.stdin(Stdio::null()).stdout(log).stderr(stderr);
        let mut child = spawn(&mut cli, "redis-cli");

        let output = || std::fs::read_to_string(&log_path).unwrap_or_default();
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return,
                Ok(Some(status)) => {
                    panic!(
                        "redis-cli --cluster create failed ({status}):\n{}",
                        output()
                    )
                }
                Ok(None) if Instant::now() < deadline => thread::sleep(POLL),
                Ok(None) => {
                    kill_and_wait(&mut child);
                    panic!(
                        "redis-cli --cluster create did not finish within {CLUSTER_TIMEOUT:?}:\n{}",
                        output()
                    )
                }
                Err(e) => panic!("cannot wait for redis-cli: {e}"),
            }
        }
    }

    /// Polls `CLUSTER INFO` on every node until each reports
    /// `cluster_state:ok`, all slots assigned and all nodes known (e.g. after
    /// restarting a node). Panics with every node's report after 30 seconds.
    pub fn wait_healthy(&self) {
        let want_nodes = format!("cluster_known_nodes:{}\r\n", self.nodes.len());
        let healthy = |info: &str| {
            info.contains("cluster_state:ok\r\n")
                && info.contains("cluster_slots_assigned:16384\r\n")
                && info.contains(&want_nodes)
        };
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let infos: Vec<String> = self
                .ports()
                .into_iter()
                .map(|p| command(p, &["CLUSTER", "INFO"]).unwrap_or_else(|e| e.to_string()))
                .collect();
            if infos.iter().all(|info| healthy(info)) {
                return;
            }
            if Instant::now() >= deadline {
                let report: Vec<String> = self
                    .ports()
                    .iter()
                    .zip(&infos)
                    .map(|(port, info)| format!("node {port}:\n{info}"))
                    .collect();
                panic!(
                    "the cluster was not healthy within {CLUSTER_TIMEOUT:?}:\n{}",
                    report.join("\n")
                );
            }
            thread::sleep(POLL);
        }
    }

    /// The connection URLs of all nodes, `redis://127.0.0.1:PORT/`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The store's URL for the cluster, every node a seed:
    /// `redis+cluster://127.0.0.1:PORT,...`.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The client ports of all nodes.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The nodes themselves, e.g. to kill or restart one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }
}

/// A Redis Cluster of one master, holding every slot, that tells clients
/// to reach it at `announce_port` on 127.0.0.1 (where a [`ReplyDropper`]
/// listens), so that every connection a cluster client makes to it goes
/// through that port.
pub fn one_node_cluster_announcing(announce_port: u16) -> RedisServer {
    let node = RedisServer::start_cluster_node_with(&[
        "--cluster-announce-ip",
        "127.0.0.1",
        "--cluster-announce-port",
        &announce_port.to_string(),
    ]);
    let added = command(node.port(), &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])
        .unwrap_or_else(|e| panic!("CLUSTER ADDSLOTSRANGE: {e}"));
    assert_eq!(added, "+OK\r\n", "CLUSTER ADDSLOTSRANGE");
    let deadline = Instant::now() + CLUSTER_TIMEOUT;
    loop {
        let info = command(node.port(), &["CLUSTER", "INFO"]).unwrap_or_default();
        if info.contains("cluster_state:ok\r\n") {
            return node;
        }
        assert!(
            Instant::now() < deadline,
            "a one-node cluster was not ok within {CLUSTER_TIMEOUT:?}:\n{info}"
        );
        thread::sleep(POLL);
    }
}

/// A TCP proxy on a free loopback port in front of `127.0.0.1:target`
/// that, once armed, lets the next request holding `EVALSHA` through and
/// then, as soon as Redis answers it, closes the client's connection
/// without passing the answer on: a script that ran, whose reply was lost
/// with its connection. Dropping it stops it.
pub struct ReplyDropper {
    port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ReplyDropper {
    /// Listens on a free port; forwards to `target` once [`ReplyDropper::to`]
    /// names it.
    pub fn listen() -> (ReplyDropper, TcpListener) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot bind a proxy port: {e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        let proxy = ReplyDropper {
            port,
            armed: Default::default(),
            dropped: Default::default(),
            stop: Default::default(),
        };
        (proxy, listener)
    }

    /// Starts forwarding what `listener` accepts to `127.0.0.1:target`.
    pub fn forward(&self, listener: TcpListener, target: u16) {
        let (armed, dropped, stop) = (self.armed.clone(), self.dropped.clone(), self.stop.clone());
        thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let (Ok(client), Ok(server)) =
                    (client, TcpStream::connect((Ipv4Addr::LOCALHOST, target)))
                else {
                    continue;
                };
                pump(client, server, armed.clone(), dropped.clone());
            }
        });
    }

    /// The port clients reach the node through.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Drops the reply to the next script call.
    pub fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many replies it has dropped.
    pub fn dropped(&self) -> usize {
        self.dropped.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for ReplyDropper {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the accept loop, which then sees `stop`.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
    }
}

/// A keepalive's answer, as Redis sends it.
const PONG: &[u8] = b"+PONG\r\n";

/// Copies bytes both ways between `client` and `server` on two threads,
/// dropping the connection instead of a script call's reply when armed.
fn pump(
    client: TcpStream,
    server: TcpStream,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::Ordering::SeqCst;
    let doomed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (Ok(mut from_client), Ok(mut to_server)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let marked = doomed.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = from_client.read(&mut buf) {
            let chunk = &buf[..n];
            // Marked before the call is passed on: marked after, its reply
            // could come back and through before the mark, on a busy
            // machine (a CI run saw the call answered and nothing
            // dropped). The tests arm it between calls, when no earlier
            // reply is on its way that the mark could catch instead.
            if chunk.windows(7).any(|w| w.eq_ignore_ascii_case(b"EVALSHA"))
                && armed.swap(false, SeqCst)
            {
                marked.store(true, SeqCst);
            }
            if to_server.write_all(chunk).is_err() {
                break;
            }
        }
        let _ = to_server.shutdown(std::net::Shutdown::Both);
    });
    let (mut from_server, mut to_client) = (server, client);
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = from_server.read(&mut buf) {
            let mut chunk = &buf[..n];
            if doomed.load(SeqCst) {
                // The store pings a connection that has been silent, and
                // that answer can come back after the mark: it passes, and
                // only what follows it is the script call's reply.
                let mut pongs = 0;
                while let Some(rest) = chunk.strip_prefix(PONG) {
                    (chunk, pongs) = (rest, pongs + 1);
                }
                if to_client.write_all(&PONG.repeat(pongs)).is_err() {
                    break;
                }
                if chunk.is_empty() {
                    continue;
                }
                // Redis has answered the script call: it ran.
                dropped.fetch_add(1, SeqCst);
                break;
            }
            if to_client.write_all(chunk).is_err() {
                break;
            }
        }
        let _ = to_client.shutdown(std::net::Shutdown::Both);
        let _ = from_server.shutdown(std::net::Shutdown::Both);
    });
}
