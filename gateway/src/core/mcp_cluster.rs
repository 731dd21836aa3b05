//! The MCP front in cluster mode (`--nats-url`). Every MCP message goes through JetStream
//! like any publish, so every node's log holds every MCP stream under the same IDs, and a
//! `GET` with `Last-Event-ID` replays on any node (ARCHITECTURE.md, "MCP in cluster mode"):
//! - **Order.** The MCP core predicts each record's seq (its stream's count so far); each
//!   record carries it (`Gw-Seq`). A stream has up to `--cluster-mcp-inflight-max` records
//!   in flight (sent in order on one NATS connection), the rest queue behind. On this node
//!   each applied record must be its stream's oldest in flight at the predicted seq, else the
//!   stream breaks (its connections close, a resume gets 503); on *every* node a record whose
//!   `Gw-Seq` is not the seq JetStream's order gives it is stored as an explicit error record
//!   instead (`seq_mismatch_record`), so a lost or overtaken record is never a silent gap or
//!   reorder anywhere. With a window of 1 a retried send can never be overtaken, so streams
//!   survive a JetStream leader fail-over.
//! - **Streams are born with their first applied message** (as every stream in cluster
//!   mode): an SSE response opened before that waits as an unborn subscriber.
//! - **Other nodes' sessions** are recovered into this node's MCP core when a client resumes
//!   them with their session ID (`Mcp::cluster_recover`), replay only; new requests get 404
//!   (their upstream is elsewhere). Session IDs this process mints start with its own 4
//!   random bytes, so it never recovers its own (ended) sessions.
//! - **Catch-up.** A resume naming what this node has not applied yet (or a complete stream
//!   whose last records are still on their way) waits up to `--cluster-catchup-wait-ms`,
//!   then gets 503 with `Retry-After`. A replay-only resume (a session minted elsewhere: the
//!   MCP core ends its stream at this node's tail) also waits for a read barrier: JetStream's
//!   last sequence of the shard when it arrived, applied here (else 503, never a short replay).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use cluster::Inbound;
use log_store::{EventId, Seq};

use super::mcp::{Effect, Mcp, McpCx};
use crate::mcp::core::{parse_stream_name, redact_stream_name as redacted, subject_tag};
use crate::mcp::jsonrpc;
use crate::streams::hub::{Hub, SubRef};
use crate::streams::publish::RecordLimit;

/// One MCP record waiting for its turn.
#[derive(Debug)]
struct Queued {
    seq: Seq,
    event_type: Option<&'static str>,
    data: Vec<u8>,
}

/// An MCP stream's messages on their way through JetStream.
#[derive(Debug, Default)]
struct Order {
    /// The messages in flight, in the order they were sent: ticket and predicted seq (at
    /// most `--cluster-mcp-inflight-max`).
    inflight: VecDeque<(u64, Seq)>,
    queued: VecDeque<Queued>,
}

impl Order {
    /// Whether a new record may be sent now (else it queues: order is kept).
    fn may_send(&self, window: usize) -> bool {
        self.inflight.len() < window && self.queued.is_empty()
    }

    /// One of this stream's tickets came back (`Ok(seq)`: applied at `seq`). It must be the
    /// oldest in flight and carry the predicted seq; the popped oldest ticket is returned
    /// either way (the caller forgets it), with the reason the stream must break, if any.
    fn done(&mut self, ticket: u64, outcome: Result<Seq, &str>) -> (u64, Option<String>) {
        let (oldest, predicted) = self.inflight.pop_front().expect("the ticket in flight");
        let why = match outcome {
            Err(why) => Some(format!("JetStream did not confirm a record: {why}")),
            Ok(_) if oldest != ticket => Some(
                "JetStream stored the stream's records out of the order they were sent (a \
                 record was sent again after a failure)"
                    .to_owned(),
            ),
            Ok(seq) if seq != predicted => Some(format!(
                "the MCP core predicted seq {predicted}, JetStream's order gave {seq} (a record \
                 went missing, or another node wrote to this session's stream)"
            )),
            Ok(_) => None,
        };
        (oldest, why)
    }

    /// The next queued record the window lets go.
    fn next(&mut self, window: usize) -> Option<Queued> {
        (self.inflight.len() < window)
            .then(|| self.queued.pop_front())
            .flatten()
    }
}

