//! A connection's transport, chosen once when it is accepted (or handed over): plaintext, or
//! TLS. A TLS connection's records are sealed by rustls until a subscriber's first send; from
//! then on by the gateway's record layer (`tls::record`) or by the kernel (`tls::kernel`),
//! for good. `Net` asks the transport, in one place per operation (receive, answer, a
//! subscriber's send, a completion, a confirmation reading), which path the bytes take; no
//! handler of the core branches on TLS.
//!
//! This file holds the state and the socket readings; `net/tls.rs` the TLS paths of `Net`.

use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use crate::core::Shared;
use crate::sys;
use crate::tls::kernel::{self, CryptoInfo, KernelTx};
use crate::tls::{SealFrom, TlsConn};
use crate::uring::Vectored;

/// How a connection's bytes reach its socket, decided once per connection.
#[derive(Debug)]
pub(in crate::core) enum Transport {
    /// As they are: the machine's buffer, or a subscriber's runs straight from the mapped log.
    Plain,
    /// Through a TLS session (rustls; a subscriber's record layer or kernel TLS after its
    /// first send).
    Tls(Box<Tls>),
}

impl Transport {
    /// The transport of a connection that comes with `tls` (a session, or none: plaintext).
    pub(in crate::core) fn of(tls: Option<Box<TlsConn>>) -> Transport {
        match tls {
            None => Transport::Plain,
            Some(s) => Transport::Tls(Box::new(Tls::new(s))),
        }
    }

    /// The session alone, to move to another core with the fd (nothing may be in flight).
    pub(in crate::core) fn into_session(self) -> Option<Box<TlsConn>> {
        match self {
            Transport::Plain => None,
            Transport::Tls(t) => Some(t.into_session()),
        }
    }

    /// A TLS handshake that began at least `limit` before `now` and has not ended.
    pub(in crate::core) fn handshake_overdue(&self, now: Instant, limit: Duration) -> bool {
        match self {
            Transport::Plain => false,
            Transport::Tls(t) => !t.s.established() && now.duration_since(t.s.started()) >= limit,
        }
    }

    /// Whether the kernel's byte counts are this connection's own bytes (TX ACK timestamps
    /// then name byte offsets of the window): plaintext only.
    pub(in crate::core) fn kernel_counts_plain(&self) -> bool {
        matches!(self, Transport::Plain)
    }

    /// The connection reads nothing more (a subscriber): a TLS receive buffer goes.
    pub(in crate::core) fn stop_reading(&mut self) {
        if let Transport::Tls(t) = self {
            t.crecv = None;
        }
    }

    /// Kernel TLS's transmit side, once the kernel seals this connection's records.
    pub(in crate::core) fn kernel(&mut self) -> Option<&mut KernelTx> {
        match self {
            Transport::Plain => None,
            Transport::Tls(t) => t.s.kernel(),
        }
    }
}

/// A connection's TLS state on its core.
#[derive(Debug)]
pub(in crate::core) struct Tls {
    pub(super) s: Box<TlsConn>,
    /// The connection machine's receive buffer waiting for plaintext (`Step::Recv`).
    pub(super) plain: Option<(Vec<u8>, usize)>,
    /// The ciphertext receive buffer (`None` while a receive holds it).
    pub(super) crecv: Option<Vec<u8>>,
    /// What the batch being sent carries.
    pub(super) held: Held,
    /// Close once the batch being sent (an alert) is out.
    pub(super) close_after_send: bool,
    /// The handshake completion was counted.
    pub(super) counted: bool,
    /// A handoff to another core waiting for the batch being sent: (core, bytes received).
    pub(super) handoff: Option<(usize, Vec<u8>)>,
}

#[derive(Debug)]
pub(super) enum Held {
    Nothing,
    Http(Vec<u8>),
    Sub(Box<Vectored>),
}

impl Tls {
    /// The session alone, to move to another core (nothing may be in flight).
    fn into_session(self) -> Box<TlsConn> {
        assert!(
            self.plain.is_none() && !self.s.sending() && self.handoff.is_none(),
            "a TLS connection is handed off with nothing in flight"
        );
        self.s
    }

    fn new(s: Box<TlsConn>) -> Tls {
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
pub(in crate::core) fn outq_plain(
    fd: BorrowedFd<'_>,
    transport: &mut Transport,
    send_in_flight: bool,
) -> Option<u64> {
    let Transport::Tls(t) = transport else {
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
pub(super) fn kernel_rec_seq(fd: BorrowedFd<'_>, k: &KernelTx) -> Option<u64> {
    // The answer carries the key too: wiped when dropped.
    let mut buf = Zeroizing::new(vec![0u8; k.info_len()]);
    let n = sys::getsockopt_bytes(fd, libc::SOL_TLS, kernel::TLS_TX, &mut buf).ok()?;
    k.rec_seq_of(&buf[..n])
}

/// Why the kernel did not take (or cannot serve) a subscriber's keys.
#[derive(Debug)]
pub(super) enum Refusal {
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
pub(super) fn to_kernel(
    fd: BorrowedFd<'_>,
    info: &CryptoInfo,
    written: u64,
) -> Result<(), Refusal> {
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

/// Counts where a subscriber's keys went (on core `id`); a kernel with no TLS is asked no more.
pub(super) fn count_seal(shared: &Shared, id: usize, r: SealFrom, refusal: Option<Refusal>) {
    let m = &shared.metrics[id];
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
    let before = shared.ktls_refused.fetch_or(bits, Relaxed);
    if matches!(refusal, Refusal::NoUlp) && before != kernel::ALL_FORMS {
        for m in &shared.metrics {
            m.tls_kernel.store(0, Relaxed);
        }
        tracing::warn!(
            "the kernel has no TLS (TCP_ULP \"tls\": ENOENT): TLS subscribers' \
             records are sealed by the gateway's record layer"
        );
    }
}
