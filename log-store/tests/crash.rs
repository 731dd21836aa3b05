//! Crash tests at the byte level. The active segment is cut at every byte offset of the writes
//! of its last records (in payload-then-entry and entry-then-payload order, since pages reach
//! the disk in any order), a lost entry below intact later entries is simulated, and sealed
//! segments are damaged. After each cut the log must reopen with exactly the complete prefix of
//! records, byte for byte, and keep working (append + reopen). Uses the documented layout
//! (DESIGN.md): 64-byte header, 32-byte entries downward from the end.
#![forbid(unsafe_code)]

use std::fs;
use std::path::Path;

use log_store::{Log, LogOptions, OpenError, StreamId};

const SEG: u64 = 64 * 1024;
const LAST_RECORDS: usize = 3;

fn opts() -> LogOptions {
    LogOptions {
        segment_bytes: SEG,
        record_bytes_max: 8 * 1024,
        ..LogOptions::default()
    }
}

fn seg_name(n: u64) -> String {
    format!("{n:020}.seg")
}

struct Ent {
    slot: usize,
    off: usize,
    len: usize,
    stream: u32,
}

fn entries(bytes: &[u8]) -> Vec<Ent> {
    let mut v = Vec::new();
    loop {
        let slot = bytes.len() - 32 * (v.len() + 1);
        let e = &bytes[slot..slot + 32];
        if e.iter().all(|&b| b == 0) {
            return v;
        }
        let u = |a: usize| u32::from_le_bytes(e[a..a + 4].try_into().unwrap()) as usize;
        v.push(Ent {
            slot,
            off: u(8),
            len: u(4),
            stream: u(12) as u32,
        });
    }
}

/// Every stream's records as framed bytes, read through the public API.
fn contents(log: &Log) -> Vec<Vec<Vec<u8>>> {
    (0..log.stream_count() as u32)
        .map(|s| {
            let b = log.bounds(StreamId(s)).unwrap();
            (b.floor..=b.visible_tail)
                .map(|q| log.record(StreamId(s), q).unwrap().as_bytes().to_vec())
                .collect()
        })
        .collect()
}

/// Builds a one-segment log with two streams and returns (segment bytes, per-stream records).
fn build(dir: &Path) -> (Vec<u8>, Vec<Vec<Vec<u8>>>) {
    let mut log = Log::open(dir, opts()).unwrap();
    let a = log.create_stream("a").unwrap();
    let b = log.create_stream("b").unwrap();
    for i in 0..12u32 {
        let s = if i % 3 == 2 { b } else { a };
        let data = format!("record {i}\nline two {}", "x".repeat((i * 7) as usize));
        log.append(s, (i % 2 == 0).then_some("t"), data.as_bytes())
            .unwrap();
    }
    let c = contents(&log);
    drop(log);
    (fs::read(dir.join(seg_name(0))).unwrap(), c)
}

/// Opens `bytes` as the only segment of a fresh directory and checks it recovered exactly the
/// first `keep` events (global order), then that it still appends and reopens correctly.
fn check_recovers(
    bytes: &[u8],
    full: &[Vec<Vec<u8>>],
    event_streams: &[u32],
    keep: usize,
    what: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(seg_name(0)), bytes).unwrap();
    let mut log = Log::open(dir.path(), opts()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut want: Vec<Vec<Vec<u8>>> = vec![Vec::new(); full.len()];
    let mut next = vec![0usize; full.len()];
    for &s in &event_streams[..keep] {
        let s = s as usize;
        want[s].push(full[s][next[s]].clone());
        next[s] += 1;
    }
    assert_eq!(contents(&log), want, "{what}: recovered records");
    // The log keeps working: a new record after the cut survives a reopen, nothing stale
    // resurfaces behind it.
    let r = log.append(StreamId(0), None, b"after").unwrap();
    assert_eq!(r.id.seq, want[0].len() as u64 + 1, "{what}");
    drop(log);
    let log = Log::open(dir.path(), opts()).unwrap_or_else(|e| panic!("{what} (reopen): {e}"));
    want[0].push(format!("id: {}\ndata: after\n\n", r.id).into_bytes());
    assert_eq!(contents(&log), want, "{what}: after append + reopen");
}

