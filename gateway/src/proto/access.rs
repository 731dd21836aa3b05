//! Who may do what, decided on a request's head before any of its body is read: the browser
//! origin (CORS, `--cors-allow-origin`) and the caller's grants (JWT or an anonymous pattern,
//! the `auth` crate). Pure: the wall clock is handed in by the core each turn.
//!
//! Decisions, in order:
//! 1. A request with an `Origin` not in `--cors-allow-origin` is refused with 403
//!    `origin_not_allowed`: a page on another site must not publish with a "simple" cross-site
//!    POST (no preflight) or read with the user's cookie. Clients that are not browsers send no
//!    `Origin` and are unaffected. With no `--cors-allow-origin`, every `Origin` is refused.
//! 2. A preflight (`OPTIONS`) from an allowed origin is answered 204 with the methods and
//!    request headers the API takes.
//! 3. With authentication configured, publish, batch publish and delete need a publish grant,
//!    subscribe a subscribe grant (401 / 403 with `WWW-Authenticate`, RFC 6750).
//! 4. Every answer to an allowed origin carries `Access-Control-Allow-Origin: <origin>`,
//!    `Access-Control-Allow-Credentials: true`, the exposed headers and `Vary: Origin`.
#![forbid(unsafe_code)]

use std::sync::Arc;

use auth::{Access, Action, Auth, Credentials, Denied};

use super::http::Head;
use super::route::Route;

/// Request headers a browser may send to the API (answered in preflights).
const ALLOW_HEADERS: &str =
    "Authorization, Content-Type, Last-Event-ID, Event-Type, Idempotency-Key";
/// Methods the API takes.
const ALLOW_METHODS: &str = "GET, POST, DELETE, OPTIONS";
/// Response headers a page may read besides the CORS-safelisted ones.
const EXPOSE_HEADERS: &str = "X-Resume-Class, WWW-Authenticate, Retry-After, Idempotent-Replay";
/// Seconds a browser may cache a preflight's answer.
const PREFLIGHT_MAX_AGE_SECS: u32 = 600;

/// A core's access policy: the allowed origins and its authenticator (with its token cache).
#[derive(Debug)]
pub struct Gate {
    origins: Arc<[String]>,
    auth: Auth,
    /// Seconds since the Unix epoch, set by the core each turn (token expiry).
    pub now_unix_secs: u64,
    /// Requests refused by authentication (401 / 403) and for their `Origin` (403).
    pub auth_refusals: u64,
    pub origin_refusals: u64,
}

/// What the gate decided for one request.
#[derive(Debug)]
pub enum Admission {
    /// Go on. `headers` (CORS; empty without an `Origin`) go on every answer to this request;
    /// `access` says who asked (anonymous: no subject, no expiry).
    Admit { headers: String, access: Access },
    /// A preflight, answered by `answer` (the request has no body to read).
    Preflight { answer: Vec<u8> },
    /// Refused: a JSON error `status` / `code` / `message`, with `headers` (CORS so a page can
    /// read it, and `WWW-Authenticate` on 401 / 403 from authentication).
    Refuse {
        status: u16,
        code: &'static str,
        message: String,
        headers: String,
    },
}

impl Gate {
    pub fn new(origins: Arc<[String]>, auth: Auth) -> Gate {
        Gate {
            origins,
            auth,
            now_unix_secs: 0,
            auth_refusals: 0,
            origin_refusals: 0,
        }
    }

    /// The CORS verdict on a head, before it is routed (so routing errors carry the headers
    /// too): the header lines for its answers, or the refusal of its origin.
    pub fn cors(&mut self, head: &Head) -> Result<String, Admission> {
        self.cors_headers(head)
            .inspect_err(|_| self.origin_refusals += 1)
    }

