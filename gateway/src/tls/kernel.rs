//! Kernel TLS for a subscriber's transmit direction (`TCP_ULP "tls"` and `TLS_TX`; the
//! kernel's `Documentation/networking/tls.rst`): after rustls' handshake the transmit keys go
//! to the kernel, and the subscriber's sends take the plaintext path — iovecs straight into
//! the mapped log; the kernel copies each byte once, into the record it seals.
//!
//! - [`CryptoInfo`]: rustls' extracted keys as the kernel's `struct tls12_crypto_info_*`
//!   (`linux/tls.h`; the layout is checked against the header in a test).
//! - [`KernelTx`]: the map from the kernel's ciphertext byte counts to the plaintext a
//!   subscriber's window counts, read from the kernel rather than modelled (below).
//!
//! ## Why the accounting reads the kernel
//! The kernel chooses the record boundaries: full 2^14-byte records, the end of each
//! `sendmsg`, and earlier when a record's scatterlist fills or memory is short; a short
//! `sendmsg` leaves a record open, and a sealed record may wait in the TLS layer while TCP's
//! send buffer is full. None of that is visible from a send's result, and a model that guessed
//! one boundary wrong would confirm an event whose record is not fully ACKed. So a reading
//! takes, with no send in flight:
//! 1. `R`, the records the key has sealed since the hand-over (`rec_seq` from
//!    `getsockopt(SOL_TLS, TLS_TX)` minus the sequence number at the hand-over);
//! 2. the ciphertext TCP has taken since the hand-over, `written` = `tcpi_bytes_acked` +
//!    `SIOCOUTQ` − the bytes written before it, read in that order so that an ACK arriving
//!    between the two calls can only make `written` smaller.
//!
//! Every record adds the same `overhead` to its plaintext (AEAD records; the kernel does not
//! pad), so with `P` the plaintext the kernel has taken, `written ≤ sealed ciphertext =
//! (plaintext in sealed records) + overhead·R ≤ P + overhead·R`. When `written == P +
//! overhead·R` both inequalities are equalities: no plaintext waits in an open record and no
//! sealed record waits for TCP, so plaintext byte `P` ends exactly at ciphertext byte `P +
//! overhead·R`, a record boundary. Only such a reading makes a checkpoint; a checkpoint's
//! plaintext is confirmed once `tcpi_bytes_acked` − the bytes before the hand-over reaches
//! its ciphertext end. A reading that does not balance (a record still open or waiting) makes
//! no checkpoint; older checkpoints still confirm. Nothing is guessed, so the worst a kernel
//! that behaved differently could do is confirm nothing (the window then fills and the
//! subscriber is closed as lagging, to resume from the log).
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use rustls::{ConnectionTrafficSecrets, ProtocolVersion};
use zeroize::Zeroizing;

/// `linux/tls.h`.
pub const TLS_TX: i32 = 1;
const TLS_1_2_VERSION: u16 = 0x0303;
const TLS_1_3_VERSION: u16 = 0x0304;
const TLS_CIPHER_AES_GCM_128: u16 = 51;
const TLS_CIPHER_AES_GCM_256: u16 = 52;
const TLS_CIPHER_CHACHA20_POLY1305: u16 = 54;
/// Every [`CryptoInfo::form_bit`] (2 versions × 3 ciphers).
pub const ALL_FORMS: u8 = 0b11_1111;

/// One direction's keys as `struct tls12_crypto_info_{aes_gcm_128, aes_gcm_256,
/// chacha20_poly1305}`: `{ u16 version; u16 cipher_type; }` then `iv`, `key`, `salt`,
/// `rec_seq` (big-endian), in that order, with no padding. Wiped when dropped.
pub struct CryptoInfo {
    bytes: Zeroizing<Vec<u8>>,
    seq: u64,
    overhead: u64,
}

