//! Tests of the MCP core against the rules in `SPEC-NOTES.md`: one test per rule at least,
//! named as in the notes. A harness plays the driver: it carries out every [`Action`] on an
//! in-memory model of the log (asserting the core's predicted sequence numbers), records
//! responses, SSE opens and upstream traffic, and computes what each SSE connection delivers.

use super::*;
use crate::jsonrpc;
use log_store::EventId;
use proptest::prelude::*;
use serde_json::{Value, json};
use std::collections::HashSet;

const EPOCH: Epoch = Epoch(0x0123_4567_89ab_cdef);

#[derive(Debug, Default)]
struct FakeLog {
    names: Vec<String>,
    /// Per stream: (event type, data) for seq 1.. ; `floor` marks retention.
    recs: Vec<Vec<(Option<&'static str>, Vec<u8>)>>,
    floor: Vec<Seq>,
}

impl FakeLog {
    fn id(&self, name: &str) -> Option<StreamId> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| StreamId(i as u32))
    }
}

impl LogView for FakeLog {
    fn epoch(&self) -> Epoch {
        EPOCH
    }
    fn stream_name(&self, id: StreamId) -> Option<&str> {
        self.names.get(id.0 as usize).map(String::as_str)
    }
    fn bounds(&self, id: StreamId) -> Option<Bounds> {
        let tail = self.recs.get(id.0 as usize)?.len() as Seq;
        Some(Bounds {
            floor: self.floor[id.0 as usize],
            tail,
            visible_tail: tail,
        })
    }
}

#[derive(Debug, Clone)]
struct Sse {
    stream: String,
    from: Seq,
    retry: Option<u32>,
    headers: Vec<(&'static str, String)>,
    end_after: Option<Seq>,
    reprime: Option<String>,
    closed_by_server: bool,
}

#[derive(Debug, Clone)]
struct Resp {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct H {
    core: McpCore,
    log: FakeLog,
    now: u64,
    next_conn: ConnId,
    responses: HashMap<ConnId, Resp>,
    sse: HashMap<ConnId, Sse>,
    upstream_in: HashMap<UpstreamId, Vec<Value>>,
    spawned: Vec<(UpstreamId, Option<String>)>,
    killed: Vec<UpstreamId>,
    complete: HashMap<String, Seq>,
    /// The authenticated subject every request carries (None: no authentication).
    subject: Option<String>,
    /// Per upstream, in order: `("set", value)` for each `SetUpstreamAuthorization`,
    /// `("send:<method>", value)` for each `SendUpstream` (`"send:response"` without method).
    auth_trace: Vec<(UpstreamId, String, Option<String>)>,
}

fn counter_source() -> Box<dyn FnMut() -> [u8; 16] + Send> {
    let mut n: u128 = 0x5eed;
    Box::new(move || {
        n = n
            .wrapping_mul(0x2545_f491_4f6c_dd1d)
            .wrapping_add(0x9e37_79b9);
        n.to_le_bytes()
    })
}

impl H {
    fn new() -> H {
        H::with(McpConfig::default())
    }

    fn with(cfg: McpConfig) -> H {
        H {
            core: McpCore::new(cfg, counter_source()),
            log: FakeLog::default(),
            now: 1_000,
            next_conn: 1,
            responses: HashMap::new(),
            sse: HashMap::new(),
            upstream_in: HashMap::new(),
            spawned: Vec::new(),
            killed: Vec::new(),
            complete: HashMap::new(),
            subject: None,
            auth_trace: Vec::new(),
        }
    }

    fn pump(&mut self) {
        while let Some(a) = self.core.poll_action() {
            match a {
                Action::Respond {
                    conn,
                    status,
                    headers,
                    body,
                } => {
                    assert!(
                        self.responses
                            .insert(
                                conn,
                                Resp {
                                    status,
                                    headers,
                                    body
                                }
                            )
                            .is_none(),
                        "two responses on one conn"
                    );
                    assert!(!self.sse.contains_key(&conn));
                }
                Action::CreateStream { stream } => {
                    if self.log.id(&stream).is_none() {
                        self.log.names.push(stream);
                        self.log.recs.push(Vec::new());
                        self.log.floor.push(1);
                    }
                }
                Action::Append {
                    stream,
                    seq,
                    event_type,
                    data,
                } => {
                    let id = self.log.id(&stream).expect("append to a created stream").0 as usize;
                    assert_eq!(
                        self.log.recs[id].len() as Seq + 1,
                        seq,
                        "core predicted the wrong seq on {stream}"
                    );
                    assert!(
                        !self.complete.contains_key(&stream),
                        "append after StreamComplete on {stream}"
                    );
                    self.log.recs[id].push((event_type, data));
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
                    assert!(!self.responses.contains_key(&conn));
                    assert!(self.log.id(&stream).is_some(), "open on a created stream");
                    self.sse.insert(
                        conn,
                        Sse {
                            stream,
                            from: from_seq,
                            retry: retry_ms,
                            headers,
                            end_after,
                            reprime,
                            closed_by_server: false,
                        },
                    );
                }
                Action::StreamComplete { stream, last_seq } => {
                    let id = self.log.id(&stream).unwrap().0 as usize;
                    assert_eq!(self.log.recs[id].len() as Seq, last_seq);
                    assert!(
                        self.complete.insert(stream, last_seq).is_none(),
                        "completed twice"
                    );
                }
                Action::CloseSse { conn } => {
                    self.sse
                        .get_mut(&conn)
                        .expect("close an open sse")
                        .closed_by_server = true;
                }
                Action::SpawnUpstream { upstream, session } => {
                    self.spawned.push((upstream, session))
                }
                Action::SendUpstream {
                    upstream,
                    line,
                    authorization,
                } => {
                    assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
                    assert_eq!(*line.last().unwrap(), b'\n');
                    let v: Value = serde_json::from_slice(&line).unwrap();
                    let what = format!("send:{}", v["method"].as_str().unwrap_or("response"));
                    let a = authorization.map(|c| c.expose().to_owned());
                    self.auth_trace.push((upstream, what, a));
                    self.upstream_in.entry(upstream).or_default().push(v);
                }
                Action::SetUpstreamAuthorization {
                    upstream,
                    authorization,
                } => {
                    let a = authorization.map(|c| c.expose().to_owned());
                    self.auth_trace.push((upstream, "set".to_owned(), a));
                }
                Action::KillUpstream { upstream } => self.killed.push(upstream),
            }
        }
    }

    fn conn(&mut self) -> ConnId {
        self.next_conn += 1;
        self.next_conn
    }

    fn req(&mut self, method: HttpMethod, headers: &[(&str, &str)], body: &str) -> ConnId {
        let conn = self.conn();
        let pairs: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        self.core.handle_http(
            self.now,
            &HttpRequest {
                conn,
                method,
                headers: &pairs,
                body: body.as_bytes(),
                subject: self.subject.as_deref(),
            },
            &self.log,
        );
        self.pump();
        conn
    }

    fn post(&mut self, headers: &[(&str, &str)], body: &str) -> ConnId {
        self.req(HttpMethod::Post, headers, body)
    }

    fn resp(&self, conn: ConnId) -> &Resp {
        self.responses.get(&conn).unwrap_or_else(|| {
            panic!(
                "no plain response on conn {conn}: sse={:?}",
                self.sse.get(&conn)
            )
        })
    }

    fn status(&self, conn: ConnId) -> u16 {
        self.resp(conn).status
    }

    /// Initializes a session; returns (session id, upstream, init conn).
    fn init(&mut self) -> (String, UpstreamId, ConnId) {
        let c = self.post(&[("accept", "application/json, text/event-stream")], INIT);
        let sid = self.sse[&c]
            .headers
            .iter()
            .find(|(k, _)| *k == "mcp-session-id")
            .unwrap()
            .1
            .clone();
        let up = self.spawned.last().unwrap().0;
        self.upstream_line(up, r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"u","version":"1"}}}"#);
        (sid, up, c)
    }

    fn upstream_line(&mut self, up: UpstreamId, line: &str) {
        self.core
            .handle_upstream_line(self.now, up, line.as_bytes());
        self.pump();
    }

    fn s(&self, sid: &str) -> Vec<(&'static str, String)> {
        vec![
            ("mcp-session-id", sid.to_owned()),
            ("accept", "application/json, text/event-stream".to_owned()),
        ]
    }

    fn post_s(&mut self, sid: &str, body: &str) -> ConnId {
        let hs = self.s(sid);
        let hs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.post(&hs, body)
    }

    fn get_s(&mut self, sid: &str, last_event_id: Option<&str>) -> ConnId {
        let mut hs = vec![("mcp-session-id", sid), ("accept", "text/event-stream")];
        if let Some(l) = last_event_id {
            hs.push(("last-event-id", l));
        }
        self.req(HttpMethod::Get, &hs, "")
    }

    /// Records a connection delivers: from `from` through its end (or the log tail).
    fn records(&self, conn: ConnId) -> Vec<(Seq, Option<&'static str>, Vec<u8>)> {
        let s = &self.sse[&conn];
        let id = self.log.id(&s.stream).unwrap().0 as usize;
        let tail = self.log.recs[id].len() as Seq;
        let end = s.end_after.map_or(tail, |e| e.min(tail));
        (s.from..=end)
            .map(|q| {
                (
                    q,
                    self.log.recs[id][(q - 1) as usize].0,
                    self.log.recs[id][(q - 1) as usize].1.clone(),
                )
            })
            .collect()
    }

