//! A client's credential on its way to an HTTP upstream (`--mcp-forward-authorization`): the
//! value of the client's `Authorization` header. It must never be logged, printed, put in
//! metrics or in an error body, so the type has no `Display`, its `Debug` prints
//! `<redacted>`, and its text is reachable only through [`Credential::expose`] (called where
//! the HTTP upstream writes its request head) and removed from upstream text that might echo
//! it with [`Credential::scrub`].
#![forbid(unsafe_code)]

use std::fmt;

/// What [`Credential::scrub`] puts in place of the credential.
pub const REDACTED: &str = "<redacted>";

/// The credential part shorter than this is not scrubbed on its own (it would match ordinary
/// words); the whole header value always is.
const SCRUB_TOKEN_BYTES_MIN: usize = 8;

/// The value of one `Authorization` header. See the module doc.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(String);

impl Credential {
    /// The header value, if it can go into an HTTP request head verbatim: not empty, visible
    /// ASCII, spaces and tabs only (no CR, LF or other control byte), at most 8 KiB.
    pub fn from_header(raw: &[u8]) -> Option<Credential> {
        let ok = !raw.is_empty()
            && raw.len() <= 8192
            && raw
                .iter()
                .all(|&b| b == b' ' || b == b'\t' || (0x21..=0x7e).contains(&b));
        let text = std::str::from_utf8(raw).ok()?.trim();
        (ok && !text.is_empty()).then(|| Credential(text.to_owned()))
    }

    /// The header value, for the upstream request head only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the header value, and of its credential part (after
    /// the scheme, e.g. the token of `Bearer <token>`), replaced by [`REDACTED`]: for text the
    /// upstream wrote (an error body may echo what it was sent).
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.replace(&self.0, REDACTED);
        if let Some((_, token)) = self.0.split_once([' ', '\t']) {
            let token = token.trim();
            if token.len() >= SCRUB_TOKEN_BYTES_MIN {
                out = out.replace(token, REDACTED);
            }
        }
        out
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credential({REDACTED})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let c = Credential::from_header(b"Bearer s3cr3t-token-value").unwrap();
        let shown = format!("{c:?} {:?} {:#?}", Some(&c), vec![c.clone()]);
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert_eq!(c.expose(), "Bearer s3cr3t-token-value");
    }

    #[test]
    fn only_values_safe_in_a_head_are_taken() {
        assert!(Credential::from_header(b"Bearer a\r\nX-Evil: 1").is_none());
        assert!(Credential::from_header(b"Bearer a\nb").is_none());
        assert!(Credential::from_header(b"Bearer \x00").is_none());
        assert!(Credential::from_header(b"").is_none());
        assert!(Credential::from_header(b"   ").is_none());
        assert!(Credential::from_header("Bearer \u{e9}".as_bytes()).is_none());
        assert!(Credential::from_header(&[b'a'; 8193]).is_none());
        let c = Credential::from_header(b" Basic dXNlcjpwYXNz ").unwrap();
        assert_eq!(c.expose(), "Basic dXNlcjpwYXNz");
    }

    #[test]
    fn scrub_removes_the_value_and_its_token() {
        let c = Credential::from_header(b"Bearer abcdefgh.ijk.lmn").unwrap();
        let s = c.scrub("got Bearer abcdefgh.ijk.lmn; token abcdefgh.ijk.lmn is expired");
        assert_eq!(s, "got <redacted>; token <redacted> is expired");
        // A short credential part is left alone inside other words; the whole value is not.
        let c = Credential::from_header(b"Key ab").unwrap();
        assert_eq!(c.scrub("Key ab: tab"), "<redacted>: tab");
    }
}
