//! Completions to the code that handles them: accepts, the eventfd (handoffs, shutdown), and
//! each connection's receive, send, poll, watch and TX-timestamp completions. A completion
//! of a closing connection only returns its memory; the slot is freed once nothing that owns
//! memory is in flight.

use std::sync::atomic::Ordering::Relaxed;

use super::{Core, State, Then};
use crate::uring::Completion;

impl Core {
    pub(super) fn dispatch(&mut self, c: Completion) {
        let slot = match c {
            Completion::Accept { fd, more } => {
                if let Some(slot) = self.net.on_accept(fd, more) {
                    self.drive_http(slot);
                }
                return;
            }
            Completion::EventFd { res } => return self.on_eventfd(res),
            Completion::Fsync { shard, res } => {
                self.m().log_fsyncs_total.fetch_add(1, Relaxed);
                let took = self.hub.on_fsync(shard, res, self.id, self.now);
                return self.m().fsync_duration.observe(took);
            }
            Completion::Recv { slot, .. }
            | Completion::Send { slot, .. }
            | Completion::PollOut { slot, .. }
            | Completion::Watch { slot, .. }
            | Completion::TxTimestamp { slot, .. }
            | Completion::Prefetch { slot, .. } => slot,
        };
        if self.net.conn(slot).closing {
            return self.net.maybe_free(slot); // the memory in `c` is dropped here
        }
        let then = match c {
            Completion::Recv { slot, res, buf } => self.net.on_recv(slot, res, buf),
            Completion::Send { slot, res, mem } => self.net.on_sent(slot, res, mem),
            Completion::PollOut { .. } => Then::Pump,
            Completion::Prefetch { slot, .. } => {
                if let State::Sub(sub) = &mut self.net.conn(slot).state {
                    sub.on_prefetched();
                }
                Then::Pump
            }
            Completion::Watch { slot, res, more } => self.net.on_watch(slot, res, more),
            Completion::TxTimestamp {
                slot,
                res,
                flags,
                more,
            } => {
                self.net.on_tx_timestamp(slot, res, flags, more);
                Then::Wait
            }
            Completion::Accept { .. } | Completion::EventFd { .. } | Completion::Fsync { .. } => {
                unreachable!("above")
            }
        };
        self.then(slot, then);
    }

    fn on_eventfd(&mut self, res: i32) {
        if res < 0 && res != -libc::EAGAIN {
            tracing::error!(core = self.id, "eventfd read: {res}");
        }
        if self.shared.shutdown.load(Relaxed) {
            self.begin_shutdown();
        } else {
            self.net.io.read_eventfd(self.efd);
        }
        while let Ok(h) = self.rx.try_recv() {
            if let Some(slot) = self.net.on_handoff(h) {
                self.drive_http(slot);
            }
        }
    }
}
