//! A plain blocking MCP-over-HTTP test client for the MCP end-to-end tests (shared by
//! `mcp_e2e.rs` and `mcp_http_upstream.rs`): one HTTP exchange per fresh connection, the
//! response head and Content-Length body, or an SSE stream read event by event. Every read is
//! bounded by a timeout. Not a general HTTP client (no chunked bodies: the gateway sends none).
#![allow(dead_code)]
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The `Accept` header a Streamable HTTP client sends on every POST.
pub const ACCEPT: (&str, &str) = ("Accept", "application/json, text/event-stream");

/// Sends the `notifications/initialized` notification that completes `sid`'s initialization
/// and checks it is accepted (202).
pub fn send_initialized(addr: SocketAddr, sid: &str) {
    let n = Exchange::send(
        addr,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", sid)],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(n.status, 202);
}

/// One HTTP exchange on a fresh connection; the response is read as far as its head, then
/// either its Content-Length body or (SSE) left open for `next_event`.
pub struct Exchange {
    pub stream: TcpStream,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub buf: Vec<u8>,
    pub eof: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Ev {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

impl Exchange {
    pub fn send(addr: SocketAddr, method: &str, headers: &[(&str, &str)], body: &str) -> Exchange {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(20)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut req = format!(
            "{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        s.write_all(req.as_bytes()).unwrap();
        let mut x = Exchange {
            stream: s,
            status: 0,
            headers: Vec::new(),
            body: Vec::new(),
            buf: Vec::new(),
            eof: false,
        };
        let end = loop {
            if let Some(i) = x.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(x.fill(), "closed before the response head");
        };
        let head = String::from_utf8(x.buf[..end].to_vec()).unwrap();
        x.buf.drain(..end);
        let mut lines = head.split("\r\n");
        x.status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        for l in lines.filter(|l| !l.is_empty()) {
            let (k, v) = l.split_once(':').unwrap();
            x.headers
                .push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
        if let Some(len) = x
            .header("content-length")
            .map(|v| v.parse::<usize>().unwrap())
        {
            while x.buf.len() < len {
                assert!(x.fill(), "closed inside the body");
            }
            x.body = x.buf.drain(..len).collect();
        }
        x
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    pub fn fill(&mut self) -> bool {
        let mut tmp = [0u8; 16384];
        let n = self.stream.read(&mut tmp).expect("read within the timeout");
        self.buf.extend_from_slice(&tmp[..n]);
        self.eof |= n == 0;
        n > 0
    }

    /// The next SSE event (blocks, bounded by the read timeout); None at end of stream.
    pub fn next_event(&mut self) -> Option<Ev> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..i + 2).collect();
                let text = String::from_utf8(block).unwrap();
                let mut ev = Ev {
                    id: None,
                    event: None,
                    data: String::new(),
                };
                let mut has_field = false;
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        ev.id = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        ev.event = Some(v.to_owned());
                    } else if let Some(v) =
                        line.strip_prefix("data: ").or(line.strip_prefix("data:"))
                    {
                        ev.data.push_str(v);
                    } else {
                        continue; // retry:, comments
                    }
                    has_field = true;
                }
                if has_field {
                    return Some(ev);
                }
                continue;
            }
            if self.eof || !self.fill() {
                return None;
            }
        }
    }
}

/// The stdio fixture upstream (`tests/mcp_upstream.awk`) as an `--upstream-cmd`.
pub fn upstream_cmd() -> String {
    // mawk reads a pipe in blocks unless told to be interactive (line by line); gawk and
    // busybox awk read lines as they come.
    let script = format!("{}/tests/mcp_upstream.awk", env!("CARGO_MANIFEST_DIR"));
    format!(
        "if awk -W version 2>&1 | grep -q mawk; then exec awk -W interactive -f '{script}'; else exec awk -f '{script}'; fi"
    )
}

pub const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}"#;

/// Initializes a session (2025-11-25) and sends `notifications/initialized`; returns its ID.
pub fn initialize(addr: SocketAddr) -> String {
    let mut x = Exchange::send(addr, "POST", &[ACCEPT], INIT);
    assert_eq!(x.status, 200);
    assert_eq!(x.header("content-type"), Some("text/event-stream"));
    let sid = x.header("mcp-session-id").expect("session id").to_owned();
    let priming = x.next_event().unwrap();
    assert!(
        priming.id.is_some() && priming.data.is_empty(),
        "priming first: {priming:?}"
    );
    let resp = x.next_event().unwrap();
    let v: serde_json::Value = serde_json::from_str(&resp.data).unwrap();
    assert_eq!(v["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(x.next_event(), None, "the stream ends after its response");
    send_initialized(addr, &sid);
    sid
}

/// The `progress` of a progress notification.
pub fn progress_of(ev: &Ev) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(&ev.data).ok()?;
    v["params"]["progress"].as_u64()
}
