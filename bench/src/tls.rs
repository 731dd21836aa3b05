//! The load driver's connection: a non-blocking mio `TcpStream`, in the clear or with a
//! rustls client session driven sans-IO over it (`https://` URLs, trusting `--ca-file`).
//!
//! [`Conn`] implements `Read`, `Write` and mio's `Source`, so the load driver's code is the same
//! for both. In the clear, `read`/`write` go straight to the socket (one branch, no copy).
//! Over TLS:
//! - `read` fills the caller's buffer with plaintext; it returns a short count only once the
//!   socket said `WouldBlock` (or EOF), so the driver's edge-triggered rule "a short read means
//!   the socket is drained" still holds. Ciphertext is read from the socket in large reads into
//!   a per-connection buffer and fed to rustls from there (rustls reads 4 KiB per `read_tls`:
//!   fed from the socket directly, that would be a syscall per 4 KiB).
//! - `write` hands the plaintext to rustls (unlimited buffer: it always takes all of it) and
//!   writes the ciphertext out until `WouldBlock`; what is left goes out at the next `write`,
//!   `read` or [`Conn::flush_tls`] (call it on writable events).
//! - Handshake messages are written from `read` as they become due, so a request written
//!   before the handshake completes goes out with the client's Finished.
//! - End of stream: a `close_notify` or a TCP EOF without one both read as `Ok(0)` (the server
//!   closed), as in the clear. When the end comes after some plaintext, that plaintext is
//!   returned first (a short read) and [`Conn::read_closed`] says the `Ok(0)` is due.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use mio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// Ciphertext read from the socket per `read` syscall over TLS.
const CIPHERTEXT_BUF_BYTES: usize = 64 * 1024;

/// A client TLS configuration trusting the certificates in a PEM file (ring provider, TLS 1.2
/// and 1.3): a server certificate byte-identical to one of them is accepted as is (a pinned
/// self-signed certificate: `openssl req -x509` marks it `CA:TRUE`, which webpki refuses as an
/// end-entity certificate); any other chain is verified by webpki with them as roots.
pub fn client_config(ca_file: &Path) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let mut pinned = Vec::new();
    for cert in CertificateDer::pem_file_iter(ca_file)
        .map_err(|e| format!("--ca-file {}: {e}", ca_file.display()))?
    {
        let cert = cert.map_err(|e| format!("--ca-file {}: {e}", ca_file.display()))?;
        pinned.push(cert.clone());
        roots
            .add(cert)
            .map_err(|e| format!("--ca-file {}: {e}", ca_file.display()))?;
    }
    if pinned.is_empty() {
        return Err(format!(
            "--ca-file {}: no CERTIFICATE in it",
            ca_file.display()
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| format!("--ca-file {}: {e}", ca_file.display()))?;
    let verifier = Arc::new(PinnedOrWebPki {
        pinned,
        webpki,
        algs: provider.signature_verification_algorithms,
    });
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// Accepts a server certificate identical to a `--ca-file` one; otherwise webpki decides.
/// Handshake signatures are always verified (with the ring provider's algorithms).
#[derive(Debug)]
struct PinnedOrWebPki {
    pinned: Vec<CertificateDer<'static>>,
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
    algs: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for PinnedOrWebPki {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if self
            .pinned
            .iter()
            .any(|c| c.as_ref() == end_entity.as_ref())
        {
            return Ok(rustls::client::danger::ServerCertVerified::assertion());
        }
        self.webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// The server name a URL's host is checked against: an IP literal (the certificate needs an
/// `IP:` subjectAltName) or a DNS name (`localhost`).
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string()).map_err(|e| format!("server name {host:?}: {e}"))
}

/// The TLS half of a connection.
#[derive(Debug)]
struct Tls {
    conn: rustls::ClientConnection,
    /// Ciphertext read from the socket and not yet handed to rustls: `cbuf[coff..clen]`.
    cbuf: Vec<u8>,
    coff: usize,
    clen: usize,
    /// The socket read EOF (rustls was told).
    sock_eof: bool,
    /// The session ended (close_notify, or EOF without it): the next `read` returns `Ok(0)`.
    closed: bool,
}

/// A load-driver connection: plaintext, or TLS over the same socket.
#[derive(Debug)]
pub struct Conn {
    sock: TcpStream,
    tls: Option<Box<Tls>>,
}

impl Conn {
    /// A plaintext connection.
    pub fn plain(sock: TcpStream) -> Conn {
        Conn { sock, tls: None }
    }

    /// A TLS client connection over `sock` (the handshake starts with the first write or read).
    pub fn tls(
        sock: TcpStream,
        cfg: &Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    ) -> io::Result<Conn> {
        let mut conn = rustls::ClientConnection::new(cfg.clone(), name)
            .map_err(|e| io::Error::other(format!("TLS client: {e}")))?;
        conn.set_buffer_limit(None);
        Ok(Conn {
            sock,
            tls: Some(Box::new(Tls {
                conn,
                cbuf: Vec::new(),
                coff: 0,
                clen: 0,
                sock_eof: false,
                closed: false,
            })),
        })
    }

    /// True over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The socket's pending error (`SO_ERROR`).
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.sock.take_error()
    }

    /// The peer address (an error while the connect is in progress).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.sock.peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Writes pending TLS records until done or `WouldBlock` (nothing to do in the clear).
    pub fn flush_tls(&mut self) -> io::Result<()> {
        let Some(t) = self.tls.as_mut() else {
            return Ok(());
        };
        flush_records(&mut t.conn, &mut self.sock)
    }

    /// True once a TLS session has ended (the next `read` returns `Ok(0)`): a short read then
    /// does not mean "wait for the next readiness event" (none will come). Always false in the
    /// clear, where the end is the `Ok(0)` itself.
    pub fn read_closed(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.closed)
    }

    /// True while TLS records wait for the socket to take them.
    pub fn tls_pending(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.conn.wants_write())
    }
}