    /// Non-priming messages a connection delivers, as JSON.
    fn msgs(&self, conn: ConnId) -> Vec<Value> {
        self.records(conn)
            .into_iter()
            .filter(|(_, _, d)| !d.is_empty())
            .map(|(_, _, d)| serde_json::from_slice(&d).unwrap())
            .collect()
    }

    fn event_id(&self, conn: ConnId, seq: Seq) -> String {
        let id = self.log.id(&self.sse[&conn].stream).unwrap();
        EventId {
            epoch: EPOCH,
            stream: id,
            seq,
        }
        .to_string()
    }

    fn stream_msgs(&self, name: &str) -> Vec<Value> {
        let Some(id) = self.log.id(name) else {
            return Vec::new();
        };
        self.log.recs[id.0 as usize]
            .iter()
            .filter(|(t, d)| !d.is_empty() && t.is_none())
            .map(|(_, d)| serde_json::from_slice(d).unwrap())
            .collect()
    }

    fn close(&mut self, conn: ConnId) {
        self.core.handle_connection_closed(self.now, conn);
        self.pump();
    }

    fn tick(&mut self, now: u64) {
        self.now = now;
        self.core.handle_tick(now);
        self.pump();
    }
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

fn call(id: i64, tool: &str, token: Option<&str>) -> String {
    match token {
        Some(t) => format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","_meta":{{"progressToken":"{t}"}}}}}}"#
        ),
        None => format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}"}}}}"#
        ),
    }
}

fn result(id: i64) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[]}}}}"#)
}

fn progress(token: &str, n: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"{token}","progress":{n}}}}}"#
    )
}

// ------------------------------------------------------------------ common rules

/// SPEC C1.
#[test]
fn origin_foreign_is_403() {
    let mut h = H::new();
    for m in [HttpMethod::Post, HttpMethod::Get, HttpMethod::Delete] {
        let c = h.req(
            m,
            &[
                ("origin", "http://evil.example"),
                ("accept", "application/json, text/event-stream"),
            ],
            INIT,
        );
        assert_eq!(h.status(c), 403);
        let b = h.resp(c).json();
        assert_eq!(b["id"], Value::Null);
        assert!(
            b["error"]["message"]
                .as_str()
                .unwrap()
                .contains("evil.example")
        );
    }
    assert!(
        h.spawned.is_empty(),
        "a forbidden request must not start anything"
    );
}

/// SPEC C1.
#[test]
fn origin_loopback_is_allowed() {
    let mut h = H::new();
    let c = h.post(
        &[
            ("origin", "http://localhost:6274"),
            ("accept", "text/event-stream"),
        ],
        INIT,
    );
    assert!(h.sse.contains_key(&c));
}

/// SPEC C1.
#[test]
fn origin_absent_is_allowed() {
    let mut h = H::new();
    let c = h.post(&[("accept", "text/event-stream")], INIT);
    assert!(h.sse.contains_key(&c));
}

/// SPEC C2.
#[test]
fn host_foreign_is_403() {
    let mut h = H::new();
    let c = h.post(&[("host", "attacker.example:8080")], INIT);
    assert_eq!(h.status(c), 403);
    let c = h.post(&[("host", "127.0.0.1:8080")], INIT);
    assert!(h.sse.contains_key(&c));
}

/// Duplicated security headers are ambiguous: 400.
#[test]
fn duplicate_session_header_is_400() {
    let mut h = H::new();
    let (sid, _, _) = h.init();
    let c = h.post(
        &[("mcp-session-id", &sid), ("Mcp-Session-Id", "other")],
        &call(1, "t", None),
    );
    assert_eq!(h.status(c), 400);
}

/// SPEC C4.
#[test]
fn body_not_json_is_400_parse_error() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let before = h.upstream_in[&up].len();
    let c = h.post_s(&sid, "{not json");
    assert_eq!(h.status(c), 400);
    assert_eq!(h.resp(c).json()["error"]["code"], -32700);
    let c = h.post_s(&sid, r#"{"jsonrpc":"2.0","id":1}"#);
    assert_eq!(h.resp(c).json()["error"]["code"], -32600);
    assert_eq!(h.upstream_in[&up].len(), before, "nothing forwarded");
}

/// SPEC C5.
#[test]
fn other_methods_are_405() {
    let mut h = H::new();
    let c = h.req(HttpMethod::Other, &[], "");
    assert_eq!(h.status(c), 405);
    assert!(h.resp(c).header("allow").unwrap().contains("POST"));
}

/// SPEC C6.
#[test]
fn notification_is_202_and_forwarded() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let c = h.post_s(
        &sid,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(h.status(c), 202);
    assert!(h.resp(c).body.is_empty());
    assert_eq!(
        h.upstream_in[&up].last().unwrap()["method"],
        "notifications/initialized"
    );
}

/// SPEC C6: a client's response (to a server request) is forwarded, 202.
#[test]
fn response_is_202_and_forwarded() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let c = h.post_s(
        &sid,
        r#"{"jsonrpc":"2.0","id":"srv-1","result":{"action":"accept"}}"#,
    );
    assert_eq!(h.status(c), 202);
    assert_eq!(h.upstream_in[&up].last().unwrap()["id"], "srv-1");
}

/// SPEC C7 + L9 + L10 + M12.
#[test]
fn request_opens_sse_stream_with_priming() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let c = h.post_s(&sid, &call(1, "t", None));
    let s = h.sse[&c].clone();
    assert_eq!(s.stream, format!("mcp/{sid}/2"));
    assert_eq!(s.retry, Some(1000));
    assert!(s.headers.contains(&("x-accel-buffering", "no".to_owned())));
    let recs = h.records(c);
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].0, 1, "priming is the stream's first record");
    assert!(recs[0].2.is_empty(), "priming has empty data");
    assert_eq!(h.upstream_in[&up].last().unwrap()["id"], 1);
}

/// SPEC C9.
#[test]
fn upstream_garbage_line_is_dropped() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let c = h.post_s(&sid, &call(1, "t", None));
    h.upstream_line(up, "Debugger listening on ws://...");
    h.upstream_line(up, r#"{"jsonrpc":"2.0","id":1"#);
    assert_eq!(h.records(c).len(), 1);
    assert_eq!(h.core.stats().upstream_garbage_lines, 2);
    h.upstream_line(up, &result(1));
    assert_eq!(h.msgs(c).len(), 1);
}

// ------------------------------------------------------------------ legacy sessions