/// What a held resume waits for besides its `Last-Event-ID`: a replay-only resume (of a
/// session this process did not mint) is read by the MCP core as ending at this node's tail,
/// so it is served only once this node has applied every message JetStream held for the
/// shard when the resume arrived (a node lagging by a few records would otherwise end the
/// stream short: a silent partial replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Barrier {
    /// None needed: this node's own session (`completing` covers its stream's end).
    Unneeded,
    /// JetStream's last sequence of the shard was asked for under this token.
    Asked(u64),
    /// Served once the shard's applied message count reaches this.
    At(u64),
    /// JetStream could not say (NATS down, a timeout): refused at once (503).
    Failed,
}

/// What becomes of a held resume now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    /// Carried out: its `Last-Event-ID` and its barrier are applied here.
    Serve,
    /// 503 with `Retry-After`: its barrier failed, or (`deadlines`) its deadline passed.
    Refuse,
    Wait,
}

/// The decision for one held resume: `id_applied` (the log holds its `Last-Event-ID` and a
/// completing stream's end), its barrier, the shard's applied message count.
pub(super) fn due(id_applied: bool, barrier: Barrier, shard_applied: u64, expired: bool) -> Due {
    let barrier_met = match barrier {
        Barrier::Unneeded => true,
        Barrier::Asked(_) | Barrier::Failed => false,
        Barrier::At(last) => shard_applied >= last,
    };
    match (id_applied && barrier_met, barrier, expired) {
        (true, _, _) => Due::Serve,
        (false, Barrier::Failed, _) | (false, _, true) => Due::Refuse,
        (false, _, false) => Due::Wait,
    }
}

/// A `GET` + `Last-Event-ID` this node has not applied yet (or that waits for its read
/// barrier), held until it has.
pub(super) struct CatchUp {
    pub(super) conn: SubRef,
    pub(super) id: EventId,
    pub(super) head: Vec<u8>,
    pub(super) body: Vec<u8>,
    pub(super) close: bool,
    pub(super) subject: Option<String>,
    pub(super) deadline: Instant,
    pub(super) barrier: Barrier,
}

/// The MCP core's cluster state (`Debug` prints counts: its maps hold session IDs).
pub(super) struct McpCluster {
    /// The hex prefix of every session ID this process mints (4 random bytes per process).
    pub(super) minted: String,
    streams: HashMap<String, Order>,
    /// In-flight ticket → its stream.
    tickets: HashMap<u64, String>,
    /// Bytes of queued (not yet sent) records (`--cluster-mcp-queue-bytes-max`).
    queued_bytes: usize,
    catchup: Vec<CatchUp>,
    /// Complete streams with records still on their way: stream → its last seq.
    completing: HashMap<String, Seq>,
    /// The read barrier request in flight (its token), and the next token
    /// ([`McpCluster::barrier_token`]).
    asked: Option<u64>,
    next_barrier: u64,
    /// Held resumes just found due: carried out without being held again.
    passed: Vec<SubRef>,
}

/// The record every node stores instead of an MCP record that JetStream's order put at
/// `got` while its publisher predicted `expected`: the JSON-RPC error for the same request
/// (or an `event: error` record), as for a record the log refused; a fixed `event: error`
/// record if even that would not fit `record_max`. A function of the message and the log, so
/// every node stores the same bytes.
pub(super) fn seq_mismatch_record(
    data: &[u8],
    expected: Seq,
    got: Seq,
    limit: RecordLimit,
) -> (Option<&'static str>, Vec<u8>) {
    let why = format!(
        "its publisher expected seq {expected}, JetStream's order gave {got} (a record before \
         it was lost, or it overtook one): the stream is broken from here"
    );
    mcp_substitute(data, &why, limit)
}

/// The record that takes an MCP record's place in its stream (`why` it could not be stored):
/// the MCP front's substitute, or a bare error record if that would not fit the log.
pub(super) fn mcp_substitute(
    data: &[u8],
    why: &str,
    limit: RecordLimit,
) -> (Option<&'static str>, Vec<u8>) {
    let (t, d) = jsonrpc::not_stored_substitute(data, why);
    if limit.overflow_any_id(t, &d).is_none() {
        return (t, d);
    }
    let body = serde_json::json!({ "error": why, "code": jsonrpc::NOT_STORED });
    (Some("error"), body.to_string().into_bytes())
}

