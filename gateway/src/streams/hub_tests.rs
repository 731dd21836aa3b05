//! Group-commit rounds: one `fdatasync` per file, or one `syncfs` for a round of several
//! files (`--fsync-scope filesystem`), and what each completion ends.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use super::*;

/// A hub of `shards` real logs in `dir` (group commit), with a sync directory when
/// `files_min` is set.
fn hub(dir: &std::path::Path, shards: u32, files_min: Option<usize>) -> Hub {
    let opts = log_store::LogOptions {
        segment_bytes: 64 * 1024,
        record_bytes_max: 4096,
        fsync: log_store::FsyncPolicy::Group,
        ..log_store::LogOptions::default()
    };
    let logs = (0..shards)
        .map(|s| {
            let d = dir.join(format!("shard-{s}"));
            (s, Log::open(&d, opts.clone()).unwrap())
        })
        .collect();
    let sync_dir = files_min.map(|files_min| SyncDir {
        fd: OwnedFd::from(std::fs::File::open(dir).unwrap()),
        files_min,
    });
    Hub::new(logs, shards).with_sync_dir(sync_dir)
}

/// Appends one event to a stream of `shard`; the wait its publish would hold.
fn append(hub: &mut Hub, shard: u32, name: &str) -> Wait {
    let sid = hub.log_mut(shard).create_stream(name).unwrap();
    let m = metrics::CoreMetrics::default();
    let p = hub.append_events((shard, sid), &[(None, b"x".to_vec())], (false, false), &m);
    p.wait.expect("a group-commit append waits")
}

fn rounds(ops: &[SyncOp]) -> Vec<u32> {
    (ops.iter())
        .filter_map(|op| match *op {
            SyncOp::Filesystem { round, .. } => Some(round),
            SyncOp::File { .. } => None,
        })
        .collect()
}

#[test]
fn a_round_of_several_shards_is_one_syncfs_and_its_completion_ends_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let mut hub = hub(dir.path(), 3, Some(2));
    let t = Instant::now();
    let (a, b) = (append(&mut hub, 0, "a"), append(&mut hub, 1, "b"));
    let ops = hub.start_syncs(t);
    let r = rounds(&ops);
    assert_eq!((ops.len(), r.len()), (1, 1), "{ops:?}");
    assert!(!hub.visible(a) && !hub.visible(b));
    // While the round is in flight nothing starts, not even another shard's lone file: what
    // is dirty meanwhile goes together in the next round.
    append(&mut hub, 0, "a2");
    let c = append(&mut hub, 2, "c");
    assert_eq!(hub.start_syncs(t), []);
    // The syncfs completes: both shards' records are visible, touched for wake-ups.
    hub.end_turn();
    assert!(hub.on_syncfs(r[0], 0, 0, t).is_some());
    assert!(hub.visible(a) && hub.visible(b) && !hub.visible(c));
    let mut touched: Vec<u32> = hub.end_turn().iter().map(|k| k.0).collect();
    touched.dedup();
    assert_eq!(touched, [0, 1]);
    // A second completion of the same round (none is in flight) changes nothing.
    assert_eq!(hub.on_syncfs(r[0], -libc::EIO, 0, t), None);
    assert!(!hub.poisoned(0) && !hub.poisoned(1));
    // The next round holds shard 0's and shard 2's appends: one syncfs again.
    let r2 = rounds(&hub.start_syncs(t));
    assert_eq!(r2.len(), 1);
    assert!(hub.on_syncfs(r2[0], 0, 0, t).is_some());
    assert!(hub.visible(c));
    // A round of one file is its fdatasync, and while that runs a syncfs round may start.
    append(&mut hub, 0, "a3");
    let ops = hub.start_syncs(t);
    assert!(
        matches!(ops[..], [SyncOp::File { shard: 0, .. }]),
        "{ops:?}"
    );
    append(&mut hub, 1, "b3");
    append(&mut hub, 2, "c3");
    assert_eq!(rounds(&hub.start_syncs(t)).len(), 1);
}

#[test]
fn a_failed_syncfs_poisons_every_shard_of_its_round_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let mut hub = hub(dir.path(), 3, Some(2));
    let t = Instant::now();
    let c = append(&mut hub, 2, "c");
    let ops = hub.start_syncs(t);
    assert!(matches!(ops[..], [SyncOp::File { shard: 2, .. }]));
    hub.on_fsync(2, 0, 0, t);
    let (a, b) = (append(&mut hub, 0, "a"), append(&mut hub, 1, "b"));
    let r = rounds(&hub.start_syncs(t));
    assert_eq!(r.len(), 1);
    assert!(hub.on_syncfs(r[0], -libc::EIO, 0, t).is_some());
    assert!(hub.poisoned(0) && hub.poisoned(1) && !hub.poisoned(2));
    let mut failed = hub.take_failed();
    failed.sort_unstable();
    assert_eq!(failed, [0, 1]);
    assert!(!hub.visible(a) && !hub.visible(b) && hub.visible(c));
}

