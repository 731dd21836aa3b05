//! Steady-state append cost: appends records of `SIZE` bytes to one stream (fsync=never,
//! `retain_bytes` = 4 segments of 64 MiB, so retired segment files are recycled), first a
//! warm-up of 6 segments' worth (until recycling is in steady state), then `N` measured appends.
//! Prints wall time and on-CPU time per append, and the slowest single append (from /proc/self/schedstat, which counts only
//! the time this thread ran, so other processes sharing the core do not inflate it; criterion
//! measures wall time only). Usage: `append_cpu [N] [SIZE]`.
#![forbid(unsafe_code)]

use std::time::{Instant, SystemTime};

use log_store::{FsyncPolicy, Log, LogOptions};

const SEGMENT_BYTES: u64 = 64 << 20;

/// Nanoseconds this (single-threaded) process has spent on a CPU.
fn cpu_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/self/schedstat").expect("schedstat");
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("schedstat field")
}

/// Framed size of a single-line event without a type: `id: <id>\n` `data: <data>\n` `\n`.
fn framed_len(id: &log_store::EventId, size: usize) -> u64 {
    (4 + id.encoded_len() + 1 + 6 + size + 1 + 1) as u64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(4_000_000);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = LogOptions {
        segment_bytes: SEGMENT_BYTES,
        retain_bytes: Some(4 * SEGMENT_BYTES),
        fsync: FsyncPolicy::Never,
        ..LogOptions::default()
    };
    let mut log = Log::open(dir.path(), opts).expect("open");
    let s = log.create_stream("bench").expect("stream");
    let data: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
    let mut appended = 0u64;
    let mut framed = 0u64;
    let append = |log: &mut Log, framed: &mut u64, appended: &mut u64| {
        *appended += 1;
        if appended.is_multiple_of(4096) {
            log.enforce_retention(SystemTime::now()).expect("retention");
        }
        let r = log.append(s, None, &data).expect("append");
        *framed += framed_len(&r.id, size);
    };
    while framed < 6 * SEGMENT_BYTES {
        append(&mut log, &mut framed, &mut appended);
    }
    let (t0, c0, f0) = (Instant::now(), cpu_ns(), framed);
    for _ in 0..n {
        append(&mut log, &mut framed, &mut appended);
    }
    let (wall, cpu) = (t0.elapsed().as_nanos() as f64, (cpu_ns() - c0) as f64);
    let (n_f, framed_f) = (n as f64, (framed - f0) as f64);
    // Separately (timing each call costs CPU): the slowest append (a segment roll) and the
    // slowest retention pass over 4 segments' worth.
    let (mut slowest_ns, mut slowest_retention_ns) = (0u128, 0u128);
    let f1 = framed;
    while framed - f1 < 4 * SEGMENT_BYTES {
        appended += 1;
        if appended.is_multiple_of(4096) {
            let t = Instant::now();
            log.enforce_retention(SystemTime::now()).expect("retention");
            slowest_retention_ns = slowest_retention_ns.max(t.elapsed().as_nanos());
        }
        let t = Instant::now();
        let r = log.append(s, None, &data).expect("append");
        slowest_ns = slowest_ns.max(t.elapsed().as_nanos());
        framed += framed_len(&r.id, size);
    }
    println!(
        "{n} appends of {size} B payload ({:.0} B framed): {:.0} ns/append on CPU \
         ({:.0} MB/s payload, {:.0} MB/s framed per CPU-second); {:.0} ns/append wall; \
         slowest append (a segment roll) {:.2} ms; slowest retention pass {:.2} ms",
        framed_f / n_f,
        cpu / n_f,
        n_f * size as f64 / cpu * 1e3,
        framed_f / cpu * 1e3,
        wall / n_f,
        slowest_ns as f64 / 1e6,
        slowest_retention_ns as f64 / 1e6,
    );
}
