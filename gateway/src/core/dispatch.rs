//! Completions to the code that handles them: accepts, the eventfd (handoffs, shutdown), and
//! each connection's receive, send, poll, watch and TX-timestamp completions. A completion
//! of a closing connection only returns its memory; the slot is freed once nothing that owns
//! memory is in flight.

use std::sync::atomic::Ordering::Relaxed;

use super::Core;
use crate::uring::Completion;

impl Core {
    pub(super) fn dispatch(&mut self, c: Completion) {
        match c {
            Completion::Accept { fd, more } => {
                if let Some(slot) = self.net.on_accept(fd, more) {
                    self.drive_http(slot);
                }
            }
            Completion::EventFd { res } => self.on_eventfd(res),
            Completion::Fsync { shard, res } => {
                self.m().log_fsyncs_total.fetch_add(1, Relaxed);
                let took = self.hub.on_fsync(shard, res, self.id, self.now);
                self.m().fsync_duration.observe(took);
            }
            Completion::SyncFs { round, res } => {
                self.m().log_syncfs_total.fetch_add(1, Relaxed);
                if let Some(took) = self.hub.on_syncfs(round, res, self.id, self.now) {
                    self.m().fsync_duration.observe(took);
                }
            }
            c => {
                if let Some((slot, then)) = self.net.on_completion(c) {
                    self.then(slot, then);
                }
            }
        }
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
