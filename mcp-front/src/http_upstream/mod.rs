//! Upstream MCP servers reached over streamable HTTP (`--upstream-url http(s)://host:port/path`):
//! one client per upstream id (= per gateway MCP session, or the shared modern upstream), all
//! of them sharing one [`HttpEndpoint`] (the URL, the TLS client, the keep-alive pool). A
//! dispatcher thread takes the lines the core sends upstream, in order, and POSTs each as its
//! body; the answer — 202, a JSON body or an SSE stream — is read by a thread per POST, and
//! every JSON-RPC message in it is handed on as [`UpstreamEvent::Line`], exactly like a stdout
//! line of a stdio child, so the core and the log see no difference. The upstream's
//! `Mcp-Session-Id` (from the `initialize` answer, which the dispatcher reads itself before
//! sending anything else) and its negotiated protocol version go on every later request;
//! after `initialize` the upstream's GET stream is opened (405 is fine: the upstream has none).
//! Stopping sends `DELETE` with the session id and shuts every socket of the client down.
//!
//! Explicit errors, never a silent gap: a request the upstream refuses (4xx/5xx other than 404),
//! whose answer cannot be read, or whose SSE stream ends without its response (an upstream
//! without resumability cannot be resumed by us) gets a JSON-RPC error response made here for
//! its id; 404 on a session request, or an upstream that cannot be connected (refused, TLS
//! handshake failed — a certificate that does not verify, for one), ends the upstream with
//! [`UpstreamEvent::Failed`] naming why (the core then answers its in-flight requests with
//! errors quoting it). Once a message is in our log it is resumable by our clients even though
//! the upstream keeps no history.
//!
//! # TLS (`https://`)
//! rustls with the ring provider, TLS 1.2/1.3, ALPN `http/1.1`, over the same blocking sockets
//! (`rustls::StreamOwned`). Trust: the system roots, or only the `--upstream-ca-file` PEM
//! files when given. The certificate must match the URL's host (a DNS name via SNI, an IP
//! literal against the certificate's IP addresses). The handshake completes before a byte of
//! a request is written; a failed one is a failed connection, never a plaintext fallback.
//!
//! # Keep-alive and retries
//! POSTs and the closing DELETE go over HTTP/1.1 keep-alive connections from the endpoint's
//! pool (at most `--upstream-pool-connections-max` idle, each closed after
//! `--upstream-pool-idle-secs` unused; 0 connections = `Connection: close` on every request).
//! A request takes the most recently used idle connection that passes a non-blocking probe
//! (nothing readable: no FIN, no alert, no stray byte), else opens one; it never waits for
//! one. A connection goes back only after an answer read exactly to its end (`Content-Length`
//! or chunked; a 202 or error body up to 64 KiB is read for that) from a server that did not
//! say `Connection: close`; an SSE answer holds its connection until the stream ends, a body
//! delimited by close is never reused. The GET stream always has a connection of its own.
//!
//! A request is sent again — once, on a freshly opened connection — only when it went out on
//! a *reused* connection and either (a) writing it failed (the server did not get all of it,
//! so it cannot have acted on it), or (b) the connection ended (EOF or an error) before one
//! byte of the answer arrived: the usual sign of a server that closed the idle connection as
//! the request was sent. MCP POSTs are not idempotent, and (b) is HTTP's retry caveat (RFC
//! 9110 §9.2.2): a server that read the request, acted on it and then closed without a byte
//! of an answer (a crash) would get it twice; the probe leaves (b) only to a close racing the
//! request. Nothing else is retried: a failure on a fresh connection ends the upstream (as
//! above), and a request of which any byte of the answer arrived gets an explicit error if
//! the answer is cut. A retried request can reach the upstream after requests sent after it
//! (each request has its own connection, so their order at the upstream was never strict).
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
//! error body quoted in one has it scrubbed, [`Credential::scrub`]). Pooled connections are
//! shared by every client of the endpoint; a credential lives in a request, never in a
//! connection.
//!
//! Not done: resuming the upstream's own streams with `Last-Event-ID`, TLS client
//! certificates, and the 2026-07-28 `Mcp-Method`/`Mcp-Name` mirror headers towards the
//! upstream (the body's `_meta` protocol version is sent as `MCP-Protocol-Version`).
//!
//! # Layout
//! This file: the URL, the endpoint, the client and its dispatcher thread, the GET stream.
//! `shared`: what a client's threads share; one request out and its answer's head in (the
//! retry). `answer`: reading one answer (JSON or SSE) and forwarding its messages. `pool`:
//! connections (TCP, TLS) and the keep-alive pool. `tls`: the TLS client configuration.
//! `wire`: HTTP/1.1 response framing (head, chunked and length-delimited bodies).
#![forbid(unsafe_code)]

