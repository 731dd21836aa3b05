//! Stream removal through the public API: a removed stream is gone for reads, appends and
//! bounds; a recreated name gets a new id, so the old incarnation's event IDs resume as another
//! stream (through `plan_resume` and `ResumePlan::outcome`); removal follows the group commit
//! (`SyncReport::removed`, `removal_is_durable`); it survives restarts, including after
//! retention deleted the segments holding the name and removal records; other streams' appends
//! are unaffected; the expiry and `--streams-max` queries.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io;
use std::time::SystemTime;

use log_store::{
    AppendError, Bounds, EventId, FsyncPolicy, Log, LogOptions, ReadError, RemoveError, Removed,
    ResumeClass, ResumeInput, ResumeOutcome, ResumePlan, StreamId, SyncJob, WindowView,
    plan_resume,
};

const SEG: u64 = 64 * 1024;

fn opts(fsync: FsyncPolicy) -> LogOptions {
    LogOptions {
        segment_bytes: SEG,
        record_bytes_max: 8 * 1024,
        retain_bytes: Some(3 * SEG),
        fsync,
        ..LogOptions::default()
    }
}

/// `fdatasync`s every file of the job, as the gateway does through io_uring.
fn run(job: &SyncJob) -> io::Result<()> {
    for fd in job.fds() {
        File::from(fd.try_clone_to_owned()?).sync_data()?;
    }
    Ok(())
}

fn resume(log: &Log, stream: StreamId, requested: EventId, w: Option<WindowView>) -> ResumePlan {
    plan_resume(&ResumeInput {
        log_epoch: log.epoch(),
        stream,
        bounds: log.bounds(stream).unwrap(),
        requested,
        window: w,
        known_epochs: &[],
    })
}

/// Every visible record of `s` as text, read through `read` in small batches.
fn text(log: &Log, s: StreamId) -> String {
    let b = log.bounds(s).unwrap();
    let mut out = String::new();
    let mut next = b.floor;
    loop {
        let batch = log.read(s, next, 300).unwrap();
        if batch.is_empty() {
            return out;
        }
        assert_eq!(batch.first, next);
        for sl in &batch.slices {
            out += std::str::from_utf8(sl.as_bytes()).unwrap();
        }
        next = batch.last + 1;
    }
}

fn framed(log: &Log, stream: StreamId, seq: u64, data: &str) -> String {
    let id = EventId {
        epoch: log.epoch(),
        stream,
        seq,
    };
    format!("id: {id}\ndata: {data}\n\n")
}

/// The old incarnation's ID against the new stream: `OtherStream`, refused as such by the
/// outcome — even with a window that looks like the new stream's own and a sequence the new
/// stream has too. The new incarnation's own ID replays.
fn check_old_id_is_another_stream(log: &Log, old: EventId, new: StreamId) {
    let epoch = log.epoch();
    assert!(
        log.bounds(new).unwrap().visible_tail > old.seq,
        "same seq exists in new"
    );
    let window = WindowView {
        epoch,
        stream: new,
        head: old.seq + 1,
        last: old.seq + 1,
        contiguous: true,
    };
    for w in [None, Some(window)] {
        let plan = resume(log, new, old, w);
        assert_eq!(
            plan,
            ResumePlan::OtherStream {
                got: old.stream,
                expected: new
            }
        );
        let ResumeOutcome::Refused(r) = plan.outcome() else {
            panic!("an old incarnation's ID is refused, not served: {plan:?}");
        };
        assert_eq!(
            (r.class, r.code),
            (ResumeClass::OtherStream, "other_stream")
        );
    }
    let own = EventId {
        epoch,
        stream: new,
        seq: old.seq,
    };
    assert_eq!(
        resume(log, new, own, None),
        ResumePlan::Replay { from: old.seq + 1 }
    );
}

