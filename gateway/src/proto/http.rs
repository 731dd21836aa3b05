//! Pure HTTP/1.1 request-head parsing (httparse) with limits, and response serialization.
//! Bytes in, decisions out: no sockets, no clock, no io_uring. The driver calls
//! [`parse_head`] on its read buffer, decides the body limit from the route, waits until
//! `head_len + content_length` bytes are buffered (or decodes a chunked body with
//! `super::chunked`), and serializes answers with [`response`] / [`error_response`]. A head
//! with `Transfer-Encoding` is accepted only with exactly one field saying `chunked`, no
//! `Content-Length` and HTTP/1.1: anything else could be framed otherwise by an intermediary.
#![forbid(unsafe_code)]

use std::mem::MaybeUninit;

/// Limits on a request head; each is a CLI flag.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    /// Bytes of request line + headers + the blank line.
    pub header_bytes_max: usize,
    /// Header fields.
    pub header_count_max: usize,
}

/// Request methods the gateway distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Delete,
    /// A CORS preflight (answered by the connection machine).
    Options,
    /// Anything else (answered 405 by the router).
    Other,
}

impl Method {
    fn parse(m: &str) -> Method {
        match m {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            _ => Method::Other,
        }
    }
}

/// The parsed head of one request.
/// (`Debug` by hand: credentials never reach a log line.)
#[derive(Clone, PartialEq, Eq)]
pub struct Head {
    pub method: Method,
    /// Path part of the request target (before `?`).
    pub path: String,
    /// Query part (after `?`, without it), possibly empty.
    pub query: String,
    /// Bytes of the head including the terminating blank line.
    pub head_len: usize,
    /// Declared body length (0 when absent).
    pub content_length: u64,
    /// `Content-Length` was present.
    pub has_content_length: bool,
    /// `Transfer-Encoding: chunked` (then there is no `Content-Length`).
    pub chunked: bool,
    /// The client wants the connection closed after this response (HTTP/1.0 or `Connection: close`).
    pub close: bool,
    /// `Expect: 100-continue` was sent.
    pub expect_continue: bool,
    pub last_event_id: Option<String>,
    pub accept: Option<String>,
    /// `Event-Type` header: the SSE `event:` field of a single publish.
    pub event_type: Option<String>,
    /// `Idempotency-Key` header of a publish (checked by the router).
    pub idempotency_key: Option<String>,
    /// `Origin` (sent by browsers; checked against `--cors-allow-origin`).
    pub origin: Option<String>,
    /// `Authorization` (a Bearer token when authentication is on).
    pub authorization: Option<String>,
    /// `Cookie` (several fields are joined with `; `, as RFC 6265 §5.4 has a user agent send one).
    pub cookie: Option<String>,
    /// A sane `X-Request-Id` ([`sane_request_id`]); others are replaced.
    pub request_id: Option<String>,
    /// The first `Mcp-Session-Id` value that is visible ASCII (it only routes a request on the
    /// MCP path to its session's core; the MCP core checks the field itself, and refuses a
    /// repeated one). A credential: never in `Debug`.
    pub mcp_session_id: Option<String>,
}

impl std::fmt::Debug for Head {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |v: &Option<String>| v.as_ref().map(|_| "<redacted>");
        f.debug_struct("Head")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("query_bytes", &self.query.len())
            .field("head_len", &self.head_len)
            .field("content_length", &self.content_length)
            .field("has_content_length", &self.has_content_length)
            .field("chunked", &self.chunked)
            .field("close", &self.close)
            .field("expect_continue", &self.expect_continue)
            .field("last_event_id", &self.last_event_id)
            .field("accept", &self.accept)
            .field("event_type", &self.event_type)
            .field("idempotency_key", &self.idempotency_key)
            .field("origin", &self.origin)
            .field("authorization", &redacted(&self.authorization))
            .field("cookie", &redacted(&self.cookie))
            .field("request_id", &self.request_id)
            .field("mcp_session_id", &redacted(&self.mcp_session_id))
            .finish()
    }
}

