//! The record layer against a real TLS client: rustls' client, in memory, handshakes with a
//! [`TlsConn`] whose transmit keys then move to [`Sealer`]; whatever the version and cipher,
//! the client must decrypt exactly the plaintext sealed, across batches and record splits.

use std::time::Instant;

use rustls::crypto::ring::cipher_suite as cs;

use super::*;
use crate::tls::test_client::{
    SUITES, certs, client, client_reads, connect, drain, pattern, session,
};
use crate::tls::{SealFrom, TlsConn};

#[test]
fn a_real_client_decrypts_exactly_what_the_record_layer_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, root) = certs(dir.path());
    for suite in SUITES {
        let name = format!("{:?}", suite.suite());
        let (mut c, mut s) = connect(&certs, &root, suite);
        // Application data through rustls first (an HTTP answer), then the keys move.
        let answer = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
        let n = s.encrypt(std::iter::once(&answer[..])).unwrap() as u64;
        assert_eq!(client_reads(&mut c, &drain(&mut s, n)), answer, "{name}");
        assert_eq!(s.seal_from_now(|_, _| false), SealFrom::Sealed, "{name}");
        // Batches of parts: empty parts, parts sharing a record, a part over one record,
        // a batch of exactly one full record.
        let batches: Vec<Vec<Vec<u8>>> = vec![
            vec![b"id: 1\ndata: a\n\n".to_vec()],
            vec![Vec::new(), pattern(300, 1), Vec::new(), pattern(7, 2)],
            vec![pattern(40_000, 3), pattern(100, 4)],
            vec![pattern(RECORD_PLAIN_MAX, 5)],
            vec![pattern(RECORD_PLAIN_MAX - 1, 6), pattern(2, 7)],
        ];
        for parts in batches {
            let want: Vec<u8> = parts.concat();
            let plain = s.encrypt(parts.iter().map(Vec::as_slice)).unwrap();
            assert_eq!(plain, want.len());
            let wire = drain(&mut s, plain as u64);
            let records = plain.div_ceil(RECORD_PLAIN_MAX);
            assert!(
                wire.len() >= plain + records * 21,
                "{name}: every record is sealed"
            );
            assert_eq!(client_reads(&mut c, &wire), want, "{name}");
        }
        // Nothing more is read from the client once the keys moved.
        s.on_cipher(b"\x17\x03\x03\x00\x05hello").unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(s.read_plain(&mut buf), 0);
    }
}

#[test]
fn a_tampered_record_is_refused_by_the_client() {
    let (_dir, mut c, mut s) = session(cs::TLS13_AES_256_GCM_SHA384);
    assert_eq!(s.seal_from_now(|_, _| false), SealFrom::Sealed);
    let plain = s.encrypt(std::iter::once(&b"data: x\n\n"[..])).unwrap();
    let mut wire = drain(&mut s, plain as u64);
    let last = wire.len() - 1;
    wire[last] ^= 1;
    let mut rd = &wire[..];
    c.read_tls(&mut rd).unwrap();
    assert!(
        c.process_new_packets().is_err(),
        "a forged tag must not pass"
    );
}

#[test]
fn keys_stay_with_rustls_while_a_batch_is_being_sent() {
    let (_dir, mut c, mut s) = session(cs::TLS13_AES_128_GCM_SHA256);
    let n = s.encrypt(std::iter::once(&b"answer"[..])).unwrap() as u64;
    let (buf, off) = s.poll_send(n).unwrap();
    assert_eq!(
        s.seal_from_now(|_, _| false),
        SealFrom::Kept,
        "a batch is in flight"
    );
    let len = buf.len() - off;
    let wire = buf[off..].to_vec();
    s.on_sent(buf, len).unwrap();
    assert_eq!(client_reads(&mut c, &wire), b"answer");
    assert_eq!(s.seal_from_now(|_, _| false), SealFrom::Sealed);
    let n = s.encrypt(std::iter::once(&b"after"[..])).unwrap() as u64;
    assert_eq!(client_reads(&mut c, &drain(&mut s, n)), b"after");
}

#[test]
fn the_record_limit_ends_the_connection_instead_of_reusing_a_nonce() {
    let secrets = rustls::ConnectionTrafficSecrets::Aes256Gcm {
        key: rustls::crypto::cipher::AeadKey::from([7u8; 32]),
        iv: rustls::crypto::cipher::Iv::new([1u8; 12]),
    };
    let limit = 1 << 24; // AES-GCM's
    let mut s = Sealer::new(rustls::ProtocolVersion::TLSv1_3, limit - 2, secrets, limit).unwrap();
    let mut out = Vec::new();
    let two = pattern(RECORD_PLAIN_MAX + 1, 0);
    assert_eq!(s.seal(std::iter::once(&two[..]), &mut out), Ok(two.len()));
    let before = out.len();
    assert_eq!(
        s.seal(std::iter::once(&b"x"[..]), &mut out),
        Err(SealError::KeyExhausted)
    );
    assert_eq!(out.len(), before, "nothing appended");
}

/// Records rustls still holds when the keys move (an HTTP answer not sent yet, TLS 1.3
/// tickets) open the first sealed batch, and sealing continues after their sequence numbers.
#[test]
fn records_rustls_still_holds_go_first_and_sealing_continues_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, root) = certs(dir.path());
    for suite in [
        cs::TLS13_AES_128_GCM_SHA256,
        cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ] {
        let mut c = client(root.clone(), suite);
        let mut s = TlsConn::new(certs.current(), Instant::now()).unwrap();
        // The handshake, without taking the server's last flight.
        for _ in 0..10 {
            let mut to_server = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut to_server).unwrap();
            }
            s.on_cipher(&to_server).unwrap();
            if s.established() {
                break;
            }
            let to_client = drain(&mut s, 0);
            client_reads(&mut c, &to_client);
        }
        let answer = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
        s.encrypt(std::iter::once(&answer[..])).unwrap();
        assert_eq!(s.seal_from_now(|_, _| false), SealFrom::Sealed);
        let n = s.encrypt(std::iter::once(&b"after"[..])).unwrap() as u64;
        let got = client_reads(&mut c, &drain(&mut s, n));
        assert_eq!(
            got,
            b"HTTP/1.1 200 OK\r\n\r\nafter".to_vec(),
            "{:?}",
            suite.suite()
        );
    }
}

/// A client's KeyUpdate asking the server to update too, processed before the keys move:
/// rustls' reply (under the old key) goes out first, and the sealer continues on the new key.
#[test]
fn a_key_update_rustls_owes_the_client_is_sent_before_the_keys_move() {
    let (_dir, mut c, mut s) = session(cs::TLS13_CHACHA20_POLY1305_SHA256);
    c.refresh_traffic_keys().unwrap();
    let mut to_server = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut to_server).unwrap();
    }
    s.on_cipher(&to_server).unwrap();
    assert_eq!(s.seal_from_now(|_, _| false), SealFrom::Sealed);
    let n = s.encrypt(std::iter::once(&b"after-ku"[..])).unwrap() as u64;
    assert_eq!(client_reads(&mut c, &drain(&mut s, n)), b"after-ku");
}