/// SPEC L1.
#[test]
fn initialize_mints_session_and_spawns_upstream() {
    let mut h = H::new();
    let c = h.post(&[("accept", "application/json, text/event-stream")], INIT);
    let s = h.sse[&c].clone();
    let sid = s
        .headers
        .iter()
        .find(|(k, _)| *k == "mcp-session-id")
        .unwrap()
        .1
        .clone();
    assert_eq!(h.spawned, vec![(UpstreamId(1), Some(sid.clone()))]);
    assert_eq!(h.upstream_in[&UpstreamId(1)][0]["method"], "initialize");
    h.upstream_line(
        UpstreamId(1),
        r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18"}}"#,
    );
    let m = h.msgs(c);
    assert_eq!(m.len(), 1);
    assert_eq!(m[0]["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(
        h.complete[&s.stream], 2,
        "initialize stream completes with its response"
    );
}

/// SPEC L2.
#[test]
fn session_id_is_visible_ascii_and_unique() {
    let mut h = H::new();
    let mut seen = HashSet::new();
    for _ in 0..50 {
        let (sid, _, _) = h.init();
        assert!(sid.len() >= 32);
        assert!(sid.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert!(seen.insert(sid));
    }
}

/// With authentication, a session belongs to the subject that initialized it: another
/// subject's POST, GET (resume) or DELETE gets 404 exactly as an unknown session, and the owner
/// keeps working.
#[test]
fn a_session_answers_only_its_own_subject() {
    let mut h = H::new();
    h.subject = Some("alice".into());
    let (sid, _, _) = h.init();
    assert!(sid.ends_with(&crate::core::subject_tag("alice")), "{sid}");
    let headers = h.s(&sid);
    let hs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for subject in [Some("mallory"), Some("")] {
        h.subject = subject.map(str::to_owned);
        let c = h.post(&hs, &call(1, "t", None));
        assert_eq!(h.status(c), 404, "POST as {subject:?}");
        let c = h.req(HttpMethod::Get, &hs, "");
        assert_eq!(h.status(c), 404, "GET as {subject:?}");
        let c = h.req(HttpMethod::Delete, &hs, "");
        assert_eq!(h.status(c), 404, "DELETE as {subject:?}");
    }
    // An unknown session of the same shape answers the same way.
    h.subject = Some("mallory".into());
    let fake = format!("{}{}", "0".repeat(32), crate::core::subject_tag("alice"));
    let fake_headers = h.s(&fake);
    let fh: Vec<(&str, &str)> = fake_headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let c = h.post(&fh, &call(1, "t", None));
    assert_eq!(h.status(c), 404);
    h.subject = Some("alice".into());
    let c = h.post(&hs, &call(2, "t", None));
    assert!(h.sse.contains_key(&c), "the owner's call is accepted");
}

/// SPEC L3.
#[test]
fn post_without_session_is_400() {
    let mut h = H::new();
    h.init();
    let c = h.post(&[("accept", "text/event-stream")], &call(1, "t", None));
    assert_eq!(h.status(c), 400);
}

/// SPEC L3.
#[test]
fn get_without_session_is_400() {
    let mut h = H::new();
    let c = h.req(HttpMethod::Get, &[("accept", "text/event-stream")], "");
    assert_eq!(h.status(c), 400);
}

/// SPEC L3.
#[test]
fn delete_without_session_is_400() {
    let mut h = H::new();
    let c = h.req(HttpMethod::Delete, &[], "");
    assert_eq!(h.status(c), 400);
}

/// SPEC L4.
#[test]
fn unknown_session_is_404() {
    let mut h = H::new();
    let c = h.post_s("nope", &call(1, "t", None));
    assert_eq!(h.status(c), 404);
    let c = h.get_s("nope", None);
    assert_eq!(h.status(c), 404);
}

/// SPEC L4 + L5.
#[test]
fn deleted_session_is_404() {
    let mut h = H::new();
    let (sid, _, _) = h.init();
    let c = h.req(HttpMethod::Delete, &[("mcp-session-id", &sid)], "");
    assert_eq!(h.status(c), 200);
    for m in [HttpMethod::Post, HttpMethod::Get, HttpMethod::Delete] {
        let c = h.req(
            m,
            &[
                ("mcp-session-id", &sid),
                ("accept", "application/json, text/event-stream"),
            ],
            &call(2, "t", None),
        );
        assert_eq!(h.status(c), 404, "{m:?} after DELETE");
    }
}

/// SPEC L5: DELETE kills the upstream and answers open requests with errors.
#[test]
fn delete_terminates_and_kills_upstream() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let c = h.post_s(&sid, &call(1, "slow", None));
    let d = h.req(HttpMethod::Delete, &[("mcp-session-id", &sid)], "");
    assert_eq!(h.status(d), 200);
    assert_eq!(h.killed, vec![up]);
    let m = h.msgs(c);
    assert_eq!(m.len(), 1);
    assert_eq!(m[0]["id"], 1);
    assert_eq!(m[0]["error"]["code"], jsonrpc::UPSTREAM_GONE);
    assert!(h.complete.contains_key(&h.sse[&c].stream));
    // A late line from the killed upstream goes nowhere.
    h.upstream_line(up, &result(1));
    assert_eq!(h.msgs(c).len(), 1);
}

/// SPEC L4: idle expiry terminates; then 404.
#[test]
fn expired_session_is_404() {
    let mut h = H::with(McpConfig {
        session_idle_ms: 5_000,
        ..McpConfig::default()
    });
    let (sid, up, init) = h.init();
    h.close(init);
    assert_eq!(h.core.poll_timeout(), Some(h.now + 5_000));
    h.tick(h.now + 4_999);
    assert!(h.killed.is_empty());
    h.tick(h.now + 1);
    assert_eq!(h.killed, vec![up]);
    let c = h.post_s(&sid, &call(1, "t", None));
    assert_eq!(h.status(c), 404);
}

/// A session with an attached connection is never idle.
#[test]
fn attached_session_does_not_expire() {
    let mut h = H::with(McpConfig {
        session_idle_ms: 5_000,
        ..McpConfig::default()
    });
    let (sid, _, _) = h.init();
    let _g = h.get_s(&sid, None);
    h.tick(h.now + 60_000);
    assert!(h.killed.is_empty());
}

/// SPEC L4 + issue: the child died → in-flight requests get errors, the GET stream gets an
/// error event, the session is gone.
#[test]
fn upstream_death_terminates_session() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let g = h.get_s(&sid, None);
    let c = h.post_s(&sid, &call(1, "t", Some("p")));
    h.upstream_line(up, &progress("p", 1));
    h.core.handle_upstream_exit(h.now, up, "exit status 1");
    h.pump();
    assert!(
        h.killed.is_empty(),
        "an exited upstream is not killed again"
    );
    let m = h.msgs(c);
    assert_eq!(m.len(), 2);
    assert_eq!(m[1]["error"]["code"], jsonrpc::UPSTREAM_GONE);
    assert!(
        m[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exit status 1")
    );
    let gr = h.records(g);
    assert_eq!(gr.last().unwrap().1, Some("error"));
    assert!(h.complete.contains_key(&h.sse[&g].stream));
    let c2 = h.post_s(&sid, &call(2, "t", None));
    assert_eq!(h.status(c2), 404);
}

/// SPEC L6: without a header and without a negotiated version, 2025-03-26 rules apply
/// (batches allowed); after negotiating 2025-11-25 they are not.
#[test]
fn missing_version_header_assumes_2025_03_26() {
    let mut h = H::new();
    let c = h.post(&[("accept", "text/event-stream")], INIT);
    let sid = h.sse[&c]
        .headers
        .iter()
        .find(|(k, _)| *k == "mcp-session-id")
        .unwrap()
        .1
        .clone();
    // Before the initialize response: nothing negotiated → 2025-03-26 → batch accepted.
    let b = h.post_s(
        &sid,
        r#"[{"jsonrpc":"2.0","method":"notifications/initialized"}]"#,
    );
    assert_eq!(h.status(b), 202);
    h.upstream_line(
        UpstreamId(1),
        r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25"}}"#,
    );
    let b = h.post_s(
        &sid,
        r#"[{"jsonrpc":"2.0","method":"notifications/initialized"}]"#,
    );
    assert_eq!(h.status(b), 400);
}

/// SPEC L6.
#[test]
fn unsupported_version_header_is_400() {
    let mut h = H::new();
    let (sid, _, _) = h.init();
    for v in ["2024-11-05", "1900-01-01", "latest"] {
        let c = h.post(
            &[("mcp-session-id", &sid), ("mcp-protocol-version", v)],
            &call(1, "t", None),
        );
        assert_eq!(h.status(c), 400, "{v}");
        assert_eq!(h.resp(c).json()["error"]["data"]["requested"], v);
    }
    let c = h.req(
        HttpMethod::Get,
        &[
            ("mcp-session-id", &sid),
            ("mcp-protocol-version", "2099-01-01"),
        ],
        "",
    );
    assert_eq!(h.status(c), 400);
}

/// SPEC L7.
#[test]
fn batch_rejected_after_2025_03_26() {
    let mut h = H::new();
    let (sid, _, _) = h.init();
    let body = format!("[{},{}]", call(1, "a", None), call(2, "b", None));
    for v in ["2025-06-18", "2025-11-25"] {
        let c = h.post(
            &[
                ("mcp-session-id", &sid),
                ("mcp-protocol-version", v),
                ("accept", "text/event-stream"),
            ],
            &body,
        );
        assert_eq!(h.status(c), 400, "{v}");
    }
}

/// SPEC L7 + L8: a 2025-03-26 batch of requests shares one stream, which completes when all
/// responses arrived; notifications in the batch are forwarded too.
#[test]
fn batch_of_requests_shares_one_stream() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let body = format!(
        r#"[{},{{"jsonrpc":"2.0","method":"notifications/x"}},{}]"#,
        call(1, "a", None),
        call(2, "b", None)
    );
    let c = h.post(
        &[
            ("mcp-session-id", &sid),
            ("mcp-protocol-version", "2025-03-26"),
            ("accept", "text/event-stream"),
        ],
        &body,
    );
    let ups: Vec<_> = h.upstream_in[&up]
        .iter()
        .skip(1)
        .map(|v| v.get("id").cloned().unwrap_or(Value::Null))
        .collect();
    assert_eq!(ups, vec![json!(1), Value::Null, json!(2)]);
    h.upstream_line(up, &result(2));
    assert!(!h.complete.contains_key(&h.sse[&c].stream));
    h.upstream_line(up, &format!("[{}]", result(1)));
    assert_eq!(
        h.msgs(c)
            .iter()
            .map(|m| m["id"].clone())
            .collect::<Vec<_>>(),
        vec![json!(2), json!(1)]
    );
    assert!(h.complete.contains_key(&h.sse[&c].stream));
}

/// SPEC L11: the hold timeout closes the connection, never the stream: the response appended
/// later is still there for the resuming client.
#[test]
fn hold_timeout_closes_connection_not_stream() {
    let mut h = H::with(McpConfig {
        post_hold_ms: Some(50),
        ..McpConfig::default()
    });
    let (sid, up, _) = h.init();
    let c = h.post_s(&sid, &call(1, "test_reconnection", None));
    let priming = h.event_id(c, 1);
    h.tick(h.now + 49);
    assert!(!h.sse[&c].closed_by_server);
    h.tick(h.now + 1);
    assert!(h.sse[&c].closed_by_server);
    h.close(c); // the send path reports the close
    h.upstream_line(up, &result(1));
    let r = h.get_s(&sid, Some(&priming));
    assert_eq!(
        h.msgs(r),
        vec![serde_json::from_str::<Value>(&result(1)).unwrap()]
    );
    assert_eq!(h.sse[&r].end_after, Some(2));
}

