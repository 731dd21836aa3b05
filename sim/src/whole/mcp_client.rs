//! MCP session clients of the whole node (the 2025-11-25 session transport on `/mcp`): each
//! initializes a session, sends `notifications/initialized`, then calls a tool whose
//! progress notifications and result stream on the POST's response. It reads a few bytes at a
//! time or many, is cut at any byte, and resumes the call's stream with GET + `Last-Event-ID`
//! (by the seed first with an ID the node must refuse with 400: another session's, one beyond
//! its stream's tail, or not an event ID).
//!
//! The oracle is the call itself (the upstream's behaviour is known, see [`super::upstream`]):
//! its stream is the priming event, progress `1..=count` and the result `{"sent": count}`,
//! each exactly once and in order across every cut and resume, with contiguous sequence
//! numbers on one stream; a resumed response first restates the client's position. Explicit
//! errors end a call — a lost session (404), an ended stream without its result (410), a
//! JSON-RPC error, a 5xx — but only with a cause since the session's `initialize`: a crash, a
//! failed sync, a full disk, or the death of the session's own upstream — or while the node
//! refuses records (a poisoned log, a disk full in the last 100 steps), or, for 410, with
//! retention on. Anything else is a violation, and so is a 400 to a resume from an ID the node showed.
#![forbid(unsafe_code)]

use serde_json::Value;

use super::client::{ClientConn, seq_of, whole_answer};
use crate::sse::{Item, Parser};

const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sim","version":"1"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// Where a session client stands.
#[derive(Debug)]
enum State {
    /// No session: the next request is an `initialize`.
    Fresh,
    /// The `initialize` is in flight.
    Init,
    /// The session is known; `notifications/initialized` is to be sent (`sent`: in flight).
    Notify { sent: bool },
    /// Ready for a call.
    Ready,
    /// A call in flight: its POST, or a resume of its stream.
    Call(Call),
}

#[derive(Debug)]
struct Call {
    rpc: u64,
    count: u64,
    /// The next progress value due (`count + 1`: the result).
    next: u64,
    /// The last event of its stream seen: its ID and sequence.
    last: Option<(String, u64)>,
    /// This connection is a resume: its first event restates `last`.
    resumed: bool,
    /// Events read on this connection.
    read: u64,
}

/// What may excuse an MCP client's loss (see the module's doc).
#[derive(Debug, Clone, Copy, Default)]
pub struct Excuses {
    /// Crashes, failed syncs and full disks so far, plus one if the upstream of the session
    /// asked about died.
    pub count: u64,
    /// The node refuses records now: its log is poisoned (until the crash that follows), or
    /// its disk was full in the last 100 steps.
    pub failing: bool,
}

/// The world's [`Excuses`] for a session (`None`: no session yet).
pub type Ex<'a> = &'a dyn Fn(Option<&str>) -> Excuses;

/// What a client asks for on a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    Initialize,
    Initialized,
    Call,
    Resume,
}

/// One MCP session client.
#[derive(Debug)]
pub struct McpClient {
    pub conn: Option<ClientConn>,
    parser: Parser,
    /// The bytes of a plain answer (the `202` to a notification).
    answer: Vec<u8>,
    sid: Option<String>,
    state: State,
    /// The world's excuses (crashes, failed syncs, full disks; see [`McpClient::advance`])
    /// when its `initialize` was sent.
    excuses_at: u64,
    /// Retention is on: a resume may find its history gone (410).
    retention: bool,
    pub slow: bool,
    next_rpc: u64,
    /// Calls whose result arrived whole; calls ended by an explicit error.
    pub results: u64,
    pub errors: u64,
    /// IDs of the events shown since the world last took them (checked durable).
    pub shown: Vec<String>,
    /// The connection resumes with an ID the node must refuse (400): another session's, one
    /// beyond the stream's tail, or not an event ID.
    odd: Option<String>,
}

