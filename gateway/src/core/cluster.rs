//! Cluster mode on a core (`--nats-url`): publishes go to JetStream (one message per event)
//! and are answered once the node's own follower has applied them and they are durable in the
//! local log; every message of this core's shards is applied in JetStream order (checked: the
//! n-th message of a shard must be applied n-th, else the node stops loudly; one applied
//! already and delivered again is ignored), each as the
//! quarantine decides (`streams::quarantine`: as it is, an error record in its place, or
//! skipped — a message never stops a node); a subscribe to a
//! stream not created yet is served from its event 1 once it is; a resume that names what this
//! node has not applied yet waits up to `--cluster-catchup-wait-ms`, then gets 503 with
//! `Retry-After`.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use cluster::{Applied, Inbound, Next, names};
use log_store::{AppendError, EventId, Log};

use super::cluster_state::{CatchUp, ClusterCore, Pending, Ticket};
use super::cluster_state::{ClusterCx, refuse_catchup};
use super::http::Caller;
use super::mcp_cluster::barrier_known;
use super::mcp_cluster_state::{mcp_substitute, seq_mismatch_record};
use super::{Core, State};
use crate::logging::Gate;
use crate::metrics::CoreMetrics;
use crate::proto::conn::Wait;
use crate::proto::route::SubscribeQuery;
use crate::proto::sse;
use crate::streams::StreamKey;
use crate::streams::hub::Hub;
use crate::streams::idempotency::Keyed;
use crate::streams::publish::{self, Event};
use crate::streams::quarantine::{self, QUARANTINE_STREAM, Reason, Verdict};
use crate::streams::subjects::{self, Subject};

/// Messages taken from the inbox per turn (the rest wait for the next turn).
const DRAIN_PER_TURN: usize = 4096;

/// The wait a cluster publish's answer holds until its events are applied.
fn ticket_wait(shard: u32, first: u64) -> Wait {
    Wait::Applied {
        shard,
        ticket: first,
    }
}

/// A message's place, decided before its stream is created (if it must be) and written.
struct Placed<'a> {
    name: &'a str,
    substitute: Option<Record>,
    reason: Option<Reason>,
    key: StreamKey,
    /// The stream was created by this message (its unborn subscribers move to it).
    born: bool,
}

impl Core {
    /// The cluster part and what it borrows, in cluster mode.
    pub(super) fn cluster_cx(&mut self) -> Option<(&mut ClusterCore, ClusterCx<'_>)> {
        let (cc, cx) = self.cluster_parts();
        Some((cc?, cx))
    }

