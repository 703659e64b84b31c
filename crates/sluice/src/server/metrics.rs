//! The Prometheus recorder: installed once per process, rendered by
//! `/metrics`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// A handle on the process's recorder.
#[derive(Clone)]
pub struct Metrics(PrometheusHandle);

impl Metrics {
    /// The process's recorder, installed on first use. A process has one
    /// global recorder, so every server in it (tests start several) shares it.
    pub fn global() -> Option<Metrics> {
        static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
        HANDLE
            .get_or_init(|| {
                let recorder = PrometheusBuilder::new()
                    .set_buckets(&[
                        0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025,
                        0.05, 0.1, 0.25,
                    ])
                    .ok()?
                    .build_recorder();
                let handle = recorder.handle();
                metrics::set_global_recorder(recorder).ok()?;
                Some(handle)
            })
            .clone()
            .map(Metrics)
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        self.0.render()
    }
}
