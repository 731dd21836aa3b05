//! Closing a connection: the MCP front hears of it, a subscriber's unconfirmed window is
//! tightened by `SIOCOUTQ` and parked for an aligned resume (unless it never parks), then
//! `Net` shuts the socket down, cancels every operation in flight, and closes the fd and
//! frees the slot only once no memory-owning operation is in flight (`Net::maybe_free`).

use super::Core;

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
        subs.detach(&mut cx, slot, shutting_down);
        self.net.shut(slot);
    }
}
