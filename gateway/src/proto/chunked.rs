//! The decoder of `Transfer-Encoding: chunked` request bodies (RFC 9112 §7.1): streaming, in
//! place and bounded. It decodes inside the request buffer: the body decoded so far sits at the
//! front, the bytes received after it (not yet decoded) follow, and each call moves newly
//! arrived chunk data down onto the body's end, so the buffer never holds more than the body
//! plus one incomplete line. Chunk extensions are ignored, trailer fields read and discarded
//! (within their own byte limit), and the final `0` chunk with the blank line after the
//! trailers is required: a body without it is incomplete, never done.
//!
//! Strict where leniency lets two parsers disagree (request smuggling): lines end in CRLF only
//! (a bare CR or LF is refused), a chunk size is hex digits only (no sign, no `0x`, no
//! whitespace before it) that must fit in 64 bits, data must be followed by CRLF, and a
//! trailer line starting with whitespace (obs-fold) is refused. No I/O, no clock.
#![forbid(unsafe_code)]

/// Limits of one chunked body (flags, checked at start).
#[derive(Debug, Clone, Copy)]
pub struct ChunkLimits {
    /// Decoded body bytes; above it: [`ChunkError::TooLarge`] (413).
    pub body_bytes_max: usize,
    /// Bytes of one chunk-size line, extensions included, and of all trailer lines together
    /// (the head limit, `--header-bytes-max`).
    pub line_bytes_max: usize,
}

/// How a chunked body is malformed or too large; each names the peer's exact violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkError {
    /// A chunk-size line that does not start with hex digits, or has something other than an
    /// extension (`;…`) after them → 400.
    BadSize,
    /// A chunk size that does not fit in 64 bits → 400.
    SizeOverflow,
    /// A chunk extension with a control character → 400.
    BadExtension,
    /// A line ending other than CRLF (a bare CR or LF) → 400.
    BadLineEnding,
    /// Chunk data not followed by CRLF → 400.
    MissingDataEnd,
    /// A trailer line that is not a `name: value` field (or is an obs-fold) → 400.
    BadTrailer,
    /// A chunk-size line longer than the limit → 400.
    LineTooLong,
    /// Trailer fields beyond the head limit → 431.
    TrailersTooLarge,
    /// The decoded body would exceed `body_bytes_max` → 413.
    TooLarge { limit: usize },
}

impl ChunkError {
    /// Status code, short machine code and human message for the JSON error body.
    pub fn status(&self) -> (u16, &'static str, String) {
        let bad = |what: &str| (400, "bad_chunked_body", format!("chunked body: {what}"));
        match self {
            ChunkError::BadSize => bad("chunk size is not hex digits"),
            ChunkError::SizeOverflow => bad("chunk size does not fit in 64 bits"),
            ChunkError::BadExtension => bad("chunk extension holds a control character"),
            ChunkError::BadLineEnding => bad("line not ended by CRLF"),
            ChunkError::MissingDataEnd => bad("chunk data not followed by CRLF"),
            ChunkError::BadTrailer => bad("trailer is not a header field"),
            ChunkError::LineTooLong => bad("chunk-size line exceeds --header-bytes-max"),
            ChunkError::TrailersTooLarge => (
                431,
                "headers_too_large",
                "chunked body trailers exceed --header-bytes-max".into(),
            ),
            ChunkError::TooLarge { limit } => (
                413,
                "body_too_large",
                format!("chunked body exceeds the limit of {limit}"),
            ),
        }
    }
}

/// What a call to [`Decoder::decode`] left in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// More bytes are needed: `buf[..len]` is the body so far followed by bytes not decoded
    /// yet (at most an incomplete line); the next bytes received go after them.
    More { len: usize },
    /// The body is complete: `buf[..body]`; the `rest` bytes received after the final chunk
    /// (a pipelined request) were moved to follow it, `buf[body..body + rest]`.
    Done { body: usize, rest: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk's data, `left` bytes of it to come.
    Data { left: u64 },
    /// After a chunk's data: expecting its CRLF.
    DataEnd,
    /// After the last (`0`) chunk: trailer lines until a blank one.
    Trailer,
}

/// The decoding state of one chunked body.
#[derive(Debug, Clone)]
pub struct Decoder {
    state: State,
    /// Decoded body bytes, at the front of the buffer.
    body: usize,
    /// Trailer bytes read so far (bounded by `line_bytes_max`).
    trailer_bytes: usize,
}

