//! Behaviour tests of `Log` through its public API: append/read/coalescing, bounds, reopen,
//! visibility under each fsync policy, retention with pinned slices, input validation.
#![forbid(unsafe_code)]

mod common;

use std::time::{Duration, Instant, SystemTime};

use log_store::{AppendError, Bounds, EventId, FsyncPolicy, Log, LogOptions, ReadError, StreamId};

fn opts(segment_bytes: u64) -> LogOptions {
    LogOptions {
        segment_bytes,
        record_bytes_max: 16 * 1024,
        ..LogOptions::default()
    }
}

fn frame(log: &Log, s: StreamId, seq: u64, data: &str) -> String {
    let id = EventId {
        epoch: log.epoch(),
        stream: s,
        seq,
    };
    format!("id: {id}\ndata: {data}\n\n")
}

#[test]
fn append_read_coalesce_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts(65536)).unwrap();
    assert!(log.recovery().created);
    let a = log.create_stream("a").unwrap();
    let b = log.create_stream("b").unwrap();
    assert_eq!(log.create_stream("a").unwrap(), a);
    assert_eq!(log.stream_name(b), Some("b"));
    assert_eq!(
        log.bounds(a),
        Some(Bounds {
            floor: 1,
            tail: 0,
            visible_tail: 0
        })
    );
    // a1 a2 b1 a3: a1,a2 adjacent; a3 separate.
    for (s, d) in [(a, "1"), (a, "2"), (b, "x"), (a, "3")] {
        let r = log.append(s, None, d.as_bytes()).unwrap();
        assert!(r.durable);
    }
    let batch = log.read(a, 1, usize::MAX).unwrap();
    assert_eq!((batch.first, batch.last), (1, 3));
    assert_eq!(batch.slices.len(), 2, "a1+a2 coalesced, a3 separate");
    assert_eq!(
        (batch.slices[0].first_seq(), batch.slices[0].last_seq()),
        (1, 2)
    );
    let text: String = batch
        .slices
        .iter()
        .map(|s| std::str::from_utf8(s.as_bytes()).unwrap())
        .collect();
    assert_eq!(
        text,
        [
            frame(&log, a, 1, "1"),
            frame(&log, a, 2, "2"),
            frame(&log, a, 3, "3")
        ]
        .concat()
    );
    assert_eq!(batch.record_lens.iter().sum::<u32>() as usize, text.len());
    // bytes_max: at least one record, then whole records only.
    let one = log.read(a, 1, 1).unwrap();
    assert_eq!((one.first, one.last), (1, 1));
    // caught up / beyond / unknown
    let caught_up = log.read(a, 4, 100).unwrap();
    assert!(caught_up.is_empty() && caught_up.slices.is_empty());
    assert_eq!(
        log.read(a, 5, 100).unwrap_err(),
        ReadError::BeyondTail {
            requested: 5,
            tail: 3
        }
    );
    assert_eq!(
        log.read(StreamId(9), 1, 100).unwrap_err(),
        ReadError::UnknownStream
    );
    assert_eq!(
        log.record(b, 1).unwrap().as_bytes(),
        frame(&log, b, 1, "x").as_bytes()
    );
    let epoch = log.epoch();
    drop((log, batch, one, caught_up)); // slices pin the directory lock

    let mut log = Log::open(dir.path(), opts(65536)).unwrap();
    assert!(!log.recovery().created);
    assert_eq!(log.epoch(), epoch);
    assert_eq!(log.stream_id("b"), Some(b));
    assert_eq!(
        log.bounds(a),
        Some(Bounds {
            floor: 1,
            tail: 3,
            visible_tail: 3
        })
    );
    let r = log.append(a, Some("ev"), b"4").unwrap();
    assert_eq!(r.id.seq, 4);
    let text = String::from_utf8(log.record(a, 4).unwrap().as_bytes().to_vec()).unwrap();
    assert_eq!(text, format!("id: {}\nevent: ev\ndata: 4\n\n", r.id));
}

#[test]
fn second_open_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let _log = Log::open(dir.path(), opts(65536)).unwrap();
    assert!(matches!(
        Log::open(dir.path(), opts(65536)),
        Err(log_store::OpenError::Locked { .. })
    ));
}

