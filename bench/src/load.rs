//! The load driver: one thread, one mio (epoll) loop, publisher connections with keep-alive and
//! pipelining, subscriber connections parsed by the pure SSE/chunked/checker code.
//!
//! It owns sockets and the clock; it decides nothing about correctness (that is `checker`).
//! Hot-path rule: no allocation per event — requests are appended to a reused buffer, reads go
//! to one shared scratch buffer, and per-connection parser state is fixed-size. Allocation
//! happens only per connection (request bytes, header buffer) and on error paths.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::checker::{CheckCounts, Checker};
use crate::chunked::Dechunker;
use crate::payload::{PAYLOAD_HEADER_BYTES, parse_payload, write_payload};
use crate::procstat::{self, ProcSample};
use crate::progress::Progress;
use crate::resume_class::{ByClass, ResumeClass};
use crate::sse::{Event, SseParser};
use crate::tail::ByteTail;
use crate::target::{Bearer, IdStyle, PublishStyle, UrlTemplate, gateway_seq};
use crate::tls::{self, Conn};

/// Bytes of SSE framing per event beyond the payload, used to size slow readers' byte rate.
const WIRE_OVERHEAD_BYTES: usize = 64;
/// An NDJSON batch line is `{"data":"` + payload + `"}` + LF.
const BATCH_LINE_OVERHEAD: &[u8; 12] = b"{\"data\":\"\"}\n";
/// Size of the shared read buffer.
const SCRATCH_BYTES: usize = 256 * 1024;
/// Size of a publisher's response buffer.
const PUB_RBUF_BYTES: usize = 64 * 1024;

/// Everything a run needs; built by the CLI from flags (each limit has a flag and a default).
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub publish: UrlTemplate,
    pub subscribe: UrlTemplate,
    pub publish_style: PublishStyle,
    pub id_style: IdStyle,
    /// Stream names are `<prefix><index>`; the prefix is unique per run so streams start empty.
    pub stream_prefix: String,
    pub streams: usize,
    pub subscribers_per_stream: usize,
    /// Extra subscribers per stream that read at 1/`slow_rate_divisor` of the production rate.
    pub slow_subscribers_per_stream: usize,
    pub slow_rate_divisor: u32,
    pub events_per_stream: u64,
    pub payload_bytes: usize,
    /// 0 = as fast as the pipelines allow.
    pub rate_events_per_sec: u64,
    pub publishers: usize,
    pub pipeline_depth: usize,
    /// Events per publish request; above 1 the gateway's batch form is used (NDJSON lines of
    /// `{"data":"<payload>"}` POSTed to `publish_batch`).
    pub batch_events: usize,
    /// Batch publish URL template (gateway: `.../v1/streams/{stream}/events:batch`).
    pub publish_batch: Option<UrlTemplate>,
    pub publish_secs_max: f64,
    pub drain_secs_max: f64,
    pub connect_secs_max: f64,
    /// Idle mode: no publishing; hold connections this long after all are up.
    pub idle_hold_secs: Option<f64>,
    /// Resume storm: connections cut per second (0 = none).
    pub cuts_per_sec: f64,
    /// Resume storm: a subscriber due for a cut cuts only once it has read its socket to
    /// EAGAIN (everything its TCP received, and so ACKed, has been read), wherever its last
    /// byte falls (instead of at a random byte of a read, leaving received bytes unread).
    pub cut_at_eagain: bool,
    /// Like `cut_at_eagain`, and the last byte read must also end an event.
    pub cut_at_boundary: bool,
    /// Resume storm: a subscriber due for a cut first stops reading for this long (a stalled
    /// client: the server's backlog to it grows), then reads and cuts. 0 = no pause.
    pub cut_pause_ms: u64,
    /// SO_RCVBUF of subscriber sockets, set before connect (0 = the system default).
    pub subscriber_rcvbuf_bytes: usize,
    /// Spread subscriber source addresses over `127.0.0.<first>` .. (`source_addrs` of them).
    pub source_addrs: u8,
    /// First source address's last octet (`127.0.0.<first>`); with `source_addrs` 1 and
    /// `source_addr_first` 1 no bind is done at all.
    pub source_addr_first: u8,
    pub connects_inflight_max: usize,
    pub header_bytes_max: usize,
    pub reconnects_max: u32,
    pub target_pids: Vec<u32>,
    pub seed: u64,
    /// `Authorization: Bearer <token>` on every publish and subscribe request (default: none).
    pub bearer: Bearer,
    /// Client TLS configuration for `https://` URLs (`--ca-file`); `None` = plaintext only.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// A progress line on stderr every this many seconds of a phase (0 = none).
    pub progress_interval_secs: u64,
}

/// Server figures over the measured window.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ServerFigures {
    pub cpu_secs: f64,
    /// Seconds the server's threads were runnable but waiting for a CPU over the window.
    pub runqueue_wait_secs: f64,
    pub rss_start_kib: u64,
    pub rss_end_kib: u64,
    pub rss_peak_sampled_kib: u64,
    pub hwm_kib: u64,
}

/// What a run observed.
#[derive(Debug)]
pub struct LoadResult {
    pub fast: CheckCounts,
    pub slow: CheckCounts,
    pub subscribers: usize,
    pub subscribers_up: usize,
    pub subscriber_failures: u64,
    pub published: u64,
    pub publish_errors: u64,
    pub publish_secs: f64,
    pub window_secs: f64,
    pub slow_backlog_events: u64,
    pub latency_fast_ns: Histogram<u64>,
    pub latency_slow_ns: Histogram<u64>,
    pub resume_ns: Histogram<u64>,
    /// Cut → the resumed connection's 200 response head (the rest of `resume_ns` is the
    /// server's time to the first event).
    pub resume_headers_ns: Histogram<u64>,
    /// Resume counts and latencies per class announced by the server (`X-Resume-Class`).
    pub resume_by_class: ByClass,
    /// Connections cut (resume storm).
    pub cuts: u64,
    pub server_closes: u64,
    pub reconnects: u64,
    pub http_410: u64,
    pub server: Option<ServerFigures>,
    /// CPU-seconds the bench itself used over the window (is the load generator saturated?).
    pub bench_cpu_secs: f64,
    /// Idle mode: server RSS before any subscriber connected and once all were up.
    pub idle_rss_before_kib: Option<u64>,
    pub idle_rss_after_kib: Option<u64>,
    /// The server's RSS at the end of the hold (idle mode): what the held connections keep
    /// once the set-up's transient buffers are returned.
    pub idle_rss_end_kib: Option<u64>,
    pub errors: Vec<String>,
}

/// Why a run could not be carried out (as opposed to what it observed).
#[derive(Debug)]
pub enum LoadError {
    /// The configuration is inconsistent.
    Config(String),
    /// The event loop failed.
    Io(std::io::Error),
    /// A target process could not be read.
    Proc(procstat::ProcError),
    /// Subscribers could not all be connected in time.
    ConnectTimeout {
        up: usize,
        wanted: usize,
        first_error: String,
    },
    /// A publisher failed (connection refused, reset).
    Publisher(String),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Config(s) => write!(f, "bad configuration: {s}"),
            LoadError::Io(e) => write!(f, "event loop: {e}"),
            LoadError::Proc(e) => write!(f, "{e}"),
            LoadError::ConnectTimeout {
                up,
                wanted,
                first_error,
            } => {
                write!(
                    f,
                    "only {up} of {wanted} subscribers connected in time; first error: {first_error}"
                )
            }
            LoadError::Publisher(s) => write!(f, "publisher: {s}"),
        }
    }
}

impl From<std::io::Error> for LoadError {
    fn from(e: std::io::Error) -> Self {
        LoadError::Io(e)
    }
}

/// Open a non-blocking TCP connection, optionally bound to `src` first. The bind picks the
/// ephemeral port (rustix has no IP_BIND_ADDRESS_NO_PORT), so each source address gives about
/// one ephemeral port range (~28k) of connections: spread many connections over addresses.
pub fn connect_from(src: Option<Ipv4Addr>, dst: SocketAddr) -> std::io::Result<TcpStream> {
    connect_with_rcvbuf(src, dst, 0)
}

/// [`connect_from`] with `SO_RCVBUF` set to `rcvbuf_bytes` before connecting (0 = default;
/// the kernel doubles the value and enforces a minimum).
pub fn connect_with_rcvbuf(
    src: Option<Ipv4Addr>,
    dst: SocketAddr,
    rcvbuf_bytes: usize,
) -> std::io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, sockopt};
    let fd = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    sockopt::set_tcp_nodelay(&fd, true)?;
    if rcvbuf_bytes > 0 {
        sockopt::set_socket_recv_buffer_size(&fd, rcvbuf_bytes)?;
    }
    if let Some(ip) = src {
        rustix::net::bind(&fd, &SocketAddrV4::new(ip, 0))?;
    }
    match rustix::net::connect(&fd, &dst) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(TcpStream::from_std(std::net::TcpStream::from(fd)))
}

