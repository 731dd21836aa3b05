//! Upstream MCP servers reached over streamable HTTP (`--upstream-url http://host:port/path`):
//! one client per upstream id (= per gateway MCP session, or the shared modern upstream). A
//! dispatcher thread takes the lines the core sends upstream, in order, and POSTs each as its
//! body on a fresh loopback connection (`Connection: close`); the answer — 202, a JSON body or
//! an SSE stream — is read by a thread per POST, and every JSON-RPC message in it is handed on
//! as [`UpstreamEvent::Line`], exactly like a stdout line of a stdio child, so the core and the
//! log see no difference. The upstream's `Mcp-Session-Id` (from the `initialize` answer, which
//! the dispatcher reads itself before sending anything else) and its negotiated protocol
//! version go on every later request; after `initialize` the upstream's GET stream is opened
//! (405 is fine: the upstream has none). Stopping sends `DELETE` with the session id and shuts
//! every open socket down.
//!
//! Explicit errors, never a silent gap: a request the upstream refuses (4xx/5xx other than 404),
//! whose answer cannot be read, or whose SSE stream ends without its response (an upstream
//! without resumability cannot be resumed by us) gets a JSON-RPC error response made here for
//! its id; 404 on a session request, or an upstream that cannot be connected, ends the upstream
//! (the core then answers its in-flight requests with errors). Once a message is in our log it
//! is resumable by our clients even though the upstream keeps no history.
//!
//! Not done: TLS (`https://` is refused at start), keep-alive connections, resuming the
//! upstream's own streams with `Last-Event-ID`, and the 2026-07-28 `Mcp-Method`/`Mcp-Name`
//! mirror headers towards the upstream (the body's `_meta` protocol version is sent as
//! `MCP-Protocol-Version`).
#![forbid(unsafe_code)]

use crate::core::UpstreamId;
use crate::upstream_event::UpstreamEvent;
use crossbeam::channel::{self, Receiver, Sender};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bytes of an upstream response head before it counts as broken.
const HEAD_BYTES_MAX: usize = 64 * 1024;
/// Connect and write timeout towards the upstream (loopback: generous).
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Read timeout for answers that must be short (DELETE, error bodies); SSE streams have none
/// (they live as long as the request and are shut down when the upstream is stopped).
const SHORT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the upstream is: a plain-HTTP URL, resolved once at start.
#[derive(Debug, Clone)]
pub struct HttpTarget {
    /// `host[:port]` as written, for the `Host` header.
    pub authority: String,
    pub addr: SocketAddr,
    /// Path and query, starting with `/`.
    pub path: String,
}

/// Why `--upstream-url` was refused.
#[derive(Debug, PartialEq)]
pub enum UrlError {
    Https,
    NotHttp,
    NoHost,
    Unresolvable(String),
}

impl std::fmt::Display for UrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UrlError::Https => write!(
                f,
                "https:// upstreams are not supported (the gateway has no TLS client); use http:// on loopback"
            ),
            UrlError::NotHttp => write!(f, "the URL must start with http://"),
            UrlError::NoHost => write!(f, "the URL has no host"),
            UrlError::Unresolvable(e) => write!(f, "the host cannot be resolved: {e}"),
        }
    }
}

/// Parses `http://host[:port][/path]` (port 80 by default, path `/` by default).
pub fn parse_url(url: &str) -> Result<HttpTarget, UrlError> {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(UrlError::Https);
    }
    if !lower.starts_with("http://") {
        return Err(UrlError::NotHttp);
    }
    let rest = &url["http://".len()..];
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_owned()),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(UrlError::NoHost);
    }
    let with_port = if authority.ends_with(']') || !authority.contains(':') {
        format!("{authority}:80")
    } else {
        authority.to_owned()
    };
    let addr = with_port
        .to_socket_addrs()
        .map_err(|e| UrlError::Unresolvable(e.to_string()))?
        .next()
        .ok_or_else(|| UrlError::Unresolvable("no address".into()))?;
    Ok(HttpTarget {
        authority: authority.to_owned(),
        addr,
        path,
    })
}

