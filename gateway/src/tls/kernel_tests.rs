//! The kernel hand-over, as far as it can be checked without a kernel that has TLS:
//! - the keys' layout against `linux/tls.h` itself (compiled here);
//! - the keys' meaning: records sealed from the handed-over bytes alone, by the rules of the
//!   kernel's `tls_sw.c` (nonce, explicit nonce, AAD, sequence advance), decrypt at rustls'
//!   client for every suite;
//! - TLS 1.2 AES-GCM explicit nonces never repeat across the hand-over;
//! - the accounting against a simulated kernel that splits records anywhere, leaves them open
//!   or unpushed, and takes ACKs between the reads: nothing is confirmed before the last
//!   byte of its record is ACKed, and everything is once all is ACKed.

use proptest::prelude::*;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::crypto::ring::cipher_suite as cs;

use super::*;
use crate::tls::SealFrom;
use crate::tls::test_client::{SUITES, certs, client_reads, connect, drain, pattern, session};

/// Seals application-data records from a `struct tls12_crypto_info_*` the way the kernel's
/// software TLS does, reading nothing but those bytes.
struct KernelModel {
    key: LessSafeKey,
    salt: Vec<u8>,
    iv: Vec<u8>,
    seq: u64,
    tls13: bool,
    /// TLS 1.2 AES-GCM: the iv is the explicit nonce, sent and counted up per record.
    explicit: bool,
}

impl KernelModel {
    fn from_info(b: &[u8]) -> KernelModel {
        let version = u16::from_ne_bytes([b[0], b[1]]);
        let cipher = u16::from_ne_bytes([b[2], b[3]]);
        let (iv_len, key_len, salt_len, alg) = match cipher {
            51 => (8, 16, 4, &aead::AES_128_GCM),
            52 => (8, 32, 4, &aead::AES_256_GCM),
            54 => (12, 32, 0, &aead::CHACHA20_POLY1305),
            c => panic!("cipher type {c}"),
        };
        assert_eq!(b.len(), 4 + iv_len + key_len + salt_len + 8, "struct size");
        let (iv, rest) = b[4..].split_at(iv_len);
        let (key, rest) = rest.split_at(key_len);
        let (salt, rec_seq) = rest.split_at(salt_len);
        let tls13 = match version {
            0x0304 => true,
            0x0303 => false,
            v => panic!("version {v:#x}"),
        };
        KernelModel {
            key: LessSafeKey::new(UnboundKey::new(alg, key).unwrap()),
            salt: salt.to_vec(),
            iv: iv.to_vec(),
            seq: u64::from_be_bytes(rec_seq.try_into().unwrap()),
            tls13,
            explicit: !tls13 && cipher != 54,
        }
    }

    fn seal(&mut self, plain: &[u8]) -> Vec<u8> {
        let mut nonce: [u8; 12] = [&self.salt[..], &self.iv[..]].concat().try_into().unwrap();
        if !self.explicit {
            for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
                *n ^= s;
            }
        }
        let mut body = plain.to_vec();
        if self.tls13 {
            body.push(23);
        }
        let len = body.len() + 16 + if self.explicit { 8 } else { 0 };
        let mut rec = vec![23, 3, 3];
        rec.extend_from_slice(&(len as u16).to_be_bytes());
        let aad: Vec<u8> = if self.tls13 {
            rec.clone()
        } else {
            let mut a = self.seq.to_be_bytes().to_vec();
            a.extend_from_slice(&[23, 3, 3]);
            a.extend_from_slice(&(plain.len() as u16).to_be_bytes());
            a
        };
        if self.explicit {
            rec.extend_from_slice(&self.iv);
        }
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad[..]),
                &mut body,
            )
            .unwrap();
        rec.extend_from_slice(&body);
        self.seq += 1;
        if self.explicit {
            let next = u64::from_be_bytes(self.iv[..].try_into().unwrap()).wrapping_add(1);
            self.iv = next.to_be_bytes().to_vec();
        }
        rec
    }
}

