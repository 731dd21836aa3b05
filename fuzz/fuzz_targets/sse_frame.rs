//! Fuzz target: SSE framing as the log does it at append, checked by an independent minimal
//! EventSource parser (`sse_gateway_fuzz::parse_sse`). One long-lived log (fsync=never, in
//! a tempdir, retention keeps it small) takes every input as one `append(event_type, data)`:
//! - invalid input (data not UTF-8, event type with CR/LF, record too large) is refused with
//!   its error and appends nothing (the tail does not move);
//! - an accepted event read back with `record` parses as exactly one event whose `id` is the
//!   returned ID, whose type is the given one and whose data is the given data with line
//!   breaks normalized to LF (what the SSE client reassembles).
//! - the gateway's `sse::framed_event_bytes` (its all-or-nothing batch pre-check) equals the
//!   length the log framed (or reported in `RecordTooLarge`).
//! Also the gateway's own `event: truncated` notice: one event, no `id:`, the JSON intact.
#![no_main]

use std::cell::RefCell;
use std::time::SystemTime;

use libfuzzer_sys::fuzz_target;
use log_store::{AppendError, FsyncPolicy, Log, LogOptions, StreamId};
use log_store::EventId;
use sse_gateway_fuzz::sse::{TruncatedReason, framed_event_bytes, truncated_event, truncated_json};
use sse_gateway_fuzz::{Input, normalize_breaks, parse_sse};

const RECORD_BYTES_MAX: u32 = 16 * 1024;

struct Fixture {
    _dir: tempfile::TempDir,
    log: Log,
    stream: StreamId,
    appends: u64,
}

thread_local! {
    static FIX: RefCell<Option<Fixture>> = const { RefCell::new(None) };
}

fn fixture() -> Fixture {
    // /dev/shm when present: one segment roll per 64 KiB, no disk traffic.
    let dir = tempfile::Builder::new()
        .prefix("fuzz-sse-frame")
        .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" })
        .expect("tempdir");
    let opts = LogOptions {
        segment_bytes: 64 * 1024,
        record_bytes_max: RECORD_BYTES_MAX,
        retain_bytes: Some(256 * 1024),
        fsync: FsyncPolicy::Never,
        ..LogOptions::default()
    };
    let mut log = Log::open(dir.path(), opts).expect("open");
    let stream = log.create_stream("fuzz").expect("stream");
    Fixture { _dir: dir, log, stream, appends: 0 }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let type_len = usize::from(inp.u8() % 64);
    let type_bytes = inp.take(type_len);
    let payload = inp.rest();
    // Event types are `&str`: a non-UTF-8 type cannot reach the log (the HTTP layer refuses it).
    let event_type = if flags & 1 == 1 {
        match std::str::from_utf8(type_bytes) {
            Ok(t) => Some(t),
            Err(_) => return,
        }
    } else {
        None
    };
    FIX.with(|f| {
        let mut f = f.borrow_mut();
        let fx = f.get_or_insert_with(fixture);
        let before = fx.log.bounds(fx.stream).expect("bounds");
        match fx.log.append(fx.stream, event_type, payload) {
            Ok(a) => {
                let text = std::str::from_utf8(payload).expect("accepted data is UTF-8");
                assert!(!event_type.is_some_and(|t| t.contains(['\r', '\n'])));
                assert_eq!(a.id.seq, before.tail + 1);
                let rec = fx.log.record(fx.stream, a.id.seq).expect("record");
                let events = parse_sse(rec.as_bytes()).expect("framed bytes are UTF-8");
                assert_eq!(events.len(), 1, "one record, one event: {:?}", rec.as_bytes());
                let ev = &events[0];
                assert_eq!(ev.id, a.id.to_string());
                assert_eq!(ev.event.as_deref(), event_type.filter(|t| !t.is_empty()));
                assert_eq!(ev.data, normalize_breaks(text));
                // The gateway's pre-check of batches computes the same length as the log.
                assert_eq!(
                    framed_event_bytes(a.id.encoded_len(), event_type, payload),
                    rec.as_bytes().len()
                );
                fx.appends += 1;
                if fx.appends % 64 == 0 {
                    fx.log.enforce_retention(SystemTime::now()).expect("retention");
                }
            }
            Err(e) => {
                match e {
                    AppendError::DataNotUtf8 { valid_up_to } => {
                        assert!(std::str::from_utf8(payload).is_err());
                        assert_eq!(std::str::from_utf8(&payload[..valid_up_to]).map(|_| ()), Ok(()));
                    }
                    AppendError::EventTypeHasLineBreak => {
                        assert!(event_type.is_some_and(|t| t.contains(['\r', '\n'])));
                    }
                    AppendError::RecordTooLarge { framed_bytes, .. } => {
                        assert!(framed_bytes > RECORD_BYTES_MAX as usize);
                        let id = EventId { epoch: fx.log.epoch(), stream: fx.stream, seq: before.tail + 1 };
                        assert_eq!(framed_event_bytes(id.encoded_len(), event_type, payload), framed_bytes);
                    }
                    other => panic!("unexpected append error {other:?}"),
                }
                assert_eq!(fx.log.bounds(fx.stream), Some(before), "a refused append moved the log");
            }
        }
    });
    // The gateway-made notice: never an `id:` (it must not move the client's Last-Event-ID).
    let (r, f, t) = (inp_u64(data, 0), inp_u64(data, 8), inp_u64(data, 16));
    let reason = if flags & 2 == 0 { TruncatedReason::Truncated } else { TruncatedReason::Lagging };
    let json = truncated_json(reason, r, f, t);
    let ev = parse_sse(&truncated_event(&json)).expect("utf8");
    assert_eq!(ev.len(), 1);
    assert_eq!((ev[0].id.as_str(), ev[0].event.as_deref()), ("", Some("truncated")));
    let v: serde_json::Value = serde_json::from_str(&ev[0].data).expect("json");
    assert_eq!((v["requested"].as_u64(), v["floor"].as_u64(), v["tail"].as_u64()), (Some(r), Some(f), Some(t)));
});

fn inp_u64(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        *x = data.get(at + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(b)
}
