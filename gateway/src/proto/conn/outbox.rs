//! A connection's answers: the ordered outbox (durability waits, CORS header lines), what to
//! transmit next and what a send completed.
#![forbid(unsafe_code)]

use std::time::Instant;

use super::super::access;
use super::super::http;
use super::super::request_log::{Finished, status_of};
use super::{HttpConn, Outgoing, Wait};

/// What [`HttpConn::release_waits`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Some answer was released (something new may be ready to send).
    pub some: bool,
    /// Some answer still waits.
    pub still_waiting: bool,
}

impl HttpConn {
    /// Queues an answer after the earlier ones; `wait`: held back until durable.
    pub fn answer(&mut self, bytes: Vec<u8>, wait: Option<Wait>, close: bool) {
        self.close_requested |= close;
        let headers = self.answer_headers();
        let bytes = access::with_headers(bytes, &headers);
        // A 1xx is not the request's answer: the record waits for the final one.
        let record = if status_of(&bytes) >= 200 {
            self.record.take()
        } else {
            None
        };
        self.outbox_bytes += bytes.len();
        self.outbox.push_back(Outgoing {
            bytes,
            wait,
            close,
            headers,
            record,
        });
    }

    /// A JSON error answer.
    pub fn error(&mut self, status: u16, code: &str, msg: &str, close: bool) {
        self.answer(http::error_response(status, code, msg, close), None, close);
    }

    /// Releases the answers whose wait `visible` says is over.
    pub fn release_waits(&mut self, visible: impl Fn(Wait) -> bool) -> Released {
        let mut r = Released::default();
        for o in self.outbox.iter_mut() {
            if let Some(w) = o.wait {
                if visible(w) {
                    o.wait = None;
                    r.some = true;
                } else {
                    r.still_waiting = true;
                }
            }
        }
        r
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

    /// Replaces the queued answer held by `old` (a placeholder) with `bytes`, now held by
    /// `wait` (`None`: ready to send).
    pub fn replace_wait(&mut self, old: Wait, bytes: Vec<u8>, wait: Option<Wait>) {
        if let Some(o) = self.outbox.iter_mut().find(|o| o.wait == Some(old)) {
            let bytes = access::with_headers(bytes, &o.headers);
            self.outbox_bytes = self.outbox_bytes - o.bytes.len() + bytes.len();
            o.bytes = bytes;
            o.wait = wait;
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
                if let Some(record) = o.record {
                    self.finished.push(Finished {
                        record: *record,
                        status: status_of(&o.bytes),
                        bytes_out: o.bytes.len() as u64,
                    });
                }
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

    /// The peer ended its sending side (a FIN, or TLS `close_notify`) while the machine waited
    /// for more: the receive gives `buf` back; nothing more is parsed, and the connection
    /// closes after the last answer queued now (every request received is answered first).
    /// False if no answer is queued or being sent: close now.
    pub fn close_after_answers(&mut self, buf: Vec<u8>) -> bool {
        assert!(
            self.rbuf.is_none(),
            "the peer's end came with no receive out"
        );
        self.rbuf = Some(buf);
        self.close_requested = true;
        match self.outbox.back_mut() {
            Some(last) => last.close = true,
            None => self.close_after_write = true,
        }
        self.busy()
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
}
