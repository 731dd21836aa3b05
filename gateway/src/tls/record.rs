//! The TLS record layer of a subscriber connection, after rustls has done the handshake: its
//! transmit keys are taken out of the session (as kernel TLS would take them) and application
//! data is sealed here, straight into the connection's ciphertext batch — the plaintext is
//! copied once, from the mapped log into the record's place in the batch, and encrypted in
//! place. rustls' own send path (buffered or unbuffered, 0.23) encrypts each record into a
//! vector of its own and copies it out again.
//!
//! Only the transmit direction: a subscriber reads nothing more (a client's later records —
//! `close_notify`, a key update — are ignored; its hang-up closes the connection).
//!
//! Record formats (application data, content type 23, legacy version 0x0303):
//! - TLS 1.3 (RFC 8446 §5.2): `header ‖ AEAD(nonce = iv ⊕ seq, aad = header,
//!   plaintext ‖ 0x17) ‖ tag`.
//! - TLS 1.2 AES-GCM (RFC 5288): `header ‖ explicit nonce (8) ‖ AEAD(nonce, aad = seq ‖ 23 ‖
//!   0x0303 ‖ length, plaintext) ‖ tag`, the nonce built as rustls builds it (its salt and
//!   explicit part `⊕ seq`, `extract_keys`).
//! - TLS 1.2 ChaCha20-Poly1305 (RFC 7905): as AES-GCM without the explicit nonce.
#![forbid(unsafe_code)]

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::{ConnectionTrafficSecrets, ProtocolVersion};

/// Largest plaintext in one record (2^14, RFC 8446 §5.1).
pub const RECORD_PLAIN_MAX: usize = 16 * 1024;
/// Records one key may seal when its suite sets no smaller limit (the sequence number must
/// never wrap). The suite's own limit (rustls' `confidentiality_limit`: 2^24 for AES-GCM,
/// below RFC 8446 §5.5's 2^24.5) applies where it has one; past it the stream ends (the
/// client resumes on a new connection with its Last-Event-ID): this layer sends no key
/// update, and answers none (a subscriber reads nothing more; RFC 8446 §4.6.3's reply to a
/// client's `update_requested` is not sent).
pub const RECORDS_MAX: u64 = u64::MAX - 1;

const HEADER: usize = 5;
const TAG: usize = 16;
const CONTENT_APPLICATION_DATA: u8 = 23;

/// Whether [`Sealer`] seals records of `suite` (the AEAD suites of TLS 1.3 and 1.2).
pub fn knows(suite: rustls::CipherSuite) -> bool {
    use rustls::CipherSuite as S;
    matches!(
        suite,
        S::TLS13_AES_128_GCM_SHA256
            | S::TLS13_AES_256_GCM_SHA384
            | S::TLS13_CHACHA20_POLY1305_SHA256
            | S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | S::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            | S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            | S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
            | S::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
            | S::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
    )
}

/// Why a record could not be sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealError {
    /// The key sealed as many records as its limit allows: end the connection.
    KeyExhausted,
}

