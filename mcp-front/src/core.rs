//! The MCP front's state machine: sessions, stream routing, resume decisions. The reactor
//! drives it (quinn-proto style): `handle_*` for inputs — a parsed HTTP request, an upstream
//! line, an upstream exit, an SSE connection closed, `handle_tick(now_ms)` — and
//! `poll_action` for outputs ([`Action`]: respond, create/append to a log stream, open an SSE
//! response on a log stream from a sequence, close a connection, spawn/kill/write an upstream).
//!
//! It does not touch sockets, io_uring, processes, files or a clock: time comes in as
//! milliseconds, randomness through the session-id source given at construction, and the log
//! is seen only through [`LogView`] (names and bounds) — the driver performs every append the
//! core asks for, in order, and the core predicts each appended sequence number (it is the
//! only writer of `mcp/...` streams), which the driver asserts.
//!
//! Each message lands on exactly one log stream. Legacy era (sessions): `mcp/<session>/0` is
//! the session's GET stream, `mcp/<session>/<n>` (n ≥ 1) the stream of the n-th POST that
//! carried requests. Modern era (stateless): `mcp/m<boot>/<n>` per request, not resumable.
//! See `SPEC-NOTES.md` for the rules and the test that checks each.
#![forbid(unsafe_code)]

use crate::era::{self, Era, Version};
use crate::headers::{self, Headers, OriginPolicy};
use crate::jsonrpc::{self, Body, Kind, Message, RpcId};
use log_store::{
    Bounds, Detail, Epoch, EventId, Refusal, ResumeClass, ResumeInput, ResumeOutcome, Seq,
    StreamId, plan_resume,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;

/// The reactor's handle for one client connection (one HTTP request/response at a time).
pub type ConnId = u64;

/// One upstream MCP server process (legacy: one per session; modern: one shared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UpstreamId(pub u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpMethod {
    Get,
    Post,
    Delete,
    Other,
}

/// A parsed HTTP request for the MCP path, as the HTTP layer hands it over.
#[derive(Debug, Clone, Copy)]
pub struct HttpRequest<'a> {
    pub conn: ConnId,
    pub method: HttpMethod,
    pub headers: &'a [(&'a str, &'a [u8])],
    pub body: &'a [u8],
}

/// What the core needs to know about the log (names and bounds), for resumes.
pub trait LogView {
    fn epoch(&self) -> Epoch;
    fn stream_name(&self, id: StreamId) -> Option<&str>;
    fn bounds(&self, id: StreamId) -> Option<Bounds>;
    /// Epochs of other logs of this gateway (other shards), so their ids read as "another
    /// stream" rather than "another epoch".
    fn known_epochs(&self) -> &[Epoch] {
        &[]
    }
}

/// Limits and policies, each set by a CLI flag (units in the names).
#[derive(Debug, Clone)]
pub struct McpConfig {
    pub origin_policy: OriginPolicy,
    /// `retry:` sent at the start of every legacy SSE response (`--mcp-retry-ms`).
    pub retry_ms: u32,
    /// Close a POST stream's connection (not the stream) if its response has not arrived
    /// within this time, so the client polls with GET + Last-Event-ID (`--mcp-post-hold-ms`).
    pub post_hold_ms: Option<u64>,
    /// A session with no attached connection and no traffic for this long is terminated
    /// (`--mcp-session-idle-secs`, here in ms).
    pub session_idle_ms: u64,
    /// Live + recovered sessions (`--mcp-sessions-max`).
    pub sessions_max: usize,
    /// Client requests awaiting a response, per session and for the modern front
    /// (`--mcp-requests-inflight-max`).
    pub requests_inflight_max: usize,
    /// Messages in one 2025-03-26 batch (`--mcp-batch-len-max`).
    pub batch_len_max: usize,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            origin_policy: OriginPolicy::default(),
            retry_ms: 1000,
            post_hold_ms: None,
            session_idle_ms: 30 * 60 * 1000,
            sessions_max: 1024,
            requests_inflight_max: 256,
            batch_len_max: 64,
        }
    }
}

/// Output of the core. The driver executes actions in the order they are polled.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A complete HTTP response (JSON or empty body).
    Respond {
        conn: ConnId,
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Vec<u8>,
    },
    /// Create the log stream if it does not exist (idempotent).
    CreateStream { stream: String },
    /// Append one event; the log must assign exactly `seq` (the driver asserts it).
    Append {
        stream: String,
        seq: Seq,
        event_type: Option<&'static str>,
        data: Vec<u8>,
    },
    /// Answer `conn` with `200 text/event-stream` (plus `headers`), write `retry: <ms>` first
    /// if given, then — on a resume — an id-only event restating the client's Last-Event-ID
    /// (`id: <reprime>` + empty data: no message, so nothing is delivered twice), then the
    /// stream's records from `from_seq` on, live; if `end_after` is set, end the response
    /// after that record.
    OpenSse {
        conn: ConnId,
        stream: String,
        from_seq: Seq,
        retry_ms: Option<u32>,
        reprime: Option<String>,
        headers: Vec<(&'static str, String)>,
        end_after: Option<Seq>,
    },
    /// The stream will get no more records: connections on it end after `last_seq`.
    StreamComplete { stream: String, last_seq: Seq },
    /// Close this SSE connection now (the stream goes on; the client may resume).
    CloseSse { conn: ConnId },
    /// Start an upstream (`--upstream-cmd` child or `--upstream-url` client). `session` is the
    /// MCP session it serves (None: the shared modern upstream).
    SpawnUpstream {
        upstream: UpstreamId,
        session: Option<String>,
    },
    /// Write one line (ends in `\n`) to the upstream.
    SendUpstream { upstream: UpstreamId, line: Vec<u8> },
    /// Stop the upstream (stdio: close stdin, then SIGTERM, then SIGKILL after grace).
    KillUpstream { upstream: UpstreamId },
}

/// Counters for /metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpStats {
    pub sessions_minted: u64,
    pub sessions_terminated: u64,
    pub upstream_lines: u64,
    /// Upstream stdout lines that were not JSON-RPC (dropped, never streamed).
    pub upstream_garbage_lines: u64,
    /// Upstream messages with no destination (unknown response id, stale progress token,
    /// modern server→client request): dropped, never broadcast.
    pub orphan_messages: u64,
    pub resumes_ok: u64,
    pub resumes_truncated: u64,
    pub resumes_rejected: u64,
    pub modern_cancels: u64,
    /// Upstreams that ended while the core still used them (not stopped by the core).
    pub upstream_deaths: u64,
}

