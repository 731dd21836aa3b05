//! Criterion benchmarks of the log: append throughput (64 B / 256 B / 4 KiB payloads, fsync
//! never and always with group commit), replay of one stream alone and of one stream among
//! 1,000 interleaved, and recovery scan speed. Short runs (a few seconds each); figures and
//! commands go to BENCHMARKS.md. Data lives in a temporary directory under $TMPDIR.
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use log_store::{FsyncPolicy, Log, LogOptions, StreamId};

const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

fn options(fsync: FsyncPolicy) -> LogOptions {
    LogOptions {
        segment_bytes: SEGMENT_BYTES,
        retain_bytes: Some(4 * SEGMENT_BYTES),
        retain_secs: None,
        fsync,
        record_bytes_max: 1024 * 1024,
        epoch_on_create: None,
    }
}

fn payload(bytes: usize) -> Vec<u8> {
    // JSON-ish single-line data, no line breaks (the common MCP case).
    (0..bytes)
        .map(|i| b"abcdefghijklmnopqrstuvwxyz0123456789"[i % 36])
        .collect()
}

fn append(c: &mut Criterion) {
    let mut g = c.benchmark_group("append");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for size in [64usize, 256, 4096] {
        let data = payload(size);
        // fsync = never: one append per iteration; retention every 4096 appends keeps the disk
        // footprint bounded (its cost is included).
        {
            let dir = tempfile::tempdir().unwrap();
            let mut log = Log::open(dir.path(), options(FsyncPolicy::Never)).unwrap();
            let s = log.create_stream("bench").unwrap();
            let mut n = 0u64;
            g.throughput(Throughput::Bytes(size as u64));
            g.bench_function(format!("never/{size}B"), |b| {
                b.iter(|| {
                    n += 1;
                    if n.is_multiple_of(4096) {
                        log.enforce_retention(SystemTime::now()).unwrap();
                    }
                    black_box(log.append(s, None, &data).unwrap())
                })
            });
        }
        // fsync = always with group commit: 64 appends, then one poll_sync (one msync).
        {
            let dir = tempfile::tempdir().unwrap();
            let mut log = Log::open(dir.path(), options(FsyncPolicy::Always)).unwrap();
            let s = log.create_stream("bench").unwrap();
            let mut n = 0u64;
            g.throughput(Throughput::Bytes(64 * size as u64));
            g.bench_function(format!("always_batch64/{size}B"), |b| {
                b.iter(|| {
                    for _ in 0..64 {
                        black_box(log.append(s, None, &data).unwrap());
                    }
                    n += 1;
                    if n.is_multiple_of(64) {
                        log.enforce_retention(SystemTime::now()).unwrap();
                    }
                    black_box(log.poll_sync(Instant::now()).unwrap())
                })
            });
        }
    }
    g.finish();
}

/// Fills a log: `streams` streams, `per_stream` records of `size` bytes each, round-robin.
fn fill(dir: &Path, streams: u32, per_stream: u32, size: usize) -> Log {
    let opts = LogOptions {
        retain_bytes: None,
        ..options(FsyncPolicy::Never)
    };
    let mut log = Log::open(dir, opts).unwrap();
    let ids: Vec<StreamId> = (0..streams)
        .map(|i| log.create_stream(&format!("s{i}")).unwrap())
        .collect();
    let data = payload(size);
    for _ in 0..per_stream {
        for &s in &ids {
            log.append(s, None, &data).unwrap();
        }
    }
    log
}

/// Reads the whole stream in `bytes_max` batches; returns framed bytes (and touches them when
/// `touch`, summing one byte per cache line, to include memory traffic).
fn replay(log: &Log, s: StreamId, bytes_max: usize, touch: bool) -> u64 {
    let mut from = 1;
    let mut total = 0u64;
    loop {
        let b = log.read(s, from, bytes_max).unwrap();
        if b.is_empty() {
            return total;
        }
        for sl in &b.slices {
            total += sl.len() as u64;
            if touch {
                total += sl
                    .as_bytes()
                    .iter()
                    .step_by(64)
                    .map(|&x| u64::from(x))
                    .sum::<u64>()
                    & 1;
            }
        }
        from = b.last + 1;
    }
}

fn replay_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("replay");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    // One stream alone: 200,000 records of 256 B payload (~62 MB framed, one segment roll).
    {
        let dir = tempfile::tempdir().unwrap();
        let log = fill(dir.path(), 1, 200_000, 256);
        let s = StreamId(0);
        let bytes = replay(&log, s, usize::MAX, false);
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function("one_stream_alone/read", |b| {
            b.iter(|| black_box(replay(&log, s, 1 << 20, false)))
        });
        g.bench_function("one_stream_alone/read_touch", |b| {
            b.iter(|| black_box(replay(&log, s, 1 << 20, true)))
        });
    }
    // One stream among 1,000 interleaved round-robin: 200 records each (200,000 total).
    {
        let dir = tempfile::tempdir().unwrap();
        let log = fill(dir.path(), 1000, 200, 256);
        let s = StreamId(500);
        let bytes = replay(&log, s, usize::MAX, false);
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function("one_of_1000_interleaved/read", |b| {
            b.iter(|| black_box(replay(&log, s, 1 << 20, false)))
        });
        g.bench_function("one_of_1000_interleaved/read_touch", |b| {
            b.iter(|| black_box(replay(&log, s, 1 << 20, true)))
        });
    }
    g.finish();
}

fn recovery(c: &mut Criterion) {
    let mut g = c.benchmark_group("recovery");
    g.measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(10);
    // ~3 segments of 256 B records over 100 streams (page cache warm).
    let dir = tempfile::tempdir().unwrap();
    let scanned = {
        let log = fill(dir.path(), 100, 6_000, 256);
        drop(log);
        let log = Log::open(dir.path(), options(FsyncPolicy::Never)).unwrap();
        log.recovery().bytes_scanned
    };
    g.throughput(Throughput::Bytes(scanned));
    g.bench_function("open_scan_256B_records", |b| {
        b.iter_batched(
            || (),
            |()| {
                let log = Log::open(dir.path(), options(FsyncPolicy::Never)).unwrap();
                assert_eq!(log.recovery().bytes_scanned, scanned);
                black_box(log)
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, append, replay_benches, recovery);
criterion_main!(benches);
