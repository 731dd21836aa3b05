//! The MCP front's thin driver inside a reactor core: turns a buffered HTTP request on the MCP
//! path into a [`HttpRequest`] for the pure [`McpCore`], and carries out the core's actions
//! with the reactor's own machinery — log appends on the MCP shard's log (so MCP events are
//! durable and fsynced like any other), SSE responses as ordinary log subscribers (the same
//! zero-copy send path, ACK-confirmed window and backpressure), plain responses, and upstream
//! child processes ([`UpstreamSet`]).
//!
//! It is compiled as a child module of `reactor` (declared there with `#[path]`), so it can use
//! the reactor's private connection and subscriber types; it holds no protocol logic itself.
//! All MCP streams (`mcp/...`) hash to one shard (see `shards::shard_of`), so one core owns
//! the MCP state; requests landing on other cores are handed to it like any stream request.
//! `--upstream-url` uses the same [`UpstreamSet`] holding HTTP clients instead of children.

use super::*;
use crate::mcp::core::{Action, ConnId, HttpMethod, HttpRequest, LogView, McpCore};
use crate::mcp::upstream::{UpstreamEvent, UpstreamSet};

/// The name every MCP stream is routed by (see `shards::shard_of`).
pub(crate) const MCP_SHARD_ANCHOR: &str = "mcp/";

/// Upstream events handled per drain before the core yields to other work (it re-wakes
/// itself when more are queued).
const UPSTREAM_EVENTS_PER_TURN_MAX: usize = 4096;

/// How often exited upstream children are looked for (a `try_wait` per child).
const REAP_INTERVAL: Duration = Duration::from_millis(100);

/// How often the `gateway_mcp_*` metrics snapshot is refreshed while MCP state changes.
const METRICS_INTERVAL: Duration = Duration::from_millis(250);

