//! TLS on the listener (`--tls-cert-file`, `--tls-key-file`): rustls, which is sans-IO, sits
//! between the io_uring driver and the connection machine. Ciphertext goes through the
//! driver's receive and send operations; plaintext goes to and from the connection machine and
//! the subscribers' send windows. No socket, no io_uring, no clock here (time passed in).
//!
//! - [`Certs`]: the server configuration (TLS 1.2 and 1.3, ALPN `http/1.1`, session tickets),
//!   replaced whole on SIGHUP; new handshakes take the current one, established connections
//!   keep theirs.
//! - [`TlsConn`]: one connection's session: ciphertext in, plaintext out; plaintext in (an
//!   HTTP answer, or a subscriber's runs straight from the mapped log), one batch of
//!   ciphertext out at a time; and [`map::CipherMap`], which turns the kernel's ciphertext
//!   byte counts into the plaintext the window counts.
//!
//! A subscriber's transmit direction, once its handshake is done, leaves rustls: to the
//! kernel ([`kernel`], `--tls-kernel auto`) where the kernel takes the keys, else to the
//! gateway's own record layer ([`record`]).
#![forbid(unsafe_code)]

pub mod kernel;
pub mod map;
pub mod record;
#[cfg(test)]
mod test_client;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use map::CipherMap;

/// Ciphertext bytes one receive takes: a maximal TLS record (16 KiB + header + overhead).
pub const CIPHER_RECV_BYTES: usize = 16 * 1024 + 512;

/// The server certificate and key, reloadable.
#[derive(Debug)]
pub struct Certs {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<Arc<ServerConfig>>,
}

impl Certs {
    /// Loads the PEM chain and key; an error names the file and the cause.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Certs, String> {
        let cfg = server_config(cert_file, key_file)?;
        Ok(Certs {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            current: RwLock::new(cfg),
        })
    }

    /// The configuration new handshakes use.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.read().expect("certs lock").clone()
    }

    /// Reads the files again; on success new handshakes use them. On failure the old pair
    /// stays (the error says why).
    pub fn reload(&self) -> Result<(), String> {
        let cfg = server_config(&self.cert_file, &self.key_file)?;
        *self.current.write().expect("certs lock") = cfg;
        Ok(())
    }
}

fn server_config(cert_file: &Path, key_file: &Path) -> Result<Arc<ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("--tls-cert-file {}: {e}", cert_file.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "--tls-cert-file {}: no CERTIFICATE in it",
            cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("--tls-key-file {}: {e}", key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("--tls-cert-file / --tls-key-file: {e}"))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    cfg.ticketer = rustls::crypto::ring::Ticketer::new().map_err(|e| format!("tickets: {e}"))?;
    // A subscriber's transmit keys move to its own record layer (record.rs).
    cfg.enable_secret_extraction = true;
    Ok(Arc::new(cfg))
}

/// Whether the kernel offers TLS offload (`tls` in `tcp_available_ulp`).
pub fn ktls_available() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .is_ok_and(|s| s.split_whitespace().any(|u| u == "tls"))
}

/// What [`TlsConn::seal_from_now`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealFrom {
    /// Application data is sealed by the connection's own record layer from now on.
    Sealed,
    /// The kernel holds the transmit keys ([`kernel`]): send plaintext on the socket.
    Kernel,
    /// Not possible now (a batch is being sent, or an unknown version or cipher): rustls
    /// still seals, and the connection works as before.
    Kept,
    /// The session was given up and no record layer took its keys: close the connection.
    Lost,
}

/// One connection's TLS session.
#[derive(Debug)]
pub struct TlsConn {
    /// The session until a subscriber's transmit keys move to `sealer` (`None` after).
    conn: Option<rustls::ServerConnection>,
    /// A subscriber's own record layer ([`TlsConn::seal_from_now`]).
    sealer: Option<record::Sealer>,
    /// Or the kernel's, and the map from its byte counts to plaintext.
    kernel: Option<kernel::KernelTx>,
    /// Received ciphertext rustls has not taken yet (it refuses more while its plaintext
    /// buffer is full): `cin[cin_pos..]`.
    cin: Vec<u8>,
    cin_pos: usize,
    /// The ciphertext batch being sent (`None` while a send holds it), how much of it the
    /// kernel took, and the plaintext it carries (`None`: no batch is being sent).
    cout: Option<Vec<u8>>,
    cout_off: usize,
    carry: Option<u64>,
    pub map: CipherMap,
    started: Instant,
    /// The peer sent `close_notify` (or the session failed): read nothing more.
    pub eof: bool,
}

