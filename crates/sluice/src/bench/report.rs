//! What a run measured: per-worker tallies (a latency histogram and counts
//! by outcome), merged into one result printed as text or JSON.

use std::io::Write;
use std::time::Duration;

use hdrhistogram::Histogram;

/// The outcomes of one protocol, in the order of [`Tally::counts`]. The last
/// one is always the error that got no answer (and so no latency).
#[derive(Debug, Clone, Copy)]
pub(super) enum Protocol {
    /// 2xx, 429, other status, transport error.
    Http,
    /// OK, OVER_LIMIT, UNKNOWN, error status or transport error.
    Grpc,
}

/// How many outcomes each protocol distinguishes.
pub(super) const OUTCOMES: usize = 4;
/// The index of the outcome that got no answer.
pub(super) const ERROR: usize = OUTCOMES - 1;

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
        }
    }

    /// JSON keys of the outcomes.
    fn keys(self) -> [&'static str; OUTCOMES] {
        match self {
            Protocol::Http => [
                "status_2xx",
                "status_429",
                "other_status",
                "transport_errors",
            ],
            Protocol::Grpc => ["ok", "over_limit", "unknown", "errors"],
        }
    }

    /// Text labels of the outcomes.
    fn labels(self) -> [&'static str; OUTCOMES] {
        match self {
            Protocol::Http => ["2xx", "429", "other status", "transport errors"],
            Protocol::Grpc => ["OK", "OVER_LIMIT", "UNKNOWN", "errors"],
        }
    }
}

/// One worker's measurements (or all of them, merged).
#[derive(Debug)]
pub(super) struct Tally {
    /// Latencies of answered requests, in microseconds.
    latency: Histogram<u64>,
    /// Requests by outcome, indexed as [`Protocol::keys`].
    counts: [u64; OUTCOMES],
    /// Cores the client process kept busy during the measured window, when
    /// known; set on the merged tally.
    pub(super) client_cpu: Option<f64>,
    /// What went wrong first (an error, or an answer other than allowed or
    /// limited), so that a run full of errors says why.
    first_problem: Option<String>,
}

impl Tally {
    /// An empty tally.
    pub(super) fn new() -> anyhow::Result<Self> {
        // Three significant digits, growing as slower answers arrive: a
        // worker that only sees sub-millisecond answers keeps a small
        // histogram, whatever the concurrency.
        let mut latency = Histogram::new(3)?;
        latency.auto(true);
        Ok(Tally {
            latency,
            counts: [0; OUTCOMES],
            client_cpu: None,
            first_problem: None,
        })
    }

    /// Counts an answered request and its latency.
    pub(super) fn answer(&mut self, outcome: usize, latency: Duration) {
        self.counts[outcome] += 1;
        // Auto-resizing makes every value recordable; zero is recorded as
        // the smallest value the histogram holds.
        let micros = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let _ = self.latency.record(micros);
    }

    /// Counts a request that got no answer.
    pub(super) fn error(&mut self) {
        self.counts[ERROR] += 1;
    }

    /// Keeps `why` if it is the first problem seen; formatted only then, so
    /// that a run full of errors does not format them all.
    pub(super) fn problem(&mut self, why: &dyn std::fmt::Display) {
        if self.first_problem.is_none() {
            self.first_problem = Some(why.to_string());
        }
    }

    /// Adds another worker's tally to this one.
    pub(super) fn merge(&mut self, other: &Tally) -> anyhow::Result<()> {
        self.latency.add(&other.latency)?;
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a += b;
        }
        if self.first_problem.is_none() {
            self.first_problem.clone_from(&other.first_problem);
        }
        Ok(())
    }
}

/// The result of a run.
#[derive(Debug)]
pub(super) struct Report<'a> {
    /// What was spoken.
    pub(super) protocol: Protocol,
    /// The server's `host:port`.
    pub(super) target: &'a str,
    /// The request, in a few words.
    pub(super) what: &'a str,
    /// Requests in flight.
    pub(super) concurrency: u32,
    /// Connections they were spread over.
    pub(super) connections: u32,
    /// The client runtime's threads.
    pub(super) client_threads: usize,
    /// The warm-up, left out.
    pub(super) warmup: Duration,
    /// The measured window.
    pub(super) window: Duration,
    /// What was measured.
    pub(super) tally: &'a Tally,
}

