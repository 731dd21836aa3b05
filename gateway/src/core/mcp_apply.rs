//! The MCP core's actions, turned into what the core does: appends on the MCP shard's log (so
//! MCP events are durable and fsynced like any other; a refused record is replaced by an
//! explicit error record at the same seq, else the stream is marked broken), SSE responses as
//! ordinary log subscribers (the same zero-copy send path, ACK-confirmed window and
//! backpressure; never parked, since MCP resumes replay from the log), plain responses, and
//! the upstreams. What touches connections comes back as [`Effect`]s (`mcp_drive` carries
//! them out).

use log_store::Seq;

use super::mcp::{BROKEN_PER_SESSION_MAX, Effect, Mcp, McpCx, McpSubscribe};
use crate::mcp::core::{Action, ConnId, UpstreamId, redact_stream_name as redacted};
use crate::mcp::jsonrpc;
use crate::streams::StreamKey;
use crate::streams::catalog::MCP_STREAM_PREFIX;
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

impl Mcp {
    /// The MCP core's next action (`None`: none; its next timer is noted).
    pub(super) fn next_action(&mut self) -> Option<Action> {
        let Some(action) = self.core.poll_action() else {
            self.deadline_ms = self.core.poll_timeout();
            return None;
        };
        self.metrics_dirty = true;
        Some(action)
    }

    /// Carries out one action as far as this part can; the rest is returned, in order.
    pub(super) fn act(&mut self, action: Action, cx: &mut McpCx<'_>) -> Vec<Effect> {
        let mut out = Vec::new();
        match action {
            Action::Respond {
                conn,
                status,
                headers,
                body,
            } => self.respond(conn, status, &headers, &body, &mut out),
            // In cluster mode a stream is born with its first applied message.
            Action::CreateStream { stream } if cx.cluster.is_some() => {
                self.calls.created(&stream, cx.now);
            }
            Action::CreateStream { stream } => {
                self.calls.created(&stream, cx.now);
                if let Err(e) = cx.hub.log_mut(self.shard).create_stream(&stream) {
                    // A full disk, a poisoned log: the stream is broken from the start (its
                    // response is an explicit 503, none of its messages is appended), never
                    // appended to as if it existed.
                    let why = format!("the stream cannot be created: {e}");
                    self.break_stream(stream, why, cx, &mut out);
                }
            }
            Action::Append {
                stream,
                seq,
                event_type,
                data,
            } => self.append(stream, seq, event_type, data, cx, &mut out),
            open @ Action::OpenSse { .. } => self.open_sse(open, cx, &mut out),
            Action::StreamComplete { stream, last_seq } => {
                self.complete(&stream, last_seq, cx, &mut out)
            }
            Action::CloseSse { conn } => self.close_sse(conn, &mut out),
            Action::SpawnUpstream { upstream, session } => {
                self.spawn(upstream, session.as_deref(), cx)
            }
            Action::SendUpstream {
                upstream,
                line,
                authorization,
            } => self.send_up(upstream, line, authorization, cx),
            Action::SetUpstreamAuthorization {
                upstream,
                authorization,
            } => self.ups.set_authorization(upstream, authorization),
            Action::KillUpstream { upstream } => self.ups.kill(upstream, cx.now),
        }
        out
    }

    fn append(
        &mut self,
        stream: String,
        seq: Seq,
        event_type: Option<&'static str>,
        data: Vec<u8>,
        cx: &mut McpCx<'_>,
        out: &mut Vec<Effect>,
    ) {
        if self.broken.contains_key(&stream) {
            let stream = redacted(&stream);
            crate::warn_limited!(
                core = self.core_id,
                %stream,
                seq,
                "MCP message for a broken stream not stored",
            );
            return;
        }
        if cx.cluster.is_some() {
            return self.cluster_append(stream, seq, event_type, data, cx, out);
        }
        let log = cx.hub.log_mut(self.shard);
        let sid = log
            .stream_id(&stream)
            .expect("the core creates a stream before appending to it");
        let core_id = self.core_id;
        let refused = &mut self.records_refused;
        let appended = log.append(sid, event_type, &data).or_else(|e| {
            // An operating error (record too large, disk full): the same position gets an
            // explicit error record instead (the request is answered with a JSON-RPC error),
            // so the stream stays gap-free and the core's sequence prediction holds.
            *refused += 1;
            let why = e.to_string();
            let name = redacted(&stream);
            crate::warn_limited!(
                core = core_id,
                stream = %name,
                error = %why,
                "MCP append failed; storing an error record instead",
            );
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
                cx.hub.record_appends((self.shard, sid), 1);
            }
            Err(why) => self.break_stream(stream, why, cx, out),
        }
    }