/// SPEC L12.
#[test]
fn response_completes_stream() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let c = h.post_s(&sid, &call(1, "t", None));
    h.upstream_line(up, &result(1));
    assert_eq!(h.complete[&h.sse[&c].stream], 2);
}

/// SPEC L13.
#[test]
fn legacy_disconnect_is_not_cancellation() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let c = h.post_s(&sid, &call(1, "t", Some("p")));
    let sent = h.upstream_in[&up].len();
    h.close(c);
    assert_eq!(
        h.upstream_in[&up].len(),
        sent,
        "nothing sent upstream on disconnect"
    );
    h.upstream_line(up, &progress("p", 1));
    h.upstream_line(up, &result(1));
    assert_eq!(
        h.stream_msgs(&format!("mcp/{sid}/2")).len(),
        2,
        "messages still logged"
    );
}

/// SPEC L14.
#[test]
fn get_opens_session_stream() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let g = h.get_s(&sid, None);
    assert_eq!(h.sse[&g].stream, format!("mcp/{sid}/0"));
    assert_eq!(h.sse[&g].retry, Some(1000));
    h.upstream_line(
        up,
        r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
    );
    assert_eq!(h.msgs(g).len(), 1);
}

/// SPEC L14: never two live connections on one stream; a second fresh GET takes over.
#[test]
fn second_fresh_get_takes_over() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let g = h.get_s(&sid, None);
    let note = r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;
    h.upstream_line(up, note);
    let g2 = h.get_s(&sid, None);
    assert!(h.sse[&g].closed_by_server);
    assert!(
        h.records(g2).is_empty(),
        "the old connection was handed seq 1"
    );
    h.upstream_line(up, note);
    assert_eq!(
        h.records(g2).iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![2]
    );
    h.close(g); // late close report of the old connection does not detach the new one
    h.upstream_line(up, note);
    assert_eq!(h.records(g2).len(), 2);
    let g3 = h.get_s(&sid, None);
    assert!(h.sse[&g2].closed_by_server);
    assert_eq!(h.sse[&g3].from, 4);
}

/// Messages logged while no GET connection is open reach the next fresh GET; messages
/// handed to a previous GET connection are not repeated on a fresh one.
#[test]
fn fresh_get_starts_after_what_previous_get_was_handed() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let note = r#"{"jsonrpc":"2.0","method":"notifications/resources/list_changed"}"#;
    h.upstream_line(up, note); // before any GET
    let g = h.get_s(&sid, None);
    assert_eq!(h.msgs(g).len(), 1);
    h.upstream_line(up, note);
    h.close(g);
    h.upstream_line(up, note);
    let g2 = h.get_s(&sid, None);
    assert_eq!(
        h.records(g2).iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![3]
    );
}

/// SPEC L15.
#[test]
fn orphan_response_never_goes_to_get_stream() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let g = h.get_s(&sid, None);
    h.upstream_line(up, &result(99));
    h.upstream_line(
        up,
        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#,
    );
    assert!(h.msgs(g).is_empty());
    assert_eq!(h.core.stats().orphan_messages, 2);
}

/// SPEC L17.
#[test]
fn progress_goes_to_its_request_stream() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let g = h.get_s(&sid, None);
    let a = h.post_s(&sid, &call(1, "a", Some("ta")));
    let b = h.post_s(&sid, &call(2, "b", Some("tb")));
    h.upstream_line(up, &progress("tb", 1));
    h.upstream_line(up, &progress("ta", 1));
    h.upstream_line(up, &progress("ta", 2));
    h.upstream_line(up, &result(1));
    h.upstream_line(up, &progress("ta", 3)); // after completion: stale token, dropped
    assert_eq!(h.msgs(a).len(), 3);
    assert_eq!(h.msgs(b).len(), 1);
    assert!(h.msgs(g).is_empty());
    assert_eq!(h.core.stats().orphan_messages, 1);
}

/// SPEC L17.
#[test]
fn unrelated_notification_goes_to_get_stream() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let g = h.get_s(&sid, None);
    let a = h.post_s(&sid, &call(1, "a", None));
    h.upstream_line(up, r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"test://x"}}"#);
    assert_eq!(h.msgs(g).len(), 1);
    assert!(h.msgs(a).is_empty());
}

/// SPEC L17: sampling/elicitation and log messages during the only call in flight go to it.
#[test]
fn server_request_during_single_call_goes_to_its_stream() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let g = h.get_s(&sid, None);
    let a = h.post_s(&sid, &call(1, "test_sampling", None));
    h.upstream_line(
        up,
        r#"{"jsonrpc":"2.0","id":0,"method":"sampling/createMessage","params":{}}"#,
    );
    h.upstream_line(up, r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}"#);
    assert_eq!(h.msgs(a).len(), 2);
    // Two calls in flight: ambiguous → the GET stream.
    let _b = h.post_s(&sid, &call(2, "b", None));
    h.upstream_line(
        up,
        r#"{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{}}"#,
    );
    assert_eq!(h.msgs(g).len(), 1);
}

/// Duplicate in-flight request ids or progress tokens would make routing ambiguous.
#[test]
fn duplicate_inflight_id_or_token_is_400() {
    let mut h = H::new();
    let (sid, _, _) = h.init();
    let _a = h.post_s(&sid, &call(1, "a", Some("t")));
    let b = h.post_s(&sid, &call(1, "b", None));
    assert_eq!(h.status(b), 400);
    let c = h.post_s(&sid, &call(2, "c", Some("t")));
    assert_eq!(h.status(c), 400);
}

/// Inflight limit per session.
#[test]
fn inflight_limit_is_429() {
    let mut h = H::with(McpConfig {
        requests_inflight_max: 2,
        ..McpConfig::default()
    });
    let (sid, _, _) = h.init();
    h.post_s(&sid, &call(1, "a", None));
    h.post_s(&sid, &call(2, "a", None));
    let c = h.post_s(&sid, &call(3, "a", None));
    assert_eq!(h.status(c), 429);
}

/// Sessions limit.
#[test]
fn sessions_limit_is_503() {
    let mut h = H::with(McpConfig {
        sessions_max: 1,
        ..McpConfig::default()
    });
    h.init();
    let c = h.post(&[("accept", "text/event-stream")], INIT);
    assert_eq!(h.status(c), 503);
}

/// Cores sharing one `SessionCount` share `sessions_max`: a core refuses an `initialize` when
/// the others hold the places, and a place another core gives back is taken again.
#[test]
fn cores_sharing_a_count_share_the_sessions_limit() {
    let cfg = McpConfig {
        sessions_max: 3,
        ..McpConfig::default()
    };
    let (mut a, mut b) = (H::with(cfg.clone()), H::with(cfg.clone()));
    a.init();
    let (on_b, _, _) = b.init();
    b.init();
    assert_eq!(cfg.sessions.get(), 3);
    let c = a.post(&[("accept", "text/event-stream")], INIT);
    assert_eq!(a.status(c), 503, "the other core holds the places");
    let body: serde_json::Value = serde_json::from_slice(&a.resp(c).body).unwrap();
    let msg = body["error"]["message"].to_string();
    assert!(msg.contains("3 sessions"), "{msg}");
    let d = b.req(HttpMethod::Delete, &[("mcp-session-id", &on_b)], "");
    assert_eq!(b.status(d), 200);
    assert_eq!(cfg.sessions.get(), 2);
    a.init();
    assert_eq!(cfg.sessions.get(), 3);
    assert_eq!(a.core.sessions_live() + b.core.sessions_live(), 3);
}

/// Sessions per subject: an `initialize` beyond `sessions_per_subject_max` live sessions of
/// its subject gets 429; other subjects still get theirs, and ending one frees its place.
#[test]
fn sessions_per_subject_limit_is_429() {
    let mut h = H::with(McpConfig {
        sessions_per_subject_max: 2,
        ..McpConfig::default()
    });
    h.subject = Some("alice".into());
    let (first, _, _) = h.init();
    h.init();
    let c = h.post(&[("accept", "text/event-stream")], INIT);
    assert_eq!(h.status(c), 429);
    h.subject = Some("bob".into());
    h.init();
    h.subject = Some("alice".into());
    let c = h.req(HttpMethod::Delete, &[("mcp-session-id", &first)], "");
    assert_eq!(h.status(c), 200);
    h.init();
}

/// A replay-only (recovered) session with nothing attached gives its slot to a new session;
/// a live one never does.
#[test]
fn replay_only_sessions_give_way_to_new_ones() {
    let cfg = McpConfig {
        sessions_max: 2,
        ..McpConfig::default()
    };
    let mut h = H::with(cfg.clone());
    let (old, _, _) = h.init();
    let names = h.log.names.clone();
    // "Restart" (a new process: a new count): the session comes back replay-only, beside a
    // new live one.
    let cfg = McpConfig {
        sessions: Default::default(),
        ..cfg
    };
    h.core = McpCore::new(cfg, counter_source());
    h.sse.clear();
    for n in &names {
        h.core.recover_stream(n, h.now);
    }
    let (live, _, _) = h.init();
    assert_eq!(h.core.sessions_live(), 2);
    // Full: the replay-only one goes, the live one stays.
    let (newer, _, _) = h.init();
    assert_eq!(h.core.sessions_live(), 2);
    let p = h.post_s(&old, &call(5, "a", None));
    assert_eq!(h.status(p), 404, "the evicted replay-only session");
    // Full of live sessions: 503, nothing evicted.
    let c = h.post(&[("accept", "text/event-stream")], INIT);
    assert_eq!(h.status(c), 503);
    let ping = r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#;
    for sid in [&live, &newer] {
        let p = h.post_s(sid, ping);
        assert!(
            h.sse.contains_key(&p),
            "live sessions stay (an SSE response, not 404)"
        );
    }
}

