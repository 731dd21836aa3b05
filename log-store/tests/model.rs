//! Model-based property test: random operations (stream creation, removal and recreation under
//! the same name, appends over many streams, syncs, range reads, resumes through the planner,
//! retention, clean reopen, and crashes that tear unsynced records off the active segment) run
//! against the real `Log` and a plain in-memory model. Every read must equal the model's suffix
//! or be the explicit truncation / beyond-tail / removed-stream error the model predicts; an
//! event ID of a removed incarnation resumes as another stream; recovery must keep every synced
//! record (and removal) and drop exactly a suffix of unsynced ones. It runs inline and in
//! background mode (segments prepared and checkpoints written by queued jobs, run at random
//! points). `PROPTEST_CASES` overrides the case count (default 24).
#![forbid(unsafe_code)]

use std::fs;
use std::path::Path;
use std::time::SystemTime;

use log_store::resume::{ResumeInput, ResumeOutcome, ResumePlan, WindowView, plan_resume};
use log_store::{AppendError, Epoch, EventId, FsyncPolicy, Log, LogOptions, ReadError, StreamId};
use proptest::prelude::*;

const SEGMENT_BYTES: u64 = 64 * 1024;
const NAMES: [&str; 6] = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"];

fn options() -> LogOptions {
    LogOptions {
        segment_bytes: SEGMENT_BYTES,
        retain_bytes: Some(2 * SEGMENT_BYTES),
        retain_secs: None,
        fsync: FsyncPolicy::Always,
        record_bytes_max: 8 * 1024,
        epoch_on_create: None,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Create(u8),
    Remove(u8),
    Append {
        stream: u8,
        shape: u8,
        len: u16,
        typed: bool,
    },
    Sync,
    Read {
        stream: u8,
        from: u8,
        bytes_max: u16,
    },
    Resume {
        stream: u8,
        n: u8,
        window: Option<(i8, u8, bool, bool)>,
    },
    Retention,
    Reopen,
    Crash {
        tear: u8,
        flip: bool,
    },
    /// Run the background jobs queued so far (background-mode runs only).
    Background,
    /// Hold a read batch (as an in-flight send would) across later operations.
    Pin {
        stream: u8,
        from: u8,
    },
    Unpin,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => any::<u8>().prop_map(Op::Create),
        1 => any::<u8>().prop_map(Op::Remove),
        24 => (any::<u8>(), any::<u8>(), prop_oneof![0u16..80, 0u16..3000], any::<bool>())
            .prop_map(|(stream, shape, len, typed)| Op::Append { stream, shape, len, typed }),
        3 => Just(Op::Sync),
        5 => (any::<u8>(), any::<u8>(), prop_oneof![1u16..400, 1u16..20000])
            .prop_map(|(stream, from, bytes_max)| Op::Read { stream, from, bytes_max }),
        4 => (any::<u8>(), any::<u8>(), proptest::option::of((-2i8..=2, 0u8..4, any::<bool>(), any::<bool>())))
            .prop_map(|(stream, n, window)| Op::Resume { stream, n, window }),
        1 => Just(Op::Retention),
        1 => Just(Op::Reopen),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(tear, flip)| Op::Crash { tear, flip }),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(stream, from)| Op::Pin { stream, from }),
        1 => Just(Op::Unpin),
    ]
}

/// The background-mode runs add points where the queued background jobs run.
fn op_bg() -> impl Strategy<Value = Op> {
    prop_oneof![16 => op(), 1 => Just(Op::Background)]
}

/// Opens the log inline, or in background mode with the jobs run by hand (`Op::Background`).
fn open(dir: &Path, bg: bool) -> Log {
    if bg {
        Log::open_with_manual_background(dir, options()).unwrap()
    } else {
        Log::open(dir, options()).unwrap()
    }
}

/// Event data of a given shape (plain, with line breaks of every kind, unicode).
fn data(shape: u8, len: u16, salt: u64) -> String {
    let base: String = (0..len as u64)
        .map(|i| (b'a' + ((i + salt) % 26) as u8) as char)
        .collect();
    match shape % 4 {
        0 => base,
        1 => base
            .char_indices()
            .map(|(i, c)| match i % 37 {
                5 => '\n',
                11 => '\r',
                _ => c,
            })
            .collect(),
        2 => format!("{base}\r\n{base}\n"),
        _ => format!("é{base}✓"),
    }
}

