//! A chunked request body on the API (`Transfer-Encoding: chunked` on a publish or batch):
//! decoded in place in the request buffer as it arrives (`super::super::chunked`), under the
//! same body limits, body budget and body deadline as a `Content-Length` body.
#![forbid(unsafe_code)]

use std::time::Instant;

use super::super::chunked::{ChunkLimits, Decoder, Progress};
use super::super::http::Head;
use super::super::route::Route;
use super::{ConnLimits, HttpConn, Step, Target};

/// What [`HttpConn::on_chunked`] needs of the poll it runs in.
pub(super) struct Ctx<'a> {
    /// Answers are pending (a request that moves the connection waits for them).
    pub busy: bool,
    pub now: Instant,
    pub lim: &'a ConnLimits,
}

impl HttpConn {
    /// An API head with a chunked body of at most `body_max` bytes. A stream owned by another
    /// core moves the connection there before any byte is decoded (the owner decodes the raw
    /// bytes itself); here the body is decoded as far as it has arrived, then either receives
    /// more or is a complete request.
    pub(super) fn on_chunked(
        &mut self,
        head: Head,
        route: Route,
        access: auth::Access,
        body_max: usize,
        ctx: Ctx<'_>,
        remote: &dyn Fn(Target<'_>) -> Option<usize>,
    ) -> Step {
        if self.chunked.is_none() {
            if let Some(owner) = route.stream().and_then(|s| remote(Target::Stream(s))) {
                return if ctx.busy {
                    Step::Wait // polled again once the answers are sent
                } else {
                    self.hand_off(owner)
                };
            }
            self.chunked = Some(Box::new(Decoder::new()));
            self.start_body_deadline(ctx.now);
        }
        let lim = ChunkLimits {
            body_bytes_max: body_max,
            line_bytes_max: ctx.lim.head.header_bytes_max,
        };
        let start = self.rpos + head.head_len;
        let rbuf = self.rbuf.as_mut().expect("held");
        let decoder = self.chunked.as_mut().expect("set above");
        match decoder.decode(&mut rbuf[start..self.rlen], &lim) {
            Err(e) => {
                self.chunked = None;
                let (status, code, msg) = e.status();
                self.error(status, code, &msg, true);
                Step::Wait
            }
            Ok(Progress::More { len }) => {
                self.rlen = start + len;
                // Room for the whole body and one line more than a line may be, so a buffer
                // that fills up always holds a complete line or one too long (an error).
                let cap = head.head_len + body_max + lim.line_bytes_max + 1;
                self.await_body(&head, cap, true)
            }
            Ok(Progress::Done { body, rest }) => {
                self.chunked = None;
                self.rlen = start + body + rest;
                let body = self.take_request(head.head_len, head.head_len + body, ctx.now);
                self.api_request(head, route, body, access)
            }
        }
    }

    /// The head of an API request with a body is complete: `--body-timeout-secs` starts now
    /// (once per body: the head is parsed again on every poll until the body is complete).
    pub(super) fn start_body_deadline(&mut self, now: Instant) {
        if !self.awaiting_body || self.started.is_none() {
            self.started = Some(now);
        }
    }
}
