//! The sans-IO HTTP/1.1 connection machine: the request buffer, parse → route → limits, the
//! ordered outbox of answers (a publish's answer waits there until durable), pipelining with
//! its answer-bytes cap, `100 Continue`, and the header / body / idle deadlines. It never touches a
//! socket or a clock: the core feeds it received bytes, send results and the time, and it
//! answers with a [`Step`] (arm a receive, a complete request, hand the connection over,
//! nothing to do) or the bytes to transmit. Its buffers are moved out while an operation uses
//! them ([`Step::Recv`], [`HttpConn::poll_transmit`]) and handed back with the completion, so
//! the machine cannot touch memory the kernel is reading or writing.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

mod budget;
mod chunked_body;
mod outbox;
mod record;

use std::sync::Arc;

pub use budget::BodyBudget;
pub use outbox::Released;

use super::access::{Admission, Gate};
use super::chunked::Decoder;
use super::http::{self, Head, HeadLimits};
use super::request_log::{Finished, Record};
use super::route::{self, Route};

/// The smallest receive buffer (and what it shrinks back to after a large body).
pub const RECV_BYTES_MIN: usize = 4096;
/// What one receive may add to a body beyond the bytes that arrived (at least; the buffer then
/// doubles): a client that declares a large body and sends little costs little memory.
const BODY_GROWTH_BYTES_MIN: usize = 16 * 1024;
/// A buffer grown by a body is shrunk back to a head buffer once the body is consumed (its
/// bytes count against `--request-buffer-bytes-max` until then).
const RECV_BYTES_KEEP_MAX: usize = 8 * 1024;
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The limits a connection enforces (flags, checked at start).
#[derive(Debug, Clone)]
pub struct ConnLimits {
    pub head: HeadLimits,
    pub event_bytes_max: usize,
    pub batch_bytes_max: usize,
    /// `--pipeline-answer-bytes-max`: answers queued before no further request is read.
    pub answer_bytes_max: usize,
    /// The MCP endpoint's path and `--mcp-body-bytes-max`, when the MCP front is on.
    pub mcp: Option<(String, usize)>,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// `--body-timeout-secs`: the whole body of an API request, from its head on.
    pub body_timeout: Duration,
}

/// What a request is for, decided by its path (the core decides where it runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    Stream(&'a str),
    /// A request on the MCP path: its head (its `Mcp-Session-Id`) and who sent it.
    Mcp(&'a Head, &'a auth::Access),
}

/// A complete request, consumed from the buffer.
#[derive(Debug)]
pub struct Request {
    pub kind: Kind,
    /// The client asked to close after the answer.
    pub close: bool,
    pub body: Vec<u8>,
    /// Who asked (the gate's verdict): subject and token expiry, both `None` when anonymous.
    pub access: auth::Access,
    /// Header lines for every answer to this request (CORS); empty for most.
    pub headers: String,
}

#[derive(Debug)]
pub enum Kind {
    /// An API request; `event_type` is the `Event-Type` header of a single publish,
    /// `idempotency_key` a publish's `Idempotency-Key` (valid: the router checked it).
    Api {
        route: Route,
        event_type: Option<String>,
        idempotency_key: Option<String>,
    },
    /// A request on the MCP path, with its head's bytes (the MCP front reads every header).
    Mcp { head: Vec<u8> },
}

/// What the core does next for this connection.
#[derive(Debug)]
pub enum Step {
    /// Arm a receive into `buf[from..]`; hand the buffer back with [`HttpConn::on_recv`].
    Recv { buf: Vec<u8>, from: usize },
    /// Nothing until a completion (a receive or send in flight, answers over the cap, a
    /// request that takes the connection over waiting for earlier answers, or closing).
    Wait,
    /// A complete request to carry out. More may follow (poll again).
    Request(Request),
    /// The buffered request belongs to core `owner`: move the connection there with `bytes`
    /// (everything received and not consumed). The machine is spent.
    HandOff { owner: usize, bytes: Vec<u8> },
}

/// What a queued answer waits for before it may leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Event `seq` of stream `(shard, stream)` durable under `--fsync` (its visible tail
    /// reached it); `seq` = `u64::MAX`: the stream's removal durable.
    Durable { shard: u32, stream: u32, seq: u64 },
    /// A cluster publish's placeholder: its events back from JetStream and applied on this
    /// node (`ticket`: the request's first); the core then replaces it with the answer, which
    /// waits [`Wait::Durable`] in turn.
    Applied { shard: u32, ticket: u64 },
}

