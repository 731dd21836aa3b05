//! On-disk byte layout (see `DESIGN.md`): the 64-byte segment header, the 32-byte record entry
//! and the checkpoint file. Little-endian fixed-width fields, CRC32C checksums. Pure encode and
//! decode over byte slices; no I/O and no knowledge of the log's state.
#![forbid(unsafe_code)]

use crate::event_id::{Epoch, Seq, StreamId};

/// Segment header magic.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"SSELOGSG";
/// Checkpoint magic.
pub(crate) const CHECKPOINT_MAGIC: [u8; 8] = *b"SSELOGCK";
/// Segment header version written by this code. Version 2 = version 1 plus the *stream
/// removed* record kind, which only a version-2 segment may hold: a reader that predates the
/// kind refuses the header (`UnsupportedVersion`) instead of taking the record for a torn tail.
/// Version 3 = version 2 plus the *key* record kind, under the same rule.
pub(crate) const SEGMENT_VERSION: u32 = 3;
/// Oldest segment header version still read (logs written before stream removal existed).
pub(crate) const SEGMENT_VERSION_MIN: u32 = 1;
/// First segment header version whose segments may hold a *stream removed* record.
pub(crate) const STREAM_REMOVED_SINCE_VERSION: u32 = 2;
/// First segment header version whose segments may hold a *key* record.
pub(crate) const KEY_SINCE_VERSION: u32 = 3;
/// Checkpoint version written by this code (2: a tag byte per stream, live or removed);
/// version 1 (every stream live, no tag) is still read.
pub(crate) const CHECKPOINT_VERSION: u32 = 2;
pub(crate) const HEADER_BYTES: usize = 64;
pub(crate) const ENTRY_BYTES: usize = 32;
/// Header + one record entry + the seal entry always reserved for rolling.
pub(crate) const SEGMENT_OVERHEAD_BYTES: usize = HEADER_BYTES + 2 * ENTRY_BYTES;
/// Stream names are at most this long (UTF-8 bytes).
pub const STREAM_NAME_BYTES_MAX: usize = 1024;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Decoded segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// Format version (`SEGMENT_VERSION_MIN..=SEGMENT_VERSION`): decides which record kinds
    /// the segment may hold.
    pub version: u32,
    pub epoch: Epoch,
    pub number: u64,
    pub segment_bytes: u64,
    pub created_unix_ms: u64,
}

/// Why a header did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// Every byte is zero: the segment file was created but its header never reached the disk.
    Blank,
    BadMagic,
    BadChecksum,
    UnsupportedVersion(u32),
    BadHeaderBytes(u32),
}

impl Header {
    pub(crate) fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.epoch.0.to_le_bytes());
        b[24..32].copy_from_slice(&self.number.to_le_bytes());
        b[32..40].copy_from_slice(&self.segment_bytes.to_le_bytes());
        b[40..48].copy_from_slice(&self.created_unix_ms.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The header's CRC: the chain seed of the segment's first entry.
    pub(crate) fn crc(b: &[u8]) -> u32 {
        u32_at(b, 60)
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Header, HeaderError> {
        let b = &b[..HEADER_BYTES];
        if b.iter().all(|&x| x == 0) {
            return Err(HeaderError::Blank);
        }
        if b[0..8] != SEGMENT_MAGIC {
            return Err(HeaderError::BadMagic);
        }
        if crc32c::crc32c(&b[0..60]) != u32_at(b, 60) {
            return Err(HeaderError::BadChecksum);
        }
        let version = u32_at(b, 8);
        if !(SEGMENT_VERSION_MIN..=SEGMENT_VERSION).contains(&version) {
            return Err(HeaderError::UnsupportedVersion(version));
        }
        let hb = u32_at(b, 12);
        if hb as usize != HEADER_BYTES {
            return Err(HeaderError::BadHeaderBytes(hb));
        }
        Ok(Header {
            version,
            epoch: Epoch(u64_at(b, 16)),
            number: u64_at(b, 24),
            segment_bytes: u64_at(b, 32),
            created_unix_ms: u64_at(b, 40),
        })
    }
}

/// What a record entry describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Payload = framed SSE bytes of event (`stream`, `seq`).
    Event = 1,
    /// Payload = UTF-8 name of new stream `stream`; `seq` = 0.
    StreamName = 2,
    /// Last entry of a sealed segment; `seq` = number of entries before it; no payload.
    Seal = 3,
    /// Stream `stream` was removed; payload = its UTF-8 name; `seq` = 0. Only in segments of
    /// version 2 or later.
    StreamRemoved = 4,
    /// A key naming events `seq..seq + count` of stream `stream`, written after them; payload =
    /// `count` (u32) and the key's opaque bytes. Only in segments of version 3 or later.
    Key = 5,
}

