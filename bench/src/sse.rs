//! Minimal streaming SSE parser for the load generator: finds `id:`, `event:` and the first
//! bytes of `data:` of each event, across arbitrary read boundaries, without allocating.
//!
//! It does not keep whole events: only a fixed-size prefix of each line is carried between reads
//! (enough for our payload header and IDs), so memory per connection is constant. It accepts LF
//! and CRLF line endings; a lone CR as a line terminator (legal in SSE, unused by HTTP servers we
//! target) is not recognised. Field semantics follow the WHATWG EventSource rules we need: the
//! last event ID persists across events, an event with no `data:` line is not dispatched,
//! comments (`:` lines) and `retry:` are ignored.

/// Bytes of a line kept when the line spans reads; longer lines keep only this prefix.
pub const LINE_KEEP_BYTES: usize = DATA_PREFIX_BYTES_MAX + 16;
/// Longest event ID we store; a longer ID is reported as `id_too_long`.
pub const ID_BYTES_MAX: usize = 96;
/// Longest `event:` type we store (longer types are cut, which is fine for classification).
pub const EVENT_TYPE_BYTES_MAX: usize = 32;
/// Bytes of the first `data:` line kept by default (enough for the bench's payload header).
pub const DATA_PREFIX_BYTES: usize = 64;
/// Most bytes of the first `data:` line a parser can be asked to keep
/// ([`SseParser::with_data_keep_bytes`], for JSON messages such as MCP's).
pub const DATA_PREFIX_BYTES_MAX: usize = 1024;

/// One dispatched event, borrowed from the parser's fixed buffers.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    /// The last event ID in effect when the event was dispatched (may be empty).
    pub id: &'a [u8],
    /// True when an `id:` line was longer than [`ID_BYTES_MAX`] and could not be kept.
    pub id_too_long: bool,
    /// The `event:` type, empty for the default `message` type.
    pub event_type: &'a [u8],
    /// The first bytes (the parser's data keep, [`DATA_PREFIX_BYTES`] by default) of the first
    /// `data:` line.
    pub data_prefix: &'a [u8],
    /// Number of `data:` lines in the event.
    pub data_lines: u32,
}

