//! SSE framing of one event, done once at append: `id: <EventId>\n`, optional
//! `event: <type>\n`, one `data: <line>\n` per line of the data (lines split on `\r\n`, `\n` or
//! `\r`, as the SSE parser does), then the blank line `\n`. Pure code over bytes; it does not
//! validate UTF-8 (the caller does) and does no I/O.
#![forbid(unsafe_code)]

use crate::event_id::{Epoch, EventId, Seq, StreamId, decimal_len, encode_decimal};

/// True when `chunk` contains CR or LF. Fixed-size input so the compiler vectorizes the fold.
fn chunk_has_break(chunk: &[u8; 32]) -> bool {
    chunk.iter().fold(0u8, |acc, &b| {
        acc | u8::from(b == b'\n') | u8::from(b == b'\r')
    }) != 0
}

/// Index of the first CR or LF.
fn first_break(data: &[u8]) -> Option<usize> {
    let mut chunks = data.chunks_exact(32);
    let mut base = 0;
    for chunk in &mut chunks {
        if chunk_has_break(chunk.try_into().expect("32 bytes")) {
            return chunk
                .iter()
                .position(|&b| b == b'\n' || b == b'\r')
                .map(|i| base + i);
        }
        base += 32;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == b'\n' || b == b'\r')
        .map(|i| base + i)
}

/// How the data splits into SSE lines: computed once per append.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Lines {
    /// No line break: one `data:` line (the common case, e.g. JSON).
    Single,
    /// At least one line break, the first at this index.
    Multi { first_break: usize },
}

pub(crate) fn split(data: &[u8]) -> Lines {
    match first_break(data) {
        None => Lines::Single,
        Some(first_break) => Lines::Multi { first_break },
    }
}

/// Iterates the SSE lines of `data` starting with a known first break position.
fn multi_lines(data: &[u8], known_break: usize) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(data);
    let mut known = Some(known_break);
    std::iter::from_fn(move || {
        let r = rest?;
        match known.take().or_else(|| first_break(r)) {
            Some(at) => {
                let len = if r[at] == b'\r' && r.get(at + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
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

const ID_PREFIX: &[u8] = b"id: ";
const EVENT_PREFIX: &[u8] = b"event: ";
const DATA_PREFIX: &[u8] = b"data: ";

/// The constant start of every event of one stream: `id: {epoch:016x}-{stream}-`. Built once
/// per stream so an append only formats its sequence number.
pub(crate) fn id_prefix(epoch: Epoch, stream: StreamId) -> Box<[u8]> {
    let id = EventId {
        epoch,
        stream,
        seq: 0,
    };
    let mut buf = [0u8; crate::event_id::EVENT_ID_BYTES_MAX];
    let n = id.encode(&mut buf);
    // Drop the trailing "0" (seq) and keep "...-".
    [ID_PREFIX, &buf[..n - 1]].concat().into_boxed_slice()
}

/// Exact framed length of an event whose id line starts with `prefix` (see [`id_prefix`]).
pub(crate) fn framed_len(
    prefix: &[u8],
    seq: Seq,
    event_type: Option<&str>,
    data: &[u8],
    lines: Lines,
) -> usize {
    let mut n = prefix.len() + decimal_len(seq) + 1;
    if let Some(t) = event_type {
        n += EVENT_PREFIX.len() + t.len() + 1;
    }
    match lines {
        Lines::Single => n += DATA_PREFIX.len() + data.len() + 1,
        Lines::Multi { first_break } => {
            for line in multi_lines(data, first_break) {
                n += DATA_PREFIX.len() + line.len() + 1;
            }
        }
    }
    n + 1
}

/// Copies `bytes` to `out[at..]` and returns the new position.
fn put(out: &mut [u8], at: usize, bytes: &[u8]) -> usize {
    out[at..at + bytes.len()].copy_from_slice(bytes);
    at + bytes.len()
}

/// Writes the framed event into `out`, which must be exactly `framed_len(..)` bytes.
pub(crate) fn write_frame(
    out: &mut [u8],
    prefix: &[u8],
    seq: Seq,
    event_type: Option<&str>,
    data: &[u8],
    lines: Lines,
) {
    let mut at = put(out, 0, prefix);
    at += encode_decimal(seq, &mut out[at..]);
    at = put(out, at, b"\n");
    if let Some(t) = event_type {
        at = put(out, at, EVENT_PREFIX);
        at = put(out, at, t.as_bytes());
        at = put(out, at, b"\n");
    }
    match lines {
        Lines::Single => {
            at = put(out, at, DATA_PREFIX);
            at = put(out, at, data);
            at = put(out, at, b"\n");
        }
        Lines::Multi { first_break } => {
            for line in multi_lines(data, first_break) {
                at = put(out, at, DATA_PREFIX);
                at = put(out, at, line);
                at = put(out, at, b"\n");
            }
        }
    }
    at = put(out, at, b"\n");
    assert_eq!(at, out.len(), "framed length mismatch");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(t: Option<&str>, data: &[u8]) -> String {
        let id = EventId {
            epoch: Epoch(1),
            stream: StreamId(2),
            seq: 3,
        };
        let lines = split(data);
        let prefix = id_prefix(id.epoch, id.stream);
        let mut v = vec![0; framed_len(&prefix, id.seq, t, data, lines)];
        write_frame(&mut v, &prefix, id.seq, t, data, lines);
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
        let long = "y".repeat(100) + "\n" + &"z".repeat(40) + "\r" + &"w".repeat(70);
        assert_eq!(
            frame(None, long.as_bytes()),
            format!(
                "{id}data: {}\ndata: {}\ndata: {}\n\n",
                "y".repeat(100),
                "z".repeat(40),
                "w".repeat(70)
            )
        );
    }
}
