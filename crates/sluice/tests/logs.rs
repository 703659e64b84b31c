//! What `serve` and `proxy` log at start, read from a file as an operator
//! would: which policy and which store are in force, an error naming a
//! store that does not answer (its password masked), the cap on
//! connections fitted to the limit on open files at the right level, and
//! no colour escapes, which only a terminal shows as colours.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::path::Path;
use std::process::Stdio;

use support::serve::POLICY;
use support::{PATIENCE, Process, eventually, free_port, policy_file, sluice_through};

/// A limit on open files far below what the default cap of 10,000
/// connections needs, so that every start lowers it.
fn few_files() -> Vec<String> {
    ["prlimit", "--nofile=1024:1024", "--"]
        .map(str::to_owned)
        .to_vec()
}

/// Starts `sluice args` with `env`, logging at `info` to `log`.
fn start(args: &[&str], env: &[(&str, &str)], log: &Path) -> Process {
    let file = std::fs::File::create(log).unwrap();
    let mut command = sluice_through(&few_files());
    command
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .stderr(Stdio::from(file));
    Process(command.spawn().unwrap())
}

/// Waits until the log holds a line with every one of `parts`, and returns
/// that line.
async fn line_with(log: &Path, parts: &[&str]) -> String {
    let mut found = String::new();
    let what = format!("a log line with {parts:?}");
    eventually(PATIENCE, &what, async || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        match text.lines().find(|l| parts.iter().all(|p| l.contains(p))) {
            Some(l) => {
                found = l.to_owned();
                true
            }
            None => false,
        }
    })
    .await;
    found
}

/// The level a log line was written at: the word after its timestamp.
fn level(line: &str) -> &str {
    line.split_whitespace().nth(1).unwrap_or_default()
}

fn address() -> String {
    format!("127.0.0.1:{}", free_port())
}

#[tokio::test]
async fn serve_names_its_policy_and_store_and_a_store_that_does_not_answer_in_a_plain_log() {
    let (dir, policy) = policy_file(POLICY);
    let log = dir.path().join("serve.log");
    // Nothing listens there.
    let redis = format!("redis://:hunter2@127.0.0.1:{}", free_port());
    let (http, grpc) = (address(), address());
    let _server = start(
        &[
            "serve",
            "--policy",
            policy.to_str().unwrap(),
            "--store",
            &redis,
            "--http",
            &http,
            "--grpc",
            &grpc,
        ],
        &[],
        &log,
    );
    let masked = redis.replace("hunter2", "***");
    let policy_line = line_with(&log, &["the policy in force", policy.to_str().unwrap()]).await;
    assert_eq!(level(&policy_line), "INFO", "{policy_line}");
    assert!(policy_line.contains("limits=1 rules=1"), "{policy_line}");
    let store_line = line_with(&log, &["the store in use", &masked]).await;
    assert_eq!(level(&store_line), "INFO", "{store_line}");
    // The default cap, fitted to the limit on open files: routine.
    let cap_line = line_with(&log, &["lowering --max-connections"]).await;
    assert_eq!(level(&cap_line), "INFO", "{cap_line}");
    // The server starts all the same, and says the store does not answer.
    line_with(&log, &["serving the decision API", &http]).await;
    let client = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let healthz = client.get(format!("http://{http}/healthz")).send().await;
    assert_eq!(healthz.unwrap().status(), 200);
    let error = line_with(&log, &["the store is not answering", &masked]).await;
    assert_eq!(level(&error), "ERROR", "{error}");

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains('\u{1b}'),
        "colour escapes in a file:\n{text}"
    );
    assert!(
        !text.contains("hunter2"),
        "the password in the log:\n{text}"
    );
}

/// A cap someone chose, by flag or by environment, that the limit on open
/// files cannot hold is worth a warning; here through `proxy`, whose log
/// names its policy and store as `serve`'s does.
#[tokio::test]
async fn a_cap_that_was_asked_for_and_cannot_be_held_is_a_warning() {
    let (dir, policy) = policy_file(POLICY);
    let policy = policy.to_str().unwrap();
    // The flags and the environment that ask for the cap.
    type Asked<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);
    let cases: [Asked<'_>; 2] = [
        (&["--max-connections", "5000"], &[]),
        (&[], &[("SLUICE_MAX_CONNECTIONS", "5000")]),
    ];
    for (i, (flags, env)) in cases.into_iter().enumerate() {
        let log = dir.path().join(format!("proxy-{i}.log"));
        let listen = address();
        let mut args = vec![
            "proxy",
            "--policy",
            policy,
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            &listen,
        ];
        args.extend_from_slice(flags);
        let _proxy = start(&args, env, &log);
        let cap = line_with(&log, &["lowering --max-connections", "asked=5000"]).await;
        assert_eq!(level(&cap), "WARN", "{cap}");
        let store = line_with(&log, &["the store in use", "store=memory"]).await;
        assert_eq!(level(&store), "INFO", "{store}");
        line_with(&log, &["the policy in force", policy]).await;
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            !text.contains('\u{1b}'),
            "colour escapes in a file:\n{text}"
        );
    }
}