/// What the dispatcher and readers share.
struct Shared {
    id: UpstreamId,
    target: HttpTarget,
    line_bytes_max: usize,
    tx: Sender<UpstreamEvent>,
    wake: Arc<dyn Fn() + Send + Sync>,
    /// Upstream session id and protocol version, once `initialize` has been answered.
    session: Mutex<(Option<String>, Option<String>)>,
    /// Open sockets (POST answers, GET stream), shut down when the upstream stops; the flag
    /// says they were, so a socket registered later is shut down at once.
    sockets: Mutex<(bool, Vec<(u64, TcpStream)>)>,
    next_socket: AtomicU64,
    /// Set once the upstream is known gone (reported `Closed` once).
    dead: AtomicBool,
}

impl Shared {
    fn emit(&self, ev: UpstreamEvent) {
        if self.tx.send(ev).is_ok() {
            (self.wake)();
        }
    }

    fn die(&self, why: &str) {
        if !self.dead.swap(true, Ordering::SeqCst) {
            eprintln!("mcp upstream {}: {why}", self.id.0);
            self.emit(UpstreamEvent::Closed(self.id));
        }
    }

    fn register(&self, s: &TcpStream) -> Option<u64> {
        let n = self.next_socket.fetch_add(1, Ordering::Relaxed);
        let c = s.try_clone().ok()?;
        let mut g = self.sockets.lock().expect("sockets lock");
        if g.0 {
            let _ = c.shutdown(Shutdown::Both);
        } else {
            g.1.push((n, c));
        }
        Some(n)
    }

    fn unregister(&self, n: Option<u64>) {
        if let Some(n) = n {
            self.sockets
                .lock()
                .expect("sockets lock")
                .1
                .retain(|(k, _)| *k != n);
        }
    }

    fn shutdown_all(&self) {
        let mut g = self.sockets.lock().expect("sockets lock");
        g.0 = true;
        for (_, s) in g.1.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Sends one request; the connection is returned for reading the answer.
    fn send(
        &self,
        method: &str,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> std::io::Result<TcpStream> {
        let mut s = TcpStream::connect_timeout(&self.target.addr, IO_TIMEOUT)?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        let mut head = format!(
            "{method} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: application/json, text/event-stream\r\n",
            self.target.path, self.target.authority
        );
        let (sid, ver) = self.session.lock().expect("session lock").clone();
        if let Some(sid) = sid {
            head.push_str(&format!("Mcp-Session-Id: {sid}\r\n"));
        }
        let ver = extra
            .iter()
            .find(|(k, _)| *k == "MCP-Protocol-Version")
            .map(|(_, v)| (*v).to_owned())
            .or(ver);
        if let Some(v) = ver {
            head.push_str(&format!("MCP-Protocol-Version: {v}\r\n"));
        }
        if method == "POST" {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        s.flush()?;
        Ok(s)
    }
}

/// One HTTP-upstream client.
pub struct HttpUpstream {
    lines: Option<Sender<Vec<u8>>>,
    shared: Arc<Shared>,
    finished: Arc<AtomicBool>,
}

impl std::fmt::Debug for HttpUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpUpstream")
            .field("id", &self.shared.id)
            .field("authority", &self.shared.target.authority)
            .field("finished", &self.finished.load(Ordering::SeqCst))
            .finish()
    }
}

impl HttpUpstream {
    /// Starts the dispatcher thread; nothing is sent until the core sends a line.
    pub fn start(
        id: UpstreamId,
        target: HttpTarget,
        line_bytes_max: usize,
        queue_lines_max: usize,
        tx: Sender<UpstreamEvent>,
        wake: Arc<dyn Fn() + Send + Sync>,
    ) -> Result<HttpUpstream, String> {
        let shared = Arc::new(Shared {
            id,
            target,
            line_bytes_max,
            tx,
            wake,
            session: Mutex::new((None, None)),
            sockets: Mutex::new((false, Vec::new())),
            next_socket: AtomicU64::new(0),
            dead: AtomicBool::new(false),
        });
        let (ltx, lrx) = channel::bounded::<Vec<u8>>(queue_lines_max.max(1));
        let finished = Arc::new(AtomicBool::new(false));
        let (sh, fin) = (shared.clone(), finished.clone());
        std::thread::Builder::new()
            .name(format!("mcp-up{}-http", id.0))
            .spawn(move || {
                dispatch(&sh, &lrx);
                fin.store(true, Ordering::SeqCst);
            })
            .map_err(|e| format!("cannot start upstream thread: {e}"))?;
        Ok(HttpUpstream {
            lines: Some(ltx),
            shared,
            finished,
        })
    }

