//! The bench's event payload: a fixed-width ASCII header carrying the per-stream publish
//! counter and the publish time, padded to the requested size.
//!
//! Layout: `c` + 16 lowercase hex digits (counter) + `t` + 16 hex digits (ns since the run's
//! origin) + `x` padding. No newlines, so one SSE `data:` line carries it. It does not encode
//! the stream: the subscriber knows which stream it subscribed to.

/// Bytes of the header; payloads are at least this long.
pub const PAYLOAD_HEADER_BYTES: usize = 34;

/// Why a received payload could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadError {
    /// Fewer than [`PAYLOAD_HEADER_BYTES`] bytes.
    TooShort(usize),
    /// Missing `c` / `t` marker at the given offset.
    BadMarker(usize),
    /// A non-hex byte at the given offset.
    BadHex(usize),
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Append a payload of `bytes` (at least [`PAYLOAD_HEADER_BYTES`]) to `out`.
pub fn write_payload(out: &mut Vec<u8>, counter: u64, t_ns: u64, bytes: usize) {
    assert!(bytes >= PAYLOAD_HEADER_BYTES, "payload below header size");
    out.push(b'c');
    write_hex(out, counter);
    out.push(b't');
    write_hex(out, t_ns);
    out.resize(out.len() + (bytes - PAYLOAD_HEADER_BYTES), b'x');
}

fn write_hex(out: &mut Vec<u8>, v: u64) {
    let mut digits = [0u8; 16];
    for (i, d) in digits.iter_mut().enumerate() {
        *d = HEX[((v >> (60 - 4 * i)) & 0xf) as usize];
    }
    out.extend_from_slice(&digits);
}

/// Decode `(counter, t_ns)` from the start of a payload.
pub fn parse_payload(p: &[u8]) -> Result<(u64, u64), PayloadError> {
    if p.len() < PAYLOAD_HEADER_BYTES {
        return Err(PayloadError::TooShort(p.len()));
    }
    if p[0] != b'c' {
        return Err(PayloadError::BadMarker(0));
    }
    if p[17] != b't' {
        return Err(PayloadError::BadMarker(17));
    }
    Ok((parse_hex(p, 1)?, parse_hex(p, 18)?))
}

fn parse_hex(p: &[u8], at: usize) -> Result<u64, PayloadError> {
    let mut v = 0u64;
    for (i, &b) in p[at..at + 16].iter().enumerate() {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return Err(PayloadError::BadHex(at + i)),
        };
        v = (v << 4) | u64::from(d);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_size() {
        let mut b = Vec::new();
        write_payload(&mut b, 0xdead_beef, u64::MAX - 3, 256);
        assert_eq!(b.len(), 256);
        assert!(!b.contains(&b'\n'));
        assert_eq!(parse_payload(&b), Ok((0xdead_beef, u64::MAX - 3)));
    }

    #[test]
    fn rejects_foreign_payloads() {
        assert_eq!(parse_payload(b"hello"), Err(PayloadError::TooShort(5)));
        let mut b = Vec::new();
        write_payload(&mut b, 1, 2, 40);
        b[5] = b'G';
        assert_eq!(parse_payload(&b), Err(PayloadError::BadHex(5)));
        b[0] = b'x';
        assert_eq!(parse_payload(&b), Err(PayloadError::BadMarker(0)));
    }
}
