//! Pure request routing: method + path + query + a few headers → a [`Route`] or a
//! [`RouteError`] with its status. Also parses batch publish bodies. No I/O, no log access;
//! the driver executes the route against the owning core's log.
#![forbid(unsafe_code)]

use crate::proto::http::{Head, Method};

/// Longest accepted stream name in bytes.
pub const STREAM_NAME_BYTES_MAX: usize = 200;

/// Event types only the gateway emits: `event: truncated` is its in-band notice that events
/// were skipped. A published event of that type would be indistinguishable to a client that
/// switches on the type, so a producer could make subscribers believe (or miss) a truncation.
pub const RESERVED_EVENT_TYPES: [&str; 2] = ["truncated", "expired"];

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/streams/{name}/events`: body = data, header `Event-Type` = SSE `event:`.
    Publish { stream: String },
    /// `POST /v1/streams/{name}/events:batch`: NDJSON or JSON array of `{"event"?, "data"}`.
    PublishBatch { stream: String },
    /// `GET /v1/streams/{name}` (text/event-stream).
    Subscribe { stream: String, q: SubscribeQuery },
    /// `DELETE /v1/streams/{name}`: the stream, its events and its name are removed; a stream
    /// created later under the name is another stream (old IDs are refused as foreign).
    Delete { stream: String },
    /// `OPTIONS` on an API path: a CORS preflight.
    Preflight,
    /// `GET /healthz`.
    Healthz,
}

impl Route {
    /// The stream this route touches, which decides the owning core.
    pub fn stream(&self) -> Option<&str> {
        match self {
            Route::Publish { stream }
            | Route::PublishBatch { stream }
            | Route::Subscribe { stream, .. }
            | Route::Delete { stream } => Some(stream),
            Route::Preflight | Route::Healthz => None,
        }
    }
}

/// Where a new subscriber (no Last-Event-ID) starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    Earliest,
    Latest,
}

/// What to do when the requested resume point is below the retained floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTruncated {
    /// 410 Gone with a JSON body (default).
    Error,
    /// 200, first event `event: truncated`, then from the floor.
    Earliest,
    /// 200, first event `event: truncated`, then live from the tail.
    Latest,
}

/// Subscription parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeQuery {
    pub from: From,
    /// From the `Last-Event-ID` header, else `?last_event_id=` (header wins).
    pub last_event_id: Option<String>,
    pub on_truncated: OnTruncated,
}

/// A request the router refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    NotFound,
    /// `/metrics` asked on the public listener: it is served on `--admin-listen` only.
    AdminOnly,
    MethodNotAllowed,
    /// The stream name has a forbidden byte or length.
    BadStreamName,
    /// A query parameter has an unknown value.
    BadQuery(String),
    /// Accept excludes text/event-stream.
    NotAcceptable,
    /// POST with neither Content-Length nor a chunked body.
    LengthRequired,
    /// `Idempotency-Key` is not 1..=64 visible ASCII bytes.
    BadIdempotencyKey,
    /// `Event-Type` names a type only the gateway emits ([`RESERVED_EVENT_TYPES`]).
    ReservedEventType,
}

impl RouteError {
    /// Status code, machine code and message for the JSON error body.
    pub fn status(&self) -> (u16, &'static str, String) {
        match self {
            RouteError::NotFound => (404, "not_found", "no such resource".into()),
            RouteError::AdminOnly => (
                404,
                "not_found",
                "/metrics is served on the admin listener (--admin-listen) only".into(),
            ),
            RouteError::MethodNotAllowed => {
                (405, "method_not_allowed", "method not allowed here".into())
            }
            RouteError::BadStreamName => (
                400,
                "bad_stream_name",
                format!("stream names are 1..={STREAM_NAME_BYTES_MAX} bytes of [A-Za-z0-9._~-]"),
            ),
            RouteError::BadQuery(m) => (400, "bad_query", m.clone()),
            RouteError::NotAcceptable => (
                406,
                "not_acceptable",
                "subscriptions are served as text/event-stream".into(),
            ),
            RouteError::LengthRequired => (
                411,
                "length_required",
                "POST needs a Content-Length or chunked body".into(),
            ),
            RouteError::BadIdempotencyKey => (
                400,
                "bad_idempotency_key",
                "Idempotency-Key must be 1 to 64 visible ASCII bytes".into(),
            ),
            RouteError::ReservedEventType => (
                400,
                "reserved_event_type",
                "event types reserved for the gateway's own notices: truncated, expired".into(),
            ),
        }
    }
}

/// Routes one parsed head.
pub fn route(head: &Head) -> Result<Route, RouteError> {
    let path = head.path.as_str();
    match path {
        "/metrics" => return Err(RouteError::AdminOnly),
        "/healthz" => {
            return match head.method {
                Method::Get | Method::Head => Ok(Route::Healthz),
                Method::Options => Ok(Route::Preflight),
                _ => Err(RouteError::MethodNotAllowed),
            };
        }
        _ => {}
    }
    let rest = path
        .strip_prefix("/v1/streams/")
        .ok_or(RouteError::NotFound)?;
    let (name, tail) = match rest.split_once('/') {
        Some((n, t)) => (n, Some(t)),
        None => (rest, None),
    };
    let stream = valid_name(name)?;
    if head.method == Method::Options && matches!(tail, None | Some("events" | "events:batch")) {
        return Ok(Route::Preflight);
    }
    match tail {
        None => match head.method {
            Method::Get => {
                if let Some(a) = &head.accept
                    && !accepts_event_stream(a)
                {
                    return Err(RouteError::NotAcceptable);
                }
                let q = subscribe_query(&head.query, head.last_event_id.as_deref())?;
                Ok(Route::Subscribe { stream, q })
            }
            Method::Delete => Ok(Route::Delete { stream }),
            _ => Err(RouteError::MethodNotAllowed),
        },
        Some(t @ ("events" | "events:batch")) => publish_route(head, stream, t == "events"),
        Some(_) => Err(RouteError::NotFound),
    }
}

/// `POST /v1/streams/{name}/events[:batch]`.
fn publish_route(head: &Head, stream: String, single: bool) -> Result<Route, RouteError> {
    if head.method != Method::Post {
        return Err(RouteError::MethodNotAllowed);
    }
    if !head.has_content_length && !head.chunked {
        return Err(RouteError::LengthRequired);
    }
    if head
        .idempotency_key
        .as_deref()
        .is_some_and(|k| !valid_idempotency_key(k))
    {
        return Err(RouteError::BadIdempotencyKey);
    }
    if single
        && head
            .event_type
            .as_deref()
            .is_some_and(|e| RESERVED_EVENT_TYPES.contains(&e))
    {
        return Err(RouteError::ReservedEventType);
    }
    Ok(if single {
        Route::Publish { stream }
    } else {
        Route::PublishBatch { stream }
    })
}

/// A stream name as routed: 1..=STREAM_NAME_BYTES_MAX bytes of `[A-Za-z0-9._~-]`.
fn valid_name(n: &str) -> Result<String, RouteError> {
    if !is_api_name(n) {
        return Err(RouteError::BadStreamName);
    }
    Ok(n.to_owned())
}

/// `Idempotency-Key`'s value: 1 to this many visible ASCII bytes.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 64;

/// Whether `v` is a valid `Idempotency-Key` (1..=64 bytes of 0x21..=0x7e).
pub fn valid_idempotency_key(v: &str) -> bool {
    (1..=IDEMPOTENCY_KEY_BYTES_MAX).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_graphic())
}

/// Whether `n` is a name the API can route (what [`route`] accepts in a path).
pub fn is_api_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= STREAM_NAME_BYTES_MAX
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-'))
}

/// True if an Accept header admits `text/event-stream` (with q > 0).
pub fn accepts_event_stream(accept: &str) -> bool {
    accept.split(',').any(|item| {
        let mut parts = item.split(';');
        let ty = parts.next().unwrap_or("").trim();
        let q_zero = parts.any(|p| {
            let p = p.trim();
            p.strip_prefix("q=")
                .is_some_and(|v| v.trim().parse::<f32>().is_ok_and(|q| q <= 0.0))
        });
        !q_zero
            && (ty.eq_ignore_ascii_case("text/event-stream")
                || ty == "*/*"
                || ty.eq_ignore_ascii_case("text/*"))
    })
}

fn subscribe_query(query: &str, header_id: Option<&str>) -> Result<SubscribeQuery, RouteError> {
    let mut q = SubscribeQuery {
        from: From::Latest,
        last_event_id: header_id.map(str::to_owned),
        on_truncated: OnTruncated::Error,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "from" => {
                q.from = match v {
                    "earliest" => From::Earliest,
                    "latest" => From::Latest,
                    _ => {
                        return Err(RouteError::BadQuery(
                            "from must be earliest or latest".into(),
                        ));
                    }
                }
            }
            "on_truncated" => {
                q.on_truncated = match v {
                    "error" => OnTruncated::Error,
                    "earliest" => OnTruncated::Earliest,
                    "latest" => OnTruncated::Latest,
                    _ => {
                        return Err(RouteError::BadQuery(
                            "on_truncated must be error, earliest or latest".into(),
                        ));
                    }
                }
            }
            "last_event_id" => {
                if q.last_event_id.is_none() || header_id.is_none() {
                    q.last_event_id = Some(v.to_owned());
                }
            }
            // The token, read by the access gate (only under --jwt-allow-query-token).
            "access_token" => {}
            _ => {
                return Err(RouteError::BadQuery(format!(
                    "unknown query parameter {k:?}"
                )));
            }
        }
    }
    Ok(q)
}

/// One event of a batch publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Why a batch body is refused (nothing of it is appended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// Not UTF-8, not JSON, or an element is not `{"event"?: string, "data": string}`.
    Malformed { index: usize, why: String },
    /// An event's data exceeds `--event-bytes-max`.
    EventTooLarge { index: usize },
    /// `event` contains CR or LF.
    BadEventType { index: usize },
    /// `event` is reserved for the gateway's own notices ([`RESERVED_EVENT_TYPES`]).
    ReservedEventType { index: usize },
    /// No events at all.
    Empty,
}

impl BatchError {
    /// Status, code and message.
    pub fn status(&self) -> (u16, &'static str, String) {
        match self {
            BatchError::Malformed { index, why } => {
                (400, "bad_batch", format!("event {index}: {why}"))
            }
            BatchError::EventTooLarge { index } => (
                413,
                "event_too_large",
                format!("event {index}: data exceeds --event-bytes-max"),
            ),
            BatchError::BadEventType { index } => (
                400,
                "bad_event_type",
                format!("event {index}: event type must not contain CR or LF"),
            ),
            BatchError::ReservedEventType { index } => (
                400,
                "reserved_event_type",
                format!("event {index}: event type is reserved for the gateway's own notices"),
            ),
            BatchError::Empty => (400, "bad_batch", "batch has no events".into()),
        }
    }
}

/// Parses a batch body: a JSON array of objects, or NDJSON (one object per non-empty line).
pub fn parse_batch(body: &[u8], event_bytes_max: usize) -> Result<Vec<BatchEvent>, BatchError> {
    let text = std::str::from_utf8(body).map_err(|_| BatchError::Malformed {
        index: 0,
        why: "body is not UTF-8".into(),
    })?;
    let values: Vec<serde_json::Value> = if text.trim_start().starts_with('[') {
        serde_json::from_str(text).map_err(|e| BatchError::Malformed {
            index: 0,
            why: e.to_string(),
        })?
    } else {
        let mut v = Vec::new();
        for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
            v.push(
                serde_json::from_str(line).map_err(|e| BatchError::Malformed {
                    index: i,
                    why: e.to_string(),
                })?,
            );
        }
        v
    };
    if values.is_empty() {
        return Err(BatchError::Empty);
    }
    values
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let obj = v.as_object().ok_or_else(|| BatchError::Malformed {
                index,
                why: "not an object".into(),
            })?;
            let data =
                obj.get("data")
                    .and_then(|d| d.as_str())
                    .ok_or_else(|| BatchError::Malformed {
                        index,
                        why: "\"data\" must be a string".into(),
                    })?;
            if data.len() > event_bytes_max {
                return Err(BatchError::EventTooLarge { index });
            }
            let event = match obj.get("event") {
                None | Some(serde_json::Value::Null) => None,
                Some(serde_json::Value::String(s)) => {
                    if s.contains(['\r', '\n']) {
                        return Err(BatchError::BadEventType { index });
                    }
                    if RESERVED_EVENT_TYPES.contains(&s.as_str()) {
                        return Err(BatchError::ReservedEventType { index });
                    }
                    Some(s.clone())
                }
                Some(_) => {
                    return Err(BatchError::Malformed {
                        index,
                        why: "\"event\" must be a string".into(),
                    });
                }
            };
            Ok(BatchEvent {
                event,
                data: data.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::http::{HeadLimits, parse_head};

    fn head(raw: &str) -> Head {
        let l = HeadLimits {
            header_bytes_max: 4096,
            header_count_max: 16,
        };
        parse_head(raw.as_bytes(), &l).unwrap().unwrap()
    }

    #[test]
    fn routes() {
        assert_eq!(
            route(&head(
                "POST /v1/streams/a.b/events HTTP/1.1\r\nContent-Length: 1\r\n\r\n"
            )),
            Ok(Route::Publish {
                stream: "a.b".into()
            })
        );
        assert_eq!(
            route(&head(
                "POST /v1/streams/a/events:batch HTTP/1.1\r\nContent-Length: 1\r\n\r\n"
            )),
            Ok(Route::PublishBatch { stream: "a".into() })
        );
        assert_eq!(
            route(&head("POST /v1/streams/a/events HTTP/1.1\r\n\r\n")),
            Err(RouteError::LengthRequired)
        );
        assert_eq!(
            route(&head("GET /v1/streams/a/events HTTP/1.1\r\n\r\n")),
            Err(RouteError::MethodNotAllowed)
        );
        assert_eq!(
            route(&head("GET /v1/streams/a%20b HTTP/1.1\r\n\r\n")),
            Err(RouteError::BadStreamName)
        );
        assert_eq!(
            route(&head("GET /nope HTTP/1.1\r\n\r\n")),
            Err(RouteError::NotFound)
        );
        assert_eq!(
            route(&head("GET /metrics HTTP/1.1\r\n\r\n")),
            Err(RouteError::AdminOnly)
        );
        assert_eq!(
            route(&head("DELETE /v1/streams/a HTTP/1.1\r\n\r\n")),
            Ok(Route::Delete { stream: "a".into() })
        );
        assert_eq!(
            route(&head("OPTIONS /v1/streams/a/events HTTP/1.1\r\n\r\n")),
            Ok(Route::Preflight)
        );
        assert_eq!(
            route(&head("OPTIONS /v1/streams/a/x HTTP/1.1\r\n\r\n")),
            Err(RouteError::NotFound)
        );
        assert_eq!(
            route(&head("PUT /v1/streams/a HTTP/1.1\r\n\r\n")),
            Err(RouteError::MethodNotAllowed)
        );
        assert_eq!(
            route(&head("DELETE /healthz HTTP/1.1\r\n\r\n")),
            Err(RouteError::MethodNotAllowed)
        );
    }

    #[test]
    fn subscribe_params() {
        let r = route(&head(
            "GET /v1/streams/s?from=earliest&on_truncated=latest&last_event_id=q HTTP/1.1\r\nLast-Event-ID: h\r\n\r\n",
        ))
        .unwrap();
        assert_eq!(
            r,
            Route::Subscribe {
                stream: "s".into(),
                q: SubscribeQuery {
                    from: From::Earliest,
                    last_event_id: Some("h".into()),
                    on_truncated: OnTruncated::Latest
                }
            }
        );
        let r = route(&head("GET /v1/streams/s?last_event_id=q HTTP/1.1\r\n\r\n")).unwrap();
        assert!(matches!(r, Route::Subscribe { q, .. } if q.last_event_id.as_deref() == Some("q")));
        assert!(matches!(
            route(&head("GET /v1/streams/s?from=middle HTTP/1.1\r\n\r\n")),
            Err(RouteError::BadQuery(_))
        ));
        assert_eq!(
            route(&head(
                "GET /v1/streams/s HTTP/1.1\r\nAccept: application/json\r\n\r\n"
            )),
            Err(RouteError::NotAcceptable)
        );
    }

    #[test]
    fn accept_negotiation() {
        assert!(accepts_event_stream("text/event-stream"));
        assert!(accepts_event_stream("application/json, */*;q=0.5"));
        assert!(!accepts_event_stream(
            "text/event-stream;q=0, application/json"
        ));
        assert!(!accepts_event_stream("application/json"));
    }

    #[test]
    fn batches() {
        let nd = b"{\"data\":\"a\"}\n\n{\"event\":\"t\",\"data\":\"b\\nc\"}\n";
        assert_eq!(
            parse_batch(nd, 10).unwrap(),
            vec![
                BatchEvent {
                    event: None,
                    data: "a".into()
                },
                BatchEvent {
                    event: Some("t".into()),
                    data: "b\nc".into()
                }
            ]
        );
        let arr = br#"[{"data":"x"},{"data":"y","event":null}]"#;
        assert_eq!(parse_batch(arr, 10).unwrap().len(), 2);
        assert_eq!(
            parse_batch(br#"[{"data":"0123456789x"}]"#, 10),
            Err(BatchError::EventTooLarge { index: 0 })
        );
        assert_eq!(
            parse_batch(br#"[{"data":"x","event":"a\nb"}]"#, 10),
            Err(BatchError::BadEventType { index: 0 })
        );
        assert!(matches!(
            parse_batch(b"[1]", 10),
            Err(BatchError::Malformed { .. })
        ));
        assert!(matches!(
            parse_batch(b"{\"data\":1}", 10),
            Err(BatchError::Malformed { .. })
        ));
        assert_eq!(parse_batch(b"", 10), Err(BatchError::Empty));
    }

    /// Regression (adversarial review): a producer could publish `event: truncated`, which a
    /// subscriber cannot tell from the gateway's own notice that events were skipped.
    #[test]
    fn reserved_event_type_is_refused() {
        assert_eq!(
            route(&head(
                "POST /v1/streams/a/events HTTP/1.1\r\nContent-Length: 1\r\nEvent-Type: truncated\r\n\r\n"
            )),
            Err(RouteError::ReservedEventType)
        );
        assert!(matches!(
            route(&head(
                "POST /v1/streams/a/events HTTP/1.1\r\nContent-Length: 1\r\nEvent-Type: Truncated\r\n\r\n"
            )),
            Ok(Route::Publish { .. })
        ));
        assert_eq!(
            parse_batch(br#"[{"data":"x"},{"data":"y","event":"truncated"}]"#, 10),
            Err(BatchError::ReservedEventType { index: 1 })
        );
    }

    #[test]
    fn idempotency_keys_are_one_to_sixty_four_visible_ascii_bytes() {
        assert!(valid_idempotency_key("a"));
        assert!(valid_idempotency_key(&"~".repeat(64)));
        for bad in ["", "a b", "a\tb", "é", "a\u{7f}"] {
            assert!(!valid_idempotency_key(bad), "{bad:?}");
        }
        assert!(!valid_idempotency_key(&"a".repeat(65)));
        let post = |k: &str| {
            route(&head(&format!(
                "POST /v1/streams/a/events:batch HTTP/1.1\r\nContent-Length: 1\r\n\
                 Idempotency-Key: {k}\r\n\r\n"
            )))
        };
        assert!(post("order-17").is_ok());
        assert_eq!(post(&"k".repeat(65)), Err(RouteError::BadIdempotencyKey));
        assert!(!valid_idempotency_key("a\u{7f}"));
    }
}
