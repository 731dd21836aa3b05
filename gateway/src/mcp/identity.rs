//! Who an MCP session belongs to: an identity derived from a token's issuer and subject with
//! HMAC-SHA256, keyed by a random secret kept in the data directory (`mcp-session.key`, 32
//! bytes, created mode 0600 at the first start with the MCP front). The MCP front binds each
//! session to it (the session ID's tag, `mcp_front::core::subject_tag`), so a session ID
//! neither names nor confirms a subject; and gateways that share the key file (cluster mode)
//! derive the same identity, so a session resumes on any node. Losing the key unbinds every
//! session (their owners re-initialize).
#![forbid(unsafe_code)]

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use auth::Access;
use hmac::{KeyInit, Mac};

/// The key file's name in `--data-dir`.
pub const KEY_FILE: &str = "mcp-session.key";
/// Bytes of the key (the HMAC-SHA256 block of security).
pub const KEY_BYTES: usize = 32;

/// The key identities are derived with. Its `Debug` shows no byte of it.
pub struct SessionKey([u8; KEY_BYTES]);

impl SessionKey {
    /// The key of `data_dir` (`mcp-session.key`), created if there is none. A key file of
    /// another length, or readable by anyone but its owner, is an error naming the file.
    pub fn load_or_create(data_dir: &Path) -> Result<SessionKey, String> {
        let path = data_dir.join(KEY_FILE);
        let shown = path.display();
        let mut key = [0u8; KEY_BYTES];
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut f) => {
                getrandom::fill(&mut key).map_err(|e| format!("{shown}: no randomness: {e}"))?;
                f.write_all(&key)
                    .and_then(|()| f.sync_all())
                    .map_err(|e| format!("{shown}: {e}"))?;
                sync_dir(data_dir)?;
                tracing::info!(file = %shown, "created the MCP session key");
                return Ok(SessionKey(key));
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("{shown}: {e}")),
        }
        read_key(&path, &mut key)?;
        Ok(SessionKey(key))
    }

    /// The key itself (tests, and gateways that share it).
    #[cfg(test)]
    fn from_bytes(key: [u8; KEY_BYTES]) -> SessionKey {
        SessionKey(key)
    }

    /// The identity of `access`: the first 128 bits of HMAC-SHA256(key, len(iss) as 8 bytes
    /// little-endian ‖ iss ‖ sub) in hex; `None` without a subject (no authentication: the
    /// gate lets no token without `sub` reach the MCP front).
    pub fn identity(&self, access: &Access) -> Option<String> {
        let sub = access.subject.as_deref()?;
        let iss = access.issuer.as_deref().unwrap_or("");
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(&(iss.len() as u64).to_le_bytes());
        mac.update(iss.as_bytes());
        mac.update(sub.as_bytes());
        let d = mac.finalize().into_bytes();
        Some(d[..16].iter().map(|b| format!("{b:02x}")).collect())
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

/// Reads an existing key file: exactly [`KEY_BYTES`] bytes, no access for group or others.
fn read_key(path: &PathBuf, key: &mut [u8; KEY_BYTES]) -> Result<(), String> {
    let shown = path.display();
    let mut f = std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?;
    let mode = f
        .metadata()
        .map_err(|e| format!("{shown}: {e}"))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "{shown}: the MCP session key is open to other users (mode {:o}): chmod 600 it",
            mode & 0o777
        ));
    }
    let mut bytes = Vec::with_capacity(KEY_BYTES + 1);
    f.read_to_end(&mut bytes)
        .map_err(|e| format!("{shown}: {e}"))?;
    if bytes.len() != KEY_BYTES {
        return Err(format!(
            "{shown}: the MCP session key must be exactly {KEY_BYTES} bytes, not {} (delete \
             it to have a new one made: every session's owner then re-initializes)",
            bytes.len()
        ));
    }
    key.copy_from_slice(&bytes);
    Ok(())
}

/// Makes the new file's directory entry durable.
fn sync_dir(dir: &Path) -> Result<(), String> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("{}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(iss: Option<&str>, sub: Option<&str>) -> Access {
        Access {
            issuer: iss.map(str::to_owned),
            subject: sub.map(str::to_owned),
            ..Access::anonymous()
        }
    }

    #[test]
    fn identities_are_keyed_and_keep_issuer_and_subject_apart() {
        let k = SessionKey::from_bytes([7; KEY_BYTES]);
        let alice = k.identity(&access(Some("idp"), Some("alice"))).unwrap();
        assert_eq!(alice.len(), 32);
        assert!(!alice.contains("alice"));
        assert_eq!(
            k.identity(&access(Some("idp"), Some("alice"))).unwrap(),
            alice
        );
        assert_ne!(
            k.identity(&access(Some("id"), Some("palice"))).unwrap(),
            alice
        );
        assert_ne!(k.identity(&access(None, Some("alice"))).unwrap(), alice);
        let other = SessionKey::from_bytes([8; KEY_BYTES]);
        assert_ne!(
            other.identity(&access(Some("idp"), Some("alice"))).unwrap(),
            alice
        );
        assert_eq!(k.identity(&access(Some("idp"), None)), None);
        assert_eq!(format!("{k:?}"), "SessionKey(..)");
    }

    #[test]
    fn the_key_file_is_made_once_private_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let a = SessionKey::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(KEY_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = SessionKey::load_or_create(dir.path()).unwrap();
        assert_eq!(a.0, b.0, "the same key at the next start");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = SessionKey::load_or_create(dir.path()).unwrap_err();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, b"short").unwrap();
        let e = SessionKey::load_or_create(dir.path()).unwrap_err();
        assert!(e.contains("exactly 32 bytes, not 5"), "{e}");
    }
}