mod answer;
mod pool;
mod shared;
mod tls;
mod wire;

use crate::core::UpstreamId;
use crate::credential::Credential;
use crate::upstream_event::UpstreamEvent;
use answer::{DRAIN_BYTES_MAX, read_answer, read_sse};
use crossbeam::channel::{self, Receiver, Sender};
use pool::Pool;
pub use pool::PoolStats;
use rustls::pki_types::ServerName;
use serde_json::Value;
use shared::Shared;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wire::{Body, is_sse, read_head};

/// Read timeout for answers that must be short (DELETE); POST answers and SSE streams have
/// none (they live as long as the request and are shut down when the upstream is stopped).
const SHORT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the upstream is: an `http://` or `https://` URL, resolved once at start.
#[derive(Debug, Clone)]
pub struct HttpTarget {
    /// `host[:port]` as written, for the `Host` header.
    pub authority: String,
    pub addr: SocketAddr,
    /// Path and query, starting with `/`.
    pub path: String,
    /// `https://`: the name the upstream's certificate must carry (the URL's host).
    pub server_name: Option<ServerName<'static>>,
}

/// Why `--upstream-url` was refused.
#[derive(Debug, PartialEq)]
pub enum UrlError {
    NotHttp,
    NoHost,
    BadTlsName(String),
    Unresolvable(String),
}

impl std::fmt::Display for UrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UrlError::NotHttp => write!(f, "the URL must start with http:// or https://"),
            UrlError::NoHost => write!(f, "the URL has no host"),
            UrlError::BadTlsName(e) => write!(f, "{e}"),
            UrlError::Unresolvable(e) => write!(f, "the host cannot be resolved: {e}"),
        }
    }
}

/// Parses `http(s)://host[:port][/path]` (port 80 or 443 by default, path `/` by default).
pub fn parse_url(url: &str) -> Result<HttpTarget, UrlError> {
    let lower = url.to_ascii_lowercase();
    let (rest, https) = if lower.starts_with("https://") {
        (&url["https://".len()..], true)
    } else if lower.starts_with("http://") {
        (&url["http://".len()..], false)
    } else {
        return Err(UrlError::NotHttp);
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_owned()),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(UrlError::NoHost);
    }
    let (host, with_port) = if authority.ends_with(']') || !authority.contains(':') {
        let port = if https { 443 } else { 80 };
        (authority, format!("{authority}:{port}"))
    } else {
        let colon = authority.rfind(':').expect("contains ':'");
        (&authority[..colon], authority.to_owned())
    };
    let server_name = match https {
        true => Some(tls::server_name(host).map_err(UrlError::BadTlsName)?),
        false => None,
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
        server_name,
    })
}

/// How to reach an `--upstream-url` server besides its URL.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `--upstream-ca-file`: the only roots an `https://` upstream is verified against
    /// (empty: the system roots).
    pub ca_files: Vec<PathBuf>,
    /// `--upstream-pool-connections-max`: idle keep-alive connections kept (0: none).
    pub pool_connections_max: usize,
    /// `--upstream-pool-idle-secs`: how long an idle connection is kept.
    pub pool_idle: Duration,
}

/// One upstream server: its URL, the TLS client for `https://`, and the keep-alive pool that
/// every client of it shares. Built once at start; [`HttpEndpoint::new`] refuses what cannot
/// work (a bad URL, a CA file without certificates, `--upstream-ca-file` with `http://`).
pub struct HttpEndpoint {
    target: HttpTarget,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for HttpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpEndpoint")
            .field("target", &self.target)
            .field("pool", &self.pool.stats())
            .finish()
    }
}

impl HttpEndpoint {
    pub fn new(url: &str, opts: &HttpOptions) -> Result<Arc<HttpEndpoint>, String> {
        let target = parse_url(url).map_err(|e| e.to_string())?;
        let tls = match &target.server_name {
            Some(name) => Some((tls::client_config(&opts.ca_files)?, name.clone())),
            None if !opts.ca_files.is_empty() => {
                return Err("--upstream-ca-file needs an https:// --upstream-url".into());
            }
            None => None,
        };
        let pool = Pool::new(target.addr, tls, opts.pool_connections_max, opts.pool_idle);
        Ok(Arc::new(HttpEndpoint {
            target,
            pool: Arc::new(pool),
        }))
    }

    pub fn target(&self) -> &HttpTarget {
        &self.target
    }

    /// The pool's counters.
    pub fn stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Closes the idle connections and keeps none from now on (gateway shutdown).
    pub fn close_idle(&self) {
        self.pool.close_all();
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
            .field("authority", &self.shared.ep.target.authority)
            .field("finished", &self.finished.load(Ordering::SeqCst))
            .finish()
    }
}