/// Wraps a connected (or connecting) socket for `url`: TLS when the URL is `https://`.
fn wrap(cfg: &LoadConfig, url: &UrlTemplate, sock: TcpStream) -> std::io::Result<Conn> {
    if !url.tls {
        return Ok(Conn::plain(sock));
    }
    let tls_cfg = cfg
        .tls
        .as_ref()
        .ok_or_else(|| std::io::Error::other("https:// URL without a TLS configuration"))?;
    let name = tls::server_name(&url.host).map_err(std::io::Error::other)?;
    Conn::tls(sock, tls_cfg, name)
}

/// Raise `RLIMIT_NOFILE` to at least `wanted` (soft and hard; raising the hard limit needs
/// CAP_SYS_RESOURCE). Returns the soft limit in effect afterwards.
pub fn raise_nofile(wanted: u64) -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let cur = getrlimit(Resource::Nofile);
    let have = cur.current.unwrap_or(u64::MAX);
    if have >= wanted {
        return have;
    }
    let hard = cur.maximum.unwrap_or(u64::MAX);
    let want_hard = hard.max(wanted);
    if setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(wanted),
            maximum: Some(want_hard),
        },
    )
    .is_ok()
    {
        return wanted;
    }
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: Some(hard),
        },
    );
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SubPhase {
    Down,
    Connecting,
    Requesting,
    Headers,
    Streaming,
    /// Finished for good: explicit 410, failure, or reconnect budget exhausted.
    Over,
}

#[derive(Debug)]
struct Sub {
    stream: u32,
    slow: bool,
    sock: Option<Conn>,
    phase: SubPhase,
    phase_since: Instant,
    req: Vec<u8>,
    req_off: usize,
    hdr: Vec<u8>,
    chunked: Option<Dechunker>,
    sse: SseParser,
    checker: Checker,
    /// Resume storm: close after this many more body bytes.
    cut_after_bytes: Option<usize>,
    /// Set when reconnecting after a cut with events known to be pending: resume latency is
    /// measured from here to the first event.
    resume_started: Option<Instant>,
    /// The current connection's request carried a Last-Event-ID (it is a resume).
    resuming: bool,
    /// When the resume's connect started (only for resumes after a bench cut, as
    /// `resume_started`): the per-class latencies are measured from here.
    reconnect_at: Option<Instant>,
    /// The class the server announced for the current connection's resume.
    class: ResumeClass,
    /// A cut is due and the subscriber does not read until then (`cut_pause_ms`).
    paused_until: Option<Instant>,
    slow_budget_bytes: f64,
    /// The last readiness event said the peer closed (EPOLLRDHUP): a short read does not mean
    /// "drained" then, the EOF is still to be read (edge-triggered: no further event comes).
    peer_closed: bool,
    reconnects: u32,
    failed: bool,
    up_once: bool,
}

