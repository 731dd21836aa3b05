//! Closing a connection: the MCP front hears of it, a subscriber's unconfirmed window is
//! tightened by `SIOCOUTQ` and parked for an aligned resume (unless it never parks), then
//! `Net` shuts the socket down, cancels every operation in flight, and closes the fd and
//! frees the slot only once no memory-owning operation is in flight (`Net::maybe_free`).

use super::Core;
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
        let (subs, mut cx) = self.subs_cx();
        let unborn = subs
            .detach(&mut cx, slot, shutting_down)
            .is_some_and(|key| key.1 == PENDING_STREAM);
        if unborn {
            self.unborn_closed((slot, self.net.io.generation(slot)));
        }
        self.net.shut(slot);
    }
}
