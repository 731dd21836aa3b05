//! Fuzz target: log-store recovery of corrupted directories. A template log is built once per
//! process (four 64 KiB segments, three streams, interleaved multi-line events, one retention
//! pass so a checkpoint exists and stream floors are above 1). Each input is a list of damage
//! operations on a fresh copy (in /dev/shm when present): flip a byte anywhere, flip a byte in
//! the entry area at the end of a segment, overwrite a whole 32-byte entry slot, truncate a
//! file, delete a file. Then `Log::open` must either return an error or a log whose state is
//! prefix-consistent with what was written:
//! - every stream it knows has its original name and id;
//! - every retained record (`floor..=visible_tail`) is byte-identical to the original event
//!   with that sequence (nothing invented, nothing shifted);
//! - `visible_tail == tail <= the original tail`;
//! - it keeps working: an append gets `tail + 1`, and a reopen sees the same records plus it.
//! Never a panic, abort or SIGBUS.
#![no_main]

use std::cell::RefCell;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use libfuzzer_sys::fuzz_target;
use log_store::{FsyncPolicy, Log, LogOptions, StreamId};
use sse_gateway_fuzz::Input;

const SEG: u64 = 64 * 1024;
const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];
const OPS_MAX: usize = 8;

fn opts() -> LogOptions {
    LogOptions {
        segment_bytes: SEG,
        record_bytes_max: 8 * 1024,
        retain_bytes: Some(4 * SEG),
        fsync: FsyncPolicy::Never,
        ..LogOptions::default()
    }
}

struct Template {
    /// (file name, bytes), sorted by name; LOCK excluded.
    files: Vec<(String, Vec<u8>)>,
    /// Per stream id: every event ever written, framed (index = seq - 1).
    records: Vec<Vec<Vec<u8>>>,
}

thread_local! {
    static TEMPLATE: RefCell<Option<Template>> = const { RefCell::new(None) };
}

fn scratch_root() -> &'static str {
    if Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" }
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

fn build_template() -> Template {
    let dir = tempfile::Builder::new().prefix("fuzz-recovery-tpl").tempdir_in(scratch_root()).unwrap();
    let mut log = Log::open(dir.path(), opts()).unwrap();
    let ids: Vec<StreamId> = NAMES.iter().map(|n| log.create_stream(n).unwrap()).collect();
    let mut records = vec![Vec::new(); ids.len()];
    // ~5 segments of data; retention keeps 4, so segment 0 goes and a checkpoint is written.
    let mut i = 0u32;
    while log.enforce_retention(SystemTime::now()).unwrap().segments_deleted == 0 {
        let s = (i % 7 % 3) as usize;
        let data = format!("event {i}\r\nline {}\n{}", "x".repeat((i % 13) as usize), "y".repeat((i * 37 % 1500) as usize));
        let a = log.append(ids[s], (i % 3 == 0).then_some("kind"), data.as_bytes()).unwrap();
        records[s].push(log.record(ids[s], a.id.seq).unwrap().as_bytes().to_vec());
        i += 1;
        assert!(i < 100_000);
    }
    // A few records after retention so the active segment has a tail to tear.
    for j in 0..5u32 {
        let s = (j % 3) as usize;
        let a = log.append(ids[s], None, format!("after {j}").as_bytes()).unwrap();
        records[s].push(log.record(ids[s], a.id.seq).unwrap().as_bytes().to_vec());
    }
    log.sync_now().unwrap();
    drop(log);
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name() != "LOCK")
        .map(|e| (e.file_name().into_string().unwrap(), fs::read(e.path()).unwrap()))
        .collect();
    files.sort();
    assert!(files.iter().any(|(n, _)| n == "checkpoint"), "template has a checkpoint");
    Template { files, records }
}

fn write_damaged(t: &Template, dir: &Path, inp: &mut Input<'_>) {
    let mut files: Vec<(PathBuf, Option<Vec<u8>>)> =
        t.files.iter().map(|(n, b)| (dir.join(n), Some(b.clone()))).collect();
    let nops = 1 + usize::from(inp.u8()) % OPS_MAX;
    for _ in 0..nops {
        if inp.is_empty() {
            break;
        }
        let kind = inp.u8() % 8;
        let fi = usize::from(inp.u8()) % files.len();
        let at = inp.u32() as usize;
        let x = inp.u8();
        let Some(b) = files[fi].1.as_mut() else { continue };
        if b.is_empty() {
            continue;
        }
        let len = b.len();
        match kind {
            // Flip a byte anywhere.
            0 | 1 => b[at % len] ^= x | 1,
            // Flip a byte in the last 4 KiB (the entry slots grow down from the end).
            2 | 3 => b[len - 1 - at % len.min(4096)] ^= x | 1,
            // Overwrite a whole entry slot (a torn or stale 32-byte entry).
            4 if len >= 32 => {
                let slot = 1 + at % (len / 32).min(128);
                let s = len - 32 * slot;
                for (k, byte) in b[s..s + 32].iter_mut().enumerate() {
                    *byte = x.wrapping_mul(k as u8 + 1);
                }
            }
            4 => {}
            // Flip a byte in the header (first 64 bytes).
            5 => b[at % len.min(64)] ^= x | 1,
            // Truncate.
            6 => b.truncate(at % len),
            // Delete the file.
            _ => files[fi].1 = None,
        }
    }
    for (p, b) in &files {
        if let Some(b) = b {
            fs::write(p, b).unwrap();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    TEMPLATE.with(|t| {
        let mut t = t.borrow_mut();
        let t = t.get_or_insert_with(build_template);
        let dir = tempfile::Builder::new().prefix("fuzz-recovery").tempdir_in(scratch_root()).unwrap();
        write_damaged(t, dir.path(), &mut Input::new(data));
        let Ok(mut log) = Log::open(dir.path(), opts()) else {
            return; // An explicit error is an acceptable answer to damage.
        };
        let got = contents(&log);
        assert!(got.len() <= NAMES.len(), "streams invented");
        for (id, (name, floor, tail, recs)) in got.iter().enumerate() {
            assert_eq!(name, NAMES[id], "stream {id} renamed");
            let b = log.bounds(StreamId(id as u32)).unwrap();
            assert_eq!(b.visible_tail, b.tail, "fsync=never: everything recovered is visible");
            assert!(*floor >= 1 && *tail + 1 >= *floor);
            let original = &t.records[id];
            assert!(*tail <= original.len() as u64, "stream {id} tail {tail} beyond what was written");
            for (k, r) in recs.iter().enumerate() {
                let seq = floor + k as u64;
                assert_eq!(Some(r), original.get(seq as usize - 1), "stream {id} seq {seq} differs");
            }
        }
        // It keeps working: append, reopen, same state plus the new record.
        let mut after = got.clone();
        if !got.is_empty() {
            let a = log.append(StreamId(0), None, b"after recovery").expect("append after recovery");
            assert_eq!(a.id.seq, got[0].2 + 1);
            after[0].2 += 1;
            after[0].3.push(log.record(StreamId(0), a.id.seq).unwrap().as_bytes().to_vec());
        }
        drop(log);
        let log = Log::open(dir.path(), opts()).expect("reopen after a successful recovery");
        assert_eq!(contents(&log), after, "reopen changed the recovered state");
    });
});
