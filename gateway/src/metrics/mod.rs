//! Process-wide counters, one block of atomics per core, and their Prometheus text rendering.
//! Cores write only their own block (relaxed atomics); `/metrics` reads all of them. Per-stream
//! floors/tails are published by each core as a pre-rendered snapshot it refreshes on its
//! timer, because a log may only be touched by its owning core.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use log_store::ResumeClass;

use crate::proto::request_log::RouteClass;

mod families;
mod histogram;
pub mod jwks;
pub mod mcp;
mod process;

pub use histogram::{Histogram, PUBLISH_ROUTES};

/// The resume classes counted in `/metrics` (the resume planner's classes, shared with the
/// MCP front), in the order of a core's counters.
const RESUME_CLASSES: [ResumeClass; 7] = [
    ResumeClass::Aligned,
    ResumeClass::Replay,
    ResumeClass::UpToDate,
    ResumeClass::Truncated,
    ResumeClass::BeyondTail,
    ResumeClass::WrongEpoch,
    ResumeClass::OtherStream,
];

/// The resume classes that serve events (the others are refusals), by their planner labels.
pub const SERVED_RESUMES: [&str; 3] = ["aligned", "replay", "up-to-date"];

/// Where a served resume's class (its planner label) is in [`SERVED_RESUMES`].
pub fn served_resume_index(label: &str) -> Option<usize> {
    SERVED_RESUMES.iter().position(|l| *l == label)
}

/// Adds `v` to a counter in the calling core's own block, on that core's thread: cores write
/// only their own block, so a relaxed load and store (no locked read-modify-write, which the
/// per-send counters paid on every completion) loses no update, and a reader sees each store
/// whole.
#[inline]
pub fn bump_own(counter: &AtomicU64, v: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(v), Relaxed);
}

/// The `class` label of `gateway_resumes_total` (Prometheus label values use `_`).
fn resume_label(c: ResumeClass) -> &'static str {
    match c {
        ResumeClass::UpToDate => "up_to_date",
        other => other.label(),
    }
}

