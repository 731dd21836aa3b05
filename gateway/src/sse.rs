//! SSE response framing that is not an event of the log: the subscription response head,
//! the `retry:` line, `:` keep-alive comments and the explicit `event: truncated` notice
//! (which carries no `id:` line, so it never moves the client's Last-Event-ID).
//! Event records themselves are framed once by the log store at append time.
#![forbid(unsafe_code)]

/// Head of a 200 subscription response plus the initial `retry:` line. The body is
/// delimited by connection close (no Content-Length, no chunking), so events can be sent
/// straight from the mapped log without per-chunk framing.
pub fn subscribe_head(retry_ms: u64) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
         Connection: close\r\nX-Accel-Buffering: no\r\n\r\nretry: {retry_ms}\n\n"
    )
    .into_bytes()
}

/// A keep-alive comment.
pub const KEEPALIVE: &[u8] = b":\n\n";

/// Why a subscription is told it missed events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TruncatedReason {
    /// The requested position is below the retained floor.
    Truncated,
    /// The subscriber fell more than `--lag-events-max` behind the tail.
    Lagging,
}

/// The JSON body shared by `410 Gone` and the in-band `event: truncated`.
pub fn truncated_json(reason: TruncatedReason, requested: u64, floor: u64, tail: u64) -> String {
    let error = match reason {
        TruncatedReason::Truncated => "truncated",
        TruncatedReason::Lagging => "lagging",
    };
    serde_json::json!({ "error": error, "requested": requested, "floor": floor, "tail": tail })
        .to_string()
}

/// `event: truncated` with the JSON as data and no `id:` line.
pub fn truncated_event(json: &str) -> Vec<u8> {
    format!("event: truncated\ndata: {json}\n\n").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_event_has_no_id_and_parses() {
        let j = truncated_json(TruncatedReason::Truncated, 3, 10, 20);
        let e = String::from_utf8(truncated_event(&j)).unwrap();
        assert!(e.starts_with("event: truncated\ndata: {"));
        assert!(!e.contains("\nid:") && !e.starts_with("id:"));
        assert!(e.ends_with("\n\n"));
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(
            (v["requested"].as_u64(), v["floor"].as_u64()),
            (Some(3), Some(10))
        );
    }

    #[test]
    fn head_is_event_stream_with_retry() {
        let h = String::from_utf8(subscribe_head(500)).unwrap();
        assert!(h.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(h.contains("Content-Type: text/event-stream\r\n"));
        assert!(h.contains("Cache-Control: no-cache\r\n"));
        assert!(h.ends_with("\r\n\r\nretry: 500\n\n"));
    }
}
