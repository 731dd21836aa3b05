//! Streaming decoder for HTTP/1.1 `Transfer-Encoding: chunked` bodies (nchan's eventsource
//! responses use it): hands out the data slices without copying, across read boundaries.
//!
//! It does not keep chunk extensions or trailers (they are skipped), and it does not allocate.

/// Largest chunk size accepted (a bigger size line is a protocol error, not a huge allocation).
pub const CHUNK_BYTES_MAX: u64 = 1 << 32;

/// Why a chunked body is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkError {
    /// A chunk-size line starts with or contains a byte that is not a hex digit.
    BadSizeByte(u8),
    /// The chunk-size line names more than [`CHUNK_BYTES_MAX`] bytes.
    SizeTooLarge,
    /// Chunk data is not followed by CRLF.
    MissingDataCrlf(u8),
    /// Bytes arrived after the terminating zero-size chunk and its trailer.
    DataAfterEnd,
}

impl std::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChunkError::BadSizeByte(b) => write!(f, "chunk size line has byte 0x{b:02x}"),
            ChunkError::SizeTooLarge => write!(f, "chunk size above {CHUNK_BYTES_MAX} bytes"),
            ChunkError::MissingDataCrlf(b) => {
                write!(f, "chunk data not followed by CRLF (0x{b:02x})")
            }
            ChunkError::DataAfterEnd => write!(f, "bytes after the last chunk"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a size line (`digits` seen so far).
    Size {
        value: u64,
        digits: u32,
    },
    /// In a chunk extension, until LF.
    SizeExt {
        value: u64,
    },
    /// Chunk data with this many bytes left.
    Data(u64),
    DataCr,
    DataLf,
    /// After the zero chunk: trailer lines until an empty line. `line_bytes` of the current line.
    Trailer {
        line_bytes: u64,
    },
    Done,
}

/// Chunked-body decoder state for one response.
#[derive(Debug, Clone)]
pub struct Dechunker {
    state: State,
}

impl Default for Dechunker {
    fn default() -> Self {
        Self::new()
    }
}

impl Dechunker {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        Self {
            state: State::Size {
                value: 0,
                digits: 0,
            },
        }
    }

    /// True after the terminating zero-size chunk and trailer: the body is complete.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consume bytes; calls `on_data` with each piece of chunk data. Returns the bytes
    /// consumed: fewer than `buf.len()` only when the body ended inside `buf` (the rest belongs
    /// to the next response). Feeding bytes to a finished body is [`ChunkError::DataAfterEnd`].
    pub fn feed(
        &mut self,
        buf: &[u8],
        on_data: &mut impl FnMut(&[u8]),
    ) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < buf.len() {
            match self.state {
                State::Size { value, digits } => {
                    let b = buf[i];
                    i += 1;
                    self.state = Self::after_size_byte(value, digits, b)?;
                }
                State::SizeExt { value } => match memchr::memchr(b'\n', &buf[i..]) {
                    Some(p) => {
                        i += p + 1;
                        self.state = Self::after_size(value);
                    }
                    None => i = buf.len(),
                },
                State::Data(left) => {
                    let n = (buf.len() - i).min(usize::try_from(left).unwrap_or(usize::MAX));
                    on_data(&buf[i..i + n]);
                    i += n;
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        State::DataCr
                    } else {
                        State::Data(left)
                    };
                }
                State::DataCr => {
                    match buf[i] {
                        b'\r' => self.state = State::DataLf,
                        b'\n' => {
                            self.state = State::Size {
                                value: 0,
                                digits: 0,
                            }
                        }
                        b => return Err(ChunkError::MissingDataCrlf(b)),
                    }
                    i += 1;
                }
                State::DataLf => {
                    if buf[i] != b'\n' {
                        return Err(ChunkError::MissingDataCrlf(buf[i]));
                    }
                    i += 1;
                    self.state = State::Size {
                        value: 0,
                        digits: 0,
                    };
                }
                State::Trailer { line_bytes } => {
                    let b = buf[i];
                    i += 1;
                    self.state = Self::after_trailer_byte(line_bytes, b);
                }
                State::Done if i == 0 => return Err(ChunkError::DataAfterEnd),
                State::Done => return Ok(i),
            }
        }
        Ok(i)
    }

    /// The state after byte `b` of a size line that holds `value` in `digits` hex digits so
    /// far.
    fn after_size_byte(value: u64, digits: u32, b: u8) -> Result<State, ChunkError> {
        let d = match b {
            b'0'..=b'9' => u64::from(b - b'0'),
            b'a'..=b'f' => u64::from(b - b'a' + 10),
            b'A'..=b'F' => u64::from(b - b'A' + 10),
            b';' | b' ' | b'\t' | b'\r' if digits > 0 => return Ok(State::SizeExt { value }),
            b'\n' if digits > 0 => return Ok(Self::after_size(value)),
            _ => return Err(ChunkError::BadSizeByte(b)),
        };
        let value = value * 16 + d;
        if value > CHUNK_BYTES_MAX {
            return Err(ChunkError::SizeTooLarge);
        }
        Ok(State::Size {
            value,
            digits: digits + 1,
        })
    }

    /// The state after byte `b` of a trailer line with `line_bytes` bytes so far (an empty
    /// line ends the body).
    fn after_trailer_byte(line_bytes: u64, b: u8) -> State {
        match b {
            b'\n' if line_bytes == 0 => State::Done,
            b'\n' => State::Trailer { line_bytes: 0 },
            b'\r' => State::Trailer { line_bytes },
            _ => State::Trailer {
                line_bytes: line_bytes + 1,
            },
        }
    }

    fn after_size(value: u64) -> State {
        if value == 0 {
            State::Trailer { line_bytes: 0 }
        } else {
            State::Data(value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(input: &[u8], piece: usize) -> Result<(Vec<u8>, bool), ChunkError> {
        let mut d = Dechunker::new();
        let mut out = Vec::new();
        for c in input.chunks(piece) {
            let mut c = c;
            while !c.is_empty() {
                let used = d.feed(c, &mut |s| out.extend_from_slice(s))?;
                c = &c[used..];
            }
        }
        Ok((out, d.is_done()))
    }

    #[test]
    fn decodes_across_every_split() {
        let input = b"5\r\nhello\r\n1;ext=1\r\n \r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n";
        for piece in 1..=input.len() {
            let (out, done) = decode(input, piece).unwrap();
            assert_eq!(out, b"hello 0123456789", "piece {piece}");
            assert!(done);
        }
    }

    #[test]
    fn open_body_is_not_done() {
        let (out, done) = decode(b"3\r\nabc\r\n", 2).unwrap();
        assert_eq!(out, b"abc");
        assert!(!done);
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(decode(b"zz\r\n", 4), Err(ChunkError::BadSizeByte(b'z')));
        assert_eq!(
            decode(b"2\r\nabX", 9),
            Err(ChunkError::MissingDataCrlf(b'X'))
        );
        assert_eq!(
            decode(b"fffffffffff\r\n", 99),
            Err(ChunkError::SizeTooLarge)
        );
        assert_eq!(decode(b"0\r\n\r\nextra", 99), Err(ChunkError::DataAfterEnd));
    }
}
