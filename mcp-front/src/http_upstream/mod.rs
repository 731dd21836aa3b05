//! Upstream MCP servers reached over streamable HTTP (`--upstream-url http(s)://host:port/path`):
//! one client per upstream id (= per gateway MCP session, or the shared modern upstream), each
//! with its own ureq agent (its connections and keep-alive pool) built from the one
//! [`HttpEndpoint`] (the URL, the trust, the proxy, the counters). A dispatcher thread takes
//! the lines the core sends upstream, in order, and POSTs each as its body; the answer — 202,
//! a JSON body or an SSE stream — is read by a thread per POST, and every JSON-RPC message in
//! it is handed on as [`UpstreamEvent::Line`], exactly like a stdout line of a stdio child, so
//! the core and the log see no difference. The dispatcher takes the next line once a POST is
//! written whole (not answered), so the upstream gets them in order. The upstream's
//! `Mcp-Session-Id` (from the `initialize` answer, which the dispatcher reads itself before
//! sending anything else) and its negotiated protocol version go on every later request;
//! after `initialize` the upstream's GET stream is opened (405 is fine: the upstream has none).
//! Stopping sends `DELETE` with the session id, then shuts every connection of the client down
//! (`Agent::shutdown`: readers blocked on an answer return at once).
//!
//! Explicit errors, never a silent gap: a request the upstream refuses (4xx/5xx other than 404),
//! whose answer cannot be read, or whose SSE stream ends without its response (an upstream
//! without resumability cannot be resumed by us) gets a JSON-RPC error response made here for
//! its id; 404 on a session request, or an upstream that cannot be reached (no address
//! accepts, the proxy refuses, the TLS handshake fails — a certificate that does not verify,
//! for one), ends the upstream with [`UpstreamEvent::Failed`] naming why (the core then answers
//! its in-flight requests with errors quoting it). Once a message is in our log it is
//! resumable by our clients even though the upstream keeps no history.
//!
//! # The HTTP client: ureq
//! HTTP/1.1 framing, the keep-alive pool, TLS and proxy tunnels are ureq 3's (blocking, like
//! these threads; rustls with our ring provider; MIT OR Apache-2.0). Each new connection
//! resolves the host again (ureq's resolver: the system's `getaddrinfo`, at most 16 addresses)
//! and tries every address in order until one accepts, so an upstream that moves (a Kubernetes
//! service, a load balancer's addresses) is found again. Proxies: `proxy.rs`
//! (`HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY`). Timeouts: resolving, connecting (each address
//! included), the proxy tunnel, the TLS handshake and writing a request each 10 s; no read
//! timeout on POST answers and SSE streams (they live as long as the request and end when the
//! client stops); the closing `DELETE` 10 s in all. Heads up to 64 KiB; bodies are read as
//! they arrive, a JSON message or an SSE line at most the line limit. Redirects are not
//! followed (a 3xx is an error answer).
//!
//! # TLS (`https://`)
//! TLS 1.2/1.3 (`tls.rs`). Trust: the system roots, or only the `--upstream-ca-file` PEM files
//! when given. The certificate must match the URL's host (a DNS name via SNI, an IP literal
//! against the certificate's IP addresses). The handshake completes before a byte of a request
//! is written; a failed one is a failed connection, never a plaintext fallback.
//!
//! # Keep-alive and retries
//! A client's POSTs and its closing DELETE go over HTTP/1.1 keep-alive connections from its
//! agent's pool (at most `--upstream-pool-connections-max` idle, each closed once
//! `--upstream-pool-idle-secs` unused — at the client's next request, or when it stops; 0
//! connections = none kept). A request takes the most recently used idle connection that
//! passes ureq's non-blocking probe (nothing readable: no FIN, no stray byte), else opens one;
//! it never waits for one. A connection goes back only after an answer read exactly to its
//! end (a 202 or error body up to 64 KiB is read for that); an SSE answer holds its connection
//! until the stream ends.
//!
//! A request is sent again — once, on a fresh connection — only when it went out on a
//! *reused* connection and either (a) writing it failed (the server did not get all of it,
//! so it cannot have acted on it), or (b) the connection ended before one byte of the answer
//! arrived: the usual sign of a server that closed the idle connection as the request was
//! sent. MCP POSTs are not idempotent, and (b) is HTTP's retry caveat (RFC 9110 §9.2.2): a
//! server that read the request, acted on it and then closed without a byte of an answer (a
//! crash) would get it twice; the probe leaves (b) only to a close racing the request. Nothing
//! else is retried: a failure on a fresh connection ends the upstream (as above), and a
//! request of which any byte of the answer arrived gets an explicit error if the answer is
//! cut. (ureq does not retry; `agent.rs` watches each connection to tell these cases apart.)
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
//! error body quoted in one has it scrubbed, [`Credential::scrub`]). A credential lives in a
//! request, never in a connection.
//!
//! Not done: resuming the upstream's own streams with `Last-Event-ID`, TLS client
//! certificates, SOCKS proxies, and the 2026-07-28 `Mcp-Method`/`Mcp-Name` mirror headers
//! towards the upstream (the body's `_meta` protocol version is sent as
//! `MCP-Protocol-Version`).
//!
//! # Layout
//! This file: the URL, the endpoint, the client and its dispatcher thread, the GET stream.
//! `shared`: what a client's threads share; one request out and its answer's head in (the
//! retry). `answer`: reading one answer (JSON or SSE) and forwarding its messages. `agent`:
//! the ureq agents and the connection watch. `proxy`: which proxy. `tls`: the roots.
#![forbid(unsafe_code)]

