//! Trust towards `https://` upstreams. The TLS client is ureq's over our rustls with the ring
//! provider (as the gateway's listener), TLS 1.2 and 1.3. Trust is either the system's root
//! store (`rustls-native-certs`, which honours `SSL_CERT_FILE` / `SSL_CERT_DIR`) or, when
//! `--upstream-ca-file` is given, only the certificates in those PEM files; both are read and
//! checked here at start. The peer's certificate is checked against the URL's host by
//! rustls/webpki: a DNS name against the certificate's DNS names (SNI carries it), an IP
//! literal against its IP addresses (no SNI, as RFC 6066 forbids one for an address). Nothing
//! falls back to plaintext: a failed handshake is a failed connection.

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::path::PathBuf;
use std::sync::Arc;
use ureq::tls::Certificate;

/// The name the upstream's certificate must carry: the URL's host, without the brackets of
/// an IPv6 literal.
pub(super) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(bare.to_owned())
        .map_err(|e| format!("{host:?} is not a valid TLS server name: {e}"))
}

/// The roots: the PEM files when any is given (each may hold several certificates), else the
/// system store. Each is checked as a trust anchor here (the TLS client skips what it cannot
/// parse: a bad file must fail the start instead).
pub(super) fn roots(ca_files: &[PathBuf]) -> Result<Arc<Vec<Certificate<'static>>>, String> {
    let mut checked = RootCertStore::empty();
    let mut ders = Vec::new();
    if ca_files.is_empty() {
        let found = rustls_native_certs::load_native_certs();
        for c in found.certs {
            if checked.add(c.clone()).is_ok() {
                ders.push(c);
            }
        }
        if ders.is_empty() {
            let why = found
                .errors
                .first()
                .map_or_else(|| "none found".to_owned(), ToString::to_string);
            return Err(format!(
                "no usable system root certificate ({why}); give --upstream-ca-file"
            ));
        }
    }
    for f in ca_files {
        let shown = f.display();
        let certs = CertificateDer::pem_file_iter(f)
            .map_err(|e| format!("--upstream-ca-file {shown}: {e}"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--upstream-ca-file {shown}: {e}"))?;
        if certs.is_empty() {
            return Err(format!(
                "--upstream-ca-file {shown}: no PEM certificate in it"
            ));
        }
        for c in certs {
            checked
                .add(c.clone())
                .map_err(|e| format!("--upstream-ca-file {shown}: {e}"))?;
            ders.push(c);
        }
    }
    let certs = ders.iter().map(|c| Certificate::from_der(c).to_owned());
    Ok(Arc::new(certs.collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_from_hosts() {
        assert!(matches!(
            server_name("127.0.0.1"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(server_name("[::1]"), Ok(ServerName::IpAddress(_))));
        assert!(matches!(
            server_name("mcp.example.com"),
            Ok(ServerName::DnsName(_))
        ));
        assert!(server_name("bad host").is_err());
    }

    /// Without --upstream-ca-file the system store is used (it loads on this machine kind; a
    /// machine without one is refused with a pointer to the flag).
    #[test]
    fn system_roots_or_a_clear_refusal() {
        if let Err(e) = roots(&[]) {
            assert!(e.contains("--upstream-ca-file"), "{e}");
        }
    }

    #[test]
    fn ca_files_must_hold_certificates() {
        let dir = std::env::temp_dir().join(format!("mcp-front-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = roots(std::slice::from_ref(&empty)).unwrap_err();
        assert!(e.contains("no PEM certificate"), "{e}");
        let missing = dir.join("missing.pem");
        let e = roots(&[missing]).unwrap_err();
        assert!(e.contains("missing.pem"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
