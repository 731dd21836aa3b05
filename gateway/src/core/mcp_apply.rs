//! Carries out the MCP core's actions with the core's own machinery: appends on the MCP
//! shard's log (so MCP events are durable and fsynced like any other; a refused record is
//! replaced by an explicit error record at the same seq, else the stream is marked broken),
//! SSE responses as ordinary log subscribers (the same zero-copy send path, ACK-confirmed
//! window and backpressure; never parked, since MCP resumes replay from the log), plain
//! responses, and the upstreams.

use log_store::Seq;

use super::{Core, State};
use crate::mcp::core::{Action, ConnId, UpstreamId, redact_stream_name as redacted};
use crate::mcp::jsonrpc;
use crate::streams::sub::Sub;
use mcp_front::credential::Credential;

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

impl Core {
    /// Carries out the core's actions, in order, until it has none.
    pub(super) fn mcp_apply(&mut self) {
        loop {
            let Some(m) = self.mcp.as_mut() else { return };
            let Some(action) = m.core.poll_action() else {
                m.deadline_ms = m.core.poll_timeout();
                return;
            };
            m.metrics_dirty = true;
            self.mcp_act(action);
        }
    }

    fn mcp_act(&mut self, action: Action) {
        match action {
            Action::Respond {
                conn,
                status,
                headers,
                body,
            } => self.mcp_respond(conn, status, &headers, &body),
            // In cluster mode a stream is born with its first applied message.
            Action::CreateStream { .. } if self.cluster.is_some() => {}
            Action::CreateStream { stream } => {
                let shard = self.mcp_shard();
                if let Err(e) = self.hub.log_mut(shard).create_stream(&stream) {
                    let (id, stream) = (self.id, redacted(&stream));
                    eprintln!("core {id}: MCP stream {stream} cannot be created: {e}");
                }
            }
            Action::Append {
                stream,
                seq,
                event_type,
                data,
            } => self.mcp_append(stream, seq, event_type, data),
            open @ Action::OpenSse { .. } => self.mcp_open_sse(open),
            Action::StreamComplete { stream, last_seq } => self.mcp_complete(&stream, last_seq),
            Action::CloseSse { conn } => self.mcp_close_sse(conn),
            Action::SpawnUpstream { upstream, session } => {
                self.mcp_spawn(upstream, session.as_deref())
            }
            Action::SendUpstream {
                upstream,
                line,
                authorization,
            } => self.mcp_send_up(upstream, line, authorization),
            Action::SetUpstreamAuthorization {
                upstream,
                authorization,
            } => {
                if let Some(m) = self.mcp.as_mut() {
                    m.ups.set_authorization(upstream, authorization);
                }
            }
            Action::KillUpstream { upstream } => {
                let now = self.now;
                if let Some(m) = self.mcp.as_mut() {
                    m.ups.kill(upstream, now);
                }
            }
        }
    }

    pub(super) fn mcp_shard(&self) -> u32 {
        self.mcp.as_ref().expect("MCP front on this core").shard
    }

    fn mcp_append(
        &mut self,
        stream: String,
        seq: Seq,
        event_type: Option<&'static str>,
        data: Vec<u8>,
    ) {
        let shard = self.mcp_shard();
        let id_core = self.id;
        let m = self.mcp.as_mut().expect("checked");
        if m.broken.contains_key(&stream) {
            let stream = redacted(&stream);
            eprintln!(
                "core {id_core}: MCP message for broken stream {stream} (seq {seq}) not stored"
            );
            return;
        }
        if self.cluster.is_some() {
            return self.mcp_cluster_append(stream, seq, event_type, data);
        }
        let log = self.hub.log_mut(shard);
        let sid = log
            .stream_id(&stream)
            .expect("the core creates a stream before appending to it");
        let appended = log.append(sid, event_type, &data).or_else(|e| {
            // An operating error (record too large, disk full): the same position gets an
            // explicit error record instead (the request is answered with a JSON-RPC error),
            // so the stream stays gap-free and the core's sequence prediction holds.
            m.records_refused += 1;
            let why = e.to_string();
            let name = redacted(&stream);
            eprintln!("core {id_core}: MCP append to {name} failed: {why}");
            let (t, sub) = jsonrpc::not_stored_substitute(&data, &why);
            log.append(sid, t, &sub)
                .map_err(|e2| format!("{why}; then {e2}"))
        });
        match appended {
            Ok(a) => {
                assert!(
                    a.id.seq == seq,
                    "MCP core predicted seq {seq} on {}, log assigned {}",
                    redacted(&stream),
                    a.id.seq
                );
                self.hub.record_appends((shard, sid), 1);
            }
            Err(why) => self.mcp_break_stream(stream, why),
        }
    }

