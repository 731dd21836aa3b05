//! What the bench talks to: URL templates with a `{stream}` placeholder, the publish style and
//! the event-ID style, so one scenario runs unchanged against the gateway or nginx + nchan.
//!
//! Only `http://` and `https://` URLs with an IPv4 literal or `localhost` host are accepted: the
//! bench runs on loopback and does no DNS. `https://` is spoken by the load scenarios (fanout,
//! resume-storm, slow, idle; see `tls`), trusting `--ca-file`.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// How events are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum PublishStyle {
    /// The gateway: `POST` body = event data; batches as newline-delimited JSON (see README).
    Gateway,
    /// nchan's publisher location: `POST` body = message; no batch form.
    Nchan,
}

/// How event IDs are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum IdStyle {
    /// `<epoch16hex>-<stream>-<seq>`: the sequence is checked beside the payload counter.
    Gateway,
    /// nchan's `time:tag`: opaque; only the payload counter is checked.
    Nchan,
}

/// Why a URL template is unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlError {
    /// Neither `http://` nor `https://`.
    NotHttp,
    /// The host is not an IPv4 literal or `localhost`.
    BadHost(String),
    /// The port is not a number in 1..=65535.
    BadPort(String),
    /// A `{...}` placeholder other than `{stream}`, or an unclosed `{`.
    BadPlaceholder(String),
}

impl std::fmt::Display for UrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UrlError::NotHttp => write!(f, "URL must start with http:// or https://"),
            UrlError::BadHost(h) => write!(f, "host {h:?} is not an IPv4 literal or localhost"),
            UrlError::BadPort(p) => write!(f, "port {p:?} is not in 1..=65535"),
            UrlError::BadPlaceholder(p) => write!(f, "unknown placeholder {p:?} (only {{stream}})"),
        }
    }
}

/// A parsed URL template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlTemplate {
    /// Where to connect.
    pub addr: SocketAddr,
    /// The `Host` header value.
    pub host_header: String,
    /// `https://`: TLS over the connection.
    pub tls: bool,
    /// The host as written (the TLS server name).
    pub host: String,
    /// Path and query, split at each `{stream}`.
    parts: Vec<String>,
}

impl UrlTemplate {
    /// Parse `http[s]://host[:port]/path?query` with `{stream}` placeholders anywhere in the
    /// path or query.
    pub fn parse(s: &str) -> Result<Self, UrlError> {
        let (tls, rest) = match (s.strip_prefix("http://"), s.strip_prefix("https://")) {
            (Some(r), _) => (false, r),
            (None, Some(r)) => (true, r),
            (None, None) => return Err(UrlError::NotHttp),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| UrlError::BadPort(p.to_string()))?,
            ),
            None => (authority, if tls { 443 } else { 80 }),
        };
        let ip: Ipv4Addr = if host == "localhost" {
            Ipv4Addr::LOCALHOST
        } else {
            host.parse()
                .map_err(|_| UrlError::BadHost(host.to_string()))?
        };
        let mut parts = Vec::new();
        let mut cur = String::new();
        let mut it = path;
        while let Some(open) = it.find('{') {
            cur.push_str(&it[..open]);
            let close = it[open..]
                .find('}')
                .ok_or_else(|| UrlError::BadPlaceholder(it[open..].to_string()))?
                + open;
            let name = &it[open..=close];
            if name != "{stream}" {
                return Err(UrlError::BadPlaceholder(name.to_string()));
            }
            parts.push(std::mem::take(&mut cur));
            it = &it[close + 1..];
        }
        cur.push_str(it);
        parts.push(cur);
        Ok(Self {
            addr: SocketAddr::V4(SocketAddrV4::new(ip, port)),
            host_header: authority.to_string(),
            tls,
            host: host.to_string(),
            parts,
        })
    }

    /// Append the path and query for `stream` to `out`.
    pub fn render_path(&self, stream: &str, out: &mut Vec<u8>) {
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(stream.as_bytes());
            }
            out.extend_from_slice(p.as_bytes());
        }
    }

    /// True when the rendered path has a query string already.
    pub fn has_query(&self) -> bool {
        self.parts.iter().any(|p| p.contains('?'))
    }
}

/// Why a bearer token is unusable as an HTTP header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BearerError {
    /// Nothing but whitespace.
    Empty,
    /// A byte that cannot appear in a token68 header value (a control byte, a space, non-ASCII).
    BadByte(u8),
}

impl std::fmt::Display for BearerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BearerError::Empty => write!(f, "the bearer token is empty"),
            BearerError::BadByte(b) => {
                write!(
                    f,
                    "the bearer token holds byte 0x{b:02x} (not a visible ASCII character)"
                )
            }
        }
    }
}

/// The `Authorization: Bearer <token>` header sent on every publish and subscribe request, or
/// nothing (the default: no header at all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bearer {
    /// The whole header line, CRLF included; empty when there is no token.
    line: Vec<u8>,
}

impl Bearer {
    /// No token: requests carry no `Authorization` header.
    pub fn none() -> Bearer {
        Bearer::default()
    }

    /// From a token's text (a token file's contents): surrounding whitespace, such as the
    /// file's final newline, is dropped; what remains must be visible ASCII (no CR/LF, so it
    /// cannot end the header early).
    pub fn from_token_text(text: &str) -> Result<Bearer, BearerError> {
        let token = text.trim();
        if token.is_empty() {
            return Err(BearerError::Empty);
        }
        if let Some(&b) = token.as_bytes().iter().find(|b| !b.is_ascii_graphic()) {
            return Err(BearerError::BadByte(b));
        }
        let mut line = b"Authorization: Bearer ".to_vec();
        line.extend_from_slice(token.as_bytes());
        line.extend_from_slice(b"\r\n");
        Ok(Bearer { line })
    }

