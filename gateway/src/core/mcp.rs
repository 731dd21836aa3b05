//! The MCP front's thin driver inside the core that owns the MCP shard: turns a request on
//! the MCP path into an [`HttpRequest`] for the pure [`McpCore`], runs the upstreams
//! ([`UpstreamSet`]), and feeds the core's timers; its actions are carried out by
//! `mcp_apply`. It holds no protocol logic. All MCP streams (`mcp/...`) hash to one shard
//! (see `shards::shard_of`), so one core owns the MCP state; requests landing on other cores
//! are handed to it like any stream request.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log_store::{Bounds, Epoch, Log, StreamId};

use super::Core;
use crate::mcp::core::{ConnId, HttpMethod, HttpRequest, LogView, McpCore};
use crate::mcp::upstream::{UpstreamEvent, UpstreamSet};
use crate::shards;
use crate::sys;

/// The name every MCP stream is routed by (see `shards::shard_of`).
const MCP_SHARD_ANCHOR: &str = crate::streams::catalog::MCP_STREAM_PREFIX;

/// Upstream events handled per drain before the core yields to other work (it re-wakes
/// itself when more are queued).
const UPSTREAM_EVENTS_PER_TURN_MAX: usize = 4096;

/// Broken streams remembered per `--mcp-sessions-max` session (see `Mcp::broken`).
pub(super) const BROKEN_PER_SESSION_MAX: usize = 8;

/// How often exited upstream children are looked for (a `try_wait` per child).
const REAP_INTERVAL: Duration = Duration::from_millis(100);

/// How often the `gateway_mcp_*` metrics snapshot is refreshed while MCP state changes.
const METRICS_INTERVAL: Duration = Duration::from_millis(250);

/// MCP state of the owning core.
pub(super) struct Mcp {
    pub(super) core: McpCore,
    pub(super) ups: UpstreamSet,
    pub(super) shard: u32,
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
    /// Messages handed to upstreams (lines / POST bodies).
    pub(super) messages_up: u64,
    /// Records the log refused (replaced by an error record, or breaking the stream).
    pub(super) records_refused: u64,
    /// Something changed since the last metrics snapshot; refreshed at `next_metrics`.
    pub(super) metrics_dirty: bool,
    pub(super) next_metrics: Instant,
    /// Cluster mode: MCP records on their way through JetStream, held resumes.
    pub(super) cluster: Option<super::mcp_cluster::McpCluster>,
}

impl std::fmt::Debug for Mcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mcp")
            .field("core", &self.core)
            .field("ups", &self.ups)
            .finish()
    }
}