    /// An `Action::OpenSse`: the connection becomes a subscriber of the MCP stream.
    fn mcp_open_sse(&mut self, open: Action) {
        let Action::OpenSse {
            conn,
            stream,
            from_seq,
            retry_ms,
            reprime,
            headers,
            end_after,
        } = open
        else {
            unreachable!("called with OpenSse only");
        };
        let shard = self.mcp_shard();
        let m = self.mcp.as_mut().expect("checked");
        let Some(&(slot, generation, _)) = m.conns.get(&conn) else {
            return;
        };
        if let Some(why) = m.broken.get(&stream) {
            let name = redacted(&stream);
            let msg = format!("stream {name} cannot be served: its log refused a record ({why})");
            let data = Some(serde_json::json!({ "stream": name }));
            let body = jsonrpc::error_body(None, jsonrpc::NOT_STORED, &msg, data);
            let headers = vec![("Content-Type", "application/json".to_owned())];
            return self.mcp_respond(conn, 503, &headers, &body);
        }
        if self.conn_at((slot, generation)).is_none_or(|c| c.closing) {
            return self.mcp_conn_gone(conn);
        }
        let head = sse_head(&headers, retry_ms, reprime.as_deref());
        let setup = |sub: &mut Sub| {
            sub.never_park();
            if let Some(e) = end_after {
                sub.end_after(e);
            }
        };
        match self.hub.log(shard).stream_id(&stream) {
            Some(sid) => self.become_subscriber(slot, (shard, sid), from_seq, head, None, setup),
            // Cluster mode: its first message is not applied here yet.
            None if self.cluster.is_some() => {
                self.subscribe_unborn_at(slot, &stream, from_seq, head, setup)
            }
            None => unreachable!("the core creates a stream before opening it"),
        }
    }

    fn mcp_complete(&mut self, stream: &str, last_seq: Seq) {
        if self
            .mcp
            .as_ref()
            .is_some_and(|m| m.broken.contains_key(stream))
        {
            return; // its connections are closed; the log ends before last_seq
        }
        self.mcp_cluster_complete(stream, last_seq);
        for r in self.mcp_stream_subs(stream) {
            if let Some(c) = self.conn_at(r)
                && let State::Sub(sub) = &mut c.state
            {
                sub.end_after(last_seq);
                self.pump(r.0);
            }
        }
    }

    fn mcp_close_sse(&mut self, conn: ConnId) {
        let Some(m) = self.mcp.as_mut() else { return };
        let Some((slot, generation, _)) = m.conns.remove(&conn) else {
            return;
        };
        if m.by_slot.get(&slot) == Some(&conn) {
            m.by_slot.remove(&slot);
        }
        if self.conn_at((slot, generation)).is_some_and(|c| !c.closing) {
            self.close_conn(slot);
        }
    }

    fn mcp_spawn(&mut self, upstream: UpstreamId, session: Option<&str>) {
        let now_ms = self.mcp_now_ms();
        let m = self.mcp.as_mut().expect("checked");
        if let Err(e) = m.ups.spawn(upstream, session) {
            eprintln!("core {}: {e}", self.id);
            m.core.handle_upstream_exit(now_ms, upstream, &e);
        }
    }

