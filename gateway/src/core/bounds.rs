//! Process-wide bounds a core enforces with the other cores: connections per client address
//! (`--connections-per-ip-max`) and the bytes of request bodies being received
//! (`--request-buffer-bytes-max`). Past the byte bound a connection's receive is not armed —
//! the kernel's receive buffer fills and TCP pushes back on the client — until bytes are
//! released (a request consumed, a connection closed); deferred receives are retried at the
//! tick and when bytes are released.

use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;

use super::{Core, State};
use crate::proto::conn::RECV_BYTES_MIN;
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

    /// Arms a receive into `buf[from..]`, or defers it while the connection's grown buffer
    /// would take the process past `--request-buffer-bytes-max`. A connection's first
    /// `header_bytes_max` bytes are not counted: every connection can always read a head.
    pub(super) fn arm_recv(&mut self, slot: u32, buf: Vec<u8>, from: usize) {
        let free = self.lim.conn.head.header_bytes_max.max(RECV_BYTES_MIN) as u64;
        let want = (buf.len() as u64).saturating_sub(free);
        let max = self.shared.cfg.request_buffer_bytes_max;
        let conn = self.conns[slot as usize].as_mut().expect("live slot");
        if want > conn.buffered {
            let grow = want - conn.buffered;
            let total = self.shared.request_bytes.fetch_add(grow, Relaxed) + grow;
            if total > max {
                self.shared.request_bytes.fetch_sub(grow, Relaxed);
                if let State::Http(h) = &mut conn.state {
                    // Not grown after all: the memory goes back until the bytes are granted.
                    h.give_back(buf, (conn.buffered + free) as usize);
                }
                self.deferred_recvs.push((slot, self.io.generation(slot)));
                self.shared.metrics[self.id]
                    .request_buffer_waits_total
                    .fetch_add(1, Relaxed);
                return;
            }
            conn.buffered = want;
        } else if want < conn.buffered {
            self.shared
                .request_bytes
                .fetch_sub(conn.buffered - want, Relaxed);
            conn.buffered = want;
        }
        let fd = conn.fd.as_raw_fd();
        self.io.recv(slot, fd, buf, from);
    }

    /// Gives back a connection's counted request-buffer bytes (it closes, is handed off, or
    /// stops reading requests).
    pub(super) fn release_buffered(&mut self, slot: u32) {
        let conn = self.conns[slot as usize].as_mut().expect("live slot");
        if conn.buffered > 0 {
            self.shared.request_bytes.fetch_sub(conn.buffered, Relaxed);
            conn.buffered = 0;
        }
    }

    /// Retries the receives deferred by the byte bound (oldest first).
    pub(super) fn retry_deferred_recvs(&mut self) {
        // Only once some room opened (a deferral re-queues itself, re-parsing its head).
        let room = self.shared.cfg.request_buffer_bytes_max
            > self.shared.request_bytes.load(Relaxed) + RECV_BYTES_MIN as u64;
        if self.deferred_recvs.is_empty() || !room {
            return;
        }
        for r in std::mem::take(&mut self.deferred_recvs) {
            if self.conn_at(r).is_some_and(|c| !c.closing) {
                self.drive_http(r.0);
            }
        }
    }
}
