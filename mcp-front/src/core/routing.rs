//! Upstream input: each upstream line's messages routed to exactly one stream (or dropped and
//! counted), for legacy sessions and for the modern front.

use super::{Action, McpCore, Modern, Owner, Session, Stream, StreamKind, UpstreamId};
use crate::era::Version;
use crate::jsonrpc::{self, Body, Kind, Message, RpcId};
use serde_json::Value;

impl McpCore {
    /// One line from an upstream's stdout (without its `\n`).
    pub fn handle_upstream_line(&mut self, now_ms: u64, upstream: UpstreamId, line: &[u8]) {
        let Some(owner) = self.upstreams.get(&upstream).cloned() else {
            return;
        };
        self.stats.upstream_lines += 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let msgs = match jsonrpc::classify(line, usize::MAX) {
            Ok(Body::Single(m)) => vec![m],
            Ok(Body::Batch(v)) => v, // SPEC L21: a 2025-03-26 server may batch
            Err(_) => {
                // SPEC C9: never streamed.
                self.stats.upstream_garbage_lines += 1;
                return;
            }
        };
        for m in msgs {
            match &owner {
                Owner::Session(sid) => self.route_legacy(now_ms, sid, m),
                Owner::Modern => self.route_modern(m),
            }
        }
    }

    /// SPEC L15/L16/L17: exactly one destination per message, or none (dropped, counted).
    fn route_legacy(&mut self, now_ms: u64, sid: &str, m: Message) {
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        sess.last_active_ms = now_ms;
        let (dest, is_response) = legacy_destination(sess, &m);
        let Some(n) = dest else {
            self.stats.orphan_messages += 1;
            return;
        };
        if n == 0 && !sess.streams.contains_key(&0) {
            let st = Stream::new(format!("mcp/{sid}/0"), StreamKind::Get);
            self.actions.push_back(Action::CreateStream {
                stream: st.name.clone(),
            });
            sess.streams.insert(0, st);
        }
        let Some(st) = sess.streams.get_mut(&n) else {
            unreachable!("a routed stream with pending requests is in memory");
        };
        debug_assert!(st.complete.is_none(), "routed to a complete stream");
        let seq = st.next_seq;
        st.next_seq += 1;
        let data = m.to_line();
        let data = data[..data.len() - 1].to_vec();
        self.actions.push_back(Action::Append {
            stream: st.name.clone(),
            seq,
            event_type: None,
            data,
        });
        if is_response {
            st.pending -= 1;
            if st.pending == 0 && st.kind == StreamKind::Post {
                // SPEC L12.
                st.complete = Some(seq);
                st.hold_deadline_ms = None;
                self.actions.push_back(Action::StreamComplete {
                    stream: st.name.clone(),
                    last_seq: seq,
                });
                if st.conn.is_none() {
                    sess.streams.remove(&n);
                }
            }
        }
    }

    /// SPEC M8/M9/M10: exactly one destination per message, or none (dropped, counted).
    fn route_modern(&mut self, mut m: Message) {
        let md = &mut self.modern;
        let (dest, complete) = modern_destination(md, &mut m);
        let Some(n) = dest else {
            self.stats.orphan_messages += 1;
            return;
        };
        let Some(st) = md.streams.get_mut(&n) else {
            // The client closed the stream (cancelled); late messages are dropped (SPEC M9).
            self.stats.orphan_messages += 1;
            return;
        };
        let seq = st.next_seq;
        st.next_seq += 1;
        self.actions.push_back(Action::Append {
            stream: st.name.clone(),
            seq,
            event_type: None,
            data: serde_json::to_vec(&m.value).expect("Value serialises"),
        });
        if complete {
            st.complete = Some(seq);
            self.actions.push_back(Action::StreamComplete {
                stream: st.name.clone(),
                last_seq: seq,
            });
            if st.conn.is_none() {
                md.streams.remove(&n);
            }
        }
    }
}