impl McpClient {
    pub fn new(slow: bool, retention: bool) -> McpClient {
        McpClient {
            conn: None,
            parser: Parser::default(),
            answer: Vec::new(),
            sid: None,
            state: State::Fresh,
            excuses_at: 0,
            retention,
            slow,
            next_rpc: 1,
            results: 0,
            errors: 0,
            shown: Vec::new(),
            odd: None,
        }
    }

    /// The ID of the last event of a call seen, if a call is in flight.
    pub fn last_id(&self) -> Option<&str> {
        match &self.state {
            State::Call(c) => c.last.as_ref().map(|l| l.0.as_str()),
            _ => None,
        }
    }

    /// Resumes the call's stream on `conn` with `id`, which the node must refuse with 400
    /// (another session's ID, one beyond the tail, not an ID); the call goes on afterwards.
    pub fn connect_odd(&mut self, mut conn: ClientConn, id: String) {
        let sid = self.sid.clone().unwrap_or_default();
        let req = format!(
            "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\
             Mcp-Session-Id: {sid}\r\nLast-Event-ID: {id}\r\n\r\n"
        );
        conn.queue(req.as_bytes());
        self.conn = Some(conn);
        self.parser = Parser::default();
        self.odd = Some(id);
    }

    /// The session's ID, once an `initialize` was answered (none while a new one is sought).
    pub fn session(&self) -> Option<&str> {
        match self.state {
            State::Fresh => None,
            _ => self.sid.as_deref(),
        }
    }

    /// Whether the next connection resumes a call's stream (else it starts a request).
    pub fn resuming(&self) -> bool {
        matches!(&self.state, State::Call(c) if c.last.is_some())
    }

    /// A call in flight (its answer or its stream not whole yet).
    pub fn in_call(&self) -> bool {
        matches!(self.state, State::Call(_))
    }