// ------------------------------------------------------------------ resumption

/// SPEC L19: resume replays that stream only, from N+1, gap-free, duplicate-free.
#[test]
fn resume_replays_only_its_stream() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let g = h.get_s(&sid, None);
    let a = h.post_s(&sid, &call(1, "a", Some("ta")));
    let b = h.post_s(&sid, &call(2, "b", Some("tb")));
    for i in 1..=5 {
        h.upstream_line(up, &progress("ta", i));
        h.upstream_line(up, &progress("tb", i));
        h.upstream_line(
            up,
            r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
        );
    }
    // The client saw a's records through seq 3 (priming + 2 progress), then lost the connection.
    let last = h.event_id(a, 3);
    h.close(a);
    let r = h.get_s(&sid, Some(&last));
    let got: Vec<u64> = h
        .msgs(r)
        .iter()
        .map(|m| m["params"]["progress"].as_u64().unwrap())
        .collect();
    assert_eq!(got, vec![3, 4, 5]);
    assert!(
        h.msgs(r)
            .iter()
            .all(|m| m["params"]["progressToken"] == "ta")
    );
    assert_eq!(h.sse[&r].from, 4);
    assert_eq!(
        h.sse[&r].reprime.as_deref(),
        Some(last.as_str()),
        "resume restates the client's id"
    );
    assert_eq!(
        h.sse[&a].reprime, None,
        "a new stream's first id is its priming record"
    );
    // Live continuation lands on the resumed connection only.
    h.upstream_line(up, &result(1));
    assert_eq!(h.msgs(r).last().unwrap()["id"], 1);
    assert_eq!(h.msgs(b).len(), 5);
    assert_eq!(h.msgs(g).len(), 5);
}

/// Resume while the old connection is still attached: the old one is closed (no two live
/// connections on one stream).
#[test]
fn resume_takes_over_a_stale_connection() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let a = h.post_s(&sid, &call(1, "a", Some("ta")));
    h.upstream_line(up, &progress("ta", 1));
    let last = h.event_id(a, 2);
    let r = h.get_s(&sid, Some(&last));
    assert!(h.sse[&a].closed_by_server);
    assert!(h.msgs(r).is_empty());
    h.close(a); // late close report of the old connection must not detach the new one
    h.upstream_line(up, &result(1));
    assert_eq!(h.msgs(r).len(), 1);
    assert_eq!(h.sse[&r].end_after, None);
    assert_eq!(h.complete[&h.sse[&r].stream], 3);
}

/// SPEC L19: an id naming another session's stream is refused, never replayed.
#[test]
fn resume_of_other_session_stream_is_400() {
    let mut h = H::new();
    let (s1, up1, _) = h.init();
    let (s2, _, _) = h.init();
    let a = h.post_s(&s1, &call(1, "a", Some("t")));
    h.upstream_line(up1, &progress("t", 1));
    let foreign = h.event_id(a, 1);
    let r = h.get_s(&s2, Some(&foreign));
    assert_eq!(h.status(r), 400);
    assert_eq!(h.resp(r).json()["error"]["code"], jsonrpc::RESUME_INVALID);
}

/// SPEC L19.
#[test]
fn resume_bad_event_id_is_400() {
    let mut h = H::new();
    let (sid, _, _) = h.init();
    for bad in [
        "",
        "abc",
        "0123456789abcdef-1",
        "0123456789ABCDEF-1-1",
        "0123456789abcdef-1-01",
        "stream_1_2",
    ] {
        let r = h.get_s(&sid, Some(bad));
        assert_eq!(h.status(r), 400, "{bad:?}");
        assert_eq!(h.resp(r).json()["error"]["data"]["requested"], bad);
    }
    // A well-formed id of a stream that does not exist.
    let r = h.get_s(&sid, Some("0123456789abcdef-77-1"));
    assert_eq!(h.status(r), 400);
}

/// SPEC L20: history gone → 410 naming requested, floor, tail; never 404, never empty 200.
#[test]
fn resume_truncated_is_410_with_positions() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let a = h.post_s(&sid, &call(1, "a", Some("t")));
    for i in 1..=9 {
        h.upstream_line(up, &progress("t", i));
    }
    let early = h.event_id(a, 2);
    let id = h.log.id(&h.sse[&a].stream).unwrap().0 as usize;
    h.log.floor[id] = 6; // retention dropped seqs 1..=5
    h.close(a);
    let r = h.get_s(&sid, Some(&early));
    assert_eq!(h.status(r), 410);
    let e = h.resp(r).json()["error"].clone();
    assert_eq!(e["code"], jsonrpc::RESUME_TRUNCATED);
    assert_eq!(e["data"]["requested_seq"], 2);
    assert_eq!(e["data"]["floor"], 6);
    assert_eq!(e["data"]["tail"], 10);
    assert_eq!(e["data"]["requested"], early);
    // Just inside the window still works: N = 5 → replay from 6.
    let ok = h.event_id(a, 5);
    let r = h.get_s(&sid, Some(&ok));
    assert_eq!(h.sse[&r].from, 6);
}

/// SPEC L20.
#[test]
fn resume_wrong_epoch_is_400() {
    let mut h = H::new();
    let (sid, _, init) = h.init();
    let mut other = h.event_id(init, 1);
    other.replace_range(0..16, "fedcba9876543210");
    let r = h.get_s(&sid, Some(&other));
    assert_eq!(h.status(r), 400);
    assert!(
        h.resp(r).json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("epoch")
    );
}

/// SPEC L20.
#[test]
fn resume_beyond_tail_is_400() {
    let mut h = H::new();
    let (sid, _, init) = h.init();
    let beyond = h.event_id(init, 9);
    let r = h.get_s(&sid, Some(&beyond));
    assert_eq!(h.status(r), 400);
    assert_eq!(h.resp(r).json()["error"]["data"]["tail"], 2);
}

/// After a restart: sessions are recovered from log stream names; their streams resume from
/// the log and end at their tail; new POSTs get 404 (their upstream is gone).
#[test]
fn recovered_session_resumes_after_restart() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let a = h.post_s(&sid, &call(1, "a", Some("t")));
    for i in 1..=4 {
        h.upstream_line(up, &progress("t", i));
    }
    h.upstream_line(up, &result(1));
    let mid = h.event_id(a, 3);
    // "Restart": a new core over the same log.
    let names = h.log.names.clone();
    h.core = McpCore::new(McpConfig::default(), counter_source());
    h.sse.clear();
    for n in &names {
        h.core.recover_stream(n, h.now);
    }
    let r = h.get_s(&sid, Some(&mid));
    let got = h.msgs(r);
    assert_eq!(got.len(), 3, "progress 3, 4 and the result");
    assert_eq!(got[0]["params"]["progress"], 3);
    assert_eq!(got[2]["id"], 1);
    assert_eq!(h.sse[&r].end_after, Some(6));
    let p = h.post_s(&sid, &call(2, "a", None));
    assert_eq!(h.status(p), 404);
}

/// A replay-only session (recovered; in cluster mode, another node's) ends each resumed
/// response at the log's tail as it is then, not as it was at its first resume: the session's
/// node may still be adding records (a stale end would answer 410 "ended" below the tail).
#[test]
fn replay_only_session_follows_the_log_as_it_grows() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let a = h.post_s(&sid, &call(1, "a", Some("t")));
    h.upstream_line(up, &progress("t", 1));
    h.upstream_line(up, &progress("t", 2));
    let name = h.sse[&a].stream.clone();
    let (p1, p2) = (h.event_id(a, 2), h.event_id(a, 3));
    // "Another node": a core that knows the session only from the log.
    let names = h.log.names.clone();
    h.core = McpCore::new(McpConfig::default(), counter_source());
    h.sse.clear();
    for n in &names {
        h.core.recover_stream(n, h.now);
    }
    let r = h.get_s(&sid, Some(&p1));
    assert_eq!(h.sse[&r].end_after, Some(3), "served, to the tail");
    // The session's own node logs two more records.
    let id = h.log.id(&name).unwrap().0 as usize;
    h.log.recs[id].push((None, progress("t", 3).into_bytes()));
    h.log.recs[id].push((None, result(1).into_bytes()));
    let r2 = h.get_s(&sid, Some(&p2));
    // Served (not 410): the log goes on past the first resume's tail.
    assert_eq!(h.sse.get(&r2).and_then(|s| s.end_after), Some(5));
    let got = h.msgs(r2);
    assert_eq!(
        (got[0]["params"]["progress"].clone(), got[1]["id"].clone()),
        (3.into(), 1.into())
    );
    // At the log's tail now: the explicit end.
    let last = h.event_id(r2, 5);
    let r3 = h.get_s(&sid, Some(&last));
    assert_eq!(h.status(r3), 410);
}

