//! Endings and time: an upstream's exit, session termination, SSE connections closing,
//! hold and idle timers, and shutdown.

use super::{Action, ConnId, EndReason, InFlight, McpCore, Owner, Route, UpstreamId};
use crate::jsonrpc::{self, RpcId};
use serde_json::json;

impl McpCore {
    /// The upstream process exited (or its pipes broke): its session ends (SPEC: "If the child
    /// dies, its open streams get an explicit error event and its in-flight requests get
    /// JSON-RPC errors").
    pub fn handle_upstream_exit(&mut self, _now_ms: u64, upstream: UpstreamId, why: &str) {
        let owner = self.upstreams.remove(&upstream);
        if owner.is_some() {
            self.stats.upstream_deaths += 1;
        }
        match owner {
            Some(Owner::Session(sid)) => {
                if let Some(s) = self.sessions.get_mut(&sid) {
                    s.upstream = None; // already gone: no KillUpstream
                }
                self.terminate(&sid, EndReason::UpstreamExited(why.to_owned()));
            }
            Some(Owner::Modern) => {
                self.modern.upstream = None;
                self.fail_modern(&format!("upstream MCP server exited: {why}"));
            }
            None => {}
        }
    }

    fn fail_modern(&mut self, why: &str) {
        let routes: Vec<Route> = self.modern.routes.drain().map(|(_, r)| r).collect();
        self.modern.tokens.clear();
        for r in routes {
            let Some(st) = self.modern.streams.get_mut(&r.stream) else {
                continue;
            };
            let seq = st.next_seq;
            st.next_seq += 1;
            let data = jsonrpc::error_body(Some(&r.orig_id), jsonrpc::UPSTREAM_GONE, why, None);
            self.actions.push_back(Action::Append {
                stream: st.name.clone(),
                seq,
                event_type: None,
                data,
            });
            st.complete = Some(seq);
            self.actions.push_back(Action::StreamComplete {
                stream: st.name.clone(),
                last_seq: seq,
            });
            if st.conn.is_none() {
                self.modern.streams.remove(&r.stream);
            }
        }
    }

    /// Ends a session: unanswered requests get a JSON-RPC error on their stream, the GET stream
    /// gets an `event: error` when the upstream died, every stream completes, the upstream is
    /// killed, and the id answers 404 from now on.
    pub(super) fn terminate(&mut self, sid: &str, why: EndReason) {
        let Some(mut sess) = self.sessions.remove(sid) else {
            return;
        };
        self.cfg.sessions.release();
        self.stats.sessions_terminated += 1;
        let message = why.to_string();
        let mut inflight: Vec<(RpcId, InFlight)> = sess.inflight.drain().collect();
        inflight.sort_by_key(|(_, f)| f.stream);
        for (id, f) in inflight {
            let Some(st) = sess.streams.get_mut(&f.stream) else {
                continue;
            };
            let seq = st.next_seq;
            st.next_seq += 1;
            let data = jsonrpc::error_body(Some(&id), jsonrpc::UPSTREAM_GONE, &message, None);
            self.actions.push_back(Action::Append {
                stream: st.name.clone(),
                seq,
                event_type: None,
                data,
            });
        }
        if let (EndReason::UpstreamExited(_), Some(st)) = (&why, sess.streams.get_mut(&0)) {
            let seq = st.next_seq;
            st.next_seq += 1;
            let data = serde_json::to_vec(&json!({ "error": message })).expect("Value serialises");
            self.actions.push_back(Action::Append {
                stream: st.name.clone(),
                seq,
                event_type: Some("error"),
                data,
            });
        }
        for st in sess.streams.values_mut() {
            if st.complete.is_none() && st.next_seq > 1 {
                st.complete = Some(st.next_seq - 1);
                self.actions.push_back(Action::StreamComplete {
                    stream: st.name.clone(),
                    last_seq: st.next_seq - 1,
                });
            } else if st.complete.is_none() {
                // A GET stream with no record yet: end its connection directly.
                if let Some(c) = st.conn {
                    self.actions.push_back(Action::CloseSse { conn: c });
                }
            }
            if let Some(c) = st.conn.take() {
                self.conns.remove(&c);
            }
        }
        if let Some(u) = sess.upstream.take() {
            self.upstreams.remove(&u);
            self.actions.push_back(Action::KillUpstream { upstream: u });
        }
    }