impl McpCluster {
    pub(super) fn new(minted: String) -> McpCluster {
        McpCluster {
            minted,
            streams: HashMap::new(),
            tickets: HashMap::new(),
            queued_bytes: 0,
            catchup: Vec::new(),
            completing: HashMap::new(),
            asked: None,
            next_barrier: 0,
            passed: Vec::new(),
        }
    }
}

impl std::fmt::Debug for McpCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpCluster")
            .field("streams", &self.streams.len())
            .field("queued_bytes", &self.queued_bytes)
            .field("catchup", &self.catchup.len())
            .finish_non_exhaustive()
    }
}

impl McpCluster {
    /// The read barrier of a resume that arrives now: the token of a JetStream request sent
    /// after it. At most one request is in flight per MCP shard (a flood of resumes is not
    /// a flood of JetStream requests): a resume arriving meanwhile takes the next token,
    /// asked when the one in flight is answered (an answer to a request sent before the
    /// resume arrived could miss records stored in between).
    fn barrier_token(&mut self, shard: u32, handle: &cluster::Cluster) -> u64 {
        if self.asked.is_some() {
            return self.next_barrier;
        }
        let token = self.next_barrier;
        self.next_barrier += 1;
        self.asked = Some(token);
        handle.last_seq(shard, token);
        token
    }

    /// JetStream answered read barrier `token`: every resume waiting for it learns its
    /// barrier (the ones that went away meanwhile are gone); the next request goes out if
    /// resumes wait for it.
    pub(super) fn barrier_known(
        &mut self,
        token: u64,
        last: Result<u64, String>,
        (shard, handle): (u32, &cluster::Cluster),
    ) {
        let barrier = match &last {
            Ok(last) => Barrier::At(*last),
            Err(_) => Barrier::Failed,
        };
        let waiting = self.catchup.iter_mut();
        let mut told = 0;
        for w in waiting.filter(|w| w.barrier == Barrier::Asked(token)) {
            w.barrier = barrier;
            told += 1;
        }
        if let (Err(why), 1..) = (&last, told) {
            crate::warn_limited!(reason = %why, resumes = told, "MCP resumes refused: no read barrier");
        }
        if self.asked == Some(token) {
            self.asked = None;
            let next = Barrier::Asked(self.next_barrier);
            if self.catchup.iter().any(|w| w.barrier == next) {
                self.barrier_token(shard, handle);
            }
        }
    }
}

/// An [`Inbound::LastSeq`] for the MCP part ([`McpCluster::barrier_known`]), if this core
/// runs it in cluster mode.
pub(super) fn barrier_known(
    mcp: &mut Option<Box<Mcp>>,
    cluster: &Option<Box<super::cluster_state::ClusterCore>>,
    answer: Inbound,
) {
    let Inbound::LastSeq { token, last, .. } = answer else {
        return;
    };
    let (Some(m), Some(cc)) = (mcp.as_deref_mut(), cluster.as_deref()) else {
        return;
    };
    let shard = m.shard;
    if let Some(mc) = m.cluster.as_mut() {
        mc.barrier_known(token, last, (shard, &cc.handle));
    }
}

impl Mcp {
    fn mcp_cluster(&mut self) -> &mut McpCluster {
        self.cluster.as_mut().expect("cluster mode")
    }

    /// An `Action::Append` in cluster mode: sent now if its stream has nothing in flight,
    /// else queued behind it.
    pub(super) fn cluster_append(
        &mut self,
        stream: String,
        seq: Seq,
        event_type: Option<&'static str>,
        data: Vec<u8>,
        cx: &mut McpCx<'_>,
        out: &mut Vec<Effect>,
    ) {
        // Every node must be able to apply it: a record over the limit becomes an explicit
        // error record at the same seq (as in single-node mode).
        let (mut event_type, mut data) = (event_type, data);
        let limit = RecordLimit::of(cx.hub.log(self.shard));
        if let Some(framed) = limit.overflow_any_id(event_type, &data) {
            let record_max = limit.record_bytes_max;
            let why = format!("a {framed}-byte record exceeds the record limit {record_max}");
            self.cluster_note(&stream, &why);
            self.records_refused += 1;
            (event_type, data) = jsonrpc::not_stored_substitute(&data, &why);
            // The substitute repeats the message's JSON-RPC id, which may itself be too large:
            // then nothing can stand at this seq, and the stream breaks (as in single-node
            // mode). Every node must be able to apply what is sent.
            if let Some(framed) = limit.overflow_any_id(event_type, &data) {
                let why = format!("{why}; its {framed}-byte error record too");
                return self.break_stream(stream, why, cx, out);
            }
        }
        let max = cx.cfg.cluster.cluster_mcp_queue_bytes_max;
        let window = cx.cfg.cluster.cluster_mcp_inflight_max;
        let mc = self.mcp_cluster();
        let order = mc.streams.entry(stream.clone()).or_default();
        if !order.may_send(window) {
            if mc.queued_bytes + data.len() > max {
                let why = format!("--cluster-mcp-queue-bytes-max {max} reached");
                return self.break_stream(stream, why, cx, out);
            }
            mc.queued_bytes += data.len();
            order.queued.push_back(Queued {
                seq,
                event_type,
                data,
            });
            return;
        }
        self.cluster_send(stream, seq, event_type, data, cx);
    }