impl Wait {
    /// The shard whose log the wait depends on (a failed group commit fails its waits).
    pub fn shard(self) -> u32 {
        match self {
            Wait::Durable { shard, .. } | Wait::Applied { shard, .. } => shard,
        }
    }
}

/// An answer waiting its turn. Answers leave strictly in request order.
#[derive(Debug)]
struct Outgoing {
    bytes: Vec<u8>,
    wait: Option<Wait>,
    close: bool,
    /// The request's extra header lines (CORS), for an answer rewritten by `fail_waits`.
    headers: String,
    /// The access-log record of the request this answer is the final one of.
    record: Option<Box<Record>>,
}

/// What the header / idle deadlines decided at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    None,
    /// The head did not complete in time: a 408 was queued (the connection closes after it).
    TimedOut,
    /// An API request's body did not complete within `--body-timeout-secs`: a 408 was queued
    /// (the connection closes after it).
    BodyTimedOut,
    /// Idle too long: close now.
    Idle,
}

/// One HTTP connection's protocol state.
#[derive(Debug)]
pub struct HttpConn {
    /// The request buffer; `None` while a receive holds it.
    rbuf: Option<Vec<u8>>,
    /// Received bytes are `rbuf[..rlen]`; those before `rpos` are consumed requests.
    rpos: usize,
    rlen: usize,
    outbox: VecDeque<Outgoing>,
    outbox_bytes: usize,
    /// The send buffer; `None` while a send holds it. `woff` bytes of it are sent.
    wbuf: Option<Vec<u8>>,
    woff: usize,
    /// Bytes handed to the send in flight and not yet reported sent.
    sending: usize,
    close_after_write: bool,
    /// A request asked to close (or was refused with close): parse nothing more.
    close_requested: bool,
    sent_continue: bool,
    idle_since: Instant,
    /// When the part of a request being received began: its head's first byte, or, while an
    /// API body is awaited, the head's completion (`--body-timeout-secs` runs from it).
    started: Option<Instant>,
    /// The head is complete and the body is being received: the idle timeout applies.
    awaiting_body: bool,
    /// Extra header lines for the answers to the request being handled (the gate's CORS
    /// headers); set per head, spliced into each answer queued meanwhile.
    headers: String,
    /// Where body bytes are taken from (`None`: unbounded), what this connection holds of it,
    /// and whether it now waits for some (see [`HttpConn::starved`]).
    budget: Option<Arc<BodyBudget>>,
    counted: u64,
    starved: bool,
    /// The access-log record of the head being handled, until its final answer is queued
    /// (or a subscriber takes it); then the answered ones, until the core takes them.
    record: Option<Box<Record>>,
    finished: Vec<Finished>,
    /// The chunked body being decoded (in place, after its head), once it is known to be
    /// served here.
    chunked: Option<Box<Decoder>>,
}

/// Where a parsed head goes next (internal to [`HttpConn::poll`]). A return value, never
/// stored: boxing its large variant would only add an allocation per request.
#[allow(clippy::large_enum_variant)]
enum Parsed {
    Step(Step),
    /// An error answer was queued without closing: parse the next request.
    Again,
}

impl Parsed {
    /// After an answer queued in place of a request: wait if the connection closes after it,
    /// else parse the next request.
    fn after(close: bool) -> Parsed {
        if close {
            Parsed::Step(Step::Wait)
        } else {
            Parsed::Again
        }
    }
}

impl HttpConn {
    /// A connection that already received `bytes` (empty for a fresh accept; a handoff's bytes).
    pub fn new(bytes: Vec<u8>, now: Instant) -> HttpConn {
        let rlen = bytes.len();
        let mut rbuf = bytes;
        rbuf.resize(rlen.max(RECV_BYTES_MIN), 0);
        HttpConn {
            rbuf: Some(rbuf),
            rpos: 0,
            rlen,
            outbox: VecDeque::new(),
            outbox_bytes: 0,
            wbuf: Some(Vec::new()),
            woff: 0,
            sending: 0,
            close_after_write: false,
            close_requested: false,
            sent_continue: false,
            idle_since: now,
            started: (rlen > 0).then_some(now),
            awaiting_body: false,
            headers: String::new(),
            budget: None,
            counted: 0,
            starved: false,
            record: None,
            finished: Vec::new(),
            chunked: None,
        }
    }

