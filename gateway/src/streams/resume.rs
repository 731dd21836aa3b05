//! Where a new subscriber of the SSE API starts: at the floor or the tail without
//! `Last-Event-ID`; with one, where the resume planner (`log_store::plan_resume`, the one
//! decision table) says, as its shared outcome (`ResumePlan::outcome`, also used by the MCP
//! front): an aligned resume served from a parked window, a replay from the
//! log at N+1, or an explicit error (410 / in-band truncation, 400 naming why). Never a
//! silent restart. No I/O.
#![forbid(unsafe_code)]

use std::time::Instant;

use log_store::{
    Bounds, Detail, Epoch, EventId, Log, Refusal, ResumeClass, ResumeInput, ResumeOutcome, Seq,
};

use super::StreamKey;
use super::parked::ParkedWindows;
use super::sub::PENDING_STREAM;
use super::window::ParkedEvent;
use crate::proto::http;
use crate::proto::route::{From, OnTruncated, SubscribeQuery};
use crate::proto::sse::{self, TruncatedReason};
use crate::uring::Bytes;

/// The bounds of a stream that does not exist yet: nothing appended, nothing deleted.
const UNBORN_BOUNDS: Bounds = Bounds {
    floor: 1,
    tail: 0,
    visible_tail: 0,
};

/// How a subscription starts.
#[derive(Debug)]
pub enum Start {
    /// Serve from `cursor` after `preamble`; `aligned`: the parked events that go first.
    Serve {
        cursor: Seq,
        preamble: Vec<u8>,
        aligned: Option<Vec<ParkedEvent<Bytes>>>,
    },
    /// Answer with this (an explicit error) and close.
    Refuse(Vec<u8>),
}

/// What the subscriber's request asked and what the core knows.
#[derive(Debug)]
pub struct Ask<'a> {
    pub key: StreamKey,
    pub q: &'a SubscribeQuery,
    pub retry_ms: u64,
    pub known_epochs: &'a [Epoch],
    pub now: Instant,
}

/// Decides where a subscription starts; the resume class (if it was a resume) for the metrics.
/// A stream not created yet (`ask.key.1` is [`PENDING_STREAM`]) reads as an empty one with an
/// id no event ID can name (every well-formed ID is then another stream's or epoch's): it is
/// served from 1 once born, or refused, and nothing is created either way.
pub fn start(log: &Log, parked: &mut ParkedWindows, ask: &Ask<'_>) -> (Start, Option<ResumeClass>) {
    let bounds = match ask.key.1 {
        PENDING_STREAM => UNBORN_BOUNDS,
        id => log.bounds(id).expect("stream exists"),
    };
    let Some(raw) = ask.q.last_event_id.as_deref() else {
        let cursor = match ask.q.from {
            From::Earliest => bounds.floor,
            From::Latest => bounds.visible_tail + 1,
        };
        let preamble = sse::subscribe_head(ask.retry_ms);
        return (
            Start::Serve {
                cursor,
                preamble,
                aligned: None,
            },
            None,
        );
    };
    let requested: EventId = match raw.parse() {
        Ok(id) => id,
        Err(e) => {
            let msg = format!("Last-Event-ID {raw:?} is not an event ID: {e:?}");
            let b = http::error_response(400, "bad_last_event_id", &msg, true);
            return (Start::Refuse(b), None);
        }
    };
    let epoch = log.epoch();
    let window = parked.view(ask.key, epoch, requested.seq, ask.now);
    let plan = log_store::plan_resume(&ResumeInput {
        log_epoch: epoch,
        stream: ask.key.1,
        bounds,
        requested,
        window,
        known_epochs: ask.known_epochs,
    });
    let outcome = plan.outcome();
    let class = outcome.class();
    (
        serve(outcome, parked, ask, bounds.visible_tail),
        Some(class),
    )
}

/// Turns the outcome into the subscription's start.
fn serve(o: ResumeOutcome, parked: &mut ParkedWindows, ask: &Ask<'_>, visible_tail: Seq) -> Start {
    let (cursor, preamble, aligned) = match o {
        ResumeOutcome::Serve {
            class,
            from,
            aligned,
        } => {
            let evs = aligned.map(|(head, last)| parked.take(ask.key, head, last));
            (
                from,
                sse::subscribe_head_resumed(ask.retry_ms, class.label()),
                evs,
            )
        }
        ResumeOutcome::Gone {
            requested,
            floor,
            tail,
        } => {
            let json = sse::truncated_json(TruncatedReason::Truncated, requested, floor, tail);
            let cursor = match ask.q.on_truncated {
                OnTruncated::Error => {
                    let b = http::response(410, "application/json", json.as_bytes(), true);
                    return Start::Refuse(b);
                }
                OnTruncated::Earliest => floor,
                OnTruncated::Latest => visible_tail + 1,
            };
            let mut preamble = sse::subscribe_head_resumed(ask.retry_ms, "truncated");
            preamble.extend_from_slice(&sse::truncated_event(&json));
            (cursor, preamble, None)
        }
        ResumeOutcome::Refused(r) => {
            return Start::Refuse(http::json_response(400, &refusal_json(&r), true));
        }
    };
    Start::Serve {
        cursor,
        preamble,
        aligned,
    }
}

/// The JSON body of a refused resume: `{"error": code, "message": ..., details...}`.
fn refusal_json(r: &Refusal) -> serde_json::Value {
    let mut body = serde_json::Map::new();
    body.insert("error".into(), r.code.into());
    body.insert("message".into(), r.message.into());
    for (k, v) in &r.details {
        let v = match v {
            Detail::Num(n) => serde_json::Value::from(*n),
            Detail::Text(t) => serde_json::Value::from(t.as_str()),
        };
        body.insert((*k).into(), v);
    }
    serde_json::Value::Object(body)
}
