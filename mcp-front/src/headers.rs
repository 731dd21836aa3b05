//! Header rules of the MCP front: case-insensitive lookup with duplicate rejection, `Origin` and
//! `Host` validation against an allow-list (DNS-rebinding protection), and the 2026-07-28
//! `Mcp-Method` / `Mcp-Name` / protocol-version mirror checks (with the `=?base64?…?=` form).
//! Pure functions over bytes; no HTTP parsing (the gateway's HTTP layer hands us name/value
//! pairs) and no decision about status codes beyond the error enums.
#![forbid(unsafe_code)]

use crate::jsonrpc::{Kind, Message};
use std::fmt;

/// Request headers as the HTTP layer parsed them (name, raw value), in order.
#[derive(Debug, Clone, Copy)]
pub struct Headers<'a> {
    pairs: &'a [(&'a str, &'a [u8])],
}

/// A header that must appear at most once appeared more often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateHeader(pub &'static str);

impl<'a> Headers<'a> {
    pub fn new(pairs: &'a [(&'a str, &'a [u8])]) -> Headers<'a> {
        Headers { pairs }
    }

    /// The single value of `name` (case-insensitive), `None` if absent, error if repeated.
    pub fn one(&self, name: &'static str) -> Result<Option<&'a [u8]>, DuplicateHeader> {
        let mut found = None;
        for (n, v) in self.pairs {
            if n.eq_ignore_ascii_case(name) {
                if found.is_some() {
                    return Err(DuplicateHeader(name));
                }
                found = Some(*v);
            }
        }
        Ok(found)
    }

    /// All values of `name` joined by `,` (for list headers such as `Accept`).
    pub fn joined(&self, name: &str) -> String {
        let mut out = String::new();
        for (n, v) in self.pairs {
            if n.eq_ignore_ascii_case(name) {
                if !out.is_empty() {
                    out.push(',');
                }
                out.push_str(&String::from_utf8_lossy(v));
            }
        }
        out
    }
}

pub const ORIGIN: &str = "origin";
pub const HOST: &str = "host";
pub const SESSION_ID: &str = "mcp-session-id";
pub const PROTOCOL_VERSION: &str = "mcp-protocol-version";
pub const LAST_EVENT_ID: &str = "last-event-id";
pub const MCP_METHOD: &str = "mcp-method";
pub const MCP_NAME: &str = "mcp-name";
pub const ACCEPT: &str = "accept";
/// Read only with `--mcp-forward-authorization` (the gateway's access gate checks the token).
pub const AUTHORIZATION: &str = "authorization";

/// Which origins and hosts may talk to the MCP endpoint.
#[derive(Debug, Clone)]
pub struct OriginPolicy {
    /// Exact origins (`scheme://host[:port]`, compared case-insensitively) allowed besides
    /// loopback ones (flag `--mcp-allow-origin`, repeatable).
    pub origins: Vec<String>,
    /// Host names (without port) allowed in `Host` besides loopback ones.
    pub hosts: Vec<String>,
    /// Allow `localhost`, `127.0.0.1`, `[::1]` (any port) as origin host and `Host`.
    pub allow_loopback: bool,
}

impl Default for OriginPolicy {
    fn default() -> Self {
        OriginPolicy {
            origins: Vec::new(),
            hosts: Vec::new(),
            allow_loopback: true,
        }
    }
}

/// Why a request is refused with 403.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForbiddenError {
    /// `Origin` present and not allowed (value shown lossily).
    Origin(String),
    /// `Host` present and not allowed.
    Host(String),
}

impl fmt::Display for ForbiddenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForbiddenError::Origin(o) => write!(f, "origin {o:?} is not allowed"),
            ForbiddenError::Host(h) => write!(f, "host {h:?} is not allowed"),
        }
    }
}

fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host == "127.0.0.1" || host == "[::1]"
}

