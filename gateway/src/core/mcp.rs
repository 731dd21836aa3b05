//! One MCP shard's part of the MCP front, on the core that owns the shard: [`Mcp`] turns a
//! request on the MCP path into an [`HttpRequest`] for the pure [`McpCore`], runs the
//! upstreams ([`UpstreamSet`]) and keeps the MCP core's timers; its actions (`mcp_apply`)
//! become [`Effect`]s that `mcp_drive` carries out against the core. It never sees the core:
//! each call borrows only what it needs ([`McpCx`]). It holds no protocol logic. Its sessions'
//! IDs name its shard, so their streams (`mcp/<session>/...`) are in it (`shards::shard_of`)
//! and requests landing on other cores are handed to this one (`shards::McpPlace`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log_store::{Bounds, Epoch, Log, Seq, StreamId};

use super::cluster_state::ClusterCore;
use crate::config::Config;
use crate::mcp::core::{ConnId, HttpMethod, HttpRequest, LogView, McpCore, SessionCount};
use crate::mcp::upstream::{UpstreamEvent, UpstreamSet, Upstreams};
use crate::metrics::CoreMetrics;
use crate::shards::{self, McpPlace};
use crate::streams::StreamKey;
use crate::streams::catalog::MCP_STREAM_PREFIX;
use crate::streams::hub::{Hub, SubRef};

/// Broken streams remembered per `--mcp-sessions-max` session (see `Mcp::broken`).
pub(super) const BROKEN_PER_SESSION_MAX: usize = 8;

/// How often exited upstream children are looked for (a `try_wait` per child).
const REAP_INTERVAL: Duration = Duration::from_millis(100);

/// How often the `gateway_mcp_*` metrics snapshot is refreshed while MCP state changes.
const METRICS_INTERVAL: Duration = Duration::from_millis(250);

/// What [`Mcp`] borrows of the core for one call: disjoint parts, never the core itself.
pub(super) struct McpCx<'a> {
    pub(super) now: Instant,
    /// The logs (the MCP shard's) and subscribers by stream.
    pub(super) hub: &'a mut Hub,
    /// Cluster mode: where MCP records are published.
    pub(super) cluster: Option<&'a mut ClusterCore>,
    pub(super) metrics: &'a CoreMetrics,
    pub(super) cfg: &'a Config,
    /// Every shard's log epoch.
    pub(super) epochs: &'a [Epoch],
}

/// What the core is to do for the MCP part (`mcp_drive` carries these out, in order).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Effect {
    /// A whole answer on `conn`, if it is still open (then closed if `close`).
    Respond {
        conn: SubRef,
        bytes: Vec<u8>,
        close: bool,
    },
    /// `conn` becomes a subscriber of MCP stream `stream` (`key`: `None` in cluster mode
    /// while its first record is not applied here) from `from_seq`, with the response head
    /// `head`, never parked, ending after `end_after`. If `conn` is gone meanwhile, the MCP
    /// core is told its connection `cid` went away instead.
    Subscribe(McpSubscribe),
    /// Close `conn` if it is still open.
    Close(SubRef),
    /// The subscriber on `conn` (if still there) ends after `last_seq`; pump it.
    EndAfter { conn: SubRef, last_seq: Seq },
}

/// An MCP response stream to open on `conn` (`Effect::Subscribe`): its stream (`key`; `None`
/// in cluster mode until its first message is applied here), from `from_seq`, after `head`,
/// ending after `end_after` when the stream is complete.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct McpSubscribe {
    pub(super) conn: SubRef,
    pub(super) cid: ConnId,
    pub(super) stream: String,
    pub(super) key: Option<StreamKey>,
    pub(super) from_seq: Seq,
    pub(super) head: Vec<u8>,
    pub(super) end_after: Option<Seq>,
}