    /// Sends one record of `stream` (its `Order` exists) and notes it in flight.
    fn cluster_send(
        &mut self,
        stream: String,
        seq: Seq,
        event_type: Option<&'static str>,
        data: Vec<u8>,
        cx: &mut McpCx<'_>,
    ) {
        let cc = cx.cluster.as_deref_mut().expect("cluster mode");
        let event = event_type.map(str::to_owned);
        let ticket = cc.publish(self.shard, stream.clone(), event, data, Some(seq), None);
        cx.metrics.cluster_publishes_total.fetch_add(1, Relaxed);
        let mc = self.mcp_cluster();
        let order = mc.streams.get_mut(&stream).expect("the stream's order");
        order.inflight.push_back((ticket, seq));
        mc.tickets.insert(ticket, stream);
    }

    /// A ticket came back (applied as `Ok(id)`, or unconfirmed): true if it was an MCP
    /// record's. It must be the stream's oldest in flight and carry the predicted seq (so
    /// JetStream stored the stream's records in the order they were sent, none missing);
    /// then more are sent, else the stream is broken.
    pub(super) fn ticket_done(
        &mut self,
        ticket: u64,
        outcome: Result<EventId, &str>,
        cx: &mut McpCx<'_>,
        out: &mut Vec<Effect>,
    ) -> bool {
        let Some(mc) = self.cluster.as_mut() else {
            return false;
        };
        if mc.tickets.is_empty() {
            return false; // the common case: an API publish's ticket, no MCP record in flight
        }
        let Some(stream) = mc.tickets.remove(&ticket) else {
            return false;
        };
        let order = mc.streams.get_mut(&stream).expect("a ticket's stream");
        let (oldest, failed) = order.done(ticket, outcome.map(|id| id.seq));
        mc.tickets.remove(&oldest);
        if let Some(why) = failed {
            self.break_stream(stream, why, cx, out);
            return true;
        }
        let window = cx.cfg.cluster.cluster_mcp_inflight_max;
        loop {
            let mc = self.mcp_cluster();
            let order = mc.streams.get_mut(&stream).expect("present");
            let Some(next) = order.next(window) else {
                if order.inflight.is_empty() && order.queued.is_empty() {
                    mc.streams.remove(&stream);
                    mc.completing.remove(&stream);
                }
                return true;
            };
            mc.queued_bytes -= next.data.len();
            let Queued {
                seq,
                event_type,
                data,
            } = next;
            self.cluster_send(stream.clone(), seq, event_type, data, cx);
        }
    }

