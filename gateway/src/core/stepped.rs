//! The per-core loop one turn at a time, over a [`Ring`] of the caller's: the entry of the
//! whole-node simulator (`sim/`, `--whole`). Everything a core does is the same as in
//! [`super::run_core`] — the connection machine, the streams, the log, the group commit, the
//! tick — except that the caller decides when a turn runs, when the logs' background jobs run
//! (logs opened with `Log::open_with_manual_background`), and when the node crashes.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use super::{Core, CoreSetup, Shared, State};
use crate::uring::{Cqe, Driver, Ring};

/// One core driven turn by turn.
pub struct SteppedCore {
    core: Core,
    cqes: Vec<Cqe>,
}

impl std::fmt::Debug for SteppedCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SteppedCore")
            .field("id", &self.core.id)
            .finish()
    }
}

impl SteppedCore {
    /// Core `setup.id` over `ring`: its accept and eventfd read are submitted, its
    /// `Idempotency-Key`s recovered from its logs.
    pub fn new(setup: CoreSetup, shared: Arc<Shared>, ring: Box<dyn Ring>) -> SteppedCore {
        SteppedCore {
            core: Core::new(setup, shared, Driver::over(ring)),
            cqes: Vec::new(),
        }
    }

    /// One turn: submit (the ring's wait is the ring's business), reap, dispatch, the group
    /// commits, the tick when due. `false` once the core is to stop.
    pub fn turn(&mut self) -> bool {
        self.core.turn(&mut self.cqes)
    }

    /// Runs the logs' queued background jobs (segment preparation, checkpoints); how many.
    pub fn run_background_jobs(&mut self) -> usize {
        self.core
            .hub
            .logs_mut()
            .map(|(_, l)| l.run_background_jobs())
            .sum()
    }

    /// The log of `shard`, if this core owns it (for the simulator's durability checks).
    pub fn log(&self, shard: u32) -> Option<&log_store::Log> {
        let hub = &self.core.hub;
        hub.has_shard(shard).then(|| hub.log(shard))
    }

    /// Each plaintext subscriber's socket and the bytes of its window its peer confirmed
    /// (released): never more than the peer has read (the simulator checks).
    pub fn confirmed(&self) -> Vec<(RawFd, u64)> {
        (self.core.net.conns.iter())
            .filter_map(|(_, c)| match &c.state {
                State::Sub(s) if c.transport.kernel_counts_plain() => {
                    Some((c.fd.as_raw_fd(), s.acked_bytes()))
                }
                _ => None,
            })
            .collect()
    }

    /// Live connections.
    pub fn connections(&self) -> usize {
        self.core.live_connections()
    }

    /// A crash: every log dropped as a crash leaves it (nothing more written or synced);
    /// connections, windows and answers waiting are gone with the rest of the memory.
    pub fn crash(self) {
        let Core { hub, net, .. } = self.core;
        drop(net); // the ring first: nothing it executes may touch a log after this
        for (_, log) in hub.into_logs() {
            log.simulate_crash();
        }
    }
}