/// MCP state of the owning core.
pub(super) struct Mcp {
    pub(super) core: McpCore,
    pub(super) ups: Box<dyn Upstreams>,
    pub(super) shard: u32,
    /// The core's id (for log lines).
    pub(super) core_id: usize,
    t0: Instant,
    pub(super) next_conn: ConnId,
    /// The core's next timer, recomputed after every input (so idle reactor turns cost O(1)).
    pub(super) deadline_ms: Option<u64>,
    /// When exited children are next reaped (every `REAP_INTERVAL`, or on a closed stdout).
    pub(super) next_reap: Instant,
    /// Core connection id → (slot, generation, close after response).
    pub(super) conns: HashMap<ConnId, (u32, u32, bool)>,
    /// Slot → the MCP connection id of the request / SSE response it carries.
    pub(super) by_slot: HashMap<u32, ConnId>,
    /// Streams whose log refused a record and its substitute (disk full, poisoned log): the
    /// core's sequence prediction is ahead of the log, so nothing more is appended to them,
    /// their connections are closed and resuming them is an explicit 503 (stream → reason).
    /// Bounded: past `BROKEN_PER_SESSION_MAX` × `--mcp-sessions-max` entries the oldest of
    /// streams the MCP core no longer holds go (`broken_order`; the ones it holds are bounded by
    /// its sessions and their streams).
    pub(super) broken: HashMap<String, String>,
    pub(super) broken_order: std::collections::VecDeque<String>,
    /// The MCP shard's log was found poisoned (`Mcp::log_failed` has run).
    pub(super) log_poisoned: bool,
    /// Messages handed to upstreams (lines / POST bodies).
    pub(super) messages_up: u64,
    /// Records the log refused (replaced by an error record, or breaking the stream).
    pub(super) records_refused: u64,
    /// Something changed since the last metrics snapshot; refreshed at `next_metrics`.
    pub(super) metrics_dirty: bool,
    pub(super) next_metrics: Instant,
    /// Cluster mode: MCP records on their way through JetStream, held resumes.
    pub(super) cluster: Option<super::mcp_cluster_state::McpCluster>,
    /// Upstream calls being timed.
    pub(super) calls: super::mcp_calls::Calls,
}

impl std::fmt::Debug for Mcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mcp")
            .field("core", &self.core)
            .field("ups", &self.ups)
            .finish()
    }
}

/// A complete request on the MCP path.
#[derive(Debug)]
pub(super) struct McpRequest<'a> {
    /// The connection and its generation now.
    pub(super) conn: SubRef,
    pub(super) head: &'a [u8],
    pub(super) body: Vec<u8>,
    pub(super) close: bool,
    /// The verified token's subject (with JWT keys configured).
    pub(super) subject: Option<&'a str>,
}

/// The MCP shard's log as the core sees it.
struct LogRef<'a> {
    log: &'a Log,
    epochs: &'a [Epoch],
}

impl LogView for LogRef<'_> {
    fn epoch(&self) -> Epoch {
        self.log.epoch()
    }
    fn stream_name(&self, id: StreamId) -> Option<&str> {
        self.log.stream_name(id)
    }
    fn bounds(&self, id: StreamId) -> Option<Bounds> {
        self.log.bounds(id)
    }
    fn known_epochs(&self) -> &[Epoch] {
        self.epochs
    }
}

/// Where a session ID's 16 bytes come from.
pub type SessionIds = Box<dyn FnMut() -> [u8; 16] + Send>;

/// The MCP front's outside world: its upstreams, and where session IDs come from (`None`: the
/// operating system's randomness). The gateway builds the real ones from its flags; the
/// simulator brings a deterministic pair, so that one seed gives one trace.
pub struct McpOutside {
    pub upstreams: Box<dyn Upstreams>,
    pub session_ids: Option<SessionIds>,
}

impl std::fmt::Debug for McpOutside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpOutside")
            .field("upstreams", &self.upstreams)
            .field("session_ids", &self.session_ids.is_some())
            .finish()
    }
}