/// One record entry (32 bytes, stored downward from the end of the segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub len: u32,
    pub data_off: u32,
    pub stream: StreamId,
    pub seq: Seq,
    pub timestamp_ms: u64,
    pub kind: Kind,
}

/// Why an entry did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryError {
    BadChecksum,
    BadKind(u8),
    BadFlags(u8),
}

const TIMESTAMP_MASK: u64 = (1 << 48) - 1;

impl Entry {
    /// Encodes the entry. Its CRC32C is seeded with the previous entry's CRC (`chain`; the
    /// header CRC for the first entry) and covers entry bytes 4..32 followed by `payload`, so a
    /// stale entry left behind by a crash never validates after a different predecessor.
    pub(crate) fn encode(&self, chain: u32, payload: &[u8]) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..12].copy_from_slice(&self.data_off.to_le_bytes());
        b[12..16].copy_from_slice(&self.stream.0.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        let tail = (self.timestamp_ms & TIMESTAMP_MASK) | ((self.kind as u64) << 48);
        b[24..32].copy_from_slice(&tail.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c_append(chain, &b[4..32]), payload);
        b[0..4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The stored CRC of an encoded entry (the chain value for the next entry).
    pub(crate) fn crc(b: &[u8]) -> u32 {
        u32_at(b, 0)
    }

    /// Decodes the fixed fields only (no checksum check): the caller bounds-checks `len` and
    /// `data_off` before handing the payload to [`Entry::verify`]. `version` is the segment's
    /// header version: a kind newer than it is `BadKind`, exactly as before the kind existed.
    pub(crate) fn decode_fields(b: &[u8], version: u32) -> Result<Entry, EntryError> {
        let tail = u64_at(b, 24);
        let kind = match (tail >> 48) as u8 {
            1 => Kind::Event,
            2 => Kind::StreamName,
            3 => Kind::Seal,
            4 if version >= STREAM_REMOVED_SINCE_VERSION => Kind::StreamRemoved,
            5 if version >= KEY_SINCE_VERSION => Kind::Key,
            k => return Err(EntryError::BadKind(k)),
        };
        let flags = (tail >> 56) as u8;
        if flags != 0 {
            return Err(EntryError::BadFlags(flags));
        }
        Ok(Entry {
            len: u32_at(b, 4),
            data_off: u32_at(b, 8),
            stream: StreamId(u32_at(b, 12)),
            seq: u64_at(b, 16),
            timestamp_ms: tail & TIMESTAMP_MASK,
            kind,
        })
    }

    pub(crate) fn verify(b: &[u8], chain: u32, payload: &[u8]) -> Result<(), EntryError> {
        let crc = crc32c::crc32c_append(crc32c::crc32c_append(chain, &b[4..32]), payload);
        if crc == u32_at(b, 0) {
            Ok(())
        } else {
            Err(EntryError::BadChecksum)
        }
    }
}

/// One live stream in the checkpoint (its id is its position).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckpointStream {
    pub name: String,
    pub floor: Seq,
    pub tail: Seq,
}

/// The checkpoint file: written (tmp + fsync + rename + fsync dir) before retention deletes
/// segments, so stream names, tails and removals outlive the segments that held them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub epoch: Epoch,
    /// Segments numbered below this are deleted (or awaiting deletion).
    pub first_live_segment: u64,
    /// Every stream id ever created, in order: `None` for a removed stream.
    pub streams: Vec<Option<CheckpointStream>>,
}

/// Why the checkpoint did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointError {
    TooShort,
    BadMagic,
    BadChecksum,
    UnsupportedVersion(u32),
    Malformed(&'static str),
}

/// Version-2 tag of a live stream (floor, tail, name follow).
const TAG_LIVE: u8 = 1;
/// Version-2 tag of a removed stream (nothing follows).
const TAG_REMOVED: u8 = 2;

