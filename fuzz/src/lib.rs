//! Shared code of the fuzz targets: the gateway's pure protocol modules compiled in by
//! `#[path]` (the gateway has a library target now, but linking it would build io_uring, TLS and
//! the cluster client into every fuzz target: the four pure files are enough), and an
//! independent minimal SSE parser used as the oracle for the framing targets. No I/O here.
//!
//! The included files are the gateway's own, unmodified: `chunked` (chunked request bodies),
//! `http` (request head), `route` (router + batch bodies), `sse` (subscription head,
//! `event: truncated`).
#![forbid(unsafe_code)]

/// The gateway's `proto` modules, at the same paths as in the gateway (`route` names
/// `crate::proto::http`). Inside an inline module of a mod-rs file, `#[path]` is relative
/// to `src/proto/`.
pub mod proto {
    #[path = "../../../gateway/src/proto/chunked.rs"]
    pub mod chunked;
    #[path = "../../../gateway/src/proto/http.rs"]
    pub mod http;
    #[path = "../../../gateway/src/proto/route.rs"]
    pub mod route;
    #[path = "../../../gateway/src/proto/sse.rs"]
    pub mod sse;
}
pub use proto::{chunked, http, route, sse};

/// One dispatched SSE event as a WHATWG `EventSource` would see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The last-event-ID buffer after this event (persists across events, as in a browser).
    pub id: String,
    /// The `event:` value, `None` when absent or empty (the browser then says `message`).
    pub event: Option<String>,
    pub data: String,
}

/// What a minimal EventSource parser makes of a byte stream (HTML Living Standard, §9.2.6
/// "Interpreting an event stream"), written from the spec independently of the framer: lines
/// end in CRLF, LF or CR; `field: value` with one optional space after the colon; `data`
/// lines are joined with LF and the final LF is dropped; a blank line dispatches (nothing if
/// the data buffer is empty); `:` lines are comments; `retry` and unknown fields are ignored;
/// an `id` containing NUL is ignored. An unterminated last event is not dispatched.
pub fn parse_sse(bytes: &[u8]) -> Result<Vec<SseEvent>, std::str::Utf8Error> {
    let text = std::str::from_utf8(bytes)?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut out = Vec::new();
    let mut last_id = String::new();
    let mut event = String::new();
    let mut data = String::new();
    let mut rest = text;
    loop {
        // Cut one line; a line without its terminator at the end of input is incomplete.
        let Some(at) = rest.find(['\r', '\n']) else {
            break;
        };
        let line = &rest[..at];
        let brk = if rest[at..].starts_with("\r\n") { 2 } else { 1 };
        rest = &rest[at + brk..];
        if line.is_empty() {
            if !data.is_empty() {
                if data.ends_with('\n') {
                    data.pop();
                }
                out.push(SseEvent {
                    id: last_id.clone(),
                    event: (!event.is_empty()).then(|| event.clone()),
                    data: std::mem::take(&mut data),
                });
            }
            data.clear();
            event.clear();
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => event = value.to_owned(),
            "data" => {
                data.push_str(value);
                data.push('\n');
            }
            "id" if !value.contains('\0') => last_id = value.to_owned(),
            _ => {}
        }
    }
    Ok(out)
}

/// What the client reassembles from `data` after SSE framing: every line break (CRLF, LF or
/// CR) becomes LF.
pub fn normalize_breaks(data: &str) -> String {
    data.replace("\r\n", "\n").replace('\r', "\n")
}

/// A small deterministic byte reader over the fuzz input (so targets need no `arbitrary`).
#[derive(Debug)]
pub struct Input<'a> {
    pub bytes: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Input { bytes }
    }

    pub fn u8(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&b, rest)) => {
                self.bytes = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// Up to `n` bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.bytes.len());
        let (a, b) = self.bytes.split_at(n);
        self.bytes = b;
        a
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_follows_the_spec_examples() {
        let s = b"retry: 5\n\n: c\nid: 1\nevent: e\ndata: a\ndata:b\r\n\r\ndata\n\nid: 2\rdata:  x\r\r";
        let ev = parse_sse(s).unwrap();
        assert_eq!(
            ev,
            vec![
                SseEvent { id: "1".into(), event: Some("e".into()), data: "a\nb".into() },
                SseEvent { id: "1".into(), event: None, data: "".into() },
                SseEvent { id: "2".into(), event: None, data: " x".into() },
            ]
        );
    }
}
