//! Appends `N` records of `SIZE` bytes (fsync=never, retention bounding the disk footprint) and
//! prints wall time per append. Meant to be run under `perf stat -e task-clock` so CPU time per
//! append can be read even when other processes share the machine (criterion measures wall
//! time only). Usage: `append_cpu [N] [SIZE]`.
#![forbid(unsafe_code)]

use std::time::{Instant, SystemTime};

use log_store::{FsyncPolicy, Log, LogOptions};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = LogOptions {
        segment_bytes: 64 << 20,
        retain_bytes: Some(256 << 20),
        fsync: FsyncPolicy::Never,
        ..LogOptions::default()
    };
    let mut log = Log::open(dir.path(), opts).expect("open");
    let s = log.create_stream("bench").expect("stream");
    let data: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
    let t0 = Instant::now();
    for i in 0..n {
        if i % 4096 == 4095 {
            log.enforce_retention(SystemTime::now()).expect("retention");
        }
        log.append(s, None, &data).expect("append");
    }
    let dt = t0.elapsed();
    println!(
        "{n} appends of {size} B: {:.0} ns/append wall, {:.0} MB/s payload wall",
        dt.as_nanos() as f64 / n as f64,
        (n as f64 * size as f64) / dt.as_secs_f64() / 1e6
    );
}