/// Independent SSE framing (per the SSE spec's line splitting) for the model.
fn frame(id: &EventId, typ: Option<&str>, data: &str) -> Vec<u8> {
    let mut out = format!("id: {id}\n");
    if let Some(t) = typ {
        out += &format!("event: {t}\n");
    }
    let mut line = String::new();
    let mut chars = data.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                out += &format!("data: {line}\n");
                line.clear();
            }
            '\n' => {
                out += &format!("data: {line}\n");
                line.clear();
            }
            c => line.push(c),
        }
    }
    out += &format!("data: {line}\n\n");
    out.into_bytes()
}

#[derive(Debug, Clone, Copy)]
enum Write {
    Name(usize),
    Event(usize),
    Remove(usize),
}

#[derive(Debug, Default)]
struct MStream {
    floor: u64,
    visible: u64,
    /// `recs[seq - 1]` = framed bytes (kept even below the floor, for reference).
    recs: Vec<Vec<u8>>,
    removed: bool,
}

/// Per stream id (dense, never reused): its name and state.
#[derive(Debug, Default)]
struct Model {
    names: Vec<&'static str>,
    streams: Vec<MStream>,
    writes: Vec<Write>,
    synced: usize,
    /// Removals not yet synced, in order.
    pending_removals: Vec<StreamId>,
}

impl Model {
    fn sync(&mut self) {
        self.synced = self.writes.len();
        self.pending_removals.clear();
        for s in &mut self.streams {
            s.visible = s.recs.len() as u64;
        }
    }

    fn live_id(&self, name: &str) -> Option<usize> {
        (0..self.names.len()).find(|&i| self.names[i] == name && !self.streams[i].removed)
    }
}

/// Reads everything from `from` through the visible tail in small batches.
fn read_all(log: &Log, s: StreamId, from: u64) -> Result<Vec<u8>, ReadError> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let b = log.read(s, next, 700)?;
        if b.is_empty() {
            return Ok(out);
        }
        assert_eq!(b.first, next.max(1));
        for sl in &b.slices {
            out.extend_from_slice(sl.as_bytes());
        }
        next = b.last + 1;
    }
}

fn active_segment(dir: &Path) -> std::path::PathBuf {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v.pop().unwrap()
}

fn check_equal(log: &Log, m: &Model) {
    assert_eq!(log.stream_count(), m.streams.len());
    let live = m.streams.iter().filter(|s| !s.removed).count();
    assert_eq!(log.live_stream_count(), live);
    assert_eq!(log.streams().count(), live);
    for (i, ms) in m.streams.iter().enumerate() {
        let s = StreamId(i as u32);
        if ms.removed {
            assert!(log.is_removed(s), "stream {i} removed");
            assert_eq!((log.bounds(s), log.stream_name(s)), (None, None));
            assert_eq!(log.read(s, 1, 100).unwrap_err(), ReadError::StreamRemoved);
            continue;
        }
        assert_eq!(log.stream_id(m.names[i]), Some(s));
        assert_eq!(log.stream_name(s), Some(m.names[i]));
        assert_eq!(log.stream_is_empty(s), ms.floor > ms.recs.len() as u64);
        let b = log.bounds(s).unwrap();
        assert_eq!(
            (b.floor, b.tail, b.visible_tail),
            (ms.floor, ms.recs.len() as u64, ms.visible)
        );
        let got = read_all(log, s, ms.floor).unwrap();
        let want: Vec<u8> = ms.recs[(ms.floor - 1) as usize..ms.visible as usize].concat();
        assert_eq!(got, want, "stream {i} content");
    }
}