#[test]
fn remove_then_recreate_gives_a_new_id_and_old_ids_resume_as_another_stream() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts(FsyncPolicy::Never)).unwrap();
    let a = log.create_stream("a").unwrap();
    let s = log.create_stream("s").unwrap();
    for i in 1..=3 {
        log.append(s, None, format!("old {i}").as_bytes()).unwrap();
    }
    log.append(a, None, b"a1").unwrap();
    let old = EventId {
        epoch: log.epoch(),
        stream: s,
        seq: 3,
    };
    let pinned = log.read(s, 1, usize::MAX).unwrap();

    assert_eq!(log.remove_stream(s).unwrap(), Removed { durable: true });
    assert_eq!(log.stream_id("s"), None);
    assert_eq!((log.bounds(s), log.stream_name(s)), (None, None));
    assert!(log.is_removed(s) && log.removal_is_durable(s));
    assert_eq!(log.read(s, 1, 100).unwrap_err(), ReadError::StreamRemoved);
    assert_eq!(log.record(s, 1).unwrap_err(), ReadError::StreamRemoved);
    assert!(matches!(
        log.append(s, None, b"x"),
        Err(AppendError::StreamRemoved(id)) if id == s
    ));
    assert!(matches!(
        log.remove_stream(s),
        Err(RemoveError::AlreadyRemoved(id)) if id == s
    ));
    let never = StreamId(9);
    assert!(matches!(
        log.remove_stream(never),
        Err(RemoveError::UnknownStream(id)) if id == never
    ));
    assert!(!log.is_removed(never) && !log.removal_is_durable(never));
    assert_eq!(log.read(never, 1, 1).unwrap_err(), ReadError::UnknownStream);
    assert!(!log.stream_is_empty(s));
    let listed: Vec<StreamId> = log.streams().map(|(id, _, _)| id).collect();
    assert_eq!(listed, [a]);
    assert_eq!((log.stream_count(), log.live_stream_count()), (2, 1));
    // A batch read before the removal keeps its bytes (it pins its segment).
    let text_pinned: String = pinned
        .slices
        .iter()
        .map(|sl| std::str::from_utf8(sl.as_bytes()).unwrap())
        .collect();
    assert!(text_pinned.starts_with(&framed(&log, s, 1, "old 1")));

    let s2 = log.create_stream("s").unwrap();
    assert_eq!(s2, StreamId(2), "a new id: ids are never reused");
    assert_eq!(log.create_stream("s").unwrap(), s2);
    let mut want = String::new();
    for i in 1..=5 {
        log.append(s2, None, format!("new {i}").as_bytes()).unwrap();
        want += &framed(&log, s2, i, &format!("new {i}"));
    }
    assert_eq!(text(&log, s2), want, "only the new incarnation's events");
    check_old_id_is_another_stream(&log, old, s2);
    drop((log, pinned));

    let mut log = Log::open(dir.path(), opts(FsyncPolicy::Never)).unwrap();
    assert!(log.is_removed(s) && log.bounds(s).is_none());
    assert_eq!(log.stream_id("s"), Some(s2));
    assert_eq!(log.create_stream("s").unwrap(), s2);
    check_old_id_is_another_stream(&log, old, s2);
    assert_eq!(log.create_stream("t").unwrap(), StreamId(3));
    assert_eq!((log.stream_count(), log.live_stream_count()), (4, 3));
}

#[test]
fn removal_follows_the_group_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts(FsyncPolicy::Group)).unwrap();
    let (a, b) = (
        log.create_stream("a").unwrap(),
        log.create_stream("b").unwrap(),
    );
    log.append(a, None, b"a1").unwrap();
    log.append(b, None, b"b1").unwrap();
    log.append(b, None, b"b2").unwrap();
    assert_eq!(log.remove_stream(b).unwrap(), Removed { durable: false });
    assert!(log.is_removed(b) && !log.removal_is_durable(b));
    assert!(log.sync_due(std::time::Instant::now()));
    let job = log.begin_sync().unwrap();
    // Removed while that sync runs: left for the next one.
    let c = log.create_stream("c").unwrap();
    log.remove_stream(c).unwrap();
    let outcome = run(&job);
    let report = log.finish_sync(job, outcome).unwrap();
    assert_eq!(
        report.advanced,
        vec![(a, 1)],
        "a removed stream is not advanced"
    );
    assert_eq!(report.removed, vec![b]);
    assert!(log.removal_is_durable(b) && !log.removal_is_durable(c));
    let job = log.begin_sync().unwrap();
    let outcome = run(&job);
    let report = log.finish_sync(job, outcome).unwrap();
    assert_eq!((report.advanced, report.removed), (vec![], vec![c]));
    assert!(log.removal_is_durable(c));

    // `sync_now` with a sync in flight covers its removals; `finish_sync` does not repeat them.
    let d = log.create_stream("d").unwrap();
    log.remove_stream(d).unwrap();
    let job = log.begin_sync().unwrap();
    assert_eq!(log.sync_now().unwrap().removed, vec![d]);
    assert!(log.removal_is_durable(d));
    let outcome = run(&job);
    assert_eq!(log.finish_sync(job, outcome).unwrap().removed, vec![]);

    // A failed sync poisons the log: the removal never becomes durable, no more removals.
    let e = log.create_stream("e").unwrap();
    log.remove_stream(e).unwrap();
    let job = log.begin_sync().unwrap();
    assert!(log.finish_sync(job, Err(io::Error::other("EIO"))).is_err());
    assert!(!log.removal_is_durable(e));
    assert!(matches!(log.remove_stream(a), Err(RemoveError::Poisoned)));
    assert!(log.bounds(a).is_some());
}

