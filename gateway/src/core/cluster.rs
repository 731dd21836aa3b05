//! Cluster mode on a core (`--nats-url`): publishes go to JetStream (one message per event)
//! and are answered once the node's own follower has applied them and they are durable in the
//! local log; every message of this core's shards is applied in JetStream order (checked: the
//! n-th message of a shard must be applied n-th, else the node stops loudly); a subscribe to a
//! stream not created yet is served from its event 1 once it is; a resume that names what this
//! node has not applied yet waits up to `--cluster-catchup-wait-ms`, then gets 503 with
//! `Retry-After`.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use cluster::{Applied, Inbound, names};
use log_store::{AppendError, EventId};

use super::cluster_state::{CatchUp, Pending, Ticket};
use super::http::Caller;
use super::mcp_cluster::barrier_known;
use super::{Core, State};
use crate::proto::conn::Wait;
use crate::proto::http;
use crate::proto::route::SubscribeQuery;
use crate::proto::sse;
use crate::streams::publish::{self, Event};
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

impl Core {
    /// Publishes `events` through JetStream; the answer waits for them to be applied here.
    pub(super) fn cluster_publish(
        &mut self,
        (slot, access): Caller<'_>,
        stream: &str,
        events: Vec<Event>,
        close: bool,
        batch: bool,
    ) {
        if let Err((status, code, msg)) = publish::check_events(&events) {
            return self.error(slot, status, code, &msg, close);
        }
        let (shard, who) = (self.hub.shard_of(stream), (access, self.conn(slot).peer));
        if let Err((status, code, msg)) = self.check_cluster_publish(stream, shard, &events, who) {
            return self.error(slot, status, code, &msg, close);
        }
        let conn = (slot, self.io.generation(slot));
        let cc = self.cluster.as_mut().expect("cluster mode");
        let n = events.len();
        let first = cc.publish_events(shard, stream, events);
        let p = Pending {
            conn,
            shard,
            first,
            tickets: vec![Ticket::Pending; n],
            batch,
            close,
            reason: None,
        };
        cc.pending.insert(first, p);
        self.m()
            .cluster_publishes_total
            .fetch_add(n as u64, Relaxed);
        if !self.waiting.contains(&conn) {
            self.waiting.push(conn);
        }
        if let State::Http(h) = &mut self.conn(slot).state {
            h.answer(Vec::new(), Some(ticket_wait(shard, first)), close);
        }
    }

    /// What a publish is checked for before anything is sent: every event within the record
    /// limit, and for a new stream a valid name, room under `--streams-max` and a place of the
    /// caller's under `--streams-per-subject-max`.
    fn check_cluster_publish(
        &self,
        stream: &str,
        shard: u32,
        events: &[Event],
        (access, peer): (&auth::Access, Option<std::net::IpAddr>),
    ) -> Result<(), (u16, &'static str, String)> {
        let log = self.hub.log(shard);
        publish::check_framed_worst(log, events)?;
        if log.stream_id(stream).is_none() {
            if let Err(e) = log_store::Log::check_stream_name(stream) {
                let (status, code) = publish::append_status(&e);
                return Err((status, code, e.to_string()));
            }
            let (sh, who) = (&self.shared, Subject::of(access, peer));
            subjects::reserve_clustered(&sh.quota, &sh.subjects, &who, stream).map_err(|e| {
                e.counter(self.m()).fetch_add(1, Relaxed);
                (e.status().0, e.status().1, e.to_string())
            })?;
        }
        Ok(())
    }

