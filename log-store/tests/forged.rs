//! Regression tests for what the `log_forged` fuzz target found: directories whose checksums
//! are all valid but whose numbers sit at the edge of the sequence space. Files are written
//! from the documented layout (DESIGN.md: 64-byte header, 32-byte entries downward from the end
//! with a chained CRC32C, checkpoint with a trailing CRC32C). Recovery and append must answer
//! with an explicit error, never an arithmetic overflow (a panic in debug builds, a wrapped
//! sequence number — a reused event ID — in release builds).
#![forbid(unsafe_code)]

use std::fs;
use std::path::Path;

use log_store::log::CorruptReason;
use log_store::{AppendError, FsyncPolicy, Log, LogOptions, OpenError, StreamId};

const SEG: usize = 64 * 1024;
const EPOCH: u64 = 0x5eed;

fn opts() -> LogOptions {
    LogOptions {
        segment_bytes: SEG as u64,
        record_bytes_max: 8 * 1024,
        fsync: FsyncPolicy::Never,
        ..LogOptions::default()
    }
}

/// A checkpoint naming one stream "a" with `floor`/`tail`, first live segment 0.
fn write_checkpoint(dir: &Path, floor: u64, tail: u64) {
    write_checkpoint_at(dir, 0, floor, tail);
}

fn write_checkpoint_at(dir: &Path, first_live: u64, floor: u64, tail: u64) {
    let mut b = Vec::new();
    b.extend_from_slice(b"SSELOGCK");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&EPOCH.to_le_bytes());
    b.extend_from_slice(&first_live.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&floor.to_le_bytes());
    b.extend_from_slice(&tail.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(b"a");
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    fs::write(dir.join("checkpoint"), b).unwrap();
}

/// Segment 0 holding one event entry per `(stream, seq, payload)`, CRC chain intact.
fn write_segment(dir: &Path, events: &[(u32, u64, &[u8])]) {
    let entries: Vec<(u8, u32, u64, &[u8])> =
        events.iter().map(|&(s, q, p)| (1, s, q, p)).collect();
    write_segment_at(dir, 0, &entries);
}

/// Segment `number` holding `(kind, stream, seq, payload)` entries (kind 1 event, 3 seal).
fn write_segment_at(dir: &Path, number: u64, entries: &[(u8, u32, u64, &[u8])]) {
    let mut b = vec![0u8; SEG];
    b[0..8].copy_from_slice(b"SSELOGSG");
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    b[12..16].copy_from_slice(&64u32.to_le_bytes());
    b[16..24].copy_from_slice(&EPOCH.to_le_bytes());
    b[24..32].copy_from_slice(&number.to_le_bytes());
    b[32..40].copy_from_slice(&(SEG as u64).to_le_bytes());
    b[40..48].copy_from_slice(&1_700_000_000_000u64.to_le_bytes());
    let mut chain = crc32c::crc32c(&b[0..60]);
    b[60..64].copy_from_slice(&chain.to_le_bytes());
    let mut data_end = 64;
    for (i, &(kind, stream, seq, payload)) in entries.iter().enumerate() {
        b[data_end..data_end + payload.len()].copy_from_slice(payload);
        let mut e = [0u8; 32];
        e[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        e[8..12].copy_from_slice(&(data_end as u32).to_le_bytes());
        e[12..16].copy_from_slice(&stream.to_le_bytes());
        e[16..24].copy_from_slice(&seq.to_le_bytes());
        let ts_kind = 1_700_000_000_000u64 | (u64::from(kind) << 48);
        e[24..32].copy_from_slice(&ts_kind.to_le_bytes());
        chain = crc32c::crc32c_append(crc32c::crc32c_append(chain, &e[4..32]), payload);
        e[0..4].copy_from_slice(&chain.to_le_bytes());
        let slot = SEG - 32 * (i + 1);
        b[slot..slot + 32].copy_from_slice(&e);
        data_end += payload.len();
    }
    fs::write(dir.join(format!("{number:020}.seg")), b).unwrap();
}

/// Fuzz crash (`log_forged`): checkpoint tail u64::MAX - 1, then an event with sequence
/// u64::MAX. It used to overflow `tail + 1` in recovery; now it is named corruption.
#[test]
fn event_with_sequence_u64_max_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), u64::MAX, u64::MAX - 1);
    write_segment(dir.path(), &[(0, u64::MAX, b"data: x\n\n")]);
    match Log::open(dir.path(), opts()) {
        Err(OpenError::Corrupt {
            reason: CorruptReason::SequenceOverflow { stream },
            ..
        }) => assert_eq!(stream, StreamId(0)),
        other => panic!("expected SequenceOverflow, got {:?}", other.map(|_| ())),
    }
}

/// The last usable sequence is u64::MAX - 1: an append past it is refused explicitly (it used
/// to compute u64::MAX, and then wrap to 0 — a reused ID), also after a reopen.
#[test]
fn append_past_the_last_sequence_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), u64::MAX - 1, u64::MAX - 2);
    write_segment(dir.path(), &[]);
    let mut log = Log::open(dir.path(), opts()).unwrap();
    let s = StreamId(0);
    let a = log.append(s, None, b"last").unwrap();
    assert_eq!(a.id.seq, u64::MAX - 1);
    assert!(matches!(
        log.append(s, None, b"one too many"),
        Err(AppendError::SequenceExhausted(id)) if id == s
    ));
    let b = log.bounds(s).unwrap();
    assert_eq!((b.floor, b.tail), (u64::MAX - 1, u64::MAX - 1));
    assert_eq!(
        log.record(s, u64::MAX - 1).unwrap().as_bytes(),
        format!("id: {}\ndata: last\n\n", a.id).as_bytes()
    );
    drop(log);
    let mut log = Log::open(dir.path(), opts()).unwrap();
    assert_eq!(log.bounds(s).unwrap().tail, u64::MAX - 1);
    assert!(matches!(
        log.append(s, None, b"still too many"),
        Err(AppendError::SequenceExhausted(_))
    ));
}

/// Fuzz crash (`log_forged`): a sealed last segment numbered u64::MAX (forged checkpoint and
/// file name) overflowed `number + 1` when recovery rolled to a new active segment. Now the
/// log opens readable and appends report `SegmentNumbersExhausted`, as with a full disk.
#[test]
fn sealed_segment_numbered_u64_max_cannot_roll() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint_at(dir.path(), u64::MAX, 1, 0);
    write_segment_at(dir.path(), u64::MAX, &[(3, u32::MAX, 0, b"")]);
    let mut log = Log::open(dir.path(), opts()).unwrap();
    let s = StreamId(0);
    assert_eq!(log.bounds(s).unwrap().tail, 0);
    assert!(matches!(
        log.append(s, None, b"x"),
        Err(AppendError::SegmentNumbersExhausted)
    ));
    drop(log);
    assert!(Log::open(dir.path(), opts()).is_ok());
}
