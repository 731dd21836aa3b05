//! The sans-IO HTTP/1.1 connection machine: the request buffer, parse → route → limits, the
//! ordered outbox of answers (a publish's answer waits there until durable), pipelining with
//! its answer-bytes cap, `100 Continue`, and the header / idle deadlines. It never touches a
//! socket or a clock: the core feeds it received bytes, send results and the time, and it
//! answers with a [`Step`] (arm a receive, a complete request, hand the connection over,
//! nothing to do) or the bytes to transmit. Its buffers are moved out while an operation uses
//! them ([`Step::Recv`], [`HttpConn::poll_transmit`]) and handed back with the completion, so
//! the machine cannot touch memory the kernel is reading or writing.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::access::{self, Admission, Gate};
use super::http::{self, Head, HeadLimits};
use super::route::{self, Route};

/// The smallest receive buffer (and what it shrinks back to after a large body).
pub const RECV_BYTES_MIN: usize = 4096;
/// What one receive may add to a body beyond the bytes that arrived (at least; the buffer then
/// doubles): a client that declares a large body and sends little costs little memory.
const BODY_GROWTH_BYTES_MIN: usize = 16 * 1024;
/// A buffer grown past this by a large body is shrunk once the body is consumed.
const RECV_BYTES_KEEP_MAX: usize = 64 * 1024;
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
}

/// What a request is for, decided by its path (the core decides where it runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    Stream(&'a str),
    Mcp,
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
    /// An API request; `event_type` is the `Event-Type` header of a single publish.
    Api {
        route: Route,
        event_type: Option<String>,
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

/// A durability wait: the answer leaves only once `seq` of stream `(shard, stream)` is visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub shard: u32,
    pub stream: u32,
    pub seq: u64,
}

/// An answer waiting its turn. Answers leave strictly in request order.
#[derive(Debug)]
struct Outgoing {
    bytes: Vec<u8>,
    wait: Option<Wait>,
    close: bool,
    /// The request's extra header lines (CORS), for an answer rewritten by `fail_waits`.
    headers: String,
}

/// What the header / idle deadlines decided at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    None,
    /// The head did not complete in time: a 408 was queued (the connection closes after it).
    TimedOut,
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
    head_started: Option<Instant>,
    /// The head is complete and the body is being received: the idle timeout applies.
    awaiting_body: bool,
    /// Extra header lines for the answers to the request being handled (the gate's CORS
    /// headers); set per head, spliced into each answer queued meanwhile.
    headers: String,
}

