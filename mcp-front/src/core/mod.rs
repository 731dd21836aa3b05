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
//!
//! # Layout
//! One `impl McpCore` block per concern; this file holds the types, the state and the
//! constructor and accessors.
//! - `http`: HTTP input (header checks, dispatch by era and method) and the response helpers.
//! - `legacy`: the 2025-era session transport (`initialize`, POST streams, GET, DELETE).
//! - `resume`: GET + Last-Event-ID on legacy streams.
//! - `modern`: the 2026-07-28 stateless era.
//! - `routing`: upstream lines to streams.
//! - `lifecycle`: upstream exits, session termination, closed connections, timers, shutdown.
//! - `../core_tests.rs`: the tests, one per rule of `SPEC-NOTES.md` at least.
#![forbid(unsafe_code)]

mod http;
mod legacy;
mod lifecycle;
mod modern;
mod resume;
mod routing;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::credential::Credential;
use crate::era::Version;
use crate::headers::OriginPolicy;
use crate::jsonrpc::RpcId;
use log_store::{Bounds, Epoch, Seq, StreamId};
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
    /// Who the caller is, when the gateway authenticates (`None` when it does not): an opaque
    /// identity the gateway derives from the token's issuer and subject with a keyed hash
    /// (the gateway's `mcp/identity.rs`), never the subject itself. A session is bound to the
    /// identity that initialized it: another's request or resume gets 404, as an unknown
    /// session; at most `sessions_per_subject_max` live sessions per identity.
    pub subject: Option<&'a str>,
}

/// The tag binding a session ID to a caller: `.` and the first 128 bits of SHA-256(identity)
/// in hex, appended to the ID's 128 random bits. The binding lives in the ID itself, so it
/// holds for sessions recovered after a restart (and on other nodes that derive identities
/// with the same key). The random part stays the secret; the tag only says whose it is, and
/// as the identity is keyed (see [`HttpRequest::subject`]) it confirms no guessed subject.
pub fn subject_tag(subject: &str) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(subject.as_bytes());
    format!(".{}", hex(&d[..16]))
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
    /// Live + recovered sessions (`--mcp-sessions-max`), counted in `sessions`.
    pub sessions_max: usize,
    /// The count `sessions_max` bounds: this core's sessions alone by default; one count
    /// shared by several cores (the gateway runs an MCP core per shard it serves MCP on)
    /// bounds them all together.
    pub sessions: SessionCount,
    /// Live sessions (with an upstream) of one subject, when requests carry one
    /// (`--mcp-sessions-per-subject-max`); an `initialize` beyond it gets 429.
    pub sessions_per_subject_max: usize,
    /// Client requests awaiting a response, per session and for the modern front
    /// (`--mcp-requests-inflight-max`).
    pub requests_inflight_max: usize,
    /// Messages in one 2025-03-26 batch (`--mcp-batch-len-max`).
    pub batch_len_max: usize,
    /// Pass the client's `Authorization` header on to the upstream
    /// (`--mcp-forward-authorization`, HTTP upstreams only): a session's upstream sends the
    /// value of the session's latest request ([`Action::SetUpstreamAuthorization`]); the shared
    /// modern upstream sends each request with its own ([`Action::SendUpstream`]). Off: the
    /// core never reads the header.
    pub forward_authorization: bool,
    /// Put before every session ID and modern boot prefix this core mints (visible ASCII, no
    /// `/` or `.`): the gateway names the log shard that holds the session's streams with it,
    /// so any core can tell which core serves a session. Empty by default.
    pub session_id_prefix: String,
}

/// Sessions held by one or more MCP cores, against `McpConfig::sessions_max`: a session is
/// counted from the moment its place is reserved (an admitted `initialize`, a recovered
/// stream's new session) until it is removed (ended, or evicted as replay-only).
#[derive(Debug, Clone, Default)]
pub struct SessionCount(Arc<AtomicUsize>);

