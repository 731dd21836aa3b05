//! Reading one answer of the upstream (a JSON body or an SSE stream) and handing its JSON-RPC
//! messages on; a request left unanswered gets an error response made here.

use super::shared::{SendError, Shared};
use crate::credential::Credential;
use crate::upstream_event::UpstreamEvent;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use ureq::Body;
use ureq::http::{HeaderMap, Response};

/// A header's value, when it is text.
pub(super) fn header<'a>(hs: &'a HeaderMap, name: &str) -> Option<&'a str> {
    hs.get(name).and_then(|v| v.to_str().ok())
}

pub(super) fn is_sse(hs: &HeaderMap) -> bool {
    header(hs, "content-type").is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}

/// An answer's body, read as it arrives (ureq decodes `Content-Length` and chunked framing;
/// a body read to its end gives its connection back to the pool, one dropped before ends it).
pub(super) fn body_reader(body: Body) -> BufReader<ureq::BodyReader<'static>> {
    BufReader::with_capacity(16 * 1024, body.into_reader())
}

/// Reads at most `max` bytes of a body we do not need, so that its connection can be reused.
pub(super) fn drain(body: &mut impl Read, max: u64) {
    let _ = std::io::copy(&mut body.take(max), &mut std::io::sink());
}

/// Does this message answer `id`?
fn answers(msg: &[u8], id: &Value) -> bool {
    match serde_json::from_slice::<Value>(msg) {
        Ok(Value::Object(o)) => {
            o.get("id") == Some(id) && (o.contains_key("result") || o.contains_key("error"))
        }
        Ok(Value::Array(a)) => a.iter().any(|m| {
            m.get("id") == Some(id) && (m.get("result").is_some() || m.get("error").is_some())
        }),
        _ => false,
    }
}

/// Hands one message on (or reports it too long).
fn forward(sh: &Shared, msg: Vec<u8>, want: Option<&Value>, answered: &mut bool, init: bool) {
    if msg.len() > sh.line_bytes_max {
        sh.emit(UpstreamEvent::LineTooLong(sh.id, msg.len()));
        return;
    }
    if let Some(id) = want
        && answers(&msg, id)
    {
        *answered = true;
        if init
            && let Ok(v) = serde_json::from_slice::<Value>(&msg)
            && let Some(ver) = v.pointer("/result/protocolVersion").and_then(Value::as_str)
        {
            sh.session.lock().expect("session lock").1 = Some(ver.to_owned());
        }
    }
    sh.emit(UpstreamEvent::Line(sh.id, msg));
}

/// Bytes of a short answer we do not need (202, the rest of an error's text) read so that
/// its keep-alive connection can be reused; a longer one ends that connection instead.
pub(super) const DRAIN_BYTES_MAX: u64 = 64 * 1024;

/// Reads the answer to one POST (`sent`: what sending it gave) and forwards its messages; a
/// request left unanswered gets an error response made here, and an upstream that cannot be
/// reached ends. A JSON answer is read to its end (its connection back in the pool) before
/// its message is handed on, so the next request finds the connection idle; an SSE answer
/// keeps its connection until the stream ends. `auth`: the `Authorization` the POST carried,
/// scrubbed from any upstream text quoted in a log line or an error.
pub(super) fn read_answer(
    sh: &Arc<Shared>,
    sent: Result<Response<Body>, SendError>,
    request_id: Option<&Value>,
    init: bool,
    auth: Option<&Credential>,
) {
    let mut answered = false;
    let failure = match sent {
        Err(SendError::Unreachable(why)) => return sh.die(&why),
        Err(SendError::Unreadable(why)) => Some(why),
        Ok(resp) => {
            let (head, body) = resp.into_parts();
            if init && let Some(sid) = header(&head.headers, "mcp-session-id") {
                sh.session.lock().expect("session lock").0 = Some(sid.trim().to_owned());
            }
            let mut body = body_reader(body);
            let want = request_id.map(|id| (id, &mut answered, init));
            let status = head.status.as_u16();
            let sse = is_sse(&head.headers);
            let (failure, msg) = take_answer(sh, status, sse, &mut body, want, auth);
            drop(body);
            if let Some(msg) = msg {
                forward(sh, msg, request_id, &mut answered, init);
            }
            failure
        }
    };
    settle(sh, request_id, answered, failure);
}

/// Reads one answer's body: SSE messages are forwarded as they come; a JSON message is
/// returned (forwarded by the caller once the connection is released). Returns the failure
/// an error answer means.
fn take_answer(
    sh: &Shared,
    status: u16,
    sse: bool,
    body: &mut impl BufRead,
    want: Option<(&Value, &mut bool, bool)>,
    auth: Option<&Credential>,
) -> (Option<String>, Option<Vec<u8>>) {
    match status {
        200 if sse => {
            read_sse(sh, body, want);
            (None, None)
        }
        200 => {
            let mut msg = Vec::new();
            let max = sh.line_bytes_max as u64 + 1;
            match body.by_ref().take(max).read_to_end(&mut msg) {
                Err(e) => (Some(format!("upstream answer unreadable: {e}")), None),
                Ok(_) if msg.iter().all(u8::is_ascii_whitespace) => (None, None),
                Ok(_) => (None, Some(msg)),
            }
        }
        202 => {
            drain(body, DRAIN_BYTES_MAX);
            (None, None)
        }
        404 if sh.session.lock().expect("session lock").0.is_some() => {
            sh.die("the upstream answered 404: its session is gone");
            (None, None)
        }
        status => {
            let why = refused(status, body, auth);
            drain(body, DRAIN_BYTES_MAX);
            (Some(why), None)
        }
    }
}

