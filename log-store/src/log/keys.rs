//! Key records: an opaque key (a publish's `Idempotency-Key` and what the gateway binds to it)
//! naming a run of one stream's events, written right after them so that it is durable with
//! them and recovery gives it back (DESIGN.md "Key records").
#![forbid(unsafe_code)]

use super::streams::Lookup;
use super::{AppendError, Log};
use crate::event_id::{Seq, StreamId};
use crate::format::{KEY_SINCE_VERSION, Kind};
use crate::mmap;

/// The longest key a key record holds (bytes).
pub const KEY_BYTES_MAX: usize = 256;

/// The largest key record's payload: the count, then the longest key. Every event append
/// leaves room for one after it (`Log::ensure_room_for_event`).
pub(crate) const KEY_RECORD_BYTES_MAX: usize = 4 + KEY_BYTES_MAX;

/// A key record: events `first..first + count` of `stream` were stored under `key`, at
/// `timestamp_ms` (Unix ms, coarse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub stream: StreamId,
    pub first: Seq,
    pub count: u32,
    pub timestamp_ms: u64,
    pub key: Vec<u8>,
}

/// Why a key record's payload or claim is not valid.
pub(crate) fn check(first: Seq, count: u32, key_len: usize, tail: Seq) -> Result<(), &'static str> {
    if count == 0 {
        return Err("a key names no event");
    }
    if key_len == 0 || key_len > KEY_BYTES_MAX {
        return Err("a key is empty or longer than KEY_BYTES_MAX");
    }
    let last = first.checked_add(u64::from(count) - 1);
    if first == 0 || last.is_none_or(|l| l > tail) {
        return Err("a key names events the stream does not hold");
    }
    Ok(())
}

/// A key record's payload: `count` then the key.
pub(crate) fn decode(payload: &[u8]) -> Option<(u32, &[u8])> {
    let (count, key) = payload.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*count), key))
}

impl Log {
    /// Writes a key record naming events `first..first + count` of `stream`, which must hold
    /// them already (appended earlier, in this turn for a record durable with them: the next
    /// group commit covers it like any write). The key is opaque to the log, 1 to
    /// [`KEY_BYTES_MAX`] bytes. Recovery hands the records of the live segments back
    /// ([`Log::take_recovered_keys`]); retention deletes them with their segment.
    pub fn append_key(
        &mut self,
        stream: StreamId,
        first: Seq,
        count: u32,
        key: &[u8],
    ) -> Result<(), AppendError> {
        if self.poisoned {
            return Err(AppendError::Poisoned);
        }
        let tail = match self.streams.lookup(stream) {
            Lookup::Live(_) => self.streams[stream].tail,
            Lookup::Removed { .. } => return Err(AppendError::StreamRemoved(stream)),
            Lookup::Unknown => return Err(AppendError::UnknownStream(stream)),
        };
        check(first, count, key.len(), tail).map_err(AppendError::KeyInvalid)?;
        // As for a removal: an upgraded log's older active segment must not hold the kind.
        if self.active.version < KEY_SINCE_VERSION {
            self.roll()?;
        }
        // Right after its events this never rolls: each event left room for it.
        let len = 4 + key.len();
        self.ensure_room(len)?;
        let ts = mmap::coarse_unix_ms();
        self.write_record(Kind::Key, stream, first, ts, len, |buf| {
            buf[..4].copy_from_slice(&count.to_le_bytes());
            buf[4..].copy_from_slice(key);
        });
        Ok(())
    }

    /// The key records recovery found in the live segments, oldest first, of streams still
    /// live (taken once: later calls return nothing).
    pub fn take_recovered_keys(&mut self) -> Vec<KeyRecord> {
        let mut keys = std::mem::take(&mut self.recovered_keys);
        keys.retain(|k| matches!(self.streams.lookup(k.stream), Lookup::Live(_)));
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_must_name_held_events() {
        assert_eq!(check(1, 1, 3, 1), Ok(()));
        assert_eq!(check(5, 3, 3, 7), Ok(()));
        assert!(check(5, 3, 3, 6).is_err(), "past the tail");
        assert!(check(0, 1, 3, 6).is_err(), "sequence 0 is no event");
        assert!(check(1, 0, 3, 6).is_err(), "no event");
        assert!(check(1, 1, 0, 6).is_err(), "empty key");
        assert!(check(1, 1, KEY_BYTES_MAX + 1, 6).is_err(), "long key");
        assert!(check(u64::MAX, 2, 3, u64::MAX).is_err(), "overflow");
    }

    #[test]
    fn payload_round_trip() {
        let mut p = 7u32.to_le_bytes().to_vec();
        p.extend_from_slice(b"key");
        assert_eq!(decode(&p), Some((7, &b"key"[..])));
        assert_eq!(decode(&p[..3]), None);
    }
}
