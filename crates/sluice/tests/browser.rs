//! The pages Sluice draws, opened in a real headless Chromium: the report of
//! `sluice simulate`, the live dashboard of `sluice serve` under load, and
//! the requests `sluice proxy` holds.
//! Each test saves a screenshot in `target/test-artefacts/` (or in
//! `$SLUICE_ARTEFACTS`).
//!
//! Chromium is Debian's `chromium` package, which `scripts/test` installs
//! when it is missing; `$SLUICE_CHROMIUM` names another binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::Value;
use support::proxy::spawn_proxy;
use support::serve::spawn_serve;
use support::upstream::start_upstream;
use support::{PATIENCE, eventually, get_json, get_text, metric, policy_file};

/// The width and height of every window, and so of every screenshot.
const WINDOW: (u32, u32) = (1400, 1000);

fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_CHROMIUM") {
        return path.into();
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .unwrap();
        if found.status.success() {
            return String::from_utf8(found.stdout).unwrap().trim().into();
        }
    }
    panic!(
        "these tests need a headless Chromium: install Debian's `chromium` package \
         (scripts/test does), or name one in SLUICE_CHROMIUM"
    );
}

/// Where screenshots are kept after the test.
fn artefacts() -> PathBuf {
    let dir = std::env::var_os("SLUICE_ARTEFACTS").map_or_else(
        || Path::new(env!("CARGO_TARGET_TMPDIR")).join("../test-artefacts"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Chromium, headless, in a profile of its own, with `extra` arguments and
/// `url` last; fails the test unless it exits cleanly. Returns what it
/// printed.
fn headless(profile: &Path, extra: &[&str], url: &str) -> String {
    let size = format!("--window-size={},{}", WINDOW.0, WINDOW.1);
    let out = Command::new(chromium())
        .args([
            "--headless",
            // CI runs as root, where Chromium's sandbox cannot start.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--no-first-run",
            &size,
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Takes a screenshot of `url` into the artefacts as `name`, after
/// `budget_ms` of the page's (virtual) time, and checks that it is a PNG
/// of the window's size.
fn screenshot(profile: &Path, url: &str, name: &str, budget_ms: u32) -> PathBuf {
    let path = artefacts().join(name);
    let _ = std::fs::remove_file(&path);
    headless(
        profile,
        &[
            &format!("--screenshot={}", path.display()),
            &format!("--virtual-time-budget={budget_ms}"),
        ],
        url,
    );
    let png = std::fs::read(&path).unwrap();
    assert_eq!(
        &png[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    let dimension = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    assert_eq!((dimension(16), dimension(20)), WINDOW);
    eprintln!("screenshot: {}", path.display());
    path
}

#[test]
fn the_simulation_report_draws_every_chart_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let run = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["simulate", "double-window", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    // A page beside the report opens it in a frame and measures what the
    // browser laid out: each chart's size on screen and what it drew.
    std::fs::write(
        out.join("measure.html"),
        r#"<!doctype html><meta charset="utf-8">
<iframe id="report" src="report.html" style="width:1400px;height:1000px"></iframe>
<pre id="result"></pre>
<script>
document.getElementById("report").addEventListener("load", () => {
  const doc = document.getElementById("report").contentDocument;
  const charts = [...doc.querySelectorAll("svg")].map(svg => {
    const box = svg.getBoundingClientRect();
    return {
      width: box.width,
      height: box.height,
      marks: svg.querySelectorAll("path, polyline, rect, line, circle").length,
      labels: [...svg.querySelectorAll("text")].map(t => t.textContent),
    };
  });
  document.getElementById("result").textContent = JSON.stringify({ title: doc.title, charts });
});
</script>"#,
    )
    .unwrap();
    let profile = tempfile::tempdir().unwrap();
    let dom = headless(
        profile.path(),
        &[
            // The measuring page reads the report, a file like itself.
            "--allow-file-access-from-files",
            "--virtual-time-budget=3000",
            "--dump-dom",
        ],
        &format!("file://{}", out.join("measure.html").display()),
    );
    let json = between(&dom, "<pre id=\"result\">", "</pre>")
        .unwrap_or_else(|| panic!("the report was not measured: {dom}"));
    let measured: Value = serde_json::from_str(&json.replace("&quot;", "\"").replace("&amp;", "&"))
        .unwrap_or_else(|e| panic!("{e}: {json}"));
    let charts = measured["charts"].as_array().unwrap();
    // Admitted calls, what the first key has left, and retry_after.
    assert_eq!(charts.len(), 3, "{measured}");
    for chart in charts {
        assert!(chart["width"].as_f64() > Some(300.0), "{chart}");
        assert!(chart["height"].as_f64() > Some(150.0), "{chart}");
        assert!(chart["marks"].as_u64() > Some(10), "{chart}");
    }
    // The admitted chart names every algorithm in its legend.
    let labels = charts[0]["labels"].to_string();
    for algorithm in [
        "fixed_window",
        "token_bucket",
        "sliding_window",
        "sliding_log",
    ] {
        assert!(
            labels.contains(algorithm),
            "{algorithm} missing from {labels}"
        );
    }

    screenshot(
        profile.path(),
        &format!("file://{}", out.join("report.html").display()),
        "simulate-report.png",
        1000,
    );
}

/// The text between the first `start` and the next `end` in `s`.
fn between(s: &str, start: &str, end: &str) -> Option<String> {
    let from = s.find(start)? + start.len();
    let to = s[from..].find(end)? + from;
    Some(s[from..to].to_owned())
}

/// The value of `attribute` on the element with `id` in a dumped DOM.
fn attribute(dom: &str, id: &str, attribute: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let tag_start = dom[..at].rfind('<')?;
    let tag = &dom[tag_start..tag_start + dom[tag_start..].find('>')?];
    between(tag, &format!("{attribute}=\""), "\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_its_counters_rising_while_load_runs() {
    let policy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/policy.yaml");
    let (_serve, base, _) = spawn_serve(&policy).await;

    // Load: calls on a few keys of `sendMessage`, most of them denied,
    // until the test ends.
    let running = Arc::new(AtomicBool::new(true));
    let sent = Arc::new(AtomicU64::new(0));
    let load = {
        let (running, sent, url) = (
            Arc::clone(&running),
            Arc::clone(&sent),
            format!("{base}/v1/limit"),
        );
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut i = 0u64;
            while running.load(Ordering::Relaxed) {
                let body = format!(r#"{{"limit": "sendMessage", "key": "user-{}"}}"#, i % 5);
                client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                sent.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        })
    };
    let client = reqwest::Client::new();
    eventually(PATIENCE, "a sample with decisions in it", async || {
        let stats = get_json(&client, format!("{base}/v1/stats")).await;
        stats["decisions"].as_array().is_some_and(|d| !d.is_empty())
    })
    .await;

    let profile = tempfile::tempdir().unwrap();
    let ui = format!("{base}/ui");
    // Chromium runs for seconds: off the runtime's workers, so that the
    // load keeps going meanwhile.
    let dump = || {
        tokio::task::block_in_place(|| {
            headless(
                profile.path(),
                &["--virtual-time-budget=2500", "--dump-dom"],
                &ui,
            )
        })
    };
    let total = |dom: &str| -> u64 {
        attribute(dom, "total-decisions", "data-value")
            .unwrap_or_else(|| panic!("no decision total on the page: {dom}"))
            .parse()
            .unwrap()
    };
    let first = dump();
    let before = total(&first);
    assert!(before > 0);
    // The page fetched its data more than once, and drew the decisions.
    let updates: u32 = attribute(&first, "page", "data-updates")
        .unwrap()
        .parse()
        .unwrap();
    assert!(updates >= 2, "the page updated {updates} times");
    let chart = between(&first, "id=\"decisions-chart\"", "</svg>").unwrap();
    assert_eq!(chart.matches("class=\"series\"").count(), 3, "{chart}");
    assert!(chart.contains("points=\""), "{chart}");
    assert!(first.contains("sendMessage"), "no rule row for sendMessage");
    assert!(first.contains("user-"), "no denied key listed");
    assert_eq!(
        attribute(&first, "ready", "class").as_deref(),
        Some("badge ok")
    );

    // Another look, a sample or more later, shows more decisions.
    let mut after = before;
    eventually(PATIENCE, "the dashboard's total to rise", async || {
        after = total(&dump());
        after > before
    })
    .await;
    tokio::task::block_in_place(|| screenshot(profile.path(), &ui, "dashboard.png", 2500));
    running.store(false, Ordering::Relaxed);
    load.await.unwrap();
    assert!(sent.load(Ordering::Relaxed) >= after - before);
}

/// One request a minute per client; up to five more held, for up to an hour.
const SLOW_SHAPED: &str = "
rules:
  - name: shaped
    limit_keys: [ip:address]
    algorithm: token_bucket
    algorithm_config: {rate: 1, period: 1m, burst: 1, max_reserved: 5}
    on_limit: {delay: {max: 1h}}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_dashboard_shows_the_requests_held_and_lets_go_of_abandoned_ones() {
    let (up, seen) = start_upstream().await;
    let (_dir, path) = policy_file(SLOW_SHAPED);
    let (mut bin, listen, admin) = spawn_proxy(up, &path, &[]).await;
    let client = reqwest::Client::new();
    let url = format!("http://{listen}/r");
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    // Three more, each on a connection of its own, held for minutes.
    let held: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { reqwest::Client::new().get(&url).send().await })
        })
        .collect();
    let metrics = format!("http://{admin}/metrics");
    let scrape = async |series: &str| metric(&get_text(&client, &metrics).await, series);
    eventually(PATIENCE, "three requests held", async || {
        scrape("sluice_held_requests").await == Some(3.0)
    })
    .await;

    let profile = tempfile::tempdir().unwrap();
    let ui = format!("http://{admin}/ui");
    let dom = tokio::task::block_in_place(|| {
        headless(
            profile.path(),
            &["--virtual-time-budget=1500", "--dump-dom"],
            &ui,
        )
    });
    assert_eq!(
        attribute(&dom, "held-now", "data-value").as_deref(),
        Some("3"),
        "{dom}"
    );
    tokio::task::block_in_place(|| screenshot(profile.path(), &ui, "dashboard-held.png", 1500));

    // Their clients go away: the proxy lets go of them, reservations given back.
    for task in held {
        task.abort();
    }
    eventually(PATIENCE, "the abandoned requests let go", async || {
        scrape("sluice_held_abandoned_total").await == Some(3.0)
            && scrape("sluice_held_requests").await == Some(0.0)
    })
    .await;
    assert_eq!(seen.hits(), 1, "no held request was forwarded");
    bin.terminate(PATIENCE).await;
}