/// The stream of session `sess` an upstream message goes to (None: no destination) and whether
/// it is a response. A response settles its request (in flight no more, its progress token
/// released; the `initialize` response sets the negotiated version).
fn legacy_destination(sess: &mut Session, m: &Message) -> (Option<u32>, bool) {
    let single_inflight = if sess.inflight.len() == 1 {
        sess.inflight.values().next().map(|f| f.stream)
    } else {
        None
    };
    match &m.kind {
        Kind::Response { id: Some(id) } => (settle_response(sess, id, m), true),
        Kind::Response { id: None } => (None, true),
        Kind::Notification { method } if method == "notifications/progress" => (
            m.progress_notification_token()
                .and_then(|t| sess.progress.get(&t).copied()),
            false,
        ),
        Kind::Notification { method } if method == "notifications/cancelled" => {
            let related = m
                .request_id_param()
                .and_then(|r| sess.inflight.get(&r).map(|f| f.stream));
            (Some(related.unwrap_or(0)), false)
        }
        Kind::Notification { method } if method == "notifications/message" => {
            (Some(single_inflight.unwrap_or(0)), false)
        }
        Kind::Notification { .. } => (Some(0), false),
        Kind::Request { .. } => (Some(single_inflight.unwrap_or(0)), false),
    }
}

/// The response `m` to request `id` of `sess`: the request's stream, or None for an id not in
/// flight.
fn settle_response(sess: &mut Session, id: &RpcId, m: &Message) -> Option<u32> {
    let f = sess.inflight.remove(id)?;
    if let Some(t) = f.token {
        sess.progress.remove(&t);
    }
    if sess.init_id.as_ref() == Some(id) {
        sess.init_id = None;
        let negotiated = m
            .value
            .get("result")
            .and_then(|r| r.get("protocolVersion"))
            .and_then(Value::as_str)
            .and_then(Version::parse);
        sess.version = negotiated.or(sess.version);
    }
    Some(f.stream)
}

/// The gateway's own ids (upstream request ids and progress tokens) are strings.
fn up_key(id: &RpcId) -> Option<String> {
    match id {
        RpcId::Str(s) => Some(s.clone()),
        RpcId::Int(_) => None,
    }
}

/// The modern stream an upstream message goes to (None: no destination) and whether it
/// completes that stream; the client's own ids are restored in `m` (SPEC M8).
fn modern_destination(md: &mut Modern, m: &mut Message) -> (Option<u32>, bool) {
    match &m.kind {
        Kind::Response { id: Some(id) } => match up_key(id).and_then(|k| md.routes.remove(&k)) {
            Some(r) => {
                if let Some(t) = &r.up_token {
                    md.tokens.remove(t);
                }
                m.value["id"] = r.orig_id.to_value();
                (Some(r.stream), true)
            }
            None => (None, false),
        },
        Kind::Notification { method } if method == "notifications/progress" => {
            match m
                .progress_notification_token()
                .and_then(|t| up_key(&t))
                .and_then(|k| md.tokens.get(&k).cloned())
            {
                Some((n, orig)) => {
                    m.value["params"]["progressToken"] = orig.to_value();
                    (Some(n), false)
                }
                None => (None, false),
            }
        }
        Kind::Notification { .. } => (modern_notification_destination(md, m), false),
        // SPEC M8: no independent server requests on modern streams.
        Kind::Request { .. } | Kind::Response { id: None } => (None, false),
    }
}

/// The stream of a modern notification other than progress: the request it names (SPEC M10
/// subscription id, or `requestId`), with the client's id restored; a log message goes to the
/// only request in flight, if there is just one.
fn modern_notification_destination(md: &Modern, m: &mut Message) -> Option<u32> {
    let single = if md.routes.len() == 1 {
        md.routes.values().next().map(|r| r.stream)
    } else {
        None
    };
    // SPEC M10: subscription notifications carry the listen request's id.
    if let Some(r) = m
        .subscription_id()
        .and_then(|s| up_key(&s))
        .and_then(|k| md.routes.get(&k))
    {
        let (n, orig) = (r.stream, r.orig_id.to_value());
        m.value["params"]["_meta"][jsonrpc::SUBSCRIPTION_ID_KEY] = orig;
        Some(n)
    } else if let Some(r) = m
        .request_id_param()
        .and_then(|s| up_key(&s))
        .and_then(|k| md.routes.get(&k))
    {
        let (n, orig) = (r.stream, r.orig_id.to_value());
        m.value["params"]["requestId"] = orig;
        Some(n)
    } else if matches!(&m.kind, Kind::Notification { method } if method == "notifications/message")
    {
        single
    } else {
        None
    }
}