/// MCP state of the owning core.
pub(super) struct Mcp {
    core: McpCore,
    ups: UpstreamSet,
    shard: u32,
    t0: Instant,
    next_conn: ConnId,
    /// The core's next timer, recomputed after every input (so idle reactor turns cost O(1)).
    deadline_ms: Option<u64>,
    /// When exited children are next reaped (every `REAP_INTERVAL`, or on a closed stdout).
    next_reap: Instant,
    /// Core connection id → (slot, generation, close after response).
    conns: HashMap<ConnId, (u32, u32, bool)>,
    /// Slot → the MCP connection id of the request / SSE response it carries.
    by_slot: HashMap<u32, ConnId>,
    /// Streams whose log refused a record and its substitute (disk full, poisoned log): the
    /// core's sequence prediction is ahead of the log, so nothing more is appended to them,
    /// their connections are closed and resuming them is an explicit 503 (stream → reason).
    broken: HashMap<String, String>,
    /// Messages handed to upstreams (lines / POST bodies).
    messages_up: u64,
    /// Records the log refused (replaced by an error record, or breaking the stream).
    records_refused: u64,
    /// Something changed since the last metrics snapshot; refreshed at `next_metrics`.
    metrics_dirty: bool,
    next_metrics: Instant,
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
        let mut out = String::with_capacity(2048);
        let mut one = |name: &str, kind: &str, labels: &[(&str, &str, u64)], v: Option<u64>| {
            let _ = writeln!(out, "# TYPE gateway_mcp_{name} {kind}");
            if let Some(v) = v {
                let _ = writeln!(out, "gateway_mcp_{name} {v}");
            }
            for (k, l, v) in labels {
                let _ = writeln!(out, "gateway_mcp_{name}{{{k}=\"{l}\"}} {v}");
            }
        };
        one(
            "sessions_open",
            "gauge",
            &[],
            Some(self.core.sessions_live() as u64),
        );
        one(
            "sessions_created_total",
            "counter",
            &[],
            Some(st.sessions_minted),
        );
        one(
            "sessions_terminated_total",
            "counter",
            &[],
            Some(st.sessions_terminated),
        );
        one(
            "streams_open",
            "gauge",
            &[],
            Some(self.core.streams_live() as u64),
        );
        one(
            "sse_connections",
            "gauge",
            &[],
            Some(self.core.connections_live() as u64),
        );
        one("upstreams", "gauge", &[], Some(self.ups.children() as u64));
        one(
            "upstream_deaths_total",
            "counter",
            &[],
            Some(st.upstream_deaths),
        );
        one("messages_up_total", "counter", &[], Some(self.messages_up));
        one(
            "messages_down_total",
            "counter",
            &[],
            Some(st.upstream_lines),
        );
        one(
            "messages_dropped_total",
            "counter",
            &[
                ("reason", "not_jsonrpc", st.upstream_garbage_lines),
                ("reason", "no_destination", st.orphan_messages),
            ],
            None,
        );
        one(
            "resumes_total",
            "counter",
            &[
                ("class", "ok", st.resumes_ok),
                ("class", "truncated", st.resumes_truncated),
                ("class", "rejected", st.resumes_rejected),
            ],
            None,
        );
        one(
            "modern_cancels_total",
            "counter",
            &[],
            Some(st.modern_cancels),
        );
        one(
            "records_refused_total",
            "counter",
            &[],
            Some(self.records_refused),
        );
        one(
            "streams_broken",
            "gauge",
            &[],
            Some(self.broken.len() as u64),
        );
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

fn mcp_owner(shared: &Shared) -> (u32, usize) {
    let shard = shards::shard_of(MCP_SHARD_ANCHOR, shared.shards);
    (shard, shards::core_of_shard(shard, shared.cores))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        503 => "Service Unavailable",
        _ => "Status",
    }
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
        let efd = self.efd;
        let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || sys::eventfd_wake(efd));
        let limits = args.upstream_limits(self.shared.cfg.event_bytes_max);
        let ups = match (&args.upstream_cmd, &args.upstream_url) {
            (Some(cmd), _) => UpstreamSet::new(cmd.clone(), limits, wake),
            (None, Some(url)) => UpstreamSet::new_http(
                crate::mcp::http_upstream::parse_url(url)
                    .expect("--upstream-url is checked by McpArgs::validate at start"),
                limits,
                wake,
            ),
            (None, None) => unreachable!("enabled() checked"),
        };
        let mut core = McpCore::new(
            args.core_config(),
            Box::new(|| {
                let mut b = [0u8; 16];
                getrandom::fill(&mut b).expect("getrandom for MCP session ids");
                b
            }),
        );
        let t0 = self.now;
        if let Some(log) = self.logs.get(&shard) {
            for (_, name, _) in log.streams() {
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
            messages_up: 0,
            records_refused: 0,
            metrics_dirty: true,
            next_metrics: t0,
        }));
    }

    fn mcp_now_ms(&self) -> u64 {
        self.mcp.as_ref().map_or(0, |m| {
            self.now.saturating_duration_since(m.t0).as_millis() as u64
        })
    }

    /// The MCP endpoint's path when the front is on.
    pub(super) fn mcp_path(&self) -> Option<String> {
        let args = &self.shared.cfg.mcp;
        args.enabled().then(|| args.mcp_path.clone())
    }

    /// A request on the MCP path: wait for its body, hand it to the MCP core's owner, or run it.
    pub(super) fn mcp_process(&mut self, slot: u32, head: http::Head) {
        let body_max = self.shared.cfg.mcp.mcp_body_bytes_max;
        if head.content_length > body_max as u64 {
            let msg = format!(
                "body of {} bytes exceeds --mcp-body-bytes-max {body_max}",
                head.content_length
            );
            self.error(slot, 413, "body_too_large", &msg, true);
            return;
        }
        let total = head.head_len + head.content_length as usize;
        let conn = self.conn(slot);
        if conn.rlen < total {
            if conn.rbuf.len() < total && conn.inflight & F_RECV == 0 {
                conn.rbuf.resize(total, 0);
            }
            if head.expect_continue && !conn.sent_continue {
                conn.sent_continue = true;
                self.send_response(slot, b"HTTP/1.1 100 Continue\r\n\r\n".to_vec(), false);
            }
            if self.conn(slot).inflight & F_RECV == 0 {
                self.arm_recv(slot);
            }
            return;
        }
        self.m().requests_total.fetch_add(1, Relaxed);
        let (_, owner) = mcp_owner(&self.shared);
        if owner != self.id {
            self.handoff(slot, owner);
            return;
        }
        let header_count_max = self.limits.header_count_max;
        let now = self.now;
        let conn = self.conn(slot);
        // Re-read the head for every header (the gateway's `Head` keeps only a few).
        let mut hs = vec![httparse::EMPTY_HEADER; header_count_max];
        let mut req = httparse::Request::new(&mut hs);
        let parsed = req.parse(&conn.rbuf[..head.head_len]);
        let method = match req.method {
            Some("GET") => HttpMethod::Get,
            Some("POST") => HttpMethod::Post,
            Some("DELETE") => HttpMethod::Delete,
            _ => HttpMethod::Other,
        };
        let pairs: Vec<(String, Vec<u8>)> = req
            .headers
            .iter()
            .filter(|h| !h.name.is_empty())
            .map(|h| (h.name.to_owned(), h.value.to_vec()))
            .collect();
        let body = conn.rbuf[head.head_len..total].to_vec();
        conn.rbuf.copy_within(total..conn.rlen, 0);
        conn.rlen -= total;
        conn.sent_continue = false;
        conn.head_started = (conn.rlen > 0).then_some(now);
        if !matches!(parsed, Ok(httparse::Status::Complete(_))) {
            // parse_head accepted this head already; a mismatch is a bug, not peer input.
            unreachable!("head re-parse failed after parse_head succeeded: {parsed:?}");
        }
        let gen_ = self.gen_of(slot);
        let now_ms = self.mcp_now_ms();
        let epochs = self.shared.epochs.clone();
        let Some(m) = self.mcp.as_mut() else {
            self.error(
                slot,
                503,
                "mcp_unavailable",
                "the MCP front is not running on this core",
                true,
            );
            return;
        };
        let cid = m.next_conn;
        m.next_conn += 1;
        m.conns.insert(cid, (slot, gen_, head.close));
        m.by_slot.insert(slot, cid);
        let header_refs: Vec<(&str, &[u8])> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let log = self
            .logs
            .get(&m.shard)
            .expect("the MCP owner core holds the MCP shard");
        m.core.handle_http(
            now_ms,
            &HttpRequest {
                conn: cid,
                method,
                headers: &header_refs,
                body: &body,
            },
            &LogRef {
                log,
                epochs: &epochs,
            },
        );
        self.mcp_apply();
    }

    /// Carries out the core's actions, in order, until it has none.
    fn mcp_apply(&mut self) {
        loop {
            let Some(m) = self.mcp.as_mut() else { return };
            let Some(action) = m.core.poll_action() else {
                m.deadline_ms = m.core.poll_timeout();
                return;
            };
            m.metrics_dirty = true;
            let shard = m.shard;
            match action {
                Action::Respond {
                    conn,
                    status,
                    headers,
                    body,
                } => self.mcp_respond(conn, status, &headers, &body),
                Action::CreateStream { stream } => {
                    let log = self.logs.get_mut(&shard).expect("MCP shard");
                    if let Err(e) = log.create_stream(&stream) {
                        eprintln!(
                            "core {}: MCP stream {stream} cannot be created: {e}",
                            self.id
                        );
                    }
                }
                Action::Append {
                    stream,
                    seq,
                    event_type,
                    data,
                } => {
                    if m.broken.contains_key(&stream) {
                        eprintln!(
                            "core {}: MCP message for broken stream {stream} (seq {seq}) not stored",
                            self.id
                        );
                        continue;
                    }
                    let id_core = self.id;
                    let log = self.logs.get_mut(&shard).expect("MCP shard");
                    let sid = log
                        .stream_id(&stream)
                        .expect("the core creates a stream before appending to it");
                    let appended = match log.append(sid, event_type, &data) {
                        Ok(a) => Ok(a),
                        // An operating error (record too large, disk full): the same position
                        // gets an explicit error record instead (the request is answered with a
                        // JSON-RPC error), so the stream stays gap-free and the core's
                        // sequence prediction holds.
                        Err(e) => {
                            self.mcp.as_mut().expect("checked").records_refused += 1;
                            let why = e.to_string();
                            eprintln!("core {id_core}: MCP append to {stream} failed: {why}");
                            let (t, sub) = crate::mcp::jsonrpc::not_stored_substitute(&data, &why);
                            log.append(sid, t, &sub)
                                .map_err(|e2| format!("{why}; then {e2}"))
                        }
                    };
                    match appended {
                        Ok(a) => {
                            assert_eq!(
                                a.id.seq, seq,
                                "MCP core predicted seq {seq} on {stream}, log assigned {}",
                                a.id.seq
                            );
                            self.record_appends(shard, sid, 1);
                        }
                        Err(why) => self.mcp_break_stream(shard, sid, stream, why),
                    }
                }
                Action::OpenSse {
                    conn,
                    stream,
                    from_seq,
                    retry_ms,
                    reprime,
                    headers,
                    end_after,
                } => {
                    let Some(&(slot, gen_, _)) = m.conns.get(&conn) else {
                        continue;
                    };
                    if let Some(why) = m.broken.get(&stream) {
                        let body = crate::mcp::jsonrpc::error_body(
                            None,
                            crate::mcp::jsonrpc::NOT_STORED,
                            &format!(
                                "stream {stream} cannot be served: its log refused a record ({why})"
                            ),
                            Some(serde_json::json!({ "stream": stream })),
                        );
                        let headers = vec![("Content-Type", "application/json".to_owned())];
                        self.mcp_respond(conn, 503, &headers, &body);
                        continue;
                    }
                    if self.conn_mut(slot, gen_).is_none_or(|c| c.closing) {
                        self.mcp_conn_gone(conn);
                        continue;
                    }
                    let log = &self.logs[&shard];
                    let sid = log
                        .stream_id(&stream)
                        .expect("the core creates a stream before opening it");
                    let mut head = String::from(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n",
                    );
                    for (k, v) in &headers {
                        head.push_str(&format!("{k}: {v}\r\n"));
                    }
                    head.push_str("\r\n");
                    if let Some(r) = retry_ms {
                        head.push_str(&format!("retry: {r}\n\n"));
                    }
                    if let Some(id) = reprime {
                        head.push_str(&format!("id: {id}\ndata: \n\n"));
                    }
                    self.become_subscriber(slot, (shard, sid), from_seq, head.into_bytes(), None);
                    if let Some(c) = self.conn_mut(slot, gen_)
                        && let State::Sub(sub) = &mut c.state
                    {
                        sub.end_after = end_after;
                    }
                    self.pump(slot);
                }
                Action::StreamComplete { stream, last_seq } => {
                    if m.broken.contains_key(&stream) {
                        continue; // its connections are closed; the log ends before last_seq
                    }
                    let Some(sid) = self.logs[&shard].stream_id(&stream) else {
                        continue;
                    };
                    let subs = self.subs.get(&(shard, sid)).cloned().unwrap_or_default();
                    for (slot, gen_) in subs {
                        if let Some(c) = self.conn_mut(slot, gen_)
                            && let State::Sub(sub) = &mut c.state
                        {
                            sub.end_after = Some(last_seq);
                            self.pump(slot);
                        }
                    }
                }
                Action::CloseSse { conn } => {
                    let Some((slot, gen_, _)) = m.conns.remove(&conn) else {
                        continue;
                    };
                    if m.by_slot.get(&slot) == Some(&conn) {
                        m.by_slot.remove(&slot);
                    }
                    if self.conn_mut(slot, gen_).is_some_and(|c| !c.closing) {
                        self.close_conn(slot);
                    }
                }
                Action::SpawnUpstream { upstream, session } => {
                    if let Err(e) = m.ups.spawn(upstream, session.as_deref()) {
                        eprintln!("core {}: {e}", self.id);
                        let now_ms = self.mcp_now_ms();
                        let m = self.mcp.as_mut().expect("checked");
                        m.core.handle_upstream_exit(now_ms, upstream, &e);
                    }
                }
                Action::SendUpstream { upstream, line } => {
                    m.messages_up += 1;
                    if let Err(e) = m.ups.send(upstream, line) {
                        let now = self.now;
                        let now_ms = self.mcp_now_ms();
                        let m = self.mcp.as_mut().expect("checked");
                        m.ups.kill(upstream, now);
                        m.core.handle_upstream_exit(now_ms, upstream, &e);
                    }
                }
                Action::KillUpstream { upstream } => {
                    let now = self.now;
                    m.ups.kill(upstream, now);
                }
            }
        }
    }

    /// A plain (non-SSE) response on the core's connection `conn`.
    fn mcp_respond(
        &mut self,
        conn: ConnId,
        status: u16,
        headers: &[(&'static str, String)],
        body: &[u8],
    ) {
        let Some(m) = self.mcp.as_mut() else { return };
        let Some((slot, gen_, close)) = m.conns.remove(&conn) else {
            return;
        };
        // The slot may carry a newer MCP connection by now: keep its mapping.
        if m.by_slot.get(&slot) == Some(&conn) {
            m.by_slot.remove(&slot);
        }
        if self.conn_mut(slot, gen_).is_none_or(|c| c.closing) {
            return;
        }
        let mut out = format!(
            "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\n",
            reason(status),
            body.len()
        );
        for (k, v) in headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str(if close {
            "Connection: close\r\n\r\n"
        } else {
            "\r\n"
        });
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(body);
        self.send_response(slot, bytes, close);
    }

    /// The log refused a record of `stream` and its substitute: nothing more goes to it, its
    /// open connections are closed (the client sees the records up to the log's tail, then the
    /// end; resuming gets an explicit 503), and the process keeps running.
    fn mcp_break_stream(&mut self, shard: u32, sid: StreamId, stream: String, why: String) {
        eprintln!(
            "core {}: MCP stream {stream} broken (no record could be stored): {why}",
            self.id
        );
        if let Some(m) = self.mcp.as_mut() {
            m.broken.insert(stream, why); // first: closing re-enters the core
        }
        let subs = self.subs.get(&(shard, sid)).cloned().unwrap_or_default();
        for (slot, gen_) in subs {
            if self.conn_mut(slot, gen_).is_some_and(|c| !c.closing) {
                self.close_conn(slot);
            }
        }
    }

    /// The core's connection went away before its response could be opened.
    fn mcp_conn_gone(&mut self, cid: ConnId) {
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
                sys::eventfd_wake(self.efd); // more may be queued: come back next turn
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
