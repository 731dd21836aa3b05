//! JSON-RPC 2.0 message classification for the MCP front: a body is one message or (2025-03-26
//! only) a batch; a message is a request, a notification or a response. Also builds the error
//! bodies the gateway itself answers with. Pure: bytes in, values out. It does not decide what
//! to do with a message (that is `core`), and it does not validate MCP method parameters.
#![forbid(unsafe_code)]

use serde_json::{Map, Value, json};
use std::fmt;

/// A JSON-RPC id or an MCP progress token: MCP allows a string or an integer for both.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RpcId {
    Int(i64),
    Str(String),
}

impl RpcId {
    /// Reads an id / token from JSON; `None` for null, floats, objects, ...
    pub fn from_value(v: &Value) -> Option<RpcId> {
        match v {
            Value::String(s) => Some(RpcId::Str(s.clone())),
            Value::Number(n) => n.as_i64().map(RpcId::Int),
            _ => None,
        }
    }

    pub fn to_value(&self) -> Value {
        match self {
            RpcId::Int(i) => Value::from(*i),
            RpcId::Str(s) => Value::from(s.as_str()),
        }
    }
}

impl fmt::Display for RpcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcId::Int(i) => write!(f, "{i}"),
            RpcId::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// What one JSON-RPC message is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Has `method` and `id`.
    Request { id: RpcId, method: String },
    /// Has `method`, no `id`.
    Notification { method: String },
    /// Has `id` (possibly null for errors about unparseable input) and `result` or `error`.
    Response { id: Option<RpcId> },
}

/// One classified message with its JSON value (kept for forwarding and field lookups).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub kind: Kind,
    pub value: Value,
}

/// A POST body or an upstream line: one message or a batch (array) of them.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Single(Message),
    Batch(Vec<Message>),
}

/// Why bytes are not a JSON-RPC body. Each names the exact violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClassifyError {
    /// Not UTF-8 or not JSON (JSON-RPC -32700).
    NotJson(String),
    /// `[]`: JSON-RPC says an empty batch is invalid.
    EmptyBatch,
    /// An element is not an object (index in the batch, 0 for a single message).
    NotAnObject { index: usize },
    /// `"jsonrpc"` is missing or not `"2.0"`.
    BadVersion { index: usize },
    /// `method` present but not a string.
    BadMethod { index: usize },
    /// `id` present but neither string nor integer (null only allowed on error responses).
    BadId { index: usize },
    /// Neither `method` nor `result`/`error`, or both `result` and `error`.
    NotAMessage { index: usize },
    /// More elements than the batch limit.
    BatchTooLarge { len: usize, max: usize },
}

impl ClassifyError {
    /// The JSON-RPC error code for this violation.
    pub fn code(&self) -> i64 {
        match self {
            ClassifyError::NotJson(_) => PARSE_ERROR,
            _ => INVALID_REQUEST,
        }
    }
}

impl fmt::Display for ClassifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClassifyError::NotJson(e) => write!(f, "body is not JSON: {e}"),
            ClassifyError::EmptyBatch => write!(f, "empty JSON-RPC batch"),
            ClassifyError::NotAnObject { index } => write!(f, "message {index} is not an object"),
            ClassifyError::BadVersion { index } => {
                write!(f, "message {index} lacks \"jsonrpc\": \"2.0\"")
            }
            ClassifyError::BadMethod { index } => {
                write!(f, "message {index} has a non-string method")
            }
            ClassifyError::BadId { index } => {
                write!(
                    f,
                    "message {index} has an id that is neither string nor integer"
                )
            }
            ClassifyError::NotAMessage { index } => write!(
                f,
                "message {index} is neither request, notification nor response"
            ),
            ClassifyError::BatchTooLarge { len, max } => {
                write!(f, "batch of {len} messages exceeds the limit of {max}")
            }
        }
    }
}

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
/// MCP `HeaderMismatch` (2026-07-28 streamable HTTP, Server Validation).
pub const HEADER_MISMATCH: i64 = -32020;
/// Gateway-defined (implementation range -32000..-32099): the resume position is gone.
pub const RESUME_TRUNCATED: i64 = -32001;
/// Gateway-defined: the resume position is invalid (other stream, epoch, beyond tail).
pub const RESUME_INVALID: i64 = -32002;
/// Gateway-defined: the upstream MCP server exited or could not be reached.
pub const UPSTREAM_GONE: i64 = -32003;
/// Gateway-defined: a per-session limit was hit.
pub const LIMIT_EXCEEDED: i64 = -32004;
/// Gateway-defined: session problems (missing, unknown).
pub const SESSION_ERROR: i64 = -32000;