    /// The publishing path and what it borrows ([`super::publishing::Publishing`]).
    pub(super) fn publishing(&mut self) -> super::publishing::Publishing<'_> {
        let (cluster, cx) = self.cluster_parts();
        super::publishing::Publishing { cx, cluster }
    }

    /// The cluster part, if on, and the core's parts a publish or the cluster part borrows.
    fn cluster_parts(&mut self) -> (Option<&mut ClusterCore>, ClusterCx<'_>) {
        let cx = ClusterCx {
            hub: &mut self.hub,
            net: &mut self.net,
            idem: &mut self.idem,
            waits: &mut self.waits,
            shared: &self.shared,
            m: &self.shared.metrics[self.id],
            now: self.now,
        };
        (self.cluster.as_deref_mut(), cx)
    }

    /// Applies what the followers delivered (bounded per turn); answers publishes whose
    /// events all came back; serves the catch-up waiters that can be served now.
    pub(super) fn cluster_turn(&mut self) {
        let Some(got) = self.cluster.as_mut().and_then(|cc| cc.drain()) else {
            return;
        };
        let n = got.len();
        for m in got {
            match m {
                Inbound::Message(a) => self.apply_or_stall(a),
                Inbound::Unconfirmed { ticket, reason, .. } => {
                    if !self.mcp_ticket_done(ticket, Err(&reason)) {
                        self.resolve(ticket, Ticket::Unconfirmed, Some(reason))
                    }
                }
                Inbound::SnapshotStored { shard, seq, chunks } => {
                    let (cc, cx) = self.cluster_cx().expect("cluster mode");
                    cc.snapshot_stored(cx.m, shard, seq, chunks)
                }
                m @ Inbound::LastSeq { .. } => {
                    barrier_known(self.mcp.first_mut(), &self.cluster, m)
                }
            }
        }
        if n > 0 {
            self.serve_catchups(false);
        }
    }

    /// Retries a stalled message (the tick), then the catch-up deadlines, then the snapshots
    /// due ([`ClusterCore::take_snapshots`]).
    pub(super) fn cluster_tick(&mut self) {
        let Some(cc) = self.cluster.as_mut() else {
            return;
        };
        for a in cc.take_stalled() {
            self.apply_or_stall(a);
        }
        self.serve_catchups(true);
        let secs = self.shared.cfg.cluster.cluster_snapshot_interval_secs;
        let cc = self.cluster.as_mut().expect("cluster mode");
        cc.take_snapshots(self.now, secs, &self.hub);
    }

    /// Applies `a` now ([`ClusterCore::apply`]), unless messages are stalled (it queues
    /// behind them); one the local log refuses stalls ([`ClusterCore::stall`]). The ticket
    /// it answers is the MCP part's or a publish's.
    fn apply_or_stall(&mut self, a: Applied) {
        let (cc, mut cx) = self.cluster_cx().expect("cluster mode");
        let Some(a) = cc.unless_stalled(a) else {
            return;
        };
        match cc.apply(&a, &mut cx) {
            Ok(Some((t, id))) => {
                if !self.mcp_ticket_done(t, Ok(id)) {
                    self.resolve(t, Ticket::Applied(id), None);
                }
            }
            Ok(None) => {}
            Err(e) => cc.stall(cx.m, a, e),
        }
    }

    /// One ticket's outcome; the request is answered once none is pending.
    fn resolve(&mut self, ticket: u64, outcome: Ticket, reason: Option<String>) {
        let (cc, mut cx) = self.cluster_cx().expect("cluster mode");
        cc.settle(ticket, outcome, reason, &mut cx);
    }
}

impl ClusterCore {
    /// The stalled messages, to be applied again (the tick), in order.
    fn take_stalled(&mut self) -> std::collections::VecDeque<Applied> {
        std::mem::take(&mut self.stalled)
    }

    /// `a`, to apply now, unless messages are stalled: then it queues behind them (a shard's
    /// messages are applied in order).
    fn unless_stalled(&mut self, a: Applied) -> Option<Applied> {
        if self.stalled.is_empty() {
            return Some(a);
        }
        self.stalled.push_back(a);
        None
    }

    /// A message the local log refused: on a full disk it stalls (retried at each tick, and
    /// nothing is drained meanwhile); any other error stops the node.
    fn stall(&mut self, m: &CoreMetrics, a: Applied, e: AppendError) {
        if !matches!(e, AppendError::DiskFull) {
            panic!(
                "cluster: shard {} message {} cannot be applied to the local log ({e}); every \
                 node must apply every message: stopping",
                a.shard, a.seq
            );
        }
        m.cluster_apply_stalls_total.fetch_add(1, Relaxed);
        self.stalled.push_back(a);
    }

    /// Applies one message ([`ClusterCore::place_next`], [`ClusterCore::append_placed`]); a
    /// stream it creates takes its unborn subscribers in between
    /// ([`super::subs::adopt_unborn`]). The ticket it answers, if any.
    fn apply(
        &mut self,
        a: &Applied,
        cx: &mut ClusterCx<'_>,
    ) -> Result<Option<(u64, EventId)>, AppendError> {
        let Some(placed) = self.place_next(a, cx)? else {
            return Ok(None);
        };
        if placed.born {
            super::subs::adopt_unborn(cx.net, cx.hub, placed.name, placed.key);
        }
        self.append_placed(a, placed, cx)
    }

