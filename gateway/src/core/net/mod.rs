//! The connections part of a core, [`Net`]: it owns the io_uring driver, the connection table
//! (`core::conns`), the listener and its accept, per-address admission, the receives the body
//! budget deferred, and every path that only moves bytes between a connection and its socket:
//! receives, answers, a subscriber's sends, their completions and its confirmations (TX ACK
//! timestamps, the watch for hang-up). Each connection's [`Transport`](transport::Transport) —
//! plaintext or TLS, chosen once — says which way its bytes go.
//!
//! It decides nothing about requests or streams: what a connection does next is the core's,
//! told by a [`Then`] each byte-moving call returns (close it, poll its HTTP machine, pump its
//! subscriber), so `Net` never calls back into the core.

mod accept;
mod complete;
mod machine;
pub(super) mod tick;
mod tls;
pub(super) mod transport;

use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::conns::{Conn, Conns, State};
use super::counts::count_confirmed;
use super::{Handoff, Shared};
use crate::metrics::CoreMetrics;
use crate::proto::http;
use crate::streams::hub::SubRef;
use crate::streams::sub::{AckMode, SubLimits, TxReport};
use crate::sys;
use crate::uring::{Driver, Op, SendMem, Vectored};
use transport::{Transport, outq_plain};

/// What the core does next with a connection whose bytes `Net` just moved.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Then {
    /// Nothing now: a completion continues it.
    Wait,
    /// Close it (`Core::close_conn`: the subscriber registry, parking and the MCP front hear).
    Close,
    /// Poll its HTTP machine (`Core::drive_http`).
    Drive,
    /// Move its subscriber forward (`Core::pump`).
    Pump,
}

/// A core's connections and the driver their bytes go through.
#[derive(Debug)]
pub(super) struct Net {
    pub(super) io: Driver,
    pub(super) conns: Conns,
    /// The listener (`None` once shutting down: its multishot accept is cancelled).
    listener: Option<std::os::fd::OwnedFd>,
    /// The multishot accept ended on an error; re-armed by the next tick.
    accept_paused: bool,
    /// Receives not armed because `--request-buffer-bytes-max` was reached: retried at the
    /// tick and whenever buffer bytes are released.
    deferred_recvs: Vec<SubRef>,
    /// `BodyBudget::gives` when the deferred receives were last retried.
    deferred_gives: u64,
    /// Retrying deferred receives (a re-deferral is not counted again).
    retrying: bool,
    shared: Arc<Shared>,
    id: usize,
    sub_lim: SubLimits,
    /// The turn's clock (set by the loop after each wait).
    pub(super) now: Instant,
    /// The core is shutting down: no accepts, answers close their connections.
    pub(super) shutting_down: bool,
}

impl Net {
    pub(super) fn new(
        io: Driver,
        listener: Option<std::os::fd::OwnedFd>,
        shared: Arc<Shared>,
        id: usize,
        sub_lim: SubLimits,
        now: Instant,
    ) -> Net {
        Net {
            io,
            conns: Conns::default(),
            listener,
            accept_paused: false,
            deferred_recvs: Vec::new(),
            deferred_gives: 0,
            retrying: false,
            shared,
            id,
            sub_lim,
            now,
            shutting_down: false,
        }
    }

    fn m(&self) -> &CoreMetrics {
        &self.shared.metrics[self.id]
    }

    /// The live connection on `slot` if it is still generation `generation`.
    pub(super) fn conn_at(&mut self, (slot, generation): SubRef) -> Option<&mut Conn> {
        self.conns.at((slot, generation), self.io.generation(slot))
    }

    /// The connection on `slot`, which must be live.
    pub(super) fn conn(&mut self, slot: u32) -> &mut Conn {
        self.conns.live(slot)
    }

    // ---- answers ----

    /// Queues an answer that is ready now (behind any earlier ones).
    pub(super) fn answer(&mut self, slot: u32, bytes: Vec<u8>, close: bool) {
        if let State::Http(h) = &mut self.conn(slot).state {
            h.answer(bytes, None, close);
        }
    }