/// Seals application-data records for one connection's transmit direction.
pub struct Sealer {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
    /// Sequence numbers below this may seal (the suite's confidentiality limit).
    seq_end: u64,
    /// The records carry an explicit nonce (TLS 1.2 AES-GCM).
    explicit_nonce: bool,
    tls13: bool,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No key material.
        f.debug_struct("Sealer")
            .field("seq", &self.seq)
            .field("tls13", &self.tls13)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// The sealer for `secrets` at record sequence `seq`, under `version`, sealing up to
    /// `limit` records in all (the suite's confidentiality limit); `None` for a version or
    /// algorithm it does not know.
    pub fn new(
        version: ProtocolVersion,
        seq: u64,
        secrets: ConnectionTrafficSecrets,
        limit: u64,
    ) -> Option<Sealer> {
        let tls13 = match version {
            ProtocolVersion::TLSv1_3 => true,
            ProtocolVersion::TLSv1_2 => false,
            _ => return None,
        };
        let (alg, key, iv, gcm) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv, true),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv, true),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv, false)
            }
            _ => return None,
        };
        let key = LessSafeKey::new(UnboundKey::new(alg, key.as_ref()).ok()?);
        Some(Sealer {
            key,
            iv: iv.as_ref().try_into().ok()?,
            seq,
            seq_end: limit.min(RECORDS_MAX),
            explicit_nonce: gcm && !tls13,
            tls13,
        })
    }

    /// Ciphertext bytes the records of `plain` plaintext bytes take (at most
    /// [`RECORD_PLAIN_MAX`] each).
    pub fn sealed_len(&self, plain: usize) -> usize {
        let records = plain.div_ceil(RECORD_PLAIN_MAX);
        plain + records * self.overhead()
    }

    fn overhead(&self) -> usize {
        HEADER + TAG + usize::from(self.tls13) + if self.explicit_nonce { 8 } else { 0 }
    }

    /// Appends to `out` the records carrying `parts`, in order (several parts share a record;
    /// a record holds at most [`RECORD_PLAIN_MAX`] bytes). Returns the plaintext length. On
    /// `Err` nothing was appended.
    pub fn seal<'a>(
        &mut self,
        parts: impl Iterator<Item = &'a [u8]> + Clone,
        out: &mut Vec<u8>,
    ) -> Result<usize, SealError> {
        let plain: usize = parts.clone().map(<[u8]>::len).sum();
        if plain == 0 {
            return Ok(0);
        }
        let records = plain.div_ceil(RECORD_PLAIN_MAX) as u64;
        if self
            .seq
            .checked_add(records)
            .is_none_or(|end| end > self.seq_end)
        {
            return Err(SealError::KeyExhausted);
        }
        out.reserve(self.sealed_len(plain));
        let mut left = plain;
        let mut parts = parts.flat_map(|p| p.chunks(RECORD_PLAIN_MAX));
        let mut carry: &[u8] = &[];
        while left > 0 {
            let len = left.min(RECORD_PLAIN_MAX);
            let start = self.open_record(len, out);
            let mut need = len;
            while need > 0 {
                if carry.is_empty() {
                    carry = parts.next().expect("the parts hold `plain` bytes");
                }
                let take = need.min(carry.len());
                out.extend_from_slice(&carry[..take]);
                carry = &carry[take..];
                need -= take;
            }
            self.close_record(start, len, out);
            left -= len;
        }
        Ok(plain)
    }

    /// Writes a record's header (and explicit nonce) for `len` plaintext bytes; returns where
    /// its plaintext starts in `out`.
    fn open_record(&self, len: usize, out: &mut Vec<u8>) -> usize {
        let body = len + self.overhead() - HEADER;
        let body = u16::try_from(body).expect("a record's length fits its header");
        out.extend_from_slice(&[CONTENT_APPLICATION_DATA, 3, 3]);
        out.extend_from_slice(&body.to_be_bytes());
        if self.explicit_nonce {
            let nonce = self.nonce();
            out.extend_from_slice(&nonce[4..]);
        }
        out.len()
    }

    /// Encrypts the plaintext at `out[start..]` (`len` bytes) in place and appends the tag.
    fn close_record(&mut self, start: usize, len: usize, out: &mut Vec<u8>) {
        let nonce = Nonce::assume_unique_for_key(self.nonce());
        let tag = if self.tls13 {
            out.push(CONTENT_APPLICATION_DATA); // the inner content type
            let header: [u8; HEADER] = out[start - HEADER..start].try_into().expect("5 bytes");
            self.key
                .seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[start..])
        } else {
            let mut aad = [0u8; 13];
            aad[..8].copy_from_slice(&self.seq.to_be_bytes());
            aad[8] = CONTENT_APPLICATION_DATA;
            aad[9..11].copy_from_slice(&[3, 3]);
            aad[11..].copy_from_slice(&(len as u16).to_be_bytes());
            self.key
                .seal_in_place_separate_tag(nonce, Aad::from(aad), &mut out[start..])
        }
        .expect("sealing a record of at most 2^14 bytes cannot fail");
        out.extend_from_slice(tag.as_ref());
        self.seq += 1;
    }

    /// `iv ⊕ seq` (the sequence number as a 96-bit big-endian integer).
    fn nonce(&self) -> [u8; 12] {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        n
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