#[test]
fn stream_is_empty_and_live_stream_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts(FsyncPolicy::Group)).unwrap();
    let hot = log.create_stream("hot").unwrap();
    let idle = log.create_stream("idle").unwrap();
    assert!(log.stream_is_empty(idle) && log.stream_is_empty(hot));
    log.append(idle, None, b"unsynced still counts").unwrap();
    assert!(!log.stream_is_empty(idle));
    assert_eq!(log.bounds(idle).unwrap().visible_tail, 0);
    // Retention deletes the segment holding idle's only event: empty again.
    let payload = "h".repeat(2000);
    while log.active_segment() < 4 {
        log.append(hot, None, payload.as_bytes()).unwrap();
    }
    log.enforce_retention(SystemTime::now()).unwrap();
    assert_eq!(
        log.bounds(idle).unwrap(),
        Bounds {
            floor: 2,
            tail: 1,
            visible_tail: 1
        }
    );
    assert!(log.stream_is_empty(idle) && !log.stream_is_empty(hot));
    assert_eq!(log.live_stream_count(), 2);
    log.remove_stream(idle).unwrap();
    assert!(
        !log.stream_is_empty(idle),
        "a removed stream is not an expiry candidate"
    );
    assert!(!log.stream_is_empty(StreamId(77)));
    assert_eq!((log.stream_count(), log.live_stream_count()), (2, 1));
    log.sync_now().unwrap();
    drop(log);
    let log = Log::open(dir.path(), opts(FsyncPolicy::Group)).unwrap();
    assert_eq!((log.stream_count(), log.live_stream_count()), (2, 1));
}

/// Under every policy a synced removal survives a restart, and ids continue past it.
#[test]
fn removal_survives_restart_under_each_policy() {
    for fsync in [
        FsyncPolicy::Never,
        FsyncPolicy::Group,
        FsyncPolicy::Always,
        FsyncPolicy::Interval { interval_ms: 5 },
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), opts(fsync)).unwrap();
        let gone = log.create_stream("gone").unwrap();
        let kept = log.create_stream("kept").unwrap();
        log.append(gone, None, b"g").unwrap();
        log.append(kept, None, b"k").unwrap();
        log.remove_stream(gone).unwrap();
        let report = log.sync_now().unwrap();
        assert_eq!(
            report.removed.is_empty(),
            fsync == FsyncPolicy::Never,
            "{fsync:?}"
        );
        assert!(log.removal_is_durable(gone));
        drop(log);
        let mut log = Log::open(dir.path(), opts(fsync)).unwrap();
        assert!(
            log.is_removed(gone) && log.removal_is_durable(gone),
            "{fsync:?}"
        );
        assert_eq!(log.stream_id("gone"), None);
        assert_eq!(text(&log, kept), framed(&log, kept, 1, "k"));
        assert_eq!(log.create_stream("gone").unwrap(), StreamId(2), "{fsync:?}");
    }
}

/// Streams removed and recreated among appends to others: the others' sequences stay dense
/// (no gap, no duplicate) and their bytes exact, before and after a restart.
#[test]
fn appends_to_other_streams_are_unaffected() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts(FsyncPolicy::Group)).unwrap();
    let a = log.create_stream("a").unwrap();
    let mut b = log.create_stream("b").unwrap();
    let c = log.create_stream("c").unwrap();
    let (mut want_a, mut want_c) = (String::new(), String::new());
    let mut removed = Vec::new();
    for round in 1..=60u64 {
        let ra = log.append(a, None, format!("a{round}").as_bytes()).unwrap();
        log.append(b, None, b"b").unwrap();
        let rc = log.append(c, None, format!("c{round}").as_bytes()).unwrap();
        assert_eq!((ra.id.seq, rc.id.seq), (round, round));
        want_a += &framed(&log, a, round, &format!("a{round}"));
        want_c += &framed(&log, c, round, &format!("c{round}"));
        if round % 7 == 0 {
            log.remove_stream(b).unwrap();
            removed.push(b);
            b = log.create_stream("b").unwrap();
        }
        if round % 5 == 0 {
            let job = log.begin_sync().unwrap();
            let outcome = run(&job);
            let report = log.finish_sync(job, outcome).unwrap();
            assert!(report.advanced.contains(&(a, round)));
            assert!(report.advanced.iter().all(|(id, _)| !removed.contains(id)));
        }
    }
    log.sync_now().unwrap();
    assert_eq!(
        (text(&log, a), text(&log, c)),
        (want_a.clone(), want_c.clone())
    );
    assert_eq!(b, StreamId(2 + removed.len() as u32));
    drop(log);
    let log = Log::open(dir.path(), opts(FsyncPolicy::Group)).unwrap();
    assert_eq!((text(&log, a), text(&log, c)), (want_a, want_c));
    assert!(removed.iter().all(|&r| log.is_removed(r)));
    assert_eq!(log.stream_id("b"), Some(b));
    assert_eq!(log.bounds(b).unwrap().tail, 60 % 7);
}

