//! The `bench` command line: parses flags into a scenario, runs it with the `bench` library and
//! prints a table (or JSON). Exit status: 0 clean, 1 invariant violations (gaps, duplicates,
//! reorders, undelivered events, failed subscribers, publish errors), 2 the run could not be
//! carried out (bad flags, target down).
//!
//! It contains no protocol logic; see the library's modules for that.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use bench::durable;
use bench::floor;
use bench::load::{self, LoadConfig};
use bench::mcp;
use bench::meta::{self, Meta};
use bench::probe::{self, ProbeConfig};
use bench::procstat;
use bench::report::Report;
use bench::scrape;
use bench::target::{Bearer, IdStyle, PublishStyle, UrlTemplate};

/// Load generator and gap/duplicate checker for SSE pub/sub servers (the gateway, nginx+nchan).
///
/// Every scenario checks, per subscriber, that events arrive contiguous, gap-free and
/// duplicate-free (an explicit truncation notice — HTTP 410 or `event: truncated` — is counted
/// as explicit, not as a gap). Exit status: 0 clean, 1 violations, 2 run failed.
#[derive(Debug, Parser)]
#[command(name = "bench", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// S streams × K subscribers; N events per stream published at a rate or as fast as possible.
    Fanout {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        load: Load,
    },
    /// Like fanout, but subscribers are cut at random points (mid-event included) and resume
    /// with Last-Event-ID; reports resume latency (cut → first event), and per class the
    /// server announced in `X-Resume-Class` (reconnect → 200 head, → first event).
    ResumeStorm {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        load: Load,
        /// Subscriber connections cut per second.
        #[arg(long, default_value_t = 200.0)]
        cuts_per_sec: f64,
        /// Cut a subscriber only once it has read its socket to EAGAIN and its last byte read
        /// ends an event (not at a random byte), so the server's retained window can start at
        /// N+1 and the resume be aligned. Pair with a small --subscriber-rcvbuf-bytes.
        #[arg(long, conflicts_with = "cut_at_eagain")]
        cut_at_boundary: bool,
        /// Cut a subscriber once it has read its socket to EAGAIN, wherever its last byte
        /// falls (mid-event included): nothing its TCP ACKed is left unread.
        #[arg(long)]
        cut_at_eagain: bool,
        /// A subscriber due for a cut first stops reading this long (a stalled client whose
        /// backlog grows in the server), then reads and cuts. 0 = no pause.
        #[arg(long, default_value_t = 0)]
        cut_pause_ms: u64,
    },
    /// Fast subscribers beside slow ones reading at 1/divisor of the production rate; runs a
    /// baseline without slow subscribers first and compares fast subscribers' latency.
    Slow {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        load: Load,
        /// Slow subscribers per stream (added to --subscribers-per-stream fast ones).
        #[arg(long, default_value_t = 10)]
        slow_subscribers_per_stream: usize,
        /// Slow subscribers read at publish rate / this.
        #[arg(long, default_value_t = 20)]
        slow_rate_divisor: u32,
        /// Skip the baseline run without slow subscribers.
        #[arg(long)]
        no_baseline: bool,
    },
    /// C idle subscribers held open; reports server memory per connection from /proc.
    Idle {
        #[command(flatten)]
        common: Common,
        /// Idle subscriber connections to open.
        #[arg(long, default_value_t = 1000)]
        connections: usize,
        /// Streams they spread over.
        #[arg(long, default_value_t = 100)]
        streams: usize,
        /// Seconds to hold the connections once all are up.
        #[arg(long, default_value_t = 5.0)]
        hold_secs: f64,
        /// Source addresses 127.0.0.1..=127.0.0.N to spread over (0 = one per 20,000 connections).
        #[arg(long, default_value_t = 0)]
        source_addrs: u8,
        /// Last octet of the first source address (use different ranges for back-to-back runs:
        /// the previous run's closed connections sit in TIME_WAIT on their ports).
        #[arg(long, default_value_t = 1)]
        source_addr_first: u8,
    },
    /// M MCP sessions (gateway's MCP front, --upstream-cmd running mcp-fixture) calling
    /// `progress_stream`; each call's SSE response is cut at random byte offsets and resumed
    /// with GET + Last-Event-ID; progress must be exactly 1..count, in order, then the result.
    Mcp(McpArgs),
    /// What a durable publish costs: the raw fdatasync of the data filesystem (after an
    /// overwrite, and after an append into a preallocated file, as a log's), then 1 and 64
    /// (or --publishers) sequential publishers, one POST in flight each: publish latency
    /// p50/p99 and acknowledged events/s (and server CPU per event with --target-pid).
    Durable(DurableArgs),
    /// The kernel's floor for a delivery: one send() of --payload-bytes per subscriber per
    /// event over loopback, writer and reader threads pinned to different cores; the writer's
    /// CPU per send.
    Floor(FloorArgs),
    /// Publish N events, then resume from an early (possibly no longer retained) ID and report
    /// whether the server answers explicitly (410 / `event: truncated`) or skips silently.
    GapProbe(GapProbeArgs),
}