#[test]
fn cut_at_every_byte_of_the_last_records() {
    let dir = tempfile::tempdir().unwrap();
    let (full_bytes, full) = build(dir.path());
    let ents = entries(&full_bytes);
    let n = ents.len();
    let events: Vec<&Ent> = ents[2..].iter().collect(); // entries 0 and 1 are the stream names
    let event_streams: Vec<u32> = events.iter().map(|e| e.stream).collect();
    let first_cut = n - LAST_RECORDS;
    // The state before the last records were written.
    let mut base = full_bytes.clone();
    for e in &ents[first_cut..] {
        base[e.off..e.off + e.len].fill(0);
        base[e.slot..e.slot + 32].fill(0);
    }
    for entry_first in [false, true] {
        // The write stream of the last records: (file offset, byte) in write order.
        let mut writes: Vec<(usize, u8)> = Vec::new();
        let mut complete_after: Vec<usize> = Vec::new(); // write count at which record k is whole
        for e in &ents[first_cut..] {
            let payload = (e.off..e.off + e.len).map(|o| (o, full_bytes[o]));
            let entry = (e.slot..e.slot + 32).map(|o| (o, full_bytes[o]));
            if entry_first {
                writes.extend(entry.chain(payload));
            } else {
                writes.extend(payload.chain(entry));
            }
            // Whole once its last byte that differs from the base (zero) is written.
            let last_change = writes.iter().rposition(|&(o, b)| b != base[o]).unwrap();
            complete_after.push(last_change + 1);
        }
        let mut cut_bytes = base.clone();
        for c in 0..=writes.len() {
            if c > 0 {
                let (o, b) = writes[c - 1];
                cut_bytes[o] = b;
            }
            let whole = complete_after.iter().filter(|&&w| w <= c).count();
            let keep = first_cut - 2 + whole;
            check_recovers(
                &cut_bytes,
                &full,
                &event_streams,
                keep,
                &format!("cut {c} entry_first={entry_first}"),
            );
        }
    }
}

#[test]
fn lost_entry_below_intact_later_entries() {
    let dir = tempfile::tempdir().unwrap();
    let (full_bytes, full) = build(dir.path());
    let ents = entries(&full_bytes);
    let event_streams: Vec<u32> = ents[2..].iter().map(|e| e.stream).collect();
    for lost in ents.len() - LAST_RECORDS..ents.len() {
        let mut b = full_bytes.clone();
        b[ents[lost].slot..ents[lost].slot + 32].fill(0);
        check_recovers(
            &b,
            &full,
            &event_streams,
            lost - 2,
            &format!("entry {lost} lost"),
        );
        let mut b = full_bytes.clone();
        b[ents[lost].off] ^= 1;
        check_recovers(
            &b,
            &full,
            &event_streams,
            lost - 2,
            &format!("payload {lost} flipped"),
        );
    }
}

/// Fills segment 0 and starts segment 1; returns the directory.
fn two_segments() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts()).unwrap();
    let a = log.create_stream("a").unwrap();
    while !dir.path().join(seg_name(1)).exists() {
        log.append(a, None, "y".repeat(900).as_bytes()).unwrap();
    }
    log.append(a, None, b"in segment 1").unwrap();
    dir
}

