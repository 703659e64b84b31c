//! `sluice simulate` as a user runs it: the real binary writes a report, its
//! charts and a summary whose numbers show what each algorithm does with
//! the scenario.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const ALGORITHMS: [&str; 4] = [
    "token_bucket",
    "fixed_window",
    "sliding_window",
    "sliding_log",
];

fn simulate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("simulate")
        .args(args)
        .output()
        .unwrap()
}

/// Runs the built-in scenario `name` into `report/` of a fresh directory,
/// which must succeed; the directory and the report's path.
fn built_in(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let run = simulate(&[name, "--out", out.to_str().unwrap()]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    (dir, out)
}

fn summary(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap()
}

fn totals<'a>(rows: &'a Value, algorithm: &str) -> &'a Value {
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["algorithm"] == algorithm)
        .unwrap_or_else(|| panic!("no {algorithm} in {rows}"))
}

#[test]
fn the_double_window_attack_gets_twice_the_limit_through_a_fixed_window_only() {
    let (_dir, out) = built_in("double-window");
    let s = summary(&out);
    assert_eq!(
        (s["rate"].as_f64(), s["period"].as_f64()),
        (Some(1000.0), Some(60.0))
    );
    let rows = &s["algorithms"];
    let peak = |a: &str| totals(rows, a)["peak"].as_f64().unwrap();
    let bound = |a: &str| {
        let t = totals(rows, a);
        t["limit"].as_f64().unwrap() + t["burst"].as_f64().unwrap()
    };
    // 1000 just before the boundary and 1000 just after, all admitted: a
    // whole rate above the limit, which is the fixed window's burst.
    assert_eq!(peak("fixed_window"), 2000.0);
    assert_eq!(totals(rows, "fixed_window")["denied"], 0);
    assert_eq!(totals(rows, "fixed_window")["burst"], 1000.0);
    assert_eq!(bound("fixed_window"), 2000.0);
    // The sliding log is exact; the others stay near the limit.
    assert_eq!(peak("sliding_log"), 1000.0);
    for a in ["token_bucket", "sliding_window", "sliding_log"] {
        assert!(peak(a) < 1.1 * 1000.0, "{a} let {} through", peak(a));
    }
    // None goes past what its formula promises.
    for a in ALGORITHMS {
        assert!(peak(a) <= bound(a), "{a}: {} above {}", peak(a), bound(a));
    }
    for file in ["admitted.svg", "remaining.svg", "retry_after.svg"] {
        let svg = std::fs::read_to_string(out.join(file)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("polyline"),
            "{file}"
        );
        for a in ALGORITHMS {
            assert!(svg.contains(a), "{file} has no line for {a}");
        }
    }
    // One file, nothing to fetch: every chart inline, no script, no link.
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert_eq!(html.matches("<svg").count(), 3);
    for outside in ["<script", "<link", "src=", "url(", "https://"] {
        assert!(
            !html.contains(outside),
            "the report refers outside itself: {outside}"
        );
    }
    assert!(html.contains("double-window") && html.contains("fixed_window"));
    // Only the fixed window was driven to its limit + burst.
    assert_eq!(html.matches("<tr class=\"over\">").count(), 1, "{html}");
    assert!(html.contains("<tr class=\"over\"><td>fixed_window</td>"));
}

/// What `docs/bounds.md` promises of a chart: each line drawn with at most
/// 1,440 points, so that a chart of four lines stays under 96 KiB however
/// many calls are behind it.
const MOST_SVG_BYTES: u64 = 96 << 10;

/// Fifty thousand calls of one key, each a point of the `remaining` chart
/// before it was thinned (1.5 MB of SVG); and calls a year apart whose
/// retries were counted in one-second bins (31 million of them).
#[test]
fn charts_stay_small_however_many_calls_and_however_long_the_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let scenarios = [
        r#"{"name": "many", "rate": 100, "period": 1,
            "waves": [{"at": 0, "count": 50000, "over": 250}]}"#,
        r#"{"name": "a-year", "rate": 1, "period": 1, "retries": 2,
            "waves": [{"at": 0, "count": 3}, {"at": 31000000, "count": 3}]}"#,
    ];
    for (i, text) in scenarios.into_iter().enumerate() {
        let file = dir.path().join(format!("{i}.json"));
        std::fs::write(&file, text).unwrap();
        let out = dir.path().join(format!("out-{i}"));
        let run = simulate(&[
            "--file",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let mut charts = 0;
        for entry in std::fs::read_dir(&out).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "svg") {
                charts += 1;
                let size = std::fs::metadata(&path).unwrap().len();
                assert!(size <= MOST_SVG_BYTES, "{}: {size} bytes", path.display());
            }
        }
        assert!(charts >= 3, "{text}: {charts} charts");
    }
}

