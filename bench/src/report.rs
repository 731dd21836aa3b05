//! Turning a run's observations into the report: figures (events/s, latency percentiles,
//! server CPU per million delivered events, memory) as a plain-text table and as JSON.
//!
//! Pure: takes [`LoadResult`]s, returns values and strings; prints nothing itself.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::checker::CheckCounts;
use crate::load::{LoadResult, ServerFigures};
use crate::resume_class::{ByClass, ResumeClass};

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Percentiles {
    /// From a histogram of nanoseconds.
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let us = |v: u64| v as f64 / 1000.0;
        Self {
            count: h.len(),
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// The quantiles of [`latency_cdf`]: the body of the distribution in tenths, then its tail in
/// nines, then the maximum.
pub const CDF_QUANTILES: [f64; 19] = [
    0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995,
    0.9999, 0.99999, 1.0,
];

/// `[quantile, microseconds]` pairs of a histogram of nanoseconds at [`CDF_QUANTILES`] (empty
/// for an empty histogram): enough points to draw its distribution (`scripts/plot.py`).
pub fn latency_cdf(h: &Histogram<u64>) -> Vec<[f64; 2]> {
    if h.is_empty() {
        return Vec::new();
    }
    CDF_QUANTILES
        .iter()
        .map(|&q| [q, h.value_at_quantile(q) as f64 / 1000.0])
        .collect()
}

/// Resumes of one class (as `X-Resume-Class` announced it) and their latencies.
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    pub class: &'static str,
    /// Resumes answered 200 with this class (timed or not).
    pub resumes: u64,
    /// Reconnect (the resume's `connect()`) → 200 head; resumes after a bench cut only.
    pub to_head: Percentiles,
    /// Reconnect → first event on the resumed connection.
    pub to_first_event: Percentiles,
}

impl ClassReport {
    /// One entry per class that occurred (resumed or timed at least once).
    pub fn all(b: &ByClass) -> Vec<ClassReport> {
        ResumeClass::ALL
            .iter()
            .map(|c| {
                let i = c.index();
                ClassReport {
                    class: c.label(),
                    resumes: b.resumes[i],
                    to_head: Percentiles::of(&b.to_head_ns[i]),
                    to_first_event: Percentiles::of(&b.to_first_event_ns[i]),
                }
            })
            .filter(|r| r.resumes > 0 || r.to_head.count > 0)
            .collect()
    }
}

/// Server resource figures over the measured window.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ServerReport {
    #[serde(flatten)]
    pub raw: ServerFigures,
    /// Server CPU-seconds per million delivered events (None when nothing was delivered).
    pub cpu_secs_per_million_delivered: Option<f64>,
    /// Server CPU per delivered event, microseconds.
    pub cpu_us_per_delivered_event: Option<f64>,
}

/// One scenario's report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub label: String,
    pub subscribers: usize,
    pub subscribers_up: usize,
    pub subscriber_failures: u64,
    pub published: u64,
    pub publish_errors: u64,
    pub published_per_sec: f64,
    pub delivered: u64,
    pub delivered_per_sec: f64,
    pub window_secs: f64,
    pub latency: Percentiles,
    /// The (fast) subscribers' latency distribution: `[quantile, us]` at [`CDF_QUANTILES`].
    pub latency_cdf_us: Vec<[f64; 2]>,
    pub latency_slow: Percentiles,
    pub resume: Percentiles,
    /// Cut → 200 response head of the resumed connection.
    pub resume_headers: Percentiles,
    /// Per class announced by the server (`X-Resume-Class`; `none` without the header).
    pub resume_classes: Vec<ClassReport>,
    pub check: CheckCounts,
    pub check_slow: CheckCounts,
    pub violations: u64,
    pub slow_backlog_events: u64,
    pub cuts: u64,
    pub server_closes: u64,
    pub reconnects: u64,
    pub http_410: u64,
    pub server: Option<ServerReport>,
    pub bench_cpu_secs: f64,
    /// Server-reported counters over the run (from `--metrics-url`), e.g. resume classes.
    pub server_metrics: std::collections::BTreeMap<String, f64>,
    /// Idle: server RSS growth per connected subscriber, bytes.
    pub idle_bytes_per_connection: Option<f64>,
    /// Idle: the same at the end of the hold (after the server returned its set-up buffers).
    pub idle_bytes_per_held_connection: Option<f64>,
    pub errors: Vec<String>,
}