#[test]
fn damage_in_a_sealed_segment_is_an_explicit_error_naming_file_and_offset() {
    let dir = two_segments();
    let p0 = dir.path().join(seg_name(0));
    let mut bytes = fs::read(&p0).unwrap();
    let ents = entries(&bytes);
    let victim = &ents[ents.len() / 2];
    bytes[victim.off + 3] ^= 0x20;
    fs::write(&p0, &bytes).unwrap();
    match Log::open(dir.path(), opts()) {
        Err(OpenError::Corrupt { path, offset, .. }) => {
            assert_eq!(path, p0);
            assert_eq!(offset, victim.slot as u64);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Nothing was "repaired": the damaged byte is still there.
    assert_eq!(fs::read(&p0).unwrap(), bytes);
}

#[test]
fn sealed_segment_missing_its_seal_is_an_error() {
    let dir = two_segments();
    let p0 = dir.path().join(seg_name(0));
    let mut bytes = fs::read(&p0).unwrap();
    let ents = entries(&bytes);
    let seal = ents.last().unwrap();
    bytes[seal.slot..seal.slot + 32].fill(0);
    fs::write(&p0, &bytes).unwrap();
    assert!(matches!(
        Log::open(dir.path(), opts()),
        Err(OpenError::Corrupt {
            reason: log_store::log::CorruptReason::NotSealed,
            ..
        })
    ));
}

#[test]
fn blank_last_segment_from_a_crashed_roll_is_removed() {
    let dir = two_segments();
    let before = {
        let log = Log::open(dir.path(), opts()).unwrap();
        contents(&log)
    };
    // Simulate: the seal of segment 1 written, segment 2 created but its header never written.
    let mut log = Log::open(dir.path(), opts()).unwrap();
    while !dir.path().join(seg_name(2)).exists() {
        log.append(StreamId(0), None, "z".repeat(900).as_bytes())
            .unwrap();
    }
    let after_roll = contents(&log);
    drop(log);
    // Segment 2 holds one record; drop it to model "created, nothing written".
    let p2 = dir.path().join(seg_name(2));
    fs::write(&p2, vec![0u8; SEG as usize]).unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let mut want = after_roll.clone();
    want[0].pop();
    assert_eq!(contents(&log), want);
    assert!(want[0].len() > before[0].len());
    assert!(
        p2.exists(),
        "a fresh active segment 2 replaced the blank one"
    );
}

/// Copies every file of `src` but `skip` into a fresh directory.
fn copy_dir(src: &Path, skip: &str) -> tempfile::TempDir {
    let dst = tempfile::tempdir().unwrap();
    for e in fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name != skip && name != "LOCK" {
            fs::copy(e.path(), dst.path().join(&name)).unwrap();
        }
    }
    dst
}

#[test]
fn cut_at_every_byte_in_a_recycled_segment() {
    // Segment 0 (old content) is retired and becomes the spare; segment 2 reuses its file, so
    // before each record is written its bytes are the old generation's, not zeros.
    let dir = tempfile::tempdir().unwrap();
    let o = || LogOptions {
        retain_bytes: Some(SEG),
        ..opts()
    };
    let mut log = Log::open(dir.path(), o()).unwrap();
    let a = log.create_stream("a").unwrap();
    let b = log.create_stream("b").unwrap();
    let mut i = 0u32;
    while !dir.path().join(seg_name(1)).exists() {
        let s = if i.is_multiple_of(2) { a } else { b };
        log.append(
            s,
            None,
            format!("old generation {i} {}", "o".repeat(i as usize % 50)).as_bytes(),
        )
        .unwrap();
        i += 1;
    }
    log.enforce_retention(std::time::SystemTime::now()).unwrap();
    let stale = fs::read(dir.path().join("spare")).expect("segment 0 kept as the spare");
    while !dir.path().join(seg_name(2)).exists() {
        log.append(a, None, "filler ".repeat(40).as_bytes())
            .unwrap();
    }
    for k in 0..6u32 {
        let s = if k % 3 == 1 { b } else { a };
        log.append(
            s,
            (k % 2 == 0).then_some("n"),
            format!("new {k}\nx{}", "y".repeat(k as usize * 5)).as_bytes(),
        )
        .unwrap();
    }
    let full = contents(&log);
    drop(log);
    let seg2 = fs::read(dir.path().join(seg_name(2))).unwrap();
    let ents = entries(&seg2);
    let n = ents.len();
    let first_cut = n - LAST_RECORDS;
    // Global order of events: segment 1's (all kept), then segment 2's.
    let seg1_events: usize = full.iter().map(Vec::len).sum::<usize>() - n;
    let seg2_streams: Vec<u32> = ents.iter().map(|e| e.stream).collect();
    // Base: before the last records, their payload areas and entry slots held stale bytes,
    // except the slot of the first of them, zeroed when the record before it was written.
    let mut base = seg2.clone();
    for e in &ents[first_cut..] {
        base[e.off..e.off + e.len].copy_from_slice(&stale[e.off..e.off + e.len]);
        base[e.slot..e.slot + 32].copy_from_slice(&stale[e.slot..e.slot + 32]);
    }
    base[ents[first_cut].slot..ents[first_cut].slot + 32].fill(0);
    let below_last = ents[n - 1].slot - 32;
    base[below_last..below_last + 32].copy_from_slice(&stale[below_last..below_last + 32]);
    for entry_first in [false, true] {
        let mut writes: Vec<(usize, u8)> = Vec::new();
        let mut complete_after = Vec::new();
        // Whole once its last write that changes a byte (given the writes before it) is done.
        let mut state = base.clone();
        for e in &ents[first_cut..] {
            let payload = (e.off..e.off + e.len).map(|o| (o, seg2[o]));
            let entry = (e.slot..e.slot + 32).map(|o| (o, seg2[o]));
            let record: Vec<(usize, u8)> = if entry_first {
                entry.chain(payload).collect()
            } else {
                payload.chain(entry).collect()
            };
            let mut last_change = writes.len();
            for (o, v) in record {
                writes.push((o, v));
                if state[o] != v {
                    state[o] = v;
                    last_change = writes.len();
                }
            }
            complete_after.push(last_change);
            writes.extend((e.slot - 32..e.slot).map(|o| (o, 0u8)));
            state[e.slot - 32..e.slot].fill(0);
        }
        let mut cut = base.clone();
        for c in 0..=writes.len() {
            if c > 0 {
                let (o, v) = writes[c - 1];
                cut[o] = v;
            }
            let whole = complete_after.iter().filter(|&&w| w <= c).count();
            let keep2 = first_cut + whole; // events of segment 2 kept
            let what = format!("recycled cut {c} entry_first={entry_first}");
            let d = copy_dir(dir.path(), &seg_name(2));
            fs::write(d.path().join(seg_name(2)), &cut).unwrap();
            let mut want = full.clone();
            for &s in seg2_streams[keep2..].iter().rev() {
                want[s as usize].pop().unwrap();
            }
            let mut log = Log::open(d.path(), o()).unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = contents(&log);
            assert_eq!(
                got,
                want,
                "{what}: recovered records; lens got {:?} want {:?} torn {:?}",
                got.iter().map(Vec::len).collect::<Vec<_>>(),
                want.iter().map(Vec::len).collect::<Vec<_>>(),
                log.recovery().torn_tail_offset
            );
            if c == writes.len() {
                assert_eq!(log.recovery().torn_tail_offset, None, "{what}: clean end");
            }
            let r = log.append(a, None, b"after").unwrap();
            drop(log);
            let log = Log::open(d.path(), o()).unwrap_or_else(|e| panic!("{what} (reopen): {e}"));
            want[0].push(format!("id: {}\ndata: after\n\n", r.id).into_bytes());
            assert_eq!(contents(&log), want, "{what}: after append + reopen");
        }
        assert!(seg1_events > 0);
    }
}

mod corruption {
    //! Recovery of arbitrarily damaged directories: `open` never panics; it either refuses with
    //! an error or recovers a log whose every record is a well-formed SSE event of its stream,
    //! in sequence order, matching what was written before the damage.
    use super::*;
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(48)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

        #[test]
        fn damaged_segments_never_panic_and_never_serve_wrong_bytes(
            flips in proptest::collection::vec((0usize..2, any::<u32>(), any::<u8>()), 1..6),
            truncate in proptest::option::of((0usize..2, any::<u32>())),
        ) {
            let src = two_segments();
            let original = {
                let log = Log::open(src.path(), opts()).unwrap();
                contents(&log)
            };
            let d = copy_dir(src.path(), "");
            for (seg, at, x) in &flips {
                let p = d.path().join(seg_name(*seg as u64));
                let mut b = fs::read(&p).unwrap();
                let i = *at as usize % b.len();
                b[i] ^= x | 1;
                fs::write(&p, &b).unwrap();
            }
            if let Some((seg, at)) = truncate {
                let p = d.path().join(seg_name(seg as u64));
                let b = fs::read(&p).unwrap();
                fs::write(&p, &b[..at as usize % b.len()]).unwrap();
            }
            if let Ok(log) = Log::open(d.path(), opts()) {
                let got = contents(&log);
                prop_assert!(got.len() <= original.len());
                for (s, recs) in got.iter().enumerate() {
                    let floor = log.bounds(StreamId(s as u32)).unwrap().floor as usize;
                    for (i, r) in recs.iter().enumerate() {
                        // Whatever survived is byte-identical to what was written.
                        prop_assert_eq!(Some(r), original[s].get(floor - 1 + i));
                    }
                }
            }
        }
    }
}