fn run(ops: Vec<Op>, bg: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), bg);
    let epoch = log.epoch();
    let mut m = Model::default();
    // Pinned batches with the bytes they held when taken.
    let mut pins: Vec<(log_store::ReadBatch, Vec<u8>)> = Vec::new();
    // Segments numbered below this were retired by retention.
    let mut first_live = 0u64;
    // One batch reused by `read_into` across every read (as a server's core does).
    let mut scratch = log_store::ReadBatch::default();
    for (step, op) in ops.into_iter().enumerate() {
        if matches!(op, Op::Reopen | Op::Crash { .. }) {
            pins.clear(); // slices hold the directory lock
        }
        match op {
            Op::Background => {
                log.run_background_jobs();
            }
            Op::Pin { stream, from } => {
                if m.streams.is_empty() {
                    continue;
                }
                let si = stream as usize % m.streams.len();
                let ms = &m.streams[si];
                if ms.removed {
                    continue;
                }
                let from = ms.floor + from as u64 % (ms.visible + 2 - ms.floor);
                let b = log.read(StreamId(si as u32), from, 5000).unwrap();
                let bytes: Vec<u8> = b
                    .slices
                    .iter()
                    .flat_map(|s| s.as_bytes().to_vec())
                    .collect();
                let want: Vec<u8> = ms.recs[(from - 1) as usize..b.last as usize].concat();
                assert_eq!(bytes, want);
                pins.push((b, bytes));
                if pins.len() > 4 {
                    pins.remove(0);
                }
            }
            Op::Unpin => {
                if !pins.is_empty() {
                    pins.remove(0);
                }
            }
            Op::Create(k) => {
                let name = NAMES[k as usize % NAMES.len()];
                let id = log.create_stream(name).unwrap();
                if let Some(pos) = m.live_id(name) {
                    assert_eq!(id.0 as usize, pos);
                } else {
                    // New, or recreated after a removal: the next id, never an old one.
                    assert_eq!(id.0 as usize, m.names.len());
                    m.names.push(name);
                    m.streams.push(MStream {
                        floor: 1,
                        visible: 0,
                        recs: Vec::new(),
                        removed: false,
                    });
                    m.writes.push(Write::Name(id.0 as usize));
                }
            }
            Op::Remove(k) => {
                if m.streams.is_empty() {
                    continue;
                }
                let si = k as usize % m.streams.len();
                let s = StreamId(si as u32);
                let r = log.remove_stream(s);
                if m.streams[si].removed {
                    assert!(matches!(r, Err(log_store::RemoveError::AlreadyRemoved(_))));
                    continue;
                }
                assert!(!r.unwrap().durable);
                assert!(log.is_removed(s) && !log.removal_is_durable(s));
                m.streams[si].removed = true;
                m.writes.push(Write::Remove(si));
                m.pending_removals.push(s);
            }
            Op::Append {
                stream,
                shape,
                len,
                typed,
            } => {
                if m.streams.is_empty() {
                    continue;
                }
                let si = stream as usize % m.streams.len();
                let d = data(shape, len, step as u64);
                let typ = typed.then_some("tick");
                let r = log.append(StreamId(si as u32), typ, d.as_bytes());
                if m.streams[si].removed {
                    assert!(matches!(r, Err(AppendError::StreamRemoved(s)) if s.0 as usize == si));
                    continue;
                }
                let r = r.unwrap();
                let ms = &mut m.streams[si];
                assert_eq!(
                    r.id,
                    EventId {
                        epoch,
                        stream: StreamId(si as u32),
                        seq: ms.recs.len() as u64 + 1
                    }
                );
                assert!(!r.durable);
                ms.recs.push(frame(&r.id, typ, &d));
                m.writes.push(Write::Event(si));
            }
            Op::Sync => {
                let report = log.sync_now().unwrap();
                let mut adv = report.advanced;
                adv.sort();
                let mut want: Vec<(StreamId, u64)> = m
                    .streams
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.removed && s.visible < s.recs.len() as u64)
                    .map(|(i, s)| (StreamId(i as u32), s.recs.len() as u64))
                    .collect();
                want.sort();
                assert_eq!(adv, want);
                assert_eq!(report.removed, m.pending_removals);
                assert!(report.removed.iter().all(|&s| log.removal_is_durable(s)));
                m.sync();
            }
            Op::Read {
                stream,
                from,
                bytes_max,
            } => {
                if m.streams.is_empty() {
                    continue;
                }
                let si = stream as usize % m.streams.len();
                let ms = &m.streams[si];
                let from = from as u64 % (ms.recs.len() as u64 + 3);
                let res = log.read(StreamId(si as u32), from, bytes_max as usize);
                // The reusing read answers exactly as the allocating one, whatever the batch
                // held before.
                let again =
                    log.read_into(StreamId(si as u32), from, bytes_max as usize, &mut scratch);
                match &res {
                    Ok(b) => {
                        assert_eq!(again, Ok(()));
                        assert_eq!((scratch.first, scratch.last), (b.first, b.last));
                        assert_eq!(scratch.record_lens, b.record_lens);
                        let bytes = |x: &log_store::ReadBatch| -> Vec<Vec<u8>> {
                            x.slices.iter().map(|s| s.as_bytes().to_vec()).collect()
                        };
                        assert_eq!(bytes(&scratch), bytes(b));
                        // Its slices move on (a core drains them into a window): the batch
                        // keeps only vector capacity, never pins a segment.
                        scratch.slices.clear();
                    }
                    Err(e) => assert_eq!(again.as_ref().unwrap_err(), e),
                }
                if ms.removed {
                    assert_eq!(res.unwrap_err(), ReadError::StreamRemoved);
                    continue;
                }
                let f = from.max(1);
                if f < ms.floor {
                    assert_eq!(
                        res.unwrap_err(),
                        ReadError::Truncated {
                            requested: f,
                            floor: ms.floor,
                            tail: ms.visible
                        }
                    );
                } else if f > ms.visible + 1 {
                    assert_eq!(
                        res.unwrap_err(),
                        ReadError::BeyondTail {
                            requested: f,
                            tail: ms.visible
                        }
                    );
                } else {
                    let b = res.unwrap();
                    assert_eq!(b.first, f);
                    let mut want = Vec::new();
                    let mut lens = Vec::new();
                    let mut last = f - 1;
                    for seq in f..=ms.visible {
                        let r = &ms.recs[seq as usize - 1];
                        if !want.is_empty() && want.len() + r.len() > bytes_max as usize {
                            break;
                        }
                        want.extend_from_slice(r);
                        lens.push(r.len() as u32);
                        last = seq;
                    }
                    assert_eq!(b.last, last);
                    assert_eq!(b.record_lens, lens);
                    let got: Vec<u8> = b
                        .slices
                        .iter()
                        .flat_map(|s| s.as_bytes().to_vec())
                        .collect();
                    assert_eq!(got, want);
                    let mut expect_first = f;
                    for s in &b.slices {
                        assert_eq!(s.first_seq(), expect_first);
                        assert!(s.last_seq() >= s.first_seq());
                        expect_first = s.last_seq() + 1;
                    }
                }
            }
            Op::Resume { stream, n, window } => {
                if m.streams.is_empty() {
                    continue;
                }
                let si = stream as usize % m.streams.len();
                let s = StreamId(si as u32);
                let ms = &m.streams[si];
                if ms.removed {
                    continue;
                }
                let n = n as u64 % (ms.recs.len() as u64 + 3);
                // Sometimes an ID of an earlier, removed incarnation of the same name: another
                // stream, whatever its sequence and the window.
                let old = (0..si).find(|&o| m.names[o] == m.names[si] && m.streams[o].removed);
                let asked = old.filter(|_| n % 2 == 1).map_or(s, |o| StreamId(o as u32));
                let window = window.map(|(delta, len, contiguous, foreign)| {
                    let head = (n as i64 + 1 + delta as i64).max(0) as u64;
                    WindowView {
                        epoch: if foreign { Epoch(epoch.0 ^ 1) } else { epoch },
                        stream: s,
                        head,
                        last: (head + len as u64).saturating_sub(1),
                        contiguous,
                    }
                });
                let input = ResumeInput {
                    log_epoch: epoch,
                    stream: s,
                    bounds: log.bounds(s).unwrap(),
                    requested: EventId {
                        epoch,
                        stream: asked,
                        seq: n,
                    },
                    window,
                    known_epochs: &[],
                };
                if asked != s {
                    let plan = plan_resume(&input);
                    let want = ResumePlan::OtherStream {
                        got: asked,
                        expected: s,
                    };
                    assert_eq!(plan, want);
                    assert!(matches!(plan.outcome(), ResumeOutcome::Refused(_)));
                    continue;
                }
                let want: Option<Vec<u8>> = (n + 1 >= ms.floor && n <= ms.visible)
                    .then(|| ms.recs[n as usize..ms.visible as usize].concat());
                match plan_resume(&input) {
                    ResumePlan::Aligned {
                        window_from,
                        window_to,
                        then_log_from,
                    } => {
                        let w = window.unwrap();
                        assert!(w.contiguous && w.epoch == epoch);
                        // The window physically holds the model's records head..=last.
                        let mut got: Vec<u8> = (window_from..=window_to)
                            .flat_map(|q| ms.recs[q as usize - 1].clone())
                            .collect();
                        got.extend(read_all(&log, s, then_log_from).unwrap());
                        assert_eq!(Some(got), want);
                    }
                    ResumePlan::Replay { from } => {
                        assert_eq!(Some(read_all(&log, s, from).unwrap()), want);
                    }
                    ResumePlan::UpToDate { from } => {
                        assert_eq!(from, n + 1);
                        assert_eq!(want, Some(vec![]));
                    }
                    ResumePlan::Truncated { .. } => assert!(n + 1 < ms.floor && want.is_none()),
                    ResumePlan::BeyondTail { .. } => assert!(n > ms.visible && want.is_none()),
                    other => panic!("unexpected plan {other:?}"),
                }
            }
            Op::Retention => {
                log.sync_now().unwrap();
                m.sync();
                let segs_before: Vec<Vec<u64>> = m
                    .streams
                    .iter()
                    .enumerate()
                    .map(|(i, ms)| {
                        if ms.removed {
                            return Vec::new();
                        }
                        (ms.floor..=ms.visible)
                            .map(|q| log.record(StreamId(i as u32), q).unwrap().segment_number())
                            .collect()
                    })
                    .collect();
                let report = log.enforce_retention(SystemTime::now()).unwrap();
                // (Background mode: the checkpoint and the deletions happen here.)
                log.run_background_jobs();
                first_live += report.segments_deleted as u64;
                for (i, ms) in m.streams.iter_mut().enumerate() {
                    if ms.removed {
                        continue;
                    }
                    let gone = segs_before[i].iter().filter(|&&g| g < first_live).count() as u64;
                    let floor = ms.floor + gone;
                    assert_eq!(
                        log.bounds(StreamId(i as u32)).unwrap().floor,
                        floor,
                        "exact floor of stream {i}"
                    );
                    if gone > 0 {
                        assert!(
                            report
                                .floors_advanced
                                .contains(&(StreamId(i as u32), floor))
                        );
                    }
                    ms.floor = floor;
                }
                // A retired segment's file outlives retention exactly while a pin points into it.
                for n in first_live.saturating_sub(8)..first_live {
                    let pinned = pins
                        .iter()
                        .any(|(b, _)| b.slices.iter().any(|sl| sl.segment_number() == n));
                    let exists = dir.path().join(format!("{n:020}.seg")).exists();
                    assert_eq!(exists, pinned, "retired segment {n}: file kept iff pinned");
                }
            }
            Op::Reopen => {
                drop(log);
                log = open(dir.path(), bg);
                assert_eq!(log.epoch(), epoch);
                m.sync(); // everything recovered is durable and visible
            }
            Op::Crash { tear, flip } => {
                log.simulate_crash();
                let path = active_segment(dir.path());
                let mut bytes = fs::read(&path).unwrap();
                let len = bytes.len();
                let slot = |i: usize| len - 32 * (i + 1);
                let mut n_active = 0;
                while bytes[slot(n_active)..slot(n_active) + 32]
                    .iter()
                    .any(|&b| b != 0)
                {
                    n_active += 1;
                }
                let tearable = n_active.min(m.writes.len() - m.synced);
                // Background mode: a roll's header waits for the previous seal to be synced;
                // a crash before that loses the whole segment, which nothing synced reached.
                let headless = bytes[..64].iter().all(|&b| b == 0);
                assert!(!headless || (bg && n_active == tearable));
                let t = if headless {
                    n_active
                } else {
                    tear as usize % (tearable + 1)
                };
                if t > 0 && !headless {
                    let first_torn = n_active - t;
                    if flip {
                        // Corrupt the first torn record's payload; later entries stay intact.
                        let e = slot(first_torn);
                        let off =
                            u32::from_le_bytes(bytes[e + 8..e + 12].try_into().unwrap()) as usize;
                        bytes[off] ^= 0x40;
                    } else {
                        for i in first_torn..n_active {
                            bytes[slot(i)..slot(i) + 32].fill(0);
                        }
                    }
                    fs::write(&path, &bytes).unwrap();
                }
                log = open(dir.path(), bg);
                assert_eq!(log.epoch(), epoch);
                if t > 0 && !headless {
                    assert_eq!(log.recovery().torn_tail_offset.is_some(), flip);
                }
                for _ in 0..t {
                    match m.writes.pop().unwrap() {
                        Write::Event(si) => {
                            m.streams[si].recs.pop().unwrap();
                        }
                        Write::Name(si) => {
                            assert_eq!(si + 1, m.streams.len());
                            assert!(m.streams.pop().unwrap().recs.is_empty());
                            m.names.pop();
                        }
                        // The removal was lost: the stream is back with its events.
                        Write::Remove(si) => m.streams[si].removed = false,
                    }
                }
                m.sync();
            }
        }
        for (b, bytes) in &pins {
            let now: Vec<u8> = b
                .slices
                .iter()
                .flat_map(|s| s.as_bytes().to_vec())
                .collect();
            assert_eq!(&now, bytes, "a pinned slice changed (step {step})");
        }
        if step % 16 == 0 {
            check_equal(&log, &m);
        }
    }
    check_equal(&log, &m);
    drop(pins);
    drop(log);
    let log = open(dir.path(), bg);
    m.sync();
    check_equal(&log, &m);
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn log_matches_model(ops in proptest::collection::vec(op(), 1..250)) {
        run(ops, false);
    }

    /// The same in background mode: next segments prepared and checkpoints written by queued
    /// jobs (run at random points), background rolls deferring their headers.
    #[test]
    fn log_matches_model_in_background_mode(ops in proptest::collection::vec(op_bg(), 1..250)) {
        run(ops, true);
    }
}