/// `holds_stream`: what the core may still append to (the driver's bound on its broken-stream
/// map keeps exactly those).
#[test]
fn the_core_holds_live_streams_only() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let a = h.post_s(&sid, &call(1, "a", None));
    let name = h.sse[&a].stream.clone();
    assert!(h.core.holds_stream(&name), "in flight");
    h.upstream_line(up, &result(1));
    h.close(a);
    assert!(!h.core.holds_stream(&name), "complete and closed: dropped");
    assert!(!h.core.holds_stream(&format!("mcp/{sid}/99")));
    assert!(!h.core.holds_stream("mcp/unknown/1"));
    assert!(!h.core.holds_stream("orders"));
}

/// A complete stream resumed at its last record: explicit 410 (an empty 200 would make the
/// client reconnect in a loop), never a silent success.
#[test]
fn resume_after_end_of_complete_stream_is_410() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let a = h.post_s(&sid, &call(1, "a", None));
    h.upstream_line(up, &result(1));
    let last = h.event_id(a, 2);
    h.close(a);
    let r = h.get_s(&sid, Some(&last));
    assert_eq!(h.status(r), 410);
    let e = h.resp(r).json()["error"].clone();
    assert_eq!(e["data"]["ended"], true);
    assert_eq!(e["data"]["tail"], 2);
    // Resuming before the end still replays the rest.
    let mid = h.event_id(a, 1);
    let r = h.get_s(&sid, Some(&mid));
    assert_eq!(h.msgs(r).len(), 1);
}

/// Shutdown answers every unanswered request in the log, so resumes after a restart end.
#[test]
fn shutdown_fails_inflight_requests() {
    let mut h = H::new();
    let (sid, up, _) = h.init();
    let a = h.post_s(&sid, &call(1, "a", None));
    h.core.shutdown();
    h.pump();
    assert_eq!(h.killed, vec![up]);
    assert_eq!(h.msgs(a)[0]["error"]["code"], jsonrpc::UPSTREAM_GONE);
    assert!(h.complete.contains_key(&h.sse[&a].stream));
}

// ------------------------------------------------------------------ modern era

fn modern_headers<'a>(method: &'a str, name: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut v = vec![
        ("mcp-protocol-version", "2026-07-28"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-method", method),
    ];
    if let Some(n) = name {
        v.push(("mcp-name", n));
    }
    v
}

fn modern_call(id: i64, tool: &str, token: Option<&str>) -> String {
    let tok = token
        .map(|t| format!(r#","progressToken":"{t}""#))
        .unwrap_or_default();
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28"{tok}}}}}}}"#
    )
}

/// SPEC M1.
#[test]
fn modern_get_and_delete_are_405() {
    let mut h = H::new();
    for m in [HttpMethod::Get, HttpMethod::Delete] {
        let c = h.req(m, &[("mcp-protocol-version", "2026-07-28")], "");
        assert_eq!(h.status(c), 405);
        assert_eq!(h.resp(c).header("allow"), Some("POST"));
    }
}

/// SPEC M2.
#[test]
fn modern_ignores_session_and_last_event_id() {
    let mut h = H::new();
    let mut hs = modern_headers("tools/call", Some("t"));
    hs.push(("mcp-session-id", "whatever"));
    hs.push(("last-event-id", "garbage"));
    let c = h.post(&hs, &modern_call(1, "t", None));
    let s = &h.sse[&c];
    assert!(
        s.headers.iter().all(|(k, _)| *k != "mcp-session-id"),
        "no session id minted or echoed"
    );
    assert!(s.stream.starts_with("mcp/m"));
}

/// SPEC M3.
#[test]
fn modern_rejects_batch_and_response() {
    let mut h = H::new();
    let c = h.post(
        &modern_headers("tools/call", Some("t")),
        &format!("[{}]", modern_call(1, "t", None)),
    );
    assert_eq!(h.status(c), 400);
    let c = h.post(
        &modern_headers("x", None),
        r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
    );
    assert_eq!(h.status(c), 400);
}

/// SPEC M4.
#[test]
fn modern_version_header_vs_meta_mismatch_is_32020() {
    let mut h = H::new();
    let body = modern_call(5, "t", None).replace("2026-07-28", "2025-11-25");
    let c = h.post(&modern_headers("tools/call", Some("t")), &body);
    assert_eq!(h.status(c), 400);
    let b = h.resp(c).json();
    assert_eq!(b["error"]["code"], -32020);
    assert_eq!(b["id"], 5, "the error carries the request id");
}

/// SPEC M5.
#[test]
fn modern_mcp_method_mismatch_is_32020() {
    let mut h = H::new();
    let c = h.post(
        &modern_headers("tools/list", Some("t")),
        &modern_call(1, "t", None),
    );
    assert_eq!(h.resp(c).json()["error"]["code"], -32020);
    assert!(h.spawned.is_empty());
}

/// SPEC M5.
#[test]
fn modern_mcp_name_missing_is_32020() {
    let mut h = H::new();
    let c = h.post(
        &modern_headers("tools/call", None),
        &modern_call(1, "t", None),
    );
    assert_eq!(h.status(c), 400);
    assert_eq!(h.resp(c).json()["error"]["code"], -32020);
}

/// SPEC M5.
#[test]
fn modern_mcp_name_base64_is_decoded() {
    let mut h = H::new();
    // "t" base64 = "dA=="
    let c = h.post(
        &modern_headers("tools/call", Some("=?base64?dA==?=")),
        &modern_call(1, "t", None),
    );
    assert!(h.sse.contains_key(&c));
}

/// SPEC M5: header values are case-sensitive.
#[test]
fn modern_mcp_method_is_case_sensitive() {
    let mut h = H::new();
    let c = h.post(
        &modern_headers("TOOLS/CALL", Some("t")),
        &modern_call(1, "t", None),
    );
    assert_eq!(h.resp(c).json()["error"]["code"], -32020);
}

/// SPEC M4: a modern body without the version header is refused, not treated as legacy.
#[test]
fn modern_body_without_version_header_is_32020() {
    let mut h = H::new();
    let c = h.post(
        &[
            ("accept", "text/event-stream"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "t"),
        ],
        &modern_call(4, "t", None),
    );
    assert_eq!(h.status(c), 400);
    let b = h.resp(c).json();
    assert_eq!(b["error"]["code"], -32020);
    assert_eq!(b["id"], 4);
    assert!(h.spawned.is_empty());
}

/// SPEC M7.
#[test]
fn modern_notification_is_202() {
    let mut h = H::new();
    let c = h.post(
        &modern_headers("notifications/x", None),
        r#"{"jsonrpc":"2.0","method":"notifications/x"}"#,
    );
    assert_eq!(h.status(c), 202);
}

/// SPEC M8: ids and tokens rewritten upward, restored downward; two clients using the same
/// id never see each other's messages.
#[test]
fn modern_ids_are_rewritten_and_restored() {
    let mut h = H::new();
    let a = h.post(
        &modern_headers("tools/call", Some("t")),
        &modern_call(1, "t", Some("p")),
    );
    let b = h.post(
        &modern_headers("tools/call", Some("t")),
        &modern_call(1, "t", Some("p")),
    );
    let up = h.spawned[0].0;
    assert_eq!(h.spawned.len(), 1, "one shared modern upstream");
    let sent = h.upstream_in[&up].clone();
    let (ia, ib) = (
        sent[0]["id"].as_str().unwrap().to_owned(),
        sent[1]["id"].as_str().unwrap().to_owned(),
    );
    assert_ne!(ia, ib);
    let tb = sent[1]["params"]["_meta"]["progressToken"]
        .as_str()
        .unwrap()
        .to_owned();
    h.upstream_line(up, &format!(r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"{tb}","progress":1}}}}"#));
    h.upstream_line(
        up,
        &format!(r#"{{"jsonrpc":"2.0","id":"{ib}","result":{{}}}}"#),
    );
    let mb = h.msgs(b);
    assert_eq!(mb.len(), 2);
    assert_eq!(mb[0]["params"]["progressToken"], "p");
    assert_eq!(mb[1]["id"], 1);
    assert!(h.msgs(a).is_empty());
    h.upstream_line(
        up,
        &format!(r#"{{"jsonrpc":"2.0","id":"{ia}","result":{{}}}}"#),
    );
    assert_eq!(h.msgs(a)[0]["id"], 1);
}

/// SPEC M8.
#[test]
fn modern_server_request_is_not_streamed() {
    let mut h = H::new();
    let a = h.post(
        &modern_headers("tools/call", Some("t")),
        &modern_call(1, "t", None),
    );
    let up = h.spawned[0].0;
    h.upstream_line(
        up,
        r#"{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{}}"#,
    );
    assert!(h.msgs(a).is_empty());
    assert_eq!(h.core.stats().orphan_messages, 1);
}

/// SPEC M9.
#[test]
fn modern_close_sends_cancelled_upstream() {
    let mut h = H::new();
    let a = h.post(
        &modern_headers("tools/call", Some("t")),
        &modern_call(1, "t", Some("p")),
    );
    let up = h.spawned[0].0;
    let up_id = h.upstream_in[&up][0]["id"].clone();
    h.close(a);
    let last = h.upstream_in[&up].last().unwrap().clone();
    assert_eq!(last["method"], "notifications/cancelled");
    assert_eq!(last["params"]["requestId"], up_id);
    // Late messages for it are dropped.
    h.upstream_line(
        up,
        &format!(r#"{{"jsonrpc":"2.0","id":{up_id},"result":{{}}}}"#),
    );
    assert_eq!(h.core.stats().orphan_messages, 1);
    assert_eq!(h.core.stats().modern_cancels, 1);
}

/// SPEC M10.
#[test]
fn listen_stream_receives_subscription_notifications() {
    let mut h = H::new();
    let body = r#"{"jsonrpc":"2.0","id":"L","method":"subscriptions/listen","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"notifications":{"toolsListChanged":true}}}"#;
    let l = h.post(&modern_headers("subscriptions/listen", None), body);
    let up = h.spawned[0].0;
    let up_id = h.upstream_in[&up][0]["id"].as_str().unwrap().to_owned();
    let ack = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{{"_meta":{{"io.modelcontextprotocol/subscriptionId":"{up_id}"}}}}}}"#
    );
    h.upstream_line(up, &ack);
    h.upstream_line(
        up,
        &ack.replace("subscriptions/acknowledged", "tools/list_changed"),
    );
    let m = h.msgs(l);
    assert_eq!(m.len(), 2);
    assert_eq!(
        m[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L"
    );
    assert!(
        !h.complete.contains_key(&h.sse[&l].stream),
        "notifications do not end a listen stream"
    );
}