/// A request the gateway refuses, with the status it deserves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// Request line longer than the header limit → 414.
    UriTooLong,
    /// Head longer than `header_bytes_max` → 431.
    HeadTooLarge,
    /// More than `header_count_max` fields → 431.
    TooManyHeaders,
    /// `Transfer-Encoding` other than one `chunked` field on HTTP/1.1 without `Content-Length`
    /// (both framings, a repeated field, another coding, HTTP/1.0) → 400.
    BadTransferEncoding(&'static str),
    /// `Content-Length` repeated with different values, or not a number → 400.
    BadContentLength,
    /// A header value that is not valid UTF-8 where we need text → 400.
    BadHeaderValue(&'static str),
    /// httparse rejected the syntax → 400.
    Malformed(&'static str),
    /// Not HTTP/1.0 or 1.1 → 505.
    Version,
    /// A single-valued header repeated with different values (`Last-Event-ID`): which one a
    /// proxy honoured is unknowable, and resuming from the other would skip or repeat → 400.
    ConflictingHeader(&'static str),
}

impl HttpError {
    /// Status code, short machine code and human message for the JSON error body.
    pub fn status(&self) -> (u16, &'static str, String) {
        match self {
            HttpError::UriTooLong => (414, "uri_too_long", "request line too long".into()),
            HttpError::HeadTooLarge => (
                431,
                "headers_too_large",
                "request head exceeds --header-bytes-max".into(),
            ),
            HttpError::TooManyHeaders => (
                431,
                "too_many_headers",
                "more header fields than --header-count-max".into(),
            ),
            HttpError::BadTransferEncoding(what) => (
                400,
                "bad_transfer_encoding",
                format!("Transfer-Encoding refused: {what}"),
            ),
            HttpError::BadContentLength => {
                (400, "bad_content_length", "invalid Content-Length".into())
            }
            HttpError::BadHeaderValue(h) => {
                (400, "bad_header", format!("header {h} is not valid text"))
            }
            HttpError::Malformed(what) => (
                400,
                "malformed_request",
                format!("malformed request: {what}"),
            ),
            HttpError::Version => (505, "http_version", "only HTTP/1.0 and 1.1".into()),
            HttpError::ConflictingHeader(h) => (
                400,
                "conflicting_header",
                format!("header {h} repeated with different values"),
            ),
        }
    }
}

impl Head {
    /// A head with its request line parsed and no header applied yet.
    fn blank(method: Method, path: &str, query: &str, head_len: usize, close: bool) -> Head {
        Head {
            method,
            path: path.to_owned(),
            query: query.to_owned(),
            head_len,
            content_length: 0,
            has_content_length: false,
            chunked: false,
            close,
            expect_continue: false,
            last_event_id: None,
            accept: None,
            event_type: None,
            idempotency_key: None,
            origin: None,
            authorization: None,
            cookie: None,
            request_id: None,
            mcp_session_id: None,
        }
    }
}

/// Parses one request head at the start of `buf`.
///
/// `Ok(None)` means incomplete (read more); it is only returned while `buf` is within the
/// header limit, so a client cannot make the buffer grow without bound.
pub fn parse_head(buf: &[u8], limits: &HeadLimits) -> Result<Option<Head>, HttpError> {
    // Header count: parse into a buffer one larger than allowed, so "too many" is detectable.
    // Uninitialised slots (nothing to zero per request), on the stack for the usual limits.
    const ON_STACK: usize = 128;
    let mut stack = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; ON_STACK];
    let mut heap = Vec::new();
    let fields: &mut [MaybeUninit<httparse::Header<'_>>] = if limits.header_count_max < ON_STACK {
        &mut stack[..limits.header_count_max + 1]
    } else {
        heap.resize_with(limits.header_count_max + 1, MaybeUninit::uninit);
        &mut heap
    };
    let mut req = httparse::Request::new(&mut []);
    let window = &buf[..buf.len().min(limits.header_bytes_max)];
    let status = match req.parse_with_uninit_headers(window, fields) {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::TooManyHeaders),
        Err(e) => return Err(HttpError::Malformed(httparse_error_name(e))),
    };
    let head_len = match status {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => {
            if buf.len() >= limits.header_bytes_max {
                if !window.windows(2).any(|w| w == b"\r\n") && !window.contains(&b'\n') {
                    return Err(HttpError::UriTooLong);
                }
                return Err(HttpError::HeadTooLarge);
            }
            return Ok(None);
        }
    };
    if req.headers.len() > limits.header_count_max {
        return Err(HttpError::TooManyHeaders);
    }
    let version = req.version.ok_or(HttpError::Malformed("version"))?;
    if version > 1 {
        return Err(HttpError::Version);
    }
    let method = Method::parse(req.method.ok_or(HttpError::Malformed("method"))?);
    let target = req.path.ok_or(HttpError::Malformed("target"))?;
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, q),
        None => (target, ""),
    };
    let mut head = Head::blank(method, path, query, head_len, version == 0);
    for h in req.headers.iter() {
        apply_header(&mut head, h.name, h.value, version)?;
    }
    if head.chunked && head.has_content_length {
        return Err(HttpError::BadTransferEncoding("sent with Content-Length"));
    }
    Ok(Some(head))
}

