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
//! `Authorization` (`--mcp-forward-authorization`, off by default): the client's header value
//! goes on the upstream requests made on its behalf, and never on another client's. A
//! session's client (one per gateway session, so one client's) sends the value of the
//! session's latest request ([`HttpUpstream::set_authorization`], called by the reactor
//! before it queues that request's messages) on every request it makes — its POSTs, even those
//! queued before a refresh, its GET stream and its DELETE — so an upstream never sees a token
//! the client has already replaced. The shared modern client serves every 2026-07-28 client
//! on one dispatcher, so it forwards per request: each message carries its own value
//! ([`Outbound::authorization`], the request's; a cancellation the cancelled request's) and
//! nothing else does (its GET stream and DELETE go without). The value is written into the
//! request head and nowhere else: never logged, never in an error made here (an upstream
//! error body quoted in one has it scrubbed, [`Credential::scrub`]).
//!
//! Not done: TLS (`https://` is refused at start), keep-alive connections, resuming the
//! upstream's own streams with `Last-Event-ID`, and the 2026-07-28 `Mcp-Method`/`Mcp-Name`
//! mirror headers towards the upstream (the body's `_meta` protocol version is sent as
//! `MCP-Protocol-Version`).
//!
//! # Layout
//! This file: the URL, the client and its dispatcher thread, the GET stream. `answer`: reading
//! one answer (JSON or SSE) and forwarding its messages. `wire`: HTTP/1.1 response framing
//! (head, chunked and length-delimited bodies).
#![forbid(unsafe_code)]

mod answer;
mod wire;

use crate::core::UpstreamId;
use crate::credential::Credential;
use crate::upstream_event::UpstreamEvent;
use answer::{read_answer, read_sse};
use crossbeam::channel::{self, Receiver, Sender};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wire::{is_sse, read_head};

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
    /// The client's `Authorization` for requests whose message carries none (the session's
    /// latest; never set for the shared modern client). See the module doc.
    authorization: Mutex<Option<Credential>>,
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

    /// The session credential (see the module doc).
    fn session_authorization(&self) -> Option<Credential> {
        self.authorization
            .lock()
            .expect("authorization lock")
            .clone()
    }

    /// Sends one request (with `auth` as its `Authorization`, if any); the connection is
    /// returned for reading the answer.
    fn send(
        &self,
        method: &str,
        body: &[u8],
        extra: &[(&str, &str)],
        auth: Option<&Credential>,
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
        if let Some(a) = auth {
            // `Credential` holds no CR, LF or other control byte: it cannot end the head.
            head.push_str("Authorization: ");
            head.push_str(a.expose());
            head.push_str("\r\n");
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

/// One message for the upstream and the `Authorization` to send it with; `None`: the
/// client's session credential, if one is set ([`HttpUpstream::set_authorization`]).
#[derive(Debug)]
pub struct Outbound {
    pub line: Vec<u8>,
    pub authorization: Option<Credential>,
}

/// One HTTP-upstream client.
pub struct HttpUpstream {
    lines: Option<Sender<Outbound>>,
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
            authorization: Mutex::new(None),
            sockets: Mutex::new((false, Vec::new())),
            next_socket: AtomicU64::new(0),
            dead: AtomicBool::new(false),
        });
        let (ltx, lrx) = channel::bounded::<Outbound>(queue_lines_max.max(1));
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

    /// The message queue towards the dispatcher (None once stopping).
    pub fn lines(&self) -> Option<&Sender<Outbound>> {
        self.lines.as_ref()
    }

    /// The `Authorization` every later request of this client carries when its message brings
    /// none (the session's latest request's; `None`: no header). Takes effect at once, also
    /// for messages already queued.
    pub fn set_authorization(&self, authorization: Option<Credential>) {
        *self
            .shared
            .authorization
            .lock()
            .expect("authorization lock") = authorization;
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

fn dispatch(sh: &Arc<Shared>, lines: &Receiver<Outbound>) {
    for msg in lines {
        if sh.dead.load(Ordering::SeqCst) {
            continue; // drained until the driver stops us
        }
        post(sh, msg);
    }
    // Stopped by the driver: end the upstream session, then every open stream.
    let sid = sh.session.lock().expect("session lock").0.clone();
    let auth = sh.session_authorization();
    if sid.is_some()
        && !sh.dead.load(Ordering::SeqCst)
        && let Ok(mut s) = sh.send("DELETE", b"", &[], auth.as_ref())
    {
        let _ = s.set_read_timeout(Some(SHORT_READ_TIMEOUT));
        let _ = s.read(&mut [0u8; 1024]);
    }
    sh.shutdown_all();
}

/// POSTs one message and starts reading its answer (`initialize`: reads it here, then opens
/// the GET stream).
fn post(sh: &Arc<Shared>, msg: Outbound) {
    let body = msg.line.strip_suffix(b"\n").unwrap_or(&msg.line).to_vec();
    let out = describe(&body);
    let extra: Vec<(&str, &str)> = out
        .version
        .as_deref()
        .map(|v| ("MCP-Protocol-Version", v))
        .into_iter()
        .collect();
    let auth = msg.authorization.or_else(|| sh.session_authorization());
    let s = match sh.send("POST", &body, &extra, auth.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            let (a, p) = (&sh.target.authority, &sh.target.path);
            return sh.die(&format!("cannot send to {a}{p}: {e}"));
        }
    };
    if out.initialize {
        // Read the answer here: the session id must be known before the next message.
        read_answer(sh, s, out.request_id.as_ref(), true, auth.as_ref());
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
            .spawn(move || read_answer(&sh2, s, out.request_id.as_ref(), false, auth.as_ref()));
        if let Err(e) = started {
            sh.die(&format!("cannot start a reader thread: {e}"));
        }
    }
}

/// The GET stream: server messages unrelated to a request. 405 = the upstream has none.
fn open_get(sh: &Arc<Shared>) {
    let auth = sh.session_authorization();
    let Ok(s) = sh.send("GET", b"", &[], auth.as_ref()) else {
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
}
