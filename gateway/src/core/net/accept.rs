//! Connections coming in and the process-wide bounds a core enforces with the other cores:
//! the listener's multishot accept, `--connections-max` (a 503 written without any
//! per-connection state), connections per client address (`--connections-per-ip-max`), a
//! slot for each connection accepted or handed over, and the receives the body budget
//! (`--request-buffer-bytes-max`) deferred. A connection the budget starves arms no receive —
//! the kernel's receive buffer fills and TCP pushes back on the client — and is polled again
//! at the end of a turn or tick once some budget is free.

use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;

use super::Net;
use super::transport::Transport;
use crate::core::Handoff;
use crate::core::conns::{Conn, State};
use crate::proto::conn::{HttpConn, RECV_BYTES_MIN};
use crate::proto::http;
use crate::streams::hub::SubRef;
use crate::sys;
use crate::tls::TlsConn;

impl Net {
    /// Arms the listener's multishot accept (at start, and at a tick after an accept error).
    pub(in crate::core) fn arm_accept(&mut self) {
        if let Some(l) = &self.listener {
            self.io.accept(l.as_raw_fd());
        }
    }

    /// The tick: an accept that ended on an error is armed again.
    pub(in crate::core) fn rearm_paused_accept(&mut self) {
        if self.accept_paused && !self.shutting_down && self.listener.is_some() {
            self.accept_paused = false;
            self.arm_accept();
        }
    }

    /// Shutting down: no more accepts (dropping the listener closes it).
    pub(in crate::core) fn stop_listening(&mut self) {
        if let Some(l) = self.listener.take() {
            self.io.cancel_fd(l.as_raw_fd());
        }
    }

    /// An accept completed: the slot of the new connection, to poll its HTTP machine.
    pub(in crate::core) fn on_accept(
        &mut self,
        fd: Result<OwnedFd, i32>,
        more: bool,
    ) -> Option<u32> {
        let fd = match fd {
            Ok(fd) => fd,
            Err(res) => {
                if !self.shutting_down {
                    let e = std::io::Error::from_raw_os_error(-res);
                    crate::warn_limited!(core = self.id, "accept: {e} (re-armed at the next tick)");
                    // EMFILE/ENFILE/ENOMEM persist while the backlog is non-empty: re-arming
                    // now would spin. The tick re-arms; a multishot accept ended any other way
                    // is re-armed the same way (a listener without an armed accept leaves
                    // clients in the backlog forever).
                    self.accept_paused |= !more;
                }
                return None;
            }
        };
        if !more && !self.shutting_down {
            self.arm_accept();
        }
        self.m().accepted_total.fetch_add(1, Relaxed);
        if self.shutting_down {
            return None; // dropping the fd closes it
        }
        let total = self.shared.connections.fetch_add(1, Relaxed) + 1;
        if total > self.shared.cfg.connections_max {
            let msg = "the gateway is at --connections-max; retry later";
            self.refuse_accepted(&fd, "too_many_connections", msg);
            return None;
        }
        let Ok(peer) = self.admit_peer(&fd) else {
            self.m().per_ip_refusals_total.fetch_add(1, Relaxed);
            let msg = "this address is at --connections-per-ip-max; retry later";
            self.refuse_accepted(&fd, "too_many_connections_from_address", msg);
            return None;
        };
        let _ = sys::set_nodelay(fd.as_fd());
        let tls = match &self.shared.certs {
            None => None,
            Some(c) => match TlsConn::new(c.current(), self.now) {
                Ok(t) => Some(Box::new(t)),
                Err(e) => {
                    crate::warn_limited!(core = self.id, "TLS session: {e}");
                    self.shared.connections.fetch_sub(1, Relaxed);
                    self.release_peer(peer);
                    return None;
                }
            },
        };
        let bytes = first_bytes(&fd, tls.is_some());
        Some(self.insert_conn(fd, bytes, peer, tls))
    }

    /// A connection another core handed over: the slot it takes, to poll its HTTP machine
    /// (none while shutting down: it is closed).
    pub(in crate::core) fn on_handoff(&mut self, h: Handoff) -> Option<u32> {
        self.m().handoffs_in_total.fetch_add(1, Relaxed);
        if self.shutting_down {
            drop(h.fd);
            self.shared.connections.fetch_sub(1, Relaxed);
            self.release_peer(h.peer);
            return None;
        }
        Some(self.insert_conn(h.fd, h.bytes, h.peer, h.tls))
    }

    /// A 503 to a connection refused at accept (it was counted; the fd closes when dropped).
    fn refuse_accepted(&self, fd: &OwnedFd, code: &str, msg: &str) {
        self.shared.connections.fetch_sub(1, Relaxed);
        sys::send_now(fd.as_fd(), &http::error_response(503, code, msg, true));
    }

    /// Takes a slot for a connection that received `bytes` so far.
    fn insert_conn(
        &mut self,
        fd: OwnedFd,
        bytes: Vec<u8>,
        peer: Option<IpAddr>,
        tls: Option<Box<TlsConn>>,
    ) -> u32 {
        let slot = self.io.open_slot();
        let mut http_conn = HttpConn::new(bytes, self.now);
        http_conn.set_budget(self.shared.body_budget.clone());
        let conn = Conn {
            fd,
            closing: false,
            state: State::Http(Box::new(http_conn)),
            peer,
            transport: Transport::of(tls),
            record: None,
            woken: None,
        };
        self.conns.insert(slot, conn);
        self.m().connections.fetch_add(1, Relaxed);
        slot
    }

    /// Counts a new connection against its address; `Err` if the address is at its limit.
    fn admit_peer(&self, fd: &OwnedFd) -> Result<Option<IpAddr>, ()> {
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
    pub(in crate::core) fn release_peer(&self, peer: Option<IpAddr>) {
        let Some(ip) = peer else { return };
        let mut map = self.shared.per_ip.lock().expect("per-ip lock");
        if let Some(n) = map.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&ip);
            }
        }
    }

    /// A connection waiting because the body budget is spent is retried once some is given
    /// back (`--request-buffer-bytes-max`).
    pub(in crate::core) fn note_starved(&mut self, slot: u32) {
        if let Some(Conn {
            state: State::Http(h),
            ..
        }) = self.conns.get(slot)
            && h.starved()
        {
            let r = (slot, self.io.generation(slot));
            self.deferred_recvs.push(r);
            if !self.retrying {
                self.m().request_buffer_waits_total.fetch_add(1, Relaxed);
            }
        }
    }

    /// The deferred receives to retry now (oldest first): none unless some budget was given
    /// back since they starved. The caller polls each live one, then calls
    /// [`Net::retried`].
    pub(in crate::core) fn deferred_due(&mut self) -> Vec<SubRef> {
        let gives = self.shared.body_budget.gives();
        if self.deferred_recvs.is_empty() || gives == self.deferred_gives {
            return Vec::new();
        }
        self.deferred_gives = gives;
        self.retrying = true;
        std::mem::take(&mut self.deferred_recvs)
    }

    /// The retry of [`Net::deferred_due`]'s receives is over (a deferral counts again).
    pub(in crate::core) fn retried(&mut self) {
        self.retrying = false;
    }
}

/// A client sends its request as soon as it is connected: read it at the accept, and its head
/// is parsed in that turn instead of after a receive's round through the ring (a resume's first
/// event one turn sooner). TLS starts with the handshake instead.
fn first_bytes(fd: &OwnedFd, tls: bool) -> Vec<u8> {
    if tls {
        return Vec::new();
    }
    sys::recv_now(fd.as_fd(), RECV_BYTES_MIN)
}