/// A dropped log whose segment a slice still maps keeps the directory locked; an open in the
/// same process waits for the release (the `log-prepare` / `log-retire` threads release such
/// locks a moment after the drop) instead of failing with `Locked`.
#[test]
fn an_open_waits_for_a_dropped_log_of_this_process_to_release_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts(65536)).unwrap();
    let s = log.create_stream("s").unwrap();
    log.append(s, None, b"kept").unwrap();
    let slice = log.record(s, 1).unwrap();
    drop(log);
    let started = Instant::now();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        assert!(String::from_utf8_lossy(slice.as_bytes()).contains("kept"));
        drop(slice);
    });
    let log = Log::open(dir.path(), opts(65536)).expect("opened once the slice went");
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "it waited for the slice"
    );
    holder.join().unwrap();
    assert_eq!(log.bounds(StreamId(0)).unwrap().tail, 1);
    // A live log's lock is still refused at once.
    let started = Instant::now();
    assert!(matches!(
        Log::open(dir.path(), opts(65536)),
        Err(log_store::OpenError::Locked { .. })
    ));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn rejects_bad_input_without_appending() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(
        dir.path(),
        LogOptions {
            record_bytes_max: 200,
            ..opts(65536)
        },
    )
    .unwrap();
    let a = log.create_stream("a").unwrap();
    assert!(matches!(
        log.append(a, Some("x\ny"), b"d"),
        Err(AppendError::EventTypeHasLineBreak)
    ));
    assert!(matches!(
        log.append(a, None, b"\xff"),
        Err(AppendError::DataNotUtf8 { valid_up_to: 0 })
    ));
    assert!(matches!(
        log.append(a, None, &[b'x'; 300]),
        Err(AppendError::RecordTooLarge {
            record_bytes_max: 200,
            ..
        })
    ));
    assert!(matches!(
        log.append(StreamId(5), None, b"d"),
        Err(AppendError::UnknownStream(_))
    ));
    assert!(matches!(
        log.create_stream(""),
        Err(AppendError::StreamNameInvalid(_))
    ));
    assert!(matches!(
        log.create_stream("a\nb"),
        Err(AppendError::StreamNameInvalid(_))
    ));
    assert_eq!(log.bounds(a).unwrap().tail, 0);
    assert_eq!(log.append(a, None, b"ok").unwrap().id.seq, 1);
}

#[test]
fn visibility_follows_fsync_policy() {
    let dir = tempfile::tempdir().unwrap();
    let o = LogOptions {
        fsync: FsyncPolicy::Interval { interval_ms: 50 },
        ..opts(65536)
    };
    let t0 = Instant::now();
    let mut log = Log::open(dir.path(), o).unwrap();
    let a = log.create_stream("a").unwrap();
    let r = log.append(a, None, b"1").unwrap();
    assert!(!r.durable);
    assert_eq!(
        log.bounds(a).unwrap(),
        Bounds {
            floor: 1,
            tail: 1,
            visible_tail: 0
        }
    );
    assert!(
        log.read(a, 1, 100).unwrap().is_empty(),
        "unsynced record is invisible"
    );
    let deadline = log.next_sync_deadline().unwrap();
    assert!(deadline >= t0 + Duration::from_millis(50));
    assert!(
        log.poll_sync(deadline - Duration::from_millis(1))
            .unwrap()
            .advanced
            .is_empty()
    );
    assert_eq!(log.poll_sync(deadline).unwrap().advanced, vec![(a, 1)]);
    assert_eq!(log.bounds(a).unwrap().visible_tail, 1);
    assert_eq!(log.next_sync_deadline(), None);
    drop(log);

    let o = LogOptions {
        fsync: FsyncPolicy::Always,
        ..opts(65536)
    };
    let mut log = Log::open(dir.path(), o).unwrap();
    let b = log.create_stream("b").unwrap();
    for _ in 0..3 {
        log.append(a, None, b"x").unwrap();
        log.append(b, None, b"y").unwrap();
    }
    assert_eq!(log.bounds(a).unwrap().visible_tail, 1);
    let mut adv = log.poll_sync(Instant::now()).unwrap().advanced;
    adv.sort();
    assert_eq!(adv, vec![(a, 4), (b, 3)]);
}

