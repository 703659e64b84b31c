//! The Prometheus recorder: installed once per process, rendered by
//! `/metrics`.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// How often the samples that histograms recorded are folded into their
/// buckets. Until then each sample is held as it came, eight bytes apiece,
/// so between two folds a server holds what it recorded in this time: a
/// second's worth of store calls and proxied requests.
const UPKEEP: Duration = Duration::from_secs(1);

/// A handle on the process's recorder.
#[derive(Clone)]
pub struct Metrics(PrometheusHandle);

impl Metrics {
    /// The process's recorder, installed on first use, with a thread that
    /// folds histogram samples into their buckets every second. A process
    /// has one global recorder, so every server in it (tests start several)
    /// shares it and its thread. `None` when another recorder is installed
    /// already, or the thread cannot start.
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
                    // A held request waits up to its rule's `max`, at most
                    // an hour: buckets of its own, or every wait would be
                    // past the store's last.
                    .set_buckets_for_metric(
                        Matcher::Full("sluice_held_wait_seconds".into()),
                        &[
                            0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                            300.0, 3600.0,
                        ],
                    )
                    .ok()?
                    .build_recorder();
                let handle = recorder.handle();
                // A recorder built this way leaves the folding to its owner;
                // a scrape of `/metrics` folds too, but nothing says anyone
                // scrapes, and the samples would pile up without end. A
                // thread of its own, since the first server in a process
                // may not have started its runtime yet; started before the
                // recorder is installed, so that no sample is recorded
                // without it.
                let upkeep = handle.clone();
                std::thread::Builder::new()
                    .name("sluice-metrics".into())
                    .spawn(move || {
                        loop {
                            std::thread::sleep(UPKEEP);
                            upkeep.run_upkeep();
                        }
                    })
                    .ok()?;
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