    /// Applies what the followers delivered (bounded per turn); answers publishes whose
    /// events all came back; serves the catch-up waiters that can be served now.
    pub(super) fn cluster_turn(&mut self) {
        let Some(cc) = self.cluster.as_mut() else {
            return;
        };
        if !cc.stalled.is_empty() {
            return;
        }
        let mut got = Vec::new();
        cc.inbox.drain(DRAIN_PER_TURN, |m| got.push(m));
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
                    let m = &self.m().cluster_snapshot_chunks_total;
                    m.fetch_add(chunks, Relaxed);
                    self.snapshot_stored(shard, seq)
                }
                m @ Inbound::LastSeq { .. } => barrier_known(&mut self.mcp, &self.cluster, m),
            }
        }
        if n > 0 {
            self.serve_catchups(false);
        }
    }

    /// Retries a stalled message (the tick), then the catch-up deadlines.
    pub(super) fn cluster_tick(&mut self) {
        let Some(cc) = self.cluster.as_mut() else {
            return;
        };
        let stalled = std::mem::take(&mut cc.stalled);
        for a in stalled {
            self.apply_or_stall(a);
        }
        self.serve_catchups(true);
        self.take_snapshots();
    }

    /// A snapshot is stored: the gauge of messages this core's stored snapshots cover.
    fn snapshot_stored(&mut self, shard: u32, seq: u64) {
        let covered = self
            .cluster
            .as_mut()
            .expect("cluster mode")
            .stored(shard, seq);
        self.m().cluster_snapshot_messages.store(covered, Relaxed);
    }

    /// Every `--cluster-snapshot-interval-secs`: the snapshots due ([`ClusterCore::take_snapshots`]).
    fn take_snapshots(&mut self) {
        let secs = self.shared.cfg.cluster.cluster_snapshot_interval_secs;
        let cc = self.cluster.as_mut().expect("cluster mode");
        cc.take_snapshots(self.now, secs, &self.hub);
    }

    fn apply_or_stall(&mut self, a: Applied) {
        let cc = self.cluster.as_mut().expect("cluster mode");
        if !cc.stalled.is_empty() {
            cc.stalled.push_back(a);
            return;
        }
        match self.apply(&a) {
            Ok(()) => {}
            Err(AppendError::DiskFull) => {
                self.m().cluster_apply_stalls_total.fetch_add(1, Relaxed);
                self.cluster.as_mut().expect("cluster").stalled.push_back(a);
            }
            Err(e) => panic!(
                "cluster: shard {} message {} cannot be applied to the local log ({e}); every \
                 node must apply every message: stopping",
                a.shard, a.seq
            ),
        }
    }

    /// Applies one message: the next of its shard, one event of its stream.
    fn apply(&mut self, a: &Applied) -> Result<(), AppendError> {
        let cc = self.cluster.as_mut().expect("cluster mode");
        let applied = *cc.applied.get(&a.shard).expect("a shard of this core");
        if let Err(b) = names::check_next(applied, a.seq) {
            panic!("cluster: shard {}: chain broken: {b}", a.shard);
        }
        let Some(name) = a.stream.as_deref() else {
            let b = cluster::ChainBreak::Foreign { seq: a.seq };
            panic!("cluster: shard {}: {b}", a.shard);
        };
        assert_eq!(
            self.hub.shard_of(name),
            a.shard,
            "cluster: message {} of shard {} names a stream of another shard",
            a.seq,
            a.shard
        );
        let key = match self.hub.stream_key(name) {
            Some(k) => k,
            None => {
                let k = self.hub.open_stream(name)?;
                self.shared.quota.count_created(name);
                self.adopt_unborn(name, k);
                k
            }
        };
        // A record whose publisher predicted its seq (an MCP record) and got another one (a
        // record before it was lost, or overtaken by this one): every node stores an explicit
        // error record in its place instead, so the break is in the log itself.
        let substitute = a.expect_seq.and_then(|e| {
            let log = self.hub.log(key.0);
            let next = log.bounds(key.1).map_or(1, |b| b.tail + 1);
            let limit = publish::RecordLimit::of(log);
            (e != next).then(|| super::mcp_cluster::seq_mismatch_record(&a.data, e, next, limit))
        });
        let (event, data) = match &substitute {
            Some((t, d)) => (*t, d.as_slice()),
            None => (a.event.as_deref(), a.data.as_slice()),
        };
        let ap = self.hub.log_mut(key.0).append(key.1, event, data)?;
        if substitute.is_some() {
            self.m().cluster_seq_mismatches_total.fetch_add(1, Relaxed);
        }
        *self
            .cluster
            .as_mut()
            .expect("cluster")
            .applied
            .get_mut(&a.shard)
            .expect("shard") += 1;
        self.hub.record_appends(key, 1);
        self.m().events_appended_total.fetch_add(1, Relaxed);
        self.m().cluster_applied_total.fetch_add(1, Relaxed);
        if let Some(t) = a.ticket
            && !self.mcp_ticket_done(t, Ok(ap.id))
        {
            self.resolve(t, Ticket::Applied(ap.id), None);
        }
        Ok(())
    }

    /// One ticket's outcome; the request is answered once none is pending.
    fn resolve(&mut self, ticket: u64, outcome: Ticket, reason: Option<String>) {
        let cc = self.cluster.as_mut().expect("cluster mode");
        if let Some(p) = cc.resolve(ticket, outcome, reason) {
            self.answer_publish(p);
        }
    }

    /// Replaces the held answer with the IDs (waiting for local durability) or, if any event
    /// went unconfirmed, a 503 naming the ones that were stored.
    fn answer_publish(&mut self, p: Pending) {
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
            self.m().cluster_unconfirmed_total.fetch_add(1, Relaxed);
            let msg = format!(
                "JetStream did not confirm every event ({}); the ones not listed in \
                 appended_ids may or may not have been stored",
                p.reason.as_deref().unwrap_or("no reason given")
            );
            let b = publish::refused_answer(503, "publish_unconfirmed", &msg, &ids, p.close);
            (b, None)
        };
        let Some(c) = self.conn_at(p.conn).filter(|c| !c.closing) else {
            return;
        };
        if let State::Http(h) = &mut c.state {
            h.replace_wait(ticket_wait(p.shard, p.first), bytes, wait);
        }
        // A ready answer (the 503) goes now; one that waits is released by `complete_waits`.
        self.flush(p.conn.0);
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
        if self.cluster.is_none() || self.caught_up(stream, q) {
            return false;
        }
        if q.last_event_id.is_none() && self.hub.stream_key(stream).is_none() {
            // Nothing published yet: subscribe now, from its first event, as in single-node
            // mode (subscribers commonly come first).
            self.subscribe_unborn(slot, stream, headers, expires);
            return true;
        }
        let wait = Duration::from_millis(self.shared.cfg.cluster.cluster_catchup_wait_ms);
        let c = CatchUp {
            conn: (slot, self.io.generation(slot)),
            stream: stream.to_owned(),
            q: q.clone(),
            headers: headers.to_owned(),
            expires,
            deadline: self.now + wait,
        };
        self.m().cluster_catchup_waits_total.fetch_add(1, Relaxed);
        self.cluster.as_mut().expect("cluster").catchup.push(c);
        true
    }

    /// A subscriber of a stream that does not exist yet: its preamble now, its events from 1
    /// once the stream is created here ([`Core::adopt_unborn`]).
    fn subscribe_unborn(&mut self, slot: u32, stream: &str, headers: &str, expires: Option<u64>) {
        let preamble = sse::subscribe_head(self.shared.cfg.retry_ms);
        let preamble = crate::proto::access::with_headers(preamble, headers);
        self.subscribe_unborn_at(slot, stream, 1, preamble, |s| s.expire_at(expires));
    }

    /// Whether this node has applied what the subscribe names: the stream, and the event of
    /// its `Last-Event-ID` when that ID is of this stream's epoch and id.
    fn caught_up(&self, stream: &str, q: &SubscribeQuery) -> bool {
        let Some((shard, sid)) = self.hub.stream_key(stream) else {
            return false;
        };
        let Some(Ok(id)) = q.last_event_id.as_deref().map(str::parse::<EventId>) else {
            return true;
        };
        let log = self.hub.log(shard);
        let bounds = log.bounds(sid).expect("live");
        id.epoch != log.epoch() || id.stream != sid || id.seq <= bounds.visible_tail
    }

    /// Serves the waiters that caught up; on `deadlines`, refuses the ones past theirs.
    fn serve_catchups(&mut self, deadlines: bool) {
        let Some(cc) = self.cluster.as_mut() else {
            return;
        };
        if cc.catchup.is_empty() {
            return self.mcp_serve_catchups(deadlines);
        }
        let waiters = std::mem::take(&mut cc.catchup);
        let mut keep = Vec::new();
        for w in waiters {
            if self.conn_at(w.conn).is_none_or(|c| c.closing) {
                continue;
            }
            let slot = w.conn.0;
            if self.caught_up(&w.stream, &w.q) {
                self.subscribe(slot, &w.stream, &w.q, &w.headers, w.expires);
            } else if deadlines && self.now >= w.deadline {
                self.m()
                    .cluster_catchup_timeouts_total
                    .fetch_add(1, Relaxed);
                self.refuse_catchup(slot);
            } else {
                keep.push(w);
            }
        }
        self.cluster.as_mut().expect("cluster").catchup.extend(keep);
        self.mcp_serve_catchups(deadlines);
    }

    pub(super) fn refuse_catchup(&mut self, slot: u32) {
        let body = serde_json::json!({
            "error": "catching_up",
            "message": "this node has not yet applied the event named by Last-Event-ID; \
                        retry (here or on another node)",
        });
        let b = http::json_response(503, &body, true);
        let b = crate::proto::access::with_headers(b, "Retry-After: 1\r\n");
        self.respond(slot, b, true);
    }
}