#[test]
fn retention_advances_floors_and_pinned_slices_survive() {
    let dir = tempfile::tempdir().unwrap();
    let o = LogOptions {
        retain_bytes: Some(2 * 65536),
        ..opts(65536)
    };
    let mut log = Log::open(dir.path(), o).unwrap();
    let a = log.create_stream("a").unwrap();
    let b = log.create_stream("b").unwrap();
    let payload = "p".repeat(1000);
    // Fill segments 0 and 1 and start 2; b's only record lives in segment 0.
    for n in 1..=10_000u64 {
        let r = log.append(a, None, payload.as_bytes()).unwrap();
        if n == 1 {
            log.append(b, None, b"only").unwrap();
        }
        if log.record(a, r.id.seq).unwrap().segment_number() == 2 {
            break;
        }
    }
    assert_eq!(
        log.record(a, log.bounds(a).unwrap().tail)
            .unwrap()
            .segment_number(),
        2
    );
    let pinned = log.read(a, 1, usize::MAX).unwrap();
    let pinned_first = pinned.slices[0].clone();
    let expect = pinned_first.as_bytes().to_vec();
    let seg0 = dir.path().join(format!("{:020}.seg", 0));
    assert!(seg0.exists());
    let report = log.enforce_retention(SystemTime::now()).unwrap();
    assert!(report.segments_deleted >= 1, "{report:?}");
    let fa = log.bounds(a).unwrap().floor;
    assert!(fa > 1);
    assert_eq!(
        log.bounds(b).unwrap(),
        Bounds {
            floor: 2,
            tail: 1,
            visible_tail: 1
        }
    );
    assert_eq!(
        log.read(a, 1, 10).unwrap_err(),
        ReadError::Truncated {
            requested: 1,
            floor: fa,
            tail: log.bounds(a).unwrap().tail
        }
    );
    // The slice still reads the deleted segment's bytes, and its file is still there.
    assert!(seg0.exists(), "file kept while a slice pins it");
    assert_eq!(pinned_first.as_bytes(), &expect[..]);
    drop(pinned);
    drop(pinned_first);
    assert!(!seg0.exists(), "file unlinked when the last guard dropped");
    // Floors and tails survive reopen via the checkpoint (b has no record left at all).
    let (ba, bb) = (log.bounds(a).unwrap(), log.bounds(b).unwrap());
    drop(log);
    let mut log = Log::open(
        dir.path(),
        LogOptions {
            retain_bytes: Some(2 * 65536),
            ..opts(65536)
        },
    )
    .unwrap();
    assert_eq!(log.bounds(a).unwrap(), ba);
    assert_eq!(log.bounds(b).unwrap(), bb);
    assert_eq!(
        log.append(b, None, b"next").unwrap().id.seq,
        2,
        "sequence never reused"
    );
}

#[test]
fn retired_segment_file_is_recycled_by_the_next_roll() {
    let dir = tempfile::tempdir().unwrap();
    let o = || LogOptions {
        retain_bytes: Some(2 * 65536),
        ..opts(65536)
    };
    let mut log = Log::open(dir.path(), o()).unwrap();
    let a = log.create_stream("a").unwrap();
    let seg = |n: u64| dir.path().join(format!("{n:020}.seg"));
    let payload = "r".repeat(700);
    let fill_until = |log: &mut Log, n: u64| {
        for _ in 0..10_000 {
            if seg(n).exists() {
                return;
            }
            log.append(a, None, payload.as_bytes()).unwrap();
        }
        panic!("segment {n} never created");
    };
    fill_until(&mut log, 3);
    let report = log.enforce_retention(SystemTime::now()).unwrap();
    assert_eq!(report.segments_deleted, 2);
    assert!(
        dir.path().join("spare").exists(),
        "first retired segment kept as the spare"
    );
    assert!(!seg(0).exists() && !seg(1).exists());
    fill_until(&mut log, 4);
    assert!(
        !dir.path().join("spare").exists(),
        "spare adopted as segment 4"
    );
    log.append(a, Some("last"), b"in the recycled segment")
        .unwrap();
    let b = log.bounds(a).unwrap();
    let before: Vec<Vec<u8>> = (b.floor..=b.tail)
        .map(|q| log.record(a, q).unwrap().as_bytes().to_vec())
        .collect();
    drop(log);
    let log = Log::open(dir.path(), o()).unwrap();
    assert_eq!(
        log.recovery().torn_tail_offset,
        None,
        "recycled segment has a clean end"
    );
    assert_eq!(log.bounds(a).unwrap(), b);
    let after: Vec<Vec<u8>> = (b.floor..=b.tail)
        .map(|q| log.record(a, q).unwrap().as_bytes().to_vec())
        .collect();
    assert_eq!(after, before);
}

#[test]
fn slices_outliving_the_log_keep_the_directory_locked() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), opts(65536)).unwrap();
    let a = log.create_stream("a").unwrap();
    log.append(a, None, b"kept").unwrap();
    let slice = log.record(a, 1).unwrap();
    let bytes = slice.as_bytes().to_vec();
    drop(log);
    // A new Log could recycle or rewrite files the slice still maps: refused until it drops.
    assert!(matches!(
        Log::open(dir.path(), opts(65536)),
        Err(log_store::OpenError::Locked { .. })
    ));
    assert_eq!(slice.as_bytes(), &bytes[..]);
    drop(slice);
    let log = Log::open(dir.path(), opts(65536)).unwrap();
    assert_eq!(log.record(a, 1).unwrap().as_bytes(), &bytes[..]);
}

