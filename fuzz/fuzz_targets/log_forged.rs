//! Fuzz target: log-store recovery of *structurally* wrong directories whose checksums are
//! all valid, i.e. states that byte flips can never reach (a flip breaks the CRC first):
//! checkpoints with arbitrary stream tables (floors, tails, names, counts, first live
//! segment), and segments whose entries form a valid CRC chain but describe impossible things
//! (unknown streams, sequence gaps or repeats, huge sequences, renamed or skipped stream ids,
//! payload offsets/lengths out of bounds, seals with wrong counts or in the middle, events
//! after a seal). The on-disk format is written here from `log-store/DESIGN.md`.
//!
//! `Log::open` must never panic (debug assertions and overflow checks are on in fuzz builds):
//! it returns an error, or a log whose every retained record is the payload of a forged event
//! entry with that stream and sequence (nothing shifted or invented), whose stream names are
//! the forged ones, which takes an append at `tail + 1`, and which reopens to the same state.
#![no_main]

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use log_store::{AppendError, FsyncPolicy, Log, LogOptions, StreamId};
use sse_gateway_fuzz::Input;

const SEG: usize = 64 * 1024;
const EPOCH: u64 = 0x5eed_0000_0000_0001;
const NAMES: [&str; 4] = ["a", "b", "c", "d"];

fn opts() -> LogOptions {
    LogOptions {
        segment_bytes: SEG as u64,
        record_bytes_max: 8 * 1024,
        fsync: FsyncPolicy::Never,
        ..LogOptions::default()
    }
}

/// A small number most of the time, any u64 sometimes (the edges: 0, MAX, MAX - 1).
fn num(inp: &mut Input<'_>) -> u64 {
    let sel = inp.u8();
    match sel >> 5 {
        0 => u64::MAX - u64::from(sel & 1),
        1 => inp.u64(),
        _ => u64::from(sel & 0x1f),
    }
}

fn name(inp: &mut Input<'_>) -> Vec<u8> {
    let sel = inp.u8();
    if sel >= 0xf0 {
        let n = usize::from(inp.u8() % 8);
        inp.take(n).to_vec()
    } else {
        NAMES[usize::from(sel) % NAMES.len()].as_bytes().to_vec()
    }
}

fn checkpoint(inp: &mut Input<'_>) -> (Vec<u8>, u64, Vec<Vec<u8>>) {
    let sel = inp.u8();
    // Mostly small; sometimes at the top of the segment-number space (a roll must not overflow).
    let first_live = if sel >= 0xf0 { u64::MAX - u64::from(sel & 3) } else { u64::from(sel % 3) };
    let count = usize::from(inp.u8() % 4);
    let mut b = Vec::new();
    b.extend_from_slice(b"SSELOGCK");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&EPOCH.to_le_bytes());
    b.extend_from_slice(&first_live.to_le_bytes());
    b.extend_from_slice(&(count as u32).to_le_bytes());
    let mut names = Vec::new();
    for _ in 0..count {
        let floor = num(inp);
        let tail = num(inp);
        let n = name(inp);
        b.extend_from_slice(&floor.to_le_bytes());
        b.extend_from_slice(&tail.to_le_bytes());
        b.extend_from_slice(&(n.len() as u16).to_le_bytes());
        b.extend_from_slice(&n);
        names.push(n);
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    (b, first_live, names)
}

/// Forged event payloads by (stream, seq), and forged names by stream id.
#[derive(Default)]
struct Forged {
    events: HashMap<(u32, u64), Vec<Vec<u8>>>,
    names: HashMap<u32, Vec<Vec<u8>>>,
}