/// The failure an HTTP error answer means, quoting up to 512 bytes of the upstream's text
/// with the request's `Authorization` scrubbed out (an upstream may echo what it was sent).
fn refused(status: u16, body: &mut impl BufRead, auth: Option<&Credential>) -> String {
    let mut text = Vec::new();
    let _ = body.take(512).read_to_end(&mut text);
    let text = String::from_utf8_lossy(&text);
    let text = match auth {
        Some(a) => a.scrub(text.trim()),
        None => text.trim().to_owned(),
    };
    format!("upstream answered HTTP {status}: {text}")
}

/// After an answer: a notification's failure is logged; a request left unanswered (by a live
/// upstream) gets a JSON-RPC error made here, naming the failure.
fn settle(sh: &Shared, request_id: Option<&Value>, answered: bool, failure: Option<String>) {
    let Some(id) = request_id else {
        if let Some(f) = failure {
            tracing::warn!(upstream = sh.id.0, "{f}");
        }
        return;
    };
    if answered || sh.dead.load(Ordering::SeqCst) {
        return; // a dead upstream's requests are answered by the core
    }
    let why = failure.unwrap_or_else(|| {
        "the upstream ended the request's stream without a response (it cannot be resumed upstream)"
            .into()
    });
    let err = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": -32603, "message": why},
    });
    sh.emit(UpstreamEvent::Line(
        sh.id,
        serde_json::to_vec(&err).expect("json"),
    ));
}

/// Reads SSE events until the stream ends; each non-empty `data` is one JSON-RPC message.
pub(super) fn read_sse(
    sh: &Shared,
    body: &mut impl BufRead,
    want: Option<(&Value, &mut bool, bool)>,
) {
    let (want_id, answered, init) = match want {
        Some((id, a, i)) => (Some(id), Some(a), i),
        None => (None, None, false),
    };
    let mut dummy = false;
    let answered = answered.unwrap_or(&mut dummy);
    let mut data: Vec<u8> = Vec::new();
    let mut has_data = false;
    let mut too_long = 0usize;
    let mut line = Vec::new();
    loop {
        line.clear();
        // A line longer than the record limit is cut here and the event dropped as too long.
        let limit = sh.line_bytes_max as u64 + 2;
        match body.by_ref().take(limit).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if !line.ends_with(b"\n") && line.len() as u64 >= limit {
            too_long += line.len();
            // Skip the rest of the line.
            let mut rest = Vec::new();
            loop {
                rest.clear();
                match body.by_ref().take(64 * 1024).read_until(b'\n', &mut rest) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if rest.ends_with(b"\n") => break,
                    Ok(n) => too_long += n,
                }
            }
            continue;
        }
        let l = line.strip_suffix(b"\n").unwrap_or(&line);
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        if l.is_empty() {
            if too_long > 0 {
                sh.emit(UpstreamEvent::LineTooLong(sh.id, too_long));
            } else if has_data && !data.iter().all(u8::is_ascii_whitespace) {
                forward(sh, std::mem::take(&mut data), want_id, answered, init);
            }
            data.clear();
            has_data = false;
            too_long = 0;
            continue;
        }
        if let Some(v) = l.strip_prefix(b"data:") {
            let v = v.strip_prefix(b" ").unwrap_or(v);
            if has_data {
                data.push(b'\n');
            }
            data.extend_from_slice(v);
            has_data = true;
            if data.len() > sh.line_bytes_max {
                too_long += data.len();
                data.clear();
                has_data = false;
            }
        }
        // id:, event:, retry: and comments carry nothing we need.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_matches_id_of_response_only() {
        let id = serde_json::json!(3);
        assert!(answers(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#, &id));
        assert!(answers(br#"[{"jsonrpc":"2.0","id":3,"error":{}}]"#, &id));
        assert!(!answers(br#"{"jsonrpc":"2.0","id":3,"method":"x"}"#, &id));
        assert!(!answers(br#"{"jsonrpc":"2.0","id":"3","result":{}}"#, &id));
    }

    /// An upstream error body that echoes the forwarded credential is quoted without it.
    #[test]
    fn refused_scrubs_the_forwarded_credential() {
        let auth = Credential::from_header(b"Bearer eyJ0eXAi.secret.sig").unwrap();
        let body = || {
            std::io::Cursor::new(
                b"token eyJ0eXAi.secret.sig expired (Authorization: Bearer eyJ0eXAi.secret.sig)"
                    .to_vec(),
            )
        };
        let why = refused(401, &mut body(), Some(&auth));
        assert!(!why.contains("secret"), "{why}");
        assert_eq!(
            why,
            "upstream answered HTTP 401: token <redacted> expired (Authorization: <redacted>)"
        );
        assert!(refused(500, &mut body(), None).contains("HTTP 500: token eyJ0eXAi"));
    }
}
