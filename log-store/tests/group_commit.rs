//! The asynchronous group commit (`begin_sync` … `finish_sync`): what a sync covers, what it
//! leaves for the next one, fail-stop on an fsync error, and `sync_now` with a sync in flight.

mod common;

use std::io;
use std::time::Instant;

use common::run;
use log_store::{AppendError, FsyncPolicy, Log, LogOptions, SyncError};

fn opts(segment_bytes: u64) -> LogOptions {
    LogOptions {
        segment_bytes,
        record_bytes_max: 16 * 1024,
        fsync: FsyncPolicy::Group,
        ..LogOptions::default()
    }
}

#[test]
fn a_sync_covers_what_was_appended_before_it_began_and_the_next_covers_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts(1 << 20)).unwrap();
    let (a, b) = (
        log.create_stream("a").unwrap(),
        log.create_stream("b").unwrap(),
    );
    // A reactor reads its clock at the start of a turn, before the turn's appends: the
    // commit is still due in that turn (the streams' creation synced first).
    log.sync_now().unwrap();
    assert!(!log.sync_due(Instant::now()));
    let turn_started = Instant::now();
    for i in 0..3 {
        assert!(
            !log.append(a, None, format!("a{i}").as_bytes())
                .unwrap()
                .durable
        );
    }
    log.append(b, None, b"b0").unwrap();
    assert!(
        log.sync_due(turn_started),
        "group: due as soon as anything is unsynced, by a clock read before the appends"
    );
    let now = Instant::now();
    let job = log.begin_sync().expect("something to sync");
    assert!(
        log.sync_in_flight() && !log.sync_due(now),
        "one sync at a time"
    );
    assert!(log.begin_sync().is_none());
    // Appended while the sync runs: left for the next one.
    log.append(a, None, b"a3").unwrap();
    assert_eq!(
        log.bounds(a).unwrap().visible_tail,
        0,
        "nothing visible before the sync ends"
    );
    let outcome = run(&job);
    let report = log.finish_sync(job, outcome).unwrap();
    let mut advanced = report.advanced.clone();
    advanced.sort_by_key(|(id, _)| id.0);
    assert_eq!(advanced, vec![(a, 3), (b, 1)]);
    assert_eq!(log.bounds(a).unwrap().visible_tail, 3);
    assert_eq!(log.bounds(a).unwrap().tail, 4);
    assert!(log.sync_due(Instant::now()), "a3 is unsynced");
    let job = log.begin_sync().unwrap();
    let outcome = run(&job);
    assert_eq!(
        log.finish_sync(job, outcome).unwrap().advanced,
        vec![(a, 4)]
    );
    assert!(!log.sync_due(Instant::now()) && log.begin_sync().is_none());
}

#[test]
fn a_failed_fsync_poisons_the_log_and_is_never_retried() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts(1 << 20)).unwrap();
    let a = log.create_stream("a").unwrap();
    log.append(a, None, b"lost?").unwrap();
    let job = log.begin_sync().unwrap();
    // A sync in flight: its completion is the next event, not a timer.
    log.append(a, None, b"after").unwrap();
    assert_eq!(log.next_sync_deadline(), None, "in flight");
    let eio = io::Error::from_raw_os_error(5); // EIO, as a failing disk reports it
    assert!(matches!(
        log.finish_sync(job, Err(eio)),
        Err(SyncError::Io(_))
    ));
    assert_eq!(log.bounds(a).unwrap().visible_tail, 0, "never shown");
    assert!(matches!(
        log.append(a, None, b"more"),
        Err(AppendError::Poisoned)
    ));
    assert!(!log.sync_due(Instant::now()), "no retry");
    assert_eq!(
        log.next_sync_deadline(),
        None,
        "no timer for a sync that never starts"
    );
    assert!(log.begin_sync().is_none(), "no retry");
    assert!(matches!(log.sync_now(), Err(SyncError::Poisoned)));
    assert_eq!(log.bounds(a).unwrap().visible_tail, 0);
}

#[test]
fn sync_now_with_a_sync_in_flight_covers_it_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts(1 << 20)).unwrap();
    let a = log.create_stream("a").unwrap();
    log.append(a, None, b"one").unwrap();
    let job = log.begin_sync().unwrap();
    log.append(a, None, b"two").unwrap();
    let report = log.sync_now().unwrap();
    assert_eq!(report.advanced, vec![(a, 2)]);
    let outcome = run(&job);
    assert!(log.finish_sync(job, outcome).unwrap().advanced.is_empty());
    assert_eq!(log.bounds(a).unwrap().visible_tail, 2);
}

#[test]
fn a_roll_during_a_sync_leaves_the_sealed_segment_to_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts(65536)).unwrap();
    let a = log.create_stream("a").unwrap();
    log.append(a, None, b"first").unwrap();
    let job = log.begin_sync().unwrap();
    assert_eq!(job.fds().count(), 1);
    // Past one 64 KiB segment while the sync is in flight.
    let big = vec![b'x'; 8 * 1024];
    let mut n = 1;
    while log.bounds(a).unwrap().tail < 12 {
        log.append(a, None, &big).unwrap();
        n += 1;
    }
    let outcome = run(&job);
    log.finish_sync(job, outcome).unwrap();
    assert_eq!(log.bounds(a).unwrap().visible_tail, 1);
    let job = log.begin_sync().unwrap();
    assert_eq!(job.fds().count(), 2, "the sealed segment and the new one");
    let outcome = run(&job);
    log.finish_sync(job, outcome).unwrap();
    assert_eq!(log.bounds(a).unwrap().visible_tail, n);
    drop(log);
    let log = Log::open(dir.path(), opts(65536)).unwrap();
    assert_eq!(
        log.bounds(a).unwrap().tail,
        n,
        "everything synced survives a reopen"
    );
}

#[test]
fn interval_and_never_decide_when_a_sync_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let o = LogOptions {
        fsync: FsyncPolicy::Interval { interval_ms: 50 },
        ..opts(1 << 20)
    };
    let mut log = Log::open(dir.path(), o).unwrap();
    let a = log.create_stream("a").unwrap();
    let before = Instant::now();
    log.append(a, None, b"x").unwrap();
    assert!(!log.sync_due(before), "not before the interval");
    let later = Instant::now() + std::time::Duration::from_millis(50);
    assert!(log.sync_due(later));
    drop(log);
    let dir = tempfile::tempdir().unwrap();
    let o = LogOptions {
        fsync: FsyncPolicy::Never,
        ..opts(1 << 20)
    };
    let mut log = Log::open(dir.path(), o).unwrap();
    let a = log.create_stream("a").unwrap();
    assert!(
        log.append(a, None, b"x").unwrap().durable,
        "never: visible at once"
    );
    assert!(!log.sync_due(Instant::now() + std::time::Duration::from_secs(3600)));
}