impl Report {
    /// Build from a run.
    pub fn new(scenario: &str, label: &str, r: &LoadResult) -> Self {
        let delivered = r.fast.events + r.slow.events;
        let per_sec = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let server = r.server.map(|raw| {
            let per_m = (delivered > 0).then(|| raw.cpu_secs / delivered as f64 * 1e6);
            ServerReport {
                raw,
                cpu_secs_per_million_delivered: per_m,
                cpu_us_per_delivered_event: per_m,
            }
        });
        let per_connection = |after: Option<u64>| match (r.idle_rss_before_kib, after) {
            (Some(b), Some(a)) if r.subscribers_up > 0 => {
                Some((a as f64 - b as f64) * 1024.0 / r.subscribers_up as f64)
            }
            _ => None,
        };
        let idle_bytes_per_connection = per_connection(r.idle_rss_after_kib);
        let idle_bytes_per_held_connection = per_connection(r.idle_rss_end_kib);
        let violations =
            r.fast.violations() + r.slow.violations() + r.subscriber_failures + r.publish_errors;
        Self {
            scenario: scenario.into(),
            label: label.into(),
            subscribers: r.subscribers,
            subscribers_up: r.subscribers_up,
            subscriber_failures: r.subscriber_failures,
            published: r.published,
            publish_errors: r.publish_errors,
            published_per_sec: per_sec(r.published, r.publish_secs),
            delivered,
            delivered_per_sec: per_sec(delivered, r.window_secs),
            window_secs: r.window_secs,
            latency: Percentiles::of(&r.latency_fast_ns),
            latency_cdf_us: latency_cdf(&r.latency_fast_ns),
            latency_slow: Percentiles::of(&r.latency_slow_ns),
            resume: Percentiles::of(&r.resume_ns),
            resume_headers: Percentiles::of(&r.resume_headers_ns),
            resume_classes: ClassReport::all(&r.resume_by_class),
            check: r.fast,
            check_slow: r.slow,
            violations,
            slow_backlog_events: r.slow_backlog_events,
            cuts: r.cuts,
            server_closes: r.server_closes,
            reconnects: r.reconnects,
            http_410: r.http_410,
            server,
            bench_cpu_secs: r.bench_cpu_secs,
            server_metrics: Default::default(),
            idle_bytes_per_connection,
            idle_bytes_per_held_connection,
            errors: r.errors.clone(),
        }
    }