/// The MCP core's source of session IDs: 16 random bytes; in cluster mode (`minted`) every
/// session ID this process mints starts with its 4 random bytes (96 random bits remain), so
/// it tells its own sessions from other nodes' ones. The first call names the process's
/// modern-era streams: all random.
fn session_ids(minted: Option<[u8; 4]>) -> SessionIds {
    let mut first = true;
    Box::new(move || {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).expect("getrandom for MCP session ids");
        if let Some(m) = minted.filter(|_| !first) {
            b[..4].copy_from_slice(&m);
        }
        first = false;
        b
    })
}

/// The shard the first `Mcp-Session-Id` of request head `head` names
/// (`shards::mcp_owner_shard`), if it carries one.
pub(super) fn session_shard(head: &[u8], shards: u32) -> Option<u32> {
    let line = head.split(|b| *b == b'\n').skip(1).find_map(|l| {
        let colon = l.iter().position(|b| *b == b':')?;
        l[..colon]
            .eq_ignore_ascii_case(b"mcp-session-id")
            .then(|| &l[colon + 1..])
    })?;
    let sid = std::str::from_utf8(line.trim_ascii()).ok()?;
    Some(shards::mcp_owner_shard(sid, shards))
}

/// The request's method, every header of `head`, and its `Last-Event-ID`.
type Parsed<'h> = (HttpMethod, Vec<(&'h str, &'h [u8])>);

/// Re-reads `head` for every header (the connection machine keeps only a few).
fn parse_head<'h>(head: &'h [u8], hs: &'h mut [httparse::Header<'h>]) -> Parsed<'h> {
    let mut req = httparse::Request::new(hs);
    let parsed = req.parse(head);
    if !matches!(parsed, Ok(httparse::Status::Complete(_))) {
        // parse_head accepted this head already; a mismatch is a bug, not peer input.
        unreachable!("head re-parse failed after parse_head succeeded: {parsed:?}");
    }
    let method = match req.method {
        Some("GET") => HttpMethod::Get,
        Some("POST") => HttpMethod::Post,
        Some("DELETE") => HttpMethod::Delete,
        _ => HttpMethod::Other,
    };
    let headers = req
        .headers
        .iter()
        .filter(|h| !h.name.is_empty())
        .map(|h| (h.name, h.value))
        .collect();
    (method, headers)
}

fn header<'h>(headers: &[(&str, &'h [u8])], name: &str) -> Option<&'h [u8]> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| *v)
}

impl Mcp {
    /// The MCP part of core `core_id`, whose sessions live in shard `shard`, with its
    /// upstreams and session IDs from `outside`; outside cluster mode it recovers the sessions
    /// whose streams are in that shard's log. When the front runs on every core (`place`),
    /// the IDs it mints name the shard; `sessions` counts every part's sessions against
    /// `--mcp-sessions-max`.
    pub(super) fn new(
        cfg: &Config,
        (core_id, shard): (usize, u32),
        (place, sessions): (McpPlace, &SessionCount),
        outside: McpOutside,
        hub: &Hub,
        now: Instant,
    ) -> Mcp {
        let args = &cfg.mcp;
        let clustered = !place.everywhere;
        let mut minted = [0u8; 4];
        getrandom::fill(&mut minted).expect("getrandom for MCP session ids");
        let ids = (outside.session_ids).unwrap_or_else(|| session_ids(clustered.then_some(minted)));
        let mut mcfg = args.core_config();
        mcfg.sessions = sessions.clone();
        if place.everywhere {
            mcfg.session_id_prefix = shards::mcp_id_prefix(shard);
        }
        let mut core = McpCore::new(mcfg, ids);
        // Cluster mode recovers a session when a client resumes it (`cluster_recover`): the
        // log holds every node's sessions.
        if hub.has_shard(shard) && !clustered {
            for (_, name, _) in hub.log(shard).streams() {
                if name.starts_with(MCP_STREAM_PREFIX) {
                    core.recover_stream(name, 0);
                }
            }
        }
        tracing::info!(
            core = core_id,
            path = %args.mcp_path,
            shard,
            sessions_recovered = core.sessions_live(),
            "MCP front started"
        );
        let deadline_ms = core.poll_timeout();
        Mcp {
            core,
            ups: outside.upstreams,
            shard,
            core_id,
            t0: now,
            next_conn: 1,
            deadline_ms,
            next_reap: now,
            conns: HashMap::new(),
            by_slot: HashMap::new(),
            broken: HashMap::new(),
            broken_order: std::collections::VecDeque::new(),
            log_poisoned: false,
            messages_up: 0,
            records_refused: 0,
            metrics_dirty: true,
            next_metrics: now,
            cluster: clustered.then(|| {
                let hex: String = minted.iter().map(|b| format!("{b:02x}")).collect();
                super::mcp_cluster_state::McpCluster::new(hex)
            }),
            calls: Default::default(),
        }
    }

