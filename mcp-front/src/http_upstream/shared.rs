//! What a client's dispatcher and reader threads share, and one request's way out and its
//! answer's head in: the headers every request carries, sending it through the client's agent
//! with the one retry the module doc allows, and what a failure means (the upstream cannot be
//! reached, or this request's answer is unreadable).

use super::HttpEndpoint;
use super::agent::{self, Attempt};
use crate::core::UpstreamId;
use crate::credential::Credential;
use crate::upstream_event::UpstreamEvent;
use crossbeam::channel::Sender;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use ureq::http::Response;
use ureq::{Agent, Body, RequestBuilder};

/// What the dispatcher and readers of one client share.
pub(super) struct Shared {
    pub(super) id: UpstreamId,
    pub(super) ep: Arc<HttpEndpoint>,
    /// This client's agent: its connections, idle and in use, end with [`Shared::shutdown_all`].
    pub(super) agent: Agent,
    pub(super) line_bytes_max: usize,
    pub(super) tx: Sender<UpstreamEvent>,
    pub(super) wake: Arc<dyn Fn() + Send + Sync>,
    /// Upstream session id and protocol version, once `initialize` has been answered.
    pub(super) session: Mutex<(Option<String>, Option<String>)>,
    /// The client's `Authorization` for requests whose message carries none (the session's
    /// latest; never set for the shared modern client). See the module doc.
    pub(super) authorization: Mutex<Option<Credential>>,
    /// Set once the upstream is known gone (reported once).
    pub(super) dead: AtomicBool,
}

/// Why a request got no answer.
#[derive(Debug)]
pub(super) enum SendError {
    /// The upstream could not be reached, or took not all of the request (resolving,
    /// connecting to every address, the proxy, the TLS handshake, writing on a fresh
    /// connection): the upstream is gone.
    Unreachable(String),
    /// The request was sent; its answer's head could not be read.
    Unreadable(String),
}

impl Shared {
    pub(super) fn emit(&self, ev: UpstreamEvent) {
        if self.tx.send(ev).is_ok() {
            (self.wake)();
        }
    }

    /// The upstream is gone: logged with its address, reported with `why` alone (the core
    /// quotes it in the JSON-RPC errors of the requests in flight).
    pub(super) fn die(&self, why: &str) {
        if !self.dead.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                upstream = self.id.0,
                "upstream {} failed: {why}",
                self.ep.target.shown
            );
            self.emit(UpstreamEvent::Failed(self.id, why.to_owned()));
        }
    }

    /// Ends every connection of this client now, idle or carrying an answer (readers blocked
    /// on one return at once); nothing is sent after it.
    pub(super) fn shutdown_all(&self) {
        self.agent.clone().shutdown();
    }

    /// The session credential (see the module doc).
    pub(super) fn session_authorization(&self) -> Option<Credential> {
        self.authorization
            .lock()
            .expect("authorization lock")
            .clone()
    }

    /// `rb` with the headers of every request: `Accept`, the upstream session's id and protocol
    /// version (`version` overrides the latter), `auth` as `Authorization`. A value that is no
    /// valid header value (an upstream's session id with a control byte) fails the request.
    pub(super) fn headers<B>(
        &self,
        rb: RequestBuilder<B>,
        version: Option<&str>,
        auth: Option<&Credential>,
    ) -> RequestBuilder<B> {
        let mut rb = rb.header("Accept", "application/json, text/event-stream");
        let (sid, ver) = self.session.lock().expect("session lock").clone();
        if let Some(sid) = sid {
            rb = rb.header("Mcp-Session-Id", sid);
        }
        if let Some(v) = version.map(str::to_owned).or(ver) {
            rb = rb.header("MCP-Protocol-Version", v);
        }
        if let Some(a) = auth {
            rb = rb.header("Authorization", a.expose());
        }
        rb
    }

    /// Sends one request (`go(fresh)` makes it; `fresh`: on a new connection) and returns its
    /// answer once the head is in; `on_sent` is signalled once the request is written whole. When it went out on a *reused* connection and the request
    /// could not be written, or the connection ended before one byte of the answer, it goes
    /// once more on a fresh connection (see the module doc: the only retry). The error names
    /// no address.
    pub(super) fn send(
        &self,
        on_sent: Option<Sender<()>>,
        go: impl Fn(bool) -> Result<Response<Body>, ureq::Error>,
    ) -> Result<Response<Body>, SendError> {
        agent::begin_attempt(on_sent);
        let first = go(false);
        let a = agent::end_attempt();
        let stale = match first {
            Ok(r) => return Ok(r),
            Err(e) if a.reused && !a.answered && !matches!(e, ureq::Error::Timeout(_)) => e,
            Err(e) => return Err(classify(e, a, "")),
        };
        self.ep.counters.note_retry();
        agent::begin_attempt(None);
        let again = go(true);
        let a = agent::end_attempt();
        again.map_err(|e| {
            classify(
                e,
                a,
                &format!(" (retried after a stale connection: {stale})"),
            )
        })
    }
}

/// What a failed send means, by how far the request got (`a`).
fn classify(e: ureq::Error, a: Attempt, note: &str) -> SendError {
    match (&e, a.sent) {
        // A header value the upstream gave us (its session id) that no request may carry.
        (ureq::Error::Http(_), _) => {
            SendError::Unreachable(format!("the upstream request cannot be made: {e}{note}"))
        }
        (_, false) => SendError::Unreachable(format!("cannot reach the upstream: {e}{note}")),
        (_, true) => SendError::Unreadable(format!("upstream answer unreadable: {e}{note}")),
    }
}