/// Counters of one core.
#[derive(Debug, Default)]
pub struct CoreMetrics {
    pub connections: AtomicU64,
    pub subscribers: AtomicU64,
    pub accepted_total: AtomicU64,
    pub handoffs_out_total: AtomicU64,
    pub handoffs_in_total: AtomicU64,
    /// `gateway_requests_total`: requests answered, by route class and status class.
    pub requests: [[AtomicU64; STATUS_CLASSES.len()]; RouteClass::ALL.len()],
    /// Access-log lines dropped because the writer's queue was full.
    pub access_log_dropped_total: AtomicU64,
    pub events_appended_total: AtomicU64,
    /// Keyed publishes answered from the `Idempotency-Key` table (stored nothing); the core's
    /// table counts them itself (`streams::idempotency::Keys`).
    pub idempotent_replays_total: Arc<AtomicU64>,
    /// Cluster mode: events sent to JetStream, messages applied to the local logs, publishes
    /// answered 503 unconfirmed, applies paused by a full disk, subscribes that waited for
    /// this node to catch up and those that gave up.
    pub cluster_publishes_total: AtomicU64,
    pub cluster_applied_total: AtomicU64,
    pub cluster_unconfirmed_total: AtomicU64,
    pub cluster_apply_stalls_total: AtomicU64,
    pub cluster_catchup_waits_total: AtomicU64,
    pub cluster_catchup_timeouts_total: AtomicU64,
    /// Messages covered by the latest stored snapshot of each of this core's shards (summed):
    /// how far back a node rebuilding from a snapshot would start.
    pub cluster_snapshot_messages: AtomicU64,
    /// Chunks written for snapshots too large for one KV value.
    pub cluster_snapshot_chunks_total: AtomicU64,
    /// Applied records whose publisher predicted another seq (MCP), stored as error records.
    pub cluster_seq_mismatches_total: AtomicU64,
    /// Messages delivered again after they were applied (ignored).
    pub cluster_redeliveries_total: AtomicU64,
    /// Messages quarantined, by `streams::quarantine::Reason::ALL` index.
    pub cluster_quarantined_total: [AtomicU64; 9],
    pub events_sent_total: AtomicU64,
    pub events_confirmed_total: AtomicU64,
    pub bytes_sent_total: AtomicU64,
    pub bytes_confirmed_total: AtomicU64,
    pub truncated_closes_total: AtomicU64,
    pub lagging_closes_total: AtomicU64,
    pub inflight_bytes: AtomicU64,
    pub lag_events_max: AtomicU64,
    pub parked_windows: AtomicU64,
    /// Answers queued on keep-alive connections and not yet taken by the kernel (bytes,
    /// sampled at the tick); bounded per connection by `--pipeline-answer-bytes-max`.
    pub answer_bytes_queued: AtomicU64,
    /// Completions of connection operations (recv, send, POLLOUT, TX timestamps, watch) that
    /// matched no operation in flight on their connection: ignored, never acted on.
    pub unmatched_completions_total: AtomicU64,
    pub cq_stale_slots_total: AtomicU64,
    pub log_fsyncs_total: AtomicU64,
    pub log_syncfs_total: AtomicU64,
    /// Streams in the core's logs.
    pub streams: AtomicU64,
    /// Read-aheads of cold log pages before a replay's send.
    pub prefetches_total: AtomicU64,
    pub log_sync_failures_total: AtomicU64,
    /// Segment rolls of this core's logs by how the next segment came (stored at the tick):
    /// prepared in the background, made or waited for on the reactor, or after a forced flush.
    pub log_rolls_prepared_total: AtomicU64,
    pub log_rolls_inline_total: AtomicU64,
    pub log_rolls_flushed_total: AtomicU64,
    /// ACK confirmations received as SO_TIMESTAMPING TX_ACK completions.
    pub tx_ack_timestamps_total: AtomicU64,
    /// Subscribers that fell back to SIOCOUTQ accounting.
    pub outq_fallbacks_total: AtomicU64,
    /// Subscriptions ended in-band because their token expired.
    pub token_expired_closes_total: AtomicU64,
    /// Requests refused 401 / 403 by authentication (the gate's count, copied at the tick).
    pub auth_refusals_total: AtomicU64,
    /// Requests refused 403 because their `Origin` is not allowed (copied at the tick).
    pub origin_refusals_total: AtomicU64,
    /// Streams removed by `DELETE` and by idle expiry.
    pub streams_deleted_total: AtomicU64,
    pub streams_expired_total: AtomicU64,
    /// Stream creations refused at `--streams-max`.
    pub streams_exhausted_total: AtomicU64,
    /// Stream creations refused at `--streams-per-subject-max`.
    pub subject_quota_total: AtomicU64,
    /// Connections refused at `--connections-per-ip-max`.
    pub per_ip_refusals_total: AtomicU64,
    /// TLS handshakes completed, and TLS sessions that failed (bad handshakes, plaintext or
    /// garbage on the TLS port, handshake timeouts).
    pub tls_handshakes_total: AtomicU64,
    /// 1 when the listener serves TLS: handshakes and answers in userspace (rustls).
    pub tls_userspace: AtomicU64,
    /// 1 while this core hands TLS subscribers' transmit keys to the kernel (`--tls-kernel
    /// auto` on a kernel that has not refused the `tls` ULP); 0 when they go to the record
    /// layer. Subscribers whose keys the kernel took, and hand-overs it refused.
    pub tls_kernel: AtomicU64,
    pub tls_kernel_subscribers_total: AtomicU64,
    pub tls_kernel_refusals_total: AtomicU64,
    pub tls_handshake_failures_total: AtomicU64,
    /// TLS subscribers whose transmit keys moved to the gateway's own record layer (sealing
    /// straight into the batch), and streams ended because a key sealed its record limit.
    pub tls_record_layer_subscribers_total: AtomicU64,
    pub tls_key_exhausted_closes_total: AtomicU64,
    /// Receives deferred because `--request-buffer-bytes-max` was reached.
    pub request_buffer_waits_total: AtomicU64,
    /// Requests answered 408 because their head, or an API request's whole body, took too long.
    pub head_timeouts_total: AtomicU64,
    pub body_timeouts_total: AtomicU64,
    pub resumes: [AtomicU64; 7],
    /// `gateway_publish_duration_seconds`, by [`PUBLISH_ROUTES`].
    pub publish_duration: [Histogram; 2],
    pub fsync_duration: Histogram,
    /// `gateway_turn_duration_seconds`: the work of each loop turn, its wait excluded.
    pub turn_duration: Histogram,
    /// `gateway_mcp_upstream_call_seconds` (this core's MCP parts'; summed over cores at export).
    pub mcp_upstream_call: Histogram,
    /// `gateway_delivery_lag_seconds`.
    pub delivery_lag: Histogram,
    /// `gateway_resume_first_event_seconds`, by [`SERVED_RESUMES`].
    pub first_event: [Histogram; 3],
    /// Ticks this core ran (not exported: the systemd watchdog's proof the reactor turns).
    pub ticks: AtomicU64,
    /// Pre-rendered `gateway_stream_*` lines for this core's streams.
    pub streams_snapshot: Mutex<String>,
    /// This core's MCP part's figures for the `gateway_mcp_*` lines (summed over the cores
    /// at export; `None` on a core with no MCP part).
    pub mcp_snapshot: Mutex<Option<mcp::McpFigures>>,
}

