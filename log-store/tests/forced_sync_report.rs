//! What a sync the log runs on its own makes visible — a roll's forced sync (a segment filled
//! before its header was durable), inline retention's sync — is reported to the caller by the
//! next `finish_sync`, `sync_now` or `poll_sync`: the caller wakes subscribers from reports,
//! and no later sync names those streams again. This binary never starts the `log-prepare`
//! thread, so `Log::open` is inline.
#![forbid(unsafe_code)]

mod common;

use std::time::{Instant, SystemTime};

use common::{append_until_segment, commit_all, group, group_retaining};
use log_store::{Log, StreamId, SyncReport};

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
    let mut log = Log::open(dir.path(), group_retaining(2)).unwrap();
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