    /// The decision for an API request from an allowed origin (`headers`: [`Gate::cors`]'s).
    pub fn admit(&mut self, head: &Head, route: &Route, headers: String) -> Admission {
        let action = match route {
            Route::Preflight => {
                return match &head.origin {
                    Some(o) => Admission::Preflight {
                        answer: preflight_answer(o),
                    },
                    None => Admission::Refuse {
                        status: 403,
                        code: "origin_not_allowed",
                        message: "a preflight needs an Origin listed in --cors-allow-origin".into(),
                        headers,
                    },
                };
            }
            Route::Healthz => None,
            Route::Publish { .. } | Route::PublishBatch { .. } | Route::Delete { .. } => {
                Some(Action::Publish)
            }
            Route::Subscribe { .. } => Some(Action::Subscribe),
        };
        let stream = route.stream().unwrap_or("");
        match action {
            Some(action) if self.auth.enabled() => {
                let creds = credentials(head);
                match self.auth.check(&creds, action, stream, self.now_unix_secs) {
                    Ok(access) => Admission::Admit { headers, access },
                    Err(d) => {
                        self.auth_refusals += 1;
                        refusal(&d, headers)
                    }
                }
            }
            _ => Admission::Admit {
                headers,
                access: Access::anonymous(),
            },
        }
    }

    /// The decision for a request on the MCP endpoint: with access control configured it
    /// needs a verified token with a `sub` (its issuer and subject bind the session) and the
    /// grant `{"gateway": {"mcp": true}}` (`Auth::authorize_mcp`; anonymous patterns never
    /// open it); CORS is the MCP front's own (it checks `Origin` as the MCP transport
    /// specification requires).
    pub fn admit_mcp(&mut self, head: &Head) -> Admission {
        match self
            .auth
            .authorize_mcp(&credentials(head), self.now_unix_secs)
        {
            Ok(access) => Admission::Admit {
                headers: String::new(),
                access,
            },
            Err(d) => {
                self.auth_refusals += 1;
                refusal(&d, String::new())
            }
        }
    }

    /// The CORS headers for a request from an allowed origin, none without `Origin`, or the
    /// refusal of an origin that is not allowed.
    fn cors_headers(&self, head: &Head) -> Result<String, Admission> {
        let Some(origin) = &head.origin else {
            return Ok(String::new());
        };
        if !self.origins.iter().any(|o| o == origin) {
            return Err(Admission::Refuse {
                status: 403,
                code: "origin_not_allowed",
                message: "this Origin is not listed in --cors-allow-origin".into(),
                headers: String::new(),
            });
        }
        Ok(format!(
            "Access-Control-Allow-Origin: {origin}\r\nAccess-Control-Allow-Credentials: true\r\n\
             Access-Control-Expose-Headers: {EXPOSE_HEADERS}\r\nVary: Origin\r\n"
        ))
    }
}

fn credentials(head: &Head) -> Credentials<'_> {
    Credentials {
        authorization: head.authorization.as_deref(),
        cookie: head.cookie.as_deref(),
        query: &head.query,
    }
}

fn refusal(d: &Denied, mut headers: String) -> Admission {
    let (status, code, message) = d.status();
    if let Some(w) = d.www_authenticate() {
        headers.push_str("WWW-Authenticate: ");
        headers.push_str(w);
        headers.push_str("\r\n");
    }
    Admission::Refuse {
        status,
        code,
        message,
        headers,
    }
}

/// 204 to a preflight from the allowed `origin`.
fn preflight_answer(origin: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 204 No Content\r\nAccess-Control-Allow-Origin: {origin}\r\n\
         Access-Control-Allow-Credentials: true\r\nAccess-Control-Allow-Methods: {ALLOW_METHODS}\r\n\
         Access-Control-Allow-Headers: {ALLOW_HEADERS}\r\n\
         Access-Control-Max-Age: {PREFLIGHT_MAX_AGE_SECS}\r\nVary: Origin\r\n\
         Content-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// Who an admitted caller is, for routing its MCP requests: its token's issuer and subject,
/// NUL-separated (`None` without a token's subject).
pub fn caller(access: &auth::Access) -> Option<String> {
    let sub = access.subject.as_deref()?;
    Some(format!("{}\0{sub}", access.issuer.as_deref().unwrap_or("")))
}

/// `answer` with `headers` (whole lines) added after its status line; 1xx answers unchanged.
pub fn with_headers(answer: Vec<u8>, headers: &str) -> Vec<u8> {
    if headers.is_empty() || answer.starts_with(b"HTTP/1.1 1") {
        return answer;
    }
    let Some(eol) = answer.windows(2).position(|w| w == b"\r\n") else {
        return answer;
    };
    let mut out = Vec::with_capacity(answer.len() + headers.len());
    out.extend_from_slice(&answer[..eol + 2]);
    out.extend_from_slice(headers.as_bytes());
    out.extend_from_slice(&answer[eol + 2..]);
    out
}
