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

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering::Relaxed;

use super::{Core, State};
use crate::sys;
use crate::tls::{CIPHER_RECV_BYTES, SealFrom, TlsConn};
use crate::uring::{Op, Vectored};

/// A connection's TLS state on its core.
#[derive(Debug)]
pub(super) struct Tls {
    pub s: Box<TlsConn>,
    /// The connection machine's receive buffer waiting for plaintext (`Step::Recv`).
    plain: Option<(Vec<u8>, usize)>,
    /// The ciphertext receive buffer (`None` while a receive holds it).
    crecv: Option<Vec<u8>>,
    /// What the batch being sent carries.
    held: Held,
    /// Close once the batch being sent (an alert) is out.
    close_after_send: bool,
    /// The handshake completion was counted.
    counted: bool,
    /// A handoff to another core waiting for the batch being sent: (core, bytes received).
    pub handoff: Option<(usize, Vec<u8>)>,
}

#[derive(Debug)]
enum Held {
    Nothing,
    Http(Vec<u8>),
    Sub(Box<Vectored>),
}

impl Tls {
    /// The session alone, to move to another core (nothing may be in flight).
    pub fn into_session(self) -> Box<TlsConn> {
        assert!(
            self.plain.is_none() && !self.s.sending() && self.handoff.is_none(),
            "a TLS connection is handed off with nothing in flight"
        );
        self.s
    }

    /// The connection reads nothing more (a subscriber): the ciphertext receive buffer goes.
    pub fn stop_reading(&mut self) {
        self.crecv = None;
    }

    pub fn new(s: Box<TlsConn>) -> Tls {
        Tls {
            s,
            plain: None,
            crecv: None,
            held: Held::Nothing,
            close_after_send: false,
            counted: false,
            handoff: None,
        }
    }
}

/// `SIOCOUTQ` of a subscriber as its window counts it: ciphertext turned into plaintext for a
/// TLS connection.
pub(super) fn outq_plain(fd: BorrowedFd<'_>, tls: &mut Option<Box<Tls>>) -> Option<u64> {
    let q = sys::outq_bytes(fd).ok()?;
    Some(match tls {
        Some(t) => t.s.map.plain_outq(q),
        None => q,
    })
}

impl Core {
    /// `Step::Recv` of a TLS connection: plaintext already decrypted goes into `buf` at once
    /// (true: poll the machine again); otherwise the buffer waits and ciphertext is received.
    pub(super) fn tls_want_plain(&mut self, slot: u32, mut buf: Vec<u8>, from: usize) -> bool {
        let now = self.now;
        let conn = self.conn(slot);
        let tls = conn.tls.as_mut().expect("a TLS connection");
        let n = tls.s.read_plain(&mut buf[from..]);
        if n > 0 {
            if let State::Http(h) = &mut conn.state {
                h.on_recv(buf, n, now);
            }
            // Ciphertext rustls refused while its plaintext buffer was full goes in now.
            if tls.s.feed().is_err() {
                self.tls_failed(slot);
                return false;
            }
            return true;
        }
        if tls.s.eof {
            self.close_conn(slot);
            return false;
        }
        tls.plain = Some((buf, from));
        self.tls_arm_recv(slot);
        false
    }

