//! TLS for a whole node's seeds that ask for it: a self-signed Ed25519 certificate for the
//! node (`--tls-cert-file`, `--tls-key-file`; Ed25519 so that every handshake has the same
//! sizes whatever the keys: a seed's trace does not depend on them), and the clients' rustls
//! configuration that trusts it. Every connection of such a seed is TLS: the node's handshakes,
//! its rustls answers and its subscribers' own record layer (`tls::record`; the simulated
//! kernel has no kernel TLS) run under the kernel's partial sends, reordering and cuts.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::ServerName;

/// The node's certificate files and the clients' configuration.
#[derive(Debug, Clone)]
pub struct TlsSetup {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    client: Arc<rustls::ClientConfig>,
}

impl TlsSetup {
    /// A certificate for `localhost`, written into `dir`.
    pub fn new(dir: &Path) -> Result<TlsSetup, String> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(|e| e.to_string())?;
        let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .map_err(|e| e.to_string())?;
        let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
        let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert_file, cert.pem()).map_err(|e| e.to_string())?;
        std::fs::write(&key_file, key.serialize_pem()).map_err(|e| e.to_string())?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).map_err(|e| e.to_string())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(TlsSetup {
            cert_file,
            key_file,
            client: Arc::new(client),
        })
    }

    /// A client session for one connection.
    pub fn session(&self) -> rustls::ClientConnection {
        let name = ServerName::try_from("localhost").expect("a DNS name");
        rustls::ClientConnection::new(self.client.clone(), name).expect("a client session")
    }
}