    /// What this turn takes from the inbox (bounded), unless a stalled message waits.
    fn drain(&mut self) -> Option<Vec<Inbound>> {
        if !self.stalled.is_empty() {
            return None;
        }
        let mut got = Vec::new();
        self.inbox.drain(DRAIN_PER_TURN, |m| got.push(m));
        Some(got)
    }

    /// A publish that passed the event and idempotency checks: checked for the cluster, sent,
    /// and its answer held until its events are applied here.
    pub(super) fn publish_request(
        &mut self,
        cx: &mut ClusterCx<'_>,
        (slot, access): Caller<'_>,
        stream: &str,
        events: Vec<Event>,
        (close, batch): (bool, bool),
        keyed: Option<Keyed>,
    ) {
        let (shard, who) = (cx.hub.shard_of(stream), (access, cx.net.conn(slot).peer));
        let checked = check_cluster_publish(cx, stream, shard, &events, who);
        if let Err((status, code, msg)) = checked {
            return cx.net.error(slot, status, code, &msg, close);
        }
        let conn = (slot, cx.net.io.generation(slot));
        let n = events.len();
        let first = self.publish_events(shard, stream, events, keyed.as_ref(), batch);
        let p = Pending {
            conn,
            shard,
            first,
            tickets: vec![Ticket::Pending; n],
            batch,
            close,
            reason: None,
        };
        self.pending.insert(first, p);
        cx.m.cluster_publishes_total.fetch_add(n as u64, Relaxed);
        let wait = Some(ticket_wait(shard, first));
        cx.waits.answer(cx.net, slot, Vec::new(), wait, close);
    }

    /// A snapshot is stored: the gauge of messages this core's stored snapshots cover.
    fn snapshot_stored(&mut self, m: &CoreMetrics, shard: u32, seq: u64, chunks: u64) {
        m.cluster_snapshot_chunks_total.fetch_add(chunks, Relaxed);
        let covered = self.stored(shard, seq);
        m.cluster_snapshot_messages.store(covered, Relaxed);
    }

    /// The first half of applying a message: the next of its shard (else ignored, or the node
    /// stops), placed as the quarantine decides ([`place`]), its stream created if new.
    fn place_next<'a>(
        &mut self,
        a: &'a Applied,
        cx: &mut ClusterCx<'_>,
    ) -> Result<Option<Placed<'a>>, AppendError> {
        let applied = *self.applied.get(&a.shard).expect("a shard of this core");
        match names::check_next(applied, a.seq) {
            Ok(Next::Apply) => {}
            Ok(Next::Again) => return note_redelivered(cx.m, a).map(|()| None),
            Err(b) => panic!("cluster: shard {}: chain broken: {b}", a.shard),
        }
        let log = cx.hub.log(a.shard);
        let (name, substitute, reason) = place(a, log, cx.hub.shards());
        let (key, born) = match log.stream_id(name) {
            Some(sid) => ((a.shard, sid), false),
            None => {
                let key = (a.shard, cx.hub.log_mut(a.shard).create_stream(name)?);
                cx.shared.quota.count_created(name);
                (key, true)
            }
        };
        let placed = Placed {
            name,
            substitute,
            reason,
            key,
            born,
        };
        Ok(Some(placed))
    }

    /// The second half: the record appended and counted; the ticket it answers, if any.
    fn append_placed(
        &mut self,
        a: &Applied,
        placed: Placed<'_>,
        cx: &mut ClusterCx<'_>,
    ) -> Result<Option<(u64, EventId)>, AppendError> {
        let Placed {
            name,
            substitute,
            reason,
            key,
            ..
        } = placed;
        let (event, data) = match &substitute {
            Some((t, d)) => (*t, d.as_slice()),
            None => (a.event.as_deref(), a.data.as_slice()),
        };
        let ap = cx.hub.log_mut(key.0).append(key.1, event, data)?;
        match (reason, &a.idempotency) {
            (Some(r), _) => note_quarantined(cx.m, a, r),
            (None, Some(h)) => {
                if let Some(d) = cx.idem.on_applied(name, h, ap.id, cx.now) {
                    super::publishing::write_key(cx.hub, key.0, &d);
                }
            }
            (None, None) => {}
        }
        *self.applied.get_mut(&a.shard).expect("shard") += 1;
        cx.hub.record_appends(key, 1);
        cx.m.events_appended_total.fetch_add(1, Relaxed);
        cx.m.cluster_applied_total.fetch_add(1, Relaxed);
        // A skipped message's ID is no stream's: never an answer (no publish of ours is skipped).
        Ok(a.ticket
            .filter(|_| name != QUARANTINE_STREAM)
            .map(|t| (t, ap.id)))
    }

    /// One ticket's outcome; the request is answered once none is pending.
    fn settle(
        &mut self,
        ticket: u64,
        outcome: Ticket,
        reason: Option<String>,
        cx: &mut ClusterCx<'_>,
    ) {
        if let Some(p) = self.resolve(ticket, outcome, reason) {
            answer_publish(p, cx);
        }
    }
}

