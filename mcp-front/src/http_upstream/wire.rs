//! HTTP/1.1 response framing towards an upstream: the response head (status, headers, whether
//! the connection may carry another request) and the decoded body (`Content-Length`,
//! `Transfer-Encoding: chunked`, or until close) as a `BufRead` that stops exactly at the
//! body's end, so a keep-alive connection is left at the start of the next response.

use std::io::{self, BufRead, Read};

/// Bytes of an upstream response head before it counts as broken.
const HEAD_BYTES_MAX: usize = 64 * 1024;

pub(super) type Headers = Vec<(String, String)>;

pub(super) fn header<'a>(hs: &'a Headers, name: &str) -> Option<&'a str> {
    hs.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

pub(super) fn is_sse(hs: &Headers) -> bool {
    header(hs, "content-type").is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}

/// A response head.
#[derive(Debug)]
pub(super) struct Head {
    pub(super) status: u16,
    pub(super) headers: Headers,
    /// HTTP/1.1 without `Connection: close`: the connection may carry another request once
    /// this body has been read to its end.
    pub(super) keep_alive: bool,
    framing: Framing,
}

/// Why no head could be read.
#[derive(Debug)]
pub(super) enum HeadError {
    /// The connection was closed or reset before one byte of an answer arrived: on a reused
    /// keep-alive connection, the server closed it rather than take the request (see
    /// `mod.rs`, retry). A timeout is not this.
    Nothing(String),
    /// Part of a head arrived, or a broken one.
    Broken(String),
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadError::Nothing(e) | HeadError::Broken(e) => f.write_str(e),
        }
    }
}

/// How the body ends.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Framing {
    /// This many bytes left.
    Length(u64),
    /// Bytes left in the current chunk; `crlf`: the CRLF after a chunk is due.
    Chunked { left: u64, crlf: bool },
    /// Until the server closes (never reusable).
    Close,
    /// Read to its end.
    Done,
}

/// The connection was closed or reset (not: timed out, which says nothing about whether the
/// server took the request).
fn closed(e: &io::Error) -> bool {
    use io::ErrorKind::{
        BrokenPipe, ConnectionAborted, ConnectionReset, NotConnected, UnexpectedEof,
    };
    matches!(
        e.kind(),
        ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected | UnexpectedEof
    )
}

/// Reads one response head from `r` (interim 1xx heads are skipped), consuming exactly its
/// bytes.
pub(super) fn read_head(r: &mut impl BufRead) -> Result<Head, HeadError> {
    let mut first = true;
    loop {
        let head = read_one_head(r, first)?;
        first = false;
        if !(100..200).contains(&head.status) || head.status == 101 {
            return Ok(head);
        }
    }
}

fn read_one_head(r: &mut impl BufRead, first: bool) -> Result<Head, HeadError> {
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    loop {
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if first && buf.is_empty() && closed(&e) => {
                return Err(HeadError::Nothing(format!("{e}")));
            }
            Err(e) => return Err(HeadError::Broken(format!("read: {e}"))),
        };
        if avail.is_empty() {
            return Err(if first && buf.is_empty() {
                HeadError::Nothing("closed before a response head".into())
            } else {
                HeadError::Broken("closed in a response head".into())
            });
        }
        let old = buf.len();
        let take = avail.len().min(HEAD_BYTES_MAX + 1 - old);
        buf.extend_from_slice(&avail[..take]);
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut hs);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                r.consume(len - old);
                return head_of(&resp);
            }
            Ok(httparse::Status::Partial) if buf.len() <= HEAD_BYTES_MAX => r.consume(take),
            Ok(httparse::Status::Partial) => {
                return Err(HeadError::Broken("response head too large".into()));
            }
            Err(e) => return Err(HeadError::Broken(format!("bad response head: {e}"))),
        }
    }
}

fn head_of(resp: &httparse::Response<'_, '_>) -> Result<Head, HeadError> {
    let status = resp.code.unwrap_or(0);
    let headers: Headers = resp
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_owned(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let close = header(&headers, "connection")
        .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")));
    let framing = if status == 204 || status == 304 || (100..200).contains(&status) {
        Framing::Done
    } else if header(&headers, "transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        Framing::Chunked {
            left: 0,
            crlf: false,
        }
    } else if let Some(n) = header(&headers, "content-length") {
        match n.trim().parse::<u64>() {
            Ok(0) => Framing::Done,
            Ok(n) => Framing::Length(n),
            Err(_) => return Err(HeadError::Broken("bad Content-Length".into())),
        }
    } else {
        Framing::Close
    };
    Ok(Head {
        status,
        keep_alive: resp.version == Some(1) && !close && framing != Framing::Close,
        headers,
        framing,
    })
}

/// The body of one response, read from the connection's reader `R`; it ends where the
/// response does.
pub(super) struct Body<R> {
    inner: R,
    framing: Framing,
}

impl<R: BufRead> Body<R> {
    pub(super) fn new(inner: R, head: &Head) -> Body<R> {
        Body {
            inner,
            framing: head.framing,
        }
    }

    /// The body was read to its declared end (never true for a body delimited by close).
    pub(super) fn complete(&self) -> bool {
        self.framing == Framing::Done
    }

