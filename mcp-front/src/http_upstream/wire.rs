//! HTTP/1.1 response framing towards an upstream: the response head (status, headers) and a
//! reader of the decoded body (`Content-Length`, `Transfer-Encoding: chunked`, or until close).

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;

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

/// Reads a response head; returns the status, headers and a reader of the decoded body.
pub(super) fn read_head(
    mut s: TcpStream,
) -> Result<(u16, Headers, Box<dyn BufRead + Send>), String> {
    let mut buf = Vec::with_capacity(4096);
    let mut tmp = [0u8; 4096];
    loop {
        let n = s.read(&mut tmp).map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("closed before a response head".into());
        }
        buf.extend_from_slice(&tmp[..n]);
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut hs);
        match r.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let status = r.code.unwrap_or(0);
                let headers: Headers = r
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_owned(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                let rest = buf[len..].to_vec();
                let raw = std::io::Cursor::new(rest).chain(s);
                let body: Box<dyn BufRead + Send> = if header(&headers, "transfer-encoding")
                    .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
                {
                    Box::new(BufReader::new(Chunked::new(BufReader::new(raw))))
                } else if let Some(n) = header(&headers, "content-length") {
                    let n: u64 = n.trim().parse().map_err(|_| "bad Content-Length")?;
                    Box::new(BufReader::new(raw.take(n)))
                } else if status == 204 || status == 304 || (100..200).contains(&status) {
                    Box::new(std::io::empty())
                } else {
                    Box::new(BufReader::new(raw))
                };
                return Ok((status, headers, body));
            }
            Ok(httparse::Status::Partial) if buf.len() < HEAD_BYTES_MAX => {}
            Ok(httparse::Status::Partial) => return Err("response head too large".into()),
            Err(e) => return Err(format!("bad response head: {e}")),
        }
    }
}

/// Decoder of `Transfer-Encoding: chunked` (extensions and trailers ignored).
struct Chunked<R> {
    inner: R,
    left: u64,
    done: bool,
}

impl<R: BufRead> Chunked<R> {
    fn new(inner: R) -> Self {
        Chunked {
            inner,
            left: 0,
            done: false,
        }
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut l = Vec::new();
        self.inner.by_ref().take(4096).read_until(b'\n', &mut l)?;
        if !l.ends_with(b"\n") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "chunk size line cut",
            ));
        }
        Ok(String::from_utf8_lossy(&l).trim().to_owned())
    }
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.done || out.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let size = self.line()?;
            let hex = size.split(';').next().unwrap_or("").trim();
            self.left = u64::from_str_radix(hex, 16).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk size")
            })?;
            if self.left == 0 {
                while !self.line()?.is_empty() {}
                self.done = true;
                return Ok(0);
            }
        }
        let want = out.len().min(self.left as usize);
        let n = self.inner.read(&mut out[..want])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "chunk cut",
            ));
        }
        self.left -= n as u64;
        if self.left == 0 {
            self.line()?; // the CRLF after the chunk
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_decode() {
        let raw = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let mut c = Chunked::new(&raw[..]);
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert_eq!(out, "hello, world");
        let mut cut = Chunked::new(&b"5\r\nhel"[..]);
        assert!(cut.read_to_string(&mut String::new()).is_err());
    }
}