    // ---------------------------------------------------------------- connections and time

    /// An SSE connection ended (client went away, network, or the send path finished it).
    pub fn handle_connection_closed(&mut self, now_ms: u64, conn: ConnId) {
        let Some((owner, n)) = self.conns.remove(&conn) else {
            return;
        };
        match owner {
            Owner::Session(sid) => {
                let Some(sess) = self.sessions.get_mut(&sid) else {
                    return;
                };
                sess.last_active_ms = now_ms;
                let Some(st) = sess.streams.get_mut(&n) else {
                    return;
                };
                if st.conn != Some(conn) {
                    return;
                }
                st.conn = None;
                st.hold_deadline_ms = None;
                // SPEC L13: not a cancellation; the stream lives on in the log.
                if n == 0 {
                    sess.get_undelivered_from = st.next_seq;
                } else if st.complete.is_some() {
                    sess.streams.remove(&n);
                }
            }
            Owner::Modern => {
                let Some(st) = self.modern.streams.remove(&n) else {
                    return;
                };
                if st.complete.is_some() {
                    return;
                }
                // SPEC M9: closing the stream is cancellation; tell the upstream (stdio rule).
                let ids: Vec<String> = self
                    .modern
                    .routes
                    .iter()
                    .filter(|(_, r)| r.stream == n)
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in ids {
                    let r = self.modern.routes.remove(&k).expect("listed");
                    if let Some(t) = r.up_token {
                        self.modern.tokens.remove(&t);
                    }
                    self.stats.modern_cancels += 1;
                    if let Some(u) = self.modern.upstream {
                        let note = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": k, "reason": "client closed the response stream" } });
                        // On behalf of the client whose request it cancels: its credential.
                        self.actions.push_back(Action::SendUpstream {
                            upstream: u,
                            line: jsonrpc::value_to_line(&note),
                            authorization: r.authorization,
                        });
                    }
                }
            }
        }
    }

    /// Timers: POST hold timeouts (SPEC L11) and idle session expiry.
    pub fn handle_tick(&mut self, now_ms: u64) {
        let mut close = Vec::new();
        let mut expire = Vec::new();
        for (sid, sess) in &mut self.sessions {
            let mut attached = false;
            for st in sess.streams.values_mut() {
                if let (Some(c), Some(d)) = (st.conn, st.hold_deadline_ms)
                    && d <= now_ms
                    && st.complete.is_none()
                {
                    st.hold_deadline_ms = None;
                    st.conn = None;
                    close.push(c);
                    continue;
                }
                attached |= st.conn.is_some();
            }
            if !attached && now_ms.saturating_sub(sess.last_active_ms) >= self.cfg.session_idle_ms {
                expire.push(sid.clone());
            }
        }
        for c in close {
            self.conns.remove(&c);
            self.actions.push_back(Action::CloseSse { conn: c });
        }
        for sid in expire {
            self.terminate(&sid, EndReason::IdleExpired);
        }
    }

    /// The earliest time `handle_tick` has work (for the reactor's timer).
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut t: Option<u64> = None;
        for sess in self.sessions.values() {
            let mut attached = false;
            for st in sess.streams.values() {
                if let (Some(_), Some(d)) = (st.conn, st.hold_deadline_ms) {
                    t = Some(t.map_or(d, |x| x.min(d)));
                }
                attached |= st.conn.is_some();
            }
            if !attached {
                let d = sess.last_active_ms.saturating_add(self.cfg.session_idle_ms);
                t = Some(t.map_or(d, |x| x.min(d)));
            }
        }
        t
    }

    /// Gateway shutdown: every session ends (unanswered requests get errors in the log, so a
    /// client resuming after the restart sees an explicit error, not a stream that never ends).
    pub fn shutdown(&mut self) {
        let sids: Vec<String> = self.sessions.keys().cloned().collect();
        for sid in sids {
            self.terminate(&sid, EndReason::Shutdown);
        }
        self.fail_modern("gateway shutting down");
        if let Some(u) = self.modern.upstream.take() {
            self.upstreams.remove(&u);
            self.actions.push_back(Action::KillUpstream { upstream: u });
        }
    }
}