impl Sub {
    fn new(stream: u32, slow: bool, now: Instant) -> Self {
        Sub {
            stream,
            slow,
            sock: None,
            phase: SubPhase::Down,
            phase_since: now,
            req: Vec::new(),
            req_off: 0,
            hdr: Vec::new(),
            chunked: None,
            sse: SseParser::new(),
            checker: Checker::new(0),
            cut_after_bytes: None,
            resume_started: None,
            resuming: false,
            reconnect_at: None,
            paused_until: None,
            class: ResumeClass::None,
            slow_budget_bytes: 0.0,
            peer_closed: false,
            reconnects: 0,
            failed: false,
            up_once: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RespState {
    Head,
    Body(usize),
    Chunked,
}

#[derive(Debug)]
struct Pub {
    sock: Conn,
    connected: bool,
    streams: Vec<u32>,
    rr: usize,
    wbuf: Vec<u8>,
    woff: usize,
    inflight: usize,
    rbuf: Vec<u8>,
    rlen: usize,
    resp: RespState,
    dechunk: Dechunker,
    status: u16,
    /// The last bytes read and written on this connection, kept when `BENCH_TRACE_DIR` is set
    /// and written there when the response stream stops making sense.
    trace: Option<(ByteTail, ByteTail)>,
}

impl Pub {
    /// A connecting publisher for `streams`.
    fn new(cfg: &LoadConfig, sock: Conn, streams: Vec<u32>) -> Self {
        Pub {
            sock,
            connected: false,
            streams,
            rr: 0,
            wbuf: Vec::with_capacity(cfg.pipeline_depth * (cfg.payload_bytes + 256)),
            woff: 0,
            inflight: 0,
            rbuf: vec![0; PUB_RBUF_BYTES],
            rlen: 0,
            resp: RespState::Head,
            dechunk: Dechunker::new(),
            status: 0,
            trace: trace_dir().map(|_| (ByteTail::new(TRACE_BYTES), ByteTail::new(TRACE_BYTES))),
        }
    }
}

/// Counters and histograms shared by all connections of a run.
#[derive(Debug)]
struct Ctx {
    origin: Instant,
    id_style: IdStyle,
    latency_fast: Histogram<u64>,
    latency_slow: Histogram<u64>,
    resume: Histogram<u64>,
    resume_headers: Histogram<u64>,
    by_class: ByClass,
    server_closes: u64,
    reconnects: u64,
    http_410: u64,
    subscriber_failures: u64,
    publish_errors: u64,
    published: u64,
    responses: u64,
    errors: Vec<String>,
    /// Connections actually cut (a scheduled cut happens at the subscriber's next read).
    cuts: u64,
    /// Subscribers to reconnect (resume) before any first-time connect.
    reconnect_queue: VecDeque<usize>,
    rng: Rng,
}

impl Ctx {
    fn new(cfg: &LoadConfig, origin: Instant) -> Self {
        Ctx {
            origin,
            id_style: cfg.id_style,
            latency_fast: new_hist(),
            latency_slow: new_hist(),
            resume: new_hist(),
            resume_headers: new_hist(),
            by_class: ByClass::new(new_hist),
            server_closes: 0,
            reconnects: 0,
            http_410: 0,
            subscriber_failures: 0,
            publish_errors: 0,
            published: 0,
            responses: 0,
            errors: Vec::new(),
            cuts: 0,
            reconnect_queue: VecDeque::new(),
            rng: Rng::new(cfg.seed),
        }
    }

    fn error(&mut self, msg: String) {
        if self.errors.len() < 16 {
            self.errors.push(msg);
        }
    }
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("static histogram bounds are valid")
}

/// xorshift64*: a small deterministic generator (seeded from the CLI) for cut points.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
}

/// The stream name for index `i`.
pub fn stream_name(prefix: &str, i: usize) -> String {
    format!("{prefix}{i}")
}

/// A subscribe request (with `Last-Event-ID` when resuming, and the bearer header if any).
fn build_sub_request(
    url: &UrlTemplate,
    bearer: &Bearer,
    stream: &str,
    last_id: &[u8],
    out: &mut Vec<u8>,
) {
    out.clear();
    out.extend_from_slice(b"GET ");
    url.render_path(stream, out);
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(url.host_header.as_bytes());
    out.extend_from_slice(b"\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n");
    bearer.append_header(out);
    if !last_id.is_empty() {
        out.extend_from_slice(b"Last-Event-ID: ");
        out.extend_from_slice(last_id);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A publish request's head up to its `Content-Length` value: "POST <path> HTTP/1.1\r\nHost:
/// ..\r\nContent-Type: ..\r\n[Authorization: Bearer ..\r\n]Content-Length: ".
fn build_publish_head(
    url: &UrlTemplate,
    stream: &str,
    content_type: &[u8],
    bearer: &Bearer,
) -> Vec<u8> {
    let mut h = b"POST ".to_vec();
    url.render_path(stream, &mut h);
    h.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    h.extend_from_slice(url.host_header.as_bytes());
    h.extend_from_slice(b"\r\nContent-Type: ");
    h.extend_from_slice(content_type);
    h.extend_from_slice(b"\r\n");
    bearer.append_header(&mut h);
    h.extend_from_slice(b"Content-Length: ");
    h
}

/// Run one load phase.
pub fn run(cfg: &LoadConfig) -> Result<LoadResult, LoadError> {
    check_config(cfg)?;
    let mut run = LoadRun::new(cfg)?;
    let before_connect = sample(&cfg.target_pids)?;
    let subscribers_up = run.connect_all()?;
    if let Some(hold) = cfg.idle_hold_secs {
        return run.hold_idle(hold, before_connect, subscribers_up);
    }
    let mut pubs = Publishers::open(cfg, &run.poll, &run.subs.names, run.subs.all.len())?;
    run.load(&mut pubs, subscribers_up)
}

/// The flag combinations a run cannot be carried out with.
fn check_config(cfg: &LoadConfig) -> Result<(), LoadError> {
    if usize::from(cfg.source_addr_first) + usize::from(cfg.source_addrs) > 255
        || cfg.source_addr_first == 0
    {
        return Err(LoadError::Config(
            "source addresses must stay within 127.0.0.1..=127.0.0.254".into(),
        ));
    }
    if cfg.payload_bytes < PAYLOAD_HEADER_BYTES {
        return Err(LoadError::Config(format!(
            "--payload-bytes must be at least {PAYLOAD_HEADER_BYTES}"
        )));
    }
    if cfg.batch_events > 1 && cfg.publish_style == PublishStyle::Nchan {
        return Err(LoadError::Config(
            "nchan has no batch publish form: use --batch-events 1".into(),
        ));
    }
    if cfg.batch_events > 1 && cfg.publish_batch.is_none() {
        return Err(LoadError::Config(
            "--batch-events > 1 needs --publish-batch-url".into(),
        ));
    }
    if cfg.slow_subscribers_per_stream > 0 && cfg.rate_events_per_sec == 0 {
        return Err(LoadError::Config(
            "slow subscribers read at a fraction of the publish rate: set --rate-events-per-sec"
                .into(),
        ));
    }
    let any_tls = cfg.publish.tls
        || cfg.subscribe.tls
        || (cfg.batch_events > 1 && cfg.publish_batch.as_ref().is_some_and(|u| u.tls));
    if any_tls && cfg.tls.is_none() {
        return Err(LoadError::Config(
            "https:// URLs need a CA to trust: --ca-file PATH".into(),
        ));
    }
    if cfg.idle_hold_secs.is_none() && (cfg.publishers == 0 || cfg.pipeline_depth == 0) {
        return Err(LoadError::Config(
            "--publishers and --pipeline-depth must be at least 1".into(),
        ));
    }
    Ok(())
}

/// The target processes' figures now (`None` without target pids).
fn sample(pids: &[u32]) -> Result<Option<ProcSample>, LoadError> {
    if pids.is_empty() {
        Ok(None)
    } else {
        procstat::sample(pids).map(Some).map_err(LoadError::Proc)
    }
}

impl ServerFigures {
    /// The figures between two samples, with the largest RSS sampled in between.
    fn between(b: ProcSample, e: ProcSample, rss_peak_sampled_kib: u64) -> Self {
        ServerFigures {
            cpu_secs: (e.cpu_ticks - b.cpu_ticks) as f64 / procstat::ticks_per_second() as f64,
            runqueue_wait_secs: e.runqueue_wait_ns.saturating_sub(b.runqueue_wait_ns) as f64 / 1e9,
            rss_start_kib: b.rss_kib,
            rss_end_kib: e.rss_kib,
            rss_peak_sampled_kib,
            hwm_kib: e.hwm_kib,
        }
    }
}

/// One run's event loop and its subscriber side; the phases are its methods: connect every
/// subscriber, then either hold them (idle) or publish and drain (load).
struct LoadRun<'c> {
    cfg: &'c LoadConfig,
    poll: Poll,
    events: Events,
    ctx: Ctx,
    subs: Subscribers,
}

/// Every subscriber of a run, with the connect queue and the shared read buffer.
#[derive(Debug)]
struct Subscribers {
    /// Stream names by index.
    names: Vec<String>,
    /// Indexed by token.
    all: Vec<Sub>,
    /// First-time connects not started yet.
    connect_queue: VecDeque<usize>,
    /// Subscribers connecting, requesting or waiting for their response head.
    connecting: usize,
    scratch: Vec<u8>,
}

impl<'c> LoadRun<'c> {
    fn new(cfg: &'c LoadConfig) -> Result<Self, LoadError> {
        let origin = Instant::now();
        let subs_per_stream = cfg.subscribers_per_stream + cfg.slow_subscribers_per_stream;
        let nsubs = cfg.streams * subs_per_stream;
        raise_nofile((nsubs + cfg.publishers + 256) as u64);
        let poll = Poll::new()?;
        let events = Events::with_capacity(4096);
        let scratch = vec![0u8; SCRATCH_BYTES];
        let names: Vec<String> = (0..cfg.streams)
            .map(|i| stream_name(&cfg.stream_prefix, i))
            .collect();
        let ctx = Ctx::new(cfg, origin);
        let all: Vec<Sub> = (0..nsubs)
            .map(|i| {
                let slow = i % subs_per_stream >= cfg.subscribers_per_stream;
                Sub::new((i / subs_per_stream) as u32, slow, origin)
            })
            .collect();
        let subs = Subscribers {
            names,
            all,
            connect_queue: (0..nsubs).collect(),
            connecting: 0,
            scratch,
        };
        Ok(Self {
            cfg,
            poll,
            events,
            ctx,
            subs,
        })
    }

    /// Phase 1: connect every subscriber and wait for its 200 headers; returns how many are
    /// streaming.
    fn connect_all(&mut self) -> Result<usize, LoadError> {
        let cfg = self.cfg;
        let nsubs = self.subs.all.len();
        let connect_deadline = self.ctx.origin + Duration::from_secs_f64(cfg.connect_secs_max);
        let mut progress = Progress::new(cfg.progress_interval_secs, Instant::now());
        loop {
            self.subs
                .start_connects(cfg, &self.poll, &mut self.ctx, Instant::now());
            let up = self.subs.count(SubPhase::Streaming);
            progress.tick(Instant::now(), &[("subscribers up", up as u64)]);
            if up == nsubs {
                break;
            }
            let failed = self.subs.count(SubPhase::Over);
            let now = Instant::now();
            if now > connect_deadline
                || (failed > 0 && cfg.idle_hold_secs.is_none())
                || (up + failed == nsubs)
            {
                if cfg.idle_hold_secs.is_some() {
                    break; // idle reports what it reached
                }
                let first_error = self
                    .ctx
                    .errors
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "timeout".into());
                return Err(LoadError::ConnectTimeout {
                    up,
                    wanted: nsubs,
                    first_error,
                });
            }
            let now = self.poll_once(Duration::from_millis(5), Phase::Connect, None)?;
            self.subs
                .check_connect_timeouts(cfg, &mut self.ctx, &self.poll, now);
        }
        let subscribers_up = self.subs.count(SubPhase::Streaming);
        let pending = self
            .subs
            .all
            .iter()
            .filter(|s| !matches!(s.phase, SubPhase::Streaming | SubPhase::Over))
            .count();
        if pending > 0 {
            self.ctx.error(format!(
                "{pending} subscribers had no response headers after --connect-secs-max {}",
                cfg.connect_secs_max
            ));
        }
        Ok(subscribers_up)
    }

    /// Waits up to `timeout` for readiness and hands every connection its events (publishers
    /// only once there are any); returns the clock read after the wait.
    fn poll_once(
        &mut self,
        timeout: Duration,
        phase: Phase,
        mut pubs: Option<(&mut Publishers, &Window)>,
    ) -> Result<Instant, LoadError> {
        self.poll.poll(&mut self.events, Some(timeout))?;
        let now = Instant::now();
        let nsubs = self.subs.all.len();
        for ev in self.events.iter() {
            let i = ev.token().0;
            if i < nsubs {
                self.subs
                    .handle_event(self.cfg, ev, &self.poll, &mut self.ctx, now, phase);
            } else if let Some((pubs, w)) = pubs.as_mut() {
                pubs.handle_event(i - nsubs, ev, self.cfg, &self.poll, &mut self.ctx, w, now)?;
            }
        }
        Ok(now)
    }

    /// Idle mode: no publishing; hold the connections for `hold` seconds, sampling the
    /// server's RSS.
    fn hold_idle(
        mut self,
        hold: f64,
        before_connect: Option<ProcSample>,
        subscribers_up: usize,
    ) -> Result<LoadResult, LoadError> {
        let cfg = self.cfg;
        let after_connect = sample(&cfg.target_pids)?;
        let hold_until = Instant::now() + Duration::from_secs_f64(hold);
        let mut peak = after_connect.map(|s| s.rss_kib).unwrap_or(0);
        let mut last_sample = Instant::now();
        let mut progress = Progress::new(cfg.progress_interval_secs, last_sample);
        while Instant::now() < hold_until {
            let now = self.poll_once(Duration::from_millis(50), Phase::Idle, None)?;
            if progress.due(now) {
                let up = self.subs.count(SubPhase::Streaming) as u64;
                progress.tick(now, &[("idle subscribers up", up)]);
            }
            if now.duration_since(last_sample) > Duration::from_millis(250) {
                last_sample = now;
                if let Some(s) = sample(&cfg.target_pids)? {
                    peak = peak.max(s.rss_kib);
                }
            }
        }
        let end = sample(&cfg.target_pids)?;
        let still_up = self.subs.count(SubPhase::Streaming);
        let mut fast = CheckCounts::default();
        for s in &self.subs.all {
            fast.add(s.checker.counts());
        }
        let server = before_connect
            .zip(end)
            .map(|(b, e)| ServerFigures::between(b, e, peak));
        if still_up < subscribers_up {
            self.ctx.error(format!(
                "{} idle subscribers were closed during the hold",
                subscribers_up - still_up
            ));
        }
        let ctx = self.ctx;
        Ok(LoadResult {
            fast,
            slow: CheckCounts::default(),
            subscribers: self.subs.all.len(),
            subscribers_up: still_up,
            subscriber_failures: ctx.subscriber_failures,
            published: 0,
            publish_errors: 0,
            publish_secs: 0.0,
            window_secs: hold,
            slow_backlog_events: 0,
            latency_fast_ns: ctx.latency_fast,
            latency_slow_ns: ctx.latency_slow,
            resume_ns: ctx.resume,
            resume_headers_ns: ctx.resume_headers,
            resume_by_class: ctx.by_class,
            cuts: 0,
            server_closes: ctx.server_closes,
            reconnects: ctx.reconnects,
            http_410: ctx.http_410,
            server,
            bench_cpu_secs: 0.0,
            idle_rss_before_kib: before_connect.map(|s| s.rss_kib),
            idle_rss_after_kib: after_connect.map(|s| s.rss_kib),
            idle_rss_end_kib: end.map(|s| s.rss_kib),
            errors: ctx.errors,
        })
    }

    /// Phase 2: publish while the subscribers read (with cuts, stalls and slow readers as
    /// configured), then drain; what the window observed.
    fn load(
        mut self,
        pubs: &mut Publishers,
        subscribers_up: usize,
    ) -> Result<LoadResult, LoadError> {
        let cfg = self.cfg;
        let start_sample = sample(&cfg.target_pids)?;
        let me = [std::process::id()];
        let bench_start = procstat::sample(&me).map_err(LoadError::Proc)?;
        let mut w = Window::new(cfg, start_sample.map(|s| s.rss_kib).unwrap_or(0));
        let mut progress = Progress::new(cfg.progress_interval_secs, w.start);
        let window_end = loop {
            if let Some(end) = self.load_turn(pubs, &mut w)? {
                break end;
            }
            let delivered = self.ctx.latency_fast.len() + self.ctx.latency_slow.len();
            let counts = [("published", self.ctx.published), ("delivered", delivered)];
            progress.tick(Instant::now(), &counts);
        };
        let end_sample = sample(&cfg.target_pids)?;
        let bench_end = procstat::sample(&me).map_err(LoadError::Proc)?;
        let bench_cpu_secs = (bench_end.cpu_ticks - bench_start.cpu_ticks) as f64
            / procstat::ticks_per_second() as f64;
        let (fast, slow, slow_backlog) = self.subs.handle_end(&pubs.counters);
        let server = start_sample
            .zip(end_sample)
            .map(|(b, e)| ServerFigures::between(b, e, w.peak_rss.max(e.rss_kib)));
        let ctx = self.ctx;
        Ok(LoadResult {
            fast,
            slow,
            subscribers: self.subs.all.len(),
            subscribers_up,
            subscriber_failures: ctx.subscriber_failures,
            published: ctx.published,
            publish_errors: ctx.publish_errors,
            publish_secs: w
                .publish_end
                .unwrap_or(window_end)
                .duration_since(w.start)
                .as_secs_f64(),
            window_secs: window_end.duration_since(w.start).as_secs_f64(),
            slow_backlog_events: slow_backlog,
            latency_fast_ns: ctx.latency_fast,
            latency_slow_ns: ctx.latency_slow,
            resume_ns: ctx.resume,
            resume_headers_ns: ctx.resume_headers,
            resume_by_class: ctx.by_class,
            cuts: ctx.cuts,
            server_closes: ctx.server_closes,
            reconnects: ctx.reconnects,
            http_410: ctx.http_410,
            server,
            bench_cpu_secs,
            idle_rss_before_kib: None,
            idle_rss_after_kib: None,
            idle_rss_end_kib: None,
            errors: ctx.errors,
        })
    }

    /// One turn of the load loop; `Some(window end)` once the drain is over.
    fn load_turn(
        &mut self,
        pubs: &mut Publishers,
        w: &mut Window,
    ) -> Result<Option<Instant>, LoadError> {
        let cfg = self.cfg;
        let now = Instant::now();
        let publishing = w.publish_end.is_none();
        if publishing {
            self.publish(pubs, w, now)?;
        }
        if cfg.cuts_per_sec > 0.0 && publishing {
            self.schedule_cuts(w, now);
        }
        if cfg.cut_pause_ms > 0 {
            self.subs.read_unpaused(cfg, &self.poll, &mut self.ctx, now);
        }
        // Slow readers: read their budget on a timer.
        if w.slow_bytes_per_sec > 0.0
            && now.duration_since(w.last_slow_tick) >= Duration::from_millis(10)
        {
            let dt = now.duration_since(w.last_slow_tick).as_secs_f64();
            w.last_slow_tick = now;
            let added_bytes = w.slow_bytes_per_sec * dt;
            self.subs
                .read_slow(cfg, &self.poll, &mut self.ctx, added_bytes, now);
        }
        self.subs
            .start_connects(cfg, &self.poll, &mut self.ctx, now);
        if now.duration_since(w.last_sample) >= Duration::from_millis(200) {
            w.last_sample = now;
            self.subs
                .check_connect_timeouts(cfg, &mut self.ctx, &self.poll, now);
            if let Some(s) = sample(&cfg.target_pids)? {
                w.peak_rss = w.peak_rss.max(s.rss_kib);
            }
        }
        if let Some(dd) = w.drain_deadline
            && now.duration_since(w.last_done_check) >= Duration::from_millis(5)
        {
            w.last_done_check = now;
            if self.subs.drained(&pubs.counters) || now >= dd {
                return Ok(Some(now));
            }
        }
        let timeout = if publishing && cfg.rate_events_per_sec > 0 {
            Duration::from_micros(200)
        } else {
            Duration::from_millis(2)
        };
        self.poll_once(timeout, Phase::Load, Some((pubs, w)))?;
        Ok(None)
    }

    /// Publish: fill the pipelines up to depth within the rate budget; once the deadline or
    /// the event total is reached, end publishing when every response is in (or overdue).
    fn publish(
        &mut self,
        pubs: &mut Publishers,
        w: &mut Window,
        now: Instant,
    ) -> Result<(), LoadError> {
        let cfg = self.cfg;
        let ctx = &mut self.ctx;
        let stop = now >= w.publish_deadline || ctx.published >= w.total_events;
        // Responses still owed after the drain allowance: stop waiting (and say so).
        let overdue =
            now >= w.publish_deadline + Duration::from_secs_f64(cfg.drain_secs_max.max(1.0));
        if stop && overdue && pubs.all.iter().any(|p| p.inflight > 0) {
            let owed: usize = pubs.all.iter().map(|p| p.inflight).sum();
            ctx.error(format!("{owed} publish responses never arrived"));
            ctx.publish_errors += owed as u64;
            w.publish_end = Some(now);
            w.drain_deadline = Some(now);
        } else if stop {
            if pubs.all.iter().all(|p| p.inflight == 0) {
                w.publish_end = Some(now);
                w.drain_deadline = Some(now + Duration::from_secs_f64(cfg.drain_secs_max));
            }
        } else {
            let allowed = w.allowed_events(cfg, now);
            for (pi, p) in pubs.all.iter_mut().enumerate() {
                if !p.connected {
                    continue;
                }
                fill_publisher(cfg, p, &pubs.heads, &mut pubs.counters, ctx, allowed, now);
                flush_publisher(p)
                    .map_err(|e| LoadError::Publisher(format!("publisher {pi} write: {e}")))?;
            }
        }
        Ok(())
    }

    /// Resume storm: schedule the cuts due by now, on random streaming fast subscribers that
    /// have had an event.
    fn schedule_cuts(&mut self, w: &mut Window, now: Instant) {
        let cfg = self.cfg;
        let nsubs = self.subs.all.len();
        let due = (now.duration_since(w.start).as_secs_f64() * cfg.cuts_per_sec) as u64;
        let mut tries = 0;
        while w.cuts_scheduled < due && tries < 64 {
            tries += 1;
            let i = self.ctx.rng.below(nsubs as u64) as usize;
            let s = &mut self.subs.all[i];
            if s.phase == SubPhase::Streaming
                && s.cut_after_bytes.is_none()
                && s.checker.counts().events > 0
                && !s.slow
            {
                s.cut_after_bytes = Some(usize::MAX); // decided at the next read (random point)
                if cfg.cut_pause_ms > 0 {
                    s.paused_until = Some(now + Duration::from_millis(cfg.cut_pause_ms));
                }
                w.cuts_scheduled += 1;
            }
        }
    }
}

impl Subscribers {
    fn count(&self, phase: SubPhase) -> usize {
        self.all.iter().filter(|s| s.phase == phase).count()
    }

    fn start_connects(&mut self, cfg: &LoadConfig, poll: &Poll, ctx: &mut Ctx, now: Instant) {
        start_connects(
            cfg,
            &self.names,
            &mut self.all,
            &mut self.connect_queue,
            &mut self.connecting,
            poll,
            ctx,
            now,
        );
    }

    fn check_connect_timeouts(
        &mut self,
        cfg: &LoadConfig,
        ctx: &mut Ctx,
        poll: &Poll,
        now: Instant,
    ) {
        check_connect_timeouts(cfg, &mut self.all, &mut self.connecting, ctx, poll, now);
    }

    /// A subscriber's readiness event (its token is its index).
    fn handle_event(
        &mut self,
        cfg: &LoadConfig,
        ev: &mio::event::Event,
        poll: &Poll,
        ctx: &mut Ctx,
        now: Instant,
        phase: Phase,
    ) {
        let i = ev.token().0;
        let (s, scratch) = (&mut self.all[i], &mut self.scratch);
        handle_sub_event(
            cfg,
            s,
            ev,
            poll,
            Token(i),
            ctx,
            scratch,
            &mut self.connecting,
            now,
            phase,
        );
    }

    /// Stalled subscribers due for a cut: read again (edge-triggered: nothing else will).
    fn read_unpaused(&mut self, cfg: &LoadConfig, poll: &Poll, ctx: &mut Ctx, now: Instant) {
        for (i, s) in self.all.iter_mut().enumerate() {
            if s.paused_until.is_some_and(|t| t <= now) {
                s.paused_until = None;
                let (scratch, connecting) = (&mut self.scratch, &mut self.connecting);
                sub_read(cfg, s, poll, Token(i), ctx, scratch, connecting, now);
            }
        }
    }

    /// Slow readers: add `added_bytes` to each streaming one's budget and read within it.
    fn read_slow(
        &mut self,
        cfg: &LoadConfig,
        poll: &Poll,
        ctx: &mut Ctx,
        added_bytes: f64,
        now: Instant,
    ) {
        for (i, s) in self.all.iter_mut().enumerate() {
            if s.slow && s.phase == SubPhase::Streaming {
                s.slow_budget_bytes = (s.slow_budget_bytes + added_bytes).min(SCRATCH_BYTES as f64);
                let (scratch, connecting) = (&mut self.scratch, &mut self.connecting);
                sub_read(cfg, s, poll, Token(i), ctx, scratch, connecting, now);
            }
        }
    }

    /// Drain: every fast subscriber has everything that was published (or is over). Not
    /// waited for: slow readers (by design), finished ones, and those the server explicitly
    /// truncated (they may have been moved past the tail; their missing events are explicit,
    /// see `handle_end`).
    fn drained(&self, counters: &[u64]) -> bool {
        self.all.iter().all(|s| {
            s.slow
                || s.phase == SubPhase::Over
                || s.checker.counts().explicit_truncations > 0
                || s.checker.expected() >= counters[s.stream as usize]
        })
    }

    /// Ends every subscriber's check at its stream's published count: the fast and slow
    /// subscribers' counts and the events slow readers had not read.
    fn handle_end(&mut self, counters: &[u64]) -> (CheckCounts, CheckCounts, u64) {
        let mut fast = CheckCounts::default();
        let mut slow = CheckCounts::default();
        let mut slow_backlog = 0;
        for s in self.all.iter_mut() {
            let published = counters[s.stream as usize];
            let explicit = s.checker.counts().explicit_truncations > 0;
            s.checker.handle_end(published, s.slow || explicit);
            if s.slow {
                slow_backlog += published.saturating_sub(s.checker.expected());
                slow.add(s.checker.counts());
            } else {
                fast.add(s.checker.counts());
            }
        }
        (fast, slow, slow_backlog)
    }
}

/// The load window's clock and schedule.
#[derive(Debug)]
struct Window {
    start: Instant,
    publish_deadline: Instant,
    total_events: u64,
    publish_end: Option<Instant>,
    drain_deadline: Option<Instant>,
    cuts_scheduled: u64,
    last_slow_tick: Instant,
    last_sample: Instant,
    last_done_check: Instant,
    slow_bytes_per_sec: f64,
    /// The largest server RSS sampled so far.
    peak_rss: u64,
}

impl Window {
    /// Starts the window now.
    fn new(cfg: &LoadConfig, peak_rss: u64) -> Self {
        let start = Instant::now();
        let slow_bytes_per_sec = if cfg.slow_subscribers_per_stream > 0 {
            cfg.rate_events_per_sec as f64 / cfg.streams as f64
                * (cfg.payload_bytes + WIRE_OVERHEAD_BYTES) as f64
                / f64::from(cfg.slow_rate_divisor.max(1))
        } else {
            0.0
        };
        Window {
            start,
            publish_deadline: start + Duration::from_secs_f64(cfg.publish_secs_max),
            total_events: cfg.events_per_stream * cfg.streams as u64,
            publish_end: None,
            drain_deadline: None,
            cuts_scheduled: 0,
            last_slow_tick: start,
            last_sample: start,
            last_done_check: start,
            slow_bytes_per_sec,
            peak_rss,
        }
    }

    /// How many events the rate allows to have been published by `now` (all without a rate).
    fn allowed_events(&self, cfg: &LoadConfig, now: Instant) -> u64 {
        if cfg.rate_events_per_sec == 0 {
            u64::MAX
        } else {
            (now.duration_since(self.start).as_secs_f64() * cfg.rate_events_per_sec as f64) as u64
                + 1
        }
    }
}

/// The publisher side of a run: its connections, each stream's request head and how many
/// events each stream has been sent.
#[derive(Debug)]
struct Publishers {
    all: Vec<Pub>,
    heads: Vec<Vec<u8>>,
    counters: Vec<u64>,
}

impl Publishers {
    /// Connects the publishers (tokens from `first_token`) and builds each stream's request
    /// head once: "POST <path> HTTP/1.1\r\nHost: ..\r\nContent-Length: ".
    fn open(
        cfg: &LoadConfig,
        poll: &Poll,
        names: &[String],
        first_token: usize,
    ) -> Result<Self, LoadError> {
        let mut all = Vec::with_capacity(cfg.publishers);
        let (url, content_type): (&UrlTemplate, &[u8]) =
            match (&cfg.publish_batch, cfg.batch_events) {
                (Some(b), 2..) => (b, b"application/x-ndjson"),
                _ => (&cfg.publish, b"application/octet-stream"),
            };
        for p in 0..cfg.publishers {
            let mut sock = connect_from(None, url.addr)
                .and_then(|s| wrap(cfg, url, s))
                .map_err(|e| LoadError::Publisher(format!("connect {}: {e}", url.addr)))?;
            poll.registry().register(
                &mut sock,
                Token(first_token + p),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            let streams: Vec<u32> = (0..cfg.streams as u32)
                .filter(|s| *s as usize % cfg.publishers == p)
                .collect();
            all.push(Pub::new(cfg, sock, streams));
        }
        let heads: Vec<Vec<u8>> = names
            .iter()
            .map(|n| build_publish_head(url, n, content_type, &cfg.bearer))
            .collect();
        Ok(Publishers {
            all,
            heads,
            counters: vec![0u64; cfg.streams],
        })
    }

    /// Publisher `i`'s readiness: finish connecting, flush, read responses and refill its
    /// pipeline.
    #[allow(clippy::too_many_arguments)]
    fn handle_event(
        &mut self,
        i: usize,
        ev: &mio::event::Event,
        cfg: &LoadConfig,
        poll: &Poll,
        ctx: &mut Ctx,
        w: &Window,
        now: Instant,
    ) -> Result<(), LoadError> {
        let p = &mut self.all[i];
        if ev.is_writable() && !p.connected {
            if let Some(e) = p.sock.take_error()? {
                return Err(LoadError::Publisher(format!(
                    "connect {}: {e}",
                    cfg.publish.addr
                )));
            }
            if p.sock.peer_addr().is_ok() {
                p.connected = true;
            }
        }
        if p.connected && ev.is_writable() {
            flush_publisher(p).map_err(|e| LoadError::Publisher(format!("write: {e}")))?;
        }
        if ev.is_readable() || ev.is_read_closed() {
            match read_publisher(p, ctx) {
                Ok(()) => {}
                // Done publishing and nothing owed: a server closing an idle
                // keep-alive connection during the drain is not an error.
                Err(_) if w.publish_end.is_some() && p.inflight == 0 => {
                    let _ = poll.registry().deregister(&mut p.sock);
                    p.connected = false;
                    return Ok(());
                }
                Err(e) => return Err(LoadError::Publisher(e)),
            }
            if w.publish_end.is_none() && p.connected {
                let allowed = w.allowed_events(cfg, now);
                if now < w.publish_deadline {
                    fill_publisher(cfg, p, &self.heads, &mut self.counters, ctx, allowed, now);
                    flush_publisher(p).map_err(|e| LoadError::Publisher(format!("write: {e}")))?;
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connect,
    Load,
    Idle,
}

#[allow(clippy::too_many_arguments)]
fn start_connects(
    cfg: &LoadConfig,
    names: &[String],
    subs: &mut [Sub],
    queue: &mut VecDeque<usize>,
    connecting: &mut usize,
    poll: &Poll,
    ctx: &mut Ctx,
    now: Instant,
) {
    while *connecting < cfg.connects_inflight_max {
        let Some(i) = ctx
            .reconnect_queue
            .pop_front()
            .or_else(|| queue.pop_front())
        else {
            break;
        };
        let s = &mut subs[i];
        let src = (cfg.source_addrs > 1 || cfg.source_addr_first > 1).then(|| {
            let octet =
                usize::from(cfg.source_addr_first) + i % usize::from(cfg.source_addrs.max(1));
            Ipv4Addr::new(127, 0, 0, octet.min(254) as u8)
        });
        s.reconnect_at = s.resume_started.map(|_| Instant::now());
        match connect_with_rcvbuf(src, cfg.subscribe.addr, cfg.subscriber_rcvbuf_bytes)
            .and_then(|sock| wrap(cfg, &cfg.subscribe, sock))
        {
            Ok(mut sock) => {
                if let Err(e) = poll.registry().register(
                    &mut sock,
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                ) {
                    fail_sub(s, ctx, format!("register: {e}"));
                    continue;
                }
                build_sub_request(
                    &cfg.subscribe,
                    &cfg.bearer,
                    &names[s.stream as usize],
                    s.sse.last_id(),
                    &mut s.req,
                );
                s.resuming = !s.sse.last_id().is_empty();
                s.req_off = 0;
                s.peer_closed = false;
                s.sock = Some(sock);
                s.phase = SubPhase::Connecting;
                s.phase_since = now;
                *connecting += 1;
            }
            Err(e) => fail_sub(
                s,
                ctx,
                format!("connect {} from {src:?}: {e}", cfg.subscribe.addr),
            ),
        }
    }
}

fn fail_sub(s: &mut Sub, ctx: &mut Ctx, msg: String) {
    s.phase = SubPhase::Over;
    s.failed = true;
    s.sock = None;
    ctx.subscriber_failures += 1;
    ctx.error(msg);
}

fn check_connect_timeouts(
    cfg: &LoadConfig,
    subs: &mut [Sub],
    connecting: &mut usize,
    ctx: &mut Ctx,
    poll: &Poll,
    now: Instant,
) {
    let limit = Duration::from_secs_f64(cfg.connect_secs_max);
    for s in subs.iter_mut() {
        if matches!(
            s.phase,
            SubPhase::Connecting | SubPhase::Requesting | SubPhase::Headers
        ) && now.duration_since(s.phase_since) > limit
        {
            if let Some(mut sock) = s.sock.take() {
                let _ = poll.registry().deregister(&mut sock);
            }
            *connecting -= 1;
            fail_sub(
                s,
                ctx,
                format!(
                    "subscriber of stream {} not streaming after {:.1} s",
                    s.stream,
                    limit.as_secs_f64()
                ),
            );
        }
    }
}

/// Close a subscriber's socket; reconnect (resume from its last ID) unless the budget is spent.
fn close_sub(
    cfg: &LoadConfig,
    s: &mut Sub,
    poll: &Poll,
    connecting: &mut usize,
    ctx: &mut Ctx,
    reconnect: bool,
) {
    if let Some(mut sock) = s.sock.take() {
        let _ = poll.registry().deregister(&mut sock);
    }
    if matches!(
        s.phase,
        SubPhase::Connecting | SubPhase::Requesting | SubPhase::Headers
    ) {
        *connecting -= 1;
    }
    s.phase = SubPhase::Down;
    if !reconnect {
        s.phase = SubPhase::Over;
        return;
    }
    if s.reconnects >= cfg.reconnects_max {
        fail_sub(
            s,
            ctx,
            format!(
                "subscriber of stream {} exceeded --reconnects-max",
                s.stream
            ),
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn handle_sub_event(
    cfg: &LoadConfig,
    s: &mut Sub,
    ev: &mio::event::Event,
    poll: &Poll,
    token: Token,
    ctx: &mut Ctx,
    scratch: &mut [u8],
    connecting: &mut usize,
    now: Instant,
    phase: Phase,
) {
    if s.phase == SubPhase::Connecting && (ev.is_writable() || ev.is_error()) {
        let Some(sock) = s.sock.as_mut() else { return };
        match sock.take_error() {
            Ok(Some(e)) | Err(e) => {
                *connecting -= 1;
                let _ = poll.registry().deregister(sock);
                fail_sub(s, ctx, format!("connect {}: {e}", cfg.subscribe.addr));
                return;
            }
            Ok(None) => {}
        }
        if sock.peer_addr().is_err() {
            return; // spurious wake-up; still connecting
        }
        s.phase = SubPhase::Requesting;
    } else if ev.is_writable()
        && let Some(sock) = s.sock.as_mut()
        && sock.tls_pending()
    {
        // TLS records a full socket refused earlier (the request, handshake messages).
        if let Err(e) = sock.flush_tls() {
            ctx.error(format!("subscriber TLS write: {e}"));
            close_sub(cfg, s, poll, connecting, ctx, phase == Phase::Load);
            return;
        }
    }
    if s.phase == SubPhase::Requesting {
        let Some(sock) = s.sock.as_mut() else { return };
        while s.req_off < s.req.len() {
            match sock.write(&s.req[s.req_off..]) {
                Ok(n) => s.req_off += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    ctx.error(format!("subscribe request write: {e}"));
                    close_sub(cfg, s, poll, connecting, ctx, phase == Phase::Load);
                    return;
                }
            }
        }
        s.phase = SubPhase::Headers;
        s.hdr.clear();
    }
    if ev.is_read_closed() {
        s.peer_closed = true;
    }
    if matches!(s.phase, SubPhase::Headers | SubPhase::Streaming)
        && (ev.is_readable() || ev.is_read_closed())
        && !(s.slow && s.phase == SubPhase::Streaming)
        && s.paused_until.is_none()
    {
        sub_read(cfg, s, poll, token, ctx, scratch, connecting, now);
    }
}

/// Read what is available (slow readers: within their byte budget) and process it.
#[allow(clippy::too_many_arguments)]
fn sub_read(
    cfg: &LoadConfig,
    s: &mut Sub,
    poll: &Poll,
    token: Token,
    ctx: &mut Ctx,
    scratch: &mut [u8],
    connecting: &mut usize,
    now: Instant,
) {
    loop {
        let Some(want) = read_want(s, scratch.len()) else {
            return;
        };
        let Some(sock) = s.sock.as_mut() else { return };
        let n = match sock.read(&mut scratch[..want]) {
            Ok(0) => {
                sub_closed(cfg, s, poll, token, connecting, ctx, None);
                return;
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if boundary_cut_due(cfg, s) {
                    cut_sub(cfg, s, poll, token, connecting, ctx);
                }
                return;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                sub_closed(cfg, s, poll, token, connecting, ctx, Some(e));
                return;
            }
        };
        if s.slow && s.phase == SubPhase::Streaming {
            s.slow_budget_bytes -= n as f64;
        }
        let mut body = &scratch[..n];
        if s.phase == SubPhase::Headers {
            match sub_headers(cfg, s, body, poll, connecting, ctx, now) {
                HeadersRead::Partial => {
                    if n < want && !closing(s) {
                        return;
                    }
                    continue;
                }
                HeadersRead::Streaming { consumed } => body = &body[consumed..],
                HeadersRead::Ended => return,
            }
        }
        let cut_at = cut_within(cfg, s, body.len(), &mut ctx.rng);
        if let Some(left) = cut_at {
            body = &body[..left];
        }
        process_body(s, body, ctx, now);
        if s.phase == SubPhase::Over {
            return;
        }
        if cut_at.is_some() {
            cut_sub(cfg, s, poll, token, connecting, ctx);
            return;
        }
        // A boundary cut needs the socket read to EAGAIN: a short read does not prove it.
        // Nor does it when the peer has closed (the EOF, or over TLS the session's end, is
        // still to be read): read on to the Ok(0).
        if n < want && !(cuts_at_eagain(cfg) && s.cut_after_bytes.is_some()) && !closing(s) {
            return;
        }
    }
}

/// How many bytes a subscriber's next read may take: a streaming slow reader's budget caps it
/// (`None`: the budget is spent).
fn read_want(s: &Sub, scratch_bytes: usize) -> Option<usize> {
    if s.slow && s.phase == SubPhase::Streaming {
        let want = scratch_bytes.min(s.slow_budget_bytes as usize);
        return (want > 0).then_some(want);
    }
    Some(scratch_bytes)
}

/// The server closed a subscriber's connection (`read_error` `None`) or a read from it failed:
/// resume a streaming one (within the reconnect budget). A close before the response head
/// fails the subscriber; a read error is said as an error.
fn sub_closed(
    cfg: &LoadConfig,
    s: &mut Sub,
    poll: &Poll,
    token: Token,
    connecting: &mut usize,
    ctx: &mut Ctx,
    read_error: Option<std::io::Error>,
) {
    ctx.server_closes += 1;
    let again = s.phase == SubPhase::Streaming;
    match &read_error {
        Some(e) => ctx.error(format!("stream {}: read: {e}", s.stream)),
        None if !again => ctx.error(format!(
            "stream {}: server closed before response headers",
            s.stream
        )),
        None => {}
    }
    close_sub(cfg, s, poll, connecting, ctx, again);
    if s.phase == SubPhase::Down {
        s.reconnects += 1;
        ctx.reconnects += 1;
        requeue(s, token, ctx);
    } else if !again && read_error.is_none() {
        s.failed = true;
        ctx.subscriber_failures += 1;
    }
}

/// What reading a subscriber's response head came to.
enum HeadersRead {
    /// Not complete yet.
    Partial,
    /// A 200: the subscriber streams; the body starts `consumed` bytes into the read.
    Streaming { consumed: usize },
    /// A 410 or a bad answer: the subscriber is over.
    Ended,
}

/// Feeds `bytes` to a subscriber's response head and acts on a complete one: a 200 starts the
/// stream (recording resume-to-head latencies), a 410 is an explicit truncation, anything
/// else fails the subscriber.
fn sub_headers(
    cfg: &LoadConfig,
    s: &mut Sub,
    bytes: &[u8],
    poll: &Poll,
    connecting: &mut usize,
    ctx: &mut Ctx,
    now: Instant,
) -> HeadersRead {
    match take_headers(s, bytes, cfg.header_bytes_max) {
        HeaderOutcome::Partial => HeadersRead::Partial,
        HeaderOutcome::Ok { consumed, class } => {
            s.class = class;
            if s.resuming {
                ctx.by_class.resumes[class.index()] += 1;
            }
            if let Some(t0) = s.resume_started {
                let ns = now.saturating_duration_since(t0).as_nanos().max(1) as u64;
                let _ = ctx.resume_headers.record(ns);
            }
            if let Some(t0) = s.reconnect_at {
                // The clock now, not the poll batch's `now`: sub-ms figures.
                let ns = t0.elapsed().as_nanos().max(1) as u64;
                let _ = ctx.by_class.to_head_ns[class.index()].record(ns);
            }
            *connecting -= 1;
            s.phase = SubPhase::Streaming;
            s.phase_since = now;
            s.up_once = true;
            HeadersRead::Streaming { consumed }
        }
        HeaderOutcome::Gone => {
            ctx.http_410 += 1;
            s.checker.handle_truncation();
            *connecting -= 1;
            s.phase = SubPhase::Over;
            if let Some(mut sock) = s.sock.take() {
                let _ = poll.registry().deregister(&mut sock);
            }
            HeadersRead::Ended
        }
        HeaderOutcome::Bad(msg) => {
            *connecting -= 1;
            if let Some(mut sock) = s.sock.take() {
                let _ = poll.registry().deregister(&mut sock);
            }
            fail_sub(s, ctx, format!("stream {}: {msg}", s.stream));
            HeadersRead::Ended
        }
    }
}

/// Resume storm: where a due cut falls inside this read's `body_len` body bytes (a random
/// point, often mid-event), if it does; otherwise the bytes left before it are counted down.
/// With --cut-at-eagain / --cut-at-boundary the cut waits for EAGAIN instead
/// (`boundary_cut_due`).
fn cut_within(cfg: &LoadConfig, s: &mut Sub, body_len: usize, rng: &mut Rng) -> Option<usize> {
    let left = s.cut_after_bytes.filter(|_| !cuts_at_eagain(cfg))?;
    let left = if left == usize::MAX && body_len > 0 {
        rng.below(body_len as u64) as usize
    } else {
        left
    };
    if left < body_len {
        Some(left)
    } else {
        s.cut_after_bytes = Some(left - body_len);
        None
    }
}

/// The peer closed: a short read is followed by the end of stream, which must still be read.
fn closing(s: &Sub) -> bool {
    s.peer_closed || s.sock.as_ref().is_some_and(Conn::read_closed)
}

fn cuts_at_eagain(cfg: &LoadConfig) -> bool {
    cfg.cut_at_eagain || cfg.cut_at_boundary
}

/// Whether a subscriber due for an EAGAIN cut may cut now that its socket said EAGAIN: it is
/// streaming, not stalled, and (with `cut_at_boundary`) its last byte read ends an event.
fn boundary_cut_due(cfg: &LoadConfig, s: &Sub) -> bool {
    cuts_at_eagain(cfg)
        && s.cut_after_bytes.is_some()
        && s.paused_until.is_none()
        && s.phase == SubPhase::Streaming
        && !(cfg.cut_at_boundary && s.sse.mid_event())
}

/// Cut a subscriber's connection (resume storm) and queue its resume from its last event ID.
fn cut_sub(
    cfg: &LoadConfig,
    s: &mut Sub,
    poll: &Poll,
    token: Token,
    connecting: &mut usize,
    ctx: &mut Ctx,
) {
    ctx.cuts += 1;
    s.cut_after_bytes = None;
    close_sub(cfg, s, poll, connecting, ctx, true);
    if s.phase == SubPhase::Down {
        s.reconnects += 1;
        s.resume_started = Some(Instant::now());
        requeue(s, token, ctx);
    }
}

/// Queue a closed subscriber for reconnection with `Last-Event-ID` (its last complete event);
/// `start_connects` serves this queue before first-time connects.
fn requeue(s: &mut Sub, token: Token, ctx: &mut Ctx) {
    s.sse.reset();
    s.chunked = None;
    s.phase = SubPhase::Down;
    ctx.reconnect_queue.push_back(token.0);
}

enum HeaderOutcome {
    Partial,
    Ok {
        consumed: usize,
        /// What `X-Resume-Class` said (`None` without the header).
        class: ResumeClass,
    },
    Gone,
    Bad(String),
}

fn take_headers(s: &mut Sub, bytes: &[u8], header_bytes_max: usize) -> HeaderOutcome {
    let prev = s.hdr.len();
    s.hdr.extend_from_slice(bytes);
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(&s.hdr) {
        Ok(httparse::Status::Partial) => {
            if s.hdr.len() > header_bytes_max {
                HeaderOutcome::Bad(format!(
                    "response headers exceed --header-bytes-max {header_bytes_max}"
                ))
            } else {
                HeaderOutcome::Partial
            }
        }
        Ok(httparse::Status::Complete(len)) => {
            let code = resp.code.unwrap_or(0);
            let chunked = resp.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("transfer-encoding")
                    && h.value
                        .windows(7)
                        .any(|w| w.eq_ignore_ascii_case(b"chunked"))
            });
            let out = match code {
                200 => {
                    s.chunked = chunked.then(Dechunker::new);
                    HeaderOutcome::Ok {
                        consumed: len - prev,
                        class: ResumeClass::from_headers(
                            resp.headers.iter().map(|h| (h.name, h.value)),
                        ),
                    }
                }
                410 => HeaderOutcome::Gone,
                _ => {
                    let body = String::from_utf8_lossy(&s.hdr[len..s.hdr.len().min(len + 200)])
                        .into_owned();
                    HeaderOutcome::Bad(format!("subscribe answered HTTP {code}: {body}"))
                }
            };
            s.hdr = Vec::new();
            out
        }
        Err(e) => HeaderOutcome::Bad(format!("bad response headers: {e}")),
    }
}

fn process_body(s: &mut Sub, body: &[u8], ctx: &mut Ctx, now: Instant) {
    let now_ns = now.duration_since(ctx.origin).as_nanos() as u64;
    let Sub {
        chunked,
        sse,
        checker,
        slow,
        resume_started,
        reconnect_at,
        stream,
        class,
        ..
    } = s;
    let mut on_event = |ev: Event<'_>| {
        if let Some(t0) = resume_started.take() {
            let ns = now.saturating_duration_since(t0).as_nanos().max(1) as u64;
            let _ = ctx.resume.record(ns);
        }
        if let Some(t0) = reconnect_at.take() {
            let ns = t0.elapsed().as_nanos().max(1) as u64;
            let _ = ctx.by_class.to_first_event_ns[class.index()].record(ns);
        }
        handle_event(ev, checker, ctx, *slow, now_ns);
    };
    match chunked {
        Some(d) => {
            let mut rest = body;
            while !rest.is_empty() {
                match d.feed(rest, &mut |data| sse.feed(data, &mut on_event)) {
                    Ok(used) => rest = &rest[used..],
                    Err(e) => {
                        checker.handle_malformed();
                        ctx.error(format!("stream {stream}: chunked body: {e}"));
                        break;
                    }
                }
            }
        }
        None => sse.feed(body, &mut on_event),
    }
}

fn handle_event(ev: Event<'_>, checker: &mut Checker, ctx: &mut Ctx, slow: bool, now_ns: u64) {
    if ev.event_type == b"truncated" {
        checker.handle_truncation();
        return;
    }
    let (counter, t_ns) = match parse_payload(ev.data_prefix) {
        Ok(v) => v,
        Err(_) => {
            checker.handle_malformed();
            return;
        }
    };
    let seq = match ctx.id_style {
        IdStyle::Nchan => None,
        IdStyle::Gateway => match gateway_seq(ev.id) {
            Ok(v) => Some(v),
            Err(_) => {
                checker.handle_bad_id();
                None
            }
        },
    };
    checker.handle_event(counter, seq);
    let lat = now_ns.saturating_sub(t_ns).max(1);
    let h = if slow {
        &mut ctx.latency_slow
    } else {
        &mut ctx.latency_fast
    };
    let _ = h.record(lat.min(h.high()));
}

fn fill_publisher(
    cfg: &LoadConfig,
    p: &mut Pub,
    heads: &[Vec<u8>],
    counters: &mut [u64],
    ctx: &mut Ctx,
    allowed_total: u64,
    now: Instant,
) {
    let t_ns = now.duration_since(ctx.origin).as_nanos() as u64;
    let n = p.streams.len();
    let mut idle_streams = 0;
    while p.inflight < cfg.pipeline_depth && ctx.published < allowed_total && idle_streams < n {
        let s = p.streams[p.rr] as usize;
        p.rr = (p.rr + 1) % n;
        if counters[s] >= cfg.events_per_stream {
            idle_streams += 1;
            continue;
        }
        idle_streams = 0;
        if p.woff > 0 && p.woff == p.wbuf.len() {
            p.wbuf.clear();
            p.woff = 0;
        }
        p.wbuf.extend_from_slice(&heads[s]);
        if cfg.batch_events > 1 {
            // Our payloads are ASCII without quotes or backslashes: valid JSON strings as-is.
            let k = (cfg.batch_events as u64)
                .min(cfg.events_per_stream - counters[s])
                .min(allowed_total - ctx.published);
            let line_bytes = cfg.payload_bytes + BATCH_LINE_OVERHEAD.len();
            let _ = write!(p.wbuf, "{}\r\n\r\n", k as usize * line_bytes);
            for _ in 0..k {
                p.wbuf.extend_from_slice(&BATCH_LINE_OVERHEAD[..9]);
                write_payload(&mut p.wbuf, counters[s], t_ns, cfg.payload_bytes);
                p.wbuf.extend_from_slice(&BATCH_LINE_OVERHEAD[9..]);
                counters[s] += 1;
            }
            ctx.published += k;
        } else {
            let _ = write!(p.wbuf, "{}\r\n\r\n", cfg.payload_bytes);
            write_payload(&mut p.wbuf, counters[s], t_ns, cfg.payload_bytes);
            counters[s] += 1;
            ctx.published += 1;
        }
        p.inflight += 1;
    }
}

fn flush_publisher(p: &mut Pub) -> std::io::Result<()> {
    p.sock.flush_tls()?; // TLS records left over from the last write (nothing in the clear)
    while p.woff < p.wbuf.len() {
        match p.sock.write(&p.wbuf[p.woff..]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                if let Some((_, w)) = &mut p.trace {
                    w.push(&p.wbuf[p.woff..p.woff + n]);
                }
                p.woff += n
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    p.wbuf.clear();
    p.woff = 0;
    Ok(())
}

/// Read and account publish responses (status checked; bodies skipped).
fn read_publisher(p: &mut Pub, ctx: &mut Ctx) -> Result<(), String> {
    loop {
        if p.rlen == p.rbuf.len() {
            return Err("publish response larger than the response buffer".into());
        }
        let n = match p.sock.read(&mut p.rbuf[p.rlen..]) {
            Ok(0) => return Err("server closed the publisher connection".into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("publisher read: {e}")),
        };
        if let Some((r, _)) = &mut p.trace {
            r.push(&p.rbuf[p.rlen..p.rlen + n]);
        }
        p.rlen += n;
        let pos = take_responses(p, ctx)?;
        p.rbuf.copy_within(pos..p.rlen, 0);
        p.rlen -= pos;
    }
}

/// Accounts the responses buffered in `p.rbuf[..p.rlen]` as far as they go; returns the bytes
/// taken.
fn take_responses(p: &mut Pub, ctx: &mut Ctx) -> Result<usize, String> {
    let mut pos = 0;
    loop {
        match p.resp {
            RespState::Head => match take_response_head(p, pos)? {
                Some(len) => pos += len,
                None => break,
            },
            RespState::Body(left) => {
                let take = left.min(p.rlen - pos);
                if p.status / 100 != 2 && ctx.errors.len() < 16 {
                    let body =
                        String::from_utf8_lossy(&p.rbuf[pos..pos + take.min(200)]).into_owned();
                    ctx.error(format!("publish answered HTTP {}: {body}", p.status));
                }
                pos += take;
                if take < left {
                    p.resp = RespState::Body(left - take);
                    break;
                }
                complete_response(p, ctx)?;
            }
            RespState::Chunked => {
                if pos == p.rlen {
                    break;
                }
                let used = p
                    .dechunk
                    .feed(&p.rbuf[pos..p.rlen], &mut |_| {})
                    .map_err(|e| format!("publish response: {e}"))?;
                pos += used;
                if p.dechunk.is_done() {
                    complete_response(p, ctx)?;
                } else {
                    break;
                }
            }
        }
    }
    Ok(pos)
}

/// Parses the response head buffered at `pos`: once complete its length (status and body
/// framing taken), `None` while partial.
fn take_response_head(p: &mut Pub, pos: usize) -> Result<Option<usize>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(&p.rbuf[pos..p.rlen]) {
        Ok(httparse::Status::Complete(len)) => {
            p.status = resp.code.unwrap_or(0);
            let mut cl = 0usize;
            let mut chunked = false;
            for h in resp.headers.iter() {
                if h.name.eq_ignore_ascii_case("content-length") {
                    cl = std::str::from_utf8(h.value)
                        .ok()
                        .and_then(|v| v.trim().parse().ok())
                        .ok_or("bad Content-Length in publish response")?;
                } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = true;
                }
            }
            p.resp = if chunked {
                p.dechunk = Dechunker::new();
                RespState::Chunked
            } else {
                RespState::Body(cl)
            };
            Ok(Some(len))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => {
            let at = &p.rbuf[pos..p.rlen.min(pos + 160)];
            Err(format!(
                "bad publish response: {e} (at byte {pos} of {} buffered, {} \
                 responses awaited): {:?}{}",
                p.rlen,
                p.inflight,
                String::from_utf8_lossy(at),
                dump_trace(p)
            ))
        }
    }
}

/// Accounts one complete publish response. A response with no request outstanding is the
/// server speaking first (for example a 503 written at accept when it is at its connection
/// limit): an explicit error for this publisher, never a panic of the load generator.
fn complete_response(p: &mut Pub, ctx: &mut Ctx) -> Result<(), String> {
    let Some(inflight) = p.inflight.checked_sub(1) else {
        return Err(format!(
            "unsolicited HTTP {} on a publisher connection with no request outstanding{}",
            p.status,
            dump_trace(p)
        ));
    };
    if p.status / 100 != 2 {
        ctx.publish_errors += 1;
    }
    ctx.responses += 1;
    p.inflight = inflight;
    p.resp = RespState::Head;
    Ok(())
}

/// Bytes of a publisher connection's traffic kept each way under `BENCH_TRACE_DIR`.
const TRACE_BYTES: usize = 256 * 1024;

/// `BENCH_TRACE_DIR`: where a publisher connection whose responses stop making sense writes
/// its last bytes read and written (off when unset: nothing is kept).
fn trace_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("BENCH_TRACE_DIR").map(Into::into)
}

/// Writes a publisher's traced bytes (if tracing) and says where, for the error message.
fn dump_trace(p: &Pub) -> String {
    let (Some((r, w)), Some(dir)) = (&p.trace, trace_dir()) else {
        return String::new();
    };
    let base = dir.join(format!(
        "publisher-{}-{}",
        std::process::id(),
        p.sock.local_addr().map_or(0, |a| a.port())
    ));
    let (rp, wp) = (base.with_extension("read"), base.with_extension("written"));
    match std::fs::write(&rp, r.bytes()).and_then(|()| std::fs::write(&wp, w.bytes())) {
        Ok(()) => format!(
            " [last {} of {} bytes read in {}, last {} of {} written in {}]",
            r.bytes().len(),
            r.total(),
            rp.display(),
            w.bytes().len(),
            w.total(),
            wp.display()
        ),
        Err(e) => format!(" [trace not written to {}: {e}]", dir.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> UrlTemplate {
        UrlTemplate::parse(s).unwrap()
    }

    #[test]
    fn requests_without_a_token_carry_no_authorization() {
        let mut out = Vec::new();
        let sub = url("http://127.0.0.1:8080/v1/streams/{stream}");
        build_sub_request(&sub, &Bearer::none(), "s1", b"", &mut out);
        assert_eq!(
            out,
            b"GET /v1/streams/s1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
              Accept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"
        );
        let publish = url("http://127.0.0.1:8080/v1/streams/{stream}/events");
        let head = build_publish_head(&publish, "s1", b"application/octet-stream", &Bearer::none());
        assert_eq!(
            head,
            b"POST /v1/streams/s1/events HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
              Content-Type: application/octet-stream\r\nContent-Length: "
        );
    }

    #[test]
    fn bearer_token_is_sent_on_publish_and_subscribe() {
        let bearer = Bearer::from_token_text("abc.def.ghi\n").unwrap();
        let mut out = Vec::new();
        let sub = url("http://127.0.0.1:8080/v1/streams/{stream}");
        build_sub_request(&sub, &bearer, "s1", b"00000000000000ab-0-7", &mut out);
        assert_eq!(
            out,
            b"GET /v1/streams/s1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
              Accept: text/event-stream\r\nCache-Control: no-cache\r\n\
              Authorization: Bearer abc.def.ghi\r\n\
              Last-Event-ID: 00000000000000ab-0-7\r\n\r\n"
        );
        let batch = url("http://127.0.0.1:8080/v1/streams/{stream}/events:batch");
        let head = build_publish_head(&batch, "s2", b"application/x-ndjson", &bearer);
        assert_eq!(
            head,
            b"POST /v1/streams/s2/events:batch HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
              Content-Type: application/x-ndjson\r\n\
              Authorization: Bearer abc.def.ghi\r\nContent-Length: "
        );
    }
}