fn segment(inp: &mut Input<'_>, number: u64, forged: &mut Forged) -> Vec<u8> {
    let mut b = vec![0u8; SEG];
    b[0..8].copy_from_slice(b"SSELOGSG");
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    b[12..16].copy_from_slice(&64u32.to_le_bytes());
    b[16..24].copy_from_slice(&EPOCH.to_le_bytes());
    b[24..32].copy_from_slice(&number.to_le_bytes());
    b[32..40].copy_from_slice(&(SEG as u64).to_le_bytes());
    b[40..48].copy_from_slice(&1_700_000_000_000u64.to_le_bytes());
    let crc = crc32c::crc32c(&b[0..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    let mut chain = crc;
    let mut data_end = 64usize;
    let entries = usize::from(inp.u8() % 24);
    for i in 0..entries {
        if inp.is_empty() {
            break;
        }
        let ctl = inp.u8();
        let kind: u8 = match ctl & 7 {
            0..=3 => 1,
            4 | 5 => 2,
            6 => 3,
            _ => inp.u8(),
        };
        let stream = match kind {
            2 => u32::from(inp.u8() % 6),
            _ => (num(inp) & 0xffff_ffff) as u32,
        };
        let seq = match kind {
            3 => {
                if ctl & 0x08 != 0 { num(inp) } else { i as u64 }
            }
            2 => 0,
            _ => num(inp),
        };
        let payload: Vec<u8> = match kind {
            2 => name(inp),
            3 => Vec::new(),
            _ => {
                let n = usize::from(inp.u8() % 48);
                let mut p = format!("id: {stream}-{seq}\ndata: ").into_bytes();
                p.extend_from_slice(inp.take(n));
                p.extend_from_slice(b"\n\n");
                p
            }
        };
        // Honest offset/length most of the time; out-of-bounds values sometimes (the CRC is
        // still computed over what recovery would read, when that is in bounds).
        let (off, len) = if ctl & 0x10 != 0 {
            ((num(inp) & 0xffff_ffff) as u32, (num(inp) & 0xffff_ffff) as u32)
        } else {
            (data_end as u32, payload.len() as u32)
        };
        let slot = SEG - 32 * (i + 1);
        if data_end + payload.len() > slot - 32 {
            break;
        }
        b[data_end..data_end + payload.len()].copy_from_slice(&payload);
        let mut e = [0u8; 32];
        e[4..8].copy_from_slice(&len.to_le_bytes());
        e[8..12].copy_from_slice(&off.to_le_bytes());
        e[12..16].copy_from_slice(&stream.to_le_bytes());
        e[16..24].copy_from_slice(&seq.to_le_bytes());
        let ts: u64 = 1_700_000_000_000 | (u64::from(kind) << 48) | if ctl & 0x20 != 0 { 1 << 56 } else { 0 };
        e[24..32].copy_from_slice(&ts.to_le_bytes());
        let covered: Vec<u8> = (off as usize)
            .checked_add(len as usize)
            .filter(|&end| end <= slot)
            .map_or(Vec::new(), |end| b[off as usize..end].to_vec());
        let crc = crc32c::crc32c_append(crc32c::crc32c_append(chain, &e[4..32]), &covered);
        e[0..4].copy_from_slice(&crc.to_le_bytes());
        b[slot..slot + 32].copy_from_slice(&e);
        chain = crc;
        match kind {
            1 => forged.events.entry((stream, seq)).or_default().push(covered.to_vec()),
            2 => forged.names.entry(stream).or_default().push(payload.clone()),
            _ => {}
        }
        // Honest entries advance the data area; dishonest ones leave it (recovery refuses them).
        data_end += payload.len();
    }
    b
}

fn contents(log: &Log) -> Vec<(String, u64, u64, Vec<Vec<u8>>)> {
    log.streams()
        .map(|(id, name, b)| {
            let recs = (b.floor..=b.visible_tail)
                .map(|q| log.record(id, q).expect("retained record").as_bytes().to_vec())
                .collect();
            (name.to_owned(), b.floor, b.tail, recs)
        })
        .collect()
}

fn scratch_root() -> &'static str {
    if Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let dir = tempfile::Builder::new().prefix("fuzz-forged").tempdir_in(scratch_root()).unwrap();
    let mut forged = Forged::default();
    let mut first = 0u64;
    let mut ckpt_names = Vec::new();
    if flags & 1 != 0 {
        let (bytes, first_live, names) = checkpoint(&mut inp);
        fs::write(dir.path().join("checkpoint"), bytes).unwrap();
        first = first_live;
        ckpt_names = names;
    }
    let segments = 1 + u64::from(flags >> 1) % 3;
    for k in 0..segments {
        let Some(n) = first.checked_add(k) else { break };
        let seg = segment(&mut inp, n, &mut forged);
        fs::write(dir.path().join(format!("{n:020}.seg")), seg).unwrap();
    }
    let Ok(mut log) = Log::open(dir.path(), opts()) else {
        return;
    };
    let got = contents(&log);
    for (id, (name, floor, tail, recs)) in got.iter().enumerate() {
        let id = id as u32;
        let named = forged.names.get(&id).is_some_and(|v| v.iter().any(|n| n == name.as_bytes()))
            || ckpt_names.get(id as usize).is_some_and(|n| n == name.as_bytes());
        assert!(named, "stream {id} has a name nobody wrote: {name:?}");
        assert!(*floor >= 1 && *floor <= tail.saturating_add(1));
        for (k, r) in recs.iter().enumerate() {
            let seq = floor + k as u64;
            let candidates = forged.events.get(&(id, seq));
            assert!(
                candidates.is_some_and(|c| c.iter().any(|p| p == r)),
                "stream {id} seq {seq}: served bytes that no entry for it holds"
            );
        }
    }
    // Keeps working: append to the first stream, reopen, same state plus the append.
    let mut after = got.clone();
    if let Some(first) = got.first() {
        match log.append(StreamId(0), None, b"after") {
            Ok(a) => {
                assert_eq!(a.id.seq, first.2 + 1);
                after[0].2 += 1;
                after[0].3.push(log.record(StreamId(0), a.id.seq).unwrap().as_bytes().to_vec());
            }
            // The explicit ends of the number spaces (only forged directories reach them).
            Err(AppendError::SequenceExhausted(_)) => assert!(first.2 >= u64::MAX - 1),
            Err(AppendError::SegmentNumbersExhausted) => {}
            Err(e) => panic!("append after recovery: {e:?}"),
        }
    }
    drop(log);
    let log = Log::open(dir.path(), opts()).expect("reopen after a successful recovery");
    assert_eq!(contents(&log), after, "reopen changed the recovered state");
});