/// Replaces the held answer with the IDs (waiting for local durability) or, if any event
/// went unconfirmed, a 503 naming the ones that were stored.
fn answer_publish(p: Pending, cx: &mut ClusterCx<'_>) {
    let ids: Vec<EventId> = p
        .tickets
        .iter()
        .filter_map(|t| match t {
            Ticket::Applied(id) => Some(*id),
            _ => None,
        })
        .collect();
    let (bytes, wait) = if ids.len() == p.tickets.len() {
        // Applied here; durable once the local log's group commit covers the last one.
        publish::stored_answer(p.shard, &ids, false, p.batch, p.close)
    } else {
        cx.m.cluster_unconfirmed_total.fetch_add(1, Relaxed);
        let msg = format!(
            "JetStream did not confirm every event ({}); the ones not listed in \
             appended_ids may or may not have been stored",
            p.reason.as_deref().unwrap_or("no reason given")
        );
        let b = publish::refused_answer(503, "publish_unconfirmed", &msg, &ids, p.close);
        (b, None)
    };
    let Some(c) = cx.net.conn_at(p.conn).filter(|c| !c.closing) else {
        return;
    };
    if let State::Http(h) = &mut c.state {
        h.replace_wait(ticket_wait(p.shard, p.first), bytes, wait);
    }
    // A ready answer (the 503) goes now; one that waits is released by `complete_waits`.
    cx.net.flush(p.conn.0);
}

/// What a publish is checked for before anything is sent: every event within the record
/// limit, and for a new stream a valid name, room under `--streams-max` and a place of the
/// caller's under `--streams-per-subject-max`.
fn check_cluster_publish(
    cx: &ClusterCx<'_>,
    stream: &str,
    shard: u32,
    events: &[Event],
    (access, peer): (&auth::Access, Option<std::net::IpAddr>),
) -> Result<(), (u16, &'static str, String)> {
    if events.len() > cluster::BATCH_MESSAGES_MAX {
        let msg = format!(
            "{} events: a batch holds at most {} in cluster mode (one JetStream atomic batch)",
            events.len(),
            cluster::BATCH_MESSAGES_MAX
        );
        return Err((413, "batch_too_many_events", msg));
    }
    let log = cx.hub.log(shard);
    publish::check_framed_worst(log, events)?;
    if log.stream_id(stream).is_none() {
        if let Err(e) = log_store::Log::check_stream_name(stream) {
            let (status, code) = publish::append_status(&e);
            return Err((status, code, e.to_string()));
        }
        let (sh, who) = (cx.shared, Subject::of(access, peer));
        subjects::reserve_clustered(&sh.quota, &sh.subjects, &who, stream).map_err(|e| {
            e.counter(cx.m).fetch_add(1, Relaxed);
            (e.status().0, e.status().1, e.to_string())
        })?;
    }
    Ok(())
}

