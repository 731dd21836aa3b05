//! An in-memory TLS client for the record layer's and the kernel hand-over's tests: rustls'
//! client handshakes with a [`TlsConn`] and decrypts what the server side sealed.

use std::io::{ErrorKind, Read};
use std::sync::Arc;

use rustls::{ClientConfig, ClientConnection, SupportedCipherSuite};

use crate::tls::{Certs, TlsConn};

/// Every AEAD suite of TLS 1.3 and 1.2 the record layer and the kernel hand-over take.
pub const SUITES: [rustls::SupportedCipherSuite; 6] = [
    rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
    rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384,
    rustls::crypto::ring::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
];

/// A self-signed certificate for `localhost` (made here), loaded as the gateway loads its own.
pub fn certs(dir: &std::path::Path) -> (Certs, rustls::pki_types::CertificateDer<'static>) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (c, k) = (dir.join("c.pem"), dir.join("k.pem"));
    std::fs::write(&c, ck.cert.pem()).unwrap();
    std::fs::write(&k, ck.signing_key.serialize_pem()).unwrap();
    (Certs::load(&c, &k).unwrap(), ck.cert.der().clone())
}

/// A client offering only `suite` (so the server picks it).
pub fn client(
    root: rustls::pki_types::CertificateDer<'static>,
    suite: SupportedCipherSuite,
) -> ClientConnection {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![suite];
    let version = match suite {
        SupportedCipherSuite::Tls13(_) => &rustls::version::TLS13,
        SupportedCipherSuite::Tls12(_) => &rustls::version::TLS12,
    };
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root).unwrap();
    let cfg = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    ClientConnection::new(Arc::new(cfg), "localhost".try_into().unwrap()).unwrap()
}

/// Everything the server has to send, as the kernel would take it.
pub fn drain(s: &mut TlsConn, plain: u64) -> Vec<u8> {
    let Some((buf, off)) = s.poll_send(plain) else {
        return Vec::new();
    };
    let out = buf[off..].to_vec();
    let n = out.len();
    assert_eq!(s.on_sent(buf, n).unwrap(), plain);
    out
}

/// Feeds `bytes` to the client and returns the plaintext it decrypted.
pub fn client_reads(c: &mut ClientConnection, mut bytes: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    while !bytes.is_empty() {
        c.read_tls(&mut bytes).unwrap();
        c.process_new_packets()
            .expect("the client accepts every record");
        match c.reader().read_to_end(&mut got) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("client read: {e}"),
        }
    }
    got
}

pub fn handshake(c: &mut ClientConnection, s: &mut TlsConn) {
    for _ in 0..10 {
        let mut to_server = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut to_server).unwrap();
        }
        s.on_cipher(&to_server).unwrap();
        let to_client = drain(s, 0);
        client_reads(c, &to_client);
        if !c.is_handshaking() && s.established() {
            return;
        }
    }
    panic!("no handshake");
}

pub fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// A handshake done with a client offering only `suite`: the certificates' directory (keep it
/// alive), the client and the server side.
pub fn session(suite: SupportedCipherSuite) -> (tempfile::TempDir, ClientConnection, TlsConn) {
    let dir = tempfile::tempdir().unwrap();
    let (certs, root) = certs(dir.path());
    let (c, s) = connect(&certs, &root, suite);
    (dir, c, s)
}

/// A client offering only `suite` and the server side of `certs`, after their handshake.
pub fn connect(
    certs: &Certs,
    root: &rustls::pki_types::CertificateDer<'static>,
    suite: SupportedCipherSuite,
) -> (ClientConnection, TlsConn) {
    let mut c = client(root.clone(), suite);
    let mut s = TlsConn::new(certs.current(), std::time::Instant::now()).unwrap();
    handshake(&mut c, &mut s);
    (c, s)
}