#[test]
fn records_sealed_from_the_handed_over_keys_decrypt_at_a_real_client() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, root) = certs(dir.path());
    for suite in SUITES {
        let name = format!("{:?}", suite.suite());
        let (mut c, mut s) = connect(&certs, &root, suite);
        // An answer sealed by rustls before the hand-over, as a subscription's would be.
        let n = s
            .encrypt(std::iter::once(&b"HTTP/1.1 200 OK\r\n\r\n"[..]))
            .unwrap() as u64;
        assert_eq!(
            client_reads(&mut c, &drain(&mut s, n)),
            b"HTTP/1.1 200 OK\r\n\r\n"
        );
        let mut handed = None;
        let r = s.seal_from_now(|info, written| {
            handed = Some((info.as_bytes().to_vec(), written));
            true
        });
        assert_eq!(r, SealFrom::Kernel, "{name}");
        let (info, written) = handed.unwrap();
        assert_eq!(written, s.map.cipher_taken(), "{name}");
        assert!(s.sealed() && s.kernel().is_some());
        let mut k = KernelModel::from_info(&info);
        let mut wire = Vec::new();
        let mut want = Vec::new();
        for (i, len) in [1usize, 300, 16 * 1024, 7].into_iter().enumerate() {
            let p = pattern(len, i as u8);
            wire.extend(k.seal(&p));
            want.extend(p);
        }
        assert_eq!(client_reads(&mut c, &wire), want, "{name}");
    }
}

/// With records rustls still holds (an answer not sent yet), the keys go to the record layer:
/// the kernel would seal those records' bytes a second time.
#[test]
fn records_still_held_keep_the_keys_from_the_kernel() {
    let (_dir, mut c, mut s) = session(cs::TLS13_AES_128_GCM_SHA256);
    s.encrypt(std::iter::once(&b"answer"[..])).unwrap();
    let mut asked = false;
    assert_eq!(
        s.seal_from_now(|_, _| {
            asked = true;
            true
        }),
        SealFrom::Sealed
    );
    assert!(!asked);
    let n = s.encrypt(std::iter::once(&b" then more"[..])).unwrap() as u64;
    assert_eq!(client_reads(&mut c, &drain(&mut s, n)), b"answer then more");
}

/// A kernel that refuses the keys leaves a working record layer.
#[test]
fn a_refused_hand_over_falls_back_to_the_record_layer() {
    let (_dir, mut c, mut s) = session(cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384);
    assert_eq!(s.seal_from_now(|_, _| false), SealFrom::Sealed);
    assert!(s.kernel().is_none());
    let n = s.encrypt(std::iter::once(&b"data: 1\n\n"[..])).unwrap() as u64;
    assert_eq!(client_reads(&mut c, &drain(&mut s, n)), b"data: 1\n\n");
}

/// The layout [`CryptoInfo`] writes is `linux/tls.h`'s, and `tcpi_bytes_acked` sits where
/// `libc::tcp_info` reads it: a C program prints the header's sizes and offsets.
#[test]
fn the_keys_layout_is_linux_tls_h() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("layout.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <stddef.h>
#include <linux/tcp.h>
#include <linux/tls.h>
#define S(t) printf("%zu %zu %zu %zu %zu\n", sizeof(struct t), offsetof(struct t, iv), \
    offsetof(struct t, key), offsetof(struct t, salt), offsetof(struct t, rec_seq))
