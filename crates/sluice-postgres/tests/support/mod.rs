//! A real PostgreSQL for the tests: made with `initdb` in a temporary
//! directory, on a free port, by the `postgres` user when the tests run as
//! root (PostgreSQL refuses to run as root), and stopped when dropped.
//! `scripts/test` installs Debian's `postgresql` package when it is missing.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long PostgreSQL may take to start or stop on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The directory of PostgreSQL's server programs: `SLUICE_PG_BIN`, else the
/// newest of Debian's `/usr/lib/postgresql/<version>/bin`, else whatever
/// `PATH` finds.
fn bin(program: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("SLUICE_PG_BIN") {
        return Path::new(&dir).join(program);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, dir)) => dir.join(program),
        None => program.into(),
    }
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// `program`, as the `postgres` user when this runs as root. `setpriv`
/// execs it in place, so that the child is the program itself and a signal
/// sent to it reaches it.
fn as_owner(program: &str) -> Command {
    if running_as_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ])
        .arg(bin(program));
        c
    } else {
        Command::new(bin(program))
    }
}

/// One PostgreSQL server of the tests' own.
pub(crate) struct PostgresServer {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl PostgresServer {
    /// A new database cluster, started. It trades durability for speed
    /// (`fsync` off), as tests that do not crash it can.
    pub(crate) fn start() -> PostgresServer {
        Self::start_with(&["-c", "fsync=off", "-c", "synchronous_commit=off"])
    }

    /// A new database cluster, started with `settings` (`-c name=value`
    /// pairs).
    pub(crate) fn start_with(settings: &[&str]) -> PostgresServer {
        let dir = tempfile::Builder::new()
            .prefix("sluice-pg-")
            .tempdir()
            .unwrap();
        if running_as_root() {
            let owned = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(owned.success());
        }
        let data = dir.path().join("data");
        let made = as_owner("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .args(["--locale", "C"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap_or_else(|e| panic!("initdb ({}): {e}", bin("initdb").display()));
        assert!(
            made.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&made.stderr)
        );
        let mut server = PostgresServer {
            port: free_port(),
            dir,
            child: None,
        };
        server.run(settings);
        server
    }

    fn run(&mut self, settings: &[&str]) {
        let data = self.dir.path().join("data");
        let log = std::fs::File::create(self.dir.path().join("postgres.log")).unwrap();
        let child = as_owner("postgres")
            .arg("-D")
            .arg(&data)
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            .args(settings)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        self.wait_ready();
    }

    /// Waits until the server accepts connections.
    fn wait_ready(&self) {
        let started = Instant::now();
        loop {
            let ready = Command::new(bin("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "PostgreSQL did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// What the server logged.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// Stops the server at once, as a crash would (`-m immediate`): what it
    /// had not written to disk is recovered from its log when it starts.
    pub(crate) fn stop_immediate(&mut self) {
        let data = self.dir.path().join("data");
        let status = as_owner("pg_ctl")
            .args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(&data)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data.
    pub(crate) fn restart(&mut self, settings: &[&str]) {
        assert!(self.child.is_none(), "stop it first");
        self.run(settings);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGQUIT: PostgreSQL's immediate shutdown, which ends its
            // backends too.
            let _ = Command::new("kill")
                .args(["-QUIT", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}