    /// The next step: parses buffered bytes into at most one request.
    pub fn poll(
        &mut self,
        now: Instant,
        lim: &ConnLimits,
        remote: &dyn Fn(Target<'_>) -> Option<usize>,
        gate: &mut Gate,
    ) -> Step {
        loop {
            if self.close_requested || self.rbuf.is_none() {
                return Step::Wait;
            }
            let busy = self.busy();
            if busy && self.answer_bytes() >= lim.answer_bytes_max {
                // Backpressure on pipelining: read no further request until the client takes
                // some answers. The header timer must not run while the gateway refuses to read.
                self.started = None;
                return Step::Wait;
            }
            let rbuf = self.rbuf.as_ref().expect("checked");
            let head = match http::parse_head(&rbuf[self.rpos..self.rlen], &lim.head) {
                Ok(Some(h)) => h,
                Ok(None) => return self.await_head(lim),
                Err(e) => {
                    let (status, code, msg) = e.status();
                    self.headers.clear();
                    let started = self.started.unwrap_or(now);
                    self.record = Some(Box::new(Record::unparsed(self.rlen - self.rpos, started)));
                    self.error(status, code, &msg, true);
                    return Step::Wait;
                }
            };
            self.headers.clear();
            let mcp_path = lim.mcp.as_ref().map(|(p, _)| p.as_str());
            let started = self.started.unwrap_or(now);
            self.record = Some(Box::new(Record::of(&head, mcp_path, started)));
            match self.on_head(head, busy, now, lim, remote, gate) {
                Parsed::Step(s) => return s,
                Parsed::Again => continue,
            }
        }
    }

    fn on_head(
        &mut self,
        head: Head,
        busy: bool,
        now: Instant,
        lim: &ConnLimits,
        remote: &dyn Fn(Target<'_>) -> Option<usize>,
        gate: &mut Gate,
    ) -> Parsed {
        if let Some((path, body_max)) = &lim.mcp
            && *path == head.path
        {
            return Parsed::Step(self.on_mcp_head(head, busy, *body_max, now, remote, gate));
        }
        let (route, access) = match self.admit(&head, gate) {
            Ok(ra) => ra,
            Err(parsed) => return parsed,
        };
        let body_max = match route {
            Route::Publish { .. } => lim.event_bytes_max,
            Route::PublishBatch { .. } => lim.batch_bytes_max,
            _ => 0,
        };
        if let Some(step) = self.refuse_body(&head, body_max) {
            return Parsed::Step(step);
        }
        if head.chunked {
            let ctx = chunked_body::Ctx { busy, now, lim };
            return Parsed::Step(self.on_chunked(head, route, access, body_max, ctx, remote));
        }
        let total = head.head_len + head.content_length as usize;
        if self.rlen - self.rpos < total {
            self.start_body_deadline(now);
            return Parsed::Step(self.await_body(&head, total, true));
        }
        let owner = route.stream().and_then(|s| remote(Target::Stream(s)));
        let takes_over = matches!(route, Route::Subscribe { .. }) || owner.is_some();
        if busy && takes_over {
            // Polled again once the answers are sent. The body is complete: its deadline no
            // longer runs (the wait is the gateway's, not the client's).
            self.awaiting_body = false;
            return Parsed::Step(Step::Wait);
        }
        if let Some(owner) = owner {
            return Parsed::Step(self.hand_off(owner));
        }
        if takes_over {
            self.compact(); // a subscribe: nothing is read after it
        }
        let body = self.take_request(head.head_len, total, now);
        Parsed::Step(self.api_request(head, route, body, access))
    }

    /// The complete API request of `head` with its `body`.
    fn api_request(&self, head: Head, route: Route, body: Vec<u8>, access: auth::Access) -> Step {
        Step::Request(Request {
            kind: Kind::Api {
                route,
                event_type: head.event_type,
                idempotency_key: head.idempotency_key,
            },
            close: head.close,
            body,
            access,
            headers: self.answer_headers(),
        })
    }

    /// Routes an API head and asks the gate (origin, then grants): the route and who asked,
    /// or what was answered instead (a refusal or a preflight).
    // The `Err` is the step to return at once (moved straight out, once per request).
    #[allow(clippy::result_large_err)]
    fn admit(&mut self, head: &Head, gate: &mut Gate) -> Result<(Route, auth::Access), Parsed> {
        let admission = match gate.cors(head) {
            Err(refusal) => refusal,
            Ok(headers) => {
                self.headers = headers;
                let route = match route::route(head) {
                    Ok(r) => r,
                    Err(e) => {
                        let (status, code, msg) = e.status();
                        return Err(self.refuse_head(head, status, code, &msg));
                    }
                };
                match gate.admit(head, &route, std::mem::take(&mut self.headers)) {
                    Admission::Admit { headers, access } => {
                        self.headers = headers;
                        self.note_subject(&access);
                        return Ok((route, access));
                    }
                    other => other,
                }
            }
        };
        match admission {
            Admission::Preflight { answer } => {
                self.consume(head.head_len);
                self.answer(answer, None, head.close);
                Err(Parsed::after(head.close))
            }
            Admission::Refuse {
                status,
                code,
                message,
                headers,
            } => {
                self.headers = headers;
                Err(self.refuse_head(head, status, code, &message))
            }
            Admission::Admit { .. } => unreachable!("returned above"),
        }
    }

    /// Refuses a head with a JSON error. Its body (if any) was not read, so the connection is
    /// kept only if there is none.
    fn refuse_head(&mut self, head: &Head, status: u16, code: &str, msg: &str) -> Parsed {
        let close = head.close || status == 411 || head.content_length > 0 || head.chunked;
        if !close {
            self.consume(head.head_len);
        }
        self.error(status, code, msg, close);
        Parsed::after(close)
    }

    /// A head on the MCP path: it always takes the connection over (its answer may be a stream).
    fn on_mcp_head(
        &mut self,
        head: Head,
        busy: bool,
        body_max: usize,
        now: Instant,
        remote: &dyn Fn(Target<'_>) -> Option<usize>,
        gate: &mut Gate,
    ) -> Step {
        self.compact();
        if busy {
            return Step::Wait;
        }
        let access = match gate.admit_mcp(&head) {
            Admission::Admit { access, .. } => {
                self.note_subject(&access);
                access
            }
            Admission::Refuse {
                status,
                code,
                message,
                headers,
            } => {
                self.headers = headers;
                self.error(status, code, &message, true);
                return Step::Wait;
            }
            Admission::Preflight { .. } => unreachable!("admit_mcp answers no preflight"),
        };
        if head.chunked {
            let msg = "send /mcp bodies with a Content-Length";
            self.error(411, "length_required", msg, true);
            return Step::Wait;
        }
        if head.content_length > body_max as u64 {
            let msg = format!(
                "body of {} bytes exceeds --mcp-body-bytes-max {body_max}",
                head.content_length
            );
            self.error(413, "body_too_large", &msg, true);
            return Step::Wait;
        }
        let total = head.head_len + head.content_length as usize;
        if self.rlen < total {
            return self.await_body(&head, total, false);
        }
        if let Some(owner) = remote(Target::Mcp(&head, &access)) {
            return self.hand_off(owner);
        }
        let head_bytes = self.rbuf.as_ref().expect("held")[..head.head_len].to_vec();
        let body = self.take_request(head.head_len, total, now);
        Step::Request(Request {
            kind: Kind::Mcp { head: head_bytes },
            close: head.close,
            body,
            access,
            headers: String::new(),
        })
    }

    /// A 413 for a body over `body_max` (0: the route takes none).
    fn refuse_body(&mut self, head: &Head, body_max: usize) -> Option<Step> {
        if head.content_length <= body_max as u64 && !(head.chunked && body_max == 0) {
            return None;
        }
        let (code, msg) = if body_max == 0 {
            ("body_not_allowed", "this request takes no body".to_string())
        } else {
            (
                "body_too_large",
                format!(
                    "body of {} bytes exceeds the limit of {body_max}",
                    head.content_length
                ),
            )
        };
        self.error(413, code, &msg, true);
        Some(Step::Wait)
    }

    /// The head is incomplete: receive more (the buffer grows to the header limit). Not
    /// smaller: a pipelining publisher's receive size sets how many publishes one turn takes,
    /// hence how many events each fan-out send carries (a 4 KiB first buffer cut 1 × 100
    /// fan-out from 5.5 M to 3.3 M deliveries/s).
    fn await_head(&mut self, lim: &ConnLimits) -> Step {
        self.compact();
        if self.rlen == 0 {
            self.started = None;
        }
        let rbuf = self.rbuf.as_mut().expect("held");
        if rbuf.len() < lim.head.header_bytes_max {
            rbuf.resize(lim.head.header_bytes_max.max(RECV_BYTES_MIN), 0);
        }
        self.recv_step()
    }

    /// The head is complete, the body is not: receive it (answering `Expect: 100-continue`).
    /// `idle_deadline`: the idle timeout applies meanwhile, not the header timeout (an MCP
    /// body stays under the header timeout, as its front has always done).
    fn await_body(&mut self, head: &Head, total: usize, idle_deadline: bool) -> Step {
        self.compact();
        self.awaiting_body = idle_deadline;
        // The buffer grows with the bytes that arrive, never to the declared length up front.
        let want = total.min((self.rlen * 2).max(self.rlen + BODY_GROWTH_BYTES_MIN));
        let rbuf = self.rbuf.as_mut().expect("held");
        self.starved = false;
        if rbuf.len() < want {
            if self.reserve(total) {
                self.rbuf.as_mut().expect("held").resize(want, 0);
            } else if self.rlen == self.rbuf.as_ref().expect("held").len() {
                // No budget for this body and no room left: the core polls again once some
                // is given back. The bytes received so far stay.
                self.starved = true;
                return Step::Wait;
            }
        }
        if head.expect_continue && !self.sent_continue {
            self.sent_continue = true;
            self.answer(CONTINUE.to_vec(), None, false);
        }
        self.recv_step()
    }

    fn recv_step(&mut self) -> Step {
        let rbuf = self.rbuf.as_ref().expect("held");
        if self.rlen == rbuf.len() {
            return Step::Wait; // full: a limit error was raised before this
        }
        let from = self.rlen;
        Step::Recv {
            buf: self.rbuf.take().expect("held"),
            from,
        }
    }

    fn hand_off(&mut self, owner: usize) -> Step {
        self.compact();
        self.record = None; // the owner core parses the head again and records it
        let mut bytes = self.rbuf.take().expect("held");
        bytes.truncate(self.rlen);
        Step::HandOff { owner, bytes }
    }

    /// Consumes the request `[rpos, rpos + total)` and returns its body.
    fn take_request(&mut self, head_len: usize, total: usize, now: Instant) -> Vec<u8> {
        let base = self.rpos;
        let rbuf = self.rbuf.as_mut().expect("held");
        let body = rbuf[base + head_len..base + total].to_vec();
        self.consume(total);
        self.sent_continue = false;
        self.awaiting_body = false;
        self.started = (self.rlen > self.rpos).then_some(now);
        // A body grew the buffer: give the memory (and its budget) back.
        let rbuf = self.rbuf.as_mut().expect("held");
        if rbuf.len() > RECV_BYTES_KEEP_MAX && self.rlen - self.rpos <= RECV_BYTES_MIN {
            self.compact();
            self.shrink_buffer(RECV_BYTES_MIN);
        }
        body
    }

    /// Marks `n` buffered bytes consumed (pipelined requests advance `rpos`; the buffer is
    /// compacted before a receive is armed).
    fn consume(&mut self, n: usize) {
        self.rpos += n;
        if self.rpos == self.rlen {
            (self.rpos, self.rlen) = (0, 0);
        }
    }

    /// Moves the unconsumed bytes to the front of the buffer.
    fn compact(&mut self) {
        if self.rpos > 0 {
            let rbuf = self.rbuf.as_mut().expect("held");
            rbuf.copy_within(self.rpos..self.rlen, 0);
            self.rlen -= self.rpos;
            self.rpos = 0;
        }
    }

    /// A receive completed with `n` bytes (`n > 0`) into the buffer it held.
    pub fn on_recv(&mut self, buf: Vec<u8>, n: usize, now: Instant) {
        assert!(
            self.rbuf.is_none(),
            "a receive completed with no receive out"
        );
        self.rbuf = Some(buf);
        self.rlen += n;
        self.idle_since = now;
        self.started.get_or_insert(now);
    }

    /// The header, body and idle deadlines at a tick (the header and idle ones wait while
    /// answers are pending; the body's runs regardless: it bounds the whole body).
    pub fn on_tick(&mut self, now: Instant, lim: &ConnLimits) -> Deadline {
        if let Some(t) = self.started
            && self.awaiting_body
            && !self.close_requested
            && now.duration_since(t) >= lim.body_timeout
        {
            self.error(
                408,
                "request_timeout",
                "request body not completed within --body-timeout-secs",
                true,
            );
            return Deadline::BodyTimedOut;
        }
        if self.busy() {
            return Deadline::None;
        }
        if let Some(t) = self.started
            && !self.awaiting_body
            && now.duration_since(t) >= lim.header_timeout
        {
            self.record = Some(Box::new(Record::unparsed(self.rlen - self.rpos, t)));
            self.error(
                408,
                "request_timeout",
                "request head not completed within --header-timeout-secs",
                true,
            );
            return Deadline::TimedOut;
        }
        if (self.started.is_none() || self.awaiting_body)
            && now.duration_since(self.idle_since) >= lim.idle_timeout
        {
            return Deadline::Idle;
        }
        Deadline::None
    }
}

#[cfg(test)]
mod tests;