fn flush_records(conn: &mut rustls::ClientConnection, sock: &mut TcpStream) -> io::Result<()> {
    while conn.wants_write() {
        match conn.write_tls(sock) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn tls_read(t: &mut Tls, sock: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    if buf.is_empty() {
        return Ok(0);
    }
    let mut n = 0;
    loop {
        // 1. Plaintext rustls already holds.
        while n < buf.len() {
            match t.conn.reader().read(&mut buf[n..]) {
                Ok(0) => {
                    t.closed = true; // close_notify
                    return Ok(n);
                }
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // TCP EOF without close_notify: the server closed all the same.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    t.closed = true;
                    return Ok(n);
                }
                Err(e) => return Err(e),
            }
        }
        if n == buf.len() {
            return Ok(n);
        }
        // 2. Ciphertext already read from the socket.
        if t.coff < t.clen {
            let mut rd = &t.cbuf[t.coff..t.clen];
            let used = t.conn.read_tls(&mut rd)?;
            t.coff += used;
            process(t, sock)?;
            continue;
        }
        if t.sock_eof {
            t.closed = true;
            return Ok(n);
        }
        // 3. The socket.
        if t.cbuf.is_empty() {
            t.cbuf = vec![0; CIPHERTEXT_BUF_BYTES];
        }
        match sock.read(&mut t.cbuf) {
            Ok(0) => {
                t.sock_eof = true;
                let mut empty: &[u8] = &[];
                t.conn.read_tls(&mut empty)?; // tells rustls about the EOF
                process(t, sock)?;
            }
            Ok(k) => {
                t.coff = 0;
                t.clen = k;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return if n > 0 { Ok(n) } else { Err(e) };
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Decrypts what rustls holds; writes what it owes (handshake messages, alerts, a request
/// buffered during the handshake).
fn process(t: &mut Tls, sock: &mut TcpStream) -> io::Result<()> {
    match t.conn.process_new_packets() {
        Ok(_) => flush_records(&mut t.conn, sock),
        Err(e) => {
            let _ = flush_records(&mut t.conn, sock); // the alert, best effort
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("TLS: {e}"),
            ))
        }
    }
}

impl Read for Conn {
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.tls.as_deref_mut() {
            None => self.sock.read(buf),
            Some(t) => tls_read(t, &mut self.sock, buf),
        }
    }
}

impl Write for Conn {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.tls.as_deref_mut() {
            None => self.sock.write(buf),
            Some(t) => {
                let n = t.conn.writer().write(buf)?;
                flush_records(&mut t.conn, &mut self.sock)?;
                Ok(n)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_tls()?;
        self.sock.flush()
    }
}

impl mio::event::Source for Conn {
    fn register(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.sock.register(registry, token, interests)
    }

    fn reregister(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.sock.reregister(registry, token, interests)
    }

    fn deregister(&mut self, registry: &mio::Registry) -> io::Result<()> {
        self.sock.deregister(registry)
    }
}
