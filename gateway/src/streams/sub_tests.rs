//! Unit tests of the subscriber send path and parking, with fake sends and ACKs: a real log
//! in a temporary directory, no sockets, time passed in.

use std::time::{Duration, Instant};

use log_store::{Log, LogOptions, StreamId};

use super::*;
use crate::proto::route::{From, OnTruncated, SubscribeQuery};
use crate::streams::parked::{ParkLimits, ParkedWindows};
use crate::streams::resume::{self, Ask, Start};

fn lim() -> SubLimits {
    SubLimits {
        lag_events_max: 1000,
        send_bytes_max: 1 << 20,
        tx_ack_interval: Duration::from_millis(20),
        keepalive: Duration::from_secs(15),
    }
}

fn log_with(n: u64) -> (tempfile::TempDir, Log, StreamId) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut log = Log::open(dir.path(), LogOptions::default()).expect("open");
    let sid = log.create_stream("s").expect("create");
    for i in 1..=n {
        log.append(sid, None, format!("event {i}").as_bytes())
            .expect("append");
    }
    log.sync_now().expect("sync");
    (dir, log, sid)
}

/// The framed bytes of records `from..=to` as the log holds them.
fn framed(log: &Log, sid: StreamId, from: u64, to: u64) -> Vec<u8> {
    let b = log.read(sid, from, usize::MAX).expect("read");
    assert_eq!((b.first, b.last), (from, to));
    b.slices
        .iter()
        .flat_map(|s| s.as_bytes().to_vec())
        .collect()
}

/// Sends up to `n` bytes of the next send; returns the bytes the "kernel" took.
fn send(sub: &mut Sub, log: &Log, now: Instant, n: usize, outq: Option<u64>) -> (Vec<u8>, Sent) {
    sub.refill(log, &lim(), &mut Default::default());
    let Next::Send(v) = sub.next_send(now, &lim()) else {
        panic!("something to send");
    };
    let bytes: Vec<u8> = v.flatten();
    let took = n.min(bytes.len());
    let sent = sub.on_sent(v, took as u64, outq);
    (bytes[..took].to_vec(), sent)
}

#[test]
fn a_partial_send_resumes_at_the_exact_byte() {
    let (_d, log, sid) = log_with(3);
    let t0 = Instant::now();
    let mut sub = Sub::new((0, sid), 1, AckMode::Outq, b"PRE".to_vec(), None, t0);
    let (first, s1) = send(&mut sub, &log, t0, 7, None);
    assert!(s1.partial);
    let (rest, s2) = send(&mut sub, &log, t0, usize::MAX, None);
    assert!(!s2.partial);
    let mut all = first;
    all.extend(rest);
    let mut want = b"PRE".to_vec();
    want.extend(framed(&log, sid, 1, 3));
    assert_eq!(all, want, "every byte once, in order");
    assert_eq!(s1.events_sent + s2.events_sent, 3);
    assert!(matches!(sub.next_send(t0, &lim()), Next::Idle));
}

#[test]
fn events_leave_the_window_only_when_acked() {
    let (_d, log, sid) = log_with(2);
    let t0 = Instant::now();
    let mut sub = Sub::new((0, sid), 1, AckMode::Outq, Vec::new(), None, t0);
    // Everything sent, nothing ACKed (all of it still in the socket's queue).
    let (bytes, sent) = send(&mut sub, &log, t0, usize::MAX, Some(u64::MAX));
    assert_eq!(sent.events_confirmed, 0);
    assert_eq!(sub.unconfirmed_bytes(), bytes.len() as u64);
    // The peer ACKed all but the last event's bytes.
    let last = framed(&log, sid, 2, 2).len() as u64;
    let c = sub.confirm_outq(last);
    assert_eq!(c.events, 1);
    assert_eq!(sub.unconfirmed_bytes(), last);
    assert_eq!(sub.confirm_outq(0).events, 1);
    assert_eq!(sub.unconfirmed_bytes(), 0);
}