    /// Queues an answer and sends what is ready.
    pub(super) fn respond(&mut self, slot: u32, bytes: Vec<u8>, close: bool) {
        self.answer(slot, bytes, close);
        self.flush(slot);
    }

    pub(super) fn error(&mut self, slot: u32, status: u16, code: &str, msg: &str, close: bool) {
        self.answer(slot, http::error_response(status, code, msg, close), close);
    }

    /// Sends what the machine has ready, unless a send is in flight.
    pub(super) fn flush(&mut self, slot: u32) {
        let c = self.conns.live(slot);
        let fd = c.fd.as_raw_fd();
        if c.closing {
            return;
        }
        match &c.transport {
            Transport::Tls(_) => self.tls_flush(slot),
            Transport::Plain => {
                if let State::Http(h) = &mut c.state
                    && let Some((buf, from)) = h.poll_transmit()
                {
                    self.io.send(slot, fd, buf, from);
                }
            }
        }
        super::requests::answered(&self.shared, self.id, self.now, self.conns.live(slot));
    }

    // ---- receives ----

    /// The HTTP machine's `Step::Recv`: `Then::Drive` if plaintext was already waiting (poll
    /// the machine again); otherwise a receive is armed (or the connection must close).
    pub(super) fn want_plain(&mut self, slot: u32, buf: Vec<u8>, from: usize) -> Then {
        let c = self.conns.live(slot);
        match &c.transport {
            Transport::Tls(_) => self.tls_want_plain(slot, buf, from),
            Transport::Plain => {
                let fd = c.fd.as_raw_fd();
                self.io.recv(slot, fd, buf, from);
                Then::Wait
            }
        }
    }

    /// A receive completed.
    pub(super) fn on_recv(&mut self, slot: u32, res: i32, buf: Vec<u8>) -> Then {
        if let Transport::Tls(_) = self.conn(slot).transport {
            return self.on_tls_recv(slot, res, buf);
        }
        if res == 0 {
            return self.on_peer_done(slot, buf);
        }
        if res < 0 {
            return Then::Close;
        }
        let now = self.now;
        match &mut self.conn(slot).state {
            State::Http(h) => h.on_recv(buf, res as usize, now),
            // Cannot happen (a request is taken only with no receive out); kept total: the
            // bytes are dropped and the subscriber is watched for hang-up.
            State::Sub(_) => {
                self.arm_watch(slot);
                return Then::Wait;
            }
        }
        Then::Drive
    }

    /// The peer ended its sending side (a FIN; over TLS its `close_notify`, or a FIN) while
    /// the HTTP machine waited for more, with `buf` its receive buffer: what it sent is
    /// answered first, as on both transports alike, then the connection closes (TLS 1.3 lets
    /// a side send after the peer's `close_notify`). `Then::Close` now if nothing is left to
    /// send; otherwise the last answer's send completion closes it.
    fn on_peer_done(&mut self, slot: u32, buf: Vec<u8>) -> Then {
        let State::Http(h) = &mut self.conn(slot).state else {
            return Then::Close;
        };
        if h.close_after_answers(buf) {
            Then::Wait
        } else {
            Then::Close
        }
    }

    // ---- sends ----

    /// A send completed: an answer's buffer, a TLS batch, or a subscriber's runs.
    pub(super) fn on_sent(&mut self, slot: u32, res: i32, mem: SendMem) -> Then {
        match mem {
            SendMem::Vectored(v) => self.on_sub_sent(slot, res, v),
            SendMem::Buf(buf) => match self.conn(slot).transport {
                Transport::Tls(_) => self.on_tls_sent(slot, res, buf),
                Transport::Plain => self.on_http_sent(slot, res, buf),
            },
        }
    }