/// Why a session ended (for the error responses of its unanswered requests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndReason {
    Deleted,
    IdleExpired,
    UpstreamExited(String),
    Shutdown,
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndReason::Deleted => write!(f, "session deleted by the client"),
            EndReason::IdleExpired => write!(f, "session expired (idle)"),
            EndReason::UpstreamExited(why) => write!(f, "upstream MCP server exited: {why}"),
            EndReason::Shutdown => write!(f, "gateway shutting down"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamKind {
    Get,
    Post,
}

#[derive(Debug)]
struct Stream {
    name: String,
    kind: StreamKind,
    /// Sequence the next append gets.
    next_seq: Seq,
    /// Responses still owed on this stream.
    pending: usize,
    /// Last sequence once complete.
    complete: Option<Seq>,
    conn: Option<ConnId>,
    hold_deadline_ms: Option<u64>,
}

impl Stream {
    fn new(name: String, kind: StreamKind) -> Stream {
        Stream {
            name,
            kind,
            next_seq: 1,
            pending: 0,
            complete: None,
            conn: None,
            hold_deadline_ms: None,
        }
    }
}

#[derive(Debug)]
struct InFlight {
    stream: u32,
    token: Option<RpcId>,
}

#[derive(Debug)]
struct Session {
    /// None: recovered after a restart (resume only).
    upstream: Option<UpstreamId>,
    version: Option<Version>,
    last_active_ms: u64,
    next_n: u32,
    /// In-memory state of streams that are live or attached; a stream of this session absent
    /// here (n < next_n) is complete at its log tail.
    streams: BTreeMap<u32, Stream>,
    inflight: HashMap<RpcId, InFlight>,
    progress: HashMap<RpcId, u32>,
    /// First sequence of the GET stream not yet handed to any GET connection.
    get_undelivered_from: Seq,
    /// The initialize request id while it is in flight (its response sets `version`).
    init_id: Option<RpcId>,
}

#[derive(Debug)]
struct Route {
    stream: u32,
    orig_id: RpcId,
    up_token: Option<String>,
}

#[derive(Debug, Default)]
struct Modern {
    upstream: Option<UpstreamId>,
    next_n: u32,
    next_rpc: u64,
    streams: HashMap<u32, Stream>,
    /// Upstream request id → route.
    routes: HashMap<String, Route>,
    /// Upstream progress token → (stream, original token).
    tokens: HashMap<String, (u32, RpcId)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Owner {
    Session(String),
    Modern,
}

/// The MCP front's state. See the module doc.
pub struct McpCore {
    cfg: McpConfig,
    session_id_source: Box<dyn FnMut() -> [u8; 16] + Send>,
    boot: String,
    sessions: HashMap<String, Session>,
    modern: Modern,
    upstreams: HashMap<UpstreamId, Owner>,
    next_upstream: u64,
    conns: HashMap<ConnId, (Owner, u32)>,
    actions: VecDeque<Action>,
    stats: McpStats,
}

impl fmt::Debug for McpCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpCore")
            .field("sessions", &self.sessions.len())
            .field("conns", &self.conns.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

const JSON: (&str, &str) = ("content-type", "application/json");
const SSE_HEADERS: [(&str, &str); 1] = [("x-accel-buffering", "no")];

/// [`SSE_HEADERS`] as the owned list an [`Action::OpenSse`] carries.
fn sse_headers() -> Vec<(&'static str, String)> {
    SSE_HEADERS
        .iter()
        .map(|(k, v)| (*k, (*v).to_owned()))
        .collect()
}

/// Where a resumed SSE response starts: the client's Last-Event-ID, the stream, the first seq.
struct ResumedAt {
    /// The Last-Event-ID as sent (lossy UTF-8), quoted in answers.
    text: String,
    ev: EventId,
    stream_name: String,
    from: Seq,
}

/// A number the resume planner always puts in this refusal (an invariant of `log_store`).
fn detail_num(r: &Refusal, name: &str) -> u64 {
    r.details
        .iter()
        .find_map(|(k, v)| match v {
            Detail::Num(x) if *k == name => Some(*x),
            _ => None,
        })
        .unwrap_or_else(|| panic!("refusal {} has no number {name:?}", r.code))
}

/// The requests among `msgs`: each id with its progress token, in order.
fn requests_of(msgs: &[Message]) -> Vec<(RpcId, Option<RpcId>)> {
    msgs.iter()
        .filter_map(|m| match &m.kind {
            Kind::Request { id, .. } => Some((id.clone(), m.progress_token())),
            _ => None,
        })
        .collect()
}

/// The first request that reuses a request id or a progress token in flight in `sess` or
/// earlier in `requests`, with what it reuses.
fn first_reuse(sess: &Session, requests: &[(RpcId, Option<RpcId>)]) -> Option<(RpcId, String)> {
    for (i, (id, tok)) in requests.iter().enumerate() {
        let dup_id = sess.inflight.contains_key(id) || requests[..i].iter().any(|(x, _)| x == id);
        let dup_tok = tok.as_ref().is_some_and(|t| {
            sess.progress.contains_key(t)
                || requests[..i].iter().any(|(_, x)| x.as_ref() == Some(t))
        });
        if dup_id {
            return Some((id.clone(), format!("request id {id}")));
        }
        if dup_tok {
            return Some((id.clone(), "progress token".to_owned()));
        }
    }
    None
}

/// A new legacy session whose upstream is `upstream`: its `initialize` request `id` in
/// flight on POST stream 1, which `conn` reads (never held back).
fn new_session(
    now_ms: u64,
    conn: ConnId,
    upstream: UpstreamId,
    sid: &str,
    header_version: Option<Version>,
    msg: &Message,
    id: &RpcId,
) -> Session {
    let mut stream = Stream::new(format!("mcp/{sid}/1"), StreamKind::Post);
    stream.pending = 1;
    stream.conn = Some(conn);
    stream.hold_deadline_ms = None; // the initialize answer is never held back
    let tok = msg.progress_token();
    let mut sess = Session {
        upstream: Some(upstream),
        version: header_version,
        last_active_ms: now_ms,
        next_n: 2,
        streams: BTreeMap::new(),
        inflight: HashMap::new(),
        progress: HashMap::new(),
        get_undelivered_from: 1,
        init_id: Some(id.clone()),
    };
    if let Some(t) = &tok {
        sess.progress.insert(t.clone(), 1);
    }
    sess.inflight.insert(
        id.clone(),
        InFlight {
            stream: 1,
            token: tok,
        },
    );
    sess.streams.insert(1, stream);
    sess
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `mcp/<session>/<n>` → (session, n).
pub fn parse_stream_name(name: &str) -> Option<(&str, u32)> {
    let rest = name.strip_prefix("mcp/")?;
    let (owner, n) = rest.rsplit_once('/')?;
    if owner.is_empty()
        || owner.contains('/')
        || n.is_empty()
        || (n.len() > 1 && n.starts_with('0'))
    {
        return None;
    }
    Some((owner, n.parse().ok()?))
}

impl McpCore {
    /// `session_id_source` must return fresh cryptographically random bytes on every call
    /// (the driver uses `getrandom`); it also seeds the modern streams' boot prefix.
    pub fn new(
        cfg: McpConfig,
        mut session_id_source: Box<dyn FnMut() -> [u8; 16] + Send>,
    ) -> McpCore {
        let boot = format!("m{}", &hex(&session_id_source())[..16]);
        McpCore {
            cfg,
            session_id_source,
            boot,
            sessions: HashMap::new(),
            modern: Modern::default(),
            upstreams: HashMap::new(),
            next_upstream: 1,
            conns: HashMap::new(),
            actions: VecDeque::new(),
            stats: McpStats::default(),
        }
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    pub fn stats(&self) -> &McpStats {
        &self.stats
    }

    pub fn sessions_live(&self) -> usize {
        self.sessions.len()
    }

    /// Streams held in memory (live or attached), all sessions and the modern front.
    pub fn streams_live(&self) -> usize {
        self.sessions
            .values()
            .map(|s| s.streams.len())
            .sum::<usize>()
            + self.modern.streams.len()
    }

    /// Connections (SSE responses) attached to streams.
    pub fn connections_live(&self) -> usize {
        self.conns.len()
    }

    /// After a restart: tell the core about one existing log stream (name and tail), so the
    /// sessions it belongs to can be resumed (GET + Last-Event-ID). Their upstreams are gone:
    /// such sessions answer 404 to new POSTs (the client re-initialises).
    pub fn recover_stream(&mut self, name: &str, now_ms: u64) {
        let Some((sid, n)) = parse_stream_name(name) else {
            return;
        };
        if sid.starts_with('m')
            || self.sessions.len() >= self.cfg.sessions_max && !self.sessions.contains_key(sid)
        {
            return;
        }
        let s = self
            .sessions
            .entry(sid.to_owned())
            .or_insert_with(|| Session {
                upstream: None,
                version: None,
                last_active_ms: now_ms,
                next_n: 1,
                streams: BTreeMap::new(),
                inflight: HashMap::new(),
                progress: HashMap::new(),
                get_undelivered_from: Seq::MAX,
                init_id: None,
            });
        s.next_n = s.next_n.max(n.saturating_add(1));
    }

    // ---------------------------------------------------------------- HTTP input

    pub fn handle_http(&mut self, now_ms: u64, req: &HttpRequest<'_>, log: &dyn LogView) {
        let h = Headers::new(req.headers);
        let conn = req.conn;
        if self.refuse_headers(conn, &h) {
            return;
        }
        let Ok(header_version) = self.header_version(conn, &h) else {
            return;
        };
        if header_version.map(Version::era) == Some(Era::Modern) {
            return match req.method {
                HttpMethod::Post => self.modern_post(now_ms, conn, &h, req.body),
                // SPEC M1.
                _ => self.respond(conn, 405, vec![("allow", "POST".into())], Vec::new()),
            };
        }
        match req.method {
            HttpMethod::Post => self.legacy_post(now_ms, conn, &h, header_version, req.body),
            HttpMethod::Get => self.legacy_get(now_ms, conn, &h, log),
            HttpMethod::Delete => self.legacy_delete(conn, &h),
            HttpMethod::Other => self.respond(
                conn,
                405,
                vec![("allow", "GET, POST, DELETE".into())],
                Vec::new(),
            ),
        }
    }

    /// Our headers must not repeat (two session ids or origins are ambiguous); SPEC C1/C2:
    /// Origin and Host are checked first, for every method. Answers and returns true when the
    /// request is refused.
    fn refuse_headers(&mut self, conn: ConnId, h: &Headers<'_>) -> bool {
        for name in [
            headers::ORIGIN,
            headers::HOST,
            headers::SESSION_ID,
            headers::PROTOCOL_VERSION,
            headers::LAST_EVENT_ID,
        ] {
            if let Err(headers::DuplicateHeader(n)) = h.one(name) {
                self.error(
                    conn,
                    400,
                    None,
                    jsonrpc::INVALID_REQUEST,
                    &format!("header {n} appears more than once"),
                    None,
                );
                return true;
            }
        }
        let one = |name| h.one(name).ok().flatten();
        let Err(e) = self
            .cfg
            .origin_policy
            .check_origin(one(headers::ORIGIN))
            .and_then(|()| self.cfg.origin_policy.check_host(one(headers::HOST)))
        else {
            return false;
        };
        self.error(
            conn,
            403,
            None,
            jsonrpc::INVALID_REQUEST,
            &format!("Forbidden: {e}"),
            None,
        );
        true
    }

    /// SPEC L6: a present version header must be supported. `Ok(None)` when absent; `Err`
    /// after answering 400.
    fn header_version(&mut self, conn: ConnId, h: &Headers<'_>) -> Result<Option<Version>, ()> {
        let Some(raw) = h.one(headers::PROTOCOL_VERSION).ok().flatten() else {
            return Ok(None);
        };
        match era::request_version(Some(raw), None) {
            Ok(v) => Ok(Some(v)),
            Err(era::VersionError::Unsupported(v)) => {
                self.error(
                    conn,
                    400,
                    None,
                    jsonrpc::INVALID_REQUEST,
                    &format!("Bad Request: unsupported MCP-Protocol-Version {v:?}"),
                    Some(json!({ "supported": era::supported_list(), "requested": v })),
                );
                Err(())
            }
        }
    }

    fn respond(
        &mut self,
        conn: ConnId,
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Vec<u8>,
    ) {
        self.actions.push_back(Action::Respond {
            conn,
            status,
            headers,
            body,
        });
    }

    fn error(
        &mut self,
        conn: ConnId,
        status: u16,
        id: Option<&RpcId>,
        code: i64,
        msg: &str,
        data: Option<Value>,
    ) {
        let body = jsonrpc::error_body(id, code, msg, data);
        self.respond(conn, status, vec![(JSON.0, JSON.1.into())], body);
    }

    fn accepts_sse(h: &Headers<'_>) -> bool {
        let accept = h.joined(headers::ACCEPT);
        accept.is_empty()
            || accept.split(',').any(|part| {
                let media = part.split(';').next().unwrap_or("").trim();
                media.eq_ignore_ascii_case("text/event-stream")
                    || media == "*/*"
                    || media.eq_ignore_ascii_case("text/*")
            })
    }

    fn session_of<'h>(&mut self, conn: ConnId, h: &Headers<'h>) -> Option<String> {
        let Some(raw) = h.one(headers::SESSION_ID).ok().flatten() else {
            // SPEC L3.
            self.error(
                conn,
                400,
                None,
                jsonrpc::SESSION_ERROR,
                "Bad Request: Mcp-Session-Id header is required",
                None,
            );
            return None;
        };
        let sid = String::from_utf8_lossy(raw);
        if !self.sessions.contains_key(sid.as_ref()) {
            // SPEC L4: unknown or terminated.
            self.error(
                conn,
                404,
                None,
                jsonrpc::SESSION_ERROR,
                "Session not found",
                None,
            );
            return None;
        }
        Some(sid.into_owned())
    }

    fn legacy_post(
        &mut self,
        now_ms: u64,
        conn: ConnId,
        h: &Headers<'_>,
        header_version: Option<Version>,
        body: &[u8],
    ) {
        let parsed = match jsonrpc::classify(body, self.cfg.batch_len_max) {
            Ok(b) => b,
            Err(e) => {
                return self.error(
                    conn,
                    400,
                    None,
                    e.code(),
                    &format!("Bad Request: {e}"),
                    None,
                );
            }
        };
        if self.refuse_unversioned_modern(conn, header_version, &parsed) {
            return;
        }
        let is_init = matches!(&parsed, Body::Single(Message { kind: Kind::Request { method, .. }, .. }) if method == "initialize");
        if is_init {
            let Body::Single(msg) = parsed else {
                unreachable!("is_init implies Single")
            };
            return self.initialize(now_ms, conn, h, header_version, msg);
        }
        let Some(sid) = self.session_of(conn, h) else {
            return;
        };
        let Some((upstream, msgs)) = self.session_messages(conn, &sid, header_version, parsed)
        else {
            return;
        };
        let requests = requests_of(&msgs);
        let sess = self.sessions.get_mut(&sid).expect("session_of checked");
        sess.last_active_ms = now_ms;
        if requests.is_empty() {
            // SPEC C6: notifications / responses only → 202, forwarded in order.
            self.send_upstream(upstream, &msgs);
            return self.respond(conn, 202, Vec::new(), Vec::new());
        }
        if !Self::accepts_sse(h) {
            return self.error(
                conn,
                406,
                None,
                jsonrpc::INVALID_REQUEST,
                "Not Acceptable: requests are answered with text/event-stream",
                None,
            );
        }
        if self.refuse_requests(conn, &sid, &requests) {
            return;
        }
        self.open_post_stream(now_ms, conn, &sid, requests);
        self.send_upstream(upstream, &msgs);
    }

    /// A 2026-07-28 body (protocol version in `_meta`) without the version header would be
    /// mistaken for a legacy request: the header is required in that era (SPEC M4). Answers
    /// 400 and returns true for such a body.
    fn refuse_unversioned_modern(
        &mut self,
        conn: ConnId,
        header_version: Option<Version>,
        parsed: &Body,
    ) -> bool {
        if header_version.is_some() {
            return false;
        }
        let Body::Single(m) = parsed else {
            return false;
        };
        let Some(v) = m.meta_protocol_version() else {
            return false;
        };
        let id = match &m.kind {
            Kind::Request { id, .. } => Some(id.clone()),
            _ => None,
        };
        let e = headers::MirrorError::MissingVersion;
        self.error(
            conn,
            400,
            id.as_ref(),
            jsonrpc::HEADER_MISMATCH,
            &e.to_string(),
            Some(json!({ "body_version": v })),
        );
        true
    }

    /// The messages of a POST to session `sid` and the session's upstream; answers and returns
    /// `None` when the upstream is gone (404), the version forbids a batch, or a batch
    /// carries `initialize` (400).
    fn session_messages(
        &mut self,
        conn: ConnId,
        sid: &str,
        header_version: Option<Version>,
        parsed: Body,
    ) -> Option<(UpstreamId, Vec<Message>)> {
        let sess = &self.sessions[sid];
        let Some(upstream) = sess.upstream else {
            self.error(conn, 404, None, jsonrpc::SESSION_ERROR, "Session not found (its upstream ended with a gateway restart; resume of its streams is still possible)", None);
            return None;
        };
        let version = header_version
            .or(sess.version)
            .unwrap_or(Version::V2025_03_26);
        let msgs = match parsed {
            Body::Single(m) => vec![m],
            Body::Batch(v) if version.allows_batch() => v,
            Body::Batch(_) => {
                self.error(conn, 400, None, jsonrpc::INVALID_REQUEST, &format!("Bad Request: JSON-RPC batches are not allowed in protocol version {version}"), None);
                return None;
            }
        };
        if msgs
            .iter()
            .any(|m| matches!(&m.kind, Kind::Request { method, .. } if method == "initialize"))
        {
            self.error(
                conn,
                400,
                None,
                jsonrpc::INVALID_REQUEST,
                "Bad Request: initialize must be sent alone, without Mcp-Session-Id",
                None,
            );
            return None;
        }
        Some((upstream, msgs))
    }

    /// Refuses a POST's requests that would exceed the session's in-flight limit (429) or reuse
    /// a request id or progress token in flight in the session or earlier in the same POST
    /// (400, naming the first such request). Returns true when it answered.
    fn refuse_requests(
        &mut self,
        conn: ConnId,
        sid: &str,
        requests: &[(RpcId, Option<RpcId>)],
    ) -> bool {
        let inflight_max = self.cfg.requests_inflight_max;
        let sess = &self.sessions[sid];
        if sess.inflight.len() + requests.len() > inflight_max {
            self.error(
                conn,
                429,
                None,
                jsonrpc::LIMIT_EXCEEDED,
                &format!(
                    "Too Many Requests: more than {inflight_max} requests in flight in this session"
                ),
                None,
            );
            return true;
        }
        let Some((id, what)) = first_reuse(sess, requests) else {
            return false;
        };
        self.error(
            conn,
            400,
            Some(&id),
            jsonrpc::INVALID_REQUEST,
            &format!("Bad Request: {what} is already in use in this session"),
            None,
        );
        true
    }

    /// Creates the next POST stream of session `sid` for `requests` (in flight from now on,
    /// their progress tokens routed to it), held per `--mcp-post-hold-ms`, and opens `conn`
    /// on it primed.
    fn open_post_stream(
        &mut self,
        now_ms: u64,
        conn: ConnId,
        sid: &str,
        requests: Vec<(RpcId, Option<RpcId>)>,
    ) {
        let retry_ms = self.cfg.retry_ms;
        let hold = self.cfg.post_hold_ms;
        let sess = self.sessions.get_mut(sid).expect("session_of checked");
        let n = sess.next_n;
        sess.next_n += 1;
        let mut stream = Stream::new(format!("mcp/{sid}/{n}"), StreamKind::Post);
        stream.pending = requests.len();
        stream.conn = Some(conn);
        stream.hold_deadline_ms = hold.map(|ms| now_ms.saturating_add(ms));
        for (id, tok) in requests {
            if let Some(t) = &tok {
                sess.progress.insert(t.clone(), n);
            }
            sess.inflight.insert(
                id,
                InFlight {
                    stream: n,
                    token: tok,
                },
            );
        }
        let name = stream.name.clone();
        sess.streams.insert(n, stream);
        self.conns.insert(conn, (Owner::Session(sid.to_owned()), n));
        self.open_primed(
            conn,
            &Owner::Session(sid.to_owned()),
            n,
            Some(retry_ms),
            Vec::new(),
        );
        debug_assert_eq!(name, format!("mcp/{sid}/{n}"));
    }

    /// Forwards `msgs` to `upstream`, in order.
    fn send_upstream(&mut self, upstream: UpstreamId, msgs: &[Message]) {
        for m in msgs {
            self.actions.push_back(Action::SendUpstream {
                upstream,
                line: m.to_line(),
            });
        }
    }

    /// Creates stream `n`, appends the priming event (SPEC L9) and opens `conn` on it.
    fn open_primed(
        &mut self,
        conn: ConnId,
        owner: &Owner,
        n: u32,
        retry_ms: Option<u32>,
        mut extra: Vec<(&'static str, String)>,
    ) {
        let st = self.stream_mut(owner, n).expect("stream just inserted");
        let name = st.name.clone();
        let seq = st.next_seq;
        st.next_seq += 1;
        self.actions.push_back(Action::CreateStream {
            stream: name.clone(),
        });
        self.actions.push_back(Action::Append {
            stream: name.clone(),
            seq,
            event_type: None,
            data: Vec::new(),
        });
        extra.extend(sse_headers());
        self.actions.push_back(Action::OpenSse {
            conn,
            reprime: None,
            stream: name,
            from_seq: seq,
            retry_ms,
            headers: extra,
            end_after: None,
        });
    }

    fn stream_mut(&mut self, owner: &Owner, n: u32) -> Option<&mut Stream> {
        match owner {
            Owner::Session(sid) => self.sessions.get_mut(sid)?.streams.get_mut(&n),
            Owner::Modern => self.modern.streams.get_mut(&n),
        }
    }

    fn initialize(
        &mut self,
        now_ms: u64,
        conn: ConnId,
        h: &Headers<'_>,
        header_version: Option<Version>,
        msg: Message,
    ) {
        let Kind::Request { id, .. } = &msg.kind else {
            unreachable!("initialize is a request")
        };
        if self.refuse_initialize(conn, h, id) {
            return;
        }
        // SPEC L1/L2: 128 random bits as lowercase hex: visible ASCII, unique.
        let sid = loop {
            let s = hex(&(self.session_id_source)());
            if !self.sessions.contains_key(&s) {
                break s;
            }
        };
        let upstream = UpstreamId(self.next_upstream);
        self.next_upstream += 1;
        self.upstreams.insert(upstream, Owner::Session(sid.clone()));
        self.stats.sessions_minted += 1;
        let sess = new_session(now_ms, conn, upstream, &sid, header_version, &msg, id);
        self.sessions.insert(sid.clone(), sess);
        self.conns.insert(conn, (Owner::Session(sid.clone()), 1));
        self.actions.push_back(Action::SpawnUpstream {
            upstream,
            session: Some(sid.clone()),
        });
        let owner = Owner::Session(sid.clone());
        let retry = self.cfg.retry_ms;
        self.open_primed(conn, &owner, 1, Some(retry), vec![("mcp-session-id", sid)]);
        self.actions.push_back(Action::SendUpstream {
            upstream,
            line: msg.to_line(),
        });
    }

    /// Refuses an `initialize` that carries a session id (400), does not accept SSE (406), or
    /// would exceed `--mcp-sessions-max` (503). Returns true when it answered.
    fn refuse_initialize(&mut self, conn: ConnId, h: &Headers<'_>, id: &RpcId) -> bool {
        if h.one(headers::SESSION_ID).ok().flatten().is_some() {
            self.error(conn, 400, Some(id), jsonrpc::INVALID_REQUEST, "Bad Request: initialize must not carry Mcp-Session-Id (start a new session without it)", None);
            return true;
        }
        if !Self::accepts_sse(h) {
            self.error(
                conn,
                406,
                Some(id),
                jsonrpc::INVALID_REQUEST,
                "Not Acceptable: requests are answered with text/event-stream",
                None,
            );
            return true;
        }
        if self.sessions.len() >= self.cfg.sessions_max {
            self.error(
                conn,
                503,
                Some(id),
                jsonrpc::LIMIT_EXCEEDED,
                &format!(
                    "Service Unavailable: {} sessions open (--mcp-sessions-max)",
                    self.cfg.sessions_max
                ),
                None,
            );
            return true;
        }
        false
    }

    fn legacy_get(&mut self, now_ms: u64, conn: ConnId, h: &Headers<'_>, log: &dyn LogView) {
        if !Self::accepts_sse(h) {
            return self.error(
                conn,
                406,
                None,
                jsonrpc::INVALID_REQUEST,
                "Not Acceptable: GET serves text/event-stream only",
                None,
            );
        }
        let Some(sid) = self.session_of(conn, h) else {
            return;
        };
        self.sessions.get_mut(&sid).expect("checked").last_active_ms = now_ms;
        match h.one(headers::LAST_EVENT_ID).ok().flatten() {
            Some(raw) => self.resume(conn, &sid, raw, log),
            None => self.fresh_get(conn, &sid),
        }
    }

    fn fresh_get(&mut self, conn: ConnId, sid: &str) {
        let retry = self.cfg.retry_ms;
        let sess = self.sessions.get_mut(sid).expect("checked");
        if sess.upstream.is_none() {
            return self.error(conn, 404, None, jsonrpc::SESSION_ERROR, "Session not found (recovered after restart: only resumption with Last-Event-ID is possible)", None);
        }
        let mut created = false;
        let st = sess.streams.entry(0).or_insert_with(|| {
            created = true;
            Stream::new(format!("mcp/{sid}/0"), StreamKind::Get)
        });
        if let Some(old) = st.conn.take() {
            // SPEC L14: two live connections on one stream would duplicate messages, so the new
            // GET takes over (the old one is usually a half-dead connection of a reconnecting
            // client). As for any close, what the old one was handed counts as delivered;
            // exactness needs Last-Event-ID.
            sess.get_undelivered_from = st.next_seq;
            self.conns.remove(&old);
            self.actions.push_back(Action::CloseSse { conn: old });
        }
        st.conn = Some(conn);
        let name = st.name.clone();
        let from = sess.get_undelivered_from.min(st.next_seq);
        self.conns.insert(conn, (Owner::Session(sid.to_owned()), 0));
        if created {
            self.actions.push_back(Action::CreateStream {
                stream: name.clone(),
            });
        }
        let headers = sse_headers();
        self.actions.push_back(Action::OpenSse {
            conn,
            reprime: None,
            stream: name,
            from_seq: from,
            retry_ms: Some(retry),
            headers,
            end_after: None,
        });
    }

    /// SPEC L19/L20: GET + Last-Event-ID. The id must name a stream of this session; the log's
    /// resume planner decides the rest ([`log_store::ResumePlan::outcome`]), then the MCP-only check that
    /// a complete stream has something left to give.
    fn resume(&mut self, conn: ConnId, sid: &str, raw: &[u8], log: &dyn LogView) {
        let text = String::from_utf8_lossy(raw).into_owned();
        let Some((ev, n)) = self.resume_target(conn, sid, &text, log) else {
            return;
        };
        let Some(bounds) = log.bounds(ev.stream) else {
            return self.refuse_resume(
                conn,
                "Bad Request: unknown stream",
                json!({ "requested": text }),
            );
        };
        let plan = plan_resume(&ResumeInput {
            log_epoch: log.epoch(),
            stream: ev.stream,
            bounds,
            requested: ev,
            window: None,
            known_epochs: log.known_epochs(),
        });
        let stream_name = format!("mcp/{sid}/{n}");
        let Some(from) = self.resume_from(conn, &text, &stream_name, plan.outcome()) else {
            return;
        };
        let at = ResumedAt {
            text,
            ev,
            stream_name,
            from,
        };
        if self.refuse_ended(conn, sid, n, bounds, &at) {
            return;
        }
        self.stats.resumes_ok += 1;
        self.attach_resumed(conn, sid, n, bounds, at);
    }

    /// Parses the Last-Event-ID and finds the stream of session `sid` it names (its number);
    /// answers 400 and returns `None` when it is not an event id or names no stream of `sid`.
    fn resume_target(
        &mut self,
        conn: ConnId,
        sid: &str,
        text: &str,
        log: &dyn LogView,
    ) -> Option<(EventId, u32)> {
        let ev: EventId = match text.parse() {
            Ok(ev) => ev,
            Err(e) => {
                self.refuse_resume(conn, &format!("Bad Request: Last-Event-ID {text:?} is not an event id of this gateway: {e}"), json!({ "requested": text }));
                return None;
            }
        };
        let log_epoch = log.epoch();
        let name = if ev.epoch == log_epoch {
            log.stream_name(ev.stream)
        } else {
            None
        };
        let owned = name
            .and_then(parse_stream_name)
            .filter(|(owner, _)| *owner == sid)
            .map(|(_, n)| n);
        if owned.is_none() {
            let why = if ev.epoch != log_epoch && !log.known_epochs().contains(&ev.epoch) {
                format!("event id {text} is from another log epoch (expected {log_epoch})")
            } else {
                format!("event id {text} does not belong to a stream of this session")
            };
            self.refuse_resume(
                conn,
                &format!("Bad Request: {why}"),
                json!({ "requested": text }),
            );
        }
        owned.map(|n| (ev, n))
    }

    /// Answers a resume the client got wrong: 400 with `RESUME_INVALID`, counted as rejected.
    fn refuse_resume(&mut self, conn: ConnId, msg: &str, data: Value) {
        self.stats.resumes_rejected += 1;
        self.error(conn, 400, None, jsonrpc::RESUME_INVALID, msg, Some(data));
    }

    /// The first seq to send for a served outcome; otherwise answers the MCP error (410 for
    /// truncated history, 400 for a refusal) and returns `None`. MCP keeps no parked window,
    /// so an aligned outcome (never planned here: the window is `None`) is read from the log
    /// from its head.
    fn resume_from(
        &mut self,
        conn: ConnId,
        text: &str,
        stream_name: &str,
        outcome: ResumeOutcome,
    ) -> Option<Seq> {
        match outcome {
            ResumeOutcome::Serve { from, aligned, .. } => {
                Some(aligned.map_or(from, |(head, _)| head))
            }
            ResumeOutcome::Gone {
                requested,
                floor,
                tail,
            } => {
                self.stats.resumes_truncated += 1;
                self.error(
                    conn,
                    410,
                    None,
                    jsonrpc::RESUME_TRUNCATED,
                    &format!("Gone: the history after {text} is no longer retained (requested seq {requested}, floor {floor}, tail {tail})"),
                    Some(json!({ "requested": text, "stream": stream_name, "requested_seq": requested, "floor": floor, "tail": tail })),
                );
                None
            }
            ResumeOutcome::Refused(r) if r.class == ResumeClass::BeyondTail => {
                let (requested, tail) = (detail_num(&r, "requested"), detail_num(&r, "tail"));
                self.refuse_resume(conn, &format!("Bad Request: event id {text} is beyond the stream's tail {tail}"), json!({ "requested": text, "stream": stream_name, "requested_seq": requested, "tail": tail }));
                None
            }
            ResumeOutcome::Refused(_) => {
                // Wrong epoch / other stream: excluded by `resume_target` (same epoch, stream
                // named by the id); kept total.
                self.refuse_resume(
                    conn,
                    &format!("Bad Request: event id {text} does not belong to this stream"),
                    json!({ "requested": text }),
                );
                None
            }
        }
    }

    /// A complete stream resumed at (or past) its last record has nothing more to give. A
    /// client only does that when the stream ended without the response it waits for (its
    /// session was recovered after a crash); an empty 200 would make it reconnect forever.
    /// Answers 410 and returns true in that case.
    fn refuse_ended(
        &mut self,
        conn: ConnId,
        sid: &str,
        n: u32,
        bounds: Bounds,
        at: &ResumedAt,
    ) -> bool {
        let ResumedAt {
            text,
            stream_name,
            from,
            ..
        } = at;
        let complete_at = match self.sessions[sid].streams.get(&n) {
            Some(st) => st.complete,
            None => Some(bounds.tail),
        };
        let Some(last) = complete_at.filter(|&last| *from > last) else {
            return false;
        };
        self.stats.resumes_rejected += 1;
        self.error(
            conn,
            410,
            None,
            jsonrpc::RESUME_TRUNCATED,
            &format!("Gone: the stream ended at seq {last}; nothing follows {text}"),
            Some(json!({ "requested": text, "stream": stream_name, "tail": last, "ended": true })),
        );
        true
    }

    /// Points stream `n` of session `sid` at the resuming connection (loading the stream's
    /// state from the log's bounds when it is not in memory), closes the connection it had,
    /// and opens the SSE response from `at.from`.
    fn attach_resumed(&mut self, conn: ConnId, sid: &str, n: u32, bounds: Bounds, at: ResumedAt) {
        let retry = self.cfg.retry_ms;
        let sess = self.sessions.get_mut(sid).expect("checked");
        // A stream not in memory is complete at its log tail.
        let (end_after, old) = match sess.streams.get_mut(&n) {
            Some(st) => {
                let old = st.conn.replace(conn);
                st.hold_deadline_ms = None;
                (st.complete, old)
            }
            None if n == 0 && sess.upstream.is_some() => {
                // The GET stream exists in the log but not in memory: cannot happen for a live
                // session (stream 0 is never dropped while the session lives).
                unreachable!("live session lost its GET stream state")
            }
            None => {
                let kind = if n == 0 {
                    StreamKind::Get
                } else {
                    StreamKind::Post
                };
                let mut st = Stream::new(at.stream_name.clone(), kind);
                st.next_seq = bounds.tail + 1;
                st.complete = Some(bounds.tail);
                st.conn = Some(conn);
                sess.streams.insert(n, st);
                (Some(bounds.tail), None)
            }
        };
        if let Some(old) = old {
            // The client came back on a new connection: the old one is stale. Closing it never
            // loses a message (the log has them); the new connection replays from N+1.
            self.conns.remove(&old);
            self.actions.push_back(Action::CloseSse { conn: old });
        }
        self.conns.insert(conn, (Owner::Session(sid.to_owned()), n));
        let headers = sse_headers();
        self.actions.push_back(Action::OpenSse {
            conn,
            // Clients that lose a resumed response before its first new event must still know
            // where they are (the TypeScript SDK otherwise retries without Last-Event-ID).
            reprime: Some(at.ev.to_string()),
            stream: at.stream_name,
            from_seq: at.from,
            retry_ms: Some(retry),
            headers,
            end_after,
        });
    }

    fn legacy_delete(&mut self, conn: ConnId, h: &Headers<'_>) {
        let Some(sid) = self.session_of(conn, h) else {
            return;
        };
        self.terminate(&sid, EndReason::Deleted);
        self.respond(conn, 200, Vec::new(), Vec::new());
    }

    // ---------------------------------------------------------------- modern era

    fn modern_post(&mut self, _now_ms: u64, conn: ConnId, h: &Headers<'_>, body: &[u8]) {
        let msg = match jsonrpc::classify(body, 1) {
            Ok(Body::Single(m)) => m,
            Ok(Body::Batch(_)) | Err(jsonrpc::ClassifyError::BatchTooLarge { .. }) => {
                // SPEC M3.
                return self.error(
                    conn,
                    400,
                    None,
                    jsonrpc::INVALID_REQUEST,
                    "Bad Request: the body must be a single JSON-RPC request or notification",
                    None,
                );
            }
            Err(e) => {
                return self.error(
                    conn,
                    400,
                    None,
                    e.code(),
                    &format!("Bad Request: {e}"),
                    None,
                );
            }
        };
        let id = match &msg.kind {
            Kind::Response { .. } => {
                return self.error(conn, 400, None, jsonrpc::INVALID_REQUEST, "Bad Request: clients must not send JSON-RPC responses in protocol version 2026-07-28", None);
            }
            Kind::Request { id, .. } => Some(id.clone()),
            Kind::Notification { .. } => None,
        };
        // SPEC M4/M5.
        if let Err(e) = headers::check_modern_mirrors(h, &msg, Version::V2026_07_28.as_str()) {
            return self.error(
                conn,
                400,
                id.as_ref(),
                jsonrpc::HEADER_MISMATCH,
                &e.to_string(),
                None,
            );
        }
        let upstream = self.modern_upstream();
        let Kind::Request { id, .. } = msg.kind.clone() else {
            // SPEC M7.
            self.actions.push_back(Action::SendUpstream {
                upstream,
                line: msg.to_line(),
            });
            return self.respond(conn, 202, Vec::new(), Vec::new());
        };
        if !Self::accepts_sse(h) {
            return self.error(
                conn,
                406,
                Some(&id),
                jsonrpc::INVALID_REQUEST,
                "Not Acceptable: requests are answered with text/event-stream",
                None,
            );
        }
        if self.modern.routes.len() >= self.cfg.requests_inflight_max {
            return self.error(
                conn,
                429,
                Some(&id),
                jsonrpc::LIMIT_EXCEEDED,
                "Too Many Requests: too many modern requests in flight",
                None,
            );
        }
        // SPEC M8: rewrite id and progress token to gateway-unique ones.
        let m = &mut self.modern;
        let k = m.next_rpc;
        m.next_rpc += 1;
        let up_id = format!("gw-{k}");
        let mut value = msg.value.clone();
        value["id"] = Value::from(up_id.as_str());
        let mut up_token = None;
        if let Some(tok) = msg.progress_token() {
            let t = format!("gw-p-{k}");
            value["params"]["_meta"]["progressToken"] = Value::from(t.as_str());
            up_token = Some(t.clone());
            m.tokens.insert(t, (m.next_n, tok));
        }
        let n = m.next_n;
        m.next_n += 1;
        m.routes.insert(
            up_id,
            Route {
                stream: n,
                orig_id: id,
                up_token,
            },
        );
        let mut st = Stream::new(format!("mcp/{}/{n}", self.boot), StreamKind::Post);
        st.pending = 1;
        st.conn = Some(conn);
        let name = st.name.clone();
        m.streams.insert(n, st);
        self.conns.insert(conn, (Owner::Modern, n));
        self.actions.push_back(Action::CreateStream {
            stream: name.clone(),
        });
        // SPEC M11: no priming event, no retry.
        let headers = sse_headers();
        self.actions.push_back(Action::OpenSse {
            conn,
            reprime: None,
            stream: name,
            from_seq: 1,
            retry_ms: None,
            headers,
            end_after: None,
        });
        self.actions.push_back(Action::SendUpstream {
            upstream,
            line: jsonrpc::value_to_line(&value),
        });
    }

    fn modern_upstream(&mut self) -> UpstreamId {
        if let Some(u) = self.modern.upstream {
            return u;
        }
        let u = UpstreamId(self.next_upstream);
        self.next_upstream += 1;
        self.modern.upstream = Some(u);
        self.upstreams.insert(u, Owner::Modern);
        self.actions.push_back(Action::SpawnUpstream {
            upstream: u,
            session: None,
        });
        u
    }

    // ---------------------------------------------------------------- upstream input

    /// One line from an upstream's stdout (without its `\n`).
    pub fn handle_upstream_line(&mut self, now_ms: u64, upstream: UpstreamId, line: &[u8]) {
        let Some(owner) = self.upstreams.get(&upstream).cloned() else {
            return;
        };
        self.stats.upstream_lines += 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let msgs = match jsonrpc::classify(line, usize::MAX) {
            Ok(Body::Single(m)) => vec![m],
            Ok(Body::Batch(v)) => v, // SPEC L21: a 2025-03-26 server may batch
            Err(_) => {
                // SPEC C9: never streamed.
                self.stats.upstream_garbage_lines += 1;
                return;
            }
        };
        for m in msgs {
            match &owner {
                Owner::Session(sid) => self.route_legacy(now_ms, sid, m),
                Owner::Modern => self.route_modern(m),
            }
        }
    }

    /// SPEC L15/L16/L17: exactly one destination per message, or none (dropped, counted).
    fn route_legacy(&mut self, now_ms: u64, sid: &str, m: Message) {
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        sess.last_active_ms = now_ms;
        let single_inflight = if sess.inflight.len() == 1 {
            sess.inflight.values().next().map(|f| f.stream)
        } else {
            None
        };
        let (dest, is_response) = match &m.kind {
            Kind::Response { id: Some(id) } => match sess.inflight.remove(id) {
                Some(f) => {
                    if let Some(t) = f.token {
                        sess.progress.remove(&t);
                    }
                    if sess.init_id.as_ref() == Some(id) {
                        sess.init_id = None;
                        let negotiated = m
                            .value
                            .get("result")
                            .and_then(|r| r.get("protocolVersion"))
                            .and_then(Value::as_str)
                            .and_then(Version::parse);
                        sess.version = negotiated.or(sess.version);
                    }
                    (Some(f.stream), true)
                }
                None => (None, true),
            },
            Kind::Response { id: None } => (None, true),
            Kind::Notification { method } if method == "notifications/progress" => (
                m.progress_notification_token()
                    .and_then(|t| sess.progress.get(&t).copied()),
                false,
            ),
            Kind::Notification { method } if method == "notifications/cancelled" => {
                let related = m
                    .request_id_param()
                    .and_then(|r| sess.inflight.get(&r).map(|f| f.stream));
                (Some(related.unwrap_or(0)), false)
            }
            Kind::Notification { method } if method == "notifications/message" => {
                (Some(single_inflight.unwrap_or(0)), false)
            }
            Kind::Notification { .. } => (Some(0), false),
            Kind::Request { .. } => (Some(single_inflight.unwrap_or(0)), false),
        };
        let Some(n) = dest else {
            self.stats.orphan_messages += 1;
            return;
        };
        if n == 0 && !sess.streams.contains_key(&0) {
            let st = Stream::new(format!("mcp/{sid}/0"), StreamKind::Get);
            self.actions.push_back(Action::CreateStream {
                stream: st.name.clone(),
            });
            sess.streams.insert(0, st);
        }
        let Some(st) = sess.streams.get_mut(&n) else {
            unreachable!("a routed stream with pending requests is in memory");
        };
        debug_assert!(st.complete.is_none(), "routed to a complete stream");
        let seq = st.next_seq;
        st.next_seq += 1;
        let data = m.to_line();
        let data = data[..data.len() - 1].to_vec();
        self.actions.push_back(Action::Append {
            stream: st.name.clone(),
            seq,
            event_type: None,
            data,
        });
        if is_response {
            st.pending -= 1;
            if st.pending == 0 && st.kind == StreamKind::Post {
                // SPEC L12.
                st.complete = Some(seq);
                st.hold_deadline_ms = None;
                self.actions.push_back(Action::StreamComplete {
                    stream: st.name.clone(),
                    last_seq: seq,
                });
                if st.conn.is_none() {
                    sess.streams.remove(&n);
                }
            }
        }
    }

    fn route_modern(&mut self, mut m: Message) {
        let md = &mut self.modern;
        let single = if md.routes.len() == 1 {
            md.routes.values().next().map(|r| r.stream)
        } else {
            None
        };
        let up_key = |id: &RpcId| match id {
            RpcId::Str(s) => Some(s.clone()),
            RpcId::Int(_) => None,
        };
        let (dest, complete) = match &m.kind {
            Kind::Response { id: Some(id) } => {
                match up_key(id).and_then(|k| md.routes.remove(&k)) {
                    Some(r) => {
                        if let Some(t) = &r.up_token {
                            md.tokens.remove(t);
                        }
                        m.value["id"] = r.orig_id.to_value();
                        (Some(r.stream), true)
                    }
                    None => (None, false),
                }
            }
            Kind::Notification { method } if method == "notifications/progress" => {
                match m
                    .progress_notification_token()
                    .and_then(|t| up_key(&t))
                    .and_then(|k| md.tokens.get(&k).cloned())
                {
                    Some((n, orig)) => {
                        m.value["params"]["progressToken"] = orig.to_value();
                        (Some(n), false)
                    }
                    None => (None, false),
                }
            }
            Kind::Notification { method } => {
                // SPEC M10: subscription notifications carry the listen request's id.
                if let Some(r) = m
                    .subscription_id()
                    .and_then(|s| up_key(&s))
                    .and_then(|k| md.routes.get(&k))
                {
                    let (n, orig) = (r.stream, r.orig_id.to_value());
                    m.value["params"]["_meta"][jsonrpc::SUBSCRIPTION_ID_KEY] = orig;
                    (Some(n), false)
                } else if let Some(r) = m
                    .request_id_param()
                    .and_then(|s| up_key(&s))
                    .and_then(|k| md.routes.get(&k))
                {
                    let (n, orig) = (r.stream, r.orig_id.to_value());
                    m.value["params"]["requestId"] = orig;
                    (Some(n), false)
                } else if method == "notifications/message" {
                    (single, false)
                } else {
                    (None, false)
                }
            }
            // SPEC M8: no independent server requests on modern streams.
            Kind::Request { .. } | Kind::Response { id: None } => (None, false),
        };
        let Some(n) = dest else {
            self.stats.orphan_messages += 1;
            return;
        };
        let Some(st) = md.streams.get_mut(&n) else {
            // The client closed the stream (cancelled); late messages are dropped (SPEC M9).
            self.stats.orphan_messages += 1;
            return;
        };
        let seq = st.next_seq;
        st.next_seq += 1;
        self.actions.push_back(Action::Append {
            stream: st.name.clone(),
            seq,
            event_type: None,
            data: serde_json::to_vec(&m.value).expect("Value serialises"),
        });
        if complete {
            st.complete = Some(seq);
            self.actions.push_back(Action::StreamComplete {
                stream: st.name.clone(),
                last_seq: seq,
            });
            if st.conn.is_none() {
                md.streams.remove(&n);
            }
        }
    }

    /// The upstream process exited (or its pipes broke): its session ends (SPEC: "If the child
    /// dies, its open streams get an explicit error event and its in-flight requests get
    /// JSON-RPC errors").
    pub fn handle_upstream_exit(&mut self, _now_ms: u64, upstream: UpstreamId, why: &str) {
        let owner = self.upstreams.remove(&upstream);
        if owner.is_some() {
            self.stats.upstream_deaths += 1;
        }
        match owner {
            Some(Owner::Session(sid)) => {
                if let Some(s) = self.sessions.get_mut(&sid) {
                    s.upstream = None; // already gone: no KillUpstream
                }
                self.terminate(&sid, EndReason::UpstreamExited(why.to_owned()));
            }
            Some(Owner::Modern) => {
                self.modern.upstream = None;
                self.fail_modern(&format!("upstream MCP server exited: {why}"));
            }
            None => {}
        }
    }

    fn fail_modern(&mut self, why: &str) {
        let routes: Vec<Route> = self.modern.routes.drain().map(|(_, r)| r).collect();
        self.modern.tokens.clear();
        for r in routes {
            let Some(st) = self.modern.streams.get_mut(&r.stream) else {
                continue;
            };
            let seq = st.next_seq;
            st.next_seq += 1;
            let data = jsonrpc::error_body(Some(&r.orig_id), jsonrpc::UPSTREAM_GONE, why, None);
            self.actions.push_back(Action::Append {
                stream: st.name.clone(),
                seq,
                event_type: None,
                data,
            });
            st.complete = Some(seq);
            self.actions.push_back(Action::StreamComplete {
                stream: st.name.clone(),
                last_seq: seq,
            });
            if st.conn.is_none() {
                self.modern.streams.remove(&r.stream);
            }
        }
    }

    /// Ends a session: unanswered requests get a JSON-RPC error on their stream, the GET stream
    /// gets an `event: error` when the upstream died, every stream completes, the upstream is
    /// killed, and the id answers 404 from now on.
    fn terminate(&mut self, sid: &str, why: EndReason) {
        let Some(mut sess) = self.sessions.remove(sid) else {
            return;
        };
        self.stats.sessions_terminated += 1;
        let message = why.to_string();
        let mut inflight: Vec<(RpcId, InFlight)> = sess.inflight.drain().collect();
        inflight.sort_by_key(|(_, f)| f.stream);
        for (id, f) in inflight {
            let Some(st) = sess.streams.get_mut(&f.stream) else {
                continue;
            };
            let seq = st.next_seq;
            st.next_seq += 1;
            let data = jsonrpc::error_body(Some(&id), jsonrpc::UPSTREAM_GONE, &message, None);
            self.actions.push_back(Action::Append {
                stream: st.name.clone(),
                seq,
                event_type: None,
                data,
            });
        }
        if let (EndReason::UpstreamExited(_), Some(st)) = (&why, sess.streams.get_mut(&0)) {
            let seq = st.next_seq;
            st.next_seq += 1;
            let data = serde_json::to_vec(&json!({ "error": message })).expect("Value serialises");
            self.actions.push_back(Action::Append {
                stream: st.name.clone(),
                seq,
                event_type: Some("error"),
                data,
            });
        }
        for st in sess.streams.values_mut() {
            if st.complete.is_none() && st.next_seq > 1 {
                st.complete = Some(st.next_seq - 1);
                self.actions.push_back(Action::StreamComplete {
                    stream: st.name.clone(),
                    last_seq: st.next_seq - 1,
                });
            } else if st.complete.is_none() {
                // A GET stream with no record yet: end its connection directly.
                if let Some(c) = st.conn {
                    self.actions.push_back(Action::CloseSse { conn: c });
                }
            }
            if let Some(c) = st.conn.take() {
                self.conns.remove(&c);
            }
        }
        if let Some(u) = sess.upstream.take() {
            self.upstreams.remove(&u);
            self.actions.push_back(Action::KillUpstream { upstream: u });
        }
    }

    // ---------------------------------------------------------------- connections and time

    /// An SSE connection ended (client went away, network, or the send path finished it).
    pub fn handle_connection_closed(&mut self, now_ms: u64, conn: ConnId) {
        let Some((owner, n)) = self.conns.remove(&conn) else {
            return;
        };
        match owner {
            Owner::Session(sid) => {
                let Some(sess) = self.sessions.get_mut(&sid) else {
                    return;
                };
                sess.last_active_ms = now_ms;
                let Some(st) = sess.streams.get_mut(&n) else {
                    return;
                };
                if st.conn != Some(conn) {
                    return;
                }
                st.conn = None;
                st.hold_deadline_ms = None;
                // SPEC L13: not a cancellation; the stream lives on in the log.
                if n == 0 {
                    sess.get_undelivered_from = st.next_seq;
                } else if st.complete.is_some() {
                    sess.streams.remove(&n);
                }
            }
            Owner::Modern => {
                let Some(st) = self.modern.streams.remove(&n) else {
                    return;
                };
                if st.complete.is_some() {
                    return;
                }
                // SPEC M9: closing the stream is cancellation; tell the upstream (stdio rule).
                let ids: Vec<String> = self
                    .modern
                    .routes
                    .iter()
                    .filter(|(_, r)| r.stream == n)
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in ids {
                    let r = self.modern.routes.remove(&k).expect("listed");
                    if let Some(t) = r.up_token {
                        self.modern.tokens.remove(&t);
                    }
                    self.stats.modern_cancels += 1;
                    if let Some(u) = self.modern.upstream {
                        let note = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": k, "reason": "client closed the response stream" } });
                        self.actions.push_back(Action::SendUpstream {
                            upstream: u,
                            line: jsonrpc::value_to_line(&note),
                        });
                    }
                }
            }
        }
    }

    /// Timers: POST hold timeouts (SPEC L11) and idle session expiry.
    pub fn handle_tick(&mut self, now_ms: u64) {
        let mut close = Vec::new();
        let mut expire = Vec::new();
        for (sid, sess) in &mut self.sessions {
            let mut attached = false;
            for st in sess.streams.values_mut() {
                if let (Some(c), Some(d)) = (st.conn, st.hold_deadline_ms)
                    && d <= now_ms
                    && st.complete.is_none()
                {
                    st.hold_deadline_ms = None;
                    st.conn = None;
                    close.push(c);
                    continue;
                }
                attached |= st.conn.is_some();
            }
            if !attached && now_ms.saturating_sub(sess.last_active_ms) >= self.cfg.session_idle_ms {
                expire.push(sid.clone());
            }
        }
        for c in close {
            self.conns.remove(&c);
            self.actions.push_back(Action::CloseSse { conn: c });
        }
        for sid in expire {
            self.terminate(&sid, EndReason::IdleExpired);
        }
    }

    /// The earliest time `handle_tick` has work (for the reactor's timer).
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut t: Option<u64> = None;
        for sess in self.sessions.values() {
            let mut attached = false;
            for st in sess.streams.values() {
                if let (Some(_), Some(d)) = (st.conn, st.hold_deadline_ms) {
                    t = Some(t.map_or(d, |x| x.min(d)));
                }
                attached |= st.conn.is_some();
            }
            if !attached {
                let d = sess.last_active_ms.saturating_add(self.cfg.session_idle_ms);
                t = Some(t.map_or(d, |x| x.min(d)));
            }
        }
        t
    }

    /// Gateway shutdown: every session ends (unanswered requests get errors in the log, so a
    /// client resuming after the restart sees an explicit error, not a stream that never ends).
    pub fn shutdown(&mut self) {
        let sids: Vec<String> = self.sessions.keys().cloned().collect();
        for sid in sids {
            self.terminate(&sid, EndReason::Shutdown);
        }
        self.fail_modern("gateway shutting down");
        if let Some(u) = self.modern.upstream.take() {
            self.upstreams.remove(&u);
            self.actions.push_back(Action::KillUpstream { upstream: u });
        }
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