impl Checkpoint {
    /// Encodes the current version (2).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(40 + self.streams.len() * 24);
        b.extend_from_slice(&CHECKPOINT_MAGIC);
        b.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.epoch.0.to_le_bytes());
        b.extend_from_slice(&self.first_live_segment.to_le_bytes());
        b.extend_from_slice(&(self.streams.len() as u32).to_le_bytes());
        for s in &self.streams {
            let Some(s) = s else {
                b.push(TAG_REMOVED);
                continue;
            };
            b.push(TAG_LIVE);
            b.extend_from_slice(&s.floor.to_le_bytes());
            b.extend_from_slice(&s.tail.to_le_bytes());
            b.extend_from_slice(&(s.name.len() as u16).to_le_bytes());
            b.extend_from_slice(s.name.as_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes version 2, or version 1 (written before streams could be removed: every
    /// stream live, no tag byte).
    pub(crate) fn decode(b: &[u8]) -> Result<Checkpoint, CheckpointError> {
        if b.len() < 40 {
            return Err(CheckpointError::TooShort);
        }
        if b[0..8] != CHECKPOINT_MAGIC {
            return Err(CheckpointError::BadMagic);
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body) != u32_at(crc, 0) {
            return Err(CheckpointError::BadChecksum);
        }
        let version = u32_at(b, 8);
        if !(1..=CHECKPOINT_VERSION).contains(&version) {
            return Err(CheckpointError::UnsupportedVersion(version));
        }
        let epoch = Epoch(u64_at(b, 16));
        let first_live_segment = u64_at(b, 24);
        let count = u32_at(b, 32) as usize;
        // A stream id is below u32::MAX (`create_stream` refuses it), so at most u32::MAX ids.
        if count == u32::MAX as usize {
            return Err(CheckpointError::Malformed("more stream ids than exist"));
        }
        let mut at = 36;
        // Every entry takes at least one byte: the capacity is bounded by the file.
        let mut streams = Vec::with_capacity(count.min(body.len() - at));
        for _ in 0..count {
            if version >= 2 {
                let tag = *body
                    .get(at)
                    .ok_or(CheckpointError::Malformed("stream entry truncated"))?;
                at += 1;
                match tag {
                    TAG_LIVE => {}
                    TAG_REMOVED => {
                        streams.push(None);
                        continue;
                    }
                    _ => return Err(CheckpointError::Malformed("unknown stream tag")),
                }
            }
            let (s, next) = decode_live_stream(body, at)?;
            streams.push(Some(s));
            at = next;
        }
        if at != body.len() {
            return Err(CheckpointError::Malformed("trailing bytes"));
        }
        Ok(Checkpoint {
            epoch,
            first_live_segment,
            streams,
        })
    }
}

/// One live stream's `floor u64, tail u64, name_len u16, name` at `at`; returns it and the
/// offset after it.
fn decode_live_stream(
    body: &[u8],
    at: usize,
) -> Result<(CheckpointStream, usize), CheckpointError> {
    if at + 18 > body.len() {
        return Err(CheckpointError::Malformed("stream entry truncated"));
    }
    let floor = u64_at(body, at);
    let tail = u64_at(body, at + 8);
    let n = u16::from_le_bytes([body[at + 16], body[at + 17]]) as usize;
    let at = at + 18;
    if at + n > body.len() {
        return Err(CheckpointError::Malformed("stream name truncated"));
    }
    let name = std::str::from_utf8(&body[at..at + n])
        .map_err(|_| CheckpointError::Malformed("stream name not UTF-8"))?
        .to_owned();
    // `tail + 1` must exist: it is the next append's sequence (found by fuzzing:
    // a checksum-valid checkpoint with tail = u64::MAX overflowed here).
    if tail == u64::MAX {
        return Err(CheckpointError::Malformed("tail has no successor"));
    }
    if floor == 0 || floor > tail + 1 {
        return Err(CheckpointError::Malformed("floor outside [1, tail + 1]"));
    }
    Ok((CheckpointStream { name, floor, tail }, at + n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_damage() {
        let h = Header {
            version: SEGMENT_VERSION,
            epoch: Epoch(9),
            number: 3,
            segment_bytes: 65536,
            created_unix_ms: 1_700_000_000_000,
        };
        let mut b = h.encode();
        assert_eq!(Header::decode(&b), Ok(h));
        b[20] ^= 1;
        assert_eq!(Header::decode(&b), Err(HeaderError::BadChecksum));
        assert_eq!(Header::decode(&[0u8; 64]), Err(HeaderError::Blank));
    }

    #[test]
    fn entry_round_trip_and_damage() {
        let e = Entry {
            len: 5,
            data_off: 64,
            stream: StreamId(4),
            seq: 77,
            timestamp_ms: 123,
            kind: Kind::Event,
        };
        let b = e.encode(7, b"hello");
        assert_eq!(Entry::decode_fields(&b, SEGMENT_VERSION), Ok(e));
        assert_eq!(Entry::verify(&b, 7, b"hello"), Ok(()));
        assert_eq!(Entry::verify(&b, 8, b"hello"), Err(EntryError::BadChecksum));
        assert_eq!(Entry::verify(&b, 7, b"hellp"), Err(EntryError::BadChecksum));
        let mut c = b;
        c[16] ^= 1;
        assert_eq!(Entry::verify(&c, 7, b"hello"), Err(EntryError::BadChecksum));
    }

    #[test]
    fn checkpoint_round_trip_and_damage() {
        let c = Checkpoint {
            epoch: Epoch(5),
            first_live_segment: 2,
            streams: vec![
                Some(CheckpointStream {
                    name: "a".into(),
                    floor: 3,
                    tail: 9,
                }),
                None,
                Some(CheckpointStream {
                    name: "ünï".into(),
                    floor: 1,
                    tail: 0,
                }),
                None,
            ],
        };
        let mut b = c.encode();
        assert_eq!(Checkpoint::decode(&b), Ok(c));
        b[40] ^= 1;
        assert_eq!(Checkpoint::decode(&b), Err(CheckpointError::BadChecksum));
        assert_eq!(Checkpoint::decode(&b[..10]), Err(CheckpointError::TooShort));
    }

    /// Regression (fuzz target `log_forged`): a checksum-valid checkpoint whose tail is
    /// `u64::MAX` is malformed (no next sequence), not an arithmetic overflow.
    #[test]
    fn checkpoint_with_tail_at_u64_max_is_malformed() {
        for (floor, tail) in [(1, u64::MAX), (u64::MAX, u64::MAX), (0, u64::MAX)] {
            let c = Checkpoint {
                epoch: Epoch(5),
                first_live_segment: 0,
                streams: vec![Some(CheckpointStream {
                    name: "a".into(),
                    floor,
                    tail,
                })],
            };
            assert!(
                matches!(
                    Checkpoint::decode(&c.encode()),
                    Err(CheckpointError::Malformed(_))
                ),
                "floor {floor} tail {tail}"
            );
        }
    }

    /// The removal kind exists only in version-2 segments: in a version-1 segment its byte is
    /// an unknown kind, exactly as before the kind was introduced.
    #[test]
    fn newer_kinds_need_their_segment_version() {
        let e = Entry {
            len: 1,
            data_off: 64,
            stream: StreamId(2),
            seq: 0,
            timestamp_ms: 5,
            kind: Kind::StreamRemoved,
        };
        let b = e.encode(1, b"a");
        assert_eq!(Entry::decode_fields(&b, 2), Ok(e));
        assert_eq!(Entry::decode_fields(&b, 1), Err(EntryError::BadKind(4)));
        let key = Entry {
            kind: Kind::Key,
            seq: 1,
            ..e
        };
        let b = key.encode(1, b"\x01\0\0\0k");
        assert_eq!(Entry::decode_fields(&b, 3), Ok(key));
        assert_eq!(Entry::decode_fields(&b, 2), Err(EntryError::BadKind(5)));
        let h = Header {
            version: 1,
            epoch: Epoch(9),
            number: 0,
            segment_bytes: 65536,
            created_unix_ms: 0,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        for version in [0, SEGMENT_VERSION + 1] {
            let bad = Header { version, ..h };
            assert_eq!(
                Header::decode(&bad.encode()),
                Err(HeaderError::UnsupportedVersion(version))
            );
        }
    }

    /// A version-1 checkpoint (written before streams could be removed) still loads, every
    /// stream live; an unknown version-2 tag is malformed.
    #[test]
    fn version_1_checkpoint_still_loads() {
        let mut b = Vec::new();
        b.extend_from_slice(&CHECKPOINT_MAGIC);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&7u64.to_le_bytes());
        b.extend_from_slice(&3u64.to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes());
        for (floor, tail, name) in [(2u64, 5u64, "x"), (1, 0, "yz")] {
            b.extend_from_slice(&floor.to_le_bytes());
            b.extend_from_slice(&tail.to_le_bytes());
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        let live = |name: &str, floor, tail| {
            Some(CheckpointStream {
                name: name.into(),
                floor,
                tail,
            })
        };
        assert_eq!(
            Checkpoint::decode(&b),
            Ok(Checkpoint {
                epoch: Epoch(7),
                first_live_segment: 3,
                streams: vec![live("x", 2, 5), live("yz", 1, 0)],
            })
        );

        let c = Checkpoint {
            epoch: Epoch(7),
            first_live_segment: 0,
            streams: vec![None],
        };
        let mut v2 = c.encode();
        assert_eq!(v2.len(), 36 + 1 + 4, "a removed stream costs one byte");
        v2[36] = 3;
        let n = v2.len() - 4;
        let crc = crc32c::crc32c(&v2[..n]);
        v2[n..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            Checkpoint::decode(&v2),
            Err(CheckpointError::Malformed("unknown stream tag"))
        );
    }
}
