//! Latency histograms: fixed buckets of one core, summed over the cores at export.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{CoreMetrics, bump_own, family};

/// Upper bounds of the latency buckets, in microseconds: 50 µs to 5 s (the last bucket,
/// `+Inf`, is implicit).
const LATENCY_BOUNDS_US: [u64; 15] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 5_000_000,
];

/// A latency histogram of one core, written only by that core ([`bump_own`]); `/metrics`
/// sums the cores' buckets into one series per label set.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one duration (on the owning core's thread).
    pub fn observe(&self, d: std::time::Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = LATENCY_BOUNDS_US.partition_point(|b| *b < us);
        bump_own(&self.buckets[i], 1);
        bump_own(&self.sum_us, us);
    }
}

/// The route classes of `gateway_publish_duration_seconds`.
pub const PUBLISH_ROUTES: [&str; 2] = ["publish", "batch"];

/// Selects one histogram of a core's block.
type HistField = fn(&CoreMetrics) -> &Histogram;

/// A histogram family: name, help, and per label set the core's histogram.
struct HistFamily {
    name: &'static str,
    help: &'static str,
    series: &'static [(&'static str, HistField)],
}

const HISTOGRAMS: &[HistFamily] = &[
    HistFamily {
        name: "gateway_publish_duration_seconds",
        help: "Publish requests from their head's first byte to the answer queued (after durability under --fsync group/interval/always), by route class.",
        series: &[
            ("route=\"publish\"", |m| &m.publish_duration[0]),
            ("route=\"batch\"", |m| &m.publish_duration[1]),
        ],
    },
    HistFamily {
        name: "gateway_mcp_upstream_call_seconds",
        help: "MCP requests from their POST stream's creation (the request handed to the upstream) to the stream's completion (the upstream's response stored).",
        series: &[("", |m| &m.mcp_upstream_call)],
    },
    HistFamily {
        name: "gateway_delivery_lag_seconds",
        help: "From a stream's visible (durable) tail moving to the completion of each woken subscriber's next send carrying events: how long a durable event waits for the kernel to take it, for subscribers that keep up (a backlogged one's lag shows in gateway_lag_events_max).",
        series: &[("", |m| &m.delivery_lag)],
    },
    HistFamily {
        name: "gateway_resume_first_event_seconds",
        help: "Resumes (Last-Event-ID) from the request head's first byte to the completion of the first send carrying an event, by resume class (up_to_date waits for the next publish).",
        series: &[
            ("class=\"aligned\"", |m| &m.first_event[0]),
            ("class=\"replay\"", |m| &m.first_event[1]),
            ("class=\"up_to_date\"", |m| &m.first_event[2]),
        ],
    },
    HistFamily {
        name: "gateway_fsync_duration_seconds",
        help: "One fdatasync of a group commit, or one syncfs of a round of them (--fsync-scope filesystem), submitted to completed.",
        series: &[("", |m| &m.fsync_duration)],
    },
    HistFamily {
        name: "gateway_turn_duration_seconds",
        help: "Turns of the cores' loops, from the wake-up to the end of the turn's work (its wait for completions excluded, and with it the submission of its operations, where io_uring may run sends inline): a long one delays every event and answer of its core.",
        series: &[("", |m| &m.turn_duration)],
    },
];

/// Every histogram family, each series with cumulative `_bucket`s, `_sum` and `_count`.
pub(super) fn histograms(out: &mut String, cores: &[CoreMetrics]) {
    for HistFamily { name, help, series } in HISTOGRAMS {
        family(out, name, "histogram", help);
        for (labels, get) in *series {
            let sep = if labels.is_empty() { "" } else { "," };
            let mut cumulative = 0;
            for (i, bound) in LATENCY_BOUNDS_US.iter().map(Some).chain([None]).enumerate() {
                cumulative += cores
                    .iter()
                    .map(|m| get(m).buckets[i].load(Relaxed))
                    .sum::<u64>();
                let le = bound.map_or("+Inf".to_string(), |b| format!("{}", *b as f64 / 1e6));
                let _ = writeln!(
                    out,
                    "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
                );
            }
            let sum_us: u64 = cores.iter().map(|m| get(m).sum_us.load(Relaxed)).sum();
            let braces = if labels.is_empty() {
                String::new()
            } else {
                format!("{{{labels}}}")
            };
            let _ = writeln!(out, "{name}_sum{braces} {}", sum_us as f64 / 1e6);
            let _ = writeln!(out, "{name}_count{braces} {cumulative}");
        }
    }
}
