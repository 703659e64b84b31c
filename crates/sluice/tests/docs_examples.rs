//! The README and the pages in docs/ show commands; these tests run them,
//! so that no page shows a call that does not answer as it says.
//!
//! Every `sh` block is read command by command. A `curl` goes to a real
//! `sluice serve` (`localhost:8080` rewritten to the server's port) and
//! must exit 0 with a 2xx or 429, and its answer must have the fields of
//! the answer the page shows under it (and the same `allowed` or
//! `released`). A `sluice` command (or `cargo run -p sluice -- …`) runs the
//! test's binary: `serve` becomes the page's server, anything else runs to
//! completion in a directory that holds `examples/`. A command that needs
//! what the test does not start says so in a comment (`# needs: podman`)
//! and is skipped, and counted. A block with a `# policy: the yaml block
//! above` line is served the last `yaml` block above it on its page.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{PATIENCE, Process, eventually, free_port};

/// The marker that serves a block the page's policy instead of the example.
const POLICY_ABOVE: &str = "# policy: the yaml block above";

/// What a command may say it needs, to be skipped: only what this test
/// cannot start, so that no page skips a command it could run.
const NEEDS: &[&str] = &[
    "root",
    "podman",
    "a Kubernetes cluster",
    "postgresql",
    "axum-postgres",
    "an upstream",
    "a Redis that is down",
];

/// How long a command other than a server may run: `simulate` writes its
/// charts in a debug build.
const COMMAND_PATIENCE: Duration = Duration::from_secs(120);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The README and every page in docs/, in a fixed order, with their text.
fn pages() -> Vec<(String, String)> {
    let root = root();
    let mut paths = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let name = p.strip_prefix(&root).unwrap().display().to_string();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// One command of a `sh` block.
#[derive(Debug, PartialEq)]
struct Example {
    /// The command, its continuation lines joined with newlines, without
    /// its comment.
    command: String,
    /// What a `# needs: …` comment says it needs.
    needs: Option<String>,
    /// The first line shown under it, when it is an answer (`{` or `[`).
    output: Option<String>,
    /// The policy it is to be served: the `yaml` block above, when the
    /// block asks for it.
    policy: Option<String>,
}

/// Whether `text` ends inside a quoted string, as the shell reads quotes.
fn inside_quotes(text: &str) -> bool {
    let (mut single, mut double) = (false, false);
    for c in text.chars() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            _ => {}
        }
    }
    single || double
}

/// `line` split at a `#` that starts a shell comment (after a space,
/// outside quotes): the command, and the comment's text.
fn split_comment(line: &str) -> (&str, Option<&str>) {
    let (mut single, mut double, mut previous) = (false, false, ' ');
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => {
                return (line[..i].trim_end(), Some(line[i + 1..].trim()));
            }
            _ => {}
        }
        previous = c;
    }
    (line.trim_end(), None)
}

/// Every command of every `sh` block of `text`, in order.
fn examples(text: &str) -> Vec<Example> {
    let mut found = Vec::new();
    let mut last_yaml: Option<String> = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let fence = line.trim();
        if !fence.starts_with("```") || fence == "```" {
            continue;
        }
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        match fence {
            "```yaml" => last_yaml = Some(block.join("\n") + "\n"),
            "```sh" => {
                let policy = block.iter().any(|l| l.trim() == POLICY_ABOVE).then(|| {
                    last_yaml
                        .clone()
                        .expect("a `# policy:` block under no yaml block")
                });
                found.extend(commands(&block, policy));
            }
            _ => {}
        }
    }
    found
}

/// The commands of one `sh` block's lines.
fn commands(block: &[&str], policy: Option<String>) -> Vec<Example> {
    let mut found: Vec<Example> = Vec::new();
    let mut i = 0;
    while i < block.len() {
        let line = block[i].trim();
        i += 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('{') || line.starts_with('[') {
            let last = found.last_mut().expect("an answer under no command");
            last.output.get_or_insert_with(|| line.to_owned());
            continue;
        }
        let mut command = line.to_owned();
        while (inside_quotes(&command) || command.ends_with('\\')) && i < block.len() {
            command.push('\n');
            command.push_str(block[i]);
            i += 1;
        }
        let (command, comment) = split_comment(&command);
        let needs = comment
            .and_then(|c| c.strip_prefix("needs:"))
            .map(|n| n.trim().to_owned());
        found.push(Example {
            command: command.to_owned(),
            needs,
            output: None,
            policy: policy.clone(),
        });
    }
    found
}

/// The arguments of a `sluice` command line, as shell text: after
/// `sluice` or after `cargo run [--release] -p sluice --`.
fn sluice_args(command: &str) -> Option<&str> {
    let rest = command
        .strip_prefix("sluice ")
        .or_else(|| command.strip_prefix("cargo run -p sluice -- "))
        .or_else(|| command.strip_prefix("cargo run --release -p sluice -- "))?;
    Some(rest.trim())
}