    fn on_http_sent(&mut self, slot: u32, res: i32, buf: Vec<u8>) -> Then {
        if res < 0 {
            return Then::Close;
        }
        let (now, shutting_down) = (self.now, self.shutting_down);
        let State::Http(h) = &mut self.conn(slot).state else {
            unreachable!("a buffer send belongs to an HTTP connection");
        };
        h.on_sent(buf, res as usize, now);
        if h.done(shutting_down) {
            return Then::Close;
        }
        // The rest of a partial send, the next answers, and pipelined requests.
        Then::Drive
    }

    /// A subscriber's runs go out: as they are, or sealed into one TLS batch.
    pub(super) fn send_sub(&mut self, slot: u32, v: Box<Vectored>) -> Then {
        let c = self.conns.live(slot);
        match &c.transport {
            Transport::Tls(_) => self.tls_send_sub(slot, v),
            Transport::Plain => {
                let fd = c.fd.as_raw_fd();
                self.io.send_vectored(slot, fd, v);
                Then::Wait
            }
        }
    }

    /// A vectored send completed (plaintext, or kernel TLS: the kernel seals the records).
    fn on_sub_sent(&mut self, slot: u32, res: i32, v: Box<Vectored>) -> Then {
        let (now, lim) = (self.now, self.sub_lim);
        let conn = self.conns.live(slot);
        let fd = conn.fd.as_raw_fd();
        let State::Sub(sub) = &mut conn.state else {
            unreachable!("a vectored send belongs to a subscriber");
        };
        let n = res.max(0) as u64;
        if let Some(k) = conn.transport.kernel() {
            k.taken(n);
            if res < 0 {
                k.send_failed(); // before any reading (here or at the close)
            }
        }
        let outq = if sub.outq_due(now, &lim) {
            outq_plain(conn.fd.as_fd(), &mut conn.transport, false)
        } else {
            None
        };
        let sent = sub.on_sent(v, n, outq);
        if res < 0 {
            return Then::Close;
        }
        super::requests::sent(&self.shared, self.id, self.conns.live(slot), sent, now);
        if sent.partial {
            // The socket is above TCP_NOTSENT_LOWAT: wait until it drains below it; the rest
            // of the backlog stays in the log meanwhile.
            self.io.poll_out(slot, fd);
            return Then::Wait;
        }
        Then::Pump
    }

    // ---- subscribers ----

    /// The socket side of a connection becoming a subscriber: `TCP_NOTSENT_LOWAT`, and TX ACK
    /// timestamps if asked (`want_ts`) and the kernel's bytes are the window's. Returns how
    /// the subscriber is to confirm.
    pub(super) fn subscriber_socket(&mut self, slot: u32, want_ts: bool) -> AckMode {
        let lowat = self.shared.cfg.notsent_lowat_bytes;
        let conn = self.conns.live(slot);
        let _ = sys::set_notsent_lowat(conn.fd.as_fd(), lowat);
        // Byte 0 of the window is the first byte written after this option is set: nothing is
        // in flight on this connection now (a request is taken over only with its answers sent).
        // TLS: the kernel's byte counts are ciphertext; SIOCOUTQ goes through the session's
        // ciphertext map (net/transport.rs), TX timestamps are not used.
        let want_ts = want_ts && conn.transport.kernel_counts_plain();
        if want_ts && sys::enable_tx_ack_timestamps(conn.fd.as_fd()).is_ok() {
            AckMode::TxTimestamps
        } else {
            AckMode::Outq
        }
    }

    /// A new subscriber's operations: its TX timestamps (with `ack`) and its watch; it reads
    /// nothing more (a TLS receive buffer goes).
    pub(super) fn watch_subscriber(&mut self, slot: u32, ack: AckMode) {
        let conn = self.conns.live(slot);
        conn.transport.stop_reading();
        let fd = conn.fd.as_raw_fd();
        if ack == AckMode::TxTimestamps {
            self.io.tx_timestamps(slot, fd);
        }
        self.arm_watch(slot);
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
        let c = self.conns.live(slot);
        let fd = c.fd.as_raw_fd();
        if c.closing || self.io.in_flight(slot, Op::Watch) || self.io.in_flight(slot, Op::Recv) {
            return;
        }
        self.io.watch(slot, fd);
    }

