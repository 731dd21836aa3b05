//! The 2026-07-28 stateless era: one POST per request, answered on its own non-resumable SSE
//! stream, ids and progress tokens rewritten to gateway-unique ones towards the shared upstream.

use super::{Action, ConnId, McpCore, Owner, Route, Stream, StreamKind, UpstreamId, sse_headers};
use crate::era::Version;
use crate::headers::{self, Headers};
use crate::jsonrpc::{self, Body, Kind, Message, RpcId};
use serde_json::Value;

impl McpCore {
    pub(super) fn modern_post(&mut self, _now_ms: u64, conn: ConnId, h: &Headers<'_>, body: &[u8]) {
        let Some(msg) = self.modern_message(conn, body) else {
            return;
        };
        if self.refuse_modern_message(conn, h, &msg) {
            return;
        }
        let upstream = self.modern_upstream();
        let Kind::Request { id, .. } = msg.kind.clone() else {
            // SPEC M7.
            self.actions.push_back(Action::SendUpstream {
                upstream,
                line: msg.to_line(),
                authorization: self.authorization.clone(),
            });
            return self.respond(conn, 202, Vec::new(), Vec::new());
        };
        if self.refuse_modern_request(conn, h, &id) {
            return;
        }
        let (n, value) = self.rewrite_modern_request(&msg, id);
        self.open_modern_stream(conn, n);
        self.actions.push_back(Action::SendUpstream {
            upstream,
            line: jsonrpc::value_to_line(&value),
            authorization: self.authorization.clone(),
        });
    }

    /// The single message of a modern POST body; answers 400 and returns `None` for a batch
    /// (SPEC M3) or a body that is not JSON-RPC.
    fn modern_message(&mut self, conn: ConnId, body: &[u8]) -> Option<Message> {
        match jsonrpc::classify(body, 1) {
            Ok(Body::Single(m)) => Some(m),
            Ok(Body::Batch(_)) | Err(jsonrpc::ClassifyError::BatchTooLarge { .. }) => {
                // SPEC M3.
                self.error(
                    conn,
                    400,
                    None,
                    jsonrpc::INVALID_REQUEST,
                    "Bad Request: the body must be a single JSON-RPC request or notification",
                    None,
                );
                None
            }
            Err(e) => {
                self.error(
                    conn,
                    400,
                    None,
                    e.code(),
                    &format!("Bad Request: {e}"),
                    None,
                );
                None
            }
        }
    }

    /// Refuses a client's JSON-RPC response (not allowed in this era) and a message whose
    /// mirror headers disagree with its body (SPEC M4/M5): 400. Returns true when it answered.
    fn refuse_modern_message(&mut self, conn: ConnId, h: &Headers<'_>, msg: &Message) -> bool {
        let id = match &msg.kind {
            Kind::Response { .. } => {
                self.error(conn, 400, None, jsonrpc::INVALID_REQUEST, "Bad Request: clients must not send JSON-RPC responses in protocol version 2026-07-28", None);
                return true;
            }
            Kind::Request { id, .. } => Some(id.clone()),
            Kind::Notification { .. } => None,
        };
        // SPEC M4/M5.
        let Err(e) = headers::check_modern_mirrors(h, msg, Version::V2026_07_28.as_str()) else {
            return false;
        };
        self.error(
            conn,
            400,
            id.as_ref(),
            jsonrpc::HEADER_MISMATCH,
            &e.to_string(),
            None,
        );
        true
    }

    /// Refuses a request whose client does not accept SSE (406) or that would exceed the
    /// modern in-flight limit (429). Returns true when it answered.
    fn refuse_modern_request(&mut self, conn: ConnId, h: &Headers<'_>, id: &RpcId) -> bool {
        if !Self::accepts_sse(h) {
            self.not_acceptable(conn, Some(id));
            return true;
        }
        if self.modern.routes.len() >= self.cfg.requests_inflight_max {
            self.error(
                conn,
                429,
                Some(id),
                jsonrpc::LIMIT_EXCEEDED,
                "Too Many Requests: too many modern requests in flight",
                None,
            );
            return true;
        }
        false
    }

    /// SPEC M8: rewrites the request's id and progress token to gateway-unique ones, routes
    /// them to the request's new stream, and returns that stream's number and the rewritten
    /// request.
    fn rewrite_modern_request(&mut self, msg: &Message, id: RpcId) -> (u32, Value) {
        let m = &mut self.modern;
        let k = m.next_rpc;
        m.next_rpc += 1;
        let up_id = format!("gw-{k}");
        let mut value = msg.value.clone();
        value["id"] = Value::from(up_id.as_str());
        let mut up_token = None;
        if let Some(tok) = msg.progress_token() {
            let t = format!("gw-p-{k}");
            value["params"]["_meta"]["progressToken"] = Value::from(t.as_str());
            up_token = Some(t.clone());
            m.tokens.insert(t, (m.next_n, tok));
        }
        let n = m.next_n;
        m.next_n += 1;
        m.routes.insert(
            up_id,
            Route {
                stream: n,
                orig_id: id,
                up_token,
                authorization: self.authorization.clone(),
            },
        );
        (n, value)
    }

    /// Creates modern stream `n` (one response owed) and opens `conn` on it.
    fn open_modern_stream(&mut self, conn: ConnId, n: u32) {
        let mut st = Stream::new(format!("mcp/{}/{n}", self.boot), StreamKind::Post);
        st.pending = 1;
        st.conn = Some(conn);
        let name = st.name.clone();
        self.modern.streams.insert(n, st);
        self.conns.insert(conn, (Owner::Modern, n));
        self.actions.push_back(Action::CreateStream {
            stream: name.clone(),
        });
        // SPEC M11: no priming event, no retry.
        let headers = sse_headers();
        self.actions.push_back(Action::OpenSse {
            conn,
            reprime: None,
            stream: name,
            from_seq: 1,
            retry_ms: None,
            headers,
            end_after: None,
        });
    }

    fn modern_upstream(&mut self) -> UpstreamId {
        if let Some(u) = self.modern.upstream {
            return u;
        }
        let u = UpstreamId(self.next_upstream);
        self.next_upstream += 1;
        self.modern.upstream = Some(u);
        self.upstreams.insert(u, Owner::Modern);
        self.actions.push_back(Action::SpawnUpstream {
            upstream: u,
            session: None,
        });
        u
    }
}