impl Report<'_> {
    /// Every request whose outcome is known, errors included.
    fn requests(&self) -> u64 {
        self.tally.counts.iter().sum()
    }

    /// Answered requests per second of the measured window; errors without
    /// an answer do not count, so a refusing server does not look fast.
    fn throughput(&self) -> f64 {
        let answered = self.requests() - self.tally.counts[ERROR];
        answered as f64 / self.window.as_secs_f64().max(1e-9)
    }

    /// The latency at quantile `q`, in milliseconds (0 without answers).
    fn ms(&self, q: f64) -> f64 {
        self.tally.latency.value_at_quantile(q) as f64 / 1000.0
    }

    /// The result as one JSON object.
    pub(super) fn json(&self) -> serde_json::Value {
        let h = &self.tally.latency;
        let outcomes: serde_json::Map<String, serde_json::Value> = self
            .protocol
            .keys()
            .iter()
            .zip(self.tally.counts)
            .map(|(k, n)| ((*k).to_owned(), n.into()))
            .collect();
        serde_json::json!({
            "protocol": self.protocol.name(),
            "target": self.target,
            "request": self.what,
            "concurrency": self.concurrency,
            "connections": self.connections,
            "client_threads": self.client_threads,
            "client_cpu": self.tally.client_cpu.map(|c| round(c, 2)),
            "warmup_s": self.warmup.as_secs_f64(),
            "duration_s": self.window.as_secs_f64(),
            "requests": self.requests(),
            "throughput_rps": round(self.throughput(), 1),
            "latency_ms": {
                "p50": self.ms(0.5),
                "p99": self.ms(0.99),
                "p999": self.ms(0.999),
                "max": h.max() as f64 / 1000.0,
                "mean": round(h.mean() / 1000.0, 3),
            },
            "outcomes": outcomes,
            "first_problem": self.tally.first_problem,
        })
    }

    /// The result as a few lines of text.
    pub(super) fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let h = &self.tally.latency;
        writeln!(
            out,
            "{} {} {}: {} in flight over {} connections, {:.2} s measured after {:.2} s warm-up",
            self.protocol.name(),
            self.target,
            self.what,
            self.concurrency,
            self.connections,
            self.window.as_secs_f64(),
            self.warmup.as_secs_f64(),
        )?;
        writeln!(
            out,
            "  requests    {} ({:.1} req/s answered)",
            self.requests(),
            self.throughput()
        )?;
        writeln!(
            out,
            "  latency     p50 {:.3} ms   p99 {:.3} ms   p99.9 {:.3} ms   max {:.3} ms   mean {:.3} ms",
            self.ms(0.5),
            self.ms(0.99),
            self.ms(0.999),
            h.max() as f64 / 1000.0,
            h.mean() / 1000.0,
        )?;
        let outcomes: Vec<String> = self
            .protocol
            .labels()
            .iter()
            .zip(self.tally.counts)
            .map(|(l, n)| format!("{l} {n}"))
            .collect();
        writeln!(out, "  outcomes    {}", outcomes.join("   "))?;
        if let Some(cpu) = self.tally.client_cpu {
            writeln!(
                out,
                "  client CPU  {cpu:.2} cores busy of {} threads{}",
                self.client_threads,
                if cpu >= 0.9 * self.client_threads as f64 {
                    " (saturated: the client may be the bottleneck)"
                } else {
                    ""
                }
            )?;
        }
        if let Some(why) = &self.tally.first_problem {
            writeln!(out, "  first problem: {why}")?;
        }
        Ok(())
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (v * p).round() / p
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn merged_tallies_add_counts_and_latencies() {
        let mut a = Tally::new().unwrap();
        let mut b = Tally::new().unwrap();
        for i in 1..=99u64 {
            a.answer(0, Duration::from_micros(i * 10));
        }
        b.answer(1, Duration::from_secs(2));
        b.error();
        b.problem(&"connection reset");
        b.problem(&"not kept");
        a.merge(&b).unwrap();
        let window = Duration::from_secs(2);
        a.client_cpu = Some(0.95);
        let r = Report {
            protocol: Protocol::Http,
            target: "h:1",
            what: "GET /",
            concurrency: 1,
            connections: 1,
            client_threads: 1,
            warmup: Duration::ZERO,
            window,
            tally: &a,
        };
        let j = r.json();
        assert_eq!(j["requests"], 101);
        assert_eq!(j["throughput_rps"], 50.0);
        assert_eq!(j["outcomes"]["status_429"], 1);
        assert_eq!(j["outcomes"]["transport_errors"], 1);
        assert!((j["latency_ms"]["p50"].as_f64().unwrap() - 0.5).abs() < 0.01);
        assert!((j["latency_ms"]["max"].as_f64().unwrap() - 2000.0).abs() < 2.0);
        let mut text = Vec::new();
        r.write_text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("transport errors 1"), "{text}");
        assert!(text.contains("first problem: connection reset"), "{text}");
        assert_eq!(j["first_problem"], "connection reset");
        assert_eq!(j["client_cpu"], 0.95);
        assert!(text.contains("saturated"), "{text}");
    }
}