/// Streaming SSE parser state for one connection.
#[derive(Debug, Clone)]
pub struct SseParser {
    carry: [u8; LINE_KEEP_BYTES],
    carry_len: usize,
    carry_total: usize,
    id: [u8; ID_BYTES_MAX],
    id_len: usize,
    id_too_long: bool,
    /// The "last event ID string": the ID buffer as of the last dispatch (blank line). This,
    /// not the buffer, is what a client resumes from: an `id:` line of an event cut before its
    /// blank line must not be resumed from.
    committed: [u8; ID_BYTES_MAX],
    committed_len: usize,
    event_type: [u8; EVENT_TYPE_BYTES_MAX],
    event_type_len: usize,
    data: [u8; DATA_PREFIX_BYTES_MAX],
    data_len: usize,
    data_keep: usize,
    data_lines: u32,
    comments: u64,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self {
            carry: [0; LINE_KEEP_BYTES],
            carry_len: 0,
            carry_total: 0,
            id: [0; ID_BYTES_MAX],
            id_len: 0,
            id_too_long: false,
            committed: [0; ID_BYTES_MAX],
            committed_len: 0,
            event_type: [0; EVENT_TYPE_BYTES_MAX],
            event_type_len: 0,
            data: [0; DATA_PREFIX_BYTES_MAX],
            data_len: 0,
            data_keep: DATA_PREFIX_BYTES,
            data_lines: 0,
            comments: 0,
        }
    }

    /// A parser keeping up to `n` bytes (at most [`DATA_PREFIX_BYTES_MAX`]) of each event's
    /// first data line.
    pub fn with_data_keep_bytes(n: usize) -> Self {
        let mut p = Self::new();
        p.data_keep = n.min(DATA_PREFIX_BYTES_MAX);
        p
    }

    /// Forget any partial event and line (a new connection). The last event ID string is
    /// kept: a resumed connection continues after the ID it sent.
    pub fn reset(&mut self) {
        self.carry_len = 0;
        self.carry_total = 0;
        self.event_type_len = 0;
        self.data_len = 0;
        self.data_lines = 0;
        self.id[..self.committed_len].copy_from_slice(&self.committed[..self.committed_len]);
        self.id_len = self.committed_len;
        self.id_too_long = false;
    }

    /// The last event ID string: the ID in effect at the last complete event (what a client
    /// sends as `Last-Event-ID`). Empty before any ID.
    pub fn last_id(&self) -> &[u8] {
        &self.committed[..self.committed_len]
    }

    /// Number of comment lines seen (keep-alives).
    pub fn comments(&self) -> u64 {
        self.comments
    }

    /// True when the parser holds part of an event (a partial line or undispatched fields).
    pub fn mid_event(&self) -> bool {
        self.carry_total > 0 || self.data_lines > 0 || self.event_type_len > 0
    }

    /// Consume bytes of the body; calls `on_event` for every complete event.
    pub fn feed(&mut self, mut buf: &[u8], on_event: &mut impl FnMut(Event<'_>)) {
        while !buf.is_empty() {
            match memchr::memchr(b'\n', buf) {
                Some(i) => {
                    if self.carry_total == 0 {
                        self.handle_line(&buf[..i], false, on_event);
                    } else {
                        self.append_carry(&buf[..i]);
                        let mut line = [0u8; LINE_KEEP_BYTES];
                        let n = self.carry_len;
                        line[..n].copy_from_slice(&self.carry[..n]);
                        let cut = self.carry_total > LINE_KEEP_BYTES;
                        self.carry_len = 0;
                        self.carry_total = 0;
                        self.handle_line(&line[..n], cut, on_event);
                    }
                    buf = &buf[i + 1..];
                }
                None => {
                    self.append_carry(buf);
                    break;
                }
            }
        }
    }

    fn append_carry(&mut self, part: &[u8]) {
        let room = LINE_KEEP_BYTES - self.carry_len;
        let n = part.len().min(room);
        self.carry[self.carry_len..self.carry_len + n].copy_from_slice(&part[..n]);
        self.carry_len += n;
        self.carry_total += part.len();
    }

    /// `cut`: the line was longer than [`LINE_KEEP_BYTES`] and only its prefix is here.
    fn handle_line(&mut self, mut line: &[u8], cut: bool, on_event: &mut impl FnMut(Event<'_>)) {
        if !cut && line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        if line.is_empty() {
            self.dispatch(on_event);
            return;
        }
        if line[0] == b':' {
            self.comments += 1;
            return;
        }
        let (name, mut value) = match line.iter().position(|&b| b == b':') {
            Some(c) => (&line[..c], &line[c + 1..]),
            None => (line, &line[line.len()..]),
        };
        if value.first() == Some(&b' ') {
            value = &value[1..];
        }
        match name {
            b"data" => {
                if self.data_lines == 0 {
                    let n = value.len().min(self.data_keep);
                    self.data[..n].copy_from_slice(&value[..n]);
                    self.data_len = n;
                }
                self.data_lines += 1;
            }
            // WHATWG: an ID containing NUL is ignored.
            b"id" if !value.contains(&0) => {
                if cut || value.len() > ID_BYTES_MAX {
                    self.id_len = 0;
                    self.id_too_long = true;
                } else {
                    self.id[..value.len()].copy_from_slice(value);
                    self.id_len = value.len();
                    self.id_too_long = false;
                }
            }
            b"event" => {
                let n = value.len().min(EVENT_TYPE_BYTES_MAX);
                self.event_type[..n].copy_from_slice(&value[..n]);
                self.event_type_len = n;
            }
            _ => {} // retry and unknown fields are ignored
        }
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
        self.committed[..self.id_len].copy_from_slice(&self.id[..self.id_len]);
        self.committed_len = self.id_len;
        if self.data_lines > 0 {
            on_event(Event {
                id: &self.id[..self.id_len],
                id_too_long: self.id_too_long,
                event_type: &self.event_type[..self.event_type_len],
                data_prefix: &self.data[..self.data_len],
                data_lines: self.data_lines,
            });
        }
        self.event_type_len = 0;
        self.data_len = 0;
        self.data_lines = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Owned {
        id: Vec<u8>,
        event_type: Vec<u8>,
        data: Vec<u8>,
        lines: u32,
    }

    fn parse_in_pieces(input: &[u8], piece: usize) -> Vec<Owned> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for chunk in input.chunks(piece) {
            p.feed(chunk, &mut |e| {
                out.push(Owned {
                    id: e.id.to_vec(),
                    event_type: e.event_type.to_vec(),
                    data: e.data_prefix.to_vec(),
                    lines: e.data_lines,
                })
            });
        }
        out
    }

    const STREAM: &[u8] = b": hi\nretry: 1000\n\nid: 1-a-1\ndata: one\n\nid: 1-a-2\r\nevent: truncated\r\ndata: {\"floor\":5}\r\n\r\nid:1-a-3\ndata:x\ndata: y\n\n";

    #[test]
    fn every_split_point_gives_the_same_events() {
        let whole = parse_in_pieces(STREAM, STREAM.len());
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[0].id, b"1-a-1");
        assert_eq!(whole[0].data, b"one");
        assert_eq!(whole[1].event_type, b"truncated");
        assert_eq!(whole[1].data, b"{\"floor\":5}");
        assert_eq!(whole[2].id, b"1-a-3");
        assert_eq!(whole[2].data, b"x");
        assert_eq!(whole[2].lines, 2);
        for piece in 1..STREAM.len() {
            assert_eq!(parse_in_pieces(STREAM, piece), whole, "piece size {piece}");
        }
    }

    #[test]
    fn event_without_data_is_not_dispatched_but_id_persists() {
        let ev = parse_in_pieces(b"id: 7\n\ndata: a\n\n", 3);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].id, b"7");
    }

    #[test]
    fn long_data_line_keeps_prefix_and_next_event_is_clean() {
        let mut input = b"id: 1\ndata: ".to_vec();
        input.extend(std::iter::repeat_n(b'z', 5000));
        input.extend_from_slice(b"\n\nid: 2\ndata: b\n\n");
        let ev = parse_in_pieces(&input, 7);
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].data.len(), DATA_PREFIX_BYTES);
        assert_eq!(ev[1].id, b"2");
        assert_eq!(ev[1].data, b"b");
    }

    #[test]
    fn overlong_id_is_flagged() {
        let mut input = b"id: ".to_vec();
        input.extend(std::iter::repeat_n(b'9', ID_BYTES_MAX + 1));
        input.extend_from_slice(b"\ndata: a\n\n");
        let mut p = SseParser::new();
        let mut flagged = false;
        p.feed(&input, &mut |e| flagged = e.id_too_long && e.id.is_empty());
        assert!(flagged);
    }

    #[test]
    fn id_of_an_unfinished_event_is_not_resumed_from() {
        let mut p = SseParser::new();
        p.feed(b"id: 1\ndata: a\n\nid: 2\ndata: b", &mut |_| {});
        assert_eq!(p.last_id(), b"1");
        p.reset();
        let mut ids = Vec::new();
        p.feed(b"data: c\n\n", &mut |e| ids.push(e.id.to_vec()));
        assert_eq!(ids, vec![b"1".to_vec()]);
        p.feed(b"id: 3\ndata: d\n\n", &mut |_| {});
        assert_eq!(p.last_id(), b"3");
    }

    #[test]
    fn mid_event_tracks_partial_state() {
        let mut p = SseParser::new();
        let mut n = 0;
        p.feed(b"id: 1\ndata: a", &mut |_| n += 1);
        assert!(p.mid_event());
        p.feed(b"\n\n", &mut |_| n += 1);
        assert!(!p.mid_event());
        assert_eq!(n, 1);
    }
}
