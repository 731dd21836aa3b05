//! Process-wide bounds a core enforces with the other cores: connections per client address
//! (`--connections-per-ip-max`) and the bytes of request bodies being received
//! (`--request-buffer-bytes-max`, a `BodyBudget` the connection machine takes from before its
//! buffer grows). A connection the budget starves arms no receive — the kernel's receive
//! buffer fills and TCP pushes back on the client — and is polled again at the end of a turn
//! or tick once some budget is free.

use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};

use super::Core;
use crate::sys;

impl Core {
    /// Counts a new connection against its address; `Err` if the address is at its limit.
    pub(super) fn admit_peer(&self, fd: &OwnedFd) -> Result<Option<IpAddr>, ()> {
        let Ok(ip) = sys::peer_ip(fd.as_fd()) else {
            return Ok(None); // already reset: it will close at its first receive
        };
        let max = self.shared.cfg.connections_per_ip_max;
        let mut map = self.shared.per_ip.lock().expect("per-ip lock");
        let n = map.entry(ip).or_insert(0);
        if max > 0 && *n >= max {
            if *n == 0 {
                map.remove(&ip);
            }
            return Err(());
        }
        *n += 1;
        Ok(Some(ip))
    }

    /// A connection from `peer` is gone.
    pub(super) fn release_peer(&self, peer: Option<IpAddr>) {
        let Some(ip) = peer else { return };
        let mut map = self.shared.per_ip.lock().expect("per-ip lock");
        if let Some(n) = map.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&ip);
            }
        }
    }

    /// Retries the receives starved by the body budget (oldest first), once some budget was
    /// given back since they starved.
    pub(super) fn retry_deferred_recvs(&mut self) {
        let gives = self.shared.body_budget.gives();
        if self.deferred_recvs.is_empty() || gives == self.deferred_gives {
            return;
        }
        self.deferred_gives = gives;
        self.retrying = true;
        for r in std::mem::take(&mut self.deferred_recvs) {
            if self.conn_at(r).is_some_and(|c| !c.closing) {
                self.drive_http(r.0);
            }
        }
        self.retrying = false;
    }
}