#[test]
fn tx_ack_requests_are_sampled_one_at_a_time() {
    let (_d, mut log, sid) = log_with(1);
    let t0 = Instant::now();
    let mut sub = Sub::new((0, sid), 1, AckMode::TxTimestamps, Vec::new(), None, t0);
    let ask = |sub: &mut Sub, log: &Log, now| {
        sub.refill(log, &lim(), &mut Default::default());
        let Next::Send(v) = sub.next_send(now, &lim()) else {
            panic!("something to send")
        };
        let asked = v.asks_tx_ack();
        let n = v.len();
        sub.on_sent(v, n, None);
        asked
    };
    assert!(ask(&mut sub, &log, t0), "the first send asks");
    let first_len = framed(&log, sid, 1, 1).len() as u32;
    log.append(sid, None, b"two").expect("append");
    log.sync_now().expect("sync");
    let later = t0 + lim().tx_ack_interval * 2;
    assert!(
        !ask(&mut sub, &log, later),
        "the first request is unanswered"
    );
    // The ACK of the first send's last byte answers it (key = offset of that byte).
    let r = sub.on_tx_timestamp(
        first_len as i32 - 1,
        SCM_TSTAMP_ACK << IORING_TIMESTAMP_TYPE_SHIFT,
    );
    assert_eq!(
        r,
        TxReport::Ack(Confirmed {
            events: 1,
            bytes: u64::from(first_len)
        })
    );
    log.append(sid, None, b"three").expect("append");
    log.sync_now().expect("sync");
    assert!(
        ask(&mut sub, &log, later),
        "answered and the interval passed: ask again"
    );
    assert_eq!(sub.on_tx_timestamp(-95, 0), TxReport::Fallback);
    assert_eq!(sub.ack_mode(), AckMode::Outq);
}

#[test]
fn a_subscriber_too_far_behind_gets_an_in_band_truncation_then_closes() {
    let (_d, log, sid) = log_with(5);
    let t0 = Instant::now();
    let mut sub = Sub::new((0, sid), 1, AckMode::Outq, Vec::new(), None, t0);
    let tight = SubLimits {
        lag_events_max: 3,
        ..lim()
    };
    assert_eq!(
        sub.refill(&log, &tight, &mut Default::default()),
        Some(Ended::Lagging)
    );
    let Next::Send(v) = sub.next_send(t0, &tight) else {
        panic!("the notice is sent")
    };
    let bytes = v.flatten();
    assert!(String::from_utf8_lossy(&bytes).starts_with("event: truncated\n"));
    assert!(!bytes.starts_with(b"id:"), "the notice carries no id");
    let n = v.len();
    sub.on_sent(v, n, None);
    assert!(matches!(sub.next_send(t0, &tight), Next::Close));
}

fn query(last: Option<String>) -> SubscribeQuery {
    SubscribeQuery {
        last_event_id: last,
        from: From::Earliest,
        on_truncated: OnTruncated::Error,
    }
}

#[test]
fn an_aligned_resume_serves_the_parked_window_then_the_log_without_gap_or_duplicate() {
    let (_d, log, sid) = log_with(6);
    let t0 = Instant::now();
    let key = (0, sid);
    let mut sub = Sub::new(key, 1, AckMode::Outq, Vec::new(), None, t0);
    send(&mut sub, &log, t0, usize::MAX, None);
    // The peer confirmed events 1..=2; 3..=6 were sent but never ACKed: parked on disconnect.
    let unacked = framed(&log, sid, 3, 6).len() as u64;
    sub.confirm_outq(unacked);
    let mut parked = ParkedWindows::default();
    let lim_park = ParkLimits {
        grace: Duration::from_secs(30),
        per_stream_max: 4,
    };
    parked.park(key, sub.take_parkable(), t0, lim_park);
    assert_eq!(parked.count(), 1);
    let id = log_store::EventId {
        epoch: log.epoch(),
        stream: sid,
        seq: 2,
    };
    let q = query(Some(id.to_string()));
    let ask = Ask {
        key,
        q: &q,
        retry_ms: 1000,
        known_epochs: &[log.epoch()],
        now: t0,
    };
    let (start, class) = resume::start(&log, &mut parked, &ask);
    assert_eq!(class, Some(log_store::ResumeClass::Aligned));
    let Start::Serve {
        cursor,
        preamble,
        aligned,
    } = start
    else {
        panic!("served")
    };
    assert_eq!(cursor, 7, "the log follows the window's last event");
    let mut again = Sub::new(key, cursor, AckMode::Outq, preamble.clone(), aligned, t0);
    let (bytes, _) = send(&mut again, &log, t0, usize::MAX, None);
    let mut want = preamble;
    want.extend(framed(&log, sid, 3, 6));
    assert_eq!(bytes, want, "exactly events 3..=6, from the parked bytes");
    assert_eq!(parked.count(), 0, "the window was taken");
}

#[test]
fn a_resume_whose_head_is_not_parked_replays_from_the_log() {
    let (_d, log, sid) = log_with(4);
    let t0 = Instant::now();
    let mut parked = ParkedWindows::default();
    let id = log_store::EventId {
        epoch: log.epoch(),
        stream: sid,
        seq: 1,
    };
    let q = query(Some(id.to_string()));
    let ask = Ask {
        key: (0, sid),
        q: &q,
        retry_ms: 1000,
        known_epochs: &[log.epoch()],
        now: t0,
    };
    let (start, class) = resume::start(&log, &mut parked, &ask);
    assert_eq!(class, Some(log_store::ResumeClass::Replay));
    assert!(matches!(
        start,
        Start::Serve {
            cursor: 2,
            aligned: None,
            ..
        }
    ));
}