impl std::fmt::Debug for CryptoInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No key material.
        f.debug_struct("CryptoInfo")
            .field("len", &self.bytes.len())
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl CryptoInfo {
    /// The kernel's form of `secrets` at record sequence `seq` under `version`; `None` for a
    /// version or cipher the kernel's TLS does not take from us here.
    ///
    /// Nonces: TLS 1.3 and ChaCha20-Poly1305 build the nonce as `iv ⊕ seq` (RFC 8446 §5.3,
    /// RFC 7905), as rustls did, so the kernel continues rustls' sequence. TLS 1.2 AES-GCM
    /// sends an explicit 8-byte nonce (RFC 5288 §3) that need only never repeat under the key:
    /// rustls sent `explicit ⊕ s` for records `s < seq`, while the kernel sends the `iv` it is
    /// given and adds one per record. So the kernel starts just above every value rustls could
    /// have used ([`tls12_explicit_start`]).
    pub fn new(
        version: ProtocolVersion,
        seq: u64,
        secrets: &ConnectionTrafficSecrets,
    ) -> Option<CryptoInfo> {
        let (tls13, vcode) = match version {
            ProtocolVersion::TLSv1_3 => (true, TLS_1_3_VERSION),
            ProtocolVersion::TLSv1_2 => (false, TLS_1_2_VERSION),
            _ => return None,
        };
        let mut b = Zeroizing::new(Vec::with_capacity(56));
        b.extend_from_slice(&vcode.to_ne_bytes());
        // Capacity for the largest form: the key is never copied by a reallocation.
        let overhead = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv }
            | ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
                let (code, key_len) = match secrets {
                    ConnectionTrafficSecrets::Aes128Gcm { .. } => (TLS_CIPHER_AES_GCM_128, 16),
                    _ => (TLS_CIPHER_AES_GCM_256, 32),
                };
                if key.as_ref().len() != key_len {
                    return None;
                }
                let iv: &[u8; 12] = iv.as_ref().try_into().ok()?;
                b.extend_from_slice(&code.to_ne_bytes());
                if tls13 {
                    b.extend_from_slice(&iv[4..]);
                } else {
                    let explicit = u64::from_be_bytes(iv[4..].try_into().expect("8 bytes"));
                    b.extend_from_slice(&tls12_explicit_start(explicit, seq).to_be_bytes());
                }
                b.extend_from_slice(key.as_ref());
                b.extend_from_slice(&iv[..4]); // salt
                // header 5, tag 16; TLS 1.3 the inner content type, TLS 1.2 the explicit nonce
                if tls13 { 5 + 16 + 1 } else { 5 + 8 + 16 }
            }
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                if key.as_ref().len() != 32 || iv.as_ref().len() != 12 {
                    return None;
                }
                b.extend_from_slice(&TLS_CIPHER_CHACHA20_POLY1305.to_ne_bytes());
                b.extend_from_slice(iv.as_ref()); // 12 bytes, no salt
                b.extend_from_slice(key.as_ref());
                if tls13 { 5 + 16 + 1 } else { 5 + 16 }
            }
            _ => return None,
        };
        b.extend_from_slice(&seq.to_be_bytes());
        Some(CryptoInfo {
            bytes: b,
            seq,
            overhead,
        })
    }

    /// What `setsockopt(SOL_TLS, TLS_TX)` takes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// One bit per (version, cipher) form, to remember forms a kernel refused or cannot read
    /// back (`getsockopt(TLS_TX)` answers ChaCha20-Poly1305 only from Linux 5.16, though 5.11
    /// takes it).
    pub fn form_bit(&self) -> u8 {
        let version = u16::from_ne_bytes([self.bytes[0], self.bytes[1]]);
        let cipher = u16::from_ne_bytes([self.bytes[2], self.bytes[3]]);
        let c = match cipher {
            TLS_CIPHER_AES_GCM_128 => 0,
            TLS_CIPHER_AES_GCM_256 => 1,
            _ => 2,
        };
        1 << (c + if version == TLS_1_3_VERSION { 3 } else { 0 })
    }
}

/// The first explicit nonce the kernel may send for TLS 1.2 AES-GCM after rustls sealed
/// records `0..seq` with `explicit ⊕ s`: those all lie in `[h, h + 2^b)`, `h` being
/// `explicit` with its low `b` bits cleared and `2^b > seq − 1`; the kernel counts up from
/// `h + 2^b`, and an AES-GCM key seals at most 2^24 records (its confidentiality limit,
/// [`KernelTx::may_send`]), far fewer than the `2^64 − 2^b` it would take to come round to
/// `h`, so the two never meet.
pub fn tls12_explicit_start(explicit: u64, seq: u64) -> u64 {
    let b = 64 - seq.saturating_sub(1).leading_zeros();
    if b >= 64 {
        return explicit.wrapping_add(1); // unreachable in practice: 2^63 records sealed
    }
    (explicit & !((1u64 << b) - 1)).wrapping_add(1u64 << b)
}

/// One kernel reading for [`KernelTx::on_reading`], taken with no send in flight.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    /// `rec_seq` from `getsockopt(SOL_TLS, TLS_TX)` (`None`: the call failed).
    pub rec_seq: Option<u64>,
    /// `tcpi_bytes_acked` (read after `rec_seq`).
    pub bytes_acked: u64,
    /// `SIOCOUTQ` (read after `bytes_acked`).
    pub outq: u64,
}