/// Where a message goes, carrying out [`quarantine::decide`] over its shard's log: the stream
/// (the internal [`QUARANTINE_STREAM`] for a skipped one), the record that replaces its own
/// (an MCP stream's kind of error record, or the API's), and the quarantine reason.
fn place<'a>(a: &'a Applied, log: &Log, shards: u32) -> (&'a str, Option<Record>, Option<Reason>) {
    let m = quarantine::Message {
        shard: a.shard,
        stream: a.stream.as_deref(),
        event: a.event.as_deref(),
        seq_header: a.seq_header.as_deref(),
        data: &a.data,
    };
    let limit = publish::RecordLimit::of(log);
    let cx = quarantine::Context { shards, limit };
    let next = |name: &str| {
        let sid = log.stream_id(name);
        sid.and_then(|s| log.bounds(s)).map_or(1, |b| b.tail + 1)
    };
    match quarantine::decide(&m, &cx, next) {
        Verdict::Apply { stream } => (stream, None, None),
        Verdict::Skip { reason } => {
            let record = quarantine::skip_record(reason, a.seq);
            (QUARANTINE_STREAM, Some(record), Some(reason))
        }
        Verdict::Substitute {
            stream,
            reason,
            expected,
        } => {
            let record = match (quarantine::is_mcp(stream), expected) {
                (true, Some(e)) => seq_mismatch_record(&a.data, e, next(stream), limit),
                (true, None) => mcp_substitute(&a.data, reason.describe(), limit),
                (false, _) => quarantine::error_record(reason),
            };
            (stream, Some(record), Some(reason))
        }
    }
}

/// A message applied already was delivered again: counted, logged once a minute; nothing
/// to apply.
fn note_redelivered(m: &CoreMetrics, a: &Applied) -> Result<(), AppendError> {
    m.cluster_redeliveries_total.fetch_add(1, Relaxed);
    crate::warn_limited!(
        "cluster: shard {} message {} delivered again (applied already): ignored",
        a.shard,
        a.seq
    );
    Ok(())
}

