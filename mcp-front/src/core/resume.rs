//! Resumption of legacy streams (GET + Last-Event-ID): find the stream the id names, let the
//! log's resume planner decide, answer the MCP error or reattach the stream from the next seq.

use super::{
    Action, ConnId, LogView, McpCore, Owner, Stream, StreamKind, parse_stream_name,
    redact_stream_name, sse_headers,
};
use crate::jsonrpc;
use log_store::{
    Bounds, Detail, EventId, Refusal, ResumeClass, ResumeInput, ResumeOutcome, Seq, plan_resume,
};
use serde_json::{Value, json};

/// Where a resumed SSE response starts: the client's Last-Event-ID, the stream, the first seq.
struct ResumedAt {
    /// The Last-Event-ID as sent (lossy UTF-8), quoted in answers.
    text: String,
    ev: EventId,
    stream_name: String,
    from: Seq,
}

/// A number the resume planner always puts in this refusal (an invariant of `log_store`).
fn detail_num(r: &Refusal, name: &str) -> u64 {
    r.details
        .iter()
        .find_map(|(k, v)| match v {
            Detail::Num(x) if *k == name => Some(*x),
            _ => None,
        })
        .unwrap_or_else(|| panic!("refusal {} has no number {name:?}", r.code))
}

impl McpCore {
    /// SPEC L19/L20: GET + Last-Event-ID. The id must name a stream of this session; the log's
    /// resume planner decides the rest ([`log_store::ResumePlan::outcome`]), then the MCP-only check that
    /// a complete stream has something left to give.
    pub(super) fn resume(&mut self, conn: ConnId, sid: &str, raw: &[u8], log: &dyn LogView) {
        let text = String::from_utf8_lossy(raw).into_owned();
        let Some((ev, n)) = self.resume_target(conn, sid, &text, log) else {
            return;
        };
        let Some(bounds) = log.bounds(ev.stream) else {
            return self.refuse_resume(
                conn,
                "Bad Request: unknown stream",
                json!({ "requested": text }),
            );
        };
        let plan = plan_resume(&ResumeInput {
            log_epoch: log.epoch(),
            stream: ev.stream,
            bounds,
            requested: ev,
            window: None,
            known_epochs: log.known_epochs(),
        });
        let stream_name = format!("mcp/{sid}/{n}");
        let Some(from) = self.resume_from(conn, &text, &stream_name, plan.outcome()) else {
            return;
        };
        let at = ResumedAt {
            text,
            ev,
            stream_name,
            from,
        };
        if self.refuse_ended(conn, sid, n, bounds, &at) {
            return;
        }
        self.stats.resumes_ok += 1;
        self.attach_resumed(conn, sid, n, bounds, at);
    }

    /// Parses the Last-Event-ID and finds the stream of session `sid` it names (its number);
    /// answers 400 and returns `None` when it is not an event id or names no stream of `sid`.
    fn resume_target(
        &mut self,
        conn: ConnId,
        sid: &str,
        text: &str,
        log: &dyn LogView,
    ) -> Option<(EventId, u32)> {
        let ev: EventId = match text.parse() {
            Ok(ev) => ev,
            Err(e) => {
                self.refuse_resume(conn, &format!("Bad Request: Last-Event-ID {text:?} is not an event id of this gateway: {e}"), json!({ "requested": text }));
                return None;
            }
        };
        let log_epoch = log.epoch();
        let name = if ev.epoch == log_epoch {
            log.stream_name(ev.stream)
        } else {
            None
        };
        let owned = name
            .and_then(parse_stream_name)
            .filter(|(owner, _)| *owner == sid)
            .map(|(_, n)| n);
        if owned.is_none() {
            let why = if ev.epoch != log_epoch && !log.known_epochs().contains(&ev.epoch) {
                format!("event id {text} is from another log epoch (expected {log_epoch})")
            } else {
                format!("event id {text} does not belong to a stream of this session")
            };
            self.refuse_resume(
                conn,
                &format!("Bad Request: {why}"),
                json!({ "requested": text }),
            );
        }
        owned.map(|n| (ev, n))
    }

    /// Answers a resume the client got wrong: 400 with `RESUME_INVALID`, counted as rejected.
    fn refuse_resume(&mut self, conn: ConnId, msg: &str, data: Value) {
        self.stats.resumes_rejected += 1;
        self.error(conn, 400, None, jsonrpc::RESUME_INVALID, msg, Some(data));
    }