int main(void) {
    printf("%d %d %d %d %d %d %d\n", TLS_TX, TCP_ULP, TLS_1_2_VERSION, TLS_1_3_VERSION,
        TLS_CIPHER_AES_GCM_128, TLS_CIPHER_AES_GCM_256, TLS_CIPHER_CHACHA20_POLY1305);
    S(tls12_crypto_info_aes_gcm_128);
    S(tls12_crypto_info_aes_gcm_256);
    S(tls12_crypto_info_chacha20_poly1305);
    printf("%zu\n", offsetof(struct tcp_info, tcpi_bytes_acked));
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("layout");
    let cc = std::process::Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cc (the Rust toolchain's linker) runs");
    assert!(
        cc.status.success(),
        "compiling against linux/tls.h: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = std::process::Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Vec<usize>> = text
        .lines()
        .map(|l| l.split(' ').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            TLS_TX as usize,
            libc::TCP_ULP as usize,
            TLS_1_2_VERSION as usize,
            TLS_1_3_VERSION as usize,
            TLS_CIPHER_AES_GCM_128 as usize,
            TLS_CIPHER_AES_GCM_256 as usize,
            TLS_CIPHER_CHACHA20_POLY1305 as usize,
        ]
    );
    // Ours, read off what CryptoInfo writes for the keys of real handshakes.
    let dir = tempfile::tempdir().unwrap();
    let (certs, root) = certs(dir.path());
    let seq = 0x0102_0304_0506_0708u64;
    for (suite, key_len, c) in [
        (cs::TLS13_AES_128_GCM_SHA256, 16, &lines[1]),
        (cs::TLS13_AES_256_GCM_SHA384, 32, &lines[2]),
        (cs::TLS13_CHACHA20_POLY1305_SHA256, 32, &lines[3]),
    ] {
        let (_cl, mut s) = connect(&certs, &root, suite);
        let secrets = s
            .conn
            .take()
            .unwrap()
            .dangerous_extract_secrets()
            .unwrap()
            .tx
            .1;
        let (size, at_iv, at_key, at_salt, at_seq) = (c[0], c[1], c[2], c[3], c[4]);
        let info = CryptoInfo::new(ProtocolVersion::TLSv1_3, seq, &secrets).unwrap();
        let b = info.as_bytes();
        assert_eq!(b.len(), size);
        assert_eq!(&b[at_seq..], &seq.to_be_bytes());
        let (key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv }
            | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
            | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key.as_ref(), iv.as_ref()),
            _ => unreachable!(),
        };
        assert_eq!(key.len(), key_len);
        assert_eq!(&b[at_key..at_key + key_len], key);
        assert_eq!(at_key + key_len, at_salt);
        // salt ‖ iv is rustls' 12-byte iv (ChaCha20: no salt)
        let mut whole = b[at_salt..at_seq].to_vec();
        whole.extend_from_slice(&b[at_iv..at_key]);
        assert_eq!(whole, iv);
        assert_eq!(u16::from_ne_bytes([b[0], b[1]]), TLS_1_3_VERSION);
    }
    assert_eq!(
        lines[4][0],
        std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked)
    );
}

proptest! {
    /// TLS 1.2 AES-GCM: the explicit nonces rustls sent (`explicit ⊕ s`, `s < seq`) and the
    /// kernel's (`start + j`, `j` below the AES-GCM record limit) never meet.
    #[test]
    fn tls12_explicit_nonces_never_repeat(
        explicit in prop_oneof![any::<u64>(), Just(u64::MAX), Just(u64::MAX - 1), Just(0u64)],
        seq in prop_oneof![0u64..70, 0u64..(1 << 24), Just(1u64 << 20)],
        probes in proptest::collection::vec(any::<u64>(), 32),
    ) {
        let start = tls12_explicit_start(explicit, seq);
        let limit = 1u64 << 24;
        let kernel_has = |n: u64| n.wrapping_sub(start) < limit;
        let mut used: Vec<u64> = probes.iter().filter(|_| seq > 0).map(|p| p % seq).collect();
        if seq > 0 {
            used.extend([0, seq - 1]);
        }
        if seq < 70 {
            used.extend(0..seq);
        }
        for s in used {
            prop_assert!(!kernel_has(explicit ^ s), "rustls' record {s} vs the kernel's");
        }
    }
}

/// A kernel TLS socket as the accounting sees it: records split anywhere, left open, sealed
/// but not yet pushed to TCP, TCP taking and ACKing ciphertext byte by byte.
#[derive(Debug)]
struct Sim {
    overhead: u64,
    base: u64,
    plain: u64,
    open: u64,
    /// (plaintext end, ciphertext end) of each sealed record since the hand-over.
    records: Vec<(u64, u64)>,
    pushed: u64,
    acked: u64,
}

impl Sim {
    fn sealed_cipher(&self) -> u64 {
        self.records.last().map_or(0, |r| r.1)
    }