    /// The line queue towards the dispatcher (None once stopping).
    pub fn lines(&self) -> Option<&Sender<Vec<u8>>> {
        self.lines.as_ref()
    }

    /// Stops: the dispatcher sends DELETE (when a session exists) and shuts sockets down.
    pub fn stop(&mut self) {
        self.lines = None;
    }

    /// Stopping has finished (or the dispatcher died).
    pub fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// Last resort: shut every socket now.
    pub fn force(&self) {
        self.shared.shutdown_all();
    }
}

/// What a forwarded message is, as far as answering it goes.
struct Outgoing {
    /// The id of a single request (answered by us with an error if the upstream does not).
    request_id: Option<Value>,
    initialize: bool,
    /// A 2026-07-28 message names its version in `_meta`.
    version: Option<String>,
}

fn describe(line: &[u8]) -> Outgoing {
    let v: Value = serde_json::from_slice(line).unwrap_or(Value::Null);
    let method = v.get("method").and_then(Value::as_str);
    let request_id = match (method, v.get("id")) {
        (Some(_), Some(id)) if !id.is_null() => Some(id.clone()),
        _ => None,
    };
    Outgoing {
        request_id,
        initialize: method == Some("initialize"),
        version: v
            .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }
}

fn dispatch(sh: &Arc<Shared>, lines: &Receiver<Vec<u8>>) {
    for line in lines {
        if sh.dead.load(Ordering::SeqCst) {
            continue; // drained until the driver stops us
        }
        let body = line.strip_suffix(b"\n").unwrap_or(&line).to_vec();
        let out = describe(&body);
        let extra: Vec<(&str, &str)> = out
            .version
            .as_deref()
            .map(|v| ("MCP-Protocol-Version", v))
            .into_iter()
            .collect();
        let s = match sh.send("POST", &body, &extra) {
            Ok(s) => s,
            Err(e) => {
                sh.die(&format!(
                    "cannot send to {}{}: {e}",
                    sh.target.authority, sh.target.path
                ));
                continue;
            }
        };
        if out.initialize {
            // Read the answer here: the session id must be known before the next message.
            read_answer(sh, s, out.request_id.as_ref(), true);
            if sh.session.lock().expect("session lock").0.is_some() {
                let sh2 = sh.clone();
                let _ = std::thread::Builder::new()
                    .name(format!("mcp-up{}-get", sh.id.0))
                    .spawn(move || open_get(&sh2));
            }
        } else {
            let sh2 = sh.clone();
            let started = std::thread::Builder::new()
                .name(format!("mcp-up{}-post", sh.id.0))
                .spawn(move || read_answer(&sh2, s, out.request_id.as_ref(), false));
            if let Err(e) = started {
                sh.die(&format!("cannot start a reader thread: {e}"));
            }
        }
    }
    // Stopped by the driver: end the upstream session, then every open stream.
    let sid = sh.session.lock().expect("session lock").0.clone();
    if sid.is_some()
        && !sh.dead.load(Ordering::SeqCst)
        && let Ok(mut s) = sh.send("DELETE", b"", &[])
    {
        let _ = s.set_read_timeout(Some(SHORT_READ_TIMEOUT));
        let _ = s.read(&mut [0u8; 1024]);
    }
    sh.shutdown_all();
}

/// The GET stream: server messages unrelated to a request. 405 = the upstream has none.
fn open_get(sh: &Arc<Shared>) {
    let Ok(s) = sh.send("GET", b"", &[]) else {
        return;
    };
    let reg = sh.register(&s);
    match read_head(s) {
        Ok((200, headers, body)) if is_sse(&headers) => {
            read_sse(sh, body, None);
        }
        Ok((status, _, _)) if status != 405 => {
            eprintln!("mcp upstream {}: GET stream answered {status}", sh.id.0);
        }
        _ => {}
    }
    sh.unregister(reg);
}

type Headers = Vec<(String, String)>;

fn header<'a>(hs: &'a Headers, name: &str) -> Option<&'a str> {
    hs.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn is_sse(hs: &Headers) -> bool {
    header(hs, "content-type").is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}

