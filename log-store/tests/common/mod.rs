//! Helpers shared by the integration tests: the 64 KiB-segment options, record filling up to a
//! roll, running a group commit's `fdatasync`s by hand, and the root-only tmpfs mount of the
//! full-disk tests. Not every test binary uses every item.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use log_store::{FsyncPolicy, Log, LogOptions, StreamId, SyncJob, SyncReport};

/// The segment size of the roll tests.
#[allow(dead_code)]
pub const SEG: u64 = 64 * 1024;

/// 64 KiB segments, 8 KiB records, the given policy.
#[allow(dead_code)]
pub fn opts(fsync: FsyncPolicy) -> LogOptions {
    LogOptions {
        segment_bytes: SEG,
        record_bytes_max: 8 * 1024,
        fsync,
        ..LogOptions::default()
    }
}

/// [`opts`] under the group commit.
#[allow(dead_code)]
pub fn group() -> LogOptions {
    opts(FsyncPolicy::Group)
}

/// [`group`] with retention keeping `segments` segments' worth of bytes.
#[allow(dead_code)]
pub fn group_retaining(segments: u64) -> LogOptions {
    LogOptions {
        retain_bytes: Some(segments * SEG),
        ..group()
    }
}

/// A log in background mode with the jobs queued for `run_background_jobs`, and its stream "s".
#[allow(dead_code)]
pub fn open_manual(dir: &Path, o: LogOptions) -> (Log, StreamId) {
    let mut log = Log::open_with_manual_background(dir, o).unwrap();
    let s = log.create_stream("s").unwrap();
    (log, s)
}

/// [`open_manual`] in a fresh temporary directory; the directory first, so that it outlives the
/// log when both are dropped.
#[allow(dead_code)]
pub fn fresh_manual(o: LogOptions) -> (tempfile::TempDir, Log, StreamId) {
    let dir = tempfile::tempdir().unwrap();
    let (log, s) = open_manual(dir.path(), o);
    (dir, log, s)
}

#[allow(dead_code)]
pub fn seg_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("{n:020}.seg"))
}

/// The `i`th filler record: about 900 bytes.
#[allow(dead_code)]
pub fn record(i: usize) -> String {
    format!("{i:05} {}", "r".repeat(900))
}

/// Appends filler records until `until` holds; `next` numbers them.
fn append_while(log: &mut Log, s: StreamId, next: &mut usize, until: impl Fn(&Log) -> bool) {
    while !until(log) {
        log.append(s, None, record(*next).as_bytes()).unwrap();
        *next += 1;
    }
}

/// Appends until the active segment is past half full and its successor's preparation is
/// requested.
#[allow(dead_code)]
pub fn append_until_prepare_queued(log: &mut Log, s: StreamId, next: &mut usize) {
    append_while(log, s, next, Log::next_segment_requested);
}

/// Appends until the log rolls to segment `to`.
#[allow(dead_code)]
pub fn append_until_segment(log: &mut Log, s: StreamId, next: &mut usize, to: u64) {
    append_while(log, s, next, |log| log.active_segment() >= to);
}

/// `fdatasync`s every file of the job, as the gateway does through io_uring.
#[allow(dead_code)]
pub fn run(job: &SyncJob) -> io::Result<()> {
    for fd in job.fds() {
        File::from(fd.try_clone_to_owned()?).sync_data()?;
    }
    Ok(())
}

/// Group commits until nothing is left to sync; everything they reported.
#[allow(dead_code)]
pub fn commit_all(log: &mut Log) -> SyncReport {
    let mut all = SyncReport::default();
    while let Some(job) = log.begin_sync() {
        let outcome = run(&job);
        let r = log.finish_sync(job, outcome).unwrap();
        all.advanced.extend(r.advanced);
        all.removed.extend(r.removed);
    }
    all
}

/// The names of this process's threads (from /proc/self/task).
#[allow(dead_code)]
pub fn thread_names() -> Vec<String> {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .collect()
}

/// Whether the effective user is root (from /proc/self/status).
fn is_root() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        == Some("0")
}

/// Runs `test` in a fresh 300 KiB tmpfs (room for 4 segments of 64 KiB, not 5), unmounted
/// afterwards even if `test` panics. Needs root: not root, it fails unless
/// `GATEWAY_TESTS_WITHOUT_ROOT=1` says to skip `name`.
#[allow(dead_code)]
pub fn on_small_tmpfs(name: &str, test: impl FnOnce(&Path) + std::panic::UnwindSafe) {
    if !is_root() {
        assert!(
            std::env::var_os("GATEWAY_TESTS_WITHOUT_ROOT").is_some(),
            "mounts a tmpfs: needs root (set GATEWAY_TESTS_WITHOUT_ROOT=1 to skip)"
        );
        eprintln!("SKIPPED {name}: not root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=300k", "tmpfs"])
        .arg(dir.path())
        .status()
        .expect("run mount");
    assert!(mounted.success(), "mount failed (needs root)");
    let path = dir.path().to_owned();
    let result = std::panic::catch_unwind(move || test(&path));
    let _ = std::process::Command::new("umount")
        .arg(dir.path())
        .status();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
