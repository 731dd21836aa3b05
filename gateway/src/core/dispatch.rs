//! Completions to the code that handles them: accepts, the eventfd (handoffs, shutdown), and
//! each connection's receive, send, poll, watch and TX-timestamp completions. A completion
//! of a closing connection only returns its memory; the slot is freed once nothing that owns
//! memory is in flight.

use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;

use super::tls::Tls;
use super::{Conn, Core, State};
use crate::proto::conn::HttpConn;
use crate::proto::http;
use crate::sys;
use crate::tls::TlsConn;
use crate::uring::{Completion, SendMem};

impl Core {
    pub(super) fn dispatch(&mut self, c: Completion) {
        let slot = match c {
            Completion::Accept { fd, more } => return self.on_accept(fd, more),
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
        if self.conn(slot).closing {
            return self.maybe_free(slot); // the memory in `c` is dropped here
        }
        match c {
            Completion::Recv { slot, res, buf } if self.conn(slot).tls.is_some() => {
                self.on_tls_recv(slot, res, buf)
            }
            Completion::Recv { slot, res, buf } => self.on_recv(slot, res, buf),
            Completion::Send { slot, res, mem } => match mem {
                SendMem::Buf(buf) if self.conn(slot).tls.is_some() => {
                    self.on_tls_sent(slot, res, buf)
                }
                SendMem::Buf(buf) => self.on_http_sent(slot, res, buf),
                SendMem::Vectored(v) => self.on_sub_sent(slot, res, v),
            },
            Completion::PollOut { slot, .. } => self.pump(slot),
            Completion::Prefetch { slot, .. } => {
                if let State::Sub(sub) = &mut self.conn(slot).state {
                    sub.on_prefetched();
                }
                self.pump(slot);
            }
            Completion::Watch { slot, res, more } => self.on_watch(slot, res, more),
            Completion::TxTimestamp {
                slot,
                res,
                flags,
                more,
            } => self.on_tx_timestamp(slot, res, flags, more),
            Completion::Accept { .. } | Completion::EventFd { .. } | Completion::Fsync { .. } => {
                unreachable!("above")
            }
        }
    }

    fn on_accept(&mut self, fd: Result<OwnedFd, i32>, more: bool) {
        let fd = match fd {
            Ok(fd) => fd,
            Err(res) => {
                if self.shutting_down.is_none() {
                    let e = std::io::Error::from_raw_os_error(-res);
                    crate::warn_limited!(core = self.id, "accept: {e} (re-armed at the next tick)");
                    // EMFILE/ENFILE/ENOMEM persist while the backlog is non-empty: re-arming
                    // now would spin. The tick re-arms; a multishot accept ended any other way
                    // is re-armed the same way (a listener without an armed accept leaves
                    // clients in the backlog forever).
                    self.accept_paused |= !more;
                }
                return;
            }
        };
        if !more
            && self.shutting_down.is_none()
            && let Some(l) = &self.listener
        {
            self.io.accept(l.as_raw_fd());
        }
        self.m().accepted_total.fetch_add(1, Relaxed);
        if self.shutting_down.is_some() {
            return; // dropping the fd closes it
        }
        let total = self.shared.connections.fetch_add(1, Relaxed) + 1;
        if total > self.shared.cfg.connections_max {
            let msg = "the gateway is at --connections-max; retry later";
            return self.refuse_accepted(&fd, "too_many_connections", msg);
        }
        let Ok(peer) = self.admit_peer(&fd) else {
            self.m().per_ip_refusals_total.fetch_add(1, Relaxed);
            let msg = "this address is at --connections-per-ip-max; retry later";
            return self.refuse_accepted(&fd, "too_many_connections_from_address", msg);
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
                    return;
                }
            },
        };
        let slot = self.insert_conn(fd, Vec::new(), peer, tls);
        self.drive_http(slot);
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
            tls: tls.map(|s| Box::new(Tls::new(s))),
            record: None,
            woken: None,
        };
        self.conns.insert(slot, conn);
        self.m().connections.fetch_add(1, Relaxed);
        slot
    }

    fn on_eventfd(&mut self, res: i32) {
        if res < 0 && res != -libc::EAGAIN {
            tracing::error!(core = self.id, "eventfd read: {res}");
        }
        if self.shared.shutdown.load(Relaxed) {
            self.begin_shutdown();
        } else {
            self.io.read_eventfd(self.efd);
        }
        while let Ok(h) = self.rx.try_recv() {
            self.m().handoffs_in_total.fetch_add(1, Relaxed);
            if self.shutting_down.is_some() {
                drop(h.fd);
                self.shared.connections.fetch_sub(1, Relaxed);
                self.release_peer(h.peer);
                continue;
            }
            let slot = self.insert_conn(h.fd, h.bytes, h.peer, h.tls);
            self.drive_http(slot);
        }
    }

    fn on_recv(&mut self, slot: u32, res: i32, buf: Vec<u8>) {
        if res <= 0 {
            return self.close_conn(slot);
        }
        let now = self.now;
        match &mut self.conn(slot).state {
            State::Http(h) => h.on_recv(buf, res as usize, now),
            // Cannot happen (a request is taken only with no receive out); kept total: the
            // bytes are dropped and the subscriber is watched for hang-up.
            State::Sub(_) => return self.arm_watch(slot),
        }
        self.drive_http(slot);
    }

    /// A subscriber's watch fired: hang-up or reset closes; input is read and dropped (a
    /// subscriber has nothing more to say); an error-queue wake (a TX timestamp) is ignored.
    fn on_watch(&mut self, slot: u32, res: i32, more: bool) {
        if res < 0 {
            return self.close_conn(slot);
        }
        let mask = res as u32 as i16;
        if mask & (libc::POLLHUP | libc::POLLRDHUP) != 0 {
            return self.close_conn(slot);
        }
        let fd = self.conn(slot).fd.as_fd();
        if mask & libc::POLLIN != 0 && sys::discard_input(fd) == sys::Input::Gone {
            return self.close_conn(slot);
        }
        // Ended without F_MORE (e.g. a full completion queue ends multishot polls): re-arm.
        if !more {
            self.arm_watch(slot);
        }
    }
}