/// Reads a response head; returns the status, headers and a reader of the decoded body.
fn read_head(mut s: TcpStream) -> Result<(u16, Headers, Box<dyn BufRead + Send>), String> {
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

/// Does this message answer `id`?
fn answers(msg: &[u8], id: &Value) -> bool {
    match serde_json::from_slice::<Value>(msg) {
        Ok(Value::Object(o)) => {
            o.get("id") == Some(id) && (o.contains_key("result") || o.contains_key("error"))
        }
        Ok(Value::Array(a)) => a.iter().any(|m| {
            m.get("id") == Some(id) && (m.get("result").is_some() || m.get("error").is_some())
        }),
        _ => false,
    }
}

/// Hands one message on (or reports it too long).
fn forward(sh: &Shared, msg: Vec<u8>, want: Option<&Value>, answered: &mut bool, init: bool) {
    if msg.len() > sh.line_bytes_max {
        sh.emit(UpstreamEvent::LineTooLong(sh.id, msg.len()));
        return;
    }
    if let Some(id) = want
        && answers(&msg, id)
    {
        *answered = true;
        if init
            && let Ok(v) = serde_json::from_slice::<Value>(&msg)
            && let Some(ver) = v.pointer("/result/protocolVersion").and_then(Value::as_str)
        {
            sh.session.lock().expect("session lock").1 = Some(ver.to_owned());
        }
    }
    sh.emit(UpstreamEvent::Line(sh.id, msg));
}

/// Reads one POST's answer and forwards its messages; a request left unanswered gets an
/// error response made here.
fn read_answer(sh: &Arc<Shared>, s: TcpStream, request_id: Option<&Value>, init: bool) {
    let reg = sh.register(&s);
    let mut answered = false;
    let failure = match read_head(s) {
        Err(e) => Some(format!("upstream answer unreadable: {e}")),
        Ok((status, headers, mut body)) => {
            if init && let Some(sid) = header(&headers, "mcp-session-id") {
                sh.session.lock().expect("session lock").0 = Some(sid.trim().to_owned());
            }
            match status {
                200 if is_sse(&headers) => {
                    read_sse(sh, body, request_id.map(|id| (id, &mut answered, init)));
                    None
                }
                200 => {
                    let mut msg = Vec::new();
                    let max = sh.line_bytes_max as u64 + 1;
                    match body.by_ref().take(max).read_to_end(&mut msg) {
                        Err(e) => Some(format!("upstream answer unreadable: {e}")),
                        Ok(_) if msg.iter().all(u8::is_ascii_whitespace) => None,
                        Ok(_) => {
                            forward(sh, msg, request_id, &mut answered, init);
                            None
                        }
                    }
                }
                202 => None,
                404 if sh.session.lock().expect("session lock").0.is_some() => {
                    sh.die("the upstream answered 404: its session is gone");
                    None
                }
                _ => {
                    let mut text = Vec::new();
                    let _ = body.take(512).read_to_end(&mut text);
                    Some(format!(
                        "upstream answered HTTP {status}: {}",
                        String::from_utf8_lossy(&text).trim()
                    ))
                }
            }
        }
    };
    sh.unregister(reg);
    let Some(id) = request_id else {
        if let Some(f) = failure {
            eprintln!("mcp upstream {}: {f}", sh.id.0);
        }
        return;
    };
    if answered || sh.dead.load(Ordering::SeqCst) {
        return; // a dead upstream's requests are answered by the core
    }
    let why = failure.unwrap_or_else(|| {
        "the upstream ended the request's stream without a response (it cannot be resumed upstream)"
            .into()
    });
    let err = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": -32603, "message": why},
    });
    sh.emit(UpstreamEvent::Line(
        sh.id,
        serde_json::to_vec(&err).expect("json"),
    ));
}

