//! What a client's dispatcher and reader threads share, and one request's way out and its
//! answer's way in: building the request, writing it on a pooled or fresh connection, reading
//! the answer's head with the one retry the module doc allows, and putting a connection whose
//! answer was read to its end back into the pool.

use super::HttpEndpoint;
use super::pool::Conn;
use super::wire::{Body, Head, HeadError, read_head};
use crate::core::UpstreamId;
use crate::credential::Credential;
use crate::upstream_event::UpstreamEvent;
use crossbeam::channel::Sender;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the dispatcher and readers of one client share.
pub(super) struct Shared {
    pub(super) id: UpstreamId,
    pub(super) ep: Arc<HttpEndpoint>,
    pub(super) line_bytes_max: usize,
    pub(super) tx: Sender<UpstreamEvent>,
    pub(super) wake: Arc<dyn Fn() + Send + Sync>,
    /// Upstream session id and protocol version, once `initialize` has been answered.
    pub(super) session: Mutex<(Option<String>, Option<String>)>,
    /// The client's `Authorization` for requests whose message carries none (the session's
    /// latest; never set for the shared modern client). See the module doc.
    pub(super) authorization: Mutex<Option<Credential>>,
    /// Sockets carrying this client's requests and answers (POST answers, the GET stream),
    /// shut down when the upstream stops; the flag says they were, so a socket registered
    /// later is shut down at once. Idle pooled connections are not in it (they belong to the
    /// endpoint).
    pub(super) sockets: Mutex<(bool, Vec<(u64, TcpStream)>)>,
    pub(super) next_socket: AtomicU64,
    /// Set once the upstream is known gone (reported once).
    pub(super) dead: AtomicBool,
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
            let t = &self.ep.target;
            tracing::warn!(
                upstream = self.id.0,
                "upstream {}{} failed: {why}",
                t.authority,
                t.path
            );
            self.emit(UpstreamEvent::Failed(self.id, why.to_owned()));
        }
    }

    pub(super) fn register(&self, s: &TcpStream) -> Option<u64> {
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

    pub(super) fn unregister(&self, n: Option<u64>) {
        if let Some(n) = n {
            self.sockets
                .lock()
                .expect("sockets lock")
                .1
                .retain(|(k, _)| *k != n);
        }
    }

    pub(super) fn shutdown_all(&self) {
        let mut g = self.sockets.lock().expect("sockets lock");
        g.0 = true;
        for (_, s) in g.1.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// The session credential (see the module doc).
    pub(super) fn session_authorization(&self) -> Option<Credential> {
        self.authorization
            .lock()
            .expect("authorization lock")
            .clone()
    }

    /// The bytes of one request: the head (the upstream session's id and protocol version —
    /// `version` overrides the latter —, `auth` as `Authorization`, `Connection: close`
    /// unless `keep_alive`) and the body (POST only).
    pub(super) fn request(
        &self,
        method: &str,
        body: &[u8],
        version: Option<&str>,
        auth: Option<&Credential>,
        keep_alive: bool,
    ) -> Vec<u8> {
        let t = &self.ep.target;
        let mut head = format!(
            "{method} {} HTTP/1.1\r\nHost: {}\r\nAccept: application/json, text/event-stream\r\n",
            t.path, t.authority
        );
        if !keep_alive {
            head.push_str("Connection: close\r\n");
        }
        let (sid, ver) = self.session.lock().expect("session lock").clone();
        if let Some(sid) = sid {
            head.push_str(&format!("Mcp-Session-Id: {sid}\r\n"));
        }
        if let Some(v) = version.map(str::to_owned).or(ver) {
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
        let mut req = head.into_bytes();
        req.extend_from_slice(body);
        req
    }

    /// Writes `req` on an idle pooled connection when `keep_alive` and one passes the probe,
    /// else on a fresh one. A write that fails on a reused connection goes once more on a
    /// fresh one (the server did not get all of it, so it cannot have acted on it). The error
    /// (connect, TLS handshake, write on a fresh connection) names no address.
    pub(super) fn send(
        &self,
        req: &[u8],
        keep_alive: bool,
        read_timeout: Option<Duration>,
    ) -> Result<Conn, String> {
        let pool = &self.ep.pool;
        if keep_alive
            && pool.keeps()
            && let Some(mut c) = pool.take()
        {
            if c.tcp().set_read_timeout(read_timeout).is_ok() && c.write_request(req).is_ok() {
                return Ok(c);
            }
            pool.note_retry();
        }
        let mut c = pool.connect(keep_alive)?;
        c.tcp()
            .set_read_timeout(read_timeout)
            .and_then(|()| c.write_request(req))
            .map_err(|e| format!("cannot send to the upstream: {e}"))?;
        Ok(c)
    }

    /// Reads the head of the answer to `req` sent on `c`. When `c` was reused and ended before
    /// one byte of the answer, `req` goes once more on a fresh connection (see the module
    /// doc: the only retry after a complete write). `reg` (the registration for
    /// `shutdown_all`) follows the connection.
    pub(super) fn answer(
        &self,
        mut c: Conn,
        req: &[u8],
        reg: &mut Option<u64>,
    ) -> Result<(Head, Conn), String> {
        let stale = match read_head(&mut c.io) {
            Ok(h) => return Ok((h, c)),
            Err(HeadError::Nothing(e)) if c.reused => e,
            Err(e) => return Err(e.to_string()),
        };
        let pool = &self.ep.pool;
        pool.note_retry();
        self.unregister(reg.take());
        let read_timeout = c.tcp().read_timeout().ok().flatten();
        drop(c);
        let mut c = pool
            .connect(true)
            .map_err(|e| format!("{e} (retrying after a stale connection: {stale})"))?;
        *reg = self.register(c.tcp());
        c.tcp()
            .set_read_timeout(read_timeout)
            .and_then(|()| c.write_request(req))
            .map_err(|e| format!("cannot send to the upstream: {e}"))?;
        let h = read_head(&mut c.io).map_err(|e| e.to_string())?;
        Ok((h, c))
    }

    /// After an answer: its connection leaves this client's sockets, and goes back into the
    /// pool if the answer was read to its end on a keep-alive connection.
    pub(super) fn release(&self, body: Body<Conn>, head: &Head, reg: &mut Option<u64>) {
        self.unregister(reg.take());
        if head.keep_alive && body.complete() {
            self.ep.pool.give_back(body.into_inner());
        }
    }
}