impl SessionCount {
    /// Takes a place if fewer than `max` are taken (atomically: cores racing for the last
    /// place cannot both take it).
    fn try_reserve(&self, max: usize) -> bool {
        (self.0)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    fn release(&self) {
        let _ = (self.0).fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Places taken now.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            origin_policy: OriginPolicy::default(),
            retry_ms: 1000,
            post_hold_ms: None,
            session_idle_ms: 30 * 60 * 1000,
            sessions_max: 1024,
            sessions: SessionCount::default(),
            sessions_per_subject_max: 8,
            requests_inflight_max: 256,
            batch_len_max: 64,
            forward_authorization: false,
            session_id_prefix: String::new(),
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
    /// Write one line (ends in `\n`) to the upstream. `authorization`: the `Authorization` to
    /// send this message with, for the shared modern upstream (the request's own, or for a
    /// cancellation the cancelled request's); always `None` for a session's upstream, which
    /// sends what [`Action::SetUpstreamAuthorization`] set last.
    SendUpstream {
        upstream: UpstreamId,
        line: Vec<u8>,
        authorization: Option<Credential>,
    },
    /// From now on, every request of this session's upstream (its POSTs, its GET stream, its
    /// DELETE) carries this `Authorization` (`None`: none): the value of the session's latest
    /// request, so a client's refreshed token replaces the old one at once. Only with
    /// `forward_authorization`, and only after the request passed the session's subject check.
    SetUpstreamAuthorization {
        upstream: UpstreamId,
        authorization: Option<Credential>,
    },
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
    /// The request's `Authorization` (with `forward_authorization`), for its cancellation.
    authorization: Option<Credential>,
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
    /// The subject of the request being handled (`HttpRequest::subject`).
    subject: Option<String>,
    /// The `Authorization` of the request being handled, with `forward_authorization` only.
    authorization: Option<Credential>,
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An MCP stream's name as logs, metrics and error bodies may show it: `mcp/<redacted>/<n>`.
/// The session ID in the name is the session's only credential, so no output names it; other
/// names are returned as they are.
pub fn redact_stream_name(name: &str) -> String {
    match parse_stream_name(name) {
        Some((_, n)) => format!("mcp/<redacted>/{n}"),
        None if name.starts_with("mcp/") => "mcp/<redacted>".to_owned(),
        None => name.to_owned(),
    }
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
        let boot = format!(
            "m{}{}",
            cfg.session_id_prefix,
            &hex(&session_id_source())[..16]
        );
        McpCore {
            cfg,
            session_id_source,
            subject: None,
            authorization: None,
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

    /// Makes room under `--mcp-sessions-max` by dropping the least recently active
    /// replay-only session (recovered: no upstream, nothing attached). It loses nothing: its
    /// streams are in the log, and a resume recovers it again. False if there is none.
    fn evict_replay_only(&mut self) -> bool {
        let victim = self
            .sessions
            .iter()
            .filter(|(_, s)| s.upstream.is_none() && s.streams.values().all(|st| st.conn.is_none()))
            .min_by_key(|(_, s)| s.last_active_ms)
            .map(|(sid, _)| sid.clone());
        let evicted = victim.is_some_and(|sid| self.sessions.remove(&sid).is_some());
        if evicted {
            self.cfg.sessions.release();
        }
        evicted
    }

    /// Reserves a place for a new session under `--mcp-sessions-max` (over every core sharing
    /// the count), evicting a replay-only session of this core's if that makes room.
    fn reserve_session(&mut self) -> bool {
        let max = self.cfg.sessions_max;
        self.cfg.sessions.try_reserve(max)
            || self.evict_replay_only() && self.cfg.sessions.try_reserve(max)
    }

    /// Whether the core holds stream `name` in memory (so it may still append to it): a
    /// stream of a live session, or a live modern-era stream of this process.
    pub fn holds_stream(&self, name: &str) -> bool {
        self.held(name).is_some()
    }

    /// Whether stream `name` is held and not complete: more of its records are to come (its
    /// response, or a session's GET stream).
    pub fn stream_open(&self, name: &str) -> bool {
        self.held(name).is_some_and(|st| st.complete.is_none())
    }

    fn held(&self, name: &str) -> Option<&Stream> {
        let (owner, n) = parse_stream_name(name)?;
        if owner == self.boot {
            return self.modern.streams.get(&n);
        }
        self.sessions.get(owner)?.streams.get(&n)
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
        if sid.starts_with('m') || !self.sessions.contains_key(sid) && !self.reserve_session() {
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
}

#[cfg(test)]
#[path = "../core_tests.rs"]
mod tests;