/// A removal survives after retention deleted the segment with the stream's name record
/// (checkpoint: live; removal record: still scanned), the segment with its removal record
/// too (checkpoint: tombstone), and with both records still in a live segment though the
/// checkpoint already lists the stream as removed. Ids continue past every removed one.
#[test]
fn removal_survives_retention_of_its_name_and_removal_records() {
    let dir = tempfile::tempdir().unwrap();
    let o = || opts(FsyncPolicy::Group);
    let mut log = Log::open(dir.path(), o()).unwrap();
    let hot = log.create_stream("hot").unwrap();
    let payload = "h".repeat(3000);
    let fill_until = |log: &mut Log, seg: u64| {
        while log.active_segment() < seg {
            log.append(hot, None, payload.as_bytes()).unwrap();
        }
    };
    // Segment 0: `early` removed (name and removal records), `b` removed and recreated,
    // `late` created (removed only after its name record is gone).
    let early = log.create_stream("early").unwrap();
    log.append(early, None, b"e").unwrap();
    log.remove_stream(early).unwrap();
    let b1 = log.create_stream("b").unwrap();
    log.append(b1, None, b"b1").unwrap();
    log.remove_stream(b1).unwrap();
    let b2 = log.create_stream("b").unwrap();
    log.append(b2, None, b"b2-1").unwrap();
    let late = log.create_stream("late").unwrap();
    log.append(late, None, b"l").unwrap();
    fill_until(&mut log, 4);
    // Segment 4 (stays live): `z` created, appended to and removed entirely inside it.
    let z = log.create_stream("z").unwrap();
    log.append(z, None, b"z").unwrap();
    log.remove_stream(z).unwrap();
    log.append(b2, None, b"b2-2").unwrap();
    assert_eq!(log.active_segment(), 4);
    let report = log.enforce_retention(SystemTime::now()).unwrap();
    assert!(report.segments_deleted >= 2, "{report:?}");
    assert!(!dir.path().join(format!("{:020}.seg", 0)).exists());
    // The checkpoint lists `late` live; its removal record goes into a live segment.
    log.remove_stream(late).unwrap();
    log.sync_now().unwrap();
    // `b2_floor`: 2 while segment 4 (with b2-2) lives, 3 once it is retired.
    let check = |log: &Log, b2_floor: u64| {
        for gone in [early, b1, late, z] {
            assert!(log.is_removed(gone) && log.bounds(gone).is_none(), "{gone}");
        }
        assert_eq!(log.stream_id("b"), Some(b2));
        let b = log.bounds(b2).unwrap();
        assert_eq!(
            (b.floor, b.tail),
            (b2_floor, 2),
            "b2-1 retired with segment 0"
        );
        let want = if b2_floor == 2 {
            framed(log, b2, 2, "b2-2")
        } else {
            String::new()
        };
        assert_eq!(text(log, b2), want);
        for name in ["early", "late", "z"] {
            assert_eq!(log.stream_id(name), None);
        }
        assert_eq!((log.stream_count(), log.live_stream_count()), (6, 2));
    };
    check(&log, 2);
    drop(log);
    let mut log = Log::open(dir.path(), o()).unwrap();
    check(&log, 2);
    // Retire segment 4 too (the removal records of `late` and `z`): only the checkpoint
    // remembers any of the removed streams now.
    fill_until(&mut log, 9);
    log.enforce_retention(SystemTime::now()).unwrap();
    assert!(!dir.path().join(format!("{:020}.seg", 4)).exists());
    check(&log, 3);
    drop(log);
    let mut log = Log::open(dir.path(), o()).unwrap();
    check(&log, 3);
    assert_eq!(log.create_stream("z").unwrap(), StreamId(6));
    assert_eq!(log.create_stream("early").unwrap(), StreamId(7));
}