#[test]
fn jitter_spreads_a_thundering_herd_of_retries() {
    let (_dir, out) = built_in("thundering-herd");
    let s = summary(&out);
    for a in ALGORITHMS {
        let busiest = |rows: &Value| {
            totals(rows, a)["retries_in_busiest_second"]
                .as_u64()
                .unwrap()
        };
        let (with, without) = (busiest(&s["algorithms"]), busiest(&s["without_jitter"]));
        // Without jitter every client is told the same wait, and all 200
        // come back in one second.
        assert_eq!(without, 200, "{a}");
        assert!(
            with * 4 <= without,
            "{a}: {with} with jitter against {without}"
        );
    }
    assert!(out.join("herd.svg").exists());
}

#[test]
fn a_scenario_can_come_from_a_file_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scenario.json");
    std::fs::write(
        &file,
        r#"{"name": "mine", "rate": 10, "period": 1,
            "waves": [{"at": 0, "count": 24, "over": 3, "key": "a"}]}"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let run = simulate(&[
        "--file",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(summary(&out)["scenario"], "mine");
    // 10 a second, asked for at 8 a second: all admitted by each.
    for row in summary(&out)["algorithms"].as_array().unwrap() {
        assert_eq!(row["denied"], 0, "{row}");
    }

    for (text, says) in [
        (
            r#"{"name": "x", "rate": 10, "period": 1, "waves": [{"at": 0, "count": 4000000}]}"#,
            "at most",
        ),
        (
            r#"{"name": "x", "rate": -1, "period": 1, "waves": []}"#,
            "rate",
        ),
        (
            r#"{"name": "x", "rate": 1, "period": 1, "waves": [], "extra": 1}"#,
            "not a scenario",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let run = simulate(&[
            "--file",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success() && err.contains(says), "{text}: {err}");
    }
    let run = simulate(&["no-such-scenario", "--out", out.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&run.stderr).contains("double-window"));
}

#[test]
fn a_delaying_rule_gives_the_upstream_the_whole_rate_where_a_refusing_one_wastes_it() {
    let (_dir, out) = built_in("shaped-vs-refused");
    let s = summary(&out);
    let rows = &s["algorithms"];
    let (delayed, refused) = (totals(rows, "delayed"), totals(rows, "refused"));
    let n = |t: &Value, field: &str| t[field].as_f64().unwrap();
    for t in [delayed, refused] {
        // The same calls, and what reaches the upstream within any second
        // is no more than the rate and the burst: ten and five.
        assert_eq!(n(t, "admitted") + n(t, "denied"), 60.0 + 5.0 * 30.0 + 120.0);
        assert_eq!((n(t, "limit"), n(t, "burst")), (10.0, 5.0));
        assert!(n(t, "peak") <= 15.0, "{t}");
    }
    // Held calls fill max_reserved in the flood and never pass it, nor
    // wait longer than `max`; the refusing run holds none.
    assert_eq!(n(delayed, "most_held"), 20.0);
    assert!(n(delayed, "longest_delay") <= 2.0, "{delayed}");
    assert_eq!(n(refused, "most_held"), 0.0);
    // Delaying refuses less and forwards more: about twice as much here.
    assert!(n(delayed, "denied") < n(refused, "denied"), "{rows}");
    assert!(
        n(delayed, "admitted") > 1.8 * n(refused, "admitted"),
        "{rows}"
    );
    for file in ["upstream.svg", "held.svg"] {
        let svg = std::fs::read_to_string(out.join(file)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("polyline"),
            "{file}"
        );
    }
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(report.contains("most held at once"), "{report}");
}
