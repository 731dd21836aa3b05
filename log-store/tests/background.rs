//! Background mode (`prepare_in_background`): the next segment prepared off the writer's
//! thread and adopted by the roll, the fallback when it is not ready, the deferred header of
//! a background roll (the previous seal first, visibility after the header), and retention's
//! checkpoint written in the background before the deletions. Crash points are taken by
//! copying the directory while the log is open (what the page cache holds: a process crash),
//! with the background jobs queued by hand (`open_with_manual_background`) and run — or not —
//! at the point under test. The last test runs the real `log-prepare` thread.
#![forbid(unsafe_code)]

mod common;

use std::fs;
use std::path::Path;
use std::time::SystemTime;

use common::{
    SEG, append_until_prepare_queued, append_until_segment, commit_all, fresh_manual, group,
    group_retaining, on_small_tmpfs, open_manual, opts, record, run, seg_path, thread_names,
};
use log_store::{FsyncPolicy, Log, LogOptions, StreamId};

fn header_is_zero(dir: &Path, n: u64) -> bool {
    fs::read(seg_path(dir, n)).unwrap()[..64]
        .iter()
        .all(|&b| b == 0)
}

/// One complete group commit; the streams it made visible.
fn group_commit(log: &mut Log) -> Vec<(StreamId, u64)> {
    let job = log.begin_sync().expect("something to sync");
    let outcome = run(&job);
    log.finish_sync(job, outcome).unwrap().advanced
}

/// Every live stream's visible records, as framed bytes.
fn contents(log: &Log) -> Vec<Vec<Vec<u8>>> {
    (0..log.stream_count() as u32)
        .map(|s| match log.bounds(StreamId(s)) {
            None => Vec::new(),
            Some(b) => (b.floor..=b.visible_tail)
                .map(|q| log.record(StreamId(s), q).unwrap().as_bytes().to_vec())
                .collect(),
        })
        .collect()
}

/// Copies every file but the lock into a fresh directory: the state a process crash leaves.
fn snapshot(src: &Path) -> tempfile::TempDir {
    let dst = tempfile::tempdir().unwrap();
    for e in fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "LOCK" {
            fs::copy(e.path(), dst.path().join(e.file_name())).unwrap();
        }
    }
    dst
}

/// Drops `log` and opens `dir` again with `o`: the same contents. Returns the reopened log.
fn reopen_same(log: Log, dir: &Path, o: LogOptions) -> Log {
    let want = contents(&log);
    drop(log);
    let log = Log::open(dir, o).unwrap();
    assert_eq!(contents(&log), want);
    log
}

#[test]
fn the_roll_adopts_the_prepared_segment_and_its_records_wait_for_its_header() {
    let (dir, mut log, s) = fresh_manual(group());
    let mut next = 0;
    append_until_prepare_queued(&mut log, s, &mut next);
    assert!(!seg_path(dir.path(), 1).exists(), "nothing prepared yet");
    assert!(log.run_background_jobs() >= 1);
    assert!(seg_path(dir.path(), 1).exists() && header_is_zero(dir.path(), 1));
    assert_eq!(fs::metadata(seg_path(dir.path(), 1)).unwrap().len(), SEG);
    // A group commit in flight across the roll covers only what was appended before it.
    log.append(s, None, b"before the roll").unwrap();
    let job = log.begin_sync().unwrap();
    let before_roll = log.bounds(s).unwrap().tail;
    append_until_segment(&mut log, s, &mut next, 1);
    log.append(s, None, b"in segment 1").unwrap();
    let tail = log.bounds(s).unwrap().tail;
    let counts = log.roll_counts();
    assert_eq!((counts.prepared, counts.inline), (1, 0));
    assert_eq!(log.inline_segment_creations(), 0);
    assert!(
        header_is_zero(dir.path(), 1),
        "header deferred: seal 0 not durable"
    );
    let outcome = run(&job);
    let r = log.finish_sync(job, outcome).unwrap();
    assert_eq!(
        r.advanced,
        vec![(s, before_roll)],
        "the pre-roll sync's own marks"
    );
    assert!(header_is_zero(dir.path(), 1));
    // The next sync covers seal 0: the header is written, nothing of segment 1 shown yet.
    assert!(group_commit(&mut log).is_empty());
    assert!(
        !header_is_zero(dir.path(), 1),
        "header written after the seal was synced"
    );
    assert_eq!(log.bounds(s).unwrap().visible_tail, before_roll);
    // The one after makes the header durable, and everything visible.
    assert_eq!(group_commit(&mut log), vec![(s, tail)]);
    assert_eq!(log.bounds(s).unwrap().visible_tail, tail);
    reopen_same(log, dir.path(), group());
}

