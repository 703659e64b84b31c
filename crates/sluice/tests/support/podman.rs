//! The image tests' setup: podman as this machine runs it, the image that
//! `scripts/image` builds from the debug binary (once per test binary), and
//! containers that are removed however the test ends.

use std::hash::{Hash, Hasher};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// podman as Debian's runs where systemd does not: with runc and cgroupfs.
const PODMAN: [&str; 5] = [
    "podman",
    "--runtime",
    "runc",
    "--cgroup-manager",
    "cgroupfs",
];

/// The limits every container gets: podman's defaults are refused here.
const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=4096:4096",
    "--ulimit",
    "nproc=4096:4096",
];

/// A podman command, with the flags this machine needs.
pub(crate) fn podman() -> Command {
    let mut command = Command::new(PODMAN[0]);
    command.args(&PODMAN[1..]);
    command
}

/// Runs podman with `args` and returns what it printed; fails the test
/// unless it succeeds.
pub(crate) fn podman_output(args: &[&str]) -> String {
    let out = podman().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The image built from this test binary's `sluice`, on the first call;
/// `None` when podman is missing and CI is not set, after saying that the
/// caller is skipped. Under CI a missing podman fails the test.
pub(crate) fn image() -> Option<&'static str> {
    static IMAGE: OnceLock<Option<String>> = OnceLock::new();
    IMAGE.get_or_init(build).as_deref()
}

fn build() -> Option<String> {
    let found = Command::new(PODMAN[0])
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !found.is_ok_and(|s| s.success()) {
        let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
        assert!(
            !ci,
            "CI is set and podman is missing: scripts/test installs it (with runc); \
             the image tests cannot be skipped there"
        );
        eprintln!(
            "skipped: podman is not installed (scripts/test installs it; under CI a missing \
             podman fails instead)"
        );
        return None;
    }
    let binary = env!("CARGO_BIN_EXE_sluice");
    // A name for each build tree, so that runs in two trees at once do not
    // replace each other's image.
    let mut hasher = std::hash::DefaultHasher::new();
    binary.hash(&mut hasher);
    let tag = format!("localhost/sluice-test:{:016x}", hasher.finish());
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/image"))
        .args(["--binary", binary, "--tag", &tag])
        .env("PODMAN", PODMAN.join(" "))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/image failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&out.stdout));
    Some(tag)
}

/// A container of the test's, removed (and its log shown, when the test
/// is failing) when dropped.
pub(crate) struct Container {
    pub(crate) name: String,
}

impl Container {
    /// Starts a container of `image` for each entry of `each`, all at once:
    /// podman's flags (before the image) and the command's arguments (after
    /// it). Every container runs detached, with a read-only root
    /// filesystem and the ulimits podman needs here.
    pub(crate) fn start_all(image: &str, each: &[(Vec<String>, Vec<String>)]) -> Vec<Container> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let started: Vec<_> = each
            .iter()
            .map(|(flags, command)| {
                let name = format!(
                    "sluice-test-{}-{}",
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                );
                let child = podman()
                    .args(["run", "--detach", "--read-only", "--name", &name])
                    .args(ULIMITS)
                    .args(flags)
                    .arg(image)
                    .args(command)
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                (Container { name }, child)
            })
            .collect();
        started
            .into_iter()
            .map(|(container, child)| {
                let out = child.wait_with_output().unwrap();
                assert!(
                    out.status.success(),
                    "podman run: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                container
            })
            .collect()
    }

    /// `podman inspect --format format` of this container.
    pub(crate) fn inspect(&self, format: &str) -> String {
        podman_output(&["inspect", "--format", format, &self.name])
            .trim()
            .to_owned()
    }

    /// The container's process as the host sees it: its `/proc` directory.
    pub(crate) fn proc(&self) -> std::path::PathBuf {
        format!("/proc/{}", self.inspect("{{.State.Pid}}")).into()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Ok(out) = podman().args(["logs", &self.name]).output()
        {
            eprintln!(
                "--- podman logs {}:\n{}{}",
                self.name,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let _ = podman()
            .args(["rm", "--force", "--time", "0", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