/// Applies one header field to the head (the fields the gateway reads; others are ignored).
fn apply_header(head: &mut Head, name: &str, value: &[u8], version: u8) -> Result<(), HttpError> {
    if name.eq_ignore_ascii_case("content-length") {
        let v = std::str::from_utf8(value).map_err(|_| HttpError::BadContentLength)?;
        let n = parse_decimal(v.trim()).ok_or(HttpError::BadContentLength)?;
        if head.has_content_length && head.content_length != n {
            return Err(HttpError::BadContentLength);
        }
        head.content_length = n;
        head.has_content_length = true;
    } else if name.eq_ignore_ascii_case("transfer-encoding") {
        let refuse = |what| Err(HttpError::BadTransferEncoding(what));
        if head.chunked {
            return refuse("the field is repeated");
        }
        if version == 0 {
            return refuse("HTTP/1.0 has no transfer codings");
        }
        let coding = text(value, "Transfer-Encoding")?.trim();
        if !coding.eq_ignore_ascii_case("chunked") {
            return refuse("only chunked is supported");
        }
        head.chunked = true;
    } else if name.eq_ignore_ascii_case("connection") {
        let v = text(value, "Connection")?;
        for token in v.split(',') {
            let t = token.trim();
            if t.eq_ignore_ascii_case("close") {
                head.close = true;
            } else if t.eq_ignore_ascii_case("keep-alive") && version == 0 {
                head.close = false;
            }
        }
    } else if name.eq_ignore_ascii_case("expect") {
        head.expect_continue = text(value, "Expect")?
            .trim()
            .eq_ignore_ascii_case("100-continue");
    } else if name.eq_ignore_ascii_case("last-event-id") {
        let v = text(value, "Last-Event-ID")?.trim();
        if head.last_event_id.as_deref().is_some_and(|prev| prev != v) {
            return Err(HttpError::ConflictingHeader("Last-Event-ID"));
        }
        head.last_event_id = Some(v.to_owned());
    } else if name.eq_ignore_ascii_case("accept") {
        head.accept = Some(text(value, "Accept")?.to_owned());
    } else if name.eq_ignore_ascii_case("event-type") {
        head.event_type = Some(text(value, "Event-Type")?.trim().to_owned());
    } else if name.eq_ignore_ascii_case("idempotency-key") {
        let v = text(value, "Idempotency-Key")?.trim();
        single(&mut head.idempotency_key, v, "Idempotency-Key")?;
    } else if name.eq_ignore_ascii_case("origin") {
        single(&mut head.origin, text(value, "Origin")?.trim(), "Origin")?;
    } else if name.eq_ignore_ascii_case("authorization") {
        let v = text(value, "Authorization")?.trim();
        single(&mut head.authorization, v, "Authorization")?;
    } else if name.eq_ignore_ascii_case("mcp-session-id") {
        keep_mcp_session_id(head, value);
    } else if name.eq_ignore_ascii_case("x-request-id") {
        head.request_id = sane_request_id(value);
    } else if name.eq_ignore_ascii_case("cookie") {
        let v = text(value, "Cookie")?.trim();
        match &mut head.cookie {
            Some(c) => {
                c.push_str("; ");
                c.push_str(v);
            }
            None => head.cookie = Some(v.to_owned()),
        }
    }
    Ok(())
}

