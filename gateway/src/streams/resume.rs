//! Where a new subscriber of the SSE API starts: at the floor or the tail without
//! `Last-Event-ID`; with one, where the resume planner (`log_store::plan_resume`, the one
//! decision table) says — an aligned resume served from a parked window, a replay from the
//! log at N+1, or an explicit error (410 / in-band truncation, 400 naming why). Never a
//! silent restart. No I/O.
#![forbid(unsafe_code)]

use std::time::Instant;

use log_store::{Epoch, EventId, Log, ResumeInput, ResumePlan, Seq};

use super::StreamKey;
use super::parked::ParkedWindows;
use super::window::ParkedEvent;
use crate::metrics::ResumeClass;
use crate::proto::http;
use crate::proto::route::{From, OnTruncated, SubscribeQuery};
use crate::proto::sse::{self, TruncatedReason};
use crate::uring::Bytes;

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
pub fn start(log: &Log, parked: &mut ParkedWindows, ask: &Ask<'_>) -> (Start, Option<ResumeClass>) {
    let bounds = log.bounds(ask.key.1).expect("stream exists");
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
    let class = class_of(&plan);
    (serve(plan, parked, ask, bounds.visible_tail), Some(class))
}

fn class_of(plan: &ResumePlan) -> ResumeClass {
    match plan {
        ResumePlan::Aligned { .. } => ResumeClass::Aligned,
        ResumePlan::Replay { .. } => ResumeClass::Replay,
        ResumePlan::UpToDate { .. } => ResumeClass::UpToDate,
        ResumePlan::Truncated { .. } => ResumeClass::Truncated,
        ResumePlan::BeyondTail { .. } => ResumeClass::BeyondTail,
        ResumePlan::WrongEpoch { .. } => ResumeClass::WrongEpoch,
        ResumePlan::OtherStream { .. } => ResumeClass::OtherStream,
    }
}

/// Turns the plan into the subscription's start.
fn serve(plan: ResumePlan, parked: &mut ParkedWindows, ask: &Ask<'_>, visible_tail: Seq) -> Start {
    let resumed = |label| sse::subscribe_head_resumed(ask.retry_ms, label);
    let (cursor, preamble, aligned) = match plan {
        ResumePlan::Aligned {
            window_from,
            window_to,
            then_log_from,
        } => {
            let evs = parked.take(ask.key, window_from, window_to);
            (then_log_from, resumed("aligned"), Some(evs))
        }
        ResumePlan::Replay { from } => (from, resumed("replay"), None),
        ResumePlan::UpToDate { from } => (from, resumed("up-to-date"), None),
        ResumePlan::Truncated {
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
            let mut preamble = resumed("truncated");
            preamble.extend_from_slice(&sse::truncated_event(&json));
            (cursor, preamble, None)
        }
        refused => return Start::Refuse(http::json_response(400, &refusal(&refused), true)),
    };
    Start::Serve {
        cursor,
        preamble,
        aligned,
    }
}

/// The JSON body of a refused resume.
fn refusal(plan: &ResumePlan) -> serde_json::Value {
    match *plan {
        ResumePlan::BeyondTail { requested, tail } => serde_json::json!({
            "error": "beyond_tail",
            "message": "Last-Event-ID is beyond the stream's tail",
            "requested": requested, "tail": tail,
        }),
        ResumePlan::WrongEpoch { got, expected } => serde_json::json!({
            "error": "wrong_epoch",
            "message": "Last-Event-ID belongs to another incarnation of this log",
            "got": format!("{:016x}", got.0), "expected": format!("{:016x}", expected.0),
        }),
        ResumePlan::OtherStream { got, expected } => serde_json::json!({
            "error": "other_stream",
            "message": "Last-Event-ID belongs to another stream",
            "got": got.0, "expected": expected.0,
        }),
        _ => unreachable!("served plans are handled by the caller"),
    }
}
