//! The Grafana dashboard in `deploy/grafana/sluice.json` is valid JSON, and
//! every metric its queries read is one that Sluice's code emits (a
//! histogram's `_bucket` series included, which the exporter writes because
//! it is given buckets).

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The metric names in `text`: `sluice_` and what follows of [a-z_].
fn names(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("sluice_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        found.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    found
}

#[test]
fn the_grafana_dashboard_reads_only_metrics_sluice_emits() {
    let text = std::fs::read_to_string(repo().join("deploy/grafana/sluice.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(panel["title"].is_string(), "{panel}");
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    assert!(exprs.len() >= 10, "{} queries", exprs.len());
    let queried: BTreeSet<String> = exprs.iter().flat_map(|e| names(e)).collect();

    let mut files = Vec::new();
    sources(&repo().join("crates"), &mut files);
    let code: String = files
        .iter()
        .filter(|f| f.to_string_lossy().contains("/src/"))
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let metrics_rs =
        std::fs::read_to_string(repo().join("crates/sluice-server/src/base/metrics.rs")).unwrap();
    assert!(
        metrics_rs.contains("set_buckets"),
        "histograms need buckets for `_bucket` series"
    );
    for name in &queried {
        let emitted = name
            .strip_suffix("_bucket")
            .filter(|base| code.contains(&format!("\"{base}\"")))
            .unwrap_or(name);
        assert!(
            code.contains(&format!("\"{emitted}\"")),
            "the dashboard reads {name}, which no code emits"
        );
    }
    // The decisions, the store and the connections are all on it.
    for must in [
        "sluice_decisions_total",
        "sluice_store_seconds_bucket",
        "sluice_store_errors_total",
        "sluice_connections_open",
    ] {
        assert!(queried.contains(must), "no panel reads {must}");
    }
}