#[test]
fn subscribers_that_never_park_leave_nothing_behind() {
    let (_d, log, sid) = log_with(2);
    let t0 = Instant::now();
    let mut sub = Sub::new((0, sid), 1, AckMode::Outq, Vec::new(), None, t0);
    sub.never_park();
    send(&mut sub, &log, t0, usize::MAX, None);
    assert!(sub.take_parkable().is_empty());
}

#[test]
fn parking_keeps_the_newest_windows_per_stream_until_they_expire() {
    let (_d, log, sid) = log_with(3);
    let t0 = Instant::now();
    let lim_park = ParkLimits {
        grace: Duration::from_secs(30),
        per_stream_max: 2,
    };
    let mut parked = ParkedWindows::default();
    for head in 1..=3 {
        let mut sub = Sub::new((0, sid), head, AckMode::Outq, Vec::new(), None, t0);
        send(&mut sub, &log, t0, usize::MAX, None);
        parked.park((0, sid), sub.take_parkable(), t0, lim_park);
    }
    assert_eq!(parked.count(), 2, "the oldest window was dropped");
    let view = parked.view((0, sid), log.epoch(), 1, t0).expect("a view");
    assert_eq!(
        (view.head, view.last),
        (2, 3),
        "the window whose head is N+1"
    );
    parked.expire(t0 + lim_park.grace);
    assert_eq!(parked.count(), 0);
}

#[test]
fn a_replay_from_a_cold_segment_is_read_ahead_once_then_sent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = LogOptions {
        segment_bytes: 65536,
        record_bytes_max: 16 * 1024,
        ..LogOptions::default()
    };
    let mut log = Log::open(dir.path(), o).expect("open");
    let sid = log.create_stream("s").expect("create");
    let big = vec![b'c'; 4000];
    while log.active_segment() < 2 {
        log.append(sid, None, &big).expect("append");
    }
    log.sync_now().expect("sync");
    let t0 = Instant::now();
    let mut sub = Sub::new((0, sid), 1, AckMode::Outq, Vec::new(), None, t0);
    sub.refill(&log, &lim(), &mut Default::default());
    let active = log.active_segment();
    // Warm: nothing to read ahead.
    assert!(sub.cold_run(active, &lim(), crate::sys::resident).is_none());
    // Cold (the kernel dropped the old segment's pages): the first run of the send.
    let first = log.read(sid, 1, 1).expect("read").slices.remove(0);
    crate::sys::page_out(first.as_bytes()).expect("MADV_PAGEOUT");
    assert!(!crate::sys::resident(first.as_bytes()), "paged out");
    let cold = sub
        .cold_run(active, &lim(), crate::sys::resident)
        .expect("a cold run");
    assert_eq!(cold.slice.segment_number(), first.segment_number());
    assert_eq!(
        (cold.off, cold.slice.file_offset()),
        (0, first.file_offset())
    );
    // Once read ahead, the send goes (even if the kernel dropped the pages again meanwhile).
    sub.on_prefetched();
    assert!(sub.cold_run(active, &lim(), |_| false).is_none());
    assert!(matches!(sub.next_send(t0, &lim()), Next::Send(_)));
    // The active segment is never read ahead (appends keep it hot).
    let mut live = Sub::new(
        (0, sid),
        log.bounds(sid).unwrap().tail,
        AckMode::Outq,
        Vec::new(),
        None,
        t0,
    );
    live.refill(&log, &lim(), &mut Default::default());
    assert!(live.cold_run(active, &lim(), |_| false).is_none());
}

#[test]
fn siocoutq_readings_at_send_completions_are_sampled_per_interval() {
    let t0 = Instant::now();
    let mut outq = Sub::new((0, StreamId(0)), 1, AckMode::Outq, Vec::new(), None, t0);
    assert!(
        outq.outq_due(t0, &lim()),
        "the first completion reads SIOCOUTQ"
    );
    assert!(
        !outq.outq_due(t0 + Duration::from_millis(19), &lim()),
        "within the interval: no"
    );
    assert!(
        outq.outq_due(t0 + Duration::from_millis(20), &lim()),
        "interval passed: read"
    );
    let every = SubLimits {
        tx_ack_interval: Duration::ZERO,
        ..lim()
    };
    assert!(
        outq.outq_due(t0 + Duration::from_millis(20), &every),
        "interval 0: every send"
    );
    let mut ts = Sub::new(
        (0, StreamId(0)),
        1,
        AckMode::TxTimestamps,
        Vec::new(),
        None,
        t0,
    );
    assert!(!ts.outq_due(t0, &lim()), "TX timestamps confirm instead");
}