impl Default for Decoder {
    fn default() -> Decoder {
        Decoder::new()
    }
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder {
            state: State::Size,
            body: 0,
            trailer_bytes: 0,
        }
    }

    /// Decoded body bytes so far.
    pub fn body_len(&self) -> usize {
        self.body
    }

    /// Decodes what it can of `buf`, whose first [`Decoder::body_len`] bytes are the body
    /// decoded so far and the rest bytes received after them. After an error the decoder and
    /// the buffer are spent (the connection closes).
    pub fn decode(&mut self, buf: &mut [u8], lim: &ChunkLimits) -> Result<Progress, ChunkError> {
        let mut r = self.body; // the next undecoded byte
        loop {
            match self.step(buf, r, lim)? {
                Next::At(next) => r = next,
                Next::Wait => break,
                Next::End(end) => {
                    let rest = buf.len() - end;
                    buf.copy_within(end.., self.body);
                    return Ok(Progress::Done {
                        body: self.body,
                        rest,
                    });
                }
            }
        }
        let rest = buf.len() - r;
        buf.copy_within(r.., self.body);
        Ok(Progress::More {
            len: self.body + rest,
        })
    }

    /// Decodes one element (a size line, data, a data end, a trailer line) at `buf[r..]`.
    fn step(&mut self, buf: &mut [u8], r: usize, lim: &ChunkLimits) -> Result<Next, ChunkError> {
        match self.state {
            State::Size => {
                let Some(end) = line_end(&buf[r..], lim.line_bytes_max)? else {
                    return Ok(Next::Wait);
                };
                let size = parse_size(&buf[r..r + end])?;
                if size > (lim.body_bytes_max - self.body) as u64 {
                    return Err(ChunkError::TooLarge {
                        limit: lim.body_bytes_max,
                    });
                }
                self.state = match size {
                    0 => State::Trailer,
                    left => State::Data { left },
                };
                Ok(Next::At(r + end + 2))
            }
            State::Data { left } => {
                let n = (buf.len() - r).min(usize::try_from(left).unwrap_or(usize::MAX));
                if n == 0 {
                    return Ok(Next::Wait);
                }
                buf.copy_within(r..r + n, self.body);
                self.body += n;
                self.state = match left - n as u64 {
                    0 => State::DataEnd,
                    left => State::Data { left },
                };
                Ok(Next::At(r + n))
            }
            State::DataEnd => {
                let have = &buf[r..buf.len().min(r + 2)];
                if !b"\r\n".starts_with(have) {
                    return Err(ChunkError::MissingDataEnd);
                }
                if have.len() < 2 {
                    return Ok(Next::Wait);
                }
                self.state = State::Size;
                Ok(Next::At(r + 2))
            }
            State::Trailer => {
                let room = lim.line_bytes_max.saturating_sub(self.trailer_bytes);
                let end = match line_end(&buf[r..], room) {
                    Ok(Some(end)) => end,
                    Ok(None) => return Ok(Next::Wait),
                    Err(ChunkError::LineTooLong) => return Err(ChunkError::TrailersTooLarge),
                    Err(e) => return Err(e),
                };
                self.trailer_bytes += end + 2;
                if end == 0 {
                    return Ok(Next::End(r + 2));
                }
                check_trailer(&buf[r..r + end])?;
                Ok(Next::At(r + end + 2))
            }
        }
    }
}

/// Where decoding goes after one step.
enum Next {
    /// On at this offset.
    At(usize),
    /// The next element has not fully arrived.
    Wait,
    /// The body ended; the bytes from this offset on are the next request's.
    End(usize),
}

/// Where the line at the start of `b` ends (the index of its CR), if its CRLF has arrived.
/// A bare CR or LF is refused; a line longer than `max` (complete or not) is too long.
fn line_end(b: &[u8], max: usize) -> Result<Option<usize>, ChunkError> {
    let Some(i) = b.iter().position(|&c| c == b'\r' || c == b'\n') else {
        return if b.len() > max {
            Err(ChunkError::LineTooLong)
        } else {
            Ok(None)
        };
    };
    if i + 2 > max {
        return Err(ChunkError::LineTooLong);
    }
    match (b[i], b.get(i + 1)) {
        (b'\r', Some(b'\n')) => Ok(Some(i)),
        (b'\r', None) => Ok(None),
        _ => Err(ChunkError::BadLineEnding),
    }
}

/// `chunk-size [ chunk-ext ]`: hex digits, then nothing or `;`-led extensions (optionally
/// after spaces or tabs), which are ignored but may hold no control character.
fn parse_size(line: &[u8]) -> Result<u64, ChunkError> {
    let digits = line.iter().take_while(|c| c.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(ChunkError::BadSize);
    }
    let mut size: u64 = 0;
    for &c in &line[..digits] {
        let d = (c as char).to_digit(16).expect("a hex digit") as u64;
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(d))
            .ok_or(ChunkError::SizeOverflow)?;
    }
    let ext = &line[digits..];
    let after_ws = ext.iter().position(|&c| c != b' ' && c != b'\t');
    match after_ws.map(|i| ext[i]) {
        None if ext.is_empty() => Ok(size),
        Some(b';') if ext.iter().all(|&c| c == b'\t' || !c.is_ascii_control()) => Ok(size),
        Some(b';') => Err(ChunkError::BadExtension),
        _ => Err(ChunkError::BadSize),
    }
}

/// A trailer line: `name: value`, the name a token (so no leading whitespace: obs-fold).
fn check_trailer(line: &[u8]) -> Result<(), ChunkError> {
    let colon = line.iter().position(|&c| c == b':');
    let name_ok = |n: &[u8]| {
        !n.is_empty()
            && n.iter()
                .all(|&c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c))
    };
    match colon {
        Some(i)
            if name_ok(&line[..i]) && line.iter().all(|&c| c == b'\t' || !c.is_ascii_control()) =>
        {
            Ok(())
        }
        _ => Err(ChunkError::BadTrailer),
    }
}

#[cfg(test)]
mod tests;
