//! Closing a connection: the MCP front hears of it, a subscriber's unconfirmed window is
//! tightened by `SIOCOUTQ` and parked for an aligned resume (unless it never parks), then
//! `Net` shuts the socket down, cancels every operation in flight, and closes the fd and
//! frees the slot only once no memory-owning operation is in flight (`Net::maybe_free`).

use std::sync::atomic::Ordering::Relaxed;

use super::{Core, State};
use crate::streams::sub::PENDING_STREAM;

impl Core {
    pub(super) fn close_conn(&mut self, slot: u32) {
        self.mcp_conn_closed(slot);
        let (now, shutting_down) = (self.now, self.shutting_down.is_some());
        let conn = self.net.conns.live(slot);
        if conn.closing {
            return;
        }
        conn.closing = true;
        super::requests::subscription_ended(&self.shared, self.id, now, conn);
        self.net.confirm_at_close(slot);
        let mut unborn = false;
        if let State::Sub(sub) = &mut self.net.conns.live(slot).state {
            let key = sub.key;
            unborn = key.1 == PENDING_STREAM;
            let events = sub.take_parkable();
            self.hub.unsubscribe(key, slot);
            let m = &self.shared.metrics[self.id];
            m.subscribers.fetch_sub(1, Relaxed);
            if !shutting_down {
                self.subs.park(m, key, events, now);
            }
        }
        if unborn {
            self.unborn_closed((slot, self.net.io.generation(slot)));
        }
        self.net.shut(slot);
    }
}