    /// An `Action::OpenSse`: the connection becomes a subscriber of the MCP stream.
    fn open_sse(&mut self, open: Action, cx: &McpCx<'_>, out: &mut Vec<Effect>) {
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
        let Some(&(slot, generation, _)) = self.conns.get(&conn) else {
            return;
        };
        let log = cx.hub.log(self.shard);
        let key = log.stream_id(&stream).map(|sid| (self.shard, sid));
        let never = never_durable(log, key, end_after);
        let why = (self.broken.get(&stream).cloned())
            .or_else(|| never.then(|| "the log's sync failed (it is poisoned)".to_owned()));
        if let Some(why) = why {
            let name = redacted(&stream);
            let msg = format!("stream {name} cannot be served: its log refused a record ({why})");
            let data = Some(serde_json::json!({ "stream": name }));
            let body = jsonrpc::error_body(None, jsonrpc::NOT_STORED, &msg, data);
            let headers = vec![("Content-Type", "application/json".to_owned())];
            self.respond(conn, 503, &headers, &body, out);
            // The MCP core attached `conn` to the stream: it must learn that it is gone (else
            // the session never idles out and the stream stays held).
            return self
                .core
                .handle_connection_closed(self.now_ms(cx.now), conn);
        }
        out.push(Effect::Subscribe(McpSubscribe {
            conn: (slot, generation),
            cid: conn,
            stream,
            key,
            from_seq,
            head: sse_head(&headers, retry_ms, reprime.as_deref()),
            end_after,
        }));
    }

    fn complete(&mut self, stream: &str, last_seq: Seq, cx: &McpCx<'_>, out: &mut Vec<Effect>) {
        if self.broken.contains_key(stream) {
            return; // its connections are closed; the log ends before last_seq
        }
        self.calls.completed(stream, cx.now, cx.metrics);
        self.cluster_complete(stream, last_seq);
        for conn in self.stream_subs(stream, cx) {
            out.push(Effect::EndAfter { conn, last_seq });
        }
    }

    fn close_sse(&mut self, conn: ConnId, out: &mut Vec<Effect>) {
        let Some((slot, generation, _)) = self.conns.remove(&conn) else {
            return;
        };
        if self.by_slot.get(&slot) == Some(&conn) {
            self.by_slot.remove(&slot);
        }
        out.push(Effect::Close((slot, generation)));
    }

    fn spawn(&mut self, upstream: UpstreamId, session: Option<&str>, cx: &McpCx<'_>) {
        if let Err(e) = self.ups.spawn(upstream, session) {
            crate::warn_limited!(
                core = self.core_id,
                upstream = upstream.0,
                error = %e,
                "MCP upstream cannot start",
            );
            self.core
                .handle_upstream_exit(self.now_ms(cx.now), upstream, &e);
        }
    }

    fn send_up(
        &mut self,
        upstream: UpstreamId,
        line: Vec<u8>,
        authorization: Option<Credential>,
        cx: &McpCx<'_>,
    ) {
        self.messages_up += 1;
        if let Err(e) = self.ups.send(upstream, line, authorization) {
            self.ups.kill(upstream, cx.now);
            self.core
                .handle_upstream_exit(self.now_ms(cx.now), upstream, &e);
        }
    }

