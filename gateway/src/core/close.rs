//! Closing a connection: the MCP front hears of it, a subscriber's unconfirmed window is
//! tightened by `SIOCOUTQ` and parked for an aligned resume (unless it never parks), then
//! `Net` shuts the socket down, cancels every operation in flight, and closes the fd and
//! frees the slot only once no memory-owning operation is in flight (`Net::maybe_free`).

use std::os::fd::AsFd;
use std::sync::atomic::Ordering::Relaxed;

use super::counts::count_confirmed;
use super::net::transport::outq_plain;
use super::{Core, State};
use crate::streams::sub::PENDING_STREAM;
use crate::uring::Op;

impl Core {
    pub(super) fn close_conn(&mut self, slot: u32) {
        self.mcp_conn_closed(slot);
        let (now, lim, shutting_down) = (self.now, self.lim.park, self.shutting_down.is_some());
        let conn = self.net.conns.live(slot);
        if conn.closing {
            return;
        }
        conn.closing = true;
        super::requests::subscription_ended(&self.shared, self.id, now, conn);
        let fd = conn.fd.as_fd();
        let mut unborn = false;
        if let State::Sub(sub) = &mut conn.state {
            let key = sub.key;
            unborn = key.1 == PENDING_STREAM;
            // ACKs whose timestamp completions are not reaped yet: SIOCOUTQ (write_seq -
            // snd_una, still meaningful after a reset) tightens the window to what the peer
            // really confirmed, so the parked head is as exact as the kernel knows it.
            if let Some(q) = outq_plain(
                fd,
                &mut conn.transport,
                self.net.io.in_flight(slot, Op::Send),
            ) {
                count_confirmed(&self.shared.metrics[self.id], sub.confirm_outq(q));
            }
            let events = sub.take_parkable();
            self.hub.unsubscribe(key, slot);
            self.shared.metrics[self.id]
                .subscribers
                .fetch_sub(1, Relaxed);
            if !shutting_down {
                self.parked.park(key, events, now, lim);
                self.m()
                    .parked_windows
                    .store(self.parked.count() as u64, Relaxed);
            }
        }
        if unborn {
            self.unborn_closed((slot, self.net.io.generation(slot)));
        }
        self.net.shut(slot);
    }
}