#[test]
fn removals_and_sync_now_follow_the_deferred_header() {
    let (dir, mut log, s) = fresh_manual(group());
    let gone = log.create_stream("gone").unwrap();
    log.append(gone, None, b"x").unwrap();
    let mut next = 0;
    append_until_prepare_queued(&mut log, s, &mut next);
    log.run_background_jobs();
    append_until_segment(&mut log, s, &mut next, 1);
    log.remove_stream(gone).unwrap();
    let r = log.begin_sync().map(|j| {
        let o = run(&j);
        log.finish_sync(j, o).unwrap()
    });
    assert!(r.unwrap().removed.is_empty(), "held with the header");
    assert!(!log.removal_is_durable(gone));
    // sync_now: the previous segments, then the header, then the rest; everything released.
    let r = log.sync_now().unwrap();
    assert_eq!(r.removed, vec![gone]);
    assert!(log.removal_is_durable(gone) && !header_is_zero(dir.path(), 1));
    let b = log.bounds(s).unwrap();
    assert_eq!(b.visible_tail, b.tail);
}

#[test]
fn an_unadopted_prepared_segment_left_by_a_crash_is_deleted_at_open() {
    let (dir, mut log, s) = fresh_manual(group());
    let mut next = 0;
    append_until_prepare_queued(&mut log, s, &mut next);
    log.run_background_jobs();
    log.sync_now().unwrap();
    let want = contents(&log);
    let crashed = snapshot(dir.path());
    assert!(seg_path(crashed.path(), 1).exists());
    let mut log2 = Log::open(crashed.path(), group()).unwrap();
    assert_eq!(contents(&log2), want);
    assert_eq!(
        log2.active_segment(),
        0,
        "the blank file was not taken for a segment"
    );
    assert!(!seg_path(crashed.path(), 1).exists());
    // The number is free again: the next roll creates segment 1 normally.
    append_until_segment(&mut log2, s, &mut next, 1);
    log2.sync_now().unwrap();
    reopen_same(log2, crashed.path(), group());
    // A clean drop of the original unlinks its prepared file.
    drop(log);
    assert!(!seg_path(dir.path(), 1).exists());
}

#[test]
fn an_unadopted_recycled_spare_left_by_a_crash_is_deleted_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let o = || group_retaining(2);
    let (mut log, s) = open_manual(dir.path(), o());
    let mut next = 0;
    append_until_segment(&mut log, s, &mut next, 3);
    log.sync_now().unwrap();
    log.run_background_jobs(); // preparations queued meanwhile
    let report = log.enforce_retention(SystemTime::now()).unwrap();
    assert!(report.segments_deleted >= 1);
    log.run_background_jobs(); // checkpoint, then segment 0 becomes the spare
    assert!(dir.path().join("spare").exists());
    append_until_prepare_queued(&mut log, s, &mut next);
    log.run_background_jobs(); // the spare becomes segment 4, old bytes inside
    assert!(!dir.path().join("spare").exists());
    assert!(seg_path(dir.path(), 4).exists() && header_is_zero(dir.path(), 4));
    log.sync_now().unwrap();
    let want = contents(&log);
    let crashed = snapshot(dir.path());
    let log2 = Log::open(crashed.path(), o()).unwrap();
    assert_eq!(contents(&log2), want);
    assert!(!seg_path(crashed.path(), 4).exists());
    drop(log2);
    // The original adopts it and keeps working.
    let prepared = log.roll_counts().prepared;
    append_until_segment(&mut log, s, &mut next, 5);
    assert_eq!(log.roll_counts().prepared, prepared + 1);
    log.sync_now().unwrap();
    reopen_same(log, dir.path(), o());
}

#[test]
fn a_roll_before_the_preparation_ran_creates_the_segment_inline() {
    let (dir, mut log, s) = fresh_manual(group());
    let mut next = 0;
    append_until_prepare_queued(&mut log, s, &mut next);
    append_until_segment(&mut log, s, &mut next, 1);
    let c = log.roll_counts();
    assert_eq!((c.prepared, c.inline), (0, 1));
    assert!(
        header_is_zero(dir.path(), 1),
        "inline fallback defers its header too"
    );
    // The late job finds its preparation cancelled and touches nothing.
    assert!(log.run_background_jobs() >= 1);
    assert!(!seg_path(dir.path(), 2).exists());
    log.sync_now().unwrap();
    reopen_same(log, dir.path(), group());
}

