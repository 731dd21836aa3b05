//! What the access log records of one request, gathered by the connection machine: the
//! request ID (the client's `X-Request-Id` if sane, else one generated here), the method and
//! route class, when its head began, the bytes it brought, and who asked (a fingerprint of
//! the subject, never the subject or its token). The machine pairs each record with its final
//! answer; the core stamps the end time and hands it to the access log's writer thread.
#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

#[cfg(test)]
use super::http::sane_request_id;
use super::http::{Head, Method};

/// The route class of a request: a small fixed set, usable as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteClass {
    Publish,
    Batch,
    Subscribe,
    Delete,
    Healthz,
    Preflight,
    Mcp,
    /// A path or method the API does not serve (answered 404/405).
    Other,
    /// The head could not be parsed, or did not arrive in time.
    Invalid,
}

impl RouteClass {
    /// Every class, in the order of [`RouteClass::index`].
    pub const ALL: [RouteClass; 9] = [
        RouteClass::Publish,
        RouteClass::Batch,
        RouteClass::Subscribe,
        RouteClass::Delete,
        RouteClass::Healthz,
        RouteClass::Preflight,
        RouteClass::Mcp,
        RouteClass::Other,
        RouteClass::Invalid,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RouteClass::Publish => "publish",
            RouteClass::Batch => "batch",
            RouteClass::Subscribe => "subscribe",
            RouteClass::Delete => "delete",
            RouteClass::Healthz => "healthz",
            RouteClass::Preflight => "preflight",
            RouteClass::Mcp => "mcp",
            RouteClass::Other => "other",
            RouteClass::Invalid => "invalid",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// Classifies a parsed head by method and path alone (the router decides what is valid;
    /// this only names the kind, so refusals are classed like the requests they refused).
    pub fn of(head: &Head, mcp_path: Option<&str>) -> RouteClass {
        if mcp_path == Some(head.path.as_str()) {
            return RouteClass::Mcp;
        }
        if head.method == Method::Options {
            return RouteClass::Preflight;
        }
        if head.path == "/healthz" {
            return RouteClass::Healthz;
        }
        if !head.path.starts_with("/v1/streams/") {
            return RouteClass::Other;
        }
        match head.method {
            Method::Post if head.path.ends_with(":batch") => RouteClass::Batch,
            Method::Post => RouteClass::Publish,
            Method::Get | Method::Head => RouteClass::Subscribe,
            Method::Delete => RouteClass::Delete,
            _ => RouteClass::Other,
        }
    }
}

/// The method as the access log writes it.
pub fn method_label(m: Method) -> &'static str {
    match m {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Delete => "DELETE",
        Method::Options => "OPTIONS",
        Method::Other => "OTHER",
    }
}

/// One request as far as the connection machine knows it.
#[derive(Debug, Clone)]
pub struct Record {
    pub id: String,
    /// `None`: no head was parsed (a malformed or timed-out head).
    pub method: Option<Method>,
    pub route: RouteClass,
    pub started: Instant,
    /// Head plus declared body.
    pub bytes_in: u64,
    /// A fingerprint of the verified subject ([`fingerprint`]); `None` when anonymous.
    pub subject: Option<String>,
    /// The resume planner's class, for a subscribe with `Last-Event-ID`.
    pub resume: Option<&'static str>,
    /// A subscription: from the head to the completion of its first send carrying an event.
    pub first_event: Option<Duration>,
}

impl Record {
    /// The record of a parsed head.
    pub fn of(head: &Head, mcp_path: Option<&str>, started: Instant) -> Record {
        Record {
            id: head.request_id.clone().unwrap_or_else(generate),
            method: Some(head.method),
            route: RouteClass::of(head, mcp_path),
            started,
            bytes_in: head.head_len as u64 + head.content_length,
            subject: None,
            resume: None,
            first_event: None,
        }
    }

    /// The record of bytes that never made a head (refused or timed out).
    pub fn unparsed(bytes_in: usize, started: Instant) -> Record {
        Record {
            id: generate(),
            method: None,
            route: RouteClass::Invalid,
            started,
            bytes_in: bytes_in as u64,
            subject: None,
            resume: None,
            first_event: None,
        }
    }

    /// The header line that echoes the ID in every answer to the request.
    pub fn header_line(&self) -> String {
        format!("X-Request-Id: {}\r\n", self.id)
    }
}

/// A request whose final answer left the outbox: the core adds the end time.
#[derive(Debug)]
pub struct Finished {
    pub record: Record,
    pub status: u16,
    pub bytes_out: u64,
}

/// The status code of an HTTP/1.x answer's bytes (`0` if they are not one).
pub fn status_of(answer: &[u8]) -> u16 {
    answer
        .get(9..12)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A new request ID: 16 hex digits of a per-process random prefix and a counter (unique in
/// the process, not guessable across restarts).
pub fn generate() -> String {
    static PREFIX: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let mut b = [0u8; 4];
        getrandom::fill(&mut b).expect("getrandom for request ids");
        u32::from_le_bytes(b)
    });
    let n = NEXT.fetch_add(1, Relaxed);
    format!("{prefix:08x}{:08x}", n as u32)
}

/// The access log's fingerprint of a subject: the first 8 bytes of its SHA-256, in hex. An
/// operator who knows a subject can find its lines; a line alone does not name it.
pub fn fingerprint(subject: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, subject.as_bytes());
    d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sane_ids_are_kept_and_others_replaced() {
        assert_eq!(sane_request_id(b" abc-123 ").as_deref(), Some("abc-123"));
        assert_eq!(sane_request_id(&[b'a'; 64]).map(|s| s.len()), Some(64));
        for bad in [
            &b""[..],
            &[b'a'; 65],
            b"a b",
            b"a\"b",
            b"x\x01",
            "é".as_bytes(),
        ] {
            assert_eq!(sane_request_id(bad), None, "{bad:?}");
        }
        let (a, b) = (generate(), generate());
        assert_ne!(a, b);
        assert_eq!(a.len(), 16);
        assert!(sane_request_id(a.as_bytes()).is_some());
    }

    #[test]
    fn status_and_fingerprint() {
        assert_eq!(status_of(b"HTTP/1.1 201 Created\r\n"), 201);
        assert_eq!(status_of(b"HTTP/1.1 100 Continue\r\n\r\n"), 100);
        assert_eq!(status_of(b"junk"), 0);
        let f = fingerprint("alice");
        assert_eq!(f.len(), 16);
        assert_ne!(f, fingerprint("bob"));
        assert!(!f.contains("alice"));
    }
}
