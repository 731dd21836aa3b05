//! Event identity: [`Epoch`], [`StreamId`], [`Seq`] and the textual [`EventId`]
//! `"{epoch:016x}-{stream}-{seq}"` with a strict parser. No I/O, no allocation on parse.
//!
//! Format (the only accepted one): the epoch as exactly 16 lowercase hexadecimal digits, `-`,
//! the stream id in decimal, `-`, the sequence in decimal. Decimal fields have no sign, no
//! leading zeros (`0` itself is allowed) and must fit their type (`u32`, `u64`). Nothing else is
//! accepted: no whitespace, no uppercase hex, no trailing bytes.
#![forbid(unsafe_code)]

use std::fmt;
use std::str::FromStr;

/// Random identity of one log directory, chosen when it is created. Event IDs carry it so a
/// resume against a recreated log (same sequence numbers, different content) is detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epoch(pub u64);

/// Dense per-log stream number: 0, 1, 2, ... in creation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

/// Per-stream dense sequence number 1, 2, 3, ...; 0 means "before the first event".
pub type Seq = u64;

/// One event's identity; its `Display` is the SSE `id:` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId {
    pub epoch: Epoch,
    pub stream: StreamId,
    pub seq: Seq,
}

/// Longest valid textual event ID: 16 + 1 + 10 (u32::MAX) + 1 + 20 (u64::MAX).
pub const EVENT_ID_BYTES_MAX: usize = 48;

/// Why a textual event ID was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventIdError {
    /// The input is empty.
    Empty,
    /// The input is longer than [`EVENT_ID_BYTES_MAX`] bytes.
    TooLong,
    /// A `-` separated field is absent (`"epoch"`, `"stream"` or `"seq"`).
    MissingField(&'static str),
    /// The epoch is not exactly 16 lowercase hexadecimal digits.
    BadEpoch,
    /// The stream field is empty or contains a byte other than `0-9`.
    BadStream,
    /// The sequence field is empty or contains a byte other than `0-9` (this includes a third `-`).
    BadSeq,
    /// A decimal field has a leading zero (`"07"`).
    LeadingZero,
    /// A decimal field does not fit its type.
    Overflow,
}

impl fmt::Display for EventIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventIdError::Empty => write!(f, "event id is empty"),
            EventIdError::TooLong => {
                write!(f, "event id is longer than {EVENT_ID_BYTES_MAX} bytes")
            }
            EventIdError::MissingField(name) => write!(f, "event id lacks the {name} field"),
            EventIdError::BadEpoch => {
                write!(f, "event id epoch is not 16 lowercase hexadecimal digits")
            }
            EventIdError::BadStream => write!(f, "event id stream is not a decimal number"),
            EventIdError::BadSeq => write!(f, "event id sequence is not a decimal number"),
            EventIdError::LeadingZero => write!(f, "event id has a number with a leading zero"),
            EventIdError::Overflow => write!(f, "event id has a number that is too large"),
        }
    }
}

impl std::error::Error for EventIdError {}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; EVENT_ID_BYTES_MAX];
        let n = self.encode(&mut buf);
        // The encoder writes ASCII only.
        f.write_str(std::str::from_utf8(&buf[..n]).map_err(|_| fmt::Error)?)
    }
}

impl EventId {
    /// Writes the textual form into `out` (at least [`EVENT_ID_BYTES_MAX`] bytes) and returns
    /// its length. Allocation-free; used by the SSE framer.
    pub fn encode(&self, out: &mut [u8]) -> usize {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for i in 0..16 {
            out[i] = HEX[((self.epoch.0 >> ((15 - i) * 4)) & 0xf) as usize];
        }
        out[16] = b'-';
        let mut n = 17;
        n += encode_decimal(u64::from(self.stream.0), &mut out[n..]);
        out[n] = b'-';
        n += 1;
        n += encode_decimal(self.seq, &mut out[n..]);
        n
    }

    /// Length of the textual form, without formatting it.
    pub fn encoded_len(&self) -> usize {
        16 + 1 + decimal_len(u64::from(self.stream.0)) + 1 + decimal_len(self.seq)
    }
}

/// Number of decimal digits of `v` (1 for 0).
pub(crate) fn decimal_len(v: u64) -> usize {
    let mut n = 1;
    let mut x = v;
    while x >= 10 {
        x /= 10;
        n += 1;
    }
    n
}