/// Keeps the first `Mcp-Session-Id` if it is visible ASCII (see [`Head::mcp_session_id`]).
fn keep_mcp_session_id(head: &mut Head, value: &[u8]) {
    let visible = |b: &u8| (0x21..=0x7e).contains(b);
    let v = value.trim_ascii();
    if head.mcp_session_id.is_none() && !v.is_empty() && v.iter().all(visible) {
        head.mcp_session_id = Some(String::from_utf8_lossy(v).into_owned());
    }
}

/// The longest `X-Request-Id` taken from a client (longer ones are replaced).
pub const REQUEST_ID_BYTES_MAX: usize = 64;

/// A client's `X-Request-Id` if it is sane: 1–64 bytes of letters, digits and `-_.:/+=@`
/// (nothing that could split a log line or a header).
pub fn sane_request_id(v: &[u8]) -> Option<String> {
    let ok = |b: &u8| b.is_ascii_alphanumeric() || b"-_.:/+=@".contains(b);
    let v = v.trim_ascii();
    (!v.is_empty() && v.len() <= REQUEST_ID_BYTES_MAX && v.iter().all(ok))
        .then(|| String::from_utf8_lossy(v).into_owned())
}

/// A single-valued header: a repeat with another value is refused (which one an intermediary
/// honoured is unknowable).
fn single(slot: &mut Option<String>, v: &str, name: &'static str) -> Result<(), HttpError> {
    if slot.as_deref().is_some_and(|prev| prev != v) {
        return Err(HttpError::ConflictingHeader(name));
    }
    *slot = Some(v.to_owned());
    Ok(())
}

fn text<'a>(v: &'a [u8], name: &'static str) -> Result<&'a str, HttpError> {
    std::str::from_utf8(v).map_err(|_| HttpError::BadHeaderValue(name))
}

/// Strict decimal: digits only, no sign, no overflow, at most 19 digits.
pub fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn httparse_error_name(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "header name",
        httparse::Error::HeaderValue => "header value",
        httparse::Error::NewLine => "line ending",
        httparse::Error::Status => "status",
        httparse::Error::Token => "token",
        httparse::Error::TooManyHeaders => "too many headers",
        httparse::Error::Version => "version",
    }
}

/// Reason phrase of the statuses the gateway emits.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        410 => "Gone",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        _ => "Unknown",
    }
}