/// An event's type and data.
type Record = (Option<&'static str>, Vec<u8>);

/// Counts a quarantined message and logs it, once per reason per minute (any writer of the
/// subject can send them at will). Neither the stream's name nor any header is printed.
fn note_quarantined(m: &CoreMetrics, a: &Applied, reason: Reason) {
    m.cluster_quarantined_total[reason.index()].fetch_add(1, Relaxed);
    if reason == Reason::SeqMismatch {
        m.cluster_seq_mismatches_total.fetch_add(1, Relaxed);
    }
    static GATES: [Gate; Reason::ALL.len()] = [const { Gate::new() }; Reason::ALL.len()];
    if let Some(suppressed) = GATES[reason.index()].pass() {
        tracing::warn!(
            suppressed,
            reason = reason.label(),
            "cluster: shard {} message {} quarantined ({}); every node does the same",
            a.shard,
            a.seq,
            reason.describe()
        );
    }
}

impl Core {
    /// In cluster mode: whether this subscribe must wait for the node to catch up (then it
    /// is held, and answered later).
    pub(super) fn cluster_hold(
        &mut self,
        slot: u32,
        stream: &str,
        q: &SubscribeQuery,
        headers: &str,
        expires: Option<u64>,
    ) -> bool {
        let Some((cc, cx)) = self.cluster_cx() else {
            return false;
        };
        match cc.hold(&cx, slot, (stream, q), headers, expires) {
            Hold::Pass => false,
            Hold::Unborn => {
                self.subscribe_unborn(slot, stream, headers, expires);
                true
            }
            Hold::Held => true,
        }
    }

    /// A subscriber of a stream that does not exist yet: its preamble now, its events from 1
    /// once the stream is created here ([`super::subs::adopt_unborn`]).
    fn subscribe_unborn(&mut self, slot: u32, stream: &str, headers: &str, expires: Option<u64>) {
        let preamble = sse::subscribe_head(self.shared.cfg.retry_ms);
        let preamble = crate::proto::access::with_headers(preamble, headers);
        self.subscribe_unborn_at(slot, stream, 1, preamble, |s| s.expire_at(expires));
    }

    /// Serves the waiters that caught up; on `deadlines`, refuses the ones past theirs.
    fn serve_catchups(&mut self, deadlines: bool) {
        let Some((cc, mut cx)) = self.cluster_cx() else {
            return;
        };
        for w in cc.due_catchups(&mut cx, deadlines) {
            self.subscribe(w.conn.0, &w.stream, &w.q, &w.headers, w.expires);
        }
        self.mcp_serve_catchups(deadlines);
    }
}

/// What becomes of a subscribe in cluster mode ([`ClusterCore::hold`]).
enum Hold {
    /// This node has applied what it names: served now.
    Pass,
    /// Its stream is not created here yet and it names no event: it subscribes now, from
    /// the stream's first event.
    Unborn,
    /// Held until this node catches up (answered later).
    Held,
}

impl ClusterCore {
    /// Whether a subscribe waits until this node catches up, or `--cluster-catchup-wait-ms`
    /// passes (then it is held here).
    fn hold(
        &mut self,
        cx: &ClusterCx<'_>,
        slot: u32,
        (stream, q): (&str, &SubscribeQuery),
        headers: &str,
        expires: Option<u64>,
    ) -> Hold {
        if caught_up(cx.hub, stream, q) {
            return Hold::Pass;
        }
        if q.last_event_id.is_none() && cx.hub.stream_key(stream).is_none() {
            // Nothing published yet: subscribe now, from its first event, as in single-node
            // mode (subscribers commonly come first).
            return Hold::Unborn;
        }
        let wait = Duration::from_millis(cx.shared.cfg.cluster.cluster_catchup_wait_ms);
        let c = CatchUp {
            conn: (slot, cx.net.io.generation(slot)),
            stream: stream.to_owned(),
            q: q.clone(),
            headers: headers.to_owned(),
            expires,
            deadline: cx.now + wait,
        };
        cx.m.cluster_catchup_waits_total.fetch_add(1, Relaxed);
        self.catchup.push(c);
        Hold::Held
    }

    /// The held subscribes to serve now (caught up); the ones whose connection went are
    /// dropped and, on `deadlines`, the ones past theirs refused; the rest keep waiting.
    fn due_catchups(&mut self, cx: &mut ClusterCx<'_>, deadlines: bool) -> Vec<CatchUp> {
        let mut serve = Vec::new();
        for w in std::mem::take(&mut self.catchup) {
            match catchup_turn(&w, cx, deadlines) {
                Turn::Serve => serve.push(w),
                Turn::Wait => self.catchup.push(w),
                Turn::Gone | Turn::Refused => {}
            }
        }
        serve
    }
}

/// A catch-up waiter's turn.
enum Turn {
    /// Its connection closed or is closing: dropped.
    Gone,
    /// Caught up: subscribe it now.
    Serve,
    /// Past its deadline: refused (503) already.
    Refused,
    /// Still waiting.
    Wait,
}

/// What becomes of one catch-up waiter now; on `deadlines`, one past its deadline is refused.
fn catchup_turn(w: &CatchUp, cx: &mut ClusterCx<'_>, deadlines: bool) -> Turn {
    if cx.net.conn_at(w.conn).is_none_or(|c| c.closing) {
        return Turn::Gone;
    }
    if caught_up(cx.hub, &w.stream, &w.q) {
        return Turn::Serve;
    }
    if !(deadlines && cx.now >= w.deadline) {
        return Turn::Wait;
    }
    cx.m.cluster_catchup_timeouts_total.fetch_add(1, Relaxed);
    refuse_catchup(cx.net, w.conn.0);
    Turn::Refused
}

/// Whether this node has applied what the subscribe names: the stream, and the event of
/// its `Last-Event-ID` when that ID is of this stream's epoch and id.
fn caught_up(hub: &Hub, stream: &str, q: &SubscribeQuery) -> bool {
    let Some((shard, sid)) = hub.stream_key(stream) else {
        return false;
    };
    let Some(Ok(id)) = q.last_event_id.as_deref().map(str::parse::<EventId>) else {
        return true;
    };
    let log = hub.log(shard);
    let bounds = log.bounds(sid).expect("live");
    id.epoch != log.epoch() || id.stream != sid || id.seq <= bounds.visible_tail
}