    /// Milliseconds since this part started (the MCP core's clock).
    pub(super) fn now_ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.t0).as_millis() as u64
    }

    /// A complete request on the MCP path: every header and the body go to the MCP core.
    /// False if it is held instead (cluster mode: its `Last-Event-ID` is not applied here
    /// yet), to be carried out later.
    pub(super) fn handle_request(
        &mut self,
        req: McpRequest<'_>,
        header_count_max: usize,
        cx: &mut McpCx<'_>,
    ) -> bool {
        let McpRequest {
            conn,
            head,
            mut body,
            close,
            subject,
        } = req;
        let mut hs = vec![httparse::EMPTY_HEADER; header_count_max];
        let (method, headers) = parse_head(head, &mut hs);
        let last_event_id = header(&headers, "last-event-id");
        if method == HttpMethod::Get {
            let held = (head, &mut body, close, subject);
            if self.cluster_hold(conn, held, last_event_id, cx) {
                return false;
            }
            let session = header(&headers, "mcp-session-id");
            self.cluster_recover(last_event_id, session, subject, cx);
        }
        let now_ms = self.now_ms(cx.now);
        let cid = self.next_conn;
        self.next_conn += 1;
        self.conns.insert(cid, (conn.0, conn.1, close));
        self.by_slot.insert(conn.0, cid);
        let request = HttpRequest {
            conn: cid,
            method,
            headers: &headers,
            body: &body,
            subject,
        };
        let view = LogRef {
            log: cx.hub.log(self.shard),
            epochs: cx.epochs,
        };
        self.core.handle_http(now_ms, &request, &view);
        true
    }

    /// The core's connection went away before its response could be opened.
    pub(super) fn conn_gone(&mut self, now: Instant, cid: ConnId) {
        if let Some((slot, _, _)) = self.conns.remove(&cid)
            && self.by_slot.get(&slot) == Some(&cid)
        {
            self.by_slot.remove(&slot);
        }
        self.core.handle_connection_closed(self.now_ms(now), cid);
    }

    /// The connection on `slot` closed: true if it carried an MCP request or response.
    pub(super) fn conn_closed(&mut self, now: Instant, slot: u32) -> bool {
        let Some(cid) = self.by_slot.remove(&slot) else {
            return false;
        };
        self.conn_gone(now, cid);
        true
    }

    /// Takes one upstream event (a line, an exit) to the MCP core: false if none is queued.
    pub(super) fn handle_upstream_event(&mut self, now: Instant) -> bool {
        let now_ms = self.now_ms(now);
        let Some(ev) = self.ups.try_recv() else {
            return false;
        };
        match ev {
            UpstreamEvent::Line(id, line) => self.core.handle_upstream_line(now_ms, id, &line),
            UpstreamEvent::LineTooLong(id, n) => {
                // Dropping the line could hide a response: end the upstream explicitly.
                let why = format!("upstream wrote a {n}-byte line, over --event-bytes-max");
                crate::warn_limited!(
                    core = self.core_id,
                    upstream = id.0,
                    line_bytes = n,
                    "MCP upstream ended: {why}"
                );
                self.ups.kill(id, now);
                self.core.handle_upstream_exit(now_ms, id, &why);
            }
            UpstreamEvent::Closed(id) => {
                self.ups.kill(id, now); // reap (SIGKILL after grace if it lingers)
                self.core
                    .handle_upstream_exit(now_ms, id, "upstream closed its stdout");
            }
            UpstreamEvent::Failed(id, why) => {
                self.ups.kill(id, now);
                self.core.handle_upstream_exit(now_ms, id, &why);
            }
        }
        true
    }

    /// The timers: exited children (every `REAP_INTERVAL`), then the MCP core's own.
    pub(super) fn handle_timers(&mut self, now: Instant) {
        let now_ms = self.now_ms(now);
        if now >= self.next_reap {
            self.next_reap = now + REAP_INTERVAL;
            for (id, status) in self.ups.poll(now) {
                let why = format!("upstream exited: {status}");
                self.core.handle_upstream_exit(now_ms, id, &why);
            }
        }
        if self.deadline_ms.is_some_and(|t| t <= now_ms) {
            self.core.handle_tick(now_ms);
        }
    }

    /// Whether a snapshot of the `gateway_mcp_*` figures is due (something changed and
    /// `METRICS_INTERVAL` passed since the last one); it then counts as taken.
    pub(super) fn metrics_due(&mut self, now: Instant) -> bool {
        if !self.metrics_dirty || now < self.next_metrics {
            return false;
        }
        self.metrics_dirty = false;
        self.next_metrics = now + METRICS_INTERVAL;
        true
    }

    /// The next instant this part needs a turn: the MCP core's timer, the reaping of
    /// children, the metrics snapshot.
    pub(super) fn deadline(&self) -> Option<Instant> {
        let timer = self
            .deadline_ms
            .map(|ms| self.t0 + Duration::from_millis(ms));
        let reap = (self.ups.children() > 0).then_some(self.next_reap);
        let metrics = self.metrics_dirty.then_some(self.next_metrics);
        [timer, reap, metrics].into_iter().flatten().min()
    }

    /// After the MCP core's shutdown actions are carried out: upstream children are stopped.
    pub(super) fn stop(&mut self) {
        let st = self.core.stats();
        tracing::info!(
            core = self.core_id,
            upstreams = self.ups.children(),
            sessions_created = st.sessions_minted,
            sessions_terminated = st.sessions_terminated,
            messages_up = self.messages_up,
            messages_down = st.upstream_lines,
            messages_not_jsonrpc = st.upstream_garbage_lines,
            messages_no_destination = st.orphan_messages,
            resumes_ok = st.resumes_ok,
            resumes_truncated = st.resumes_truncated,
            resumes_rejected = st.resumes_rejected,
            modern_cancels = st.modern_cancels,
            upstream_deaths = st.upstream_deaths,
            records_refused = self.records_refused,
            "MCP front stopping"
        );
        self.ups.stop_all();
    }
}

/// The wake-up an upstream thread calls (this core's eventfd).
pub(super) type Wake = Arc<dyn Fn() + Send + Sync>;

/// The upstreams of `cfg`'s MCP front (a command or an HTTP endpoint).
pub(super) fn upstreams(cfg: &Config, wake: Wake) -> UpstreamSet {
    let args = &cfg.mcp;
    let limits = args.upstream_limits(cfg.event_bytes_max);
    match (&args.upstream_cmd, &args.upstream_url) {
        (Some(cmd), _) => UpstreamSet::new(cmd.clone(), limits, wake),
        (None, Some(_)) => UpstreamSet::new_http(
            args.http_endpoint()
                .expect("--upstream-url is checked by McpArgs::validate at start")
                .expect("--upstream-url is given"),
            limits,
            wake,
        ),
        (None, None) => unreachable!("enabled() checked"),
    }
}
