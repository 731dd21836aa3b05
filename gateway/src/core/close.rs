//! Closing a connection: a subscriber's unconfirmed window is tightened by `SIOCOUTQ` and
//! parked for an aligned resume (unless it never parks), the socket is shut down, every
//! operation in flight is cancelled, and the fd is closed and the slot freed only once no
//! memory-owning operation is in flight.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering::Relaxed;

use super::counts::count_confirmed;
use super::{Core, State};
use crate::streams::sub::PENDING_STREAM;
use crate::sys;
use crate::uring::Op;

impl Core {
    pub(super) fn close_conn(&mut self, slot: u32) {
        self.mcp_conn_closed(slot);
        let (now, lim, shutting_down) = (self.now, self.lim.park, self.shutting_down.is_some());
        let conn = self.conns.live(slot);
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
            if let Some(q) =
                super::tls::outq_plain(fd, &mut conn.tls, self.io.in_flight(slot, Op::Send))
            {
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
            self.unborn_closed((slot, self.io.generation(slot)));
        }
        sys::shutdown(self.conn(slot).fd.as_fd());
        self.io.cancel_slot(slot);
        self.maybe_free(slot);
    }

    /// Closes the fd and frees the slot of a closing connection once nothing that owns its
    /// memory is in flight.
    pub(super) fn maybe_free(&mut self, slot: u32) {
        let conn = self.conns.live(slot);
        if !conn.closing || self.io.owning_in_flight(slot) {
            return;
        }
        let conn = self.conns.take(slot);
        self.release_peer(conn.peer);
        drop(conn); // closes the fd
        self.io.close_slot(slot);
        self.shared.connections.fetch_sub(1, Relaxed);
        self.m().connections.fetch_sub(1, Relaxed);
    }
}