    /// Whether MCP records are on their way through JetStream (shutdown waits for them).
    pub(super) fn cluster_sending(&self) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|mc| !mc.streams.is_empty())
    }

    /// Drops what a broken stream still had on its way (its in-flight ticket is ignored
    /// when it comes back).
    pub(super) fn cluster_forget(&mut self, stream: &str) {
        let Some(mc) = self.cluster.as_mut() else {
            return;
        };
        mc.completing.remove(stream);
        if let Some(order) = mc.streams.remove(stream) {
            mc.queued_bytes -= order.queued.iter().map(|q| q.data.len()).sum::<usize>();
            for (t, _) in order.inflight {
                mc.tickets.remove(&t);
            }
        }
    }

    /// `Action::StreamComplete` in cluster mode: while its last records are on their way, a
    /// resume of the stream waits for them (see `applied`).
    pub(super) fn cluster_complete(&mut self, stream: &str, last_seq: Seq) {
        if let Some(mc) = self.cluster.as_mut()
            && mc.streams.contains_key(stream)
        {
            mc.completing.insert(stream.to_owned(), last_seq);
        }
    }

    /// A `GET` + `Last-Event-ID` (applied here) naming a stream of the session its
    /// `Mcp-Session-Id` names, when that session was minted by another node (or by this node
    /// before a restart): the session becomes known to this node's MCP core, replay only
    /// (`McpCore::recover_stream`). Only then: a node does not hold every session of the
    /// cluster (`--mcp-sessions-max` stays this node's), a client must know the session ID to
    /// recover it, and a session that ended on this node stays ended (404).
    pub(super) fn cluster_recover(
        &mut self,
        last_event_id: Option<&[u8]>,
        session: Option<&[u8]>,
        subject: Option<&str>,
        cx: &McpCx<'_>,
    ) {
        let Some(mc) = self.cluster.as_ref() else {
            return;
        };
        let (Some(id), Some(session)) = (parse_id(last_event_id), session) else {
            return;
        };
        let log = cx.hub.log(self.shard);
        let Some(name) = (id.epoch == log.epoch())
            .then(|| log.stream_name(id.stream))
            .flatten()
        else {
            return;
        };
        let Some((sid, _)) = parse_stream_name(name) else {
            return;
        };
        // A session bound to another token subject stays unknown here, as on its own node.
        let bound = subject.is_none_or(|s| sid.ends_with(&subject_tag(s)));
        if sid.as_bytes() != session || sid.starts_with(&mc.minted) || !bound {
            return;
        }
        let now_ms = self.now_ms(cx.now);
        self.core.recover_stream(name, now_ms);
        self.metrics_dirty = true;
    }

    /// Whether this `GET` on `conn` must wait for the node to apply its `Last-Event-ID` (then
    /// it is held, its body taken, and carried out later).
    pub(super) fn cluster_hold(
        &mut self,
        conn: SubRef,
        (head, body, close, subject): (&[u8], &mut Vec<u8>, bool, Option<&str>),
        last_event_id: Option<&[u8]>,
        cx: &McpCx<'_>,
    ) -> bool {
        if cx.cluster.is_none() {
            return false;
        }
        let Some(id) = parse_id(last_event_id) else {
            return false;
        };
        let mc = self.mcp_cluster();
        if let Some(i) = mc.passed.iter().position(|&c| c == conn) {
            mc.passed.swap_remove(i);
            return false; // held before, and due now
        }
        let barrier = match self.replay_only(id, cx.hub) {
            false if self.applied(id, cx.hub) => return false,
            false => Barrier::Unneeded,
            true => {
                let handle = &cx.cluster.as_deref().expect("cluster mode").handle;
                let shard = self.shard;
                Barrier::Asked(self.mcp_cluster().barrier_token(shard, handle))
            }
        };
        let wait = Duration::from_millis(cx.cfg.cluster.cluster_catchup_wait_ms);
        let c = CatchUp {
            conn,
            id,
            head: head.to_vec(),
            body: std::mem::take(body),
            close,
            subject: subject.map(str::to_owned),
            deadline: cx.now + wait,
            barrier,
        };
        cx.metrics.cluster_catchup_waits_total.fetch_add(1, Relaxed);
        self.mcp_cluster().catchup.push(c);
        true
    }

    /// Whether a resume from `id` would be replay-only here (the MCP core ends its stream at
    /// this node's tail): its stream is of a session another process minted, or not known
    /// here yet. Not for an ID of another epoch (the MCP core answers it at once).
    fn replay_only(&self, id: EventId, hub: &Hub) -> bool {
        let log = hub.log(self.shard);
        let minted = &self.cluster.as_ref().expect("cluster mode").minted;
        let name = log.stream_name(id.stream).and_then(parse_stream_name);
        id.epoch == log.epoch() && name.is_none_or(|(sid, _)| !sid.starts_with(minted.as_str()))
    }

    /// Takes the held resumes now due: those to carry out (not held again when they come
    /// back through [`Mcp::cluster_hold`]) and those to refuse; the rest wait.
    pub(super) fn due_catchups(
        &mut self,
        deadlines: bool,
        cx: &McpCx<'_>,
    ) -> (Vec<CatchUp>, Vec<CatchUp>) {
        let Some(mc) = self.cluster.as_ref() else {
            return (Vec::new(), Vec::new());
        };
        if mc.catchup.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let cc = cx.cluster.as_deref().expect("cluster mode");
        let shard_applied = *cc
            .applied
            .get(&self.shard)
            .expect("the MCP shard is this core's");
        let waiters = std::mem::take(&mut self.mcp_cluster().catchup);
        let (mut serve, mut refuse, mut keep) = (Vec::new(), Vec::new(), Vec::new());
        for w in waiters {
            let expired = deadlines && cx.now >= w.deadline;
            match due(
                self.applied(w.id, cx.hub),
                w.barrier,
                shard_applied,
                expired,
            ) {
                Due::Serve => serve.push(w),
                Due::Refuse => refuse.push(w),
                Due::Wait => keep.push(w),
            }
        }
        let mc = self.mcp_cluster();
        mc.catchup = keep;
        mc.passed = serve.iter().map(|w| w.conn).collect();
        (serve, refuse)
    }

    /// Whether the MCP log holds `id` (or `id` is not of its epoch: the MCP core answers),
    /// and, if its stream is complete, its last record: the MCP core reads a complete stream
    /// it no longer holds in memory as ending at the log's tail.
    pub(super) fn applied(&self, id: EventId, hub: &Hub) -> bool {
        let log = hub.log(self.shard);
        if id.epoch != log.epoch() {
            return true;
        }
        let (Some(b), Some(name)) = (log.bounds(id.stream), log.stream_name(id.stream)) else {
            return false;
        };
        let ending = self.cluster.as_ref().and_then(|mc| mc.completing.get(name));
        id.seq <= b.visible_tail && ending.is_none_or(|&last| last <= b.visible_tail)
    }

    /// The connections reading MCP stream `stream` (also those waiting for it to be born).
    pub(super) fn stream_subs(&self, stream: &str, cx: &McpCx<'_>) -> Vec<SubRef> {
        match cx.hub.log(self.shard).stream_id(stream) {
            Some(sid) => cx.hub.subscribers((self.shard, sid)).to_vec(),
            None => cx.hub.unborn().subs(stream).to_vec(),
        }
    }

    /// Logs a broken MCP stream's cause without its session ID.
    pub(super) fn cluster_note(&self, stream: &str, why: &str) {
        let stream = redacted(stream);
        crate::warn_limited!(core = self.core_id, %stream, reason = %why, "MCP record not stored");
    }
}

