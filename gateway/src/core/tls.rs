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

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering::Relaxed;

use zeroize::Zeroizing;

use super::{Core, State};
use crate::config::TlsKernel;
use crate::sys;
use crate::tls::kernel::{self, CryptoInfo, KernelTx};
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

/// What a subscriber's window counts as sent but not yet ACKed (`SIOCOUTQ` in the clear):
/// through the session's ciphertext map for a TLS connection, from a kernel reading for kernel
/// TLS — which needs no send in flight (`send_in_flight`: `None` then). `None`: no reading.
pub(super) fn outq_plain(
    fd: BorrowedFd<'_>,
    tls: &mut Option<Box<Tls>>,
    send_in_flight: bool,
) -> Option<u64> {
    let Some(t) = tls else {
        return sys::outq_bytes(fd).ok();
    };
    let Some(k) = t.s.kernel() else {
        let q = sys::outq_bytes(fd).ok()?;
        return Some(t.s.map.plain_outq(q));
    };
    if send_in_flight {
        return None;
    }
    // In this order (tls/kernel.rs): the record count, then the ACKed bytes, then SIOCOUTQ.
    let rec_seq = kernel_rec_seq(fd, k);
    let bytes_acked = sys::tcp_bytes_acked(fd).ok()?;
    let outq = sys::outq_bytes(fd).ok()?;
    Some(k.on_reading(kernel::Reading {
        rec_seq,
        bytes_acked,
        outq,
    }))
}

/// The kernel's record sequence number for a kernel TLS connection's transmit keys.
fn kernel_rec_seq(fd: BorrowedFd<'_>, k: &KernelTx) -> Option<u64> {
    // The answer carries the key too: wiped when dropped.
    let mut buf = Zeroizing::new(vec![0u8; k.info_len()]);
    let n = sys::getsockopt_bytes(fd, libc::SOL_TLS, kernel::TLS_TX, &mut buf).ok()?;
    k.rec_seq_of(&buf[..n])
}

/// Why the kernel did not take (or cannot serve) a subscriber's keys.
#[derive(Debug)]
enum Refusal {
    /// No `tls` ULP (ENOENT): the kernel has no TLS; ask no more.
    NoUlp,
    /// The kernel refuses this key form (`CryptoInfo::form_bit`), or took it but cannot
    /// answer its record count: ask no more for that form.
    Form(u8),
    /// Anything else (this connection only): its byte counts disagreed with ours, or a call
    /// failed.
    Other,
}

/// Hands `info` to the kernel on `fd`, which has written `written` ciphertext bytes so far.
fn to_kernel(fd: BorrowedFd<'_>, info: &CryptoInfo, written: u64) -> Result<(), Refusal> {
    // The accounting counts in the kernel's bytes (`tcpi_bytes_acked` + `SIOCOUTQ`): they must
    // be ours. An ACK between the two reads makes them disagree for a moment: read again.
    let agree = (0..3).any(|_| {
        let acked = sys::tcp_bytes_acked(fd);
        let outq = sys::outq_bytes(fd);
        matches!((acked, outq), (Ok(a), Ok(q)) if a + q == written)
    });
    if !agree {
        return Err(Refusal::Other);
    }
    sys::set_tcp_ulp(fd, "tls").map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => Refusal::NoUlp,
        _ => Refusal::Other,
    })?;
    // Refused here (a version or cipher this kernel lacks), the socket keeps the ULP in its
    // pass-through state: the record layer's ciphertext goes out as before.
    sys::setsockopt_bytes(fd, libc::SOL_TLS, kernel::TLS_TX, info.as_bytes()).map_err(|e| {
        match e.raw_os_error() {
            Some(libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP) => {
                Refusal::Form(info.form_bit())
            }
            _ => Refusal::Other,
        }
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

    /// A subscriber's runs: encrypted into one batch and sent (or, with kernel TLS, sent as
    /// they are).
    pub(super) fn tls_send_sub(&mut self, slot: u32, v: Box<Vectored>) {
        let conn = self.conn(slot);
        let tls = conn.tls.as_mut().expect("a TLS connection");
        assert!(!tls.s.sending(), "one batch at a time");
        if !tls.s.sealed() && !self.tls_seal_from_now(slot) {
            return self.close_conn(slot);
        }
        let conn = self.conn(slot);
        let fd = conn.fd.as_raw_fd();
        let tls = conn.tls.as_mut().expect("a TLS connection");
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
                return self.close_conn(slot);
            }
            // The plaintext path: iovecs into the mapped log; the completion comes back as a
            // plaintext subscriber's (`on_sub_sent`).
            return self.io.send_vectored(slot, fd, v);
        }
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

    /// A subscriber's first send (no batch is being sent): its records are sealed by the
    /// kernel or by its own record layer from now on (tls/kernel.rs, tls/record.rs).
    /// `false`: close the connection (nothing was sent on it).
    fn tls_seal_from_now(&mut self, slot: u32) -> bool {
        let ask_kernel = self.shared.cfg.tls_kernel == TlsKernel::Auto;
        let refused_forms = self.shared.ktls_refused.load(Relaxed);
        let conn = self.conn(slot);
        let tls = conn.tls.as_mut().expect("a TLS connection");
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
                self.count_seal(SealFrom::Lost, Some(Refusal::Form(form)));
                return false;
            }
        }
        self.count_seal(r, refusal);
        r != SealFrom::Lost
    }

    /// Counts where a subscriber's keys went; a kernel with no TLS is asked no more.
    fn count_seal(&mut self, r: SealFrom, refusal: Option<Refusal>) {
        let m = &self.shared.metrics[self.id];
        match r {
            SealFrom::Kernel => {
                m.tls_kernel_subscribers_total.fetch_add(1, Relaxed);
                m.tls_kernel.store(1, Relaxed);
            }
            SealFrom::Sealed => {
                m.tls_record_layer_subscribers_total.fetch_add(1, Relaxed);
            }
            SealFrom::Kept | SealFrom::Lost => {}
        }
        let Some(refusal) = refusal else {
            return;
        };
        m.tls_kernel_refusals_total.fetch_add(1, Relaxed);
        let bits = match refusal {
            Refusal::NoUlp => kernel::ALL_FORMS,
            Refusal::Form(bit) => bit,
            Refusal::Other => 0,
        };
        let before = self.shared.ktls_refused.fetch_or(bits, Relaxed);
        if matches!(refusal, Refusal::NoUlp) && before != kernel::ALL_FORMS {
            for m in &self.shared.metrics {
                m.tls_kernel.store(0, Relaxed);
            }
            tracing::warn!(
                "the kernel has no TLS (TCP_ULP \"tls\": ENOENT): TLS subscribers' \
                 records are sealed by the gateway's record layer"
            );
        }
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
                    outq_plain(conn.fd.as_fd(), &mut conn.tls, false)
                } else {
                    None
                };
                let sent = sub.on_sent(v, plain, outq);
                super::counts::count_sent(&self.shared.metrics[self.id], sent);
                self.pump(slot);
            }
            Held::Nothing => match conn.state {
                State::Http(_) => self.drive_http(slot),
                State::Sub(_) => self.pump(slot),
            },
        }
    }
}
