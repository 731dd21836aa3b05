//! A publish on the stream's owner core: the checks every event of a request passes before
//! any is appended (UTF-8 data, no line break in the event type, the framed record within the
//! log's limit — a batch is all or nothing), then the appends. No I/O: the answer is bytes,
//! and whether it must wait for durability is a [`Wait`].
#![forbid(unsafe_code)]

use log_store::{AppendError, EventId, Log, StreamId};

use crate::proto::conn::Wait;
use crate::proto::{http, sse};

/// One event of a publish: its type and its data.
pub type Event = (Option<String>, Vec<u8>);

/// The answer to a publish: its bytes, the durability it waits for, and how many events
/// were appended (for the metrics and the subscribers' wake-up).
#[derive(Debug)]
pub struct Published {
    pub answer: Vec<u8>,
    pub wait: Option<Wait>,
    pub appended: usize,
    /// The IDs of the events stored (all of them when the answer is 201).
    pub ids: Vec<EventId>,
    /// Why the appends stopped part-way, if they did (the answer names `ids` as stored).
    pub refusal: Option<Refusal>,
}

/// The message of the 500 `log_failed` to a publish whose group commit failed.
pub const LOG_FAILED: &str = "the event could not be made durable: an fsync of its log failed, \
     and that log refuses appends until the gateway restarts and recovers it";

/// An append refused part-way through a publish: the error answered (with the IDs stored
/// before it), and replayed to a retry under the same `Idempotency-Key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

/// The log's record limit as a publisher sees it, the one place that decides whether an
/// event's framed record fits: the API's checks, a cluster publish checked before it is sent,
/// an MCP record (or its error-record substitute) that every node must be able to apply.
#[derive(Debug, Clone, Copy)]
pub struct RecordLimit {
    /// `--record-bytes-max` of the log: a framed record's bytes at most.
    pub record_bytes_max: usize,
}

impl RecordLimit {
    pub fn of(log: &Log) -> RecordLimit {
        RecordLimit {
            record_bytes_max: log.options().record_bytes_max as usize,
        }
    }

    /// The framed size of an event whose ID is `id_len` bytes, if it is over the limit.
    pub fn overflow(&self, id_len: usize, event: Option<&str>, data: &[u8]) -> Option<usize> {
        if sse::framed_event_bytes_bound(id_len, event, data.len()) <= self.record_bytes_max {
            return None; // fits however its lines break: no need to scan it
        }
        let framed = sse::framed_event_bytes(id_len, event, data);
        (framed > self.record_bytes_max).then_some(framed)
    }

    /// [`RecordLimit::overflow`] with the longest ID any event can have (a stream that may
    /// not exist yet, a seq not known yet: every node must be able to apply it).
    pub fn overflow_any_id(&self, event: Option<&str>, data: &[u8]) -> Option<usize> {
        self.overflow(log_store::EVENT_ID_BYTES_MAX, event, data)
    }
}

/// Status and code for a failed append or stream creation.
pub fn append_status(e: &AppendError) -> (u16, &'static str) {
    use log_store::AppendError as E;
    // The operator's failures (the client's own are its answer): logged at most once a minute
    // each, however many requests they refuse.
    match e {
        E::DiskFull => crate::warn_limited!("append refused: the log's disk is full (507)"),
        E::TooManyStreams => crate::warn_limited!("append refused: the log's stream table is full"),
        E::Poisoned => crate::warn_limited!("append refused: the log failed an fsync earlier"),
        _ => {}
    }
    match e {
        E::DiskFull => (507, "insufficient_storage"),
        E::RecordTooLarge { .. } => (413, "event_too_large"),
        E::EventTypeHasLineBreak => (400, "bad_event_type"),
        E::DataNotUtf8 { .. } => (400, "bad_data"),
        E::StreamNameInvalid(_) => (400, "bad_stream_name"),
        E::TooManyStreams => (507, "too_many_streams"),
        E::Poisoned => (500, "log_failed"),
        _ => (500, "append_failed"),
    }
}

/// Checks what every event carries, before the stream is even opened: `Err` is the refusal
/// `(status, code, message)`.
pub fn check_events(events: &[Event]) -> Result<(), (u16, &'static str, String)> {
    for (ev, data) in events {
        if std::str::from_utf8(data).is_err() {
            return Err((400, "bad_data", "event data must be UTF-8".into()));
        }
        if ev.as_deref().is_some_and(|t| t.contains(['\r', '\n'])) {
            let msg = "event type must not contain CR or LF";
            return Err((400, "bad_event_type", msg.into()));
        }
    }
    Ok(())
}