#[test]
fn a_crash_before_the_deferred_header_drops_only_records_never_shown() {
    let (dir, mut log, s) = fresh_manual(group());
    let mut next = 0;
    append_until_prepare_queued(&mut log, s, &mut next);
    log.run_background_jobs();
    log.sync_now().unwrap();
    let shown = contents(&log);
    append_until_segment(&mut log, s, &mut next, 1);
    for i in 0..3 {
        log.append(s, None, format!("unseen {i}").as_bytes())
            .unwrap();
    }
    let in_seg0 = next - 1; // the record that rolled went into segment 1
    assert!(header_is_zero(dir.path(), 1));
    // Process crash: the page cache holds segment 0's seal; segment 1 has entries, no header.
    let crashed = snapshot(dir.path());
    let log2 = Log::open(crashed.path(), group()).unwrap();
    let got = contents(&log2);
    assert_eq!(
        got[s.0 as usize].len(),
        in_seg0,
        "all of segment 0, none of segment 1"
    );
    assert_eq!(
        &got[s.0 as usize][..shown[s.0 as usize].len()],
        &shown[s.0 as usize][..]
    );
    assert_eq!(
        log2.active_segment(),
        1,
        "a fresh segment 1 follows the sealed segment 0"
    );
    assert!(!header_is_zero(crashed.path(), 1));
    drop(log2);
    // Power loss: segment 0's seal (and unsynced records) did not reach the disk either.
    let crashed = snapshot(dir.path());
    let p0 = seg_path(crashed.path(), 0);
    let mut b = fs::read(&p0).unwrap();
    let len = b.len();
    let shown_entries = 1 + shown[s.0 as usize].len(); // the name record + synced events
    let mut i = shown_entries;
    while b[len - 32 * (i + 1)..len - 32 * i].iter().any(|&x| x != 0) {
        b[len - 32 * (i + 1)..len - 32 * i].fill(0);
        i += 1;
    }
    fs::write(&p0, &b).unwrap();
    let log3 = Log::open(crashed.path(), group()).unwrap();
    assert_eq!(contents(&log3), shown, "exactly what was durable");
    assert_eq!(log3.active_segment(), 0, "segment 0 is active again");
    drop(log3);
    // A clean drop writes the header (after flushing segment 0): nothing is lost.
    log.sync_now().unwrap();
    reopen_same(log, dir.path(), group());
}

/// A manual-background log rolled to segment 1 (its header deferred), then "last" appended;
/// the log, its stream and the number of filler records.
fn rolled_to_segment_1_then_last(dir: &Path) -> (Log, StreamId, usize) {
    let (mut log, s) = open_manual(dir, group());
    let mut next = 0;
    append_until_segment(&mut log, s, &mut next, 1);
    log.append(s, None, b"last").unwrap();
    (log, s, next)
}

#[test]
fn a_clean_drop_keeps_records_behind_a_deferred_header() {
    let dir = tempfile::tempdir().unwrap();
    let (log, s, _) = rolled_to_segment_1_then_last(dir.path());
    assert!(header_is_zero(dir.path(), 1));
    let tail = log.bounds(s).unwrap().tail;
    drop(log);
    let log = Log::open(dir.path(), group()).unwrap();
    assert_eq!(log.bounds(s).unwrap().tail, tail);
    // simulate_crash leaves it unwritten: segment 1's records go (never visible).
    let dir = tempfile::tempdir().unwrap();
    let (log, s, next) = rolled_to_segment_1_then_last(dir.path());
    log.simulate_crash();
    let log = Log::open(dir.path(), group()).unwrap();
    assert_eq!(
        log.bounds(s).unwrap().tail,
        next as u64 - 1,
        "the rolling record went too"
    );
}

#[test]
fn a_segment_filling_before_its_header_is_durable_flushes_first() {
    let (dir, mut log, s) = fresh_manual(group());
    let mut next = 0;
    append_until_segment(&mut log, s, &mut next, 1);
    append_until_segment(&mut log, s, &mut next, 2);
    assert_eq!(log.roll_counts().flushed, 1);
    assert!(
        !header_is_zero(dir.path(), 1),
        "segment 1's header written before roll 2"
    );
    let b = log.bounds(s).unwrap();
    assert_eq!(b.visible_tail, b.tail - 1, "all but the record that rolled");
    log.simulate_crash();
    let log = Log::open(dir.path(), group()).unwrap();
    assert_eq!(log.bounds(s).unwrap().tail, next as u64 - 1);
}