/// A `sluice serve` the test started, with what it must outlive.
struct Server {
    _process: Process,
    port: u16,
    _dir: Option<tempfile::TempDir>,
}

/// Starts `sluice <args>` (a `serve` command line as the page writes it)
/// on free ports, from the repository's root, and waits until it is ready.
async fn serve(args: &str, dir: Option<tempfile::TempDir>) -> Server {
    let (http, grpc) = (free_port(), free_port());
    let line = format!(
        "exec {} {args} --http 127.0.0.1:{http} --grpc 127.0.0.1:{grpc}",
        env!("CARGO_BIN_EXE_sluice")
    );
    let process = Process(
        Command::new("sh")
            .arg("-c")
            .arg(line)
            .current_dir(root())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = reqwest::Client::new();
    let ready = format!("http://127.0.0.1:{http}/readyz");
    eventually(PATIENCE, &format!("`sluice {args}` to start"), async || {
        let r = client.get(&ready).send().await;
        r.is_ok_and(|r| r.status() == 200)
    })
    .await;
    Server {
        _process: process,
        port: http,
        _dir: dir,
    }
}

/// A server for `policy`: the example's when there is none.
async fn serve_policy(policy: Option<&str>) -> Server {
    match policy {
        None => serve("serve --policy examples/policy.yaml", None).await,
        Some(text) => {
            let (dir, path) = support::policy_file(text);
            serve(&format!("serve --policy {}", path.display()), Some(dir)).await
        }
    }
}

/// Runs `line` through `sh -c` in `dir`, up to [`COMMAND_PATIENCE`]; its
/// exit status, standard output and standard error.
fn run(line: &str, dir: &Path) -> (std::process::ExitStatus, String, String) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(line)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + COMMAND_PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`{line}` ran for more than {COMMAND_PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status, text(out.stdout), text(out.stderr))
}

/// The keys of a JSON object.
fn keys(v: &serde_json::Value) -> BTreeSet<&str> {
    v.as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// Runs a page's `curl` on `server`, and holds its answer to the one the
/// page shows. Lease ids the page shows are replaced by those the server
/// answered, so that a page's release releases its acquire's lease.
fn run_curl(page: &str, ex: &Example, server: &Server, leases: &mut HashMap<String, String>) {
    let mut line = ex
        .command
        .replace("localhost:8080", &format!("127.0.0.1:{}", server.port));
    for (shown, real) in leases.iter() {
        line = line.replace(shown.as_str(), real);
    }
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("body");
    let line = format!("{line} -o '{}' -w '%{{http_code}}'", body.display());
    let (status, out, err) = run(&line, dir.path());
    assert!(
        status.success(),
        "{page}: `{line}` failed: {status:?} {err}"
    );
    let code: u16 = out.trim().parse().unwrap();
    assert!(
        (200..300).contains(&code) || code == 429,
        "{page}: `{}` answered {code}",
        ex.command
    );
    let Some(shown) = &ex.output else { return };
    let answer: serde_json::Value = serde_json::from_slice(&std::fs::read(&body).unwrap()).unwrap();
    let shown: serde_json::Value = serde_json::from_str(shown)
        .unwrap_or_else(|e| panic!("{page}: the answer shown under `{}`: {e}", ex.command));
    assert_eq!(
        keys(&answer),
        keys(&shown),
        "{page}: `{}` answered {answer}, the page shows {shown}",
        ex.command
    );
    for field in ["allowed", "released"] {
        assert_eq!(
            answer.get(field),
            shown.get(field),
            "{page}: `{}` answered {answer}, the page shows {shown}",
            ex.command
        );
    }
    if let (Some(shown), Some(real)) = (shown["lease"].as_str(), answer["lease"].as_str()) {
        leases.insert(shown.to_owned(), real.to_owned());
    }
}

/// Runs a `sluice` command other than a server to completion, in a fresh
/// directory that holds `examples/`, as the repository's root does.
fn run_sluice(page: &str, args: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root().join("examples"), dir.path().join("examples")).unwrap();
    let line = format!("{} {args}", env!("CARGO_BIN_EXE_sluice"));
    let (status, _, err) = run(&line, dir.path());
    assert!(
        status.success(),
        "{page}: `sluice {args}` failed: {status:?}\n{err}"
    );
}