/// A `Last-Event-ID` header's value as an event ID.
fn parse_id(v: Option<&[u8]>) -> Option<EventId> {
    std::str::from_utf8(v?).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::{Barrier, CatchUp, Due, McpCluster, Order, Queued, RecordLimit, due};

    /// Every held resume's case: served only once its `Last-Event-ID` is applied and, for a
    /// replay-only one, the shard's applied count has reached JetStream's last sequence as it
    /// was when the resume arrived (never before: a short replay); refused when the barrier
    /// failed or the deadline passed; else it waits.
    #[test]
    fn a_replay_only_resume_is_served_only_past_its_read_barrier() {
        let barriers = [
            Barrier::Unneeded,
            Barrier::Asked(0),
            Barrier::At(5),
            Barrier::Failed,
        ];
        for id_applied in [false, true] {
            for barrier in barriers {
                for shard_applied in [0, 4, 5, 6] {
                    for expired in [false, true] {
                        let met = match barrier {
                            Barrier::Unneeded => true,
                            Barrier::At(last) => shard_applied >= last,
                            Barrier::Asked(_) | Barrier::Failed => false,
                        };
                        let want = if id_applied && met {
                            Due::Serve
                        } else if expired || barrier == Barrier::Failed {
                            Due::Refuse
                        } else {
                            Due::Wait
                        };
                        let case = (id_applied, barrier, shard_applied, expired);
                        assert_eq!(
                            due(id_applied, barrier, shard_applied, expired),
                            want,
                            "{case:?}"
                        );
                    }
                }
            }
        }
        // The bug this prevents: the node holds the ID (1..40 of 42 applied) but not the
        // rest JetStream held: the resume waits instead of ending the stream at 40.
        assert_eq!(due(true, Barrier::At(42), 40, false), Due::Wait);
        assert_eq!(due(true, Barrier::At(42), 40, true), Due::Refuse);
        assert_eq!(due(true, Barrier::At(42), 42, false), Due::Serve);
    }

    #[test]
    fn one_barrier_request_at_a_time_and_each_answer_reaches_its_resumes() {
        let held = |token| CatchUp {
            conn: (1, token as u32),
            id: log_store::EventId {
                epoch: log_store::Epoch(1),
                stream: log_store::StreamId(0),
                seq: 1,
            },
            head: Vec::new(),
            body: Vec::new(),
            close: false,
            subject: None,
            deadline: Instant::now(),
            barrier: Barrier::Asked(token),
        };
        let (handle, _inbox) = cluster::Cluster::detached();
        let mut mc = McpCluster::new("00000000".into());
        // One request in flight: resumes arriving meanwhile wait for the next one.
        assert_eq!(mc.barrier_token(0, &handle), 0);
        assert_eq!(mc.barrier_token(0, &handle), 1);
        assert_eq!(mc.barrier_token(0, &handle), 1);
        mc.catchup.extend([held(0), held(1), held(1)]);
        mc.barrier_known(7, Ok(3), (0, &handle)); // no resume waits for it: nothing changes
        mc.barrier_known(0, Ok(42), (0, &handle));
        assert_eq!(
            mc.asked,
            Some(1),
            "the next one is asked for the two waiting"
        );
        mc.barrier_known(1, Err("NATS down".into()), (0, &handle));
        let got: Vec<Barrier> = mc.catchup.iter().map(|w| w.barrier).collect();
        assert_eq!(got, [Barrier::At(42), Barrier::Failed, Barrier::Failed]);
        assert_eq!(mc.asked, None, "none waits: nothing asked");
    }

    fn queued(seq: u64) -> Queued {
        Queued {
            seq,
            event_type: None,
            data: vec![b'x'],
        }
    }

    fn limit(record_bytes_max: usize) -> RecordLimit {
        RecordLimit { record_bytes_max }
    }

    #[test]
    fn a_mispredicted_record_becomes_an_explicit_error_that_always_fits() {
        let resp = br#"{"jsonrpc":"2.0","id":7,"result":{}}"#;
        let (t, d) = super::seq_mismatch_record(resp, 5, 4, limit(135_168));
        let v: serde_json::Value = serde_json::from_slice(&d).unwrap();
        assert_eq!(
            (t, v["id"].clone()),
            (None, 7.into()),
            "an error for the same request"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("expected seq 5")
        );
        // A response whose id alone is over the limit: the fixed record.
        let huge = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","result":{{}}}}"#,
            "x".repeat(300)
        );
        let (t, d) = super::seq_mismatch_record(huge.as_bytes(), 5, 4, limit(256));
        assert_eq!(t, Some("error"));
        assert!(d.len() < 256 && !String::from_utf8(d).unwrap().contains("xxx"));
    }

    #[test]
    fn a_stream_sends_within_its_window_in_order_and_breaks_on_any_disorder() {
        let mut o = Order::default();
        // Window 2: two go, the third queues.
        assert!(o.may_send(2));
        o.inflight.push_back((10, 1));
        o.inflight.push_back((11, 2));
        assert!(!o.may_send(2));
        o.queued.push_back(queued(3));
        assert!(o.next(2).is_none(), "the window is full");
        // In order, at the predicted seq: fine; the queued one may go.
        assert_eq!(o.done(10, Ok(1)), (10, None));
        assert_eq!(o.next(2).map(|q| q.seq), Some(3));
        o.inflight.push_back((12, 3));
        assert!(!o.may_send(2));
        // Out of order (12 before 11): break, and 11 (the oldest) is handed back to forget.
        let mut a = Order::default();
        a.inflight.extend([(11, 2), (12, 3)]);
        let (oldest, why) = a.done(12, Ok(2));
        assert_eq!(oldest, 11);
        assert!(why.unwrap().contains("out of the order"));
        // Another seq than predicted (a record lost before it, or another writer): break.
        let mut b = Order::default();
        b.inflight.push_back((11, 2));
        assert!(b.done(11, Ok(3)).1.unwrap().contains("predicted seq 2"));
        // Unconfirmed: break.
        let mut c = Order::default();
        c.inflight.push_back((11, 2));
        assert!(c.done(11, Err("timeout")).1.unwrap().contains("timeout"));
        // A queued record never overtakes: nothing is sent while one waits.
        let mut d = Order::default();
        d.queued.push_back(queued(5));
        assert!(!d.may_send(16));
    }
}
