//! A connection's completions (receive, send, `POLLOUT`, read-ahead, watch, TX timestamp)
//! into `Net`'s handlers: what follows is a `Then` for the core. A closing connection's
//! completion only returns its memory; its slot is freed once nothing owning memory is in
//! flight.

use super::{Net, Then};
use crate::core::conns::State;
use crate::uring::Completion;

impl Net {
    /// Handles a connection's completion; the slot and what the core does next, or `None`
    /// (the connection is closing: the completion's memory is dropped here).
    pub(in crate::core) fn on_completion(&mut self, c: Completion) -> Option<(u32, Then)> {
        let slot = c.conn_slot().expect("a connection's completion");
        if self.conn(slot).closing {
            self.maybe_free(slot);
            return None;
        }
        let then = match c {
            Completion::Recv { slot, res, buf } => self.on_recv(slot, res, buf),
            Completion::Send { slot, res, mem } => self.on_sent(slot, res, mem),
            Completion::PollOut { .. } => Then::Pump,
            Completion::Prefetch { slot, .. } => {
                if let State::Sub(sub) = &mut self.conn(slot).state {
                    sub.on_prefetched();
                }
                Then::Pump
            }
            Completion::Watch { slot, res, more } => self.on_watch(slot, res, more),
            Completion::TxTimestamp {
                slot,
                res,
                flags,
                more,
            } => {
                self.on_tx_timestamp(slot, res, flags, more);
                Then::Wait
            }
            Completion::Accept { .. }
            | Completion::EventFd { .. }
            | Completion::Fsync { .. }
            | Completion::SyncFs { .. } => unreachable!("above"),
        };
        Some((slot, then))
    }
}