    /// Reads a token file (`--bearer-token-file`); `None` gives [`Bearer::none`].
    pub fn from_file(path: Option<&std::path::Path>) -> Result<Bearer, String> {
        let Some(path) = path else {
            return Ok(Bearer::none());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--bearer-token-file {}: {e}", path.display()))?;
        Bearer::from_token_text(&text)
            .map_err(|e| format!("--bearer-token-file {}: {e}", path.display()))
    }

    /// True when a token is set.
    pub fn is_set(&self) -> bool {
        !self.line.is_empty()
    }

    /// Appends the header line (`Authorization: Bearer <token>\r\n`), or nothing, to a request
    /// head being built.
    pub fn append_header(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.line);
    }
}

/// Why an event ID could not be read for its sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdError {
    /// Not `<epoch>-<stream>-<seq>`.
    Shape,
    /// The sequence is not a decimal u64.
    Seq,
}

/// The sequence of a gateway ID `<epoch16hex>-<stream>-<seq>` (the stream may contain `-`).
pub fn gateway_seq(id: &[u8]) -> Result<u64, IdError> {
    let dash = id.iter().rposition(|&b| b == b'-').ok_or(IdError::Shape)?;
    let first = id.iter().position(|&b| b == b'-').ok_or(IdError::Shape)?;
    if first == dash || first != 16 {
        return Err(IdError::Shape);
    }
    let digits = &id[dash + 1..];
    if digits.is_empty() || digits.len() > 20 {
        return Err(IdError::Seq);
    }
    let mut v: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return Err(IdError::Seq);
        }
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or(IdError::Seq)?;
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_in_path_and_query() {
        let t = UrlTemplate::parse("http://127.0.0.1:8080/v1/streams/{stream}/events").unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t.host_header, "127.0.0.1:8080");
        let mut out = Vec::new();
        t.render_path("s7", &mut out);
        assert_eq!(out, b"/v1/streams/s7/events");
        assert!(!t.has_query());
        let n = UrlTemplate::parse("http://localhost:8081/sub?id={stream}&x={stream}").unwrap();
        let mut out = Vec::new();
        n.render_path("a", &mut out);
        assert_eq!(out, b"/sub?id=a&x=a");
        assert!(n.has_query());
        assert!(!t.tls);
        let s = UrlTemplate::parse("https://127.0.0.1:8443/v1/streams/{stream}").unwrap();
        assert!(s.tls);
        assert_eq!(s.host, "127.0.0.1");
        assert_eq!(s.host_header, "127.0.0.1:8443");
        assert_eq!(
            UrlTemplate::parse("https://localhost/")
                .unwrap()
                .addr
                .port(),
            443
        );
        let bare = UrlTemplate::parse("http://127.0.0.1").unwrap();
        assert_eq!(bare.addr.port(), 80);
        let mut out = Vec::new();
        bare.render_path("a", &mut out);
        assert_eq!(out, b"/");
    }

    #[test]
    fn bad_templates_are_named() {
        assert_eq!(UrlTemplate::parse("ftp://x/"), Err(UrlError::NotHttp));
        assert_eq!(
            UrlTemplate::parse("http://example.com/"),
            Err(UrlError::BadHost("example.com".into()))
        );
        assert_eq!(
            UrlTemplate::parse("http://127.0.0.1:0/"),
            Err(UrlError::BadPort("0".into()))
        );
        assert_eq!(
            UrlTemplate::parse("http://127.0.0.1:1/{name}"),
            Err(UrlError::BadPlaceholder("{name}".into()))
        );
        assert_eq!(
            UrlTemplate::parse("http://127.0.0.1:1/{stream"),
            Err(UrlError::BadPlaceholder("{stream".into()))
        );
    }

    #[test]
    fn bearer_header_line() {
        let none = Bearer::none();
        assert!(!none.is_set());
        let mut out = b"x".to_vec();
        none.append_header(&mut out);
        assert_eq!(out, b"x", "no token, no header");
        let b = Bearer::from_token_text("  eyJhbGciOi.eyJzdWIi.c2ln-_~+/=\n").unwrap();
        assert!(b.is_set());
        let mut out = Vec::new();
        b.append_header(&mut out);
        assert_eq!(
            out,
            b"Authorization: Bearer eyJhbGciOi.eyJzdWIi.c2ln-_~+/=\r\n"
        );
        assert_eq!(Bearer::from_token_text(" \n"), Err(BearerError::Empty));
        assert_eq!(
            Bearer::from_token_text("a\r\nX-Evil: 1"),
            Err(BearerError::BadByte(b'\r'))
        );
        assert_eq!(
            Bearer::from_token_text("a b"),
            Err(BearerError::BadByte(b' '))
        );
        assert_eq!(Bearer::from_file(None), Ok(Bearer::none()));
    }

    #[test]
    fn gateway_ids() {
        assert_eq!(gateway_seq(b"00000000000000ab-s1-42"), Ok(42));
        assert_eq!(gateway_seq(b"00000000000000ab-a-b-c-7"), Ok(7));
        assert_eq!(gateway_seq(b"1700000000:0"), Err(IdError::Shape));
        assert_eq!(gateway_seq(b"00000000000000ab-s1-4x"), Err(IdError::Seq));
        assert_eq!(gateway_seq(b"00000000000000ab-s1-"), Err(IdError::Seq));
    }
}