#[test]
fn recycled_segment_whose_adoption_never_reached_the_disk_is_dropped() {
    // fsync=never: adopting the spare writes nothing synchronously. After a power loss the new
    // segment's file may still hold the previous generation entirely (old header included).
    let dir = tempfile::tempdir().unwrap();
    let o = || LogOptions {
        retain_bytes: Some(SEG),
        ..opts()
    };
    let mut log = Log::open(dir.path(), o()).unwrap();
    let a = log.create_stream("a").unwrap();
    while !dir.path().join(seg_name(1)).exists() {
        log.append(a, None, "old ".repeat(30).as_bytes()).unwrap();
    }
    log.enforce_retention(std::time::SystemTime::now()).unwrap();
    let stale = fs::read(dir.path().join("spare")).unwrap();
    while !dir.path().join(seg_name(2)).exists() {
        log.append(a, None, "mid ".repeat(30).as_bytes()).unwrap();
    }
    for _ in 0..3 {
        log.append(a, None, b"in segment 2").unwrap();
    }
    let mut want = contents(&log);
    drop(log);
    let in_seg2 = entries(&fs::read(dir.path().join(seg_name(2))).unwrap()).len();
    fs::write(dir.path().join(seg_name(2)), &stale).unwrap();
    let log = Log::open(dir.path(), o()).unwrap();
    for _ in 0..in_seg2 {
        want[0].pop();
    }
    assert_eq!(
        contents(&log),
        want,
        "segment 2 dropped, nothing of segment 0 resurrected"
    );
    assert!(
        dir.path().join(seg_name(2)).exists(),
        "a fresh segment 2 is active"
    );
}