    /// A subscriber's watch fired: hang-up or reset closes; input is read and dropped (a
    /// subscriber has nothing more to say); an error-queue wake (a TX timestamp) is ignored.
    pub(super) fn on_watch(&mut self, slot: u32, res: i32, more: bool) -> Then {
        if res < 0 {
            return Then::Close;
        }
        let mask = res as u32 as i16;
        if mask & (libc::POLLHUP | libc::POLLRDHUP) != 0 {
            return Then::Close;
        }
        let fd = self.conn(slot).fd.as_fd();
        if mask & libc::POLLIN != 0 && sys::discard_input(fd) == sys::Input::Gone {
            return Then::Close;
        }
        // Ended without F_MORE (e.g. a full completion queue ends multishot polls): re-arm.
        if !more {
            self.arm_watch(slot);
        }
        Then::Wait
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

    // ---- leaving ----

    /// Moves the connection to core `owner` with the bytes it received — once the TLS
    /// session's own bytes (its last handshake flight, tickets) are out, if they are going out.
    pub(super) fn hand_off_when_sent(&mut self, slot: u32, owner: usize, bytes: Vec<u8>) {
        if let Transport::Tls(t) = &mut self.conn(slot).transport
            && t.s.sending()
        {
            t.handoff = Some((owner, bytes));
            return;
        }
        self.hand_off(slot, owner, bytes);
    }

    /// Moves the connection to core `owner` with the bytes it received.
    fn hand_off(&mut self, slot: u32, owner: usize, bytes: Vec<u8>) {
        assert!(
            !self.io.owning_in_flight(slot),
            "a handed-off connection has no operation in flight"
        );
        let conn = self.conns.take(slot);
        self.io.close_slot(slot);
        self.m().connections.fetch_sub(1, Relaxed);
        self.m().handoffs_out_total.fetch_add(1, Relaxed);
        let h = Handoff {
            fd: conn.fd,
            bytes,
            peer: conn.peer,
            tls: conn.transport.into_session(),
        };
        if let Err(e) = self.shared.handoff_tx[owner].send(h) {
            // The owner is gone (shutting down): the fd is dropped, which closes it.
            self.shared.connections.fetch_sub(1, Relaxed);
            self.release_peer(e.0.peer);
            return;
        }
        sys::eventfd_wake(self.shared.eventfds[owner].as_fd());
    }

    /// A closing subscriber's window tightened to what the peer confirmed: ACKs whose
    /// timestamp completions are not reaped yet are read by `SIOCOUTQ` (write_seq - snd_una,
    /// still meaningful after a reset; through the transport), so a parked head is as exact
    /// as the kernel knows it.
    pub(super) fn confirm_at_close(&mut self, slot: u32) {
        let send_in_flight = self.io.in_flight(slot, Op::Send);
        let conn = self.conns.live(slot);
        if let State::Sub(sub) = &mut conn.state
            && let Some(q) = outq_plain(conn.fd.as_fd(), &mut conn.transport, send_in_flight)
        {
            count_confirmed(&self.shared.metrics[self.id], sub.confirm_outq(q));
        }
    }

    /// The socket side of closing (the core has marked the connection closing): shut down,
    /// every operation in flight cancelled, freed once none owns memory.
    pub(super) fn shut(&mut self, slot: u32) {
        sys::shutdown(self.conn(slot).fd.as_fd());
        self.io.cancel_slot(slot);
        self.maybe_free(slot);
    }

    /// Closes the fd and frees the slot of a closing connection once nothing that owns its
    /// memory is in flight.
    pub(super) fn maybe_free(&mut self, slot: u32) {
        let conn = self.conns.live(slot);
        if !conn.closing || self.io.owning_in_flight(slot) {
            return;
        }
        let conn = self.conns.take(slot);
        self.release_peer(conn.peer);
        drop(conn); // closes the fd
        self.io.close_slot(slot);
        self.shared.connections.fetch_sub(1, Relaxed);
        self.m().connections.fetch_sub(1, Relaxed);
    }
}