/// A subscriber connection whose transmit keys the kernel holds.
#[derive(Debug)]
pub struct KernelTx {
    /// Ciphertext bytes written on the connection before the hand-over.
    base: u64,
    /// The record sequence number at the hand-over, and the first one the key may not seal
    /// (its confidentiality limit).
    seq0: u64,
    seq_end: u64,
    overhead: u64,
    /// The length of the `struct tls12_crypto_info_*` the kernel answers with, and its form.
    info_len: usize,
    form_bit: u8,
    /// Plaintext the kernel has taken since the hand-over.
    plain: u64,
    /// (ciphertext end, plaintext end) since the hand-over of balanced readings not yet known
    /// ACKed, oldest first.
    checkpoints: VecDeque<(u64, u64)>,
    plain_acked: u64,
    /// The last `rec_seq` read, and the plaintext taken since (each byte can close at most
    /// one record, and one more may be open): a bound on the records sealed now.
    seq_read: u64,
    plain_since_read: u64,
    /// A send failed: the kernel may have sealed (and sent) plaintext it did not report
    /// taken, so no reading balances truthfully any more; older checkpoints still hold.
    failed: bool,
}

impl KernelTx {
    /// The kernel took the keys of `info` on a connection that had written `base` ciphertext
    /// bytes; the key may seal records up to sequence number `limit` (exclusive).
    pub fn new(info: &CryptoInfo, base: u64, limit: u64) -> KernelTx {
        KernelTx {
            base,
            seq0: info.seq,
            seq_end: limit,
            overhead: info.overhead,
            info_len: info.bytes.len(),
            form_bit: info.form_bit(),
            plain: 0,
            checkpoints: VecDeque::new(),
            plain_acked: 0,
            seq_read: info.seq,
            plain_since_read: 0,
            failed: false,
        }
    }

    /// The record sequence number at the hand-over (a reading right after it must show it).
    pub fn seq0(&self) -> u64 {
        self.seq0
    }

    /// [`CryptoInfo::form_bit`] of the keys.
    pub fn form_bit(&self) -> u8 {
        self.form_bit
    }

    /// A send failed (`sendmsg` reports an error even after sealing records): make no more
    /// checkpoints.
    pub fn send_failed(&mut self) {
        self.failed = true;
    }

    /// How long a `getsockopt(SOL_TLS, TLS_TX)` answer is (the form the keys were given in).
    pub fn info_len(&self) -> usize {
        self.info_len
    }

    /// The record sequence number in a `getsockopt(SOL_TLS, TLS_TX)` answer (its last 8
    /// bytes, big-endian); `None` if the answer has another length.
    pub fn rec_seq_of(&self, answer: &[u8]) -> Option<u64> {
        if answer.len() != self.info_len {
            return None;
        }
        Some(u64::from_be_bytes(
            answer[answer.len() - 8..].try_into().expect("8 bytes"),
        ))
    }

    /// The kernel took `n` more plaintext bytes (a send completion, possibly short).
    pub fn taken(&mut self, n: u64) {
        self.plain += n;
        self.plain_since_read += n;
    }

    /// Whether a send of `len` more plaintext bytes stays within the key's record limit
    /// whatever records the kernel makes of it. `false`: read `rec_seq` again
    /// ([`KernelTx::on_rec_seq`]) and ask once more; still `false`, end the stream.
    pub fn may_send(&self, len: u64) -> bool {
        // Records sealed now ≤ seq_read + plain_since_read + 1 (an open record); a send of
        // `len` bytes seals at most `len` more.
        self.seq_read
            .saturating_add(self.plain_since_read)
            .saturating_add(1)
            .saturating_add(len)
            <= self.seq_end
    }

    /// A fresh `rec_seq` (for [`KernelTx::may_send`]).
    pub fn on_rec_seq(&mut self, rec_seq: u64) {
        self.seq_read = rec_seq.max(self.seq_read);
        self.plain_since_read = 0;
    }

    /// A reading: records a checkpoint if it balances, confirms what is ACKed, and returns the
    /// plaintext not yet known ACKed (as `SIOCOUTQ` would count it for a plaintext socket).
    pub fn on_reading(&mut self, r: Reading) -> u64 {
        let written = (r.bytes_acked + r.outq).saturating_sub(self.base);
        if let Some(seq) = r.rec_seq
            && seq >= self.seq0
        {
            self.on_rec_seq(seq);
            let sealed = self.plain + self.overhead * (seq - self.seq0);
            let newest = self.checkpoints.back().map_or(self.plain_acked, |c| c.1);
            if written == sealed && self.plain > newest && !self.failed {
                self.checkpoints.push_back((sealed, self.plain));
            }
        }
        let acked = r.bytes_acked.saturating_sub(self.base);
        while let Some(&(c, p)) = self.checkpoints.front() {
            if c > acked {
                break;
            }
            self.plain_acked = p;
            self.checkpoints.pop_front();
        }
        self.plain - self.plain_acked
    }
}

#[cfg(test)]
#[path = "kernel_tests.rs"]
mod tests;