    /// Reads what is left of a declared body, at most `max` bytes: a short answer we did not
    /// need (202, an error's text) still has to be consumed before the connection is reused.
    pub(super) fn drain(&mut self, max: u64) {
        if self.framing != Framing::Close {
            let _ = io::copy(&mut self.by_ref().take(max), &mut io::sink());
        }
    }

    pub(super) fn into_inner(self) -> R {
        self.inner
    }

    fn line(&mut self) -> io::Result<Vec<u8>> {
        let mut l = Vec::new();
        self.inner.by_ref().take(4096).read_until(b'\n', &mut l)?;
        if !l.ends_with(b"\n") {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "chunk size line cut",
            ));
        }
        Ok(l)
    }

    /// Moves the chunked decoder to the next data byte; returns how many body bytes may be
    /// handed out now (`None`: until close; `Some(0)`: the body has ended).
    fn advance(&mut self) -> io::Result<Option<u64>> {
        loop {
            match self.framing {
                Framing::Done => return Ok(Some(0)),
                Framing::Close => return Ok(None),
                Framing::Length(n) => return Ok(Some(n)),
                Framing::Chunked { crlf: true, left } => {
                    if !self.line()?.trim_ascii().is_empty() {
                        return Err(bad("no CRLF after a chunk"));
                    }
                    self.framing = Framing::Chunked { left, crlf: false };
                }
                Framing::Chunked { left: 0, .. } => {
                    let l = self.line()?;
                    let size = String::from_utf8_lossy(&l);
                    let hex = size.split(';').next().unwrap_or("").trim();
                    let left = u64::from_str_radix(hex, 16).map_err(|_| bad("bad chunk size"))?;
                    if left == 0 {
                        while !self.line()?.trim_ascii().is_empty() {} // trailers
                        self.framing = Framing::Done;
                    } else {
                        self.framing = Framing::Chunked { left, crlf: false };
                    }
                }
                Framing::Chunked { left, .. } => return Ok(Some(left)),
            }
        }
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

impl<R: BufRead> BufRead for Body<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        let limit = self.advance()?;
        if limit == Some(0) {
            return Ok(&[]);
        }
        let b = self.inner.fill_buf()?;
        match limit {
            None => Ok(b),
            Some(_) if b.is_empty() => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed in a response body",
            )),
            Some(n) => Ok(&b[..b.len().min(usize::try_from(n).unwrap_or(usize::MAX))]),
        }
    }

    fn consume(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.inner.consume(n);
        let n = n as u64;
        self.framing = match self.framing {
            Framing::Length(l) if l <= n => Framing::Done,
            Framing::Length(l) => Framing::Length(l - n),
            Framing::Chunked { left, .. } if left <= n => Framing::Chunked {
                left: 0,
                crlf: true,
            },
            Framing::Chunked { left, crlf } => Framing::Chunked {
                left: left - n,
                crlf,
            },
            f => f,
        };
    }
}

impl<R: BufRead> Read for Body<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let b = self.fill_buf()?;
        let n = b.len().min(out.len());
        out[..n].copy_from_slice(&b[..n]);
        self.consume(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> (Head, Body<&[u8]>) {
        let mut r = raw;
        let head = read_head(&mut r).unwrap();
        let body = Body::new(r, &head);
        (head, body)
    }

    #[test]
    fn chunked_bodies_decode_and_stop_at_their_end() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let (head, mut body) = parse(raw);
        assert!(head.keep_alive);
        let mut out = String::new();
        body.read_to_string(&mut out).unwrap();
        assert_eq!(out, "hello, world");
        assert!(body.complete());
        assert_eq!(body.into_inner(), b"NEXT");
        let (_, mut cut) = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel");
        assert!(cut.read_to_string(&mut String::new()).is_err());
        assert!(!cut.complete());
    }

    #[test]
    fn length_bodies_stop_at_their_end() {
        let (head, mut body) = parse(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP",
        );
        assert_eq!(head.status, 200);
        let mut out = String::new();
        body.read_to_string(&mut out).unwrap();
        assert_eq!((out.as_str(), body.complete()), ("abc", true));
        assert_eq!(body.into_inner(), b"HTTP");
        let (head, body) = parse(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n");
        assert!(head.keep_alive && body.complete());
    }

    #[test]
    fn what_ends_keep_alive() {
        for raw in [
            &b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: x\n\n",
        ] {
            assert!(!parse(raw).0.keep_alive, "{}", String::from_utf8_lossy(raw));
        }
        let (_, mut until_close) = parse(b"HTTP/1.1 200 OK\r\n\r\nall of it");
        let mut out = String::new();
        until_close.read_to_string(&mut out).unwrap();
        assert_eq!((out.as_str(), until_close.complete()), ("all of it", false));
    }

    #[test]
    fn nothing_vs_broken_heads() {
        assert!(matches!(
            read_head(&mut &b""[..]),
            Err(HeadError::Nothing(_))
        ));
        assert!(matches!(
            read_head(&mut &b"HTTP/1.1 200"[..]),
            Err(HeadError::Broken(_))
        ));
        assert!(matches!(
            read_head(&mut &b"garbage\r\n\r\n"[..]),
            Err(HeadError::Broken(_))
        ));
    }
}