impl Mcp {
    /// The `gateway_mcp_*` lines of `/metrics` (Prometheus text format).
    fn render_metrics(&self) -> String {
        use std::fmt::Write as _;
        let st = self.core.stats();
        let plain: [(&str, &str, u64); 13] = [
            ("sessions_open", "gauge", self.core.sessions_live() as u64),
            ("sessions_created_total", "counter", st.sessions_minted),
            (
                "sessions_terminated_total",
                "counter",
                st.sessions_terminated,
            ),
            ("streams_open", "gauge", self.core.streams_live() as u64),
            (
                "sse_connections",
                "gauge",
                self.core.connections_live() as u64,
            ),
            ("upstreams", "gauge", self.ups.children() as u64),
            ("upstream_deaths_total", "counter", st.upstream_deaths),
            ("messages_up_total", "counter", self.messages_up),
            ("messages_down_total", "counter", st.upstream_lines),
            ("messages_dropped_total", "counter", 0),
            ("resumes_total", "counter", 0),
            ("modern_cancels_total", "counter", st.modern_cancels),
            ("records_refused_total", "counter", self.records_refused),
        ];
        let labelled: [(&str, &str, &str, u64); 5] = [
            (
                "messages_dropped_total",
                "reason",
                "not_jsonrpc",
                st.upstream_garbage_lines,
            ),
            (
                "messages_dropped_total",
                "reason",
                "no_destination",
                st.orphan_messages,
            ),
            ("resumes_total", "class", "ok", st.resumes_ok),
            ("resumes_total", "class", "truncated", st.resumes_truncated),
            ("resumes_total", "class", "rejected", st.resumes_rejected),
        ];
        let mut out = String::with_capacity(2048);
        for (name, kind, v) in plain {
            let _ = writeln!(out, "# TYPE gateway_mcp_{name} {kind}");
            if labelled.iter().any(|l| l.0 == name) {
                for (_, k, l, v) in labelled.iter().filter(|l| l.0 == name) {
                    let _ = writeln!(out, "gateway_mcp_{name}{{{k}=\"{l}\"}} {v}");
                }
            } else {
                let _ = writeln!(out, "gateway_mcp_{name} {v}");
            }
        }
        let _ = writeln!(out, "# TYPE gateway_mcp_streams_broken gauge");
        let _ = writeln!(out, "gateway_mcp_streams_broken {}", self.broken.len());
        if let Some(p) = self.ups.http_stats() {
            for (name, kind, v) in [
                ("connections_opened_total", "counter", p.connections_opened),
                ("connections_idle", "gauge", p.connections_idle),
                ("requests_reused_total", "counter", p.requests_reused),
                ("requests_retried_total", "counter", p.requests_retried),
            ] {
                let _ = writeln!(out, "# TYPE gateway_mcp_upstream_{name} {kind}");
                let _ = writeln!(out, "gateway_mcp_upstream_{name} {v}");
            }
        }
        out
    }
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

/// The MCP core's source of session IDs: 16 random bytes; in cluster mode (`minted`) every
/// session ID this process mints starts with its 4 random bytes (96 random bits remain), so
/// it tells its own sessions from other nodes' ones. The first call names the process's
/// modern-era streams: all random.
fn session_ids(minted: Option<[u8; 4]>) -> Box<dyn FnMut() -> [u8; 16] + Send> {
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

fn mcp_owner(shared: &super::Shared) -> (u32, usize) {
    let shard = shards::shard_of(MCP_SHARD_ANCHOR, shared.shards);
    (shard, shards::core_of_shard(shard, shared.cores))
}

impl Core {
    /// Called once when the core starts: the MCP owner core builds the MCP state and
    /// recovers the sessions whose streams are in its log.
    pub(super) fn mcp_setup(&mut self) {
        let args = &self.shared.cfg.mcp;
        if !args.enabled() {
            return;
        }
        let (shard, owner) = mcp_owner(&self.shared);
        if owner != self.id {
            return;
        }
        let (shared, id) = (self.shared.clone(), self.id);
        let wake: Arc<dyn Fn() + Send + Sync> =
            Arc::new(move || sys::eventfd_wake(shared.eventfds[id].as_fd()));
        let limits = args.upstream_limits(self.shared.cfg.event_bytes_max);
        let ups = match (&args.upstream_cmd, &args.upstream_url) {
            (Some(cmd), _) => UpstreamSet::new(cmd.clone(), limits, wake),
            (None, Some(_)) => UpstreamSet::new_http(
                args.http_endpoint()
                    .expect("--upstream-url is checked by McpArgs::validate at start")
                    .expect("--upstream-url is given"),
                limits,
                wake,
            ),
            (None, None) => unreachable!("enabled() checked"),
        };
        let clustered = self.cluster.is_some();
        let mut minted = [0u8; 4];
        getrandom::fill(&mut minted).expect("getrandom for MCP session ids");
        let mut core = McpCore::new(args.core_config(), session_ids(clustered.then_some(minted)));
        let t0 = self.now;
        // Cluster mode recovers a session when a client resumes it (`mcp_cluster_recover`):
        // the log holds every node's sessions.
        if self.hub.has_shard(shard) && !clustered {
            for (_, name, _) in self.hub.log(shard).streams() {
                if name.starts_with(MCP_SHARD_ANCHOR) {
                    core.recover_stream(name, 0);
                }
            }
        }
        eprintln!(
            "core {}: MCP front on {} (shard {shard}), {} recovered session(s)",
            self.id,
            args.mcp_path,
            core.sessions_live()
        );
        let deadline_ms = core.poll_timeout();
        self.mcp = Some(Box::new(Mcp {
            core,
            ups,
            shard,
            t0,
            next_conn: 1,
            deadline_ms,
            next_reap: t0,
            conns: HashMap::new(),
            by_slot: HashMap::new(),
            broken: HashMap::new(),
            broken_order: std::collections::VecDeque::new(),
            messages_up: 0,
            records_refused: 0,
            metrics_dirty: true,
            next_metrics: t0,
            cluster: clustered.then(|| {
                let hex: String = minted.iter().map(|b| format!("{b:02x}")).collect();
                super::mcp_cluster::McpCluster::new(hex)
            }),
        }));
    }

    pub(super) fn mcp_now_ms(&self) -> u64 {
        self.mcp.as_ref().map_or(0, |m| {
            self.now.saturating_duration_since(m.t0).as_millis() as u64
        })
    }

    /// The core that owns the MCP shard (MCP requests are handed to it).
    pub(super) fn mcp_owner_core(&self) -> usize {
        mcp_owner(&self.shared).1
    }

    /// A complete request on the MCP path, on the MCP owner core: every header of `head`
    /// and the body go to the MCP core, whose actions are then carried out.
    pub(super) fn mcp_request(
        &mut self,
        slot: u32,
        head: &[u8],
        mut body: Vec<u8>,
        close: bool,
        subject: Option<&str>,
    ) {
        let header_count_max = self.lim.conn.head.header_count_max;
        // Re-read the head for every header (the connection machine keeps only a few).
        let mut hs = vec![httparse::EMPTY_HEADER; header_count_max];
        let mut req = httparse::Request::new(&mut hs);
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
        let headers: Vec<(&str, &[u8])> = req
            .headers
            .iter()
            .filter(|h| !h.name.is_empty())
            .map(|h| (h.name, h.value))
            .collect();
        let last_event_id = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("last-event-id"))
            .map(|(_, v)| *v);
        if method == HttpMethod::Get {
            if self.mcp_cluster_hold(slot, head, &mut body, close, subject, last_event_id) {
                return;
            }
            let session = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id"))
                .map(|(_, v)| *v);
            self.mcp_cluster_recover(last_event_id, session, subject);
        }
        let generation = self.io.generation(slot);
        let now_ms = self.mcp_now_ms();
        let Some(m) = self.mcp.as_mut() else {
            let msg = "the MCP front is not running on this core";
            let b = crate::proto::http::error_response(503, "mcp_unavailable", msg, true);
            return self.respond(slot, b, true);
        };
        let cid = m.next_conn;
        m.next_conn += 1;
        m.conns.insert(cid, (slot, generation, close));
        m.by_slot.insert(slot, cid);
        let log = self.hub.log(m.shard);
        let request = HttpRequest {
            conn: cid,
            method,
            headers: &headers,
            body: &body,
            subject,
        };
        let view = LogRef {
            log,
            epochs: &self.shared.epochs,
        };
        m.core.handle_http(now_ms, &request, &view);
        self.mcp_apply();
    }

    /// The core's connection went away before its response could be opened.
    pub(super) fn mcp_conn_gone(&mut self, cid: ConnId) {
        let now_ms = self.mcp_now_ms();
        if let Some(m) = self.mcp.as_mut() {
            if let Some((slot, _, _)) = m.conns.remove(&cid)
                && m.by_slot.get(&slot) == Some(&cid)
            {
                m.by_slot.remove(&slot);
            }
            m.core.handle_connection_closed(now_ms, cid);
        }
    }

    /// Hook from `close_conn`: an MCP connection (request or SSE) closed.
    pub(super) fn mcp_conn_closed(&mut self, slot: u32) {
        let Some(cid) = self.mcp.as_mut().and_then(|m| m.by_slot.remove(&slot)) else {
            return;
        };
        self.mcp_conn_gone(cid);
        self.mcp_apply();
    }

    /// Hook once per reactor turn: upstream lines and exits, then the core's timers. Actions
    /// are applied after each event, so queued appends never pile up in memory.
    pub(super) fn mcp_turn(&mut self) {
        let now = self.now;
        let now_ms = self.mcp_now_ms();
        let id_core = self.id;
        for handled in 0.. {
            let Some(m) = self.mcp.as_mut() else { return };
            if handled == UPSTREAM_EVENTS_PER_TURN_MAX {
                // More may be queued: come back next turn.
                sys::eventfd_wake(self.shared.eventfds[self.id].as_fd());
                break;
            }
            let Some(ev) = m.ups.try_recv() else { break };
            match ev {
                UpstreamEvent::Line(id, line) => m.core.handle_upstream_line(now_ms, id, &line),
                UpstreamEvent::LineTooLong(id, n) => {
                    // Dropping the line could hide a response: end the upstream explicitly.
                    let why = format!("upstream wrote a {n}-byte line, over --event-bytes-max");
                    eprintln!("core {id_core}: MCP upstream {}: {why}", id.0);
                    m.ups.kill(id, now);
                    m.core.handle_upstream_exit(now_ms, id, &why);
                }
                UpstreamEvent::Closed(id) => {
                    m.ups.kill(id, now); // reap (SIGKILL after grace if it lingers)
                    m.core
                        .handle_upstream_exit(now_ms, id, "upstream closed its stdout");
                }
                UpstreamEvent::Failed(id, why) => {
                    m.ups.kill(id, now);
                    m.core.handle_upstream_exit(now_ms, id, &why);
                }
            }
            self.mcp_apply();
        }
        let Some(m) = self.mcp.as_mut() else { return };
        if now >= m.next_reap {
            m.next_reap = now + REAP_INTERVAL;
            for (id, status) in m.ups.poll(now) {
                m.core
                    .handle_upstream_exit(now_ms, id, &format!("upstream exited: {status}"));
            }
        }
        if m.deadline_ms.is_some_and(|t| t <= now_ms) {
            m.core.handle_tick(now_ms);
        }
        self.mcp_apply();
        if let Some(m) = self.mcp.as_mut()
            && m.metrics_dirty
            && now >= m.next_metrics
        {
            m.metrics_dirty = false;
            m.next_metrics = now + METRICS_INTERVAL;
            let text = m.render_metrics();
            *self.m().mcp_snapshot.lock().expect("metrics lock") = text;
        }
    }

    /// Hook for the reactor's wait: the MCP core's next timer.
    pub(super) fn mcp_deadline(&self) -> Option<Instant> {
        let m = self.mcp.as_ref()?;
        let timer = m.deadline_ms.map(|ms| m.t0 + Duration::from_millis(ms));
        let reap = (m.ups.children() > 0).then_some(m.next_reap);
        let metrics = m.metrics_dirty.then_some(m.next_metrics);
        [timer, reap, metrics].into_iter().flatten().min()
    }

    /// Hook from `begin_shutdown` (before the logs are synced): every session ends with
    /// explicit errors in the log, upstream children are stopped.
    pub(super) fn mcp_shutdown(&mut self) {
        let Some(m) = self.mcp.as_mut() else { return };
        m.core.shutdown();
        self.mcp_apply();
        if let Some(m) = self.mcp.as_mut() {
            eprintln!(
                "core {}: MCP front stopping {} upstream(s); {:?}",
                self.id,
                m.ups.children(),
                m.core.stats()
            );
            m.ups.stop_all();
        }
    }
}