#[test]
fn tens_of_thousands_of_streams() {
    const STREAMS: u32 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let o = || LogOptions {
        retain_bytes: Some(4 << 20),
        ..opts(1 << 20)
    };
    let mut log = Log::open(dir.path(), o()).unwrap();
    for i in 0..STREAMS {
        let s = log.create_stream(&format!("tenant-{i}/events")).unwrap();
        assert_eq!(s, StreamId(i));
        log.append(s, None, format!("{{\"n\":{i}}}").as_bytes())
            .unwrap();
    }
    // Enough traffic on one stream to retire the segments holding every other stream's only
    // record and name: names, floors and tails must survive via the checkpoint.
    let hot = StreamId(7);
    let payload = "h".repeat(2000);
    for _ in 0..4000 {
        log.append(hot, None, payload.as_bytes()).unwrap();
    }
    let report = log.enforce_retention(SystemTime::now()).unwrap();
    assert!(report.segments_deleted > 0);
    assert!(
        log.bounds(StreamId(0)).unwrap().floor == 2,
        "stream 0's only record was retired"
    );
    drop(log);
    let mut log = Log::open(dir.path(), o()).unwrap();
    assert_eq!(log.stream_count(), STREAMS as usize);
    for i in [0, 1, 7, 12_345, STREAMS - 1] {
        let s = StreamId(i);
        assert_eq!(
            log.stream_name(s),
            Some(format!("tenant-{i}/events").as_str())
        );
        assert_eq!(log.stream_id(&format!("tenant-{i}/events")), Some(s));
    }
    assert_eq!(
        log.bounds(StreamId(0)).unwrap(),
        Bounds {
            floor: 2,
            tail: 1,
            visible_tail: 1
        }
    );
    assert_eq!(log.append(StreamId(0), None, b"again").unwrap().id.seq, 2);
    assert_eq!(log.streams().count(), STREAMS as usize);
}

#[test]
fn records_lost_below_the_checkpointed_tail_are_never_reused() {
    // fsync=never: retention writes the checkpoint without syncing; a power loss may then take
    // records the checkpoint counted. Their sequence numbers must not be reused, now or later.
    let dir = tempfile::tempdir().unwrap();
    let o = || LogOptions {
        retain_bytes: Some(65536),
        ..opts(65536)
    };
    let mut log = Log::open(dir.path(), o()).unwrap();
    let a = log.create_stream("a").unwrap();
    let seg1 = dir.path().join(format!("{:020}.seg", 1));
    while !seg1.exists() {
        log.append(a, None, "x".repeat(500).as_bytes()).unwrap();
    }
    for _ in 0..4 {
        log.append(a, None, b"in segment 1").unwrap();
    }
    log.enforce_retention(SystemTime::now()).unwrap();
    let tail = log.bounds(a).unwrap().tail;
    drop(log);
    // Power loss: the last two entries of segment 1 never reached the disk.
    let mut bytes = std::fs::read(&seg1).unwrap();
    let mut n = 0;
    while bytes[bytes.len() - 32 * (n + 1)..bytes.len() - 32 * n]
        .iter()
        .any(|&b| b != 0)
    {
        n += 1;
    }
    for i in n - 2..n {
        let at = bytes.len() - 32 * (i + 1);
        bytes[at..at + 32].fill(0);
    }
    std::fs::write(&seg1, &bytes).unwrap();

    let mut log = Log::open(dir.path(), o()).unwrap();
    assert_eq!(log.recovery().streams_behind_checkpoint, vec![a]);
    let b = Bounds {
        floor: tail + 1,
        tail,
        visible_tail: tail,
    };
    assert_eq!(log.bounds(a).unwrap(), b);
    assert!(matches!(
        log.read(a, tail, 100),
        Err(ReadError::Truncated { .. })
    ));
    let r = log.append(a, None, b"after the loss").unwrap();
    assert_eq!(r.id.seq, tail + 1);
    drop(log);
    let log = Log::open(dir.path(), o()).unwrap();
    assert_eq!(
        log.bounds(a).unwrap(),
        Bounds {
            floor: tail + 1,
            tail: tail + 1,
            visible_tail: tail + 1
        }
    );
    assert_eq!(
        log.record(a, tail + 1).unwrap().as_bytes(),
        format!("id: {}\ndata: after the loss\n\n", r.id).as_bytes()
    );
}

#[test]
fn log_is_send_and_slices_are_send_and_sync() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<Log>();
    send_sync::<log_store::LogSlice>();
    send_sync::<log_store::ReadBatch>();
}

