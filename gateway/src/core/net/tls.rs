//! TLS connections on a core: the ciphertext side of the driver's receives and sends, around
//! the same connection machine and subscriber windows as plaintext connections.
//!
//! - Receive: the machine's buffer (`Step::Recv`) waits in [`Tls::plain`] while ciphertext is
//!   received into the session's own buffer; decrypted plaintext is copied into it.
//! - Send: one ciphertext batch at a time. An HTTP answer's bytes, or a subscriber's runs
//!   (straight from the mapped log), are encrypted into the batch; the machine's buffer or the
//!   subscriber's send memory is held until the kernel has taken the whole batch, then handed
//!   back as sent. A partial send re-sends the rest of the batch (records cannot be dropped).
//! - ACKs: a TLS subscriber confirms by `SIOCOUTQ` (ciphertext not yet ACKed), turned into
//!   plaintext by the session's [`CipherMap`](crate::tls::map::CipherMap): an event is
//!   confirmed only once the last ciphertext byte of the batch holding its end is ACKed.
//! - Kernel TLS (`--tls-kernel auto`): at a subscriber's first send its transmit keys go to
//!   the kernel if it takes them; its sends are then the plaintext path's (iovecs into the
//!   mapped log), and it confirms by the kernel's record count and byte counts
//!   ([`KernelTx`](crate::tls::kernel::KernelTx)).

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering::Relaxed;

use super::transport::{
    Held, Refusal, Tls, Transport, count_seal, kernel_rec_seq, outq_plain, to_kernel,
};
use super::{Net, Then};
use crate::config::TlsKernel;
use crate::core::conns::State;
use crate::tls::CIPHER_RECV_BYTES;
use crate::tls::SealFrom;
use crate::uring::{Op, Vectored};

/// The TLS state of a connection whose transport is TLS.
fn tls_of(transport: &mut Transport) -> &mut Tls {
    match transport {
        Transport::Tls(t) => t,
        Transport::Plain => unreachable!("a TLS connection"),
    }
}

impl Net {
    /// `Step::Recv` of a TLS connection: plaintext already decrypted goes into `buf` at once
    /// (`Then::Drive`: poll the machine again); otherwise the buffer waits and ciphertext is
    /// received.
    pub(super) fn tls_want_plain(&mut self, slot: u32, mut buf: Vec<u8>, from: usize) -> Then {
        let now = self.now;
        let conn = self.conn(slot);
        let tls = tls_of(&mut conn.transport);
        let n = tls.s.read_plain(&mut buf[from..]);
        if n > 0 {
            if let State::Http(h) = &mut conn.state {
                h.on_recv(buf, n, now);
            }
            // Ciphertext rustls refused while its plaintext buffer was full goes in now.
            if tls.s.feed().is_err() {
                return self.tls_failed(slot);
            }
            return Then::Drive;
        }
        if tls.s.eof && !tls.close_after_send {
            // The peer's close_notify (a failed session closes after its alert instead).
            return self.on_peer_done(slot, buf);
        }
        if tls.s.eof {
            return Then::Close;
        }
        tls.plain = Some((buf, from));
        self.tls_arm_recv(slot);
        Then::Wait
    }

    /// Receives ciphertext unless a receive is out or rustls still holds some back.
    fn tls_arm_recv(&mut self, slot: u32) {
        if self.io.in_flight(slot, Op::Recv) {
            return;
        }
        let conn = self.conn(slot);
        let fd = conn.fd.as_raw_fd();
        let tls = tls_of(&mut conn.transport);
        if tls.s.backlog() || tls.s.eof {
            return;
        }
        let buf = tls
            .crecv
            .take()
            .unwrap_or_else(|| vec![0; CIPHER_RECV_BYTES]);
        self.io.recv(slot, fd, buf, 0);
    }