    /// Sends on `conn` what comes next: an `initialize`, the `initialized` notification, a
    /// call of the tool with `count` progress notifications, or the resume of a call.
    /// `ex`: as in [`McpClient::advance`].
    pub fn connect(&mut self, mut conn: ClientConn, count: u64, ex: Ex<'_>) -> Asked {
        let sid = self.sid.clone().unwrap_or_default();
        let (asked, req) = match &mut self.state {
            State::Fresh | State::Init => {
                self.state = State::Init;
                self.sid = None;
                self.excuses_at = ex(None).count;
                (Asked::Initialize, post(None, INIT))
            }
            State::Notify { sent } => {
                *sent = true;
                (Asked::Initialized, post(Some(&sid), INITIALIZED))
            }
            State::Call(c) if c.last.is_some() => {
                c.resumed = true;
                c.read = 0;
                let last = &c.last.as_ref().expect("checked").0;
                let req = format!(
                    "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\
                     Mcp-Session-Id: {sid}\r\nLast-Event-ID: {last}\r\n\r\n"
                );
                (Asked::Resume, req)
            }
            State::Ready | State::Call(_) => {
                let rpc = self.next_rpc;
                self.next_rpc += 1;
                self.state = State::Call(Call {
                    rpc,
                    count,
                    next: 1,
                    last: None,
                    resumed: false,
                    read: 0,
                });
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{rpc},"method":"tools/call","params":{{"name":"p","arguments":{{"count":{count}}},"_meta":{{"progressToken":{rpc}}}}}}}"#
                );
                (Asked::Call, post(Some(&sid), &body))
            }
        };
        conn.queue(req.as_bytes());
        self.conn = Some(conn);
        self.parser = Parser::default();
        self.answer.clear();
        asked
    }

    /// A cut at any byte.
    pub fn cut(&mut self) {
        self.conn = None;
        self.odd = None;
        self.settle();
    }

    /// The connection is gone: what was in flight is lost (an `initialize`, a call before
    /// its first event) or is to be resumed.
    fn settle(&mut self) {
        self.state = match std::mem::replace(&mut self.state, State::Fresh) {
            State::Fresh | State::Init => State::Fresh,
            State::Notify { .. } => State::Notify { sent: false },
            State::Call(c) if c.last.is_none() => State::Ready,
            s => s,
        };
    }

    /// Writes what is queued, reads up to `n` bytes and checks what they carry; how many
    /// messages of calls were shown (not counting priming events and restated positions).
    /// `ex`: what may excuse a loss now, for a session (asked at the moment of the decision,
    /// with the session known then: an `initialize`'s answer names it).
    pub fn advance(&mut self, n: usize, ex: Ex<'_>) -> Result<u64, String> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(0);
        };
        conn.write_some(usize::MAX);
        let got = conn.read_some(n)?;
        let eof = conn.eof;
        let mut events = 0;
        if matches!(self.state, State::Notify { sent: true }) {
            self.answer.extend_from_slice(&got);
            if let Some((status, body)) = whole_answer(&self.answer)? {
                self.on_notified(status, &body, ex)?;
                self.conn = None;
            }
        } else {
            self.parser.feed(&got);
            while let Some(item) = self.parser.poll_item()? {
                events += u64::from(self.on_item(item, ex)?);
                if self.conn.is_none() {
                    break;
                }
            }
        }
        if eof {
            self.conn = None;
        }
        if self.conn.is_none() {
            self.odd = None;
            self.settle();
        }
        Ok(events)
    }

    /// Whether an explicit loss (a session gone, a stream ended early, an error answer) has
    /// a cause since this session began.
    fn excused(&self, ex: Ex<'_>, status: u16) -> bool {
        let e = ex(self.session());
        e.failing || e.count > self.excuses_at || status == 410 && self.retention
    }

    fn on_notified(&mut self, status: u16, body: &str, ex: Ex<'_>) -> Result<(), String> {
        self.state = match status {
            202 => State::Ready,
            404 if self.excused(ex, status) => State::Fresh,
            500..=599 if self.excused(ex, status) => State::Notify { sent: false },
            _ => {
                return Err(format!(
                    "notifications/initialized answered {status}: {body}"
                ));
            }
        };
        Ok(())
    }

    /// One item of an SSE answer; whether it was an event of a call.
    fn on_item(&mut self, item: Item, ex: Ex<'_>) -> Result<bool, String> {
        match item {
            Item::Head { status } => self.on_head(status, ex).map(|()| false),
            Item::Event { id, data, .. } => match self.state {
                State::Init => self.on_init_event(&data, ex).map(|()| false),
                State::Call(_) => self.on_call_event(id, &data, ex),
                _ => Err(format!("an event {id:?} with nothing in flight")),
            },
            Item::Truncated { data } => Err(format!("an MCP stream truncated: {data}")),
            Item::Other => Ok(false),
        }
    }

    fn on_head(&mut self, status: u16, ex: Ex<'_>) -> Result<(), String> {
        let excused = self.excused(ex, status);
        if let Some(id) = self.odd.take() {
            // Refused, or the session is gone (a cause since it began): the call goes on.
            self.conn = None;
            return match status {
                400 => Ok(()),
                404 if excused => {
                    self.errors += 1;
                    self.sid = None;
                    self.state = State::Fresh;
                    Ok(())
                }
                _ => Err(format!(
                    "a resume with ID {id:?} answered {status}, not 400"
                )),
            };
        }
        let call = match &self.state {
            State::Call(c) => Some((c.rpc, c.resumed)),
            _ => None,
        };
        match (status, call) {
            (200, None) => {
                let sid = self.parser.header("mcp-session-id");
                let sid = sid.ok_or("an initialize answered 200 without Mcp-Session-Id")?;
                self.sid = Some(sid.to_owned());
                return Ok(());
            }
            (200, Some(_)) => return Ok(()),
            (500..=599, _) if excused => self.errors += 1,
            (404, Some(_)) if excused => {
                self.errors += 1;
                self.sid = None;
            }
            (410, Some((_, true))) if excused => self.errors += 1,
            (_, Some((rpc, resumed))) => {
                let how = if resumed { "its resume" } else { "its POST" };
                return Err(format!("call {rpc}: {how} answered {status}"));
            }
            (_, None) => return Err(format!("an initialize answered {status}")),
        }
        // An explicit error ends what was in flight.
        self.conn = None;
        self.state = match (&self.state, &self.sid) {
            (State::Call(_), Some(_)) => State::Ready,
            _ => State::Fresh,
        };
        Ok(())
    }

    fn on_init_event(&mut self, data: &[u8], ex: Ex<'_>) -> Result<(), String> {
        if data.is_empty() {
            return Ok(()); // the priming event
        }
        let v: Value = serde_json::from_slice(data).map_err(|e| format!("initialize: {e}"))?;
        if v["id"] == 0 && v["result"]["protocolVersion"] == "2025-11-25" {
            self.state = State::Notify { sent: false };
        } else if v["id"] == 0 && v.get("error").is_some() && self.excused(ex, 0) {
            self.errors += 1;
            self.state = State::Fresh;
        } else {
            return Err(format!("initialize answered {v}"));
        }
        self.conn = None;
        Ok(())
    }

    /// One event of a call's stream; whether it carried a message (not the priming event or
    /// the restated position).
    fn on_call_event(&mut self, id: String, data: &[u8], ex: Ex<'_>) -> Result<bool, String> {
        let excused = self.excused(ex, 0);
        let State::Call(c) = &mut self.state else {
            unreachable!("called in a call");
        };
        let seq = seq_of(&id).ok_or_else(|| format!("bad event ID {id:?}"))?;
        let rpc = c.rpc;
        let first = c.read == 0;
        c.read += 1;
        if first && c.resumed {
            let last = c.last.as_ref().map(|l| l.0.as_str());
            if !data.is_empty() || last != Some(id.as_str()) {
                return Err(format!(
                    "call {rpc}: a resume after {last:?} began with {id} {:?}, not the restated position",
                    String::from_utf8_lossy(data)
                ));
            }
            return Ok(false);
        }
        let stream_of = |id: &str| id.rsplit_once('-').map(|(p, _)| p.to_owned());
        match &c.last {
            Some((last, _)) if stream_of(last) != stream_of(&id) => {
                return Err(format!(
                    "call {rpc}: event {id} after {last}, of another stream"
                ));
            }
            Some((_, prev)) if seq != prev + 1 => {
                return Err(format!("call {rpc}: event {seq} after {prev}"));
            }
            None if !data.is_empty() => {
                return Err(format!("call {rpc}: a first event with data, not priming"));
            }
            _ => {}
        }
        c.last = Some((id.clone(), seq));
        if data.is_empty() {
            return Ok(false); // priming
        }
        self.shown.push(id);
        let v: Value = serde_json::from_slice(data).map_err(|e| format!("call {rpc}: {e}"))?;
        if v["method"] == "notifications/progress" {
            let p = v["params"]["progress"].as_u64();
            if p != Some(c.next) || v["params"]["progressToken"] != rpc {
                return Err(format!("call {rpc}: {v} where progress {} was due", c.next));
            }
            c.next += 1;
            return Ok(true);
        }
        if v["id"] != rpc {
            return Err(format!("call {rpc}: a message not of this call: {v}"));
        }
        if v.get("error").is_some() && excused {
            self.errors += 1;
        } else if c.next == c.count + 1 && v["result"]["structuredContent"]["sent"] == c.count {
            self.results += 1;
        } else {
            return Err(format!("call {rpc}: {v} after progress {}", c.next - 1));
        }
        self.state = State::Ready;
        self.conn = None;
        Ok(true)
    }
}

/// A POST on `/mcp` of `body`, in session `sid` if any.
fn post(sid: Option<&str>, body: &str) -> String {
    let session = sid.map_or(String::new(), |s| format!("Mcp-Session-Id: {s}\r\n"));
    format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json, text/event-stream\r\n\
         Content-Type: application/json\r\n{session}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}