mod agent;
mod answer;
#[cfg(test)]
mod client_tests;
mod proxy;
mod shared;
mod tls;

use crate::core::UpstreamId;
use crate::credential::Credential;
use crate::upstream_event::UpstreamEvent;
pub use agent::PoolStats;
use agent::{AgentParts, Counters, SharedResolver};
use answer::{DRAIN_BYTES_MAX, body_reader, drain, is_sse, read_answer, read_sse};
use crossbeam::channel::{self, Receiver, Sender};
pub use proxy::ProxyEnv;
use serde_json::Value;
use shared::Shared;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, Resolver};

/// The whole of the closing `DELETE` (connecting, sending, its answer).
const DELETE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the upstream is: an `http://` or `https://` URL (resolved per connection).
#[derive(Debug, Clone)]
pub struct HttpTarget {
    pub uri: Uri,
    /// `host[:port]` and path, for log lines.
    pub shown: String,
    pub https: bool,
}

/// Why `--upstream-url` was refused.
#[derive(Debug, PartialEq)]
pub enum UrlError {
    NotHttp,
    NoHost,
    BadTlsName(String),
    Invalid(String),
}

impl std::fmt::Display for UrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UrlError::NotHttp => write!(f, "the URL must start with http:// or https://"),
            UrlError::NoHost => write!(f, "the URL has no host"),
            UrlError::BadTlsName(e) => write!(f, "{e}"),
            UrlError::Invalid(e) => write!(f, "not a valid URL: {e}"),
        }
    }
}

/// Parses `http(s)://host[:port][/path]` (port 80 or 443 by default, path `/` by default; no
/// user info). Nothing is resolved here: each connection resolves the host.
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
    let scheme = if https { "https" } else { "http" };
    let uri: Uri = format!("{scheme}://{authority}{path}")
        .parse()
        .map_err(|e: ureq::http::uri::InvalidUri| UrlError::Invalid(e.to_string()))?;
    let host = uri.host().ok_or(UrlError::NoHost)?;
    if https {
        tls::server_name(host).map_err(UrlError::BadTlsName)?;
    }
    Ok(HttpTarget {
        shown: format!("{authority}{path}"),
        uri,
        https,
    })
}

/// How to reach an `--upstream-url` server besides its URL.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `--upstream-ca-file`: the only roots an `https://` upstream is verified against
    /// (empty: the system roots).
    pub ca_files: Vec<PathBuf>,
    /// `--upstream-pool-connections-max`: idle keep-alive connections kept per client (0: none).
    pub pool_connections_max: usize,
    /// `--upstream-pool-idle-secs`: how long an idle connection is kept.
    pub pool_idle: Duration,
    /// The proxy variables (`HTTPS_PROXY`, `NO_PROXY`, …), usually [`ProxyEnv::from_process`].
    pub proxy_env: ProxyEnv,
}