/// Checks every event's framed record against the log's limit before any is appended (a
/// batch is all or nothing). A stream not created yet is checked as `PENDING_STREAM` with no
/// event (its real id is no longer), so a refused publish creates nothing.
pub fn check_framed(
    log: &Log,
    sid: StreamId,
    events: &[Event],
) -> Result<(), (u16, &'static str, String)> {
    // Data within --event-bytes-max can still frame larger than a record may be (each line
    // break costs a `data: ` prefix): the log would refuse it mid-batch.
    let limit = RecordLimit::of(log);
    let tail = log.bounds(sid).map_or(0, |b| b.tail);
    let epoch = log.epoch();
    for (i, (ev, data)) in events.iter().enumerate() {
        let id = EventId {
            epoch,
            stream: sid,
            seq: tail.saturating_add(1 + i as u64),
        };
        if let Some(framed) = limit.overflow(id.encoded_len(), ev.as_deref(), data) {
            let msg = format!(
                "event {i}: framed record of {framed} bytes exceeds the record limit \
                 {} (each line of data costs a `data: ` prefix)",
                limit.record_bytes_max
            );
            return Err((413, "event_too_large", msg));
        }
    }
    Ok(())
}

/// [`check_framed`] for a stream that may not exist yet (cluster mode: it is created where the
/// event is applied), with the longest ID any event of it can have.
pub fn check_framed_worst(log: &Log, events: &[Event]) -> Result<(), (u16, &'static str, String)> {
    let limit = RecordLimit::of(log);
    for (i, (ev, data)) in events.iter().enumerate() {
        if let Some(framed) = limit.overflow_any_id(ev.as_deref(), data) {
            let msg = format!(
                "event {i}: framed record of up to {framed} bytes exceeds the record limit \
                 {} (each line of data costs a `data: ` prefix)",
                limit.record_bytes_max
            );
            return Err((413, "event_too_large", msg));
        }
    }
    Ok(())
}

/// Appends the (checked) events in order. The answer waits for durability unless every
/// append was durable at once; a refused append answers with the IDs appended before it, held
/// until those are durable too (they are named as stored: the client must not resend them).
pub fn append(
    log: &mut Log,
    shard: u32,
    sid: StreamId,
    events: &[Event],
    batch: bool,
    close: bool,
) -> Published {
    let mut ids: Vec<EventId> = Vec::with_capacity(events.len());
    let mut all_durable = true;
    for (ev, data) in events {
        match log.append(sid, ev.as_deref(), data) {
            Ok(a) => {
                all_durable &= a.durable;
                ids.push(a.id);
            }
            Err(e) => {
                let (status, code) = append_status(&e);
                let r = Refusal {
                    status,
                    code,
                    message: e.to_string(),
                };
                let wait = stored_answer(shard, &ids, all_durable, batch, close).1;
                return Published {
                    answer: refused_answer(status, code, &r.message, &ids, close),
                    wait,
                    appended: ids.len(),
                    ids,
                    refusal: Some(r),
                };
            }
        }
    }
    let (answer, wait) = stored_answer(shard, &ids, all_durable, batch, close);
    Published {
        answer,
        wait,
        appended: ids.len(),
        ids,
        refusal: None,
    }
}

/// The answer to a publish whose events were all stored, local or through the cluster: their
/// IDs (201), held until the last one is durable unless `durable` already.
pub fn stored_answer(
    shard: u32,
    ids: &[EventId],
    durable: bool,
    batch: bool,
    close: bool,
) -> (Vec<u8>, Option<Wait>) {
    let wait = ids.last().filter(|_| !durable).map(|id| Wait::Durable {
        shard,
        stream: id.stream.0,
        seq: id.seq,
    });
    (http::created_response(ids, batch, close), wait)
}

/// The answer to a publish that stopped part-way: the error, and `appended_ids` naming the
/// events that were stored before it (the client must not resend those).
pub fn refused_answer(
    status: u16,
    code: &str,
    message: &str,
    stored: &[EventId],
    close: bool,
) -> Vec<u8> {
    let appended: Vec<String> = stored.iter().map(EventId::to_string).collect();
    let body = serde_json::json!({
        "error": code, "message": message, "appended_ids": appended,
    });
    http::json_response(status, &body, close)
}