impl HttpUpstream {
    /// Starts the dispatcher thread; nothing is sent until the core sends a line.
    pub fn start(
        id: UpstreamId,
        ep: Arc<HttpEndpoint>,
        line_bytes_max: usize,
        queue_lines_max: usize,
        tx: Sender<UpstreamEvent>,
        wake: Arc<dyn Fn() + Send + Sync>,
    ) -> Result<HttpUpstream, String> {
        let shared = Arc::new(Shared {
            id,
            ep,
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
    end_session(sh);
    sh.shutdown_all();
}

/// `DELETE` of the upstream session (if one exists and the upstream is alive), its short
/// answer read so that its connection can go back into the pool.
fn end_session(sh: &Arc<Shared>) {
    let sid = sh.session.lock().expect("session lock").0.clone();
    if sid.is_none() || sh.dead.load(Ordering::SeqCst) {
        return;
    }
    let auth = sh.session_authorization();
    let keep = sh.ep.pool.keeps();
    let req = sh.request("DELETE", b"", None, auth.as_ref(), keep);
    let Ok(c) = sh.send(&req, keep, Some(SHORT_READ_TIMEOUT)) else {
        return;
    };
    let mut reg = sh.register(c.tcp());
    if let Ok((head, c)) = sh.answer(c, &req, &mut reg) {
        let mut body = Body::new(c, &head);
        body.drain(DRAIN_BYTES_MAX);
        sh.release(body, &head, &mut reg);
    }
    sh.unregister(reg);
}

/// POSTs one message and starts reading its answer (`initialize`: reads it here, then opens
/// the GET stream).
fn post(sh: &Arc<Shared>, msg: Outbound) {
    let body = msg.line.strip_suffix(b"\n").unwrap_or(&msg.line).to_vec();
    let out = describe(&body);
    let auth = msg.authorization.or_else(|| sh.session_authorization());
    let keep = sh.ep.pool.keeps();
    let req = sh.request("POST", &body, out.version.as_deref(), auth.as_ref(), keep);
    let c = match sh.send(&req, keep, None) {
        Ok(c) => c,
        Err(e) => return sh.die(&e),
    };
    if out.initialize {
        // Read the answer here: the session id must be known before the next message.
        read_answer(sh, c, req, out.request_id.as_ref(), true, auth.as_ref());
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
            .spawn(move || {
                read_answer(&sh2, c, req, out.request_id.as_ref(), false, auth.as_ref());
            });
        if let Err(e) = started {
            sh.die(&format!("cannot start a reader thread: {e}"));
        }
    }
}

/// The GET stream: server messages unrelated to a request, on a connection of its own (never
/// pooled: it lives as long as the session). 405 = the upstream has none.
fn open_get(sh: &Arc<Shared>) {
    let auth = sh.session_authorization();
    let req = sh.request("GET", b"", None, auth.as_ref(), false);
    let Ok(mut c) = sh.send(&req, false, None) else {
        return;
    };
    let reg = sh.register(c.tcp());
    match read_head(&mut c) {
        Ok(head) if head.status == 200 && is_sse(&head.headers) => {
            read_sse(sh, &mut Body::new(c, &head), None);
        }
        Ok(head) if head.status != 405 => {
            tracing::warn!(
                upstream = sh.id.0,
                status = head.status,
                "the upstream's GET stream was refused"
            );
        }
        _ => {}
    }
    sh.unregister(reg);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_schemes() {
        assert_eq!(parse_url("ftp://x/").unwrap_err(), UrlError::NotHttp);
        assert_eq!(parse_url("http:///mcp").unwrap_err(), UrlError::NoHost);
        assert_eq!(parse_url("https:///mcp").unwrap_err(), UrlError::NoHost);
        let t = parse_url("HTTPS://127.0.0.1/mcp").unwrap();
        assert_eq!(t.addr.port(), 443);
        assert!(matches!(t.server_name, Some(ServerName::IpAddress(_))));
        let t = parse_url("https://localhost:8443/mcp").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.addr.port()),
            ("localhost:8443", 8443)
        );
        assert!(matches!(t.server_name, Some(ServerName::DnsName(_))));
        let t = parse_url("https://[::1]:9/").unwrap();
        assert!(matches!(t.server_name, Some(ServerName::IpAddress(_))));
        assert!(
            parse_url("http://127.0.0.1/")
                .unwrap()
                .server_name
                .is_none()
        );
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
    fn ca_files_need_https() {
        let opts = HttpOptions {
            ca_files: vec!["/nonexistent/ca.pem".into()],
            pool_connections_max: 8,
            pool_idle: Duration::from_secs(30),
        };
        let e = HttpEndpoint::new("http://127.0.0.1:9/mcp", &opts).unwrap_err();
        assert!(e.contains("needs an https://"), "{e}");
        let e = HttpEndpoint::new("https://127.0.0.1:9/mcp", &opts).unwrap_err();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }
}