/// One upstream server: its URL, and what every client's agent is built from (trust, proxy,
/// resolver, pool bounds, the counters they share). Built once at start; [`HttpEndpoint::new`]
/// refuses what cannot work (a bad URL, a CA file without certificates, `--upstream-ca-file`
/// with `http://`, a proxy variable that cannot be used).
pub struct HttpEndpoint {
    target: HttpTarget,
    parts: AgentParts,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for HttpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpEndpoint")
            .field("target", &self.target.shown)
            .field("proxied", &self.parts.proxy.is_some())
            .field("stats", &self.counters.stats())
            .finish()
    }
}

impl HttpEndpoint {
    pub fn new(url: &str, opts: &HttpOptions) -> Result<Arc<HttpEndpoint>, String> {
        HttpEndpoint::with_resolver(url, opts, Arc::new(DefaultResolver::default()))
    }

    /// [`HttpEndpoint::new`] with another resolver than the system's (tests).
    fn with_resolver(
        url: &str,
        opts: &HttpOptions,
        resolver: Arc<dyn Resolver>,
    ) -> Result<Arc<HttpEndpoint>, String> {
        let target = parse_url(url).map_err(|e| e.to_string())?;
        let roots = match target.https {
            true => Some(tls::roots(&opts.ca_files)?),
            false if !opts.ca_files.is_empty() => {
                return Err("--upstream-ca-file needs an https:// --upstream-url".into());
            }
            false => None,
        };
        let counters = Arc::new(Counters::default());
        let parts = AgentParts {
            uri: target.uri.clone(),
            roots,
            proxy: opts.proxy_env.proxy_for(&target.uri)?,
            pool_connections_max: opts.pool_connections_max,
            pool_idle: opts.pool_idle,
            resolver: SharedResolver(resolver),
            counters: counters.clone(),
        };
        Ok(Arc::new(HttpEndpoint {
            target,
            parts,
            counters,
        }))
    }

    pub fn target(&self) -> &HttpTarget {
        &self.target
    }

    /// Whether requests go through a proxy (`HTTPS_PROXY`, …).
    pub fn proxied(&self) -> bool {
        self.parts.proxy.is_some()
    }