// The flags of `bench gap-probe` (the variant's doc comment is the command's help).
#[derive(Debug, Args)]
struct GapProbeArgs {
    #[command(flatten)]
    common: Common,
    /// Events to publish before resuming.
    #[arg(long, default_value_t = 200)]
    events: u64,
    /// Payload bytes per event.
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// Resume with the ID of this event (0-based publish counter).
    #[arg(long, default_value_t = 0)]
    resume_after_counter: u64,
    /// Extra query for the resume request, e.g. `on_truncated=earliest`.
    #[arg(long)]
    resume_query: Option<String>,
    /// Per-step timeout.
    #[arg(long, default_value_t = 5.0)]
    timeout_secs: f64,
    /// Seconds between the last publish and the resume (lets retention run).
    #[arg(long, default_value_t = 1.5)]
    settle_secs: f64,
}

// The flags of `bench mcp`.
#[derive(Debug, Args)]
struct McpArgs {
    /// The gateway's MCP endpoint.
    #[arg(long, default_value = "http://127.0.0.1:8080/mcp")]
    mcp_url: String,
    /// Concurrent MCP sessions (one thread each).
    #[arg(long, default_value_t = 10)]
    sessions: usize,
    /// Tool calls per session, one after another.
    #[arg(long, default_value_t = 3)]
    calls_per_session: usize,
    /// Progress notifications per call.
    #[arg(long, default_value_t = 200)]
    progress_count: u64,
    /// Milliseconds between progress notifications.
    #[arg(long, default_value_t = 2)]
    interval_ms: u64,
    /// Cuts (each followed by a resume) per call.
    #[arg(long, default_value_t = 3)]
    cuts_per_call: u32,
    /// A cut happens up to this many bytes (uniformly drawn) into a connection's body,
    /// after the first 128 bytes.
    #[arg(long, default_value_t = 2000)]
    cut_bytes_max: usize,
    /// Timeout per call.
    #[arg(long, default_value_t = 30.0)]
    timeout_secs: f64,
    /// Label for the report.
    #[arg(long, default_value = "gateway")]
    label: String,
    #[command(flatten)]
    out: Output,
    /// Seed for cut offsets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

// The flags of `bench durable`.
#[derive(Debug, Args)]
struct DurableArgs {
    /// Publish URL template with `{stream}` (e.g. http://127.0.0.1:8080/v1/streams/{stream}/events).
    #[arg(long)]
    publish_url: String,
    /// A directory on the server's data filesystem for the raw fdatasync probe.
    #[arg(long)]
    fsync_probe_dir: Option<PathBuf>,
    /// Raw fdatasync probes.
    #[arg(long, default_value_t = 2000)]
    fsync_probes: usize,
    /// Run the probe once on each of these CPUs (comma-separated; default: once, where the
    /// bench runs). A sync's cost depends on the CPU: its completion interrupt may be on
    /// another one; probe on the server's CPU for the like-for-like floor.
    #[arg(long, value_delimiter = ',')]
    fsync_probe_cpus: Vec<usize>,
    /// Publisher counts, comma-separated: one run each.
    #[arg(long, default_value = "1,64", value_delimiter = ',')]
    publishers: Vec<usize>,
    #[arg(long, default_value_t = 300)]
    payload_bytes: usize,
    /// Seconds each publisher count runs.
    #[arg(long, default_value_t = 5.0)]
    secs_per_run: f64,
    #[arg(long, default_value = "durable-")]
    stream_prefix: String,
    /// The server's pid, for its CPU per event.
    #[arg(long)]
    target_pid: Option<u32>,
    /// A file holding a token (e.g. a JWT), sent as `Authorization: Bearer <token>` on
    /// every publish. Without it no Authorization header is sent.
    #[arg(long, value_name = "PATH")]
    bearer_token_file: Option<PathBuf>,
    #[command(flatten)]
    out: Output,
}

// The flags of `bench floor`.
#[derive(Debug, Args)]
struct FloorArgs {
    #[arg(long, default_value_t = 100)]
    subscribers: usize,
    #[arg(long, default_value_t = 300)]
    payload_bytes: usize,
    #[arg(long, default_value_t = 5.0)]
    secs: f64,
    #[arg(long, default_value_t = 0)]
    writer_cpu: usize,
    #[arg(long, default_value_t = 1)]
    reader_cpu: usize,
    /// How the reader waits: `epoll` sleeps when idle (as `bench fanout`'s subscribers
    /// do, so the writer also pays their wake-ups), `spin` never sleeps.
    #[arg(long, value_enum, default_value = "epoll")]
    reader: floor::ReaderMode,
    /// Pace the writer to this many events per second (one send per subscriber each),
    /// e.g. a fan-out run's published events/s; 0: as fast as it can.
    #[arg(long, default_value_t = 0.0)]
    events_per_sec: f64,
    #[command(flatten)]
    out: Output,
}

#[derive(Debug, Args)]
struct Common {
    /// Publish URL template ({stream} is replaced by the stream name).
    #[arg(
        long,
        default_value = "http://127.0.0.1:8080/v1/streams/{stream}/events"
    )]
    publish_url: String,
    /// Batch publish URL template (used when --batch-events > 1).
    #[arg(
        long,
        default_value = "http://127.0.0.1:8080/v1/streams/{stream}/events:batch"
    )]
    publish_batch_url: String,
    /// Subscribe URL template.
    #[arg(long, default_value = "http://127.0.0.1:8080/v1/streams/{stream}")]
    subscribe_url: String,
    /// How to publish.
    #[arg(long, value_enum, default_value_t = PublishStyle::Gateway)]
    publish_style: PublishStyle,
    /// How to read event IDs (gateway: the ID's sequence is checked too).
    #[arg(long, value_enum, default_value_t = IdStyle::Gateway)]
    id_style: IdStyle,
    /// Server pids to read CPU and memory from (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    target_pid: Vec<u32>,
    /// Also include the direct children of each --target-pid (nginx workers).
    #[arg(long)]
    target_children: bool,
    /// Label for the report (e.g. "gateway", "nchan").
    #[arg(long, default_value = "target")]
    label: String,
    #[command(flatten)]
    out: Output,
    /// Stream name prefix (default: unique per run, so streams start empty).
    #[arg(long)]
    stream_prefix: Option<String>,
    /// Seed for random choices (cut points).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds for all subscribers to connect and get their 200 headers.
    #[arg(long, default_value_t = 20.0)]
    connect_secs_max: f64,
    /// Subscriber connects in progress at once.
    #[arg(long, default_value_t = 256)]
    connects_inflight_max: usize,
    /// Largest response header block accepted.
    #[arg(long, default_value_t = 16384)]
    header_bytes_max: usize,
    /// Prometheus endpoint scraped before and after the run (e.g.
    /// http://127.0.0.1:8080/metrics); the report shows the change of --metrics-family.
    #[arg(long)]
    metrics_url: Option<String>,
    /// Metric family summed from --metrics-url.
    #[arg(long, default_value = "gateway_resumes_total")]
    metrics_family: String,
    /// Label the family is grouped by.
    #[arg(long, default_value = "class")]
    metrics_label: String,
    /// Reconnects allowed per subscriber.
    #[arg(long, default_value_t = 100_000)]
    reconnects_max: u32,
    /// SO_RCVBUF of subscriber sockets, set before connect (0 = the system default; Linux
    /// doubles the value and enforces a minimum).
    #[arg(long, default_value_t = 0)]
    subscriber_rcvbuf_bytes: usize,
    /// A file holding a token (e.g. a JWT; surrounding whitespace is dropped), sent as
    /// `Authorization: Bearer <token>` on every publish and subscribe request. Without it no
    /// Authorization header is sent.
    #[arg(long, value_name = "PATH")]
    bearer_token_file: Option<PathBuf>,
    /// PEM file of the certificate(s) to trust for `https://` publish/subscribe URLs (a
    /// self-signed server certificate, or the CA that issued it). The load scenarios speak TLS
    /// (rustls, ring) when a URL is `https://`; gap-probe, durable and mcp do not.
    #[arg(long, value_name = "PATH")]
    ca_file: Option<PathBuf>,
}