/// Parses and classifies bytes. `batch_len_max` bounds arrays.
pub fn classify(bytes: &[u8], batch_len_max: usize) -> Result<Body, ClassifyError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| ClassifyError::NotJson(e.to_string()))?;
    match value {
        Value::Array(items) => {
            if items.is_empty() {
                return Err(ClassifyError::EmptyBatch);
            }
            if items.len() > batch_len_max {
                return Err(ClassifyError::BatchTooLarge {
                    len: items.len(),
                    max: batch_len_max,
                });
            }
            let mut out = Vec::with_capacity(items.len());
            for (index, v) in items.into_iter().enumerate() {
                out.push(classify_value(v, index)?);
            }
            Ok(Body::Batch(out))
        }
        v => Ok(Body::Single(classify_value(v, 0)?)),
    }
}

/// Classifies one already-parsed message.
pub fn classify_value(value: Value, index: usize) -> Result<Message, ClassifyError> {
    let obj = value
        .as_object()
        .ok_or(ClassifyError::NotAnObject { index })?;
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(ClassifyError::BadVersion { index });
    }
    let id = match obj.get("id") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(v) => Some(Some(
            RpcId::from_value(v).ok_or(ClassifyError::BadId { index })?,
        )),
    };
    let kind = match obj.get("method") {
        Some(Value::String(m)) => match id {
            None => Kind::Notification { method: m.clone() },
            Some(Some(id)) => Kind::Request {
                id,
                method: m.clone(),
            },
            Some(None) => return Err(ClassifyError::BadId { index }),
        },
        Some(_) => return Err(ClassifyError::BadMethod { index }),
        None => {
            let has_result = obj.contains_key("result");
            let has_error = obj.contains_key("error");
            if has_result == has_error {
                return Err(ClassifyError::NotAMessage { index });
            }
            match id {
                Some(Some(id)) => Kind::Response { id: Some(id) },
                // A null id is allowed only on an error response.
                Some(None) if has_error => Kind::Response { id: None },
                _ => return Err(ClassifyError::NotAMessage { index }),
            }
        }
    };
    Ok(Message { kind, value })
}

impl Message {
    pub fn params(&self) -> Option<&Map<String, Value>> {
        self.value.get("params").and_then(Value::as_object)
    }

    /// `params._meta.progressToken` of a request, if any.
    pub fn progress_token(&self) -> Option<RpcId> {
        self.params()?
            .get("_meta")?
            .get("progressToken")
            .and_then(RpcId::from_value)
    }

    /// `params.progressToken` of a `notifications/progress`.
    pub fn progress_notification_token(&self) -> Option<RpcId> {
        self.params()?
            .get("progressToken")
            .and_then(RpcId::from_value)
    }

    /// `params.requestId` (e.g. of `notifications/cancelled`).
    pub fn request_id_param(&self) -> Option<RpcId> {
        self.params()?.get("requestId").and_then(RpcId::from_value)
    }

    /// `params._meta["io.modelcontextprotocol/subscriptionId"]` (2026-07-28 subscriptions).
    pub fn subscription_id(&self) -> Option<RpcId> {
        self.params()?
            .get("_meta")?
            .get(SUBSCRIPTION_ID_KEY)
            .and_then(RpcId::from_value)
    }

    /// `params._meta["io.modelcontextprotocol/protocolVersion"]` (2026-07-28 requests).
    pub fn meta_protocol_version(&self) -> Option<&str> {
        self.params()?
            .get("_meta")?
            .get(PROTOCOL_VERSION_KEY)?
            .as_str()
    }

    /// One line for a stdio upstream: compact JSON (JSON escapes every newline inside strings,
    /// so the only newline is the terminator) plus `\n`.
    pub fn to_line(&self) -> Vec<u8> {
        value_to_line(&self.value)
    }
}

