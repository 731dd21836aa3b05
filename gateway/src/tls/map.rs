//! The exact map from ciphertext bytes (what the kernel counts: sent, ACKed, `SIOCOUTQ`) to
//! plaintext bytes (what a subscriber's send window counts). Plaintext is encrypted in
//! batches; a batch's ciphertext ends at a known kernel byte offset, and its plaintext is
//! confirmed only once that offset is ACKed — so an event is confirmed only when the last
//! ciphertext byte of the record holding its end is ACKed (a batch ends on a record boundary:
//! every record of the batch is before its end). Bytes the TLS layer adds on its own
//! (handshake, tickets, alerts) are ciphertext with no plaintext: batches of plaintext 0.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

/// Ciphertext ↔ plaintext offsets of one connection.
#[derive(Debug, Default)]
pub struct CipherMap {
    /// Ciphertext bytes the kernel has taken (complete batches and part of the current one).
    cipher_taken: u64,
    /// Plaintext bytes of the complete batches.
    plain_done: u64,
    /// (ciphertext end, plaintext end) of complete batches not yet known ACKed, oldest first.
    ends: VecDeque<(u64, u64)>,
    /// Plaintext known ACKed.
    plain_acked: u64,
}

impl CipherMap {
    /// The kernel took `n` more ciphertext bytes (a send completion, possibly partial).
    pub fn taken(&mut self, n: u64) {
        self.cipher_taken += n;
    }

    /// The batch whose ciphertext the kernel has now entirely taken carried `plain` bytes.
    pub fn batch_done(&mut self, plain: u64) {
        self.plain_done += plain;
        if plain > 0 {
            self.ends.push_back((self.cipher_taken, self.plain_done));
        }
    }

    /// Ciphertext bytes the kernel has taken on this connection.
    pub fn cipher_taken(&self) -> u64 {
        self.cipher_taken
    }

    /// Plaintext of the complete batches (what the window was told was sent).
    #[cfg(test)]
    pub fn plain_sent(&self) -> u64 {
        self.plain_done
    }

    /// `SIOCOUTQ` read on the socket (ciphertext not yet ACKed) → plaintext not yet known
    /// ACKed, as the window counts it (`plain_sent - plain_acked`).
    pub fn plain_outq(&mut self, cipher_outq: u64) -> u64 {
        let acked = self.cipher_taken.saturating_sub(cipher_outq);
        self.ack_cipher(acked);
        self.plain_done - self.plain_acked
    }

    /// The peer ACKed ciphertext up to `acked` (exclusive end): every batch ending there or
    /// before is confirmed; returns the plaintext ACKed.
    pub fn ack_cipher(&mut self, acked: u64) -> u64 {
        while let Some(&(c, p)) = self.ends.front() {
            if c > acked {
                break;
            }
            self.plain_acked = p;
            self.ends.pop_front();
        }
        self.plain_acked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One modelled send: a batch of `plain` plaintext bytes encrypted into `cipher` bytes
    /// (≥ plain + overhead), taken by the kernel in pieces; interleaved with ACK readings.
    #[derive(Debug, Clone)]
    enum Step {
        Batch { plain: u64, extra: u64, pieces: u8 },
        Control { cipher: u64 },
        Ack { frac: u16 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u64..40_000, 22u64..400, 1u8..5).prop_map(|(plain, extra, pieces)| Step::Batch {
                plain,
                extra,
                pieces
            }),
            (1u64..300).prop_map(|cipher| Step::Control { cipher }),
            any::<u16>().prop_map(|frac| Step::Ack { frac }),
        ]
    }

    proptest! {
        /// Whatever the batch sizes, partial sends and ACK points: the plaintext confirmed
        /// never includes a byte whose batch's last ciphertext byte is not ACKed, and a batch
        /// whose ciphertext is entirely ACKed is confirmed.
        #[test]
        fn confirms_exactly_the_batches_whose_ciphertext_is_acked(steps in prop::collection::vec(step(), 1..60)) {
            let mut m = CipherMap::default();
            // Model: (cipher end, plain end) of every complete batch.
            let mut model: Vec<(u64, u64)> = Vec::new();
            let (mut cipher, mut plain) = (0u64, 0u64);
            let mut acked_hw = 0u64; // ACKs never go backwards
            for s in steps {
                match s {
                    Step::Batch { plain: p, extra, pieces } => {
                        let c = p + extra;
                        let mut left = c;
                        for i in 0..pieces {
                            let piece = if i + 1 == pieces { left } else { left / 2 };
                            m.taken(piece);
                            left -= piece;
                            if left > 0 {
                                // Everything taken so far ACKed, the batch's end not yet sent:
                                // only the earlier batches are confirmed.
                                acked_hw = cipher + c - left;
                                let confirmed = m.plain_sent() - m.plain_outq(0);
                                prop_assert_eq!(confirmed, plain);
                            }
                        }
                        cipher += c;
                        plain += p;
                        m.batch_done(p);
                        model.push((cipher, plain));
                    }
                    Step::Control { cipher: c } => {
                        m.taken(c);
                        cipher += c;
                        m.batch_done(0);
                    }
                    Step::Ack { frac } => {
                        let acked = (cipher * u64::from(frac) / u64::from(u16::MAX)).max(acked_hw);
                        acked_hw = acked;
                        let outq = cipher - acked;
                        let plain_outq = m.plain_outq(outq);
                        let confirmed = m.plain_sent() - plain_outq;
                        let want = model.iter().filter(|(c, _)| *c <= acked).map(|(_, p)| *p).max().unwrap_or(0);
                        prop_assert_eq!(confirmed, want, "acked cipher {}", acked);
                    }
                }
            }
        }
    }

    #[test]
    fn a_batch_is_confirmed_only_by_its_last_ciphertext_byte() {
        let mut m = CipherMap::default();
        m.taken(100); // handshake
        m.batch_done(0);
        m.taken(600);
        m.batch_done(500); // ciphertext 100..700 carries plaintext 0..500
        assert_eq!(
            m.plain_outq(1),
            500,
            "one cipher byte unacked: nothing confirmed"
        );
        assert_eq!(m.plain_outq(0), 0, "all acked: all confirmed");
    }
}