/// A complete response with a Content-Length body.
pub fn response(status: u16, content_type: &str, body: &[u8], close: bool) -> Vec<u8> {
    // Byte pushes, not `format!`: every publish is answered through here.
    let mut out = Vec::with_capacity(128 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(&mut out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\nContent-Type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\nContent-Length: ");
    push_decimal(&mut out, body.len() as u64);
    out.extend_from_slice(b"\r\n");
    if status == 405 {
        out.extend_from_slice(b"Allow: GET, POST\r\n");
    }
    out.extend_from_slice(if close {
        b"Connection: close\r\n\r\n"
    } else {
        b"Connection: keep-alive\r\n\r\n"
    });
    out.extend_from_slice(body);
    out
}

/// Appends `v` in decimal.
fn push_decimal(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut x = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (x % 10) as u8;
        x /= 10;
        if x == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// A short JSON error: `{"error":"<code>","message":"<message>"}`.
pub fn error_response(status: u16, code: &str, message: &str, close: bool) -> Vec<u8> {
    let body = serde_json::json!({ "error": code, "message": message }).to_string();
    response(status, "application/json", body.as_bytes(), close)
}

/// The 201 answer to a publish: `{"id":"<id>"}`, or `{"ids":[...]}` for a batch. Event IDs
/// are ASCII hex, digits and dashes, so they need no JSON escaping; written without building a
/// JSON value (this is on every publish's path).
pub fn created_response(ids: &[log_store::EventId], batch: bool, close: bool) -> Vec<u8> {
    let mut body = Vec::with_capacity(16 + ids.len() * (log_store::EVENT_ID_BYTES_MAX + 3));
    let mut buf = [0u8; log_store::EVENT_ID_BYTES_MAX];
    body.extend_from_slice(if batch { b"{\"ids\":[" } else { b"{\"id\":" });
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        let n = id.encode(&mut buf);
        body.push(b'"');
        body.extend_from_slice(&buf[..n]);
        body.push(b'"');
    }
    body.extend_from_slice(if batch { b"]}" } else { b"}" });
    response(201, "application/json", &body, close)
}

/// A JSON response from an already serialized body.
pub fn json_response(status: u16, body: &serde_json::Value, close: bool) -> Vec<u8> {
    response(
        status,
        "application/json",
        body.to_string().as_bytes(),
        close,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: HeadLimits = HeadLimits {
        header_bytes_max: 256,
        header_count_max: 4,
    };

    #[test]
    fn debug_output_hides_credentials() {
        let r = b"GET /v1/streams/a?access_token=tok.en.x HTTP/1.1\r\nAuthorization: Bearer s3cr3t\r\nCookie: t=c00kie\r\n\r\n";
        let h = parse_head(r, &L).unwrap().unwrap();
        let d = format!("{h:?}");
        for secret in ["s3cr3t", "c00kie", "tok.en.x"] {
            assert!(!d.contains(secret), "{d}");
        }
        assert_eq!(h.authorization.as_deref(), Some("Bearer s3cr3t"));
    }

    #[test]
    fn parses_get_with_query_and_headers() {
        let r = b"GET /v1/streams/a?from=earliest HTTP/1.1\r\nAccept: text/event-stream\r\nLast-Event-ID: x-1-2\r\n\r\nrest";
        let h = parse_head(r, &L).unwrap().unwrap();
        assert_eq!(h.method, Method::Get);
        assert_eq!(h.path, "/v1/streams/a");
        assert_eq!(h.query, "from=earliest");
        assert_eq!(h.last_event_id.as_deref(), Some("x-1-2"));
        assert_eq!(h.accept.as_deref(), Some("text/event-stream"));
        assert_eq!(&r[h.head_len..], b"rest");
        assert!(!h.close);
    }

    #[test]
    fn incomplete_is_not_an_error() {
        assert_eq!(parse_head(b"GET / HTTP/1.1\r\nHost: x\r\n", &L), Ok(None));
        assert_eq!(parse_head(b"", &L), Ok(None));
    }

    #[test]
    fn limits() {
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(300, b'a');
        assert_eq!(parse_head(&big, &L), Err(HttpError::HeadTooLarge));
        let mut line = b"GET /".to_vec();
        line.resize(300, b'a');
        assert_eq!(parse_head(&line, &L), Err(HttpError::UriTooLong));
        let many = b"GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n\r\n";
        assert_eq!(parse_head(many, &L), Err(HttpError::TooManyHeaders));
    }

    #[test]
    fn header_count_limit_is_exact_on_the_stack_and_on_the_heap() {
        for max in [1usize, 4, 127, 128, 300] {
            let limits = HeadLimits {
                header_bytes_max: 64 * 1024,
                header_count_max: max,
            };
            let head = |n: usize| {
                let mut r = b"GET / HTTP/1.1\r\n".to_vec();
                for i in 0..n {
                    r.extend_from_slice(format!("H{i}: v\r\n").as_bytes());
                }
                r.extend_from_slice(b"\r\n");
                r
            };
            assert!(
                matches!(parse_head(&head(max), &limits), Ok(Some(_))),
                "{max}"
            );
            assert_eq!(
                parse_head(&head(max + 1), &limits),
                Err(HttpError::TooManyHeaders)
            );
        }
    }

    #[test]
    fn bodies() {
        let h = parse_head(b"POST /x HTTP/1.1\r\nContent-Length: 12\r\n\r\n", &L)
            .unwrap()
            .unwrap();
        assert_eq!((h.content_length, h.has_content_length), (12, true));
        assert_eq!(
            parse_head(
                b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                &L
            ),
            Err(HttpError::BadTransferEncoding("sent with Content-Length"))
        );
        for bad in ["-1", "1x", "", "99999999999999999999"] {
            let r = format!("POST /x HTTP/1.1\r\nContent-Length: {bad}\r\n\r\n");
            assert_eq!(
                parse_head(r.as_bytes(), &L),
                Err(HttpError::BadContentLength),
                "{bad}"
            );
        }
        let twice = b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(parse_head(twice, &L), Err(HttpError::BadContentLength));
    }

    /// Request smuggling: a chunked body is taken only from one `Transfer-Encoding: chunked`
    /// field on HTTP/1.1 with no `Content-Length`; every other framing an intermediary might
    /// read differently is refused.
    #[test]
    fn transfer_encoding_is_one_chunked_field_or_refused() {
        let h =
            |fields: &str| parse_head(format!("POST /x HTTP/1.1\r\n{fields}\r\n").as_bytes(), &L);
        let chunked = h("Transfer-Encoding:  Chunked \r\n").unwrap().unwrap();
        assert!(chunked.chunked && !chunked.has_content_length);
        let refused = |what| Err(HttpError::BadTransferEncoding(what));
        for (fields, what) in [
            (
                "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
                "sent with Content-Length",
            ),
            (
                "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
                "sent with Content-Length",
            ),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                "the field is repeated",
            ),
            (
                "Transfer-Encoding: chunked, chunked\r\n",
                "only chunked is supported",
            ),
            (
                "Transfer-Encoding: gzip, chunked\r\n",
                "only chunked is supported",
            ),
            (
                "Transfer-Encoding: identity\r\n",
                "only chunked is supported",
            ),
            ("Transfer-Encoding: \r\n", "only chunked is supported"),
        ] {
            assert_eq!(h(fields), refused(what), "{fields:?}");
        }
        let old = b"POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(
            parse_head(old, &L),
            refused("HTTP/1.0 has no transfer codings")
        );
        // obs-fold (a field continued on the next line) and a space before the colon are
        // malformed heads, whatever the field.
        for bad in [
            "Transfer-Encoding:\r\n chunked\r\n",
            "Transfer-Encoding : chunked\r\n",
            "X: a\r\n\tb\r\n",
        ] {
            assert!(
                matches!(h(bad), Err(HttpError::Malformed(_))),
                "{bad:?}: {:?}",
                h(bad)
            );
        }
    }

    /// Regression (adversarial review): two different Last-Event-IDs used to resolve silently
    /// to the last one; an intermediary that honoured the first would resume elsewhere.
    #[test]
    fn conflicting_last_event_ids_are_refused() {
        let two =
            b"GET /v1/streams/a HTTP/1.1\r\nLast-Event-ID: x-1-2\r\nLast-Event-ID: x-1-3\r\n\r\n";
        assert_eq!(
            parse_head(two, &L),
            Err(HttpError::ConflictingHeader("Last-Event-ID"))
        );
        let same =
            b"GET /v1/streams/a HTTP/1.1\r\nLast-Event-ID: x-1-2\r\nlast-event-id:  x-1-2\r\n\r\n";
        let h = parse_head(same, &L).unwrap().unwrap();
        assert_eq!(h.last_event_id.as_deref(), Some("x-1-2"));
    }

    #[test]
    fn an_mcp_session_id_is_kept_for_routing_and_never_shown() {
        let h = b"POST /mcp HTTP/1.1\r\nMcp-Session-Id: 3-abcdef.01\r\nmcp-session-id: 4-x\r\n\r\n";
        let h = parse_head(h, &L).unwrap().unwrap();
        assert_eq!(h.mcp_session_id.as_deref(), Some("3-abcdef.01"));
        assert!(!format!("{h:?}").contains("abcdef"));
        // Not visible ASCII: not kept (the MCP core refuses it wherever it lands).
        let h = parse_head(b"POST /mcp HTTP/1.1\r\nMcp-Session-Id: a b\r\n\r\n", &L);
        assert_eq!(h.unwrap().unwrap().mcp_session_id, None);
    }

    #[test]
    fn connection_semantics() {
        let h = parse_head(b"GET / HTTP/1.0\r\n\r\n", &L).unwrap().unwrap();
        assert!(h.close);
        let h = parse_head(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", &L)
            .unwrap()
            .unwrap();
        assert!(h.close);
        assert!(matches!(
            parse_head(b"GARBAGE\r\n\r\n", &L),
            Err(HttpError::Malformed(_))
        ));
    }

    #[test]
    fn created_response_is_the_json_a_serializer_would_write() {
        use log_store::{Epoch, EventId, StreamId};
        let ids: Vec<EventId> = [
            (0u64, 0u32, 1u64),
            (u64::MAX, u32::MAX, u64::MAX - 2),
            (0xab, 7, 10),
        ]
        .iter()
        .map(|&(e, s, q)| EventId {
            epoch: Epoch(e),
            stream: StreamId(s),
            seq: q,
        })
        .collect();
        for close in [false, true] {
            let one = created_response(&ids[1..2], false, close);
            let want = json_response(201, &serde_json::json!({ "id": ids[1].to_string() }), close);
            assert_eq!(one, want);
            let all = created_response(&ids, true, close);
            let strs: Vec<String> = ids.iter().map(EventId::to_string).collect();
            let want = json_response(201, &serde_json::json!({ "ids": strs }), close);
            assert_eq!(all, want);
        }
    }

    #[test]
    fn response_head_matches_the_formatted_one() {
        for (status, close, body) in [
            (201u16, false, &b"{}"[..]),
            (405, true, b""),
            (503, false, &[b'x'; 12345][..]),
        ] {
            let got = response(status, "text/plain", body, close);
            let mut want = format!(
                "HTTP/1.1 {status} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{}Connection: {}\r\n\r\n",
                reason(status),
                body.len(),
                if status == 405 { "Allow: GET, POST\r\n" } else { "" },
                if close { "close" } else { "keep-alive" },
            )
            .into_bytes();
            want.extend_from_slice(body);
            assert_eq!(got, want);
        }
    }

    #[test]
    fn responses_have_length_and_json() {
        let r = error_response(413, "too_large", "x", true);
        let s = String::from_utf8(r).unwrap();
        assert!(s.starts_with("HTTP/1.1 413 Content Too Large\r\n"));
        let body = s.split("\r\n\r\n").nth(1).unwrap();
        assert!(s.contains(&format!("Content-Length: {}\r\n", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"], "too_large");
        assert!(s.contains("Connection: close"));
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic, and `Ok(None)` only while under the limit.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            if let Ok(None) = parse_head(&bytes, &L) {
                proptest::prop_assert!(bytes.len() < L.header_bytes_max);
            }
        }

        /// A valid head cut at any point is incomplete, never an error; whole, it parses.
        #[test]
        fn incremental(cut in 0usize..60) {
            let req = b"POST /v1/streams/a/events HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
            let head_len = req.len() - 3;
            let cut = cut.min(head_len - 1);
            proptest::prop_assert_eq!(parse_head(&req[..cut], &L), Ok(None));
            let h = parse_head(req, &L).unwrap().unwrap();
            proptest::prop_assert_eq!(h.head_len, head_len);
        }
    }
}