    /// Ciphertext arrived.
    pub(super) fn on_tls_recv(&mut self, slot: u32, res: i32, buf: Vec<u8>) -> Then {
        let conn = self.conn(slot);
        let tls = tls_of(&mut conn.transport);
        if res == 0
            && let Some((plain, _)) = tls.plain.take()
        {
            // A FIN without close_notify: only complete requests were parsed, so none can be
            // truncated; what came is answered as over plaintext.
            tls.s.eof = true;
            tls.crecv = Some(buf);
            return self.on_peer_done(slot, plain);
        }
        if res <= 0 {
            return Then::Close;
        }
        let r = tls.s.on_cipher(&buf[..res as usize]);
        tls.crecv = Some(buf);
        if r.is_err() {
            return self.tls_failed(slot);
        }
        if !tls.counted && tls.s.established() {
            tls.counted = true;
            self.m().tls_handshakes_total.fetch_add(1, Relaxed);
        }
        self.flush(slot); // the handshake's flight, tickets, or waiting answers
        let tls = tls_of(&mut self.conn(slot).transport);
        // A subscriber reads nothing more; anything else re-arms when it wants plaintext.
        match tls.plain.take() {
            Some((b, from)) => self.tls_want_plain(slot, b, from),
            None => Then::Wait,
        }
    }

    /// A protocol error (plaintext HTTP or garbage on the TLS port, a bad handshake): the
    /// alert rustls queued goes out, then the connection closes.
    fn tls_failed(&mut self, slot: u32) -> Then {
        self.m().tls_handshake_failures_total.fetch_add(1, Relaxed);
        let tls = tls_of(&mut self.conn(slot).transport);
        tls.close_after_send = true;
        tls.s.eof = true;
        tls.plain = None;
        self.flush(slot);
        if self.io.in_flight(slot, Op::Send) {
            return Then::Wait;
        }
        Then::Close
    }

    /// Sends the next ciphertext batch if none is being sent: an HTTP answer's bytes, or
    /// whatever the session has to say on its own (handshake, alerts).
    pub(super) fn tls_flush(&mut self, slot: u32) {
        let conn = self.conn(slot);
        let fd = conn.fd.as_raw_fd();
        let tls = tls_of(&mut conn.transport);
        if tls.s.sending() {
            return;
        }
        let mut plain = 0;
        if tls.s.established()
            && !tls.close_after_send
            && let State::Http(h) = &mut conn.state
            && let Some((buf, from)) = h.poll_transmit()
        {
            debug_assert!(!tls.s.sealed(), "only subscribers seal their own records");
            plain = tls
                .s
                .encrypt(std::iter::once(&buf[from..]))
                .expect("an answer is sealed by rustls, which takes any amount");
            tls.held = Held::Http(buf);
        }
        if let Some((buf, off)) = tls.s.poll_send(plain as u64) {
            self.io.send(slot, fd, buf, off);
        }
    }

    /// A subscriber's runs: encrypted into one batch and sent (or, with kernel TLS, sent as
    /// they are).
    pub(super) fn tls_send_sub(&mut self, slot: u32, v: Box<Vectored>) -> Then {
        let conn = self.conn(slot);
        let tls = tls_of(&mut conn.transport);
        assert!(!tls.s.sending(), "one batch at a time");
        if !tls.s.sealed() && !self.tls_seal_from_now(slot) {
            return Then::Close;
        }
        let conn = self.conn(slot);
        let fd = conn.fd.as_raw_fd();
        let tls = tls_of(&mut conn.transport);
        if let Some(k) = tls.s.kernel() {
            let len = v.len();
            if !k.may_send(len)
                && let Some(seq) = kernel_rec_seq(conn.fd.as_fd(), k)
            {
                k.on_rec_seq(seq);
            }
            if !k.may_send(len) {
                // The key may seal no more records: end the stream (as below).
                self.m()
                    .tls_key_exhausted_closes_total
                    .fetch_add(1, Relaxed);
                return Then::Close;
            }
            // The plaintext path: iovecs into the mapped log; the completion comes back as a
            // plaintext subscriber's (`on_sub_sent`).
            self.io.send_vectored(slot, fd, v);
            return Then::Wait;
        }
        let Ok(plain) = tls.s.encrypt(v.run_slices()) else {
            // The key sealed as many records as it may: end the stream (the client resumes
            // on a new connection with its Last-Event-ID; nothing of this send went out).
            self.m()
                .tls_key_exhausted_closes_total
                .fetch_add(1, Relaxed);
            return Then::Close;
        };
        tls.held = Held::Sub(v);
        let (buf, off) = tls
            .s
            .poll_send(plain as u64)
            .expect("encrypted application data is ready to send");
        self.io.send(slot, fd, buf, off);
        Then::Wait
    }