/// SPEC M11.
#[test]
fn modern_stream_has_no_priming() {
    let mut h = H::new();
    let a = h.post(
        &modern_headers("tools/call", Some("t")),
        &modern_call(1, "t", None),
    );
    assert_eq!(h.sse[&a].retry, None);
    assert!(h.records(a).is_empty());
}

/// Modern upstream death: in-flight requests get errors; the next request respawns.
#[test]
fn modern_upstream_death_fails_inflight_and_respawns() {
    let mut h = H::new();
    let a = h.post(
        &modern_headers("tools/call", Some("t")),
        &modern_call(1, "t", None),
    );
    let up = h.spawned[0].0;
    h.core.handle_upstream_exit(h.now, up, "killed");
    h.pump();
    assert_eq!(h.msgs(a)[0]["error"]["code"], jsonrpc::UPSTREAM_GONE);
    assert_eq!(h.msgs(a)[0]["id"], 1);
    h.post(
        &modern_headers("tools/call", Some("t")),
        &modern_call(2, "t", None),
    );
    assert_eq!(h.spawned.len(), 2);
}

#[test]
fn stream_names_parse() {
    assert_eq!(parse_stream_name("mcp/abc/0"), Some(("abc", 0)));
    assert_eq!(parse_stream_name("mcp/abc/12"), Some(("abc", 12)));
    for bad in [
        "mcp/abc/012",
        "mcp//1",
        "mcp/a/b/1",
        "x/abc/1",
        "mcp/abc/",
        "mcp/abc/-1",
    ] {
        assert_eq!(parse_stream_name(bad), None, "{bad}");
    }
}

// ------------------------------------------------------------------ property: exactly one stream

#[derive(Debug, Clone)]
enum Op {
    Call { token: bool },
    Progress(usize),
    Respond(usize),
    ServerNote,
    ServerRequest,
    Log,
    Close(usize),
    Resume(usize),
    OpenGet,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        any::<bool>().prop_map(|token| Op::Call { token }),
        (0usize..8).prop_map(Op::Progress),
        (0usize..8).prop_map(Op::Respond),
        Just(Op::ServerNote),
        Just(Op::ServerRequest),
        Just(Op::Log),
        (0usize..8).prop_map(Op::Close),
        (0usize..8).prop_map(Op::Resume),
        Just(Op::OpenGet),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// SPEC L16: under random interleavings of calls, progress, responses, server messages,
    /// disconnects and resumes, every upstream message is appended to at most one stream
    /// (exactly one unless it is an orphan), responses and progress land on their request's
    /// stream, no response lands on the GET stream, and every resume delivers exactly the
    /// stream's records after the resumed id.
    #[test]
    fn every_message_lands_on_exactly_one_stream(ops in proptest::collection::vec(op(), 1..60)) {
        let mut h = H::new();
        let (sid, up, _) = h.init();
        let mut calls: Vec<(i64, Option<String>, ConnId, bool)> = Vec::new(); // id, token, conn, answered
        let mut marker = 0u64;
        let mut sent_markers = 0u64;
        let mut orphans_expected = 0u64;
        for o in ops {
            match o {
                Op::Call { token } => {
                    let id = calls.len() as i64 + 1;
                    let t = token.then(|| format!("t{id}"));
                    let c = h.post_s(&sid, &call(id, "x", t.as_deref()));
                    calls.push((id, t, c, false));
                }
                Op::Progress(i) => {
                    if let Some((_, Some(t), _, answered)) = calls.get(i).cloned() {
                        marker += 1;
                        sent_markers += 1;
                        if answered { orphans_expected += 1; }
                        h.upstream_line(up, &format!(r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"{t}","progress":{marker}}}}}"#));
                    }
                }
                Op::Respond(i) => {
                    if let Some(c) = calls.get_mut(i) {
                        if c.3 { orphans_expected += 1; }
                        c.3 = true;
                        marker += 1;
                        sent_markers += 1;
                        let id = c.0;
                        h.upstream_line(up, &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"m":{marker}}}}}"#));
                    }
                }
                Op::ServerNote | Op::ServerRequest | Op::Log => {
                    marker += 1;
                    sent_markers += 1;
                    let line = match o {
                        Op::ServerNote => format!(r#"{{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{{"m":{marker}}}}}"#),
                        Op::ServerRequest => format!(r#"{{"jsonrpc":"2.0","id":"s{marker}","method":"roots/list","params":{{"m":{marker}}}}}"#),
                        _ => format!(r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"m":{marker}}}}}"#),
                    };
                    h.upstream_line(up, &line);
                }
                Op::Close(i) => {
                    if let Some(&(_, _, c, _)) = calls.get(i) { h.close(c); }
                }
                Op::Resume(i) => {
                    if let Some(&(_, _, c, _)) = calls.get(i) {
                        let Some(s) = h.sse.get(&c).cloned() else { continue };
                        let id = h.log.id(&s.stream).unwrap().0 as usize;
                        let tail = h.log.recs[id].len() as u64;
                        let n = 1 + (marker % tail.max(1)); // some position in 1..=tail
                        let last = EventId { epoch: EPOCH, stream: StreamId(id as u32), seq: n.min(tail) }.to_string();
                        let r = h.get_s(&sid, Some(&last));
                        if h.complete.get(&s.stream).is_some_and(|&e| n.min(tail) >= e) {
                            // Resuming a complete stream at its end: explicit 410, nothing replayed.
                            prop_assert_eq!(h.status(r), 410);
                            continue;
                        }
                        let want: Vec<Vec<u8>> = h.log.recs[id][n.min(tail) as usize..].iter().map(|r| r.1.clone()).collect();
                        let got: Vec<Vec<u8>> = h.records(r).into_iter().map(|r| r.2).collect();
                        prop_assert_eq!(got, want);
                        // The resumed connection replaces the call's connection.
                        if let Some(entry) = calls.get_mut(i) { entry.2 = r; }
                    }
                }
                Op::OpenGet => { let _ = h.get_s(&sid, None); }
            }
        }
        // Count every marker across all streams: each at most once.
        let mut seen = HashSet::new();
        for (name, recs) in h.log.names.iter().zip(&h.log.recs) {
            for (t, d) in recs {
                if d.is_empty() || t.is_some() { continue; }
                let v: Value = serde_json::from_slice(d).unwrap();
                if name.ends_with("/0") {
                    prop_assert!(v.get("result").is_none() && v.get("error").is_none(), "response on GET stream");
                }
                let m = v["params"]["m"].as_u64().or(v["params"]["progress"].as_u64()).or(v["result"]["m"].as_u64());
                if let Some(m) = m {
                    prop_assert!(seen.insert(m), "marker {} on two streams", m);
                }
                // Responses and progress are on their request's stream.
                if let Some(id) = v["id"].as_i64().filter(|&i| i > 0) {
                    prop_assert!(name.ends_with(&format!("/{}", id + 1)), "response {} on {}", id, name);
                }
                if let Some(t) = v["params"]["progressToken"].as_str() {
                    let id: i64 = t[1..].parse().unwrap();
                    prop_assert!(name.ends_with(&format!("/{}", id + 1)), "progress {} on {}", t, name);
                }
            }
        }
        prop_assert_eq!(seen.len() as u64 + orphans_expected, sent_markers);
        prop_assert_eq!(h.core.stats().orphan_messages, orphans_expected);
    }
}

// ------------------------------------------------------------------ credentials, redaction

fn forwarding() -> H {
    H::with(McpConfig {
        forward_authorization: true,
        ..McpConfig::default()
    })
}

/// `(what, value)` of upstream `up`'s trace entries from index `from` on.
fn trace_of(h: &H, up: UpstreamId, from: usize) -> Vec<(String, Option<String>)> {
    h.auth_trace[from..]
        .iter()
        .filter(|(u, _, _)| *u == up)
        .map(|(_, w, a)| (w.clone(), a.clone()))
        .collect()
}