impl TlsConn {
    pub fn new(cfg: Arc<ServerConfig>, now: Instant) -> Result<TlsConn, rustls::Error> {
        let mut conn = rustls::ServerConnection::new(cfg)?;
        // The gateway bounds what it encrypts at once (one batch: an answer, or at most
        // --send-bytes-max of a subscriber's runs) and sends each batch whole before the next.
        conn.set_buffer_limit(None);
        Ok(TlsConn {
            conn: Some(conn),
            sealer: None,
            kernel: None,
            cin: Vec::new(),
            cin_pos: 0,
            cout: Some(Vec::new()),
            cout_off: 0,
            carry: None,
            map: CipherMap::default(),
            started: now,
            eof: false,
        })
    }

    /// The handshake is complete (application data flows).
    pub fn established(&self) -> bool {
        self.conn.as_ref().is_none_or(|c| !c.is_handshaking())
    }

    /// When the handshake started (the handshake timeout).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Received ciphertext; rustls takes what it can now (the rest waits in the session).
    /// `Err`: a protocol error — the alert is queued to send, then the connection closes.
    pub fn on_cipher(&mut self, bytes: &[u8]) -> Result<(), rustls::Error> {
        if self.cin_pos == self.cin.len() {
            self.cin.clear();
            self.cin_pos = 0;
        }
        self.cin.extend_from_slice(bytes);
        self.feed()
    }

    /// Hands rustls the received ciphertext it has not taken yet.
    pub fn feed(&mut self) -> Result<(), rustls::Error> {
        let Some(conn) = self.conn.as_mut() else {
            // A subscriber on its own record layer reads nothing more.
            self.cin.clear();
            self.cin_pos = 0;
            return Ok(());
        };
        while self.cin_pos < self.cin.len() {
            let mut rest = &self.cin[self.cin_pos..];
            match conn.read_tls(&mut rest) {
                Ok(0) => break,
                Ok(n) => self.cin_pos += n,
                // Its plaintext buffer is full: the rest waits until plaintext is read.
                Err(_) => break,
            }
            conn.process_new_packets()?;
        }
        if self.cin_pos == self.cin.len() && self.cin.capacity() > CIPHER_RECV_BYTES * 2 {
            self.cin = Vec::new();
            self.cin_pos = 0;
        }
        Ok(())
    }

    /// Whether received ciphertext is still waiting for rustls (receive no more until it is
    /// taken).
    pub fn backlog(&self) -> bool {
        self.cin_pos < self.cin.len()
    }

    /// Moves decrypted plaintext into `dst`; 0 when none is ready (or after `close_notify`,
    /// which sets `eof`).
    pub fn read_plain(&mut self, dst: &mut [u8]) -> usize {
        let Some(conn) = self.conn.as_mut().filter(|_| !dst.is_empty()) else {
            return 0;
        };
        match conn.reader().read(dst) {
            Ok(0) => {
                self.eof = true;
                0
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(_) => {
                self.eof = true; // peer closed without close_notify
                0
            }
        }
    }

    /// Encrypts `parts` as application data (after the handshake), to go out with the next
    /// batch; returns the plaintext length. `Err`: this connection's key may seal no more
    /// records ([`record::RECORDS_MAX`]): end it (nothing was encrypted).
    pub fn encrypt<'a>(
        &mut self,
        parts: impl Iterator<Item = &'a [u8]> + Clone,
    ) -> Result<usize, record::SealError> {
        if let Some(s) = &mut self.sealer {
            let out = self.cout.as_mut().expect("no batch is being sent");
            return s.seal(parts, out);
        }
        let conn = self.conn.as_mut().expect("a session or a record layer");
        let mut n = 0;
        for p in parts {
            conn.writer()
                .write_all(p)
                .expect("rustls buffers all plaintext (no buffer limit set)");
            n += p.len();
        }
        Ok(n)
    }

    /// Whether application data is sealed outside rustls (the record layer or the kernel).
    pub fn sealed(&self) -> bool {
        self.sealer.is_some() || self.kernel.is_some()
    }

    /// The kernel's record layer, when it holds the transmit keys.
    pub fn kernel(&mut self) -> Option<&mut kernel::KernelTx> {
        self.kernel.as_mut()
    }

