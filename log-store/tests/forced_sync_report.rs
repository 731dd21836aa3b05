//! What a sync the log runs on its own makes visible — a roll's forced sync (a segment filled
//! before its header was durable), inline retention's sync — is reported to the caller by the
//! next `finish_sync`, `sync_now` or `poll_sync`: the caller wakes subscribers from reports,
//! and no later sync names those streams again. This binary never starts the `log-prepare`
//! thread, so `Log::open` is inline.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io;
use std::time::{Instant, SystemTime};

use log_store::{FsyncPolicy, Log, LogOptions, StreamId, SyncJob, SyncReport};

const SEG: u64 = 64 * 1024;

fn group() -> LogOptions {
    LogOptions {
        segment_bytes: SEG,
        record_bytes_max: 8 * 1024,
        fsync: FsyncPolicy::Group,
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

/// Group commits until nothing is left to sync; everything they reported.
fn commit_all(log: &mut Log) -> SyncReport {
    let mut all = SyncReport::default();
    while let Some(job) = log.begin_sync() {
        let outcome = run(&job);
        let r = log.finish_sync(job, outcome).unwrap();
        all.advanced.extend(r.advanced);
        all.removed.extend(r.removed);
    }
    all
}

fn record(i: usize) -> String {
    format!("{i:05} {}", "r".repeat(900))
}

/// Appends to `s` until the log rolls to segment `to`.
fn append_until_segment(log: &mut Log, s: StreamId, next: &mut usize, to: u64) {
    while log.active_segment() < to {
        log.append(s, None, record(*next).as_bytes()).unwrap();
        *next += 1;
    }
}

/// Background mode (jobs never run): `b` appended and `c` removed, neither synced, then `a`
/// fills segment 1 before its deferred header is durable. The roll syncs inside the append:
/// `b` becomes visible and `c`'s removal durable there. Returns the log and `(a, b, c)`.
fn roll_with_forced_sync(dir: &std::path::Path) -> (Log, [StreamId; 3]) {
    let mut log = Log::open_with_manual_background(dir, group()).unwrap();
    let [a, b, c] = ["a", "b", "c"].map(|n| log.create_stream(n).unwrap());
    log.append(c, None, b"c").unwrap();
    commit_all(&mut log);
    let mut next = 0;
    append_until_segment(&mut log, a, &mut next, 1);
    log.append(b, None, b"b's record").unwrap();
    assert!(!log.remove_stream(c).unwrap().durable);
    assert_eq!(log.bounds(b).unwrap().visible_tail, 0);
    append_until_segment(&mut log, a, &mut next, 2);
    assert_eq!(log.roll_counts().flushed, 1, "the roll synced first");
    assert_eq!(
        log.bounds(b).unwrap().visible_tail,
        1,
        "moved inside a's append"
    );
    assert!(log.removal_is_durable(c));
    (log, [a, b, c])
}

#[test]
fn a_rolls_forced_sync_is_reported_by_the_next_group_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, [a, b, c]) = roll_with_forced_sync(dir.path());
    let r = commit_all(&mut log);
    assert!(r.advanced.contains(&(b, 1)), "{r:?}");
    assert!(r.advanced.iter().any(|&(id, _)| id == a), "{r:?}");
    assert_eq!(r.removed, vec![c]);
    // Reported once.
    log.append(a, None, b"more").unwrap();
    let r = commit_all(&mut log);
    assert!(r.advanced.iter().all(|&(id, _)| id == a) && r.removed.is_empty());
}

#[test]
fn a_rolls_forced_sync_is_reported_by_the_next_sync_now() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, [a, b, c]) = roll_with_forced_sync(dir.path());
    let r = log.sync_now().unwrap();
    let tail_a = log.bounds(a).unwrap().tail;
    assert_eq!(
        r.advanced,
        vec![(a, tail_a), (b, 1)],
        "one entry per stream"
    );
    assert_eq!(r.removed, vec![c]);
    assert_eq!(log.sync_now().unwrap(), SyncReport::default());
}

#[test]
fn inline_retentions_sync_is_reported_by_the_next_poll_sync() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogOptions {
        retain_bytes: Some(2 * SEG),
        ..group()
    };
    let mut log = Log::open(dir.path(), opts).unwrap();
    let [a, b] = ["a", "b"].map(|n| log.create_stream(n).unwrap());
    let mut next = 0;
    append_until_segment(&mut log, a, &mut next, 4);
    log.sync_now().unwrap();
    log.append(b, None, b"b's record").unwrap();
    let report = log.enforce_retention(SystemTime::now()).unwrap();
    assert!(report.segments_deleted >= 2, "{report:?}");
    assert_eq!(log.bounds(b).unwrap().visible_tail, 1, "retention synced");
    // Nothing is due any more, yet the next poll reports `b`, once.
    assert!(!log.sync_due(Instant::now()));
    let r = log.poll_sync(Instant::now()).unwrap();
    assert_eq!(r.advanced, vec![(b, 1)]);
    assert_eq!(
        log.poll_sync(Instant::now()).unwrap(),
        SyncReport::default()
    );
}

#[test]
fn a_stream_removed_before_the_report_is_not_reported_advanced() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, [a, b, c]) = roll_with_forced_sync(dir.path());
    log.remove_stream(b).unwrap();
    let r = commit_all(&mut log);
    assert!(r.advanced.iter().all(|&(id, _)| id == a), "{r:?}");
    assert_eq!(r.removed, vec![c, b]);
}