/// Where the report goes, and progress on stderr.
#[derive(Debug, Clone, Args)]
struct Output {
    /// Print JSON instead of a table (with a `meta` object: commit, argv, CPUs, kernel, load
    /// average at start).
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file (stdout keeps the table unless --json).
    #[arg(long, value_name = "PATH")]
    json_file: Option<PathBuf>,
    /// A progress line on stderr (elapsed time, events so far and their rate) every this many
    /// seconds of a run; 0 = none.
    #[arg(long, default_value_t = bench::progress::INTERVAL_SECS_DEFAULT)]
    progress_interval_secs: u64,
}

#[derive(Debug, Args)]
struct Load {
    /// Streams.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// (Fast) subscribers per stream.
    #[arg(long, default_value_t = 100)]
    subscribers_per_stream: usize,
    /// Events to publish per stream.
    #[arg(long, default_value_t = 20_000)]
    events_per_stream: u64,
    /// Payload bytes per event (at least 34).
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// Total publish rate; 0 = as fast as the pipelines allow.
    #[arg(long, default_value_t = 0)]
    rate_events_per_sec: u64,
    /// Publisher connections (each stream is published on exactly one, in order).
    #[arg(long, default_value_t = 1)]
    publishers: usize,
    /// Requests in flight per publisher connection (HTTP/1.1 pipelining).
    #[arg(long, default_value_t = 32)]
    pipeline_depth: usize,
    /// Events per publish request (gateway batch form; 1 = one event per request).
    #[arg(long, default_value_t = 1)]
    batch_events: usize,
    /// Stop publishing after this many seconds even if events remain.
    #[arg(long, default_value_t = 15.0)]
    publish_secs_max: f64,
    /// After publishing, wait at most this long for subscribers to receive everything.
    #[arg(long, default_value_t = 5.0)]
    drain_secs_max: f64,
}