    /// A plain (non-SSE) response on the core's connection `conn`.
    fn respond(
        &mut self,
        conn: ConnId,
        status: u16,
        headers: &[(&'static str, String)],
        body: &[u8],
        out: &mut Vec<Effect>,
    ) {
        let Some((slot, generation, close)) = self.conns.remove(&conn) else {
            return;
        };
        // The slot may carry a newer MCP connection by now: keep its mapping.
        if self.by_slot.get(&slot) == Some(&conn) {
            self.by_slot.remove(&slot);
        }
        let mut head = format!(
            "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\n",
            reason(status),
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(if close {
            "Connection: close\r\n\r\n"
        } else {
            "\r\n"
        });
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body);
        out.push(Effect::Respond {
            conn: (slot, generation),
            bytes,
            close,
        });
    }

    /// The MCP shard's log is poisoned (a sync failed: a group commit, a segment's flush):
    /// nothing more of it becomes durable, so a response waiting for its next record would
    /// wait for ever. Every stream that could still be waited on ([`waited_on`]) is broken: its
    /// connections close, a resume of it is an explicit 503, nothing more is appended to it.
    /// (A resume that arrives later is refused by `open_sse`, whatever `broken` still holds.)
    pub(super) fn log_failed(&mut self, cx: &McpCx<'_>) -> Vec<Effect> {
        let mut out = Vec::new();
        for name in waited_on(cx.hub.log(self.shard), &self.core) {
            if !self.broken.contains_key(&name) {
                let why = "the log's sync failed (it is poisoned)".to_owned();
                self.break_stream(name, why, cx, &mut out);
            }
        }
        out
    }

    /// The log refused a record of `stream` and its substitute: nothing more goes to it, its
    /// open connections are closed (the client sees the records up to the log's tail, then the
    /// end; resuming gets an explicit 503), and the process keeps running.
    pub(super) fn break_stream(
        &mut self,
        stream: String,
        why: String,
        cx: &McpCx<'_>,
        out: &mut Vec<Effect>,
    ) {
        let name = redacted(&stream);
        crate::warn_limited!(
            core = self.core_id,
            stream = %name,
            reason = %why,
            "MCP stream broken (no record could be stored)",
        );
        self.cluster_forget(&stream);
        self.calls.dropped(&stream);
        let subs = self.stream_subs(&stream, cx);
        let max = cx.cfg.mcp.mcp_sessions_max * BROKEN_PER_SESSION_MAX;
        // First: closing re-enters the core.
        if self.broken.insert(stream.clone(), why).is_none() {
            self.broken_order.push_back(stream);
        }
        // Over the bound, forget the oldest entries of streams the MCP core no longer holds
        // (it appends only to those it holds; a held one must stay, or its next record would
        // land below the core's predicted seq).
        let mut looked = self.broken_order.len();
        while self.broken_order.len() > max && looked > 0 {
            looked -= 1;
            let old = self.broken_order.pop_front().expect("non-empty");
            if self.core.holds_stream(&old) {
                self.broken_order.push_back(old);
            } else {
                self.broken.remove(&old);
            }
        }
        out.extend(subs.into_iter().map(Effect::Close));
    }
}

/// On a poisoned log, whether a response of stream `key` that ends after `end_after` (`None`:
/// a stream still open, or not created) would wait for a record that will never be durable.
fn never_durable(log: &log_store::Log, key: Option<StreamKey>, end_after: Option<Seq>) -> bool {
    log.is_poisoned()
        && match (key, end_after) {
            (Some((_, sid)), Some(last)) => log.bounds(sid).is_none_or(|b| last > b.visible_tail),
            _ => true,
        }
}

/// The MCP streams of `log` that a client could still wait on: one the MCP core holds open
/// (more records are to come), one with records not yet durable (a complete stream resumed
/// later would wait for them). A complete, durable stream is served as it is.
fn waited_on(log: &log_store::Log, core: &crate::mcp::core::McpCore) -> Vec<String> {
    (log.streams())
        .filter(|(_, name, b)| {
            name.starts_with(MCP_STREAM_PREFIX)
                && (b.tail > b.visible_tail || core.stream_open(name))
        })
        .map(|(_, name, _)| name.to_owned())
        .collect()
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