/// Reads SSE events until the stream ends; each non-empty `data` is one JSON-RPC message.
fn read_sse(
    sh: &Shared,
    mut body: Box<dyn BufRead + Send>,
    want: Option<(&Value, &mut bool, bool)>,
) {
    let (want_id, answered, init) = match want {
        Some((id, a, i)) => (Some(id), Some(a), i),
        None => (None, None, false),
    };
    let mut dummy = false;
    let answered = answered.unwrap_or(&mut dummy);
    let mut data: Vec<u8> = Vec::new();
    let mut has_data = false;
    let mut too_long = 0usize;
    let mut line = Vec::new();
    loop {
        line.clear();
        // A line longer than the record limit is cut here and the event dropped as too long.
        let limit = sh.line_bytes_max as u64 + 2;
        match body.by_ref().take(limit).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if !line.ends_with(b"\n") && line.len() as u64 >= limit {
            too_long += line.len();
            // Skip the rest of the line.
            let mut rest = Vec::new();
            loop {
                rest.clear();
                match body.by_ref().take(64 * 1024).read_until(b'\n', &mut rest) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if rest.ends_with(b"\n") => break,
                    Ok(n) => too_long += n,
                }
            }
            continue;
        }
        let l = line.strip_suffix(b"\n").unwrap_or(&line);
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        if l.is_empty() {
            if too_long > 0 {
                sh.emit(UpstreamEvent::LineTooLong(sh.id, too_long));
            } else if has_data && !data.iter().all(u8::is_ascii_whitespace) {
                forward(sh, std::mem::take(&mut data), want_id, answered, init);
            }
            data.clear();
            has_data = false;
            too_long = 0;
            continue;
        }
        if let Some(v) = l.strip_prefix(b"data:") {
            let v = v.strip_prefix(b" ").unwrap_or(v);
            if has_data {
                data.push(b'\n');
            }
            data.extend_from_slice(v);
            has_data = true;
            if data.len() > sh.line_bytes_max {
                too_long += data.len();
                data.clear();
                has_data = false;
            }
        }
        // id:, event:, retry: and comments carry nothing we need.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_is_refused_clearly() {
        assert_eq!(
            parse_url("https://127.0.0.1/mcp").unwrap_err(),
            UrlError::Https
        );
        assert!(
            UrlError::Https.to_string().contains("no TLS"),
            "{}",
            UrlError::Https
        );
        assert_eq!(parse_url("ftp://x/").unwrap_err(), UrlError::NotHttp);
        assert_eq!(parse_url("http:///mcp").unwrap_err(), UrlError::NoHost);
    }

    #[test]
    fn url_parts() {
        let t = parse_url("http://127.0.0.1:9000/mcp?x=1").unwrap();
        assert_eq!(t.authority, "127.0.0.1:9000");
        assert_eq!(t.path, "/mcp?x=1");
        assert_eq!(t.addr.port(), 9000);
        let t = parse_url("http://127.0.0.1").unwrap();
        assert_eq!((t.path.as_str(), t.addr.port()), ("/", 80));
    }

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

    #[test]
    fn answers_matches_id_of_response_only() {
        let id = serde_json::json!(3);
        assert!(answers(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#, &id));
        assert!(answers(br#"[{"jsonrpc":"2.0","id":3,"error":{}}]"#, &id));
        assert!(!answers(br#"{"jsonrpc":"2.0","id":3,"method":"x"}"#, &id));
        assert!(!answers(br#"{"jsonrpc":"2.0","id":"3","result":{}}"#, &id));
    }
}