    fn seal(&mut self) {
        if self.open == 0 {
            return;
        }
        let end = (
            self.records.last().map_or(0, |r| r.0) + self.open,
            self.sealed_cipher() + self.open + self.overhead,
        );
        self.records.push(end);
        self.open = 0;
    }

    /// Plaintext whose records are entirely ACKed.
    fn confirmable(&self) -> u64 {
        self.records
            .iter()
            .take_while(|r| r.1 <= self.acked)
            .last()
            .map_or(0, |r| r.0)
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// A send of `len` bytes the kernel takes `taken` of (all, when `None`); records close
    /// at 2^14, at the `early` points, and at the end unless `stay_open`; then TCP takes
    /// `push` of what is sealed.
    Send {
        len: u64,
        taken: Option<u16>,
        early: Vec<u16>,
        stay_open: bool,
        push: u16,
    },
    Push(u16),
    Ack(u16),
    /// A reading, with an ACK of `between` arriving between `tcpi_bytes_acked` and
    /// `SIOCOUTQ`.
    Read {
        between: u16,
    },
}

fn frac(x: u64, f: u16) -> u64 {
    x * u64::from(f) / u64::from(u16::MAX)
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (
            1u64..40_000,
            proptest::option::of(any::<u16>()),
            proptest::collection::vec(any::<u16>(), 0..3),
            proptest::bool::weighted(0.2),
            any::<u16>(),
        )
            .prop_map(|(len, taken, early, stay_open, push)| Step::Send {
                len,
                taken,
                early,
                stay_open,
                push
            }),
        1 => any::<u16>().prop_map(Step::Push),
        2 => any::<u16>().prop_map(Step::Ack),
        3 => any::<u16>().prop_map(|between| Step::Read { between }),
    ]
}

fn read(k: &mut KernelTx, sim: &mut Sim, seq0: u64, between: u16) -> u64 {
    let rec_seq = Some(seq0 + sim.records.len() as u64);
    let bytes_acked = sim.base + sim.acked;
    sim.acked += frac(sim.pushed - sim.acked, between);
    let outq = sim.pushed - sim.acked;
    k.on_reading(Reading {
        rec_seq,
        bytes_acked,
        outq,
    })
}

proptest! {
    #[test]
    fn nothing_is_confirmed_before_its_record_is_acked(
        overhead in prop_oneof![Just(22u64), Just(29), Just(21)],
        base in 0u64..100_000,
        seq0 in 0u64..1000,
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        let mut k = KernelTx {
            base,
            seq0,
            seq_end: u64::MAX,
            overhead,
            info_len: 40,
            form_bit: 1,
            plain: 0,
            checkpoints: VecDeque::new(),
            plain_acked: 0,
            seq_read: seq0,
            plain_since_read: 0,
            failed: false,
        };
        let mut sim = Sim { overhead, base, plain: 0, open: 0, records: Vec::new(), pushed: 0, acked: 0 };
        for s in steps {
            match s {
                Step::Send { len, taken, early, stay_open, push } => {
                    let n = taken.map_or(len, |f| frac(len, f));
                    let mut cuts: Vec<u64> = early.iter().map(|&f| frac(n, f)).collect();
                    cuts.sort_unstable();
                    let mut at = 0;
                    while at < n {
                        let to_full = RECORD_PLAIN_MAX_U64 - sim.open;
                        let next_cut = cuts.iter().copied().find(|&c| c > at).unwrap_or(n);
                        let seg = to_full.min(next_cut - at).min(n - at);
                        sim.open += seg;
                        at += seg;
                        if sim.open == RECORD_PLAIN_MAX_U64 || (at == next_cut && at < n) {
                            sim.seal();
                        }
                    }
                    if n == len && !stay_open {
                        sim.seal();
                    }
                    sim.plain += n;
                    sim.pushed += frac(sim.sealed_cipher() - sim.pushed, push);
                    k.taken(n);
                }
                Step::Push(f) => sim.pushed += frac(sim.sealed_cipher() - sim.pushed, f),
                Step::Ack(f) => sim.acked += frac(sim.pushed - sim.acked, f),
                Step::Read { between } => {
                    let q = read(&mut k, &mut sim, seq0, between);
                    let confirmed = sim.plain - q;
                    prop_assert!(
                        confirmed <= sim.confirmable(),
                        "confirmed {} but only {} is in ACKed records ({:?})",
                        confirmed, sim.confirmable(), sim
                    );
                }
            }
        }
        // Everything sealed, pushed and ACKed: everything is confirmed.
        sim.seal();
        sim.pushed = sim.sealed_cipher();
        sim.acked = sim.pushed;
        read(&mut k, &mut sim, seq0, 0);
        prop_assert_eq!(read(&mut k, &mut sim, seq0, 0), 0);
    }
}