    /// The first seq to send for a served outcome; otherwise answers the MCP error (410 for
    /// truncated history, 400 for a refusal) and returns `None`. MCP keeps no parked window,
    /// so an aligned outcome (never planned here: the window is `None`) is read from the log
    /// from its head.
    fn resume_from(
        &mut self,
        conn: ConnId,
        text: &str,
        stream_name: &str,
        outcome: ResumeOutcome,
    ) -> Option<Seq> {
        match outcome {
            ResumeOutcome::Serve { from, aligned, .. } => {
                Some(aligned.map_or(from, |(head, _)| head))
            }
            ResumeOutcome::Gone {
                requested,
                floor,
                tail,
            } => {
                self.stats.resumes_truncated += 1;
                self.error(
                    conn,
                    410,
                    None,
                    jsonrpc::RESUME_TRUNCATED,
                    &format!("Gone: the history after {text} is no longer retained (requested seq {requested}, floor {floor}, tail {tail})"),
                    Some(json!({ "requested": text, "stream": redact_stream_name(stream_name), "requested_seq": requested, "floor": floor, "tail": tail })),
                );
                None
            }
            ResumeOutcome::Refused(r) if r.class == ResumeClass::BeyondTail => {
                let (requested, tail) = (detail_num(&r, "requested"), detail_num(&r, "tail"));
                self.refuse_resume(conn, &format!("Bad Request: event id {text} is beyond the stream's tail {tail}"), json!({ "requested": text, "stream": redact_stream_name(stream_name), "requested_seq": requested, "tail": tail }));
                None
            }
            ResumeOutcome::Refused(_) => {
                // Wrong epoch / other stream: excluded by `resume_target` (same epoch, stream
                // named by the id); kept total.
                self.refuse_resume(
                    conn,
                    &format!("Bad Request: event id {text} does not belong to this stream"),
                    json!({ "requested": text }),
                );
                None
            }
        }
    }

    /// A complete stream resumed at (or past) its last record has nothing more to give. A
    /// client only does that when the stream ended without the response it waits for (its
    /// session was recovered after a crash); an empty 200 would make it reconnect forever.
    /// Answers 410 and returns true in that case.
    fn refuse_ended(
        &mut self,
        conn: ConnId,
        sid: &str,
        n: u32,
        bounds: Bounds,
        at: &ResumedAt,
    ) -> bool {
        let ResumedAt {
            text,
            stream_name,
            from,
            ..
        } = at;
        // A replay-only session (recovered: no upstream) ends where its log does now; in
        // cluster mode its node may still be adding to it.
        let sess = &self.sessions[sid];
        let complete_at = match sess.streams.get(&n) {
            Some(st) if sess.upstream.is_some() => st.complete,
            _ => Some(bounds.tail),
        };
        let Some(last) = complete_at.filter(|&last| *from > last) else {
            return false;
        };
        self.stats.resumes_rejected += 1;
        self.error(
            conn,
            410,
            None,
            jsonrpc::RESUME_TRUNCATED,
            &format!("Gone: the stream ended at seq {last}; nothing follows {text}"),
            Some(json!({ "requested": text, "stream": redact_stream_name(stream_name), "tail": last, "ended": true })),
        );
        true
    }

    /// Points stream `n` of session `sid` at the resuming connection (loading the stream's
    /// state from the log's bounds when it is not in memory), closes the connection it had,
    /// and opens the SSE response from `at.from`.
    fn attach_resumed(&mut self, conn: ConnId, sid: &str, n: u32, bounds: Bounds, at: ResumedAt) {
        let retry = self.cfg.retry_ms;
        let sess = self.sessions.get_mut(sid).expect("checked");
        // A stream not in memory is complete at its log tail.
        let replay_only = sess.upstream.is_none();
        let (end_after, old) = match sess.streams.get_mut(&n) {
            Some(st) if replay_only => {
                // Complete at the log's tail as it is now (see `refuse_ended`).
                st.next_seq = bounds.tail + 1;
                st.complete = Some(bounds.tail);
                let old = st.conn.replace(conn);
                st.hold_deadline_ms = None;
                (st.complete, old)
            }
            Some(st) => {
                let old = st.conn.replace(conn);
                st.hold_deadline_ms = None;
                (st.complete, old)
            }
            None if n == 0 && sess.upstream.is_some() => {
                // The GET stream exists in the log but not in memory: cannot happen for a live
                // session (stream 0 is never dropped while the session lives).
                unreachable!("live session lost its GET stream state")
            }
            None => {
                let kind = if n == 0 {
                    StreamKind::Get
                } else {
                    StreamKind::Post
                };
                let mut st = Stream::new(at.stream_name.clone(), kind);
                st.next_seq = bounds.tail + 1;
                st.complete = Some(bounds.tail);
                st.conn = Some(conn);
                sess.streams.insert(n, st);
                (Some(bounds.tail), None)
            }
        };
        if let Some(old) = old {
            // The client came back on a new connection: the old one is stale. Closing it never
            // loses a message (the log has them); the new connection replays from N+1.
            self.conns.remove(&old);
            self.actions.push_back(Action::CloseSse { conn: old });
        }
        self.conns.insert(conn, (Owner::Session(sid.to_owned()), n));
        let headers = sse_headers();
        self.actions.push_back(Action::OpenSse {
            conn,
            // Clients that lose a resumed response before its first new event must still know
            // where they are (the TypeScript SDK otherwise retries without Last-Event-ID).
            reprime: Some(at.ev.to_string()),
            stream: at.stream_name,
            from_seq: at.from,
            retry_ms: Some(retry),
            headers,
            end_after,
        });
    }
}