    fn mcp_send_up(
        &mut self,
        upstream: UpstreamId,
        line: Vec<u8>,
        authorization: Option<Credential>,
    ) {
        let (now, now_ms) = (self.now, self.mcp_now_ms());
        let m = self.mcp.as_mut().expect("checked");
        m.messages_up += 1;
        if let Err(e) = m.ups.send(upstream, line, authorization) {
            m.ups.kill(upstream, now);
            m.core.handle_upstream_exit(now_ms, upstream, &e);
        }
    }

    /// A plain (non-SSE) response on the core's connection `conn`.
    fn mcp_respond(
        &mut self,
        conn: ConnId,
        status: u16,
        headers: &[(&'static str, String)],
        body: &[u8],
    ) {
        let Some(m) = self.mcp.as_mut() else { return };
        let Some((slot, generation, close)) = m.conns.remove(&conn) else {
            return;
        };
        // The slot may carry a newer MCP connection by now: keep its mapping.
        if m.by_slot.get(&slot) == Some(&conn) {
            m.by_slot.remove(&slot);
        }
        if self.conn_at((slot, generation)).is_none_or(|c| c.closing) {
            return;
        }
        let mut out = format!(
            "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\n",
            reason(status),
            body.len()
        );
        for (k, v) in headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str(if close {
            "Connection: close\r\n\r\n"
        } else {
            "\r\n"
        });
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(body);
        self.respond(slot, bytes, close);
    }

    /// The log refused a record of `stream` and its substitute: nothing more goes to it, its
    /// open connections are closed (the client sees the records up to the log's tail, then the
    /// end; resuming gets an explicit 503), and the process keeps running.
    pub(super) fn mcp_break_stream(&mut self, stream: String, why: String) {
        let (id, name) = (self.id, redacted(&stream));
        eprintln!("core {id}: MCP stream {name} broken (no record could be stored): {why}");
        self.mcp_cluster_forget(&stream);
        let subs = self.mcp_stream_subs(&stream);
        let max = self.shared.cfg.mcp.mcp_sessions_max * super::mcp::BROKEN_PER_SESSION_MAX;
        if let Some(m) = self.mcp.as_mut() {
            // First: closing re-enters the core.
            if m.broken.insert(stream.clone(), why).is_none() {
                m.broken_order.push_back(stream);
            }
            // Over the bound, forget the oldest entries of streams the MCP core no longer
            // holds (it appends only to those it holds; a held one must stay, or its next
            // record would land below the core's predicted seq).
            let mut looked = m.broken_order.len();
            while m.broken_order.len() > max && looked > 0 {
                looked -= 1;
                let old = m.broken_order.pop_front().expect("non-empty");
                if m.core.holds_stream(&old) {
                    m.broken_order.push_back(old);
                } else {
                    m.broken.remove(&old);
                }
            }
        }
        for r in subs {
            if self.conn_at(r).is_some_and(|c| !c.closing) {
                self.close_conn(r.0);
            }
        }
    }
}

/// The SSE response head of an MCP stream, with its `retry:` and re-priming event.
fn sse_head(
    headers: &[(&'static str, String)],
    retry_ms: Option<u32>,
    reprime: Option<&str>,
) -> Vec<u8> {
    let mut head = String::from(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n",
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    if let Some(r) = retry_ms {
        head.push_str(&format!("retry: {r}\n\n"));
    }
    if let Some(id) = reprime {
        head.push_str(&format!("id: {id}\ndata: \n\n"));
    }
    head.into_bytes()
}

#[cfg(test)]
mod tests {
    #[test]
    fn redaction_drops_the_session_id_only() {
        assert_eq!(super::redacted("mcp/0123abcd/7"), "mcp/<redacted>/7");
        assert_eq!(super::redacted("orders"), "orders");
    }
}