    /// Receives ciphertext unless a receive is out or rustls still holds some back.
    fn tls_arm_recv(&mut self, slot: u32) {
        if self.io.in_flight(slot, Op::Recv) {
            return;
        }
        let conn = self.conn(slot);
        let fd = conn.fd.as_raw_fd();
        let tls = conn.tls.as_mut().expect("a TLS connection");
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
    pub(super) fn on_tls_recv(&mut self, slot: u32, res: i32, buf: Vec<u8>) {
        if res <= 0 {
            return self.close_conn(slot);
        }
        let conn = self.conn(slot);
        let tls = conn.tls.as_mut().expect("a TLS connection");
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
        let tls = self.conn(slot).tls.as_mut().expect("a TLS connection");
        // A subscriber reads nothing more; anything else re-arms when it wants plaintext.
        if let Some((b, from)) = tls.plain.take()
            && self.tls_want_plain(slot, b, from)
        {
            self.drive_http(slot);
        }
    }

    /// A protocol error (plaintext HTTP or garbage on the TLS port, a bad handshake): the
    /// alert rustls queued goes out, then the connection closes.
    fn tls_failed(&mut self, slot: u32) {
        self.m().tls_handshake_failures_total.fetch_add(1, Relaxed);
        let tls = self.conn(slot).tls.as_mut().expect("a TLS connection");
        tls.close_after_send = true;
        tls.s.eof = true;
        tls.plain = None;
        self.flush(slot);
        if !self.io.in_flight(slot, Op::Send) {
            self.close_conn(slot);
        }
    }

    /// Sends the next ciphertext batch if none is being sent: an HTTP answer's bytes, or
    /// whatever the session has to say on its own (handshake, alerts).
    pub(super) fn tls_flush(&mut self, slot: u32) {
        let conn = self.conn(slot);
        let fd = conn.fd.as_raw_fd();
        let tls = conn.tls.as_mut().expect("a TLS connection");
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

    /// A subscriber's runs: encrypted into one batch and sent.
    pub(super) fn tls_send_sub(&mut self, slot: u32, v: Box<Vectored>) {
        let conn = self.conn(slot);
        let fd = conn.fd.as_raw_fd();
        let tls = conn.tls.as_mut().expect("a TLS connection");
        assert!(!tls.s.sending(), "one batch at a time");
        if !tls.s.sealed() {
            // A subscriber's first send (no batch is being sent): its records are sealed by
            // its own record layer from now on, straight into its batches (tls/record.rs).
            match tls.s.seal_from_now() {
                SealFrom::Sealed => {
                    self.shared.metrics[self.id]
                        .tls_record_layer_subscribers_total
                        .fetch_add(1, Relaxed);
                }
                SealFrom::Kept => {}
                SealFrom::Lost => return self.close_conn(slot),
            }
        }
        let conn = self.conn(slot);
        let tls = conn.tls.as_mut().expect("a TLS connection");
        let Ok(plain) = tls.s.encrypt(v.run_slices()) else {
            // The key sealed as many records as it may: end the stream (the client resumes
            // on a new connection with its Last-Event-ID; nothing of this send went out).
            self.m()
                .tls_key_exhausted_closes_total
                .fetch_add(1, Relaxed);
            return self.close_conn(slot);
        };
        tls.held = Held::Sub(v);
        let (buf, off) = tls
            .s
            .poll_send(plain as u64)
            .expect("encrypted application data is ready to send");
        self.io.send(slot, fd, buf, off);
    }

    /// The kernel took `res` bytes of a ciphertext batch.
    pub(super) fn on_tls_sent(&mut self, slot: u32, res: i32, buf: Vec<u8>) {
        if res < 0 {
            return self.close_conn(slot);
        }
        let (now, shutting_down) = (self.now, self.shutting_down.is_some());
        let lim = self.lim.sub;
        let conn = self.conn(slot);
        let fd = conn.fd.as_raw_fd();
        let tls = conn.tls.as_mut().expect("a TLS connection");
        let plain = match tls.s.on_sent(buf, res as usize) {
            Ok(p) => p,
            Err((buf, off)) => return self.io.send(slot, fd, buf, off),
        };
        if tls.close_after_send {
            return self.close_conn(slot);
        }
        if let Some((owner, bytes)) = tls.handoff.take() {
            return self.hand_off(slot, owner, bytes);
        }
        match std::mem::replace(&mut tls.held, Held::Nothing) {
            Held::Http(b) => {
                let State::Http(h) = &mut conn.state else {
                    unreachable!("an answer's batch belongs to an HTTP connection")
                };
                h.on_sent(b, plain as usize, now);
                if h.done(shutting_down) {
                    return self.close_conn(slot);
                }
                self.drive_http(slot);
            }
            Held::Sub(v) => {
                let State::Sub(sub) = &mut conn.state else {
                    unreachable!("a subscriber's batch belongs to a subscriber")
                };
                let outq = if sub.outq_due(now, &lim) {
                    outq_plain(conn.fd.as_fd(), &mut conn.tls)
                } else {
                    None
                };
                let sent = sub.on_sent(v, plain, outq);
                super::subs::count_sent(&self.shared.metrics[self.id], sent);
                self.pump(slot);
            }
            Held::Nothing => match conn.state {
                State::Http(_) => self.drive_http(slot),
                State::Sub(_) => self.pump(slot),
            },
        }
    }
}