/// Where a parsed head goes next (internal to [`HttpConn::poll`]).
enum Parsed {
    Step(Step),
    /// An error answer was queued without closing: parse the next request.
    Again,
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
            head_started: (rlen > 0).then_some(now),
            awaiting_body: false,
            headers: String::new(),
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
                self.head_started = None;
                return Step::Wait;
            }
            let rbuf = self.rbuf.as_ref().expect("checked");
            let head = match http::parse_head(&rbuf[self.rpos..self.rlen], &lim.head) {
                Ok(Some(h)) => h,
                Ok(None) => return self.await_head(lim),
                Err(e) => {
                    let (status, code, msg) = e.status();
                    self.headers.clear();
                    self.error(status, code, &msg, true);
                    return Step::Wait;
                }
            };
            self.headers.clear();
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
        let route = match route::route(&head) {
            Ok(r) => r,
            Err(e) => {
                let (status, code, msg) = e.status();
                return self.refuse_head(&head, status, code, &msg);
            }
        };
        let access = match gate.admit(&head, &route) {
            Admission::Admit { headers, access } => {
                self.headers = headers;
                access
            }
            Admission::Preflight { answer } => {
                self.consume(head.head_len);
                self.answer(answer, None, head.close);
                return if head.close {
                    Parsed::Step(Step::Wait)
                } else {
                    Parsed::Again
                };
            }
            Admission::Refuse {
                status,
                code,
                message,
                headers,
            } => {
                self.headers = headers;
                return self.refuse_head(&head, status, code, &message);
            }
        };
        let body_max = match route {
            Route::Publish { .. } => lim.event_bytes_max,
            Route::PublishBatch { .. } => lim.batch_bytes_max,
            _ => 0,
        };
        if let Some(step) = self.refuse_body(&head, body_max) {
            return Parsed::Step(step);
        }
        let total = head.head_len + head.content_length as usize;
        if self.rlen - self.rpos < total {
            return Parsed::Step(self.await_body(&head, total, true));
        }
        let owner = route.stream().and_then(|s| remote(Target::Stream(s)));
        let takes_over = matches!(route, Route::Subscribe { .. }) || owner.is_some();
        if busy && takes_over {
            return Parsed::Step(Step::Wait); // polled again once the answers are sent
        }
        if let Some(owner) = owner {
            return Parsed::Step(self.hand_off(owner));
        }
        if takes_over {
            self.compact(); // a subscribe: nothing is read after it
        }
        let body = self.take_request(head.head_len, total, now);
        Parsed::Step(Step::Request(Request {
            kind: Kind::Api {
                route,
                event_type: head.event_type,
            },
            close: head.close,
            body,
            access,
            headers: self.headers.clone(),
        }))
    }

    /// Refuses a head with a JSON error. Its body (if any) was not read, so the connection is
    /// kept only if there is none.
    fn refuse_head(&mut self, head: &Head, status: u16, code: &str, msg: &str) -> Parsed {
        let close = head.close || status == 411 || head.content_length > 0;
        if !close {
            self.consume(head.head_len);
        }
        self.error(status, code, msg, close);
        if close {
            Parsed::Step(Step::Wait)
        } else {
            Parsed::Again
        }
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
            Admission::Admit { access, .. } => access,
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
        if let Some(owner) = remote(Target::Mcp) {
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
        if head.content_length <= body_max as u64 {
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

    /// The head is incomplete: receive more (the buffer grows to the header limit).
    fn await_head(&mut self, lim: &ConnLimits) -> Step {
        self.compact();
        if self.rlen == 0 {
            self.head_started = None;
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
        if rbuf.len() < want {
            rbuf.resize(want, 0);
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
        self.head_started = (self.rlen > self.rpos).then_some(now);
        // A large body grew the buffer: give the memory back.
        let rbuf = self.rbuf.as_mut().expect("held");
        if rbuf.len() > RECV_BYTES_KEEP_MAX && self.rlen - self.rpos <= RECV_BYTES_MIN {
            self.compact();
            let rbuf = self.rbuf.as_mut().expect("held");
            rbuf.truncate(RECV_BYTES_MIN);
            rbuf.shrink_to_fit();
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
        self.head_started.get_or_insert(now);
    }

    /// The receive `Step::Recv` asked for is not armed now (a process-wide byte bound): the
    /// buffer comes back, cut to `keep` bytes (at least what it holds); the next poll asks
    /// again.
    pub fn give_back(&mut self, mut buf: Vec<u8>, keep: usize) {
        assert!(self.rbuf.is_none(), "a buffer given back that was not out");
        if buf.len() > keep.max(self.rlen) {
            buf.truncate(keep.max(self.rlen));
            buf.shrink_to_fit();
        }
        self.rbuf = Some(buf);
    }

    // ---- answers ----

    /// Queues an answer after the earlier ones; `wait`: held back until durable.
    pub fn answer(&mut self, bytes: Vec<u8>, wait: Option<Wait>, close: bool) {
        self.close_requested |= close;
        let bytes = access::with_headers(bytes, &self.headers);
        self.outbox_bytes += bytes.len();
        self.outbox.push_back(Outgoing {
            bytes,
            wait,
            close,
            headers: self.headers.clone(),
        });
    }

    /// A JSON error answer.
    pub fn error(&mut self, status: u16, code: &str, msg: &str, close: bool) {
        self.answer(http::error_response(status, code, msg, close), None, close);
    }

    /// Releases the answers whose wait `visible` says is over; true if some still wait.
    pub fn release_waits(&mut self, visible: impl Fn(Wait) -> bool) -> bool {
        let mut still = false;
        for o in self.outbox.iter_mut() {
            if let Some(w) = o.wait {
                if visible(w) {
                    o.wait = None;
                } else {
                    still = true;
                }
            }
        }
        still
    }

    /// Replaces every queued answer whose wait `failed` says is lost with `error(close)` (the
    /// answer's own close flag), ready to send.
    pub fn fail_waits(&mut self, failed: impl Fn(Wait) -> bool, error: impl Fn(bool) -> Vec<u8>) {
        for o in self.outbox.iter_mut() {
            if o.wait.is_some_and(&failed) {
                let bytes = access::with_headers(error(o.close), &o.headers);
                self.outbox_bytes = self.outbox_bytes - o.bytes.len() + bytes.len();
                o.bytes = bytes;
                o.wait = None;
            }
        }
    }

    /// The bytes to send next — the rest of a partial send, or the ready prefix of the
    /// outbox — unless a send is in flight. Hand the buffer back with [`HttpConn::on_sent`].
    pub fn poll_transmit(&mut self) -> Option<(Vec<u8>, usize)> {
        let mut buf = self.wbuf.take()?;
        if self.woff == 0 {
            buf.clear();
            while self.outbox.front().is_some_and(|o| o.wait.is_none()) {
                let o = self.outbox.pop_front().expect("front exists");
                self.outbox_bytes -= o.bytes.len();
                buf.extend_from_slice(&o.bytes);
                if o.close {
                    self.close_after_write = true;
                    self.outbox.clear();
                    self.outbox_bytes = 0;
                    break;
                }
            }
        }
        if buf.len() == self.woff {
            self.wbuf = Some(buf);
            return None;
        }
        self.sending = buf.len() - self.woff;
        let from = self.woff;
        Some((buf, from))
    }

    /// A send of the buffer completed with `n` bytes taken by the kernel.
    pub fn on_sent(&mut self, buf: Vec<u8>, n: usize, now: Instant) {
        assert!(self.wbuf.is_none(), "a send completed with no send out");
        assert!(n <= self.sending, "the kernel took more than was sent");
        self.woff += n;
        self.sending = 0;
        let mut buf = buf;
        if self.woff == buf.len() {
            buf.clear();
            self.woff = 0;
            self.idle_since = now;
        }
        self.wbuf = Some(buf);
    }

    /// Nothing more will be sent and the connection should close: an answer said close and
    /// went out, or (shutting down) every answer went out.
    pub fn done(&self, shutting_down: bool) -> bool {
        !self.is_sending()
            && self.woff == 0
            && (self.close_after_write || (shutting_down && self.outbox.is_empty()))
    }

    /// Close once the send in flight completes (shutdown).
    pub fn close_after_send(&mut self) {
        self.close_after_write = true;
    }

    pub fn is_sending(&self) -> bool {
        self.wbuf.is_none()
    }

    /// Answers queued or being sent (a send in flight or answers not sent yet).
    pub fn busy(&self) -> bool {
        !self.outbox.is_empty() || self.is_sending() || self.woff > 0
    }

    /// Answer bytes held: queued plus not yet taken by the kernel.
    pub fn answer_bytes(&self) -> usize {
        let partial = self
            .wbuf
            .as_ref()
            .map_or(self.sending, |b| b.len() - self.woff);
        self.outbox_bytes + partial
    }

    /// The header and idle deadlines at a tick (none while answers are pending).
    pub fn on_tick(&mut self, now: Instant, lim: &ConnLimits) -> Deadline {
        if self.busy() {
            return Deadline::None;
        }
        if let Some(t) = self.head_started
            && !self.awaiting_body
            && now.duration_since(t) >= lim.header_timeout
        {
            self.error(
                408,
                "request_timeout",
                "request head not completed within --header-timeout-secs",
                true,
            );
            return Deadline::TimedOut;
        }
        if (self.head_started.is_none() || self.awaiting_body)
            && now.duration_since(self.idle_since) >= lim.idle_timeout
        {
            return Deadline::Idle;
        }
        Deadline::None
    }
}

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;