/// The `status` label of `gateway_requests_total`.
pub const STATUS_CLASSES: [&str; 4] = ["2xx", "3xx", "4xx", "5xx"];

impl CoreMetrics {
    /// Counts a request answered with `status` (1xx and nonsense are not answers).
    pub fn request(&self, route: RouteClass, status: u16) {
        if let 200..=599 = status {
            bump_own(&self.requests[route.index()][status as usize / 100 - 2], 1);
        }
    }

    /// Requests answered, every route and status.
    pub fn requests_answered(&self) -> u64 {
        self.requests
            .iter()
            .flatten()
            .map(|c| c.load(Relaxed))
            .sum()
    }

    pub fn resume(&self, class: ResumeClass) {
        let i = RESUME_CLASSES
            .iter()
            .position(|c| *c == class)
            .expect("listed");
        self.resumes[i].fetch_add(1, Relaxed);
    }
}

/// Writes a family's `# HELP` and `# TYPE` lines.
pub fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The configured limits exported as `gateway_limit{limit}` (set once at start), so alerts can
/// compare a gauge with its limit without knowing the flags.
static LIMITS: std::sync::OnceLock<Vec<(&'static str, u64)>> = std::sync::OnceLock::new();

/// Sets the limits `/metrics` exports (the first call wins).
pub fn set_limits(limits: Vec<(&'static str, u64)>) {
    let _ = LIMITS.set(limits);
}

fn limits(out: &mut String) {
    let Some(l) = LIMITS.get().filter(|l| !l.is_empty()) else {
        return;
    };
    family(
        out,
        "gateway_limit",
        "gauge",
        "A configured limit (the flag's value), by name.",
    );
    for (name, v) in l {
        let _ = writeln!(out, "gateway_limit{{limit=\"{name}\"}} {v}");
    }
}

/// Renders all cores' counters as Prometheus text exposition format (0.0.4): every family
/// with `# HELP` and `# TYPE`, none without a sample.
pub fn render(cores: &[CoreMetrics]) -> String {
    let mut out = String::with_capacity(16 * 1024);
    process::build_and_process(&mut out);
    jwks::render(&mut out);
    limits(&mut out);
    for f in families::FAMILIES {
        family(&mut out, f.name, f.kind, f.help);
        for (labels, get) in f.series {
            let sep = if labels.is_empty() { "" } else { "," };
            for (c, m) in cores.iter().enumerate() {
                let v = get(m).load(Relaxed);
                let _ = writeln!(out, "{}{{core=\"{c}\"{sep}{labels}}} {v}", f.name);
            }
        }
    }
    family(
        &mut out,
        "gateway_resumes_total",
        "counter",
        "Subscribes with Last-Event-ID, by the resume planner's class.",
    );
    for (c, m) in cores.iter().enumerate() {
        for (i, class) in RESUME_CLASSES.iter().enumerate() {
            let _ = writeln!(
                out,
                "gateway_resumes_total{{core=\"{c}\",class=\"{}\"}} {}",
                resume_label(*class),
                m.resumes[i].load(Relaxed)
            );
        }
    }
    requests(&mut out, cores);
    histogram::histograms(&mut out, cores);
    per_stream(&mut out, cores);
    let mcp: Vec<_> = cores
        .iter()
        .filter_map(|m| m.mcp_snapshot.lock().expect("metrics lock").clone())
        .collect();
    mcp::render(&mut out, mcp.iter());
    out
}

/// `gateway_requests_total{route,status}`: every route class and status class, per core.
fn requests(out: &mut String, cores: &[CoreMetrics]) {
    family(
        out,
        "gateway_requests_total",
        "counter",
        "Requests answered, by route class and status class (a subscription when it ends).",
    );
    for (c, m) in cores.iter().enumerate() {
        for route in RouteClass::ALL {
            for (s, status) in STATUS_CLASSES.iter().enumerate() {
                let v = m.requests[route.index()][s].load(Relaxed);
                let _ = writeln!(
                    out,
                    "gateway_requests_total{{core=\"{c}\",route=\"{}\",status=\"{status}\"}} {v}",
                    route.label()
                );
            }
        }
    }
}

/// `gateway_stream_*`, only when some core exported streams (`--metrics-per-stream`).
fn per_stream(out: &mut String, cores: &[CoreMetrics]) {
    let snaps: Vec<String> = cores
        .iter()
        .map(|m| m.streams_snapshot.lock().expect("metrics lock").clone())
        .collect();
    if snaps.iter().all(String::is_empty) {
        return;
    }
    for (name, what) in [
        ("gateway_stream_floor", "first retained"),
        ("gateway_stream_tail", "last appended"),
        ("gateway_stream_visible_tail", "last visible (durable)"),
    ] {
        family(
            out,
            name,
            "gauge",
            &format!("The {what} sequence number of a stream (--metrics-per-stream)."),
        );
        for s in &snaps {
            for l in s
                .lines()
                .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
            {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
}

/// One stream's bounds as snapshot lines.
pub fn stream_lines(out: &mut String, shard: u32, name: &str, floor: u64, tail: u64, vis: u64) {
    for (metric, v) in [
        ("gateway_stream_floor", floor),
        ("gateway_stream_tail", tail),
        ("gateway_stream_visible_tail", vis),
    ] {
        let _ = writeln!(out, "{metric}{{shard=\"{shard}\",stream=\"{name}\"}} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_core_and_class() {
        let cores: Vec<CoreMetrics> = (0..2).map(|_| CoreMetrics::default()).collect();
        cores[1].events_appended_total.fetch_add(5, Relaxed);
        cores[0].resume(ResumeClass::Aligned);
        stream_lines(
            &mut cores[0].streams_snapshot.lock().unwrap(),
            3,
            "s",
            1,
            9,
            8,
        );
        let t = render(&cores);
        assert!(t.contains("gateway_events_appended_total{core=\"1\"} 5\n"));
        assert!(t.contains("gateway_subscriber_closes_total{core=\"0\",reason=\"lagging\"} 0\n"));
        assert!(t.contains("gateway_resumes_total{core=\"0\",class=\"aligned\"} 1\n"));
        assert!(t.contains("gateway_resumes_total{core=\"1\",class=\"other_stream\"} 0\n"));
        assert!(t.contains("gateway_stream_tail{shard=\"3\",stream=\"s\"} 9\n"));
    }

    #[test]
    fn quarantine_reasons_are_labelled_by_their_index() {
        use crate::streams::quarantine::Reason;
        let cores = [CoreMetrics::default()];
        for (i, r) in Reason::ALL.iter().enumerate() {
            cores[0].cluster_quarantined_total[r.index()].fetch_add(i as u64 + 10, Relaxed);
        }
        let t = render(&cores);
        for (i, r) in Reason::ALL.iter().enumerate() {
            let line = format!(
                "gateway_cluster_quarantined_total{{core=\"0\",reason=\"{}\"}} {}\n",
                r.label(),
                i + 10
            );
            assert!(t.contains(&line), "{line}");
        }
    }

    /// Every `# TYPE` has a `# HELP` just before it and at least one sample after it.
    #[test]
    fn every_family_has_help_and_a_sample() {
        let cores: Vec<CoreMetrics> = (0..2).map(|_| CoreMetrics::default()).collect();
        let t = render(&cores);
        let lines: Vec<&str> = t.lines().collect();
        let mut families = 0;
        for (i, l) in lines.iter().enumerate() {
            let Some(rest) = l.strip_prefix("# TYPE ") else {
                continue;
            };
            families += 1;
            let name = rest.split(' ').next().unwrap();
            assert!(
                i > 0 && lines[i - 1].starts_with(&format!("# HELP {name} ")),
                "{name}: no HELP"
            );
            let next = lines.get(i + 1).copied().unwrap_or("");
            assert!(
                next.starts_with(name) && !next.starts_with('#'),
                "{name}: no sample (next line {next:?})"
            );
        }
        assert!(families >= 45, "{families}");
        // No per-stream families when no stream is exported.
        assert!(!t.contains("gateway_stream_tail"));
    }

    #[test]
    fn histograms_are_cumulative_and_summed_over_cores() {
        let cores: Vec<CoreMetrics> = (0..2).map(|_| CoreMetrics::default()).collect();
        let ms = std::time::Duration::from_millis;
        cores[0].fsync_duration.observe(ms(0)); // le 50 µs
        cores[1].fsync_duration.observe(ms(3)); // le 5 ms
        cores[1].fsync_duration.observe(ms(9_000)); // +Inf
        let t = render(&cores);
        for want in [
            "gateway_fsync_duration_seconds_bucket{le=\"0.00005\"} 1\n",
            "gateway_fsync_duration_seconds_bucket{le=\"0.0025\"} 1\n",
            "gateway_fsync_duration_seconds_bucket{le=\"0.005\"} 2\n",
            "gateway_fsync_duration_seconds_bucket{le=\"5\"} 2\n",
            "gateway_fsync_duration_seconds_bucket{le=\"+Inf\"} 3\n",
            "gateway_fsync_duration_seconds_sum 9.003\n",
            "gateway_fsync_duration_seconds_count 3\n",
            "gateway_publish_duration_seconds_count{route=\"batch\"} 0\n",
        ] {
            assert!(t.contains(want), "{want} in\n{t}");
        }
    }
}