pub const SUBSCRIPTION_ID_KEY: &str = "io.modelcontextprotocol/subscriptionId";
pub const PROTOCOL_VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";

/// Compact JSON plus `\n`.
pub fn value_to_line(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).expect("serde_json::Value always serialises");
    debug_assert!(!out.contains(&b'\n'), "compact JSON has no raw newline");
    out.push(b'\n');
    out
}

/// A JSON-RPC error response body. `id: None` gives `"id": null` (the spec's "error response
/// that has no id" for HTTP-level rejections).
pub fn error_body(id: Option<&RpcId>, code: i64, message: &str, data: Option<Value>) -> Vec<u8> {
    let mut err = json!({ "code": code, "message": message });
    if let Some(d) = data {
        err["data"] = d;
    }
    let id = id.map_or(Value::Null, RpcId::to_value);
    serde_json::to_vec(&json!({ "jsonrpc": "2.0", "id": id, "error": err }))
        .expect("serde_json::Value always serialises")
}

/// Gateway-defined: a message could not be stored in the log (record too large, disk full).
pub const NOT_STORED: i64 = -32005;

/// The record that takes the place of a stream record the log refused (`why`), at the same
/// position, so the stream stays gap-free and the refusal is explicit: a response becomes a
/// JSON-RPC error response for the same id (the request is answered); anything else becomes
/// an `event: error` record naming the lost message's method. Returns (event type, data).
pub fn not_stored_substitute(data: &[u8], why: &str) -> (Option<&'static str>, Vec<u8>) {
    let message =
        format!("a message from the upstream could not be stored in the gateway's log: {why}");
    let v: Value = serde_json::from_slice(data).unwrap_or(Value::Null);
    let is_response = v.get("result").is_some() || v.get("error").is_some();
    match v.get("id") {
        Some(id) if is_response && !id.is_null() => {
            let body = json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": { "code": NOT_STORED, "message": message, "data": { "bytes": data.len() } },
            });
            (None, serde_json::to_vec(&body).expect("Value serialises"))
        }
        _ => {
            let body = json!({
                "error": message,
                "code": NOT_STORED,
                "method": v.get("method"),
                "bytes": data.len(),
            });
            (
                Some("error"),
                serde_json::to_vec(&body).expect("Value serialises"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_stored_response_becomes_error_for_same_id() {
        let (t, d) = not_stored_substitute(
            br#"{"jsonrpc":"2.0","id":"a7","result":{"x":1}}"#,
            "too large",
        );
        assert_eq!(t, None);
        let v: Value = serde_json::from_slice(&d).unwrap();
        assert_eq!(v["id"], "a7");
        assert_eq!(v["error"]["code"], NOT_STORED);
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("too large")
        );
        let (t, d) = not_stored_substitute(
            br#"{"jsonrpc":"2.0","method":"notifications/progress"}"#,
            "x",
        );
        assert_eq!(t, Some("error"));
        let v: Value = serde_json::from_slice(&d).unwrap();
        assert_eq!(v["method"], "notifications/progress");
        // A server request (has id and method) is not a response: an error event, not an answer.
        let (t, _) = not_stored_substitute(
            br#"{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage"}"#,
            "x",
        );
        assert_eq!(t, Some("error"));
    }

    fn one(bytes: &str) -> Message {
        match classify(bytes.as_bytes(), 8).unwrap() {
            Body::Single(m) => m,
            Body::Batch(_) => panic!("expected single"),
        }
    }

    #[test]
    fn classifies_request_notification_response() {
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#).kind,
            Kind::Request {
                id: RpcId::Int(7),
                method: "tools/list".into()
            }
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":"a","method":"x"}"#).kind,
            Kind::Request {
                id: RpcId::Str("a".into()),
                method: "x".into()
            }
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).kind,
            Kind::Notification {
                method: "notifications/initialized".into()
            }
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#).kind,
            Kind::Response {
                id: Some(RpcId::Int(3))
            }
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":null,"error":{"code":1,"message":"m"}}"#).kind,
            Kind::Response { id: None }
        );
    }

    #[test]
    fn classifies_batch() {
        let b = classify(
            br#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"}]"#,
            8,
        )
        .unwrap();
        match b {
            Body::Batch(v) => {
                assert_eq!(v.len(), 2);
                assert!(matches!(v[1].kind, Kind::Notification { .. }));
            }
            Body::Single(_) => panic!("expected batch"),
        }
    }

    #[test]
    fn rejects_each_violation_precisely() {
        let e = |s: &str| classify(s.as_bytes(), 2).unwrap_err();
        assert!(matches!(e("{"), ClassifyError::NotJson(_)));
        assert!(matches!(e("\u{0}"), ClassifyError::NotJson(_)));
        assert_eq!(classify(b"\xff\xfe", 2).unwrap_err().code(), PARSE_ERROR);
        assert_eq!(e("[]"), ClassifyError::EmptyBatch);
        assert_eq!(e("3"), ClassifyError::NotAnObject { index: 0 });
        assert_eq!(
            e(r#"{"id":1,"method":"a"}"#),
            ClassifyError::BadVersion { index: 0 }
        );
        assert_eq!(
            e(r#"{"jsonrpc":"1.0","id":1,"method":"a"}"#),
            ClassifyError::BadVersion { index: 0 }
        );
        assert_eq!(
            e(r#"{"jsonrpc":"2.0","id":1,"method":5}"#),
            ClassifyError::BadMethod { index: 0 }
        );
        assert_eq!(
            e(r#"{"jsonrpc":"2.0","id":1.5,"method":"a"}"#),
            ClassifyError::BadId { index: 0 }
        );
        assert_eq!(
            e(r#"{"jsonrpc":"2.0","id":null,"method":"a"}"#),
            ClassifyError::BadId { index: 0 }
        );
        assert_eq!(
            e(r#"{"jsonrpc":"2.0","id":1}"#),
            ClassifyError::NotAMessage { index: 0 }
        );
        assert_eq!(
            e(r#"{"jsonrpc":"2.0","id":1,"result":1,"error":{}}"#),
            ClassifyError::NotAMessage { index: 0 }
        );
        assert_eq!(
            e(r#"{"jsonrpc":"2.0","id":null,"result":1}"#),
            ClassifyError::NotAMessage { index: 0 }
        );
        assert_eq!(
            e(
                r#"[{"jsonrpc":"2.0","method":"a"},{"jsonrpc":"2.0","method":"b"},{"jsonrpc":"2.0","method":"c"}]"#
            ),
            ClassifyError::BatchTooLarge { len: 3, max: 2 }
        );
        assert_eq!(
            e(r#"[{"jsonrpc":"2.0","method":"a"},7]"#),
            ClassifyError::NotAnObject { index: 1 }
        );
        assert_eq!(e("{}").code(), INVALID_REQUEST);
    }

    #[test]
    fn field_lookups() {
        let m = one(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"progressToken":"p","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
        );
        assert_eq!(m.progress_token(), Some(RpcId::Str("p".into())));
        assert_eq!(m.meta_protocol_version(), Some("2026-07-28"));
        let n = one(
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":5,"progress":1}}"#,
        );
        assert_eq!(n.progress_notification_token(), Some(RpcId::Int(5)));
        let c = one(
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"r"}}"#,
        );
        assert_eq!(c.request_id_param(), Some(RpcId::Str("r".into())));
    }

    /// SPEC-NOTES C8: the line sent to a stdio upstream has no embedded newline.
    #[test]
    fn upstream_line_has_no_embedded_newline() {
        let m = one(
            "{\n \"jsonrpc\": \"2.0\",\n \"id\": 1,\n \"method\": \"x\",\n \"params\": {\"s\": \"a\\nb\\r\"}\n}",
        );
        let line = m.to_line();
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(*line.last().unwrap(), b'\n');
        assert!(!line.contains(&b'\r'));
        let back: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(back["params"]["s"], "a\nb\r");
    }

    #[test]
    fn error_body_shape() {
        let b: Value =
            serde_json::from_slice(&error_body(None, -32020, "m", Some(json!({"x":1})))).unwrap();
        assert_eq!(
            b,
            json!({"jsonrpc":"2.0","id":null,"error":{"code":-32020,"message":"m","data":{"x":1}}})
        );
        let b: Value =
            serde_json::from_slice(&error_body(Some(&RpcId::Int(4)), 1, "m", None)).unwrap();
        assert_eq!(b["id"], 4);
    }
}