/// Splits `host[:port]` (IPv6 in brackets); the port, if any, must be decimal.
fn split_host_port(s: &str) -> Option<&str> {
    let (host, port) = if s.starts_with('[') {
        let end = s.find(']')?;
        let (h, rest) = s.split_at(end + 1);
        (h, rest.strip_prefix(':'))
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    if host.is_empty() {
        return None;
    }
    Some(host)
}

impl OriginPolicy {
    fn host_allowed(&self, host: &str) -> bool {
        (self.allow_loopback && is_loopback_host(host))
            || self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }

    /// `Origin` absent → allowed (non-browser clients send none); present → must be an allowed
    /// origin: `http(s)://<allowed host>[:port]` or listed exactly. `null` is never allowed.
    pub fn check_origin(&self, origin: Option<&[u8]>) -> Result<(), ForbiddenError> {
        let Some(raw) = origin else { return Ok(()) };
        let deny = || ForbiddenError::Origin(String::from_utf8_lossy(raw).into_owned());
        let s = std::str::from_utf8(raw).map_err(|_| deny())?;
        if self.origins.iter().any(|o| o.eq_ignore_ascii_case(s)) {
            return Ok(());
        }
        let rest = s
            .strip_prefix("http://")
            .or_else(|| s.strip_prefix("https://"))
            .ok_or_else(deny)?;
        let host = split_host_port(rest).ok_or_else(deny)?;
        if self.host_allowed(host) {
            Ok(())
        } else {
            Err(deny())
        }
    }

    /// `Host` absent → allowed here (HTTP/1.1 requires it; the HTTP layer enforces that);
    /// present → its host part must be allowed.
    pub fn check_host(&self, host: Option<&[u8]>) -> Result<(), ForbiddenError> {
        let Some(raw) = host else { return Ok(()) };
        let deny = || ForbiddenError::Host(String::from_utf8_lossy(raw).into_owned());
        let s = std::str::from_utf8(raw).map_err(|_| deny())?;
        let h = split_host_port(s).ok_or_else(deny)?;
        if self.host_allowed(h) {
            Ok(())
        } else {
            Err(deny())
        }
    }
}

/// Why a 2026-07-28 request's mirrored headers do not match its body (→ 400, -32020).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MirrorError {
    MissingMethod,
    MethodMismatch {
        header: String,
        body: String,
    },
    MissingName,
    NameMismatch {
        header: String,
        body: String,
    },
    /// A header value with bytes outside visible ASCII / space / tab, or a bad base64 form.
    InvalidValue(&'static str),
    /// `MCP-Protocol-Version` differs from `_meta["io.modelcontextprotocol/protocolVersion"]`.
    VersionMismatch {
        header: String,
        body: String,
    },
    /// A modern-looking body (`_meta` protocol version) without the version header.
    MissingVersion,
}

impl fmt::Display for MirrorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MirrorError::MissingMethod => {
                write!(f, "Header mismatch: Mcp-Method header is required")
            }
            MirrorError::MethodMismatch { header, body } => write!(
                f,
                "Header mismatch: Mcp-Method header value '{header}' does not match body value '{body}'"
            ),
            MirrorError::MissingName => write!(
                f,
                "Header mismatch: Mcp-Name header is required for this method"
            ),
            MirrorError::NameMismatch { header, body } => write!(
                f,
                "Header mismatch: Mcp-Name header value '{header}' does not match body value '{body}'"
            ),
            MirrorError::InvalidValue(h) => {
                write!(f, "Header mismatch: {h} header value is malformed")
            }
            MirrorError::VersionMismatch { header, body } => write!(
                f,
                "Header mismatch: MCP-Protocol-Version header value '{header}' does not match body value '{body}'"
            ),
            MirrorError::MissingVersion => write!(
                f,
                "Header mismatch: MCP-Protocol-Version header is required"
            ),
        }
    }
}

/// Methods whose `Mcp-Name` is required, and the params field it mirrors.
fn name_field(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    }
}

/// Decodes a header value: plain visible ASCII / space / tab as is, or the exact-case
/// `=?base64?…?=` sentinel form (UTF-8 after decoding).
pub fn decode_header_value(raw: &[u8], header: &'static str) -> Result<String, MirrorError> {
    if !raw
        .iter()
        .all(|&b| b == b'\t' || (0x20..=0x7e).contains(&b))
    {
        return Err(MirrorError::InvalidValue(header));
    }
    let s = std::str::from_utf8(raw).map_err(|_| MirrorError::InvalidValue(header))?;
    match s
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        Some(b64) => {
            let bytes = base64_decode(b64).ok_or(MirrorError::InvalidValue(header))?;
            String::from_utf8(bytes).map_err(|_| MirrorError::InvalidValue(header))
        }
        None => Ok(s.to_owned()),
    }
}