/// TLS 1.3 AES-256-GCM keys (made up) at record sequence `seq`.
fn aes256_info(seq: u64) -> CryptoInfo {
    let secrets = ConnectionTrafficSecrets::Aes256Gcm {
        key: rustls::crypto::cipher::AeadKey::from([3; 32]),
        iv: rustls::crypto::cipher::Iv::new([4; 12]),
    };
    CryptoInfo::new(ProtocolVersion::TLSv1_3, seq, &secrets).unwrap()
}

const RECORD_PLAIN_MAX_U64: u64 = crate::tls::record::RECORD_PLAIN_MAX as u64;

#[test]
fn the_record_limit_holds_whatever_records_the_kernel_makes() {
    let info = aes256_info(1000);
    let mut k = KernelTx::new(&info, 0, 1100);
    assert!(k.may_send(99), "1000 sealed + 1 open + 99 ≤ 1100");
    assert!(!k.may_send(100));
    k.taken(60);
    // 60 bytes taken since the reading could have sealed 60 records.
    assert!(!k.may_send(40));
    // A fresh reading shows one record sealed.
    k.on_rec_seq(1001);
    assert!(k.may_send(98));
    assert!(!k.may_send(99));
}

#[test]
fn an_unbalanced_reading_makes_no_checkpoint() {
    let info = aes256_info(5);
    let mut k = KernelTx::new(&info, 1000, u64::MAX);
    k.taken(100);
    // One record sealed (100 + 22 bytes) but TCP has only 100 of them: a record waits.
    let r = |acked: u64, outq: u64| Reading {
        rec_seq: Some(6),
        bytes_acked: 1000 + acked,
        outq,
    };
    assert_eq!(k.on_reading(r(100, 0)), 100);
    // All 122 taken by TCP and ACKed: confirmed.
    assert_eq!(k.on_reading(r(122, 0)), 0);
    // A failed rec_seq read confirms nothing new.
    k.taken(10);
    let q = k.on_reading(Reading {
        rec_seq: None,
        bytes_acked: 1000 + 154,
        outq: 0,
    });
    assert_eq!(q, 10);
}

/// A failed send may have sealed plaintext it did not report: no checkpoint after it.
#[test]
fn after_a_failed_send_no_new_checkpoint() {
    let info = aes256_info(0);
    let mut k = KernelTx::new(&info, 0, u64::MAX);
    k.taken(100);
    let balanced = |k: &mut KernelTx, rec: u64, acked: u64| {
        k.on_reading(Reading {
            rec_seq: Some(rec),
            bytes_acked: acked,
            outq: 0,
        })
    };
    assert_eq!(balanced(&mut k, 1, 122), 0);
    k.taken(50);
    k.send_failed();
    // It would balance (50 more bytes in one more record, all ACKed), but is not trusted.
    assert_eq!(balanced(&mut k, 2, 122 + 72), 50);
}

#[test]
fn each_form_has_its_own_bit() {
    let mut bits = 0u8;
    let dir = tempfile::tempdir().unwrap();
    let (certs, root) = certs(dir.path());
    for suite in SUITES {
        let (_c, mut s) = connect(&certs, &root, suite);
        let mut bit = 0;
        s.seal_from_now(|info, _| {
            bit = info.form_bit();
            false
        });
        assert_eq!(bit.count_ones(), 1);
        assert_eq!(bits & bit, 0, "{suite:?}");
        bits |= bit;
    }
    assert_eq!(bits, ALL_FORMS, "the six suites are the six forms");
}