    /// A subscriber's transmit keys leave rustls: to the kernel if `to_kernel` installs them
    /// (it gets them in the kernel's form and the ciphertext bytes written so far, and says
    /// whether the kernel took them), else to its own record layer ([`record`]). From now on
    /// application data is sealed by one of them, and nothing more is read. TLS records
    /// rustls still holds (e.g. session tickets) open the next batch; with any, the keys go
    /// to the record layer (the kernel would seal those records' bytes again). Only with no
    /// batch being sent, after the handshake, for the versions and ciphers [`record`] knows;
    /// otherwise the session stays as it was.
    pub fn seal_from_now(
        &mut self,
        to_kernel: impl FnOnce(&kernel::CryptoInfo, u64) -> bool,
    ) -> SealFrom {
        if self.kernel.is_some() {
            return SealFrom::Kernel;
        }
        if self.sealer.is_some() {
            return SealFrom::Sealed;
        }
        let Some(conn) = self.conn.as_mut() else {
            return SealFrom::Lost;
        };
        if self.carry.is_some() || conn.is_handshaking() {
            return SealFrom::Kept;
        }
        let (Some(version), Some(suite)) =
            (conn.protocol_version(), conn.negotiated_cipher_suite())
        else {
            return SealFrom::Kept;
        };
        if !record::knows(suite.suite()) {
            return SealFrom::Kept;
        }
        let limit = match suite {
            rustls::SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
            rustls::SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
        }
        .min(record::RECORDS_MAX);
        // An empty write makes rustls queue what it parked to send before more application
        // data — a KeyUpdate it owes the client, sealed under the old key — so it is drained
        // below; `wants_write` alone does not see it (and the client could then decrypt
        // nothing the new keys seal).
        let _ = conn.writer().write(&[]);
        let out = self.cout.as_mut().expect("no batch is being sent");
        out.clear();
        while conn.wants_write() {
            conn.write_tls(out)
                .expect("writing TLS records into a Vec cannot fail");
        }
        let queued = !out.is_empty();
        let conn = self.conn.take().expect("checked");
        // Checked above: only a rustls that changed its rules could refuse here, and the
        // session is gone then.
        let Ok(secrets) = conn.dangerous_extract_secrets() else {
            return SealFrom::Lost;
        };
        let (seq, tx) = secrets.tx;
        if !queued && let Some(info) = kernel::CryptoInfo::new(version, seq, &tx) {
            let written = self.map.cipher_taken();
            if to_kernel(&info, written) {
                self.kernel = Some(kernel::KernelTx::new(&info, written, limit));
                return SealFrom::Kernel;
            }
        }
        self.sealer = record::Sealer::new(version, seq, tx, limit);
        if self.sealer.is_some() {
            SealFrom::Sealed
        } else {
            SealFrom::Lost
        }
    }

    /// Takes the next ciphertext batch to send, if there is one and no batch is being sent:
    /// the buffer and the offset to send from. `plain`: the plaintext it carries (encrypted
    /// since the last batch), handed back by [`TlsConn::on_sent`] once the kernel took it all.
    pub fn poll_send(&mut self, plain: u64) -> Option<(Vec<u8>, usize)> {
        if self.cout.is_none() || self.carry.is_some() {
            return None;
        }
        let Some(conn) = self.conn.as_mut() else {
            // The record layer sealed into the batch buffer itself.
            if self.cout.as_ref().is_some_and(Vec::is_empty) {
                return None;
            }
            self.cout_off = 0;
            self.carry = Some(plain);
            return self.cout.take().map(|b| (b, 0));
        };
        if !conn.wants_write() {
            return None;
        }
        let mut buf = self.cout.take().expect("checked");
        buf.clear();
        while conn.wants_write() {
            conn.write_tls(&mut buf)
                .expect("writing TLS records into a Vec cannot fail");
        }
        self.cout_off = 0;
        self.carry = Some(plain);
        Some((buf, 0))
    }

    /// Whether a batch is being sent.
    pub fn sending(&self) -> bool {
        self.carry.is_some()
    }

    /// The kernel took `n` bytes of the batch from its offset. `Ok(plain)` when the batch is
    /// all taken (the buffer is kept for the next one); `Err((buf, off))`: send the rest.
    pub fn on_sent(&mut self, buf: Vec<u8>, n: usize) -> Result<u64, (Vec<u8>, usize)> {
        self.map.taken(n as u64);
        self.cout_off += n;
        if self.cout_off < buf.len() {
            return Err((buf, self.cout_off));
        }
        let plain = self.carry.take().expect("a batch was being sent");
        self.map.batch_done(plain);
        let mut buf = buf;
        buf.clear();
        self.cout = Some(buf);
        Ok(plain)
    }
}