#[test]
fn retention_by_age_deletes_only_sealed_segments_older_than_retain_secs() {
    let dir = tempfile::tempdir().unwrap();
    let o = LogOptions {
        retain_secs: Some(60),
        ..opts(65536)
    };
    let mut log = Log::open(dir.path(), o).unwrap();
    let a = log.create_stream("a").unwrap();
    while !dir.path().join(format!("{:020}.seg", 2)).exists() {
        log.append(a, None, "z".repeat(800).as_bytes()).unwrap();
    }
    let now = SystemTime::now();
    // Nothing is a minute old yet.
    assert_eq!(log.enforce_retention(now).unwrap().segments_deleted, 0);
    assert_eq!(log.bounds(a).unwrap().floor, 1);
    // Two minutes later both sealed segments are expired; the active one is kept regardless.
    let later = now + Duration::from_secs(120);
    let report = log.enforce_retention(later).unwrap();
    assert_eq!(report.segments_deleted, 2);
    let b = log.bounds(a).unwrap();
    assert_eq!(log.record(a, b.floor).unwrap().segment_number(), 2);
    assert!(matches!(
        log.read(a, b.floor - 1, 10),
        Err(ReadError::Truncated { .. })
    ));
    assert_eq!(report.floors_advanced, vec![(a, b.floor)]);
}

/// Needs root (mounts a 300 KiB tmpfs: room for 4 segments of 64 KiB, not 5). Not root, it
/// fails unless `GATEWAY_TESTS_WITHOUT_ROOT=1` says to skip it. CI runs as root.
#[test]
fn full_disk_is_a_clean_disk_full_error() {
    common::on_small_tmpfs("full_disk_is_a_clean_disk_full_error", |dir| {
        let o = || LogOptions {
            retain_bytes: Some(65536),
            ..opts(65536)
        };
        let mut log = Log::open(dir, o()).unwrap();
        let a = log.create_stream("a").unwrap();
        let payload = "f".repeat(900);
        let mut full = None;
        for _ in 0..10_000 {
            match log.append(a, None, payload.as_bytes()) {
                Ok(_) => {}
                Err(e) => {
                    full = Some(e);
                    break;
                }
            }
        }
        assert!(matches!(full, Some(AppendError::DiskFull)), "{full:?}");
        let b = log.bounds(a).unwrap();
        assert!(matches!(
            log.append(a, None, b"x"),
            Err(AppendError::DiskFull)
        ));
        assert_eq!(log.bounds(a).unwrap(), b, "failed appends appended nothing");
        assert_eq!(
            log.read(a, 1, usize::MAX).unwrap().last,
            b.tail,
            "still readable"
        );
        drop(log);
        // Reopening a full log works (read-only until space is freed) ...
        let mut log = Log::open(dir, o()).unwrap();
        assert_eq!(log.bounds(a).unwrap(), b);
        assert!(matches!(
            log.append(a, None, b"x"),
            Err(AppendError::DiskFull)
        ));
        // ... and retention frees a segment file, which the next roll reuses.
        assert!(
            log.enforce_retention(SystemTime::now())
                .unwrap()
                .segments_deleted
                > 0
        );
        let r = log.append(a, None, b"after retention").unwrap();
        assert_eq!(r.id.seq, b.tail + 1);
    });
}

#[test]
fn a_stream_created_after_a_tail_starts_there_and_keeps_it_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogOptions {
        fsync: FsyncPolicy::Never,
        segment_bytes: 1 << 20,
        record_bytes_max: 64 << 10,
        ..LogOptions::default()
    };
    let mut log = Log::open(dir.path(), opts.clone()).unwrap();
    let s = log.create_stream_after("snap", 41).unwrap();
    let b = log.bounds(s).unwrap();
    assert_eq!((b.floor, b.tail, b.visible_tail), (42, 41, 41));
    assert_eq!(log.append(s, None, b"x").unwrap().id.seq, 42);
    let plain = log.create_stream("plain").unwrap();
    assert_eq!(log.bounds(plain).unwrap().floor, 1);
    // Below the floor is gone, never served.
    assert!(matches!(
        log.read(s, 41, 1 << 16),
        Err(log_store::ReadError::Truncated { .. })
    ));
    drop(log);
    let log = Log::open(dir.path(), opts).unwrap();
    let b = log.bounds(s).unwrap();
    assert_eq!((b.floor, b.tail), (42, 42));
    assert_eq!(log.bounds(plain).unwrap().floor, 1);
    assert_eq!(log.stream_id("snap"), Some(s));
}