/// Standard base64 with `=` padding (RFC 4648 §4), strict: length multiple of 4, padding only
/// at the end. Small enough not to warrant a crate.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let b = s.as_bytes();
    if !b.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (i, chunk) in b.chunks(4).enumerate() {
        let last = i == b.len() / 4 - 1;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | val(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

/// The 2026-07-28 Server Validation rules for one request (notifications carry no mirrors).
pub fn check_modern_mirrors(
    h: &Headers<'_>,
    msg: &Message,
    version_header: &str,
) -> Result<(), MirrorError> {
    if let Some(body_v) = msg.meta_protocol_version()
        && body_v != version_header
    {
        return Err(MirrorError::VersionMismatch {
            header: version_header.to_owned(),
            body: body_v.to_owned(),
        });
    }
    let Kind::Request { method, .. } = &msg.kind else {
        return Ok(());
    };
    let hm = h
        .one(MCP_METHOD)
        .map_err(|_| MirrorError::InvalidValue("Mcp-Method"))?;
    let hm = decode_plain(hm.ok_or(MirrorError::MissingMethod)?, "Mcp-Method")?;
    if hm != *method {
        return Err(MirrorError::MethodMismatch {
            header: hm,
            body: method.clone(),
        });
    }
    if let Some(field) = name_field(method) {
        let body = msg
            .params()
            .and_then(|p| p.get(field))
            .and_then(|v| v.as_str());
        let hn = h
            .one(MCP_NAME)
            .map_err(|_| MirrorError::InvalidValue("Mcp-Name"))?;
        match (hn, body) {
            (None, Some(_)) => return Err(MirrorError::MissingName),
            (None, None) => {} // nothing to mirror: the upstream rejects the missing param
            (Some(raw), b) => {
                let hn = decode_header_value(raw, "Mcp-Name")?;
                if Some(hn.as_str()) != b {
                    return Err(MirrorError::NameMismatch {
                        header: hn,
                        body: b.unwrap_or("").to_owned(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// `Mcp-Method` is never base64-encoded (method names are ASCII).
fn decode_plain(raw: &[u8], header: &'static str) -> Result<String, MirrorError> {
    if !raw.iter().all(|&b| (0x21..=0x7e).contains(&b)) {
        return Err(MirrorError::InvalidValue(header));
    }
    String::from_utf8(raw.to_vec()).map_err(|_| MirrorError::InvalidValue(header))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonrpc::{Body, classify};

    fn msg(s: &str) -> Message {
        match classify(s.as_bytes(), 1).unwrap() {
            Body::Single(m) => m,
            Body::Batch(_) => unreachable!(),
        }
    }

    #[test]
    fn lookup_is_case_insensitive_and_rejects_duplicates() {
        let pairs: [(&str, &[u8]); 3] = [("Mcp-Session-Id", b"a"), ("X", b"1"), ("x", b"2")];
        let h = Headers::new(&pairs);
        assert_eq!(h.one(SESSION_ID), Ok(Some(&b"a"[..])));
        assert_eq!(h.one("x"), Err(DuplicateHeader("x")));
        assert_eq!(h.one(ORIGIN), Ok(None));
        assert_eq!(h.joined("x"), "1,2");
    }

    /// SPEC-NOTES C1.
    #[test]
    fn origin_rules() {
        let p = OriginPolicy::default();
        assert_eq!(p.check_origin(None), Ok(()));
        for ok in [
            "http://localhost:3000",
            "http://127.0.0.1",
            "https://[::1]:8443",
            "http://LOCALHOST:1",
        ] {
            assert_eq!(p.check_origin(Some(ok.as_bytes())), Ok(()), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "null",
            "http://localhost.evil.example",
            "http://127.0.0.1.nip.io",
            "ftp://localhost",
            "http://localhost:99999x",
            "http://",
        ] {
            assert!(p.check_origin(Some(bad.as_bytes())).is_err(), "{bad}");
        }
        let p2 = OriginPolicy {
            origins: vec!["https://app.example".into()],
            hosts: vec![],
            allow_loopback: false,
        };
        assert_eq!(p2.check_origin(Some(b"https://app.example")), Ok(()));
        assert!(p2.check_origin(Some(b"http://localhost")).is_err());
    }

    /// SPEC-NOTES C2.
    #[test]
    fn host_rules() {
        let p = OriginPolicy::default();
        assert_eq!(p.check_host(Some(b"127.0.0.1:8080")), Ok(()));
        assert_eq!(p.check_host(Some(b"localhost")), Ok(()));
        assert_eq!(p.check_host(Some(b"[::1]:1")), Ok(()));
        assert!(p.check_host(Some(b"evil.example:8080")).is_err());
        assert!(p.check_host(Some(b"127.0.0.1:")).is_err());
        let p2 = OriginPolicy {
            hosts: vec!["mcp.internal".into()],
            ..OriginPolicy::default()
        };
        assert_eq!(p2.check_host(Some(b"MCP.internal:443")), Ok(()));
    }

    #[test]
    fn base64_strict() {
        assert_eq!(
            base64_decode("SGVsbG8sIOS4lueVjA==").unwrap(),
            "Hello, 世界".as_bytes()
        );
        assert_eq!(base64_decode("IHBhZGRlZCA=").unwrap(), b" padded ");
        assert_eq!(base64_decode("").unwrap(), b"");
        assert!(base64_decode("abc").is_none());
        assert!(base64_decode("ab=c").is_none());
        assert!(base64_decode("a===").is_none());
        assert!(base64_decode("ab==abcd").is_none());
    }

    const CALL: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_weather","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;

    /// SPEC-NOTES M5: matching headers pass.
    #[test]
    fn modern_mirrors_match() {
        let pairs: [(&str, &[u8]); 2] =
            [("Mcp-Method", b"tools/call"), ("Mcp-Name", b"get_weather")];
        assert_eq!(
            check_modern_mirrors(&Headers::new(&pairs), &msg(CALL), "2026-07-28"),
            Ok(())
        );
    }

    /// SPEC-NOTES M5: Mcp-Method mismatch / missing / case.
    #[test]
    fn modern_method_rules() {
        let m = msg(CALL);
        let p1: [(&str, &[u8]); 2] = [("Mcp-Method", b"tools/list"), ("Mcp-Name", b"get_weather")];
        assert!(matches!(
            check_modern_mirrors(&Headers::new(&p1), &m, "2026-07-28"),
            Err(MirrorError::MethodMismatch { .. })
        ));
        let p2: [(&str, &[u8]); 1] = [("Mcp-Name", b"get_weather")];
        assert_eq!(
            check_modern_mirrors(&Headers::new(&p2), &m, "2026-07-28"),
            Err(MirrorError::MissingMethod)
        );
        let p3: [(&str, &[u8]); 2] = [("Mcp-Method", b"Tools/Call"), ("Mcp-Name", b"get_weather")];
        assert!(matches!(
            check_modern_mirrors(&Headers::new(&p3), &m, "2026-07-28"),
            Err(MirrorError::MethodMismatch { .. })
        ));
    }

    /// SPEC-NOTES M5: Mcp-Name missing, mismatched, base64-decoded before comparing.
    #[test]
    fn modern_name_rules() {
        let m = msg(CALL);
        let p1: [(&str, &[u8]); 1] = [("Mcp-Method", b"tools/call")];
        assert_eq!(
            check_modern_mirrors(&Headers::new(&p1), &m, "2026-07-28"),
            Err(MirrorError::MissingName)
        );
        let p2: [(&str, &[u8]); 2] = [("Mcp-Method", b"tools/call"), ("Mcp-Name", b"foo")];
        assert!(matches!(
            check_modern_mirrors(&Headers::new(&p2), &m, "2026-07-28"),
            Err(MirrorError::NameMismatch { .. })
        ));
        // base64 of "get_weather"
        let p3: [(&str, &[u8]); 2] = [
            ("Mcp-Method", b"tools/call"),
            ("Mcp-Name", b"=?base64?Z2V0X3dlYXRoZXI=?="),
        ];
        assert_eq!(
            check_modern_mirrors(&Headers::new(&p3), &m, "2026-07-28"),
            Ok(())
        );
        let p4: [(&str, &[u8]); 2] = [
            ("Mcp-Method", b"tools/call"),
            ("Mcp-Name", b"=?base64?!!?="),
        ];
        assert_eq!(
            check_modern_mirrors(&Headers::new(&p4), &m, "2026-07-28"),
            Err(MirrorError::InvalidValue("Mcp-Name"))
        );
        let read = msg(
            r#"{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"file:///a b"}}"#,
        );
        let p5: [(&str, &[u8]); 2] = [
            ("Mcp-Method", b"resources/read"),
            ("Mcp-Name", b"file:///a b"),
        ];
        assert_eq!(
            check_modern_mirrors(&Headers::new(&p5), &read, "2026-07-28"),
            Ok(())
        );
    }

    /// SPEC-NOTES M4: header version vs `_meta` version.
    #[test]
    fn modern_version_mismatch() {
        let pairs: [(&str, &[u8]); 2] =
            [("Mcp-Method", b"tools/call"), ("Mcp-Name", b"get_weather")];
        assert!(matches!(
            check_modern_mirrors(&Headers::new(&pairs), &msg(CALL), "2026-01-01"),
            Err(MirrorError::VersionMismatch { .. })
        ));
    }
}
