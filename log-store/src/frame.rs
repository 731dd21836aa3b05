//! SSE framing of one event, done once at append: `id: <EventId>\n`, optional
//! `event: <type>\n`, one `data: <line>\n` per line of the data (lines split on `\r\n`, `\n` or
//! `\r`, as the SSE parser does), then the blank line `\n`. Pure code over bytes; it does not
//! validate UTF-8 (the caller does) and does no I/O.
#![forbid(unsafe_code)]

use crate::event_id::EventId;

/// Position and length of the first line break (`\r\n` counts as one break of length 2).
fn next_break(data: &[u8]) -> Option<(usize, usize)> {
    // Scan 32-byte chunks with a branch-free fold (vectorizes), then locate inside the chunk.
    let mut base = 0;
    for chunk in data.chunks(32) {
        let hit = chunk
            .iter()
            .fold(false, |acc, &b| acc | (b == b'\n') | (b == b'\r'));
        if hit {
            let i = chunk
                .iter()
                .position(|&b| b == b'\n' || b == b'\r')
                .unwrap_or(0);
            let at = base + i;
            let len = if data[at] == b'\r' && data.get(at + 1) == Some(&b'\n') {
                2
            } else {
                1
            };
            return Some((at, len));
        }
        base += chunk.len();
    }
    None
}

/// Iterates the SSE lines of `data` (always at least one, possibly empty).
fn lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(data);
    std::iter::from_fn(move || {
        let r = rest?;
        match next_break(r) {
            Some((at, len)) => {
                rest = Some(&r[at + len..]);
                Some(&r[..at])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

/// Exact framed length of an event.
pub(crate) fn framed_len(id: &EventId, event_type: Option<&str>, data: &[u8]) -> usize {
    let mut n = 4 + id.encoded_len() + 1;
    if let Some(t) = event_type {
        n += 7 + t.len() + 1;
    }
    for line in lines(data) {
        n += 6 + line.len() + 1;
    }
    n + 1
}

/// Writes the framed event into `out`, which must be exactly `framed_len(..)` bytes.
pub(crate) fn write_frame(out: &mut [u8], id: &EventId, event_type: Option<&str>, data: &[u8]) {
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        out[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    let mut idbuf = [0u8; crate::event_id::EVENT_ID_BYTES_MAX];
    let idn = id.encode(&mut idbuf);
    put(b"id: ");
    put(&idbuf[..idn]);
    put(b"\n");
    if let Some(t) = event_type {
        put(b"event: ");
        put(t.as_bytes());
        put(b"\n");
    }
    for line in lines(data) {
        put(b"data: ");
        put(line);
        put(b"\n");
    }
    put(b"\n");
    assert_eq!(at, out.len(), "framed length mismatch");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_id::{Epoch, StreamId};

    fn frame(t: Option<&str>, data: &[u8]) -> String {
        let id = EventId {
            epoch: Epoch(1),
            stream: StreamId(2),
            seq: 3,
        };
        let mut v = vec![0; framed_len(&id, t, data)];
        write_frame(&mut v, &id, t, data);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn frames_per_sse_rules() {
        let id = "id: 0000000000000001-2-3\n";
        assert_eq!(frame(None, b"x"), format!("{id}data: x\n\n"));
        assert_eq!(
            frame(Some("msg"), b""),
            format!("{id}event: msg\ndata: \n\n")
        );
        assert_eq!(
            frame(None, b"a\r\nb\nc\rd\n"),
            format!("{id}data: a\ndata: b\ndata: c\ndata: d\ndata: \n\n")
        );
        assert_eq!(
            frame(None, b"\r\r\n"),
            format!("{id}data: \ndata: \ndata: \n\n")
        );
        let long = "y".repeat(100) + "\n" + &"z".repeat(40);
        assert_eq!(
            frame(None, long.as_bytes()),
            format!(
                "{id}data: {}\ndata: {}\n\n",
                "y".repeat(100),
                "z".repeat(40)
            )
        );
    }
}