/// Fills `n` segments under `group`, all durable.
fn durable_segments(log: &mut Log, s: StreamId, n: u64) -> usize {
    let mut next = 0;
    append_until_segment(log, s, &mut next, n);
    log.sync_now().unwrap();
    log.run_background_jobs();
    next
}

#[test]
fn retention_deletes_only_after_its_background_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let o = || group_retaining(2);
    let (mut log, s) = open_manual(dir.path(), o());
    durable_segments(&mut log, s, 4);
    let full = contents(&log);
    let report = log.enforce_retention(SystemTime::now()).unwrap();
    let k = report.segments_deleted as u64;
    assert!(k >= 2);
    let floor = log.bounds(s).unwrap().floor;
    assert!(floor > 1, "floors move at once");
    for n in 0..k {
        assert!(
            seg_path(dir.path(), n).exists(),
            "segment {n} waits for the checkpoint"
        );
    }
    assert!(!dir.path().join("checkpoint").exists());
    // Crash before the checkpoint job ran: the old state, every record still there.
    let before = snapshot(dir.path());
    let old = Log::open(before.path(), o()).unwrap();
    assert_eq!(old.bounds(s).unwrap().floor, 1);
    assert_eq!(contents(&old), full);
    drop(old);
    // Crash after the checkpoint, before the deletions: the files below it go at open.
    let saved: Vec<Vec<u8>> = (0..k)
        .map(|n| fs::read(seg_path(dir.path(), n)).unwrap())
        .collect();
    assert!(log.run_background_jobs() >= 1);
    assert!(dir.path().join("checkpoint").exists());
    for n in 0..k {
        assert!(
            !seg_path(dir.path(), n).exists(),
            "segment {n} deleted (or the spare)"
        );
    }
    assert!(dir.path().join("spare").exists());
    let after = snapshot(dir.path());
    for (n, b) in saved.iter().enumerate() {
        fs::write(seg_path(after.path(), n as u64), b).unwrap();
    }
    let log2 = Log::open(after.path(), o()).unwrap();
    assert_eq!(log2.recovery().stale_segments_deleted, k as usize);
    assert_eq!(log2.bounds(s).unwrap().floor, floor);
    assert_eq!(contents(&log2), contents(&log));
}

#[test]
fn retention_waits_for_segments_a_group_commit_has_not_covered() {
    let dir = tempfile::tempdir().unwrap();
    let o = || group_retaining(1);
    let (mut log, s) = open_manual(dir.path(), o());
    let mut next = durable_segments(&mut log, s, 3);
    // Segment 3 then fills and rolls with nothing synced: its last records and its seal are
    // not durable, segment 4's header waits.
    append_until_segment(&mut log, s, &mut next, 4);
    let r = log.enforce_retention(SystemTime::now()).unwrap();
    assert_eq!(
        r.segments_deleted, 3,
        "0..=2 only; segment 3 is not settled"
    );
    let b = log.bounds(s).unwrap();
    assert!(b.floor <= b.visible_tail + 1 && b.visible_tail < b.tail);
    // Group commits: seal 3 durable, then header 4, then everything visible.
    commit_all(&mut log);
    let b = log.bounds(s).unwrap();
    assert_eq!(b.visible_tail, b.tail);
    let r = log.enforce_retention(SystemTime::now()).unwrap();
    assert_eq!(r.segments_deleted, 1, "segment 3 now");
    log.run_background_jobs();
    let log = reopen_same(log, dir.path(), o());
    assert_eq!(log.bounds(s).unwrap().floor, b.tail);
}

#[test]
fn a_failed_background_checkpoint_deletes_nothing_and_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let o = || group_retaining(2);
    let (mut log, s) = open_manual(dir.path(), o());
    durable_segments(&mut log, s, 4);
    // A directory where the tmp file goes: File::create fails.
    fs::create_dir(dir.path().join("checkpoint.tmp")).unwrap();
    let k = log
        .enforce_retention(SystemTime::now())
        .unwrap()
        .segments_deleted as u64;
    assert!(k >= 2);
    log.run_background_jobs();
    for n in 0..k {
        assert!(seg_path(dir.path(), n).exists(), "nothing deleted");
    }
    assert!(log.enforce_retention(SystemTime::now()).is_err());
    fs::remove_dir(dir.path().join("checkpoint.tmp")).unwrap();
    assert!(log.run_background_jobs() >= 1, "queued again");
    for n in 0..k {
        assert!(!seg_path(dir.path(), n).exists());
    }
    assert!(log.enforce_retention(SystemTime::now()).is_ok());
    let floor = log.bounds(s).unwrap().floor;
    let log = reopen_same(log, dir.path(), o());
    assert_eq!(log.bounds(s).unwrap().floor, floor);
}