/// Descriptors kept free beside idle connections (publishers, /proc reads, epoll, stdio).
const IDLE_FDS_SPARE: usize = 128;

fn target_pids(c: &Common) -> Vec<u32> {
    let mut pids = c.target_pid.clone();
    if c.target_children {
        for &p in &c.target_pid {
            pids.extend(procstat::children_of(p));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn scrape_metrics(c: &Common) -> Result<Option<BTreeMap<String, f64>>, String> {
    let Some(url) = &c.metrics_url else {
        return Ok(None);
    };
    let url = UrlTemplate::parse(url).map_err(|e| format!("--metrics-url: {e}"))?;
    plain_only(&url, "--metrics-url")?;
    let text = scrape::fetch(&url, Duration::from_secs(5))?;
    Ok(Some(scrape::sum_by_label(
        &text,
        &c.metrics_family,
        &c.metrics_label,
    )))
}

/// The blocking helpers (metrics scrape, gap-probe, durable, mcp) speak plain HTTP only.
fn plain_only(url: &UrlTemplate, flag: &str) -> Result<(), String> {
    if url.tls {
        return Err(format!(
            "{flag}: https:// is spoken by the load scenarios only (fanout, resume-storm, slow, idle)"
        ));
    }
    Ok(())
}

fn unique_prefix() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("b{:x}s", (t as u64) ^ u64::from(std::process::id()))
}

fn base_config(c: &Common) -> Result<LoadConfig, String> {
    let publish = UrlTemplate::parse(&c.publish_url).map_err(|e| format!("--publish-url: {e}"))?;
    let subscribe =
        UrlTemplate::parse(&c.subscribe_url).map_err(|e| format!("--subscribe-url: {e}"))?;
    Ok(LoadConfig {
        publish,
        subscribe,
        publish_style: c.publish_style,
        id_style: c.id_style,
        stream_prefix: c.stream_prefix.clone().unwrap_or_else(unique_prefix),
        streams: 1,
        subscribers_per_stream: 1,
        slow_subscribers_per_stream: 0,
        slow_rate_divisor: 20,
        events_per_stream: 0,
        payload_bytes: 256,
        rate_events_per_sec: 0,
        publishers: 1,
        pipeline_depth: 1,
        batch_events: 1,
        publish_batch: Some(
            UrlTemplate::parse(&c.publish_batch_url)
                .map_err(|e| format!("--publish-batch-url: {e}"))?,
        ),
        publish_secs_max: 15.0,
        drain_secs_max: 5.0,
        connect_secs_max: c.connect_secs_max,
        idle_hold_secs: None,
        cuts_per_sec: 0.0,
        cut_at_boundary: false,
        cut_at_eagain: false,
        cut_pause_ms: 0,
        subscriber_rcvbuf_bytes: c.subscriber_rcvbuf_bytes,
        source_addrs: 1,
        source_addr_first: 1,
        connects_inflight_max: c.connects_inflight_max,
        header_bytes_max: c.header_bytes_max,
        reconnects_max: c.reconnects_max,
        target_pids: target_pids(c),
        seed: c.seed,
        bearer: Bearer::from_file(c.bearer_token_file.as_deref())?,
        progress_interval_secs: c.out.progress_interval_secs,
        tls: c
            .ca_file
            .as_deref()
            .map(bench::tls::client_config)
            .transpose()?,
    })
}

fn with_load(mut cfg: LoadConfig, l: &Load) -> LoadConfig {
    cfg.streams = l.streams;
    cfg.subscribers_per_stream = l.subscribers_per_stream;
    cfg.events_per_stream = l.events_per_stream;
    cfg.payload_bytes = l.payload_bytes;
    cfg.rate_events_per_sec = l.rate_events_per_sec;
    cfg.publishers = l.publishers.min(l.streams.max(1));
    cfg.pipeline_depth = l.pipeline_depth;
    cfg.batch_events = l.batch_events;
    cfg.publish_secs_max = l.publish_secs_max;
    cfg.drain_secs_max = l.drain_secs_max;
    cfg
}

enum Outcome {
    Reports(Vec<Report>, Option<String>),
    Durable(durable::DurableReport),
    Floor(floor::FloorReport),
    Probe(probe::ProbeReport),
    Mcp(mcp::McpReport),
}

impl Cmd {
    /// The subcommand's output flags.
    fn output(&self) -> &Output {
        match self {
            Cmd::Fanout { common, .. }
            | Cmd::ResumeStorm { common, .. }
            | Cmd::Slow { common, .. }
            | Cmd::Idle { common, .. } => &common.out,
            Cmd::GapProbe(a) => &a.common.out,
            Cmd::Mcp(a) => &a.out,
            Cmd::Durable(a) => &a.out,
            Cmd::Floor(a) => &a.out,
        }
    }
}

fn run(cmd: &Cmd) -> Result<Outcome, String> {
    match cmd {
        Cmd::Fanout { common, load } => {
            let cfg = with_load(base_config(common)?, load);
            Ok(Outcome::Reports(
                vec![run_load("fanout", common, &cfg)?],
                None,
            ))
        }
        Cmd::ResumeStorm {
            common,
            load,
            cuts_per_sec,
            cut_at_boundary,
            cut_at_eagain,
            cut_pause_ms,
        } => {
            let mut cfg = with_load(base_config(common)?, load);
            cfg.cuts_per_sec = *cuts_per_sec;
            cfg.cut_at_boundary = *cut_at_boundary;
            cfg.cut_at_eagain = *cut_at_eagain;
            cfg.cut_pause_ms = *cut_pause_ms;
            Ok(Outcome::Reports(
                vec![run_load("resume-storm", common, &cfg)?],
                None,
            ))
        }
        Cmd::Slow {
            common,
            load,
            slow_subscribers_per_stream,
            slow_rate_divisor,
            no_baseline,
        } => {
            let base = with_load(base_config(common)?, load);
            let slow = (*slow_subscribers_per_stream, *slow_rate_divisor);
            run_slow(common, base, slow, *no_baseline)
        }
        Cmd::Idle {
            common,
            connections,
            streams,
            hold_secs,
            source_addrs,
            source_addr_first,
        } => run_idle(
            common,
            *connections,
            *streams,
            *hold_secs,
            (*source_addrs, *source_addr_first),
        ),
        Cmd::Mcp(a) => run_mcp(a),
        Cmd::Durable(a) => run_durable(a),
        Cmd::Floor(a) => run_floor(a),
        Cmd::GapProbe(a) => run_gap_probe(a),
    }
}

/// One load run, with the server metrics' change over it when `--metrics-url` is given.
fn run_load(scenario: &str, common: &Common, cfg: &LoadConfig) -> Result<Report, String> {
    let before = scrape_metrics(common)?;
    let r = load::run(cfg).map_err(|e| e.to_string())?;
    let mut report = Report::new(scenario, &common.label, &r);
    if let (Some(b), Some(a)) = (before, scrape_metrics(common)?) {
        for (k, v) in scrape::delta(&b, &a) {
            let key = format!("{}{{{}={k}}}", common.metrics_family, common.metrics_label);
            report.server_metrics.insert(key, v);
        }
    }
    Ok(report)
}

/// `bench slow`: a baseline run of `base` (unless `no_baseline`), then one with `slow`
/// (slow subscribers per stream, rate divisor), and the fast subscribers' p99 of one over the
/// other.
fn run_slow(
    common: &Common,
    base: LoadConfig,
    (slow_subscribers_per_stream, slow_rate_divisor): (usize, u32),
    no_baseline: bool,
) -> Result<Outcome, String> {
    let mut reports = Vec::new();
    if !no_baseline {
        let mut b = base.clone();
        b.stream_prefix.push('a');
        reports.push(run_load("slow-baseline", common, &b)?);
    }
    let mut s = base;
    s.stream_prefix.push('b');
    s.slow_subscribers_per_stream = slow_subscribers_per_stream;
    s.slow_rate_divisor = slow_rate_divisor;
    reports.push(run_load("slow", common, &s)?);
    let note = (reports.len() == 2 && reports[0].latency.p99_us > 0.0).then(|| {
        format!(
            "fast subscribers' p99 with slow ones / without: {:.0} us / {:.0} us = {:.2}",
            reports[1].latency.p99_us,
            reports[0].latency.p99_us,
            reports[1].latency.p99_us / reports[0].latency.p99_us
        )
    });
    Ok(Outcome::Reports(reports, note))
}

/// `bench idle`: `connections` subscribers (capped by RLIMIT_NOFILE, with a note saying so)
/// over `streams` streams, held `hold_secs`; `(source addresses, first one)` as the flags.
fn run_idle(
    common: &Common,
    connections: usize,
    streams: usize,
    hold_secs: f64,
    (source_addrs, source_addr_first): (u8, u8),
) -> Result<Outcome, String> {
    let mut cfg = base_config(common)?;
    // Each connection is one descriptor here: without CAP_SYS_RESOURCE the hard
    // RLIMIT_NOFILE caps what one process can hold, so cap (and say so) rather than
    // fail half-way with EMFILE.
    let limit = load::raise_nofile((connections + IDLE_FDS_SPARE) as u64) as usize;
    let mut note = None;
    let connections = if limit < connections + IDLE_FDS_SPARE {
        let capped = limit.saturating_sub(IDLE_FDS_SPARE).max(1);
        let msg = format!(
            "asked for {connections} idle connections; capped at {capped} by RLIMIT_NOFILE \
             {limit} (raising the hard limit needs CAP_SYS_RESOURCE)"
        );
        eprintln!("warning: {msg}");
        note = Some(msg);
        capped
    } else {
        connections
    };
    let streams = streams.clamp(1, connections.max(1));
    cfg.streams = streams;
    cfg.subscribers_per_stream = connections / streams;
    cfg.idle_hold_secs = Some(hold_secs);
    cfg.source_addr_first = source_addr_first;
    cfg.source_addrs = if source_addrs == 0 {
        u8::try_from(connections.div_ceil(20_000))
            .unwrap_or(u8::MAX)
            .max(1)
    } else {
        source_addrs
    };
    let mut report = run_load("idle", common, &cfg)?;
    if let Some(n) = note {
        report.errors.insert(0, n);
    }
    Ok(Outcome::Reports(vec![report], None))
}

/// A URL template that must be plain HTTP (`flag` names it in errors).
fn plain_url(url: &str, flag: &str) -> Result<UrlTemplate, String> {
    UrlTemplate::parse(url)
        .map_err(|e| format!("{flag}: {e}"))
        .and_then(|u| plain_only(&u, flag).map(|()| u))
}

fn run_gap_probe(a: &GapProbeArgs) -> Result<Outcome, String> {
    let base = base_config(&a.common)?;
    plain_only(&base.publish, "--publish-url")?;
    plain_only(&base.subscribe, "--subscribe-url")?;
    let cfg = ProbeConfig {
        publish: base.publish,
        subscribe: base.subscribe,
        stream: format!("{}probe", base.stream_prefix),
        events: a.events,
        payload_bytes: a.payload_bytes,
        resume_after_counter: a.resume_after_counter,
        timeout_secs: a.timeout_secs,
        settle_secs: a.settle_secs,
        resume_query: a.resume_query.clone(),
        bearer: base.bearer,
    };
    Ok(Outcome::Probe(
        probe::run(&cfg, &a.common.label).map_err(|e| e.to_string())?,
    ))
}

fn run_mcp(a: &McpArgs) -> Result<Outcome, String> {
    let cfg = mcp::McpConfig {
        url: plain_url(&a.mcp_url, "--mcp-url")?,
        sessions: a.sessions,
        calls_per_session: a.calls_per_session,
        progress_count: a.progress_count,
        interval_ms: a.interval_ms,
        cuts_per_call: a.cuts_per_call,
        cut_bytes_max: a.cut_bytes_max.max(1),
        timeout_secs: a.timeout_secs,
        seed: a.seed,
        progress_interval_secs: a.out.progress_interval_secs,
    };
    Ok(Outcome::Mcp(
        mcp::run(&cfg, &a.label).map_err(|e| e.to_string())?,
    ))
}

fn run_durable(a: &DurableArgs) -> Result<Outcome, String> {
    let cfg = durable::DurableConfig {
        publish: plain_url(&a.publish_url, "--publish-url")?,
        stream_prefix: a.stream_prefix.clone(),
        publishers: a.publishers.clone(),
        payload_bytes: a.payload_bytes,
        secs_per_run: a.secs_per_run,
        fsync_probe_dir: a.fsync_probe_dir.clone(),
        fsync_probes: a.fsync_probes,
        fsync_probe_cpus: a.fsync_probe_cpus.clone(),
        target_pid: a.target_pid,
        bearer: Bearer::from_file(a.bearer_token_file.as_deref())?,
        progress_interval_secs: a.out.progress_interval_secs,
    };
    Ok(Outcome::Durable(durable::run(&cfg)?))
}

fn run_floor(a: &FloorArgs) -> Result<Outcome, String> {
    let cfg = floor::FloorConfig {
        reader: a.reader,
        events_per_sec: a.events_per_sec,
        subscribers: a.subscribers,
        payload_bytes: a.payload_bytes,
        secs: a.secs,
        writer_cpu: a.writer_cpu,
        reader_cpu: a.reader_cpu,
        progress_interval_secs: a.out.progress_interval_secs,
    };
    Ok(Outcome::Floor(floor::run(&cfg)?))
}

fn main() -> ExitCode {
    // Before the run: the load average the run started under.
    let meta = Meta::collect(std::env::args_os().map(|a| a.to_string_lossy().into_owned()));
    let cli = Cli::parse();
    let out = cli.cmd.output().clone();
    let done = match run(&cli.cmd) {
        Ok(outcome) => finish(outcome),
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &out.json_file {
        let text = json_text(&meta, &done.json);
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("bench: --json-file {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if out.json {
        println!("{}", json_text(&meta, &done.json));
    } else {
        print!("{}", done.table);
    }
    if let Some(why) = &done.failure {
        eprintln!("bench: {why}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// A finished run: its report as JSON and as a table, and why it fails (exit status 1), if it
/// does.
struct Done {
    json: serde_json::Value,
    table: String,
    failure: Option<String>,
}

fn json_text(meta: &Meta, report: &serde_json::Value) -> String {
    let v = meta::with_meta(meta, report.clone());
    serde_json::to_string_pretty(&v).expect("a JSON value serialises")
}

fn to_json(report: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(report).expect("reports serialise")
}

/// The report of an outcome, and whether it fails the run.
fn finish(outcome: Outcome) -> Done {
    let violations = |n: u64| (n > 0).then(|| format!("{n} invariant violation(s)"));
    match outcome {
        Outcome::Reports(reports, note) => {
            let mut table: String = reports.iter().map(Report::table).collect();
            if let Some(n) = &note {
                table.push_str(&format!("{n}\n"));
            }
            Done {
                json: serde_json::json!({ "reports": reports, "note": note }),
                table,
                failure: violations(reports.iter().map(|r| r.violations).sum()),
            }
        }
        Outcome::Floor(r) => Done {
            json: to_json(&r),
            table: r.table(),
            failure: None,
        },
        Outcome::Durable(r) => Done {
            json: to_json(&r),
            table: r.table(),
            failure: (r.errors() > 0)
                .then(|| format!("{} publish(es) not answered 201", r.errors())),
        },
        Outcome::Mcp(r) => Done {
            json: to_json(&r),
            table: r.table(),
            failure: violations(r.violations),
        },
        Outcome::Probe(p) => Done {
            json: to_json(&p),
            table: probe_table(&p),
            failure: (!p.outcome.is_ok()).then(|| {
                "the gap probe's answer was a silent gap or \
                 neither explicit nor contiguous"
                    .to_string()
            }),
        },
    }
}

/// The gap probe's verdict as text.
fn probe_table(p: &probe::ProbeReport) -> String {
    let verdict = match &p.outcome {
        probe::ProbeOutcome::Gone { body } => format!("EXPLICIT: HTTP 410 {body}"),
        probe::ProbeOutcome::TruncatedEvent { data, next_counter } => {
            format!("EXPLICIT: event: truncated {data} then event {next_counter:?}")
        }
        probe::ProbeOutcome::Contiguous => {
            "contiguous: the next event followed (history still retained)".into()
        }
        probe::ProbeOutcome::SilentGap {
            expected_counter,
            first_counter,
            missing,
        } => {
            format!(
                "SILENT GAP: expected event {expected_counter}, got {first_counter} with no notice ({missing} events skipped)"
            )
        }
        probe::ProbeOutcome::Other(s) => format!("other: {s}"),
    };
    format!(
        "== gap-probe [{}]\n  published {} events; resumed with the ID of event {} ({})\n  outcome: {verdict}\n",
        p.label, p.published, p.resume_after_counter, p.resume_id
    )
}