fn set(a: Option<&str>) -> (String, Option<String>) {
    ("set".to_owned(), a.map(str::to_owned))
}

fn sent(method: &str) -> (String, Option<String>) {
    (format!("send:{method}"), None)
}

/// `--mcp-forward-authorization`, legacy: a session's upstream is told the Authorization of
/// the session's latest request (before that request's messages), including a refreshed token,
/// a request without one (none then) and the DELETE; another subject's request with the
/// session's ID is refused (404) and changes nothing; the lines themselves carry none.
#[test]
fn forwarded_authorization_is_the_sessions_latest() {
    let mut h = forwarding();
    h.subject = Some("alice".into());
    let accept = ("accept", "application/json, text/event-stream");
    let c = h.post(&[accept, ("authorization", "Bearer A1")], INIT);
    let sid = h.sse[&c]
        .headers
        .iter()
        .find(|(k, _)| *k == "mcp-session-id");
    let sid = sid.unwrap().1.clone();
    let up = h.spawned[0].0;
    assert_eq!(
        trace_of(&h, up, 0),
        vec![set(Some("Bearer A1")), sent("initialize")]
    );
    let mark = h.auth_trace.len();
    let with = |a: &'static str| vec![("mcp-session-id", sid.clone()), ("authorization", a.into())];
    let pairs = |v: &[(&'static str, String)]| -> Vec<(&'static str, String)> {
        let mut v = v.to_vec();
        v.push(("accept", "application/json, text/event-stream".into()));
        v
    };
    let refreshed = pairs(&with("Bearer A2"));
    let hs: Vec<(&str, &str)> = refreshed.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = h.post(&hs, &call(1, "t", None));
    assert!(h.sse.contains_key(&a));
    // Mallory holds the session ID: refused like an unknown session, nothing forwarded.
    h.subject = Some("mallory".into());
    let stolen = pairs(&with("Bearer M"));
    let hs: Vec<(&str, &str)> = stolen.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for method in [HttpMethod::Post, HttpMethod::Get, HttpMethod::Delete] {
        let c = h.req(method, &hs, &call(2, "t", None));
        assert_eq!(h.status(c), 404);
    }
    h.subject = Some("alice".into());
    let g = h.req(
        HttpMethod::Get,
        &[("mcp-session-id", &sid), ("authorization", "Bearer A3")],
        "",
    );
    assert!(h.sse.contains_key(&g), "alice's GET stream");
    let c = h.post_s(&sid, &call(3, "t", None)); // no Authorization (say, a cookie token)
    assert!(h.sse.contains_key(&c));
    let d = h.req(
        HttpMethod::Delete,
        &[("mcp-session-id", &sid), ("authorization", "Bearer A4")],
        "",
    );
    assert_eq!(h.status(d), 200);
    assert_eq!(
        trace_of(&h, up, mark),
        vec![
            set(Some("Bearer A2")),
            sent("tools/call"),
            set(Some("Bearer A3")),
            set(None),
            sent("tools/call"),
            set(Some("Bearer A4")),
        ]
    );
    assert!(
        !h.auth_trace
            .iter()
            .any(|(_, _, a)| a.as_deref() == Some("Bearer M"))
    );
    assert_eq!(
        h.killed,
        vec![up],
        "the DELETE came after its Authorization was set"
    );
}

/// `--mcp-forward-authorization`, modern: the shared upstream gets no session credential;
/// each message carries its own request's Authorization (or none), and a cancellation the
/// cancelled request's.
#[test]
fn forwarded_authorization_is_per_request_in_the_modern_era() {
    let mut h = forwarding();
    let mut headers = modern_headers("tools/call", Some("t"));
    headers.push(("authorization", "Bearer alice"));
    let a = h.post(&headers, &modern_call(1, "t", None));
    *headers.last_mut().unwrap() = ("authorization", "Bearer bob");
    let b = h.post(&headers, &modern_call(2, "t", None));
    headers.pop();
    let c = h.post(&headers, &modern_call(3, "t", None));
    assert!([a, b, c].iter().all(|x| h.sse.contains_key(x)));
    h.close(a);
    let up = h.spawned[0].0;
    let with = |m: &str, a: Option<&str>| (format!("send:{m}"), a.map(str::to_owned));
    assert_eq!(
        trace_of(&h, up, 0),
        vec![
            with("tools/call", Some("Bearer alice")),
            with("tools/call", Some("Bearer bob")),
            with("tools/call", None),
            with("notifications/cancelled", Some("Bearer alice")),
        ]
    );
}

/// Without the flag the core never reads Authorization: nothing is set or carried.
#[test]
fn authorization_is_not_forwarded_by_default() {
    let mut h = H::new();
    let accept = ("accept", "application/json, text/event-stream");
    h.post(&[accept, ("authorization", "Bearer A1")], INIT);
    let mut headers = modern_headers("tools/call", Some("t"));
    headers.push(("authorization", "Bearer alice"));
    h.post(&headers, &modern_call(1, "t", None));
    assert_eq!(h.auth_trace.len(), 2, "{:?}", h.auth_trace);
    assert!(
        h.auth_trace
            .iter()
            .all(|(_, w, a)| w != "set" && a.is_none())
    );
}

/// A session ID is the session's only credential: no answer of the core names it or one of
/// its streams — the resume refusals that quote the stream (410 truncated, 400 beyond the
/// tail, 410 after the end) show it as `mcp/<redacted>/<n>` — and neither do its Debug
/// output or its stats.
#[test]
fn errors_never_name_a_session_or_its_streams() {
    let mut h = H::new();
    h.subject = Some("alice".into());
    let (sid, up, init) = h.init();
    let (other, _, _) = h.init();
    let a = h.post_s(&sid, &call(1, "a", Some("t")));
    for i in 1..=5 {
        h.upstream_line(up, &progress("t", i));
    }
    h.upstream_line(up, &result(1));
    h.close(a);
    let id = h.log.id(&h.sse[&a].stream).unwrap().0 as usize;
    let mut refusals = Vec::new();
    let ended = h.event_id(a, 7);
    refusals.push((h.get_s(&sid, Some(&ended)), 410));
    let beyond = h.event_id(init, 9);
    refusals.push((h.get_s(&sid, Some(&beyond)), 400));
    h.log.floor[id] = 5;
    let gone = h.event_id(a, 2);
    refusals.push((h.get_s(&sid, Some(&gone)), 410));
    let foreign = h.event_id(init, 1);
    refusals.push((h.get_s(&other, Some(&foreign)), 400));
    refusals.push((h.get_s(&sid, Some("not-an-id")), 400));
    refusals.push((h.post_s(&sid, &call(1, "dup", None)), 200)); // an SSE answer, not an error
    refusals.push((h.post_s(&sid, &call(2, "x", Some("t2"))), 200));
    refusals.push((h.post_s(&sid, &call(2, "again", None)), 400));
    h.subject = Some("mallory".into());
    refusals.push((h.post_s(&sid, &call(9, "x", None)), 404));
    for (c, status) in &refusals {
        if *status == 200 {
            assert!(h.sse.contains_key(c));
        } else {
            assert_eq!(
                h.status(*c),
                *status,
                "{}",
                String::from_utf8_lossy(&h.resp(*c).body)
            );
        }
    }
    let streams: Vec<Value> = refusals[..3]
        .iter()
        .map(|(c, _)| h.resp(*c).json()["error"]["data"]["stream"].clone())
        .collect();
    assert_eq!(
        streams,
        vec![
            json!("mcp/<redacted>/2"),
            json!("mcp/<redacted>/1"),
            json!("mcp/<redacted>/2")
        ]
    );
    let secret = &sid[..32];
    for r in h.responses.values() {
        let text = format!("{:?} {}", r.headers, String::from_utf8_lossy(&r.body));
        let unredacted = text.replace("mcp/<redacted>", "").contains("mcp/");
        assert!(!text.contains(secret) && !unredacted, "{text}");
    }
    for text in [format!("{:?}", h.core), format!("{:?}", h.core.stats())] {
        assert!(!text.contains(secret), "{text}");
    }
}

#[test]
fn stream_names_are_redacted_for_output() {
    assert_eq!(
        redact_stream_name("mcp/0123abcd.ffee/7"),
        "mcp/<redacted>/7"
    );
    assert_eq!(redact_stream_name("mcp/m0123/0"), "mcp/<redacted>/0");
    assert_eq!(redact_stream_name("mcp/odd"), "mcp/<redacted>");
    assert_eq!(redact_stream_name("orders"), "orders");
}

/// The gateway's shard prefix (`McpConfig::session_id_prefix`) leads every session ID and
/// modern stream this core mints, so the streams of a session land in the shard it names.
#[test]
fn minted_ids_and_modern_streams_carry_the_configured_prefix() {
    let mut h = H::with(McpConfig {
        session_id_prefix: "5-".into(),
        ..McpConfig::default()
    });
    let (sid, _, c) = h.init();
    let random = sid.strip_prefix("5-").expect("prefixed");
    assert!(random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(h.sse[&c].stream, format!("mcp/{sid}/1"));
    let c = h.post(
        &modern_headers("tools/call", Some("t")),
        &modern_call(1, "t", None),
    );
    assert!(
        h.sse[&c].stream.starts_with("mcp/m5-"),
        "{}",
        h.sse[&c].stream
    );
}