#[tokio::test]
async fn every_command_the_readme_and_the_docs_show_runs_and_answers_as_its_page_says() {
    let (mut curls, mut commands, mut servers_started) = (0, 0, 0);
    let mut skipped: Vec<String> = Vec::new();
    for (page, text) in pages() {
        // One server a policy a page, so that a page's calls follow on
        // from each other as a reader's would.
        let mut servers: HashMap<Option<String>, Server> = HashMap::new();
        let mut leases = HashMap::new();
        for ex in examples(&text) {
            if let Some(needs) = &ex.needs {
                assert!(
                    NEEDS.contains(&needs.as_str()),
                    "{page}: `{}` needs {needs:?}, which is not one of {NEEDS:?}",
                    ex.command
                );
                skipped.push(format!("{page}: `{}` (needs {needs})", ex.command));
                continue;
            }
            if ex.command.starts_with("curl ") {
                if !servers.contains_key(&ex.policy) {
                    let server = serve_policy(ex.policy.as_deref()).await;
                    servers.insert(ex.policy.clone(), server);
                }
                run_curl(&page, &ex, &servers[&ex.policy], &mut leases);
                curls += 1;
            } else if let Some(args) = sluice_args(&ex.command) {
                if args.starts_with("serve") {
                    assert!(
                        ex.policy.is_none() && !servers.contains_key(&None),
                        "{page}: a second server for the same calls"
                    );
                    servers.insert(None, serve(args, None).await);
                    servers_started += 1;
                } else {
                    run_sluice(&page, args);
                    commands += 1;
                }
            } else {
                panic!(
                    "{page}: `{}` is a command this test cannot run: \
                     say what it needs with a `# needs: …` comment",
                    ex.command
                );
            }
        }
    }
    println!(
        "ran {curls} curl calls, {commands} sluice commands and {servers_started} servers \
         the pages start; skipped {} that need what this test does not start:",
        skipped.len()
    );
    for s in &skipped {
        println!("  {s}");
    }
    assert!(curls >= 11, "only {curls} curl calls found in the docs");
    assert!(
        commands >= 2,
        "only {commands} sluice commands found in the docs"
    );
    assert!(servers_started >= 1, "no page's `sluice serve` was started");
}

/// The events docs/replay.md shows, replayed through the example policy,
/// give exactly the lines it shows.
#[test]
fn the_replay_page_shows_what_its_events_replay_to() {
    let text = std::fs::read_to_string(root().join("docs/replay.md")).unwrap();
    let blocks: Vec<Vec<&str>> = {
        let mut blocks = Vec::new();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() == "```jsonl" {
                blocks.push(lines.by_ref().take_while(|l| l.trim() != "```").collect());
            }
        }
        blocks
    };
    let [events, answers] = &blocks[..] else {
        panic!("docs/replay.md should show events and their answers in two `jsonl` blocks")
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "replay",
            "--policy",
            "examples/policy.yaml",
            "--events",
            "-",
            "--quiet",
        ])
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all((events.join("\n") + "\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let got = String::from_utf8(out.stdout).unwrap();
    assert_eq!(got.lines().collect::<Vec<_>>(), *answers);
}

/// Every link of the README and the docs names a file of the repository
/// (and no page links outside it).
#[test]
fn every_link_in_the_readme_and_the_docs_resolves_inside_the_repository() {
    let root = root();
    let mut links = 0;
    for (page, text) in pages() {
        let dir = root.join(&page).parent().unwrap().to_owned();
        for (i, _) in text.match_indices("](") {
            let target = &text[i + 2..];
            let target = &target[..target.find(')').unwrap()];
            assert!(
                !target.contains("://"),
                "{page}: a link outside the repository: {target}"
            );
            let file = target.split('#').next().unwrap();
            if file.is_empty() {
                continue;
            }
            assert!(
                dir.join(file).exists(),
                "{page}: a link to {target}, which does not exist"
            );
            links += 1;
        }
    }
    assert!(links >= 50, "only {links} links found");
}

/// A command split over lines by an open quote is one command, its
/// comment is not part of it, and the answer under it is its output.
#[test]
fn a_command_over_several_lines_with_a_comment_and_an_answer_reads_as_one() {
    let block = [
        "curl -s localhost:8080/v1/limit --json '{\"limit\": \"m\",",
        "  \"key\": \"# not a comment\"}'   # needs: a Redis that is down",
        "{\"allowed\":true}",
        "sluice validate examples/policy.yaml",
    ];
    let found = commands(&block, None);
    assert_eq!(
        found,
        [
            Example {
                command: "curl -s localhost:8080/v1/limit --json '{\"limit\": \"m\",\n  \"key\": \"# not a comment\"}'".into(),
                needs: Some("a Redis that is down".into()),
                output: Some("{\"allowed\":true}".into()),
                policy: None,
            },
            Example {
                command: "sluice validate examples/policy.yaml".into(),
                needs: None,
                output: None,
                policy: None,
            },
        ]
    );
    assert_eq!(
        sluice_args("cargo run --release -p sluice -- serve"),
        Some("serve")
    );
    assert_eq!(sluice_args("scripts/test"), None);
}
