//! Every connection's timers at a core's tick: a TLS handshake past
//! `--tls-handshake-timeout-secs`, the HTTP machine's header, body and idle deadlines, and a
//! subscriber's token expiry, `SIOCOUTQ` confirmation (through its transport) and keep-alive;
//! with the gauges summed over the connections. What to close, flush or pump goes back to the
//! core.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::Net;
use super::transport::{Transport, outq_plain};
use crate::core::Limits;
use crate::core::conns::State;
use crate::core::counts::count_confirmed;
use crate::metrics::CoreMetrics;
use crate::proto::conn::Deadline;
use crate::streams::hub::{Hub, SubRef};
use crate::streams::sub::Sub;
use crate::uring::Op;

/// Connections named at a tick, in order (taken one at a time with [`Net::next_open`]).
pub(in crate::core) type Refs = std::vec::IntoIter<SubRef>;

/// Gauges summed over a core's connections at a tick.
#[derive(Debug, Default)]
pub(in crate::core) struct Gauges {
    pub(in crate::core) inflight_bytes: u64,
    pub(in crate::core) lag_max: u64,
    pub(in crate::core) answers: u64,
}

/// Counts a 408 a connection's deadline queued; returns the deadline.
fn count_deadline(m: &CoreMetrics, d: Deadline) -> Deadline {
    match d {
        Deadline::TimedOut => m.head_timeouts_total.fetch_add(1, Relaxed),
        Deadline::BodyTimedOut => m.body_timeouts_total.fetch_add(1, Relaxed),
        Deadline::None | Deadline::Idle => 0,
    };
    d
}

impl Net {
    /// Every connection's deadlines and confirmations: the connections (slot and generation)
    /// to close, to flush (a 408 queued) and to pump, and the gauges.
    pub(in crate::core) fn tick_connections(
        &mut self,
        hub: &Hub,
        lim: &Limits,
        now_unix_secs: u64,
    ) -> (Refs, Refs, Refs, Gauges) {
        let now = self.now;
        let (mut to_close, mut to_flush, mut to_pump) = (Vec::new(), Vec::new(), Vec::new());
        let mut g = Gauges::default();
        let m = &self.shared.metrics[self.id];
        for (slot, conn) in self.conns.iter_mut() {
            if conn.closing {
                continue;
            }
            let r = (slot, self.io.generation(slot));
            if conn.transport.handshake_overdue(now, lim.tls_handshake) {
                m.tls_handshake_failures_total.fetch_add(1, Relaxed);
                to_close.push(r);
                continue;
            }
            match &mut conn.state {
                State::Http(h) => {
                    g.answers += h.answer_bytes() as u64;
                    match count_deadline(m, h.on_tick(now, &lim.conn)) {
                        Deadline::None => {}
                        Deadline::TimedOut | Deadline::BodyTimedOut => to_flush.push(r),
                        Deadline::Idle => to_close.push(r),
                    }
                }
                State::Sub(sub) => {
                    let busy = |op| self.io.in_flight(slot, op);
                    let (send, pollout) = (busy(Op::Send), busy(Op::PollOut));
                    let io = (conn.fd.as_fd(), &mut conn.transport, send, pollout);
                    tick_sub(sub, io, (now, now_unix_secs, lim), hub, m, &mut g);
                    to_pump.push(r);
                }
            }
        }
        (
            to_close.into_iter(),
            to_flush.into_iter(),
            to_pump.into_iter(),
            g,
        )
    }

    /// The next connection of `list` (from [`Net::tick_connections`]) still open: on its
    /// slot's generation named and not closing. The core acts on the lists one connection at a
    /// time, and acting on one may close a later one (an MCP session's close effects, a
    /// subscriber ended by `EndAfter` and pumped). Today such a connection is always an MCP
    /// subscriber, whose watch is in flight, so it is only marked closing, never freed then;
    /// and no slot is taken during the tick (accepts and handoffs in come only with reaped
    /// completions), so none is reused. This check keeps a later change to either from
    /// acting on a freed or reused slot (`close_conn` and `flush` require a live one).
    pub(in crate::core) fn next_open(&mut self, list: &mut Refs) -> Option<u32> {
        list.find(|&r| self.conn_at(r).is_some_and(|c| !c.closing))
            .map(|r| r.0)
    }
}

/// A subscriber's timers at the tick: its token's expiry, a `SIOCOUTQ` confirmation (through
/// its transport, `in_send`: a send is in flight), the gauges, a keep-alive when no send or
/// `POLLOUT` wait is in flight.
fn tick_sub(
    sub: &mut Sub,
    (fd, transport, in_send, in_pollout): (BorrowedFd<'_>, &mut Transport, bool, bool),
    (now, now_unix_secs, lim): (Instant, u64, &Limits),
    hub: &Hub,
    m: &CoreMetrics,
    g: &mut Gauges,
) {
    if sub.expire(now_unix_secs) {
        m.token_expired_closes_total.fetch_add(1, Relaxed);
    }
    if sub.wants_outq_poll(now)
        && let Some(q) = outq_plain(fd, transport, in_send)
    {
        count_confirmed(m, sub.confirm_outq(q));
    }
    g.inflight_bytes += sub.unconfirmed_bytes();
    if let Some(b) = hub.log(sub.key.0).bounds(sub.key.1) {
        g.lag_max = g.lag_max.max(sub.lag(b.tail));
    }
    if !in_send && !in_pollout {
        sub.keepalive(now, &lim.sub);
    }
}