    /// The connection counters of every client of this endpoint.
    pub fn stats(&self) -> PoolStats {
        self.counters.stats()
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
            .field("target", &self.shared.ep.target.shown)
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
            agent: ep.parts.agent(),
            ep,
            line_bytes_max,
            tx,
            wake,
            session: Mutex::new((None, None)),
            authorization: Mutex::new(None),
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

    /// Stops: the dispatcher sends DELETE (when a session exists) and shuts connections down.
    pub fn stop(&mut self) {
        self.lines = None;
    }

    /// Stopping has finished (or the dispatcher died).
    pub fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// Last resort: shut every connection now.
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
    if sh.session.lock().expect("session lock").0.is_none() || sh.dead.load(Ordering::SeqCst) {
        return;
    }
    let auth = sh.session_authorization();
    let sent = sh.send(None, |fresh| {
        let rb = sh.headers(
            sh.agent.delete(sh.ep.target.uri.clone()),
            None,
            auth.as_ref(),
        );
        let rb = rb.config().timeout_global(Some(DELETE_TIMEOUT));
        match fresh {
            true => rb.max_idle_age(Duration::ZERO).build().call(),
            false => rb.build().call(),
        }
    });
    if let Ok(resp) = sent {
        drain(&mut body_reader(resp.into_body()), DRAIN_BYTES_MAX);
    }
}

/// POSTs one message and reads its answer: `initialize` here (its session id is needed
/// before the next message), then the GET stream opens; any other on a reader thread of its
/// own, the next message taken once this one is written whole.
fn post(sh: &Arc<Shared>, msg: Outbound) {
    let body = msg.line.strip_suffix(b"\n").unwrap_or(&msg.line).to_vec();
    let Outgoing {
        request_id,
        initialize,
        version,
    } = describe(&body);
    let auth = msg.authorization.or_else(|| sh.session_authorization());
    let send = {
        let sh = sh.clone();
        let auth = auth.clone();
        move |on_sent| {
            sh.send(on_sent, |fresh| {
                let rb = sh.agent.post(sh.ep.target.uri.clone());
                let rb = sh.headers(rb, version.as_deref(), auth.as_ref());
                let rb = rb.header("Content-Type", "application/json");
                match fresh {
                    true => rb
                        .config()
                        .max_idle_age(Duration::ZERO)
                        .build()
                        .send(&body[..]),
                    false => rb.send(&body[..]),
                }
            })
        }
    };
    if initialize {
        read_answer(sh, send(None), request_id.as_ref(), true, auth.as_ref());
        if sh.session.lock().expect("session lock").0.is_some() {
            let sh2 = sh.clone();
            let _ = std::thread::Builder::new()
                .name(format!("mcp-up{}-get", sh.id.0))
                .spawn(move || open_get(&sh2));
        }
        return;
    }
    let (sent_tx, sent_rx) = channel::bounded(1);
    let sh2 = sh.clone();
    let started = std::thread::Builder::new()
        .name(format!("mcp-up{}-post", sh.id.0))
        .spawn(move || {
            let sent = send(Some(sent_tx));
            read_answer(&sh2, sent, request_id.as_ref(), false, auth.as_ref());
        });
    match started {
        // Written whole, or failed (the sender is gone).
        Ok(_) => _ = sent_rx.recv(),
        Err(e) => sh.die(&format!("cannot start a reader thread: {e}")),
    }
}

/// The GET stream: server messages unrelated to a request, as long as the session lives.
/// 405 = the upstream has none.
fn open_get(sh: &Arc<Shared>) {
    let auth = sh.session_authorization();
    let sent = sh.send(None, |fresh| {
        let rb = sh.headers(sh.agent.get(sh.ep.target.uri.clone()), None, auth.as_ref());
        match fresh {
            true => rb.config().max_idle_age(Duration::ZERO).build().call(),
            false => rb.call(),
        }
    });
    let Ok(resp) = sent else {
        return;
    };
    let (head, body) = resp.into_parts();
    match head.status.as_u16() {
        200 if is_sse(&head.headers) => read_sse(sh, &mut body_reader(body), None),
        405 => {}
        status => {
            tracing::warn!(
                upstream = sh.id.0,
                status,
                "the upstream's GET stream was refused"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_schemes() {
        assert_eq!(parse_url("ftp://x/").unwrap_err(), UrlError::NotHttp);
        assert_eq!(parse_url("http:///mcp").unwrap_err(), UrlError::NoHost);
        assert_eq!(parse_url("https:///mcp").unwrap_err(), UrlError::NoHost);
        assert_eq!(parse_url("http://u:p@h/").unwrap_err(), UrlError::NoHost);
        let t = parse_url("HTTPS://127.0.0.1/mcp").unwrap();
        assert!(t.https);
        assert_eq!(t.uri.to_string(), "https://127.0.0.1/mcp");
        let t = parse_url("https://localhost:8443/mcp").unwrap();
        assert_eq!(t.shown, "localhost:8443/mcp");
        assert_eq!(t.uri.port_u16(), Some(8443));
        assert!(parse_url("https://[::1]:9/").is_ok());
        assert!(!parse_url("http://127.0.0.1/").unwrap().https);
        assert!(matches!(
            parse_url("https://bad host/"),
            Err(UrlError::Invalid(_))
        ));
        // Nothing is resolved at start: a name that does not resolve (yet) is accepted.
        assert!(parse_url("http://upstream.invalid:9/mcp").is_ok());
    }

    #[test]
    fn url_parts() {
        let t = parse_url("http://127.0.0.1:9000/mcp?x=1").unwrap();
        assert_eq!(t.uri.to_string(), "http://127.0.0.1:9000/mcp?x=1");
        let t = parse_url("http://127.0.0.1?x=1").unwrap();
        assert_eq!(t.uri.to_string(), "http://127.0.0.1/?x=1");
        let t = parse_url("http://127.0.0.1").unwrap();
        assert_eq!(t.uri.path(), "/");
    }

    #[test]
    fn ca_files_need_https() {
        let opts = HttpOptions {
            ca_files: vec!["/nonexistent/ca.pem".into()],
            pool_connections_max: 8,
            pool_idle: Duration::from_secs(30),
            proxy_env: ProxyEnv::default(),
        };
        let e = HttpEndpoint::new("http://127.0.0.1:9/mcp", &opts).unwrap_err();
        assert!(e.contains("needs an https://"), "{e}");
        let e = HttpEndpoint::new("https://127.0.0.1:9/mcp", &opts).unwrap_err();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }
}