    /// A subscriber's first send (no batch is being sent): its records are sealed by the
    /// kernel or by its own record layer from now on (tls/kernel.rs, tls/record.rs).
    /// `false`: close the connection (nothing was sent on it).
    fn tls_seal_from_now(&mut self, slot: u32) -> bool {
        let ask_kernel = self.shared.cfg.tls_kernel == TlsKernel::Auto;
        let refused_forms = self.shared.ktls_refused.load(Relaxed);
        let conn = self.conn(slot);
        let tls = tls_of(&mut conn.transport);
        let mut refusal = None;
        let bfd = conn.fd.as_fd();
        let r = tls.s.seal_from_now(|info, written| {
            ask_kernel
                && refused_forms & info.form_bit() == 0
                && to_kernel(bfd, info, written)
                    .map_err(|e| refusal = Some(e))
                    .is_ok()
        });
        if r == SealFrom::Kernel {
            // Its record count must read back, or nothing it sends could be confirmed. The
            // kernel holds the keys now (the record layer cannot take over): end this
            // connection before anything is sent — the client resumes on a new one.
            let k = tls.s.kernel().expect("the kernel took the keys");
            if kernel_rec_seq(bfd, k) != Some(k.seq0()) {
                let form = k.form_bit();
                count_seal(
                    &self.shared,
                    self.id,
                    SealFrom::Lost,
                    Some(Refusal::Form(form)),
                );
                return false;
            }
        }
        count_seal(&self.shared, self.id, r, refusal);
        r != SealFrom::Lost
    }

    /// The kernel took `res` bytes of a ciphertext batch.
    pub(super) fn on_tls_sent(&mut self, slot: u32, res: i32, buf: Vec<u8>) -> Then {
        if res < 0 {
            return Then::Close;
        }
        let (now, shutting_down, lim) = (self.now, self.shutting_down, self.sub_lim);
        let conn = self.conn(slot);
        let fd = conn.fd.as_raw_fd();
        let tls = tls_of(&mut conn.transport);
        let plain = match tls.s.on_sent(buf, res as usize) {
            Ok(p) => p,
            Err((buf, off)) => {
                self.io.send(slot, fd, buf, off);
                return Then::Wait;
            }
        };
        if tls.close_after_send {
            return Then::Close;
        }
        if let Some((owner, bytes)) = tls.handoff.take() {
            self.hand_off(slot, owner, bytes);
            return Then::Wait;
        }
        match std::mem::replace(&mut tls.held, Held::Nothing) {
            Held::Http(b) => {
                let State::Http(h) = &mut conn.state else {
                    unreachable!("an answer's batch belongs to an HTTP connection")
                };
                h.on_sent(b, plain as usize, now);
                if h.done(shutting_down) {
                    return Then::Close;
                }
                Then::Drive
            }
            Held::Sub(v) => {
                let State::Sub(sub) = &mut conn.state else {
                    unreachable!("a subscriber's batch belongs to a subscriber")
                };
                let outq = if sub.outq_due(now, &lim) {
                    outq_plain(conn.fd.as_fd(), &mut conn.transport, false)
                } else {
                    None
                };
                let sent = sub.on_sent(v, plain, outq);
                crate::core::counts::count_sent(&self.shared.metrics[self.id], sent);
                Then::Pump
            }
            Held::Nothing => match conn.state {
                State::Http(_) => Then::Drive,
                State::Sub(_) => Then::Pump,
            },
        }
    }
}
