//! A background preparation that fails or panics: the roll creates the segment inline instead
//! of waiting forever, the failure is counted (`Log::prepare_failures`), and the `log-prepare`
//! thread survives a panicking job. Each test runs on a watchdog thread: a roll that waits
//! forever fails the test instead of hanging it.
#![forbid(unsafe_code)]

mod common;

use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::Duration;

use common::{
    append_until_prepare_queued, append_until_segment, fresh_manual, group, seg_path, thread_names,
};
use log_store::Log;

/// Asserts the roll counts `(prepared, inline, prepare_failures)`.
fn assert_rolls(log: &Log, want: (u64, u64, u64)) {
    let c = log.roll_counts();
    assert_eq!((c.prepared, c.inline, c.prepare_failures), want, "{c:?}");
}

/// Runs `test` on its own thread; fails if it does not finish within 30 s (a hang).
fn within_deadline(test: impl FnOnce() + Send + 'static) {
    let (tx, rx) = channel();
    let h = std::thread::spawn(move || {
        test();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Err(RecvTimeoutError::Timeout) => panic!("hung: a roll or wait_background waited forever"),
        // Done, or panicked (the sender dropped): its outcome.
        _ => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
    }
}

#[test]
fn a_panicking_preparation_leaves_no_roll_waiting_forever() {
    within_deadline(|| {
        let (_dir, mut log, s) = fresh_manual(group());
        let mut next = 0;
        log.panic_next_preparation();
        append_until_prepare_queued(&mut log, s, &mut next);
        let ran = catch_unwind(AssertUnwindSafe(|| log.run_background_jobs()));
        assert!(ran.is_err(), "the job panicked");
        log.wait_background();
        append_until_segment(&mut log, s, &mut next, 1);
        assert_rolls(&log, (0, 1, 1));
        assert_eq!(log.prepare_failures(), 1);
    });
}

#[test]
fn a_failed_preparation_is_counted_and_the_roll_creates_the_segment_inline() {
    within_deadline(|| {
        let (dir, mut log, s) = fresh_manual(group());
        let mut next = 0;
        append_until_prepare_queued(&mut log, s, &mut next);
        // Something in the file's way: the preparation fails (EEXIST), as a failed
        // `fdatasync` or directory `fsync` would; then the way is clear for the roll.
        fs::create_dir(seg_path(dir.path(), 1)).unwrap();
        assert!(log.run_background_jobs() >= 1);
        fs::remove_dir(seg_path(dir.path(), 1)).unwrap();
        assert_eq!(log.prepare_failures(), 1);
        append_until_segment(&mut log, s, &mut next, 1);
        assert_rolls(&log, (0, 1, 1));
        // The next preparation succeeds: nothing more counted.
        append_until_prepare_queued(&mut log, s, &mut next);
        log.run_background_jobs();
        append_until_segment(&mut log, s, &mut next, 2);
        assert_rolls(&log, (1, 1, 1));
    });
}

#[test]
fn the_log_prepare_thread_survives_a_panicking_job() {
    within_deadline(|| {
        log_store::prepare_in_background().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), group()).unwrap();
        let s = log.create_stream("s").unwrap();
        let mut next = 0;
        log.panic_next_preparation();
        append_until_prepare_queued(&mut log, s, &mut next);
        log.wait_background();
        append_until_segment(&mut log, s, &mut next, 1);
        assert_eq!(log.prepare_failures(), 1);
        // The next preparation runs on the thread (a dead one's would run inline, at once).
        append_until_prepare_queued(&mut log, s, &mut next);
        log.wait_background();
        append_until_segment(&mut log, s, &mut next, 2);
        let c = log.roll_counts();
        assert_eq!((c.prepared, c.prepare_failures), (1, 1), "{c:?}");
        std::thread::sleep(Duration::from_millis(50));
        assert!(thread_names().iter().any(|n| n == "log-prepare"));
    });
}