    /// A plain-text table.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let _ = writeln!(o, "== {} [{}]", self.scenario, self.label);
        let mut rows = Rows(o);
        self.delivery_rows(&mut rows);
        self.resume_rows(&mut rows);
        self.server_rows(&mut rows);
        self.check_rows(&mut rows);
        let mut o = rows.0;
        for e in &self.errors {
            let _ = writeln!(o, "  error: {e}");
        }
        o
    }

    /// Subscribers, throughput and latencies (fast and slow readers).
    fn delivery_rows(&self, rows: &mut Rows) {
        let mut row = |k: &str, v: String| rows.row(k, v);
        row(
            "subscribers up / wanted",
            format!("{} / {}", self.subscribers_up, self.subscribers),
        );
        if self.published > 0 || self.delivered > 0 {
            row(
                "published events (events/s)",
                format!("{} ({:.0})", self.published, self.published_per_sec),
            );
            row(
                "delivered events (events/s)",
                format!("{} ({:.0})", self.delivered, self.delivered_per_sec),
            );
            row("window s", format!("{:.2}", self.window_secs));
            let l = &self.latency;
            row(
                "latency p50/p99/p99.9/max us",
                format!(
                    "{:.0} / {:.0} / {:.0} / {:.0}",
                    l.p50_us, l.p99_us, l.p999_us, l.max_us
                ),
            );
        }
        if self.latency_slow.count > 0 {
            let l = &self.latency_slow;
            row(
                "slow: latency p50/p99/max us",
                format!("{:.0} / {:.0} / {:.0}", l.p50_us, l.p99_us, l.max_us),
            );
            row(
                "slow: backlog events at end",
                self.slow_backlog_events.to_string(),
            );
        }
    }

    /// Cuts, resume latencies, and per resume class.
    fn resume_rows(&self, rows: &mut Rows) {
        let mut row = |k: &str, v: String| rows.row(k, v);
        if self.cuts > 0 || self.resume.count > 0 {
            let r = &self.resume;
            row(
                "cuts / resumes measured",
                format!("{} / {}", self.cuts, r.count),
            );
            row(
                "resume p50/p99/p99.9/max us",
                format!(
                    "{:.0} / {:.0} / {:.0} / {:.0}",
                    r.p50_us, r.p99_us, r.p999_us, r.max_us
                ),
            );
            let h = &self.resume_headers;
            row(
                "  of which to 200 head p50/p99 us",
                format!("{:.0} / {:.0}", h.p50_us, h.p99_us),
            );
        }
        for c in &self.resume_classes {
            let (h, f) = (&c.to_head, &c.to_first_event);
            row(
                &format!("resume [{}] n / timed", c.class),
                format!("{} / {}", c.resumes, f.count),
            );
            row(
                &format!("  [{}] to head p50/p99/max us", c.class),
                format!("{:.0} / {:.0} / {:.0}", h.p50_us, h.p99_us, h.max_us),
            );
            row(
                &format!("  [{}] to 1st event p50/p99/max us", c.class),
                format!("{:.0} / {:.0} / {:.0}", f.p50_us, f.p99_us, f.max_us),
            );
        }
    }

    /// The server's CPU and memory, the bench's own CPU, the server metrics that moved.
    fn server_rows(&self, rows: &mut Rows) {
        let mut row = |k: &str, v: String| rows.row(k, v);
        if let Some(s) = &self.server {
            row("server cpu s", format!("{:.2}", s.raw.cpu_secs));
            row(
                "server runnable-but-waiting s",
                format!("{:.2}", s.raw.runqueue_wait_secs),
            );
            if let Some(v) = s.cpu_secs_per_million_delivered {
                row(
                    "server cpu s / 1M delivered",
                    format!("{v:.2} ({v:.2} us/event)"),
                );
            }
            row(
                "server rss start/end/peak KiB",
                format!(
                    "{} / {} / {}",
                    s.raw.rss_start_kib, s.raw.rss_end_kib, s.raw.rss_peak_sampled_kib
                ),
            );
            row("server VmHWM KiB", s.raw.hwm_kib.to_string());
        }
        if self.window_secs > 0.0 && self.bench_cpu_secs > 0.0 {
            row(
                "bench cpu s (share of one core)",
                format!(
                    "{:.2} ({:.0}%)",
                    self.bench_cpu_secs,
                    100.0 * self.bench_cpu_secs / self.window_secs
                ),
            );
        }
        for (k, v) in self.server_metrics.iter().filter(|(_, v)| **v != 0.0) {
            row(&format!("server metric {k}"), format!("{v:.0}"));
        }
        if let Some(b) = self.idle_bytes_per_connection {
            row("server bytes per idle connection", format!("{b:.0}"));
        }
        if let Some(b) = self.idle_bytes_per_held_connection {
            row("server bytes per held connection", format!("{b:.0}"));
        }
    }

    /// The checker's counts (fast and slow subscribers summed), closes and failures.
    fn check_rows(&self, rows: &mut Rows) {
        let mut row = |k: &str, v: String| rows.row(k, v);
        let c = &self.check;
        row(
            "check events/gaps/missing/dups/reord",
            format!(
                "{} / {} / {} / {} / {}",
                c.events,
                c.gaps + self.check_slow.gaps,
                c.missing_events + self.check_slow.missing_events,
                c.duplicates + self.check_slow.duplicates,
                c.reorders + self.check_slow.reorders
            ),
        );
        row(
            "check id-mismatch/malformed/undeliv",
            format!(
                "{} / {} / {}",
                c.id_mismatches + self.check_slow.id_mismatches,
                c.malformed + self.check_slow.malformed,
                c.undelivered
            ),
        );
        row(
            "explicit truncations (410 / in-band)",
            format!(
                "{} ({} as 410)",
                c.explicit_truncations + self.check_slow.explicit_truncations,
                self.http_410
            ),
        );
        row(
            "server closes / reconnects",
            format!("{} / {}", self.server_closes, self.reconnects),
        );
        row(
            "subscriber failures / publish errors",
            format!("{} / {}", self.subscriber_failures, self.publish_errors),
        );
        row("VIOLATIONS", self.violations.to_string());
    }
}

/// A report table's rows: the key in a 34-wide column, then the value.
struct Rows(String);

impl Rows {
    fn row(&mut self, k: &str, v: String) {
        use std::fmt::Write;
        let _ = writeln!(self.0, "  {k:<34} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cdf_rises_through_every_quantile_to_the_maximum() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 120_000_000_000, 3).unwrap();
        for us in 1..=10_000u64 {
            h.record(us * 1000).unwrap();
        }
        let cdf = latency_cdf(&h);
        assert_eq!(cdf.len(), CDF_QUANTILES.len());
        let qs: Vec<f64> = cdf.iter().map(|p| p[0]).collect();
        assert_eq!(qs, CDF_QUANTILES);
        assert!(cdf.windows(2).all(|w| w[0][1] <= w[1][1]), "{cdf:?}");
        let at = |q: f64| cdf.iter().find(|p| p[0] == q).unwrap()[1];
        // 3 significant digits: within 0.1 % of the exact value.
        assert!((at(0.5) - 5000.0).abs() <= 5.0, "{}", at(0.5));
        assert!((at(0.99) - 9900.0).abs() <= 10.0, "{}", at(0.99));
        assert!((at(1.0) - 10_000.0).abs() <= 10.0, "{}", at(1.0));
        assert!(latency_cdf(&Histogram::<u64>::new(3).unwrap()).is_empty());
    }
}
