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

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use cluster::Inbound;
use log_store::{EventId, Seq};

use super::mcp::{Effect, Mcp, McpCx};
use super::mcp_cluster_state::{Barrier, CatchUp, Due, McpCluster, Queued, due};
use super::net::Net;
use crate::mcp::core::{parse_stream_name, redact_stream_name as redacted, subject_tag};
use crate::mcp::jsonrpc;
use crate::streams::hub::{Hub, SubRef};
use crate::streams::publish::RecordLimit;

/// An [`Inbound::LastSeq`] for the MCP part ([`McpCluster::barrier_known`]), if this core
/// runs it in cluster mode.
pub(super) fn barrier_known(
    mcp: Option<&mut Mcp>,
    cluster: &Option<Box<super::cluster_state::ClusterCore>>,
    answer: Inbound,
) {
    let Inbound::LastSeq { token, last, .. } = answer else {
        return;
    };
    let (Some(m), Some(cc)) = (mcp, cluster.as_deref()) else {
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

    /// The held resumes to carry out now ([`Mcp::due_catchups`]) on connections still open;
    /// those whose read barrier failed and, on `deadlines`, those past theirs are refused
    /// here (503 with `Retry-After`).
    pub(super) fn serve_catchups(
        &mut self,
        deadlines: bool,
        cx: &McpCx<'_>,
        net: &mut Net,
    ) -> Vec<CatchUp> {
        let (mut serve, mut refuse) = self.due_catchups(deadlines, cx);
        serve.retain(|w| net.conn_at(w.conn).is_some_and(|c| !c.closing));
        refuse.retain(|w| net.conn_at(w.conn).is_some_and(|c| !c.closing));
        for w in refuse {
            cx.metrics
                .cluster_catchup_timeouts_total
                .fetch_add(1, Relaxed);
            super::cluster_state::refuse_catchup(net, w.conn.0);
        }
        serve
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
