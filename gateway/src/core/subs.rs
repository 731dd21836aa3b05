//! Subscriber connections on a core: turning a connection into a subscriber (TCP options,
//! ACK mode, registry, watch), pumping it (the streams layer decides what to send; the driver
//! sends it straight from the mapped log), and what send and TX-timestamp completions confirm.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering::Relaxed;

use log_store::Seq;

use super::counts::count_confirmed;
use super::{Core, State};
use crate::streams::StreamKey;
use crate::streams::sub::{AckMode, Ended, Next, Sub, TxReport};
use crate::streams::window::ParkedEvent;
use crate::sys;
use crate::uring::{Bytes, Op, Vectored};

impl Core {
    /// The connection becomes a subscriber of `key` from `cursor`, after `preamble` (and the
    /// `aligned` parked events of an aligned resume); `setup` adjusts it before its first send.
    pub(super) fn become_subscriber(
        &mut self,
        slot: u32,
        key: StreamKey,
        cursor: Seq,
        preamble: Vec<u8>,
        aligned: Option<Vec<ParkedEvent<Bytes>>>,
        setup: impl FnOnce(&mut Sub),
    ) {
        let want_ts = self.shared.uring_cmd && !self.shared.cfg.no_tx_timestamps;
        let (now, generation) = (self.now, self.io.generation(slot));
        let lowat = self.shared.cfg.notsent_lowat_bytes;
        let conn = self.conn(slot);
        let fd = conn.fd.as_raw_fd();
        let _ = sys::set_notsent_lowat(conn.fd.as_fd(), lowat);
        // Byte 0 of the window is the first byte written after this option is set: nothing is
        // in flight on this connection now (a request is taken over only with its answers sent).
        // TLS: the kernel's byte counts are ciphertext; SIOCOUTQ goes through the session's
        // ciphertext map (core/tls.rs), TX timestamps are not used.
        let want_ts = want_ts && conn.tls.is_none();
        let ack = if want_ts && sys::enable_tx_ack_timestamps(conn.fd.as_fd()).is_ok() {
            AckMode::TxTimestamps
        } else {
            AckMode::Outq
        };
        let mut sub = Box::new(Sub::new(key, cursor, ack, preamble, aligned, now));
        setup(&mut sub);
        super::requests::keep_for_subscription(conn);
        conn.state = State::Sub(sub);
        if let Some(t) = &mut conn.tls {
            t.stop_reading(); // a subscriber reads nothing more: its receive buffer goes
        }
        self.hub.subscribe(key, (slot, generation));
        self.m().subscribers.fetch_add(1, Relaxed);
        if ack == AckMode::TxTimestamps {
            self.io.tx_timestamps(slot, fd);
        }
        self.arm_watch(slot);
        self.pump(slot);
    }

    /// Arms a subscriber's multishot poll for input and hang-up, unless it is armed.
    ///
    /// Why not a recv: a subscriber socket has TX ACK timestamps on, and every timestamp
    /// queued on its error queue wakes the socket's waiters with EPOLLERR. A recv parked on
    /// io_uring's internal poll is woken, retried, finds no data, and — having been polled
    /// once already — is punted to an io-wq worker thread that blocks in `tcp_recvmsg` (one
    /// thread per subscriber, woken by every ACK). A multishot poll stays armed in the
    /// kernel instead: a spurious wake costs one CQE, never a thread.
    pub(super) fn arm_watch(&mut self, slot: u32) {
        let c = self.conn(slot);
        let fd = c.fd.as_raw_fd();
        if c.closing || self.io.in_flight(slot, Op::Watch) || self.io.in_flight(slot, Op::Recv) {
            return;
        }
        self.io.watch(slot, fd);
    }

    /// Moves a subscriber forward: refills its window from the log (up to the visible tail)
    /// and hands every unsent byte to the kernel in one send, unless a send or a `POLLOUT`
    /// wait is in flight.
    pub(super) fn pump(&mut self, slot: u32) {
        let busy = [Op::Send, Op::PollOut, Op::Prefetch];
        if busy.iter().any(|&op| self.io.in_flight(slot, op)) {
            return;
        }
        let (now, lim) = (self.now, self.lim.sub);
        let Some(conn) = self.conns.get(slot) else {
            return;
        };
        let fd = conn.fd.as_raw_fd();
        let tls = conn.tls.is_some();
        let State::Sub(sub) = &mut conn.state else {
            return;
        };
        if conn.closing {
            return;
        }
        let m = &self.shared.metrics[self.id];
        let log = self.hub.log(sub.key.0);
        match sub.refill(log, &lim, &mut self.read_scratch) {
            Some(Ended::Lagging) => m.lagging_closes_total.fetch_add(1, Relaxed),
            Some(Ended::Truncated) => m.truncated_closes_total.fetch_add(1, Relaxed),
            None => 0,
        };
        if let Some(c) = sub.cold_run(log.active_segment(), &lim, sys::resident) {
            // Replaying cold history: read it ahead through the ring first, so the send does
            // not fault the pages in on the reactor thread.
            m.prefetches_total.fetch_add(1, Relaxed);
            let (file, at) = (c.slice.file().as_raw_fd(), c.slice.file_offset());
            return self.io.prefetch(slot, file, at + c.off as u64, c.len);
        }
        match sub.next_send(now, &lim) {
            Next::Send(v) if tls => self.tls_send_sub(slot, v),
            Next::Send(v) => self.io.send_vectored(slot, fd, v),
            Next::Close => self.close_conn(slot),
            Next::Idle => {}
        }
    }

    pub(super) fn on_sub_sent(&mut self, slot: u32, res: i32, v: Box<Vectored>) {
        let (now, lim) = (self.now, self.lim.sub);
        let conn = self.conn(slot);
        let fd = conn.fd.as_raw_fd();
        let State::Sub(sub) = &mut conn.state else {
            unreachable!("a vectored send belongs to a subscriber");
        };
        let n = res.max(0) as u64;
        if let Some(k) = conn.tls.as_mut().and_then(|t| t.s.kernel()) {
            k.taken(n);
            if res < 0 {
                k.send_failed(); // before any reading (here or at the close)
            }
        }
        let outq = if sub.outq_due(now, &lim) {
            super::tls::outq_plain(conn.fd.as_fd(), &mut conn.tls, false)
        } else {
            None
        };
        let sent = sub.on_sent(v, n, outq);
        if res < 0 {
            return self.close_conn(slot);
        }
        super::requests::sent(&self.shared, self.id, self.conns.live(slot), sent, now);
        if sent.partial {
            // The socket is above TCP_NOTSENT_LOWAT: wait until it drains below it; the rest
            // of the backlog stays in the log meanwhile.
            self.io.poll_out(slot, fd);
        } else {
            self.pump(slot);
        }
    }

    pub(super) fn on_tx_timestamp(&mut self, slot: u32, res: i32, flags: u32, more: bool) {
        let conn = self.conns.live(slot);
        let fd = conn.fd.as_raw_fd();
        let State::Sub(sub) = &mut conn.state else {
            return;
        };
        let m = &self.shared.metrics[self.id];
        match sub.on_tx_timestamp(res, flags) {
            // Not supported on this socket/kernel (or the command ended): SIOCOUTQ from now on.
            TxReport::Fallback => {
                m.outq_fallbacks_total.fetch_add(1, Relaxed);
                return;
            }
            TxReport::Ack(c) => {
                m.tx_ack_timestamps_total.fetch_add(1, Relaxed);
                count_confirmed(m, c);
            }
            TxReport::Other => {}
        }
        if !more {
            self.io.tx_timestamps(slot, fd);
        }
    }
}
