//! The seed corpus and every crash the fuzzers recorded, replayed through
//! the same functions the fuzz targets call, so that `cargo test` on the
//! stable toolchain keeps fixed crashes fixed.

// The helpers are not `#[test]` functions, so clippy's allow-*-in-tests
// settings do not reach them.
#![allow(clippy::expect_used, clippy::print_stdout)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `dir`, sorted; none when it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs every corpus input and artifact of `target` and returns how many
/// ran; fails naming each input that panicked.
fn replay(target: &str) -> usize {
    let (_, body) = sluice_fuzz::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .expect("a known target");
    let corpus = inputs(&fuzz_dir().join("corpus").join(target));
    assert!(!corpus.is_empty(), "fuzz/corpus/{target} has no inputs");
    let artifacts = inputs(&fuzz_dir().join("artifacts").join(target));
    let mut failed = Vec::new();
    for path in corpus.iter().chain(&artifacts) {
        let data = std::fs::read(path).expect("a readable input");
        if catch_unwind(AssertUnwindSafe(|| body(&data))).is_err() {
            failed.push(path.display().to_string());
        }
    }
    assert!(failed.is_empty(), "{target} fails on {failed:#?}");
    println!(
        "{target}: {} corpus inputs and {} artifacts replayed",
        corpus.len(),
        artifacts.len()
    );
    corpus.len() + artifacts.len()
}

#[test]
fn every_fuzz_target_has_a_body_here_and_every_body_a_fuzz_target() {
    let mut files: Vec<String> = inputs(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut bodies: Vec<String> = sluice_fuzz::TARGETS
        .iter()
        .map(|(name, _)| (*name).to_owned())
        .collect();
    bodies.sort();
    assert_eq!(files, bodies);
}

#[test]
fn policy_seeds_and_crashes_replay_without_a_failure() {
    assert!(replay("policy") > 0);
}

#[test]
fn client_ip_seeds_and_crashes_replay_without_a_failure() {
    assert!(replay("client_ip") > 0);
}

#[test]
fn jwt_seeds_and_crashes_replay_without_a_failure() {
    assert!(replay("jwt") > 0);
}

#[test]
fn api_seeds_and_crashes_replay_without_a_failure() {
    assert!(replay("api") > 0);
}

#[test]
fn api_calls_seeds_and_crashes_replay_without_a_failure() {
    assert!(replay("api_calls") > 0);
}

#[test]
fn rls_seeds_and_crashes_replay_without_a_failure() {
    assert!(replay("rls") > 0);
}
