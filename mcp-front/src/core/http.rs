//! HTTP input: the front door of every request (duplicate headers, Origin/Host, the
//! version header), dispatch by era and method, and the response helpers the eras share.

use super::{Action, ConnId, HttpMethod, HttpRequest, JSON, LogView, McpCore, UpstreamId};
use crate::credential::Credential;
use crate::era::{self, Era, Version};
use crate::headers::{self, Headers};
use crate::jsonrpc::{self, RpcId};
use serde_json::{Value, json};

impl McpCore {
    pub fn handle_http(&mut self, now_ms: u64, req: &HttpRequest<'_>, log: &dyn LogView) {
        self.subject = req.subject.map(str::to_owned);
        // Read only when it is to be forwarded; a repeated header is ambiguous: none.
        self.authorization = if self.cfg.forward_authorization {
            Headers::new(req.headers)
                .one(headers::AUTHORIZATION)
                .ok()
                .flatten()
                .and_then(Credential::from_header)
        } else {
            None
        };
        self.dispatch_http(now_ms, req, log);
        // Held only while its own request is handled.
        self.authorization = None;
    }

    fn dispatch_http(&mut self, now_ms: u64, req: &HttpRequest<'_>, log: &dyn LogView) {
        let h = Headers::new(req.headers);
        let conn = req.conn;
        if self.refuse_headers(conn, &h) {
            return;
        }
        let Ok(header_version) = self.header_version(conn, &h) else {
            return;
        };
        if header_version.map(Version::era) == Some(Era::Modern) {
            return match req.method {
                HttpMethod::Post => self.modern_post(now_ms, conn, &h, req.body),
                // SPEC M1.
                _ => self.respond(conn, 405, vec![("allow", "POST".into())], Vec::new()),
            };
        }
        match req.method {
            HttpMethod::Post => self.legacy_post(now_ms, conn, &h, header_version, req.body),
            HttpMethod::Get => self.legacy_get(now_ms, conn, &h, log),
            HttpMethod::Delete => self.legacy_delete(conn, &h),
            HttpMethod::Other => self.respond(
                conn,
                405,
                vec![("allow", "GET, POST, DELETE".into())],
                Vec::new(),
            ),
        }
    }

    /// Our headers must not repeat (two session ids or origins are ambiguous); SPEC C1/C2:
    /// Origin and Host are checked first, for every method. Answers and returns true when the
    /// request is refused.
    fn refuse_headers(&mut self, conn: ConnId, h: &Headers<'_>) -> bool {
        for name in [
            headers::ORIGIN,
            headers::HOST,
            headers::SESSION_ID,
            headers::PROTOCOL_VERSION,
            headers::LAST_EVENT_ID,
        ] {
            if let Err(headers::DuplicateHeader(n)) = h.one(name) {
                self.error(
                    conn,
                    400,
                    None,
                    jsonrpc::INVALID_REQUEST,
                    &format!("header {n} appears more than once"),
                    None,
                );
                return true;
            }
        }
        let one = |name| h.one(name).ok().flatten();
        let Err(e) = self
            .cfg
            .origin_policy
            .check_origin(one(headers::ORIGIN))
            .and_then(|()| self.cfg.origin_policy.check_host(one(headers::HOST)))
        else {
            return false;
        };
        self.error(
            conn,
            403,
            None,
            jsonrpc::INVALID_REQUEST,
            &format!("Forbidden: {e}"),
            None,
        );
        true
    }

    /// SPEC L6: a present version header must be supported. `Ok(None)` when absent; `Err`
    /// after answering 400.
    fn header_version(&mut self, conn: ConnId, h: &Headers<'_>) -> Result<Option<Version>, ()> {
        let Some(raw) = h.one(headers::PROTOCOL_VERSION).ok().flatten() else {
            return Ok(None);
        };
        match era::request_version(Some(raw), None) {
            Ok(v) => Ok(Some(v)),
            Err(era::VersionError::Unsupported(v)) => {
                self.error(
                    conn,
                    400,
                    None,
                    jsonrpc::INVALID_REQUEST,
                    &format!("Bad Request: unsupported MCP-Protocol-Version {v:?}"),
                    Some(json!({ "supported": era::supported_list(), "requested": v })),
                );
                Err(())
            }
        }
    }

    pub(super) fn respond(
        &mut self,
        conn: ConnId,
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Vec<u8>,
    ) {
        self.actions.push_back(Action::Respond {
            conn,
            status,
            headers,
            body,
        });
    }

    pub(super) fn error(
        &mut self,
        conn: ConnId,
        status: u16,
        id: Option<&RpcId>,
        code: i64,
        msg: &str,
        data: Option<Value>,
    ) {
        let body = jsonrpc::error_body(id, code, msg, data);
        self.respond(conn, status, vec![(JSON.0, JSON.1.into())], body);
    }

    /// Answers a request whose client does not accept SSE: 406.
    pub(super) fn not_acceptable(&mut self, conn: ConnId, id: Option<&RpcId>) {
        self.error(
            conn,
            406,
            id,
            jsonrpc::INVALID_REQUEST,
            "Not Acceptable: requests are answered with text/event-stream",
            None,
        );
    }

    pub(super) fn accepts_sse(h: &Headers<'_>) -> bool {
        let accept = h.joined(headers::ACCEPT);
        accept.is_empty()
            || accept.split(',').any(|part| {
                let media = part.split(';').next().unwrap_or("").trim();
                media.eq_ignore_ascii_case("text/event-stream")
                    || media == "*/*"
                    || media.eq_ignore_ascii_case("text/*")
            })
    }

    pub(super) fn session_of<'h>(&mut self, conn: ConnId, h: &Headers<'h>) -> Option<String> {
        let Some(raw) = h.one(headers::SESSION_ID).ok().flatten() else {
            // SPEC L3.
            self.error(
                conn,
                400,
                None,
                jsonrpc::SESSION_ERROR,
                "Bad Request: Mcp-Session-Id header is required",
                None,
            );
            return None;
        };
        let sid = String::from_utf8_lossy(raw);
        let bound = self
            .subject
            .as_deref()
            .is_none_or(|s| sid.ends_with(&super::subject_tag(s)));
        if !bound || !self.sessions.contains_key(sid.as_ref()) {
            // SPEC L4: unknown or terminated. A session of another subject is answered
            // exactly as an unknown one (nothing tells a prober that the ID exists).
            self.error(
                conn,
                404,
                None,
                jsonrpc::SESSION_ERROR,
                "Session not found",
                None,
            );
            return None;
        }
        if let Some(up) = self.sessions[sid.as_ref()].upstream {
            self.set_upstream_authorization(up);
        }
        Some(sid.into_owned())
    }

    /// With `forward_authorization`: the session upstream `up` sends the current request's
    /// `Authorization` (or none) from now on. Called only for a request that passed the
    /// session's subject check, so no client's credential goes out on another's behalf.
    pub(super) fn set_upstream_authorization(&mut self, up: UpstreamId) {
        if self.cfg.forward_authorization {
            self.actions.push_back(Action::SetUpstreamAuthorization {
                upstream: up,
                authorization: self.authorization.clone(),
            });
        }
    }
}