/// "00" "01" ... "99": two digits per division.
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Writes `v` in decimal into `out` and returns the number of digits.
pub(crate) fn encode_decimal(v: u64, out: &mut [u8]) -> usize {
    let n = decimal_len(v);
    let mut x = v;
    let mut i = n;
    while x >= 100 {
        let pair = (x % 100) as usize * 2;
        x /= 100;
        i -= 2;
        out[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if x >= 10 {
        let pair = x as usize * 2;
        out[i - 2..i].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        out[i - 1] = b'0' + x as u8;
    }
    n
}

fn parse_decimal(s: &[u8], bad: EventIdError) -> Result<u64, EventIdError> {
    if s.is_empty() {
        return Err(bad);
    }
    if !s.iter().all(u8::is_ascii_digit) {
        return Err(bad);
    }
    if s.len() > 1 && s[0] == b'0' {
        return Err(EventIdError::LeadingZero);
    }
    let mut v: u64 = 0;
    for &b in s {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or(EventIdError::Overflow)?;
    }
    Ok(v)
}

impl FromStr for EventId {
    type Err = EventIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let b = s.as_bytes();
        if b.is_empty() {
            return Err(EventIdError::Empty);
        }
        if b.len() > EVENT_ID_BYTES_MAX {
            return Err(EventIdError::TooLong);
        }
        let mut parts = b.splitn(3, |&c| c == b'-');
        let epoch = parts.next().ok_or(EventIdError::MissingField("epoch"))?;
        let stream = parts.next().ok_or(EventIdError::MissingField("stream"))?;
        let seq = parts.next().ok_or(EventIdError::MissingField("seq"))?;
        if epoch.len() != 16 || !epoch.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(EventIdError::BadEpoch);
        }
        let epoch = epoch.iter().fold(0u64, |acc, &c| {
            let d = if c.is_ascii_digit() {
                c - b'0'
            } else {
                c - b'a' + 10
            };
            (acc << 4) | u64::from(d)
        });
        let stream = parse_decimal(stream, EventIdError::BadStream)?;
        let stream = u32::try_from(stream).map_err(|_| EventIdError::Overflow)?;
        let seq = parse_decimal(seq, EventIdError::BadSeq)?;
        Ok(EventId {
            epoch: Epoch(epoch),
            stream: StreamId(stream),
            seq,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn formats_documented_shape() {
        let id = EventId {
            epoch: Epoch(0xab),
            stream: StreamId(7),
            seq: 0,
        };
        assert_eq!(id.to_string(), "00000000000000ab-7-0");
        assert_eq!(id.encoded_len(), id.to_string().len());
        let max = EventId {
            epoch: Epoch(u64::MAX),
            stream: StreamId(u32::MAX),
            seq: u64::MAX,
        };
        assert_eq!(max.to_string().len(), EVENT_ID_BYTES_MAX);
        assert_eq!(max.to_string().parse::<EventId>(), Ok(max));
    }

    #[test]
    fn rejects_malformed_precisely() {
        let e = |s: &str| s.parse::<EventId>().unwrap_err();
        assert_eq!(e(""), EventIdError::Empty);
        assert_eq!(e(&"0".repeat(49)), EventIdError::TooLong);
        assert_eq!(e("00000000000000ab"), EventIdError::MissingField("stream"));
        assert_eq!(e("00000000000000ab-1"), EventIdError::MissingField("seq"));
        assert_eq!(e("00000000000000AB-1-2"), EventIdError::BadEpoch);
        assert_eq!(e("0000000000000ab-1-2"), EventIdError::BadEpoch);
        assert_eq!(e("000000000000000ab-1-2"), EventIdError::BadEpoch);
        assert_eq!(e("00000000000000ab--2"), EventIdError::BadStream);
        assert_eq!(e("00000000000000ab-+1-2"), EventIdError::BadStream);
        assert_eq!(e("00000000000000ab-1-"), EventIdError::BadSeq);
        assert_eq!(e("00000000000000ab-1-2 "), EventIdError::BadSeq);
        assert_eq!(e("00000000000000ab-1-2-3"), EventIdError::BadSeq);
        assert_eq!(e(" 00000000000000ab-1-2"), EventIdError::BadEpoch);
        assert_eq!(e("00000000000000ab-01-2"), EventIdError::LeadingZero);
        assert_eq!(e("00000000000000ab-1-00"), EventIdError::LeadingZero);
        assert_eq!(e("00000000000000ab-4294967296-2"), EventIdError::Overflow);
        assert_eq!(
            e("00000000000000ab-1-18446744073709551616"),
            EventIdError::Overflow
        );
    }

    proptest! {
        #[test]
        fn round_trips(epoch: u64, stream: u32, seq: u64) {
            let id = EventId { epoch: Epoch(epoch), stream: StreamId(stream), seq };
            let s = id.to_string();
            prop_assert_eq!(s.len(), id.encoded_len());
            prop_assert_eq!(s.parse::<EventId>(), Ok(id));
        }

        #[test]
        fn parse_never_panics_and_accepts_only_canonical(s in "[0-9a-fA-F+ -]{0,60}") {
            if let Ok(id) = s.parse::<EventId>() {
                // Strict: anything accepted is exactly the canonical rendering.
                prop_assert_eq!(id.to_string(), s);
            }
        }
    }
}