#[test]
fn rounds_use_syncfs_only_from_the_file_count_asked_and_never_without_a_sync_dir() {
    let t = Instant::now();
    // No sync directory: one fdatasync per file, whatever the round holds.
    let dir = tempfile::tempdir().unwrap();
    let mut hub = self::hub(dir.path(), 3, None);
    for s in 0..3 {
        append(&mut hub, s, &format!("s{s}"));
    }
    let ops = hub.start_syncs(t);
    assert_eq!((ops.len(), rounds(&ops).len()), (3, 0), "{ops:?}");
    // files_min 1 (the simulator draws it): even a round of one file is a syncfs.
    let dir = tempfile::tempdir().unwrap();
    let mut hub = self::hub(dir.path(), 1, Some(1));
    let w = append(&mut hub, 0, "s");
    let r = rounds(&hub.start_syncs(t));
    assert_eq!(r.len(), 1);
    hub.on_syncfs(r[0], 0, 0, t);
    assert!(hub.visible(w));
}

#[test]
fn round_numbers_wrap_within_the_bits_user_data_carries() {
    let dir = tempfile::tempdir().unwrap();
    let mut hub = hub(dir.path(), 2, Some(2));
    hub.next_round = ROUND_MASK;
    let t = Instant::now();
    for round in [ROUND_MASK, 0] {
        let a = append(&mut hub, 0, &format!("a{round}"));
        let b = append(&mut hub, 1, &format!("b{round}"));
        assert_eq!(rounds(&hub.start_syncs(t)), [round]);
        assert!(hub.on_syncfs(round, 0, 0, t).is_some());
        assert!(hub.visible(a) && hub.visible(b));
    }
}

/// `--group-commit-hold-us-max`: a commit that answered several publishes holds the shard's
/// next one until as many publishes arrived again, or until its time is up (the core's wake
/// deadline says when); a lone publisher's commits are never held.
#[test]
fn a_commit_that_answered_several_publishes_holds_the_next_until_they_are_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut hub = hub(dir.path(), 1, None).with_commit_hold(Duration::from_millis(5));
    // The log stamps its records with the real clock: the test's clock runs ahead of it, so
    // a due time never passes a hold's end however slowly this thread runs.
    let t = Instant::now() + Duration::from_secs(60);
    let waits = [append(&mut hub, 0, "a"), append(&mut hub, 0, "b")];
    assert_eq!(hub.start_syncs(t).len(), 1);
    let done = t + Duration::from_millis(2);
    hub.on_fsync(0, 0, 0, done);
    assert!(waits.iter().all(|w| hub.visible(*w)));
    // One of the two publishers is back: held (until the commit's own 2 ms have passed).
    let c = append(&mut hub, 0, "c");
    assert_eq!(hub.start_syncs(done), []);
    assert_eq!(
        hub.next_sync_deadline(),
        Some(done + Duration::from_millis(2))
    );
    // The second is back: the commit starts at once and covers both.
    let d = append(&mut hub, 0, "d");
    assert_eq!(hub.start_syncs(done).len(), 1);
    let done2 = done + Duration::from_millis(2);
    hub.on_fsync(0, 0, 0, done2);
    assert!(hub.visible(c) && hub.visible(d));
    // Only one comes back: its commit starts when the hold's time is up, not before.
    let e = append(&mut hub, 0, "e");
    assert_eq!(hub.start_syncs(done2 + Duration::from_micros(1_999)), []);
    let at = done2 + Duration::from_millis(2);
    assert_eq!(hub.start_syncs(at).len(), 1);
    hub.on_fsync(0, 0, 0, at + Duration::from_millis(1));
    assert!(hub.visible(e));
    // That commit answered one publish: the next is not held.
    append(&mut hub, 0, "f");
    assert_eq!(hub.start_syncs(at + Duration::from_millis(1)).len(), 1);
}

/// No hold with `syncfs` rounds (holds ending apart would split a round into lone files), and
/// no timer while a round is in flight (its completion is the next event).
#[test]
fn syncfs_rounds_are_not_held_and_set_no_timer_while_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let mut hub = hub(dir.path(), 2, Some(2)).with_commit_hold(Duration::from_millis(5));
    let t = Instant::now() + Duration::from_secs(60);
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        append(&mut hub, (i % 2) as u32, name);
    }
    let r = rounds(&hub.start_syncs(t));
    assert_eq!(r.len(), 1);
    append(&mut hub, 0, "e");
    assert_eq!(hub.next_sync_deadline(), None, "a round in flight");
    let done = t + Duration::from_millis(2);
    assert!(hub.on_syncfs(r[0], 0, 0, done).is_some());
    // Each shard's commit answered 2 publishes, yet the next round starts at once.
    append(&mut hub, 1, "f");
    assert_eq!(rounds(&hub.start_syncs(done)).len(), 1);
}
