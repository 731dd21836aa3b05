//! The 2025-era transport (2025-03-26..2025-11-25): sessions minted by `initialize`, POSTs
//! answered on per-POST SSE streams, the session's GET stream, and DELETE.

use super::{
    Action, ConnId, EndReason, InFlight, LogView, McpCore, Owner, Session, Stream, StreamKind,
    UpstreamId, hex, sse_headers,
};
use crate::era::Version;
use crate::headers::{self, Headers};
use crate::jsonrpc::{self, Body, Kind, Message, RpcId};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};

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

impl McpCore {
    pub(super) fn legacy_post(
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
            return self.not_acceptable(conn, None);
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
        // No `debug_assert_eq!`: its panic message would print the session ID.
        debug_assert!(name == format!("mcp/{sid}/{n}"), "POST stream name");
    }

    /// Forwards `msgs` to `upstream`, in order.
    fn send_upstream(&mut self, upstream: UpstreamId, msgs: &[Message]) {
        for m in msgs {
            self.actions.push_back(Action::SendUpstream {
                upstream,
                line: m.to_line(),
                authorization: None, // the session's, set by SetUpstreamAuthorization
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
        // SPEC L1/L2: the configured prefix, then 128 random bits as lowercase hex: visible
        // ASCII, unique.
        let tag = self.subject.as_deref().map(super::subject_tag);
        let sid = loop {
            let mut s = self.cfg.session_id_prefix.clone();
            s.push_str(&hex(&(self.session_id_source)()));
            s.push_str(tag.as_deref().unwrap_or(""));
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
        self.set_upstream_authorization(upstream);
        let owner = Owner::Session(sid.clone());
        let retry = self.cfg.retry_ms;
        self.open_primed(conn, &owner, 1, Some(retry), vec![("mcp-session-id", sid)]);
        self.actions.push_back(Action::SendUpstream {
            upstream,
            line: msg.to_line(),
            authorization: None, // the session's, set above
        });
    }

    /// Refuses an `initialize` that carries a session id (400), does not accept SSE (406), or
    /// would exceed `--mcp-sessions-per-subject-max` (429) or `--mcp-sessions-max` (503).
    /// Returns true when it answered; false with the new session's place reserved.
    fn refuse_initialize(&mut self, conn: ConnId, h: &Headers<'_>, id: &RpcId) -> bool {
        if h.one(headers::SESSION_ID).ok().flatten().is_some() {
            self.error(conn, 400, Some(id), jsonrpc::INVALID_REQUEST, "Bad Request: initialize must not carry Mcp-Session-Id (start a new session without it)", None);
            return true;
        }
        if !Self::accepts_sse(h) {
            self.not_acceptable(conn, Some(id));
            return true;
        }
        if let Some(n) = self.subject_sessions_over_max() {
            let msg = format!(
                "Too Many Requests: this caller has {n} sessions open \
                 (--mcp-sessions-per-subject-max); end one (DELETE) first"
            );
            self.error(conn, 429, Some(id), jsonrpc::LIMIT_EXCEEDED, &msg, None);
            return true;
        }
        if !self.reserve_session() {
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

    /// The live sessions (with an upstream) of the request's caller, if they are
    /// `--mcp-sessions-per-subject-max` already. O(sessions), at `initialize` only.
    fn subject_sessions_over_max(&self) -> Option<usize> {
        let tag = super::subject_tag(self.subject.as_deref()?);
        let n = (self.sessions.iter())
            .filter(|(sid, s)| s.upstream.is_some() && sid.ends_with(&tag))
            .count();
        (n >= self.cfg.sessions_per_subject_max).then_some(n)
    }

    pub(super) fn legacy_get(
        &mut self,
        now_ms: u64,
        conn: ConnId,
        h: &Headers<'_>,
        log: &dyn LogView,
    ) {
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

    pub(super) fn legacy_delete(&mut self, conn: ConnId, h: &Headers<'_>) {
        let Some(sid) = self.session_of(conn, h) else {
            return;
        };
        self.terminate(&sid, EndReason::Deleted);
        self.respond(conn, 200, Vec::new(), Vec::new());
    }
}
