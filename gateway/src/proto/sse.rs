//! SSE response framing that is not an event of the log: the subscription response head,
//! the `retry:` line, `:` keep-alive comments and the explicit `event: truncated` notice
//! (which carries no `id:` line, so it never moves the client's Last-Event-ID).
//! Event records themselves are framed once by the log store at append time.
#![forbid(unsafe_code)]

/// Head of a 200 subscription response plus the initial `retry:` line. The body is
/// delimited by connection close (no Content-Length, no chunking), so events can be sent
/// straight from the mapped log without per-chunk framing.
pub fn subscribe_head(retry_ms: u64) -> Vec<u8> {
    head(retry_ms, "")
}

/// The same head for a resume (a `Last-Event-ID` was given), with an
/// `X-Resume-Class: <class>` header saying how the server classified it (`aligned`,
/// `replay`, `up-to-date`, or `truncated` for the in-band `on_truncated` answers).
pub fn subscribe_head_resumed(retry_ms: u64, class: &str) -> Vec<u8> {
    head(retry_ms, &format!("X-Resume-Class: {class}\r\n"))
}

fn head(retry_ms: u64, extra: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
         Connection: close\r\nX-Accel-Buffering: no\r\n{extra}\r\nretry: {retry_ms}\n\n"
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

/// Exact length of an event as the log frames it (`log-store/DESIGN.md`): `id: <id>\n`, an
/// optional `event: <type>\n`, one `data: <line>\n` per line of `data` (split on CRLF, LF or
/// CR), then `\n`. `id_bytes` is the textual ID's length. Lets a batch be checked against the
/// log's record limit before any of it is appended.
/// An upper bound of [`framed_event_bytes`] from the data's length alone: every byte a line
/// break, each costing a `data: ` prefix and a newline. When the bound fits a limit, the data
/// need not be scanned.
pub fn framed_event_bytes_bound(
    id_bytes: usize,
    event_type: Option<&str>,
    data_len: usize,
) -> usize {
    let event = event_type.map_or(0, |t| "event: ".len() + t.len() + 1);
    let lines = data_len.saturating_add(1);
    ("id: ".len() + id_bytes + 1 + event + 1)
        .saturating_add(data_len)
        .saturating_add(lines.saturating_mul("data: \n".len()))
}

pub fn framed_event_bytes(id_bytes: usize, event_type: Option<&str>, data: &[u8]) -> usize {
    let (mut lines, mut break_bytes, mut i) = (1usize, 0usize, 0usize);
    while i < data.len() {
        match data[i] {
            b'\r' if data.get(i + 1) == Some(&b'\n') => {
                lines += 1;
                break_bytes += 2;
                i += 1;
            }
            b'\r' | b'\n' => {
                lines += 1;
                break_bytes += 1;
            }
            _ => {}
        }
        i += 1;
    }
    let event = event_type.map_or(0, |t| "event: ".len() + t.len() + 1);
    "id: ".len() + id_bytes + 1 + event + data.len() - break_bytes + "data: \n".len() * lines + 1
}

#[cfg(test)]
mod tests {
    #[test]
    fn framed_bound_is_never_below_the_framed_size() {
        let cases: [&[u8]; 7] = [
            b"",
            b"x",
            b"\n",
            b"\r\n",
            b"\r\r\n\n",
            b"a\nb\rc\r\nd",
            &[b'\n'; 300],
        ];
        for data in cases {
            for ev in [None, Some("update")] {
                for id in [20, 48] {
                    let exact = framed_event_bytes(id, ev, data);
                    assert!(
                        framed_event_bytes_bound(id, ev, data.len()) >= exact,
                        "{data:?} {ev:?}"
                    );
                }
            }
        }
        // All line breaks: the bound is reached exactly.
        let lf = [b'\n'; 9];
        assert_eq!(
            framed_event_bytes_bound(20, None, 9),
            framed_event_bytes(20, None, &lf) + 9
        );
    }

    use super::*;

    /// The computed length equals what the log really writes, for line-break shapes that
    /// matter (CRLF counted once, lone CR, trailing and leading breaks, empty data).
    #[test]
    fn framed_event_bytes_matches_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let opts = log_store::LogOptions {
            segment_bytes: 1 << 20,
            record_bytes_max: 64 << 10,
            fsync: log_store::FsyncPolicy::Never,
            ..log_store::LogOptions::default()
        };
        let mut log = log_store::Log::open(dir.path(), opts).unwrap();
        let s = log.create_stream("f").unwrap();
        let datas: [&[u8]; 9] = [
            b"",
            b"x",
            b"a\r\nb",
            b"a\rb\nc",
            b"\r\r\n\n",
            b"\n",
            b"trailing\r",
            b"\r\nlead",
            b"\xc3\xa9t\xc3\xa9\n\n",
        ];
        for (k, data) in datas.iter().enumerate() {
            for t in [None, Some(""), Some("kind")] {
                let a = log.append(s, t, data).unwrap();
                let real = log.record(s, a.id.seq).unwrap().as_bytes().len();
                let id_bytes = a.id.to_string().len();
                assert_eq!(
                    framed_event_bytes(id_bytes, t, data),
                    real,
                    "data {k} type {t:?}"
                );
            }
        }
    }

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
        assert!(!h.contains("X-Resume-Class"));
    }

    #[test]
    fn resumed_head_names_the_class() {
        let h = String::from_utf8(subscribe_head_resumed(500, "up-to-date")).unwrap();
        assert!(h.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(h.contains("\r\nX-Resume-Class: up-to-date\r\n\r\nretry: 500\n\n"));
        assert_eq!(h.matches("\r\n\r\n").count(), 1);
    }
}