#[test]
fn never_policy_in_background_mode() {
    let dir = tempfile::tempdir().unwrap();
    let o = || LogOptions {
        retain_bytes: Some(2 * SEG),
        ..opts(FsyncPolicy::Never)
    };
    let (mut log, s) = open_manual(dir.path(), o());
    let mut next = 0;
    for seg in 1..6 {
        append_until_prepare_queued(&mut log, s, &mut next);
        log.run_background_jobs();
        append_until_segment(&mut log, s, &mut next, seg);
        assert!(!header_is_zero(dir.path(), seg), "never: header at once");
        log.enforce_retention(SystemTime::now()).unwrap();
        log.run_background_jobs();
    }
    assert_eq!(log.roll_counts().prepared, 5);
    let b = log.bounds(s).unwrap();
    assert!(b.floor > 1 && b.visible_tail == b.tail);
    reopen_same(log, dir.path(), o());
}

#[test]
fn the_log_prepare_thread_prepares_and_checkpoints() {
    log_store::prepare_in_background().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let o = || group_retaining(3);
    let mut log = Log::open(dir.path(), o()).unwrap();
    let s = log.create_stream("s").unwrap();
    let mut next = 0;
    for seg in 1..8 {
        // Past half, let the thread finish its preparation, then roll onto it.
        while log.active_segment() < seg && !log.next_segment_requested() {
            log.append(s, None, record(next).as_bytes()).unwrap();
            next += 1;
            if next % 7 == 0 {
                commit_all(&mut log);
            }
        }
        log.wait_background();
        append_until_segment(&mut log, s, &mut next, seg);
        log.sync_now().unwrap();
        log.enforce_retention(SystemTime::now()).unwrap();
    }
    log.wait_background();
    assert!(log.roll_counts().prepared >= 6, "{:?}", log.roll_counts());
    let names = thread_names();
    assert!(names.iter().any(|n| n == "log-prepare"), "{names:?}");
    assert!(log.bounds(s).unwrap().floor > 1);
    reopen_same(log, dir.path(), o());
}

/// Needs root (mounts a 300 KiB tmpfs: room for 4 segments of 64 KiB, not 5), like
/// `basic.rs::full_disk_is_a_clean_disk_full_error`; `GATEWAY_TESTS_WITHOUT_ROOT=1` skips it.
#[test]
fn a_full_disk_in_background_mode_recovers_through_the_spare() {
    on_small_tmpfs(
        "a_full_disk_in_background_mode_recovers_through_the_spare",
        full_disk,
    );
}

fn full_disk(dir: &Path) {
    // Retention deletes one segment of the four that fit: it becomes the spare, and no room is
    // left for a fresh file.
    let o = || group_retaining(3);
    let (mut log, s) = open_manual(dir, o());
    let mut full = None;
    for i in 0..10_000 {
        if log.next_segment_requested() {
            log.run_background_jobs(); // prepared in time while there is room
        }
        match log.append(s, None, record(i).as_bytes()) {
            Ok(_) => {}
            Err(e) => {
                full = Some(e);
                break;
            }
        }
    }
    assert!(
        matches!(full, Some(log_store::AppendError::DiskFull)),
        "{full:?}"
    );
    let b = log.bounds(s).unwrap();
    let failed = |log: &mut Log| {
        matches!(
            log.append(s, None, b"x"),
            Err(log_store::AppendError::DiskFull)
        )
    };
    assert!(
        failed(&mut log),
        "the retry queued for the background is not run yet"
    );
    assert_eq!(
        log.bounds(s).unwrap().tail,
        b.tail,
        "failed appends appended nothing"
    );
    log.sync_now().unwrap();
    let r = log.enforce_retention(SystemTime::now()).unwrap();
    assert_eq!(r.segments_deleted, 1);
    log.run_background_jobs(); // the queued retry (still no room), then checkpoint + spare
    assert!(dir.join("spare").exists());
    assert!(
        failed(&mut log),
        "the spare is the background's: queue another retry"
    );
    log.run_background_jobs(); // adopts the spare
    let r = log.append(s, None, b"after retention").unwrap();
    assert_eq!(r.id.seq, b.tail + 1);
    log.sync_now().unwrap();
    reopen_same(log, dir, o());
}
