//! A core's cluster-mode state (`--nats-url`), apart from the connections it answers: the
//! tickets of publishes on their way through JetStream and the requests they complete, the
//! subscribes waiting for this node to catch up, and the shard snapshots due and stored (the
//! subscribers of streams not born yet are the hub's, as in single-node mode).
//! `core/cluster.rs` carries out what it decides.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use cluster::Applied;
use log_store::EventId;

use super::Shared;
use super::net::Net;
use crate::metrics::CoreMetrics;
use crate::proto::http;
use crate::proto::route::SubscribeQuery;
use crate::streams::hub::{Hub, SubRef};
use crate::streams::idempotency::{self, Keyed, Keys};
use crate::streams::publish::Event;

/// One ticket of a publish.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ticket {
    Pending,
    Applied(EventId),
    Unconfirmed,
}

/// A publish request waiting for its events to come back from JetStream.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) conn: SubRef,
    pub(super) shard: u32,
    pub(super) first: u64,
    pub(super) tickets: Vec<Ticket>,
    pub(super) batch: bool,
    pub(super) close: bool,
    pub(super) reason: Option<String>,
}

/// A subscribe waiting for this node to apply what it names.
#[derive(Debug)]
pub(super) struct CatchUp {
    pub(super) conn: SubRef,
    pub(super) stream: String,
    pub(super) q: SubscribeQuery,
    pub(super) headers: String,
    pub(super) expires: Option<u64>,
    pub(super) deadline: Instant,
}

/// A core's cluster state.
#[derive(Debug)]
pub(super) struct ClusterCore {
    pub(super) inbox: cluster::Inbox,
    pub(super) handle: cluster::Cluster,
    /// Messages applied, per shard of this core.
    pub(super) applied: HashMap<u32, u64>,
    pub(super) next_ticket: u64,
    /// Publish requests by first ticket, and each ticket's request.
    /// Publish requests by first ticket: a request's tickets are `first..first + n`, so a
    /// ticket's request is the last one starting at or before it.
    pub(super) pending: BTreeMap<u64, Pending>,
    pub(super) catchup: Vec<CatchUp>,
    /// When the next snapshots are due, and the message count of each shard's last one.
    pub(super) next_snapshot: Option<Instant>,
    pub(super) snapshotted: HashMap<u32, u64>,
    /// The message count of each shard's latest stored snapshot.
    pub(super) stored: HashMap<u32, u64>,
    /// A message the local log could not take yet (disk full): retried at the tick; nothing
    /// more is taken from the inbox meanwhile (the followers pause behind it).
    pub(super) stalled: VecDeque<Applied>,
}

impl ClusterCore {
    pub(super) fn new(
        inbox: cluster::Inbox,
        handle: cluster::Cluster,
        logs: &[(u32, log_store::Log)],
    ) -> ClusterCore {
        let applied = logs
            .iter()
            .map(|(s, log)| (*s, crate::clustering::applied(log)))
            .collect();
        ClusterCore {
            inbox,
            handle,
            applied,
            next_ticket: 0,
            pending: BTreeMap::new(),
            catchup: Vec::new(),
            next_snapshot: Some(Instant::now()),
            snapshotted: HashMap::new(),
            stored: HashMap::new(),
            stalled: VecDeque::new(),
        }
    }

    /// Whether the loop should come back at once (the inbox had more than one turn's worth).
    pub(super) fn busy(&self) -> bool {
        self.stalled.is_empty() && self.inbox.more()
    }

    /// Sends one event through JetStream under a new ticket (its outcome comes back to this
    /// core by it).
    pub(super) fn publish(
        &mut self,
        shard: u32,
        stream: String,
        event: Option<String>,
        data: Vec<u8>,
        expect_seq: Option<u64>,
        keyed: Option<cluster::Keyed>,
    ) -> u64 {
        let p = self.ticketed(shard, stream, (event, data), expect_seq, keyed);
        let ticket = p.ticket;
        self.handle.publish(p);
        ticket
    }

    /// One event under a new ticket.
    fn ticketed(
        &mut self,
        shard: u32,
        stream: String,
        (event, data): Event,
        expect_seq: Option<u64>,
        keyed: Option<cluster::Keyed>,
    ) -> cluster::Publish {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        cluster::Publish {
            shard,
            ticket,
            stream,
            event,
            data,
            expect_seq,
            keyed,
        }
    }

    /// Sends a request's events under consecutive tickets; returns the first. Two or more go
    /// as one JetStream atomic batch: stored together and in order, or not at all. A keyed
    /// request's events carry its key ([`idempotency::cluster_msg_id`]).
    pub(super) fn publish_events(
        &mut self,
        shard: u32,
        stream: &str,
        events: Vec<Event>,
        keyed: Option<&Keyed>,
        batch: bool,
    ) -> u64 {
        let first = self.next_ticket;
        let n = events.len();
        let mut ps = Vec::with_capacity(n);
        for (i, event) in events.into_iter().enumerate() {
            let keyed = keyed.map(|k| cluster::Keyed {
                msg_id: idempotency::cluster_msg_id(stream, k, i),
                header: idempotency::cluster_header(k, i, n, batch),
            });
            ps.push(self.ticketed(shard, stream.to_owned(), event, None, keyed));
        }
        match ps.len() {
            0 => unreachable!("a publish has events (an empty batch is refused when parsed)"),
            1 => self.handle.publish(ps.pop().expect("one")),
            _ => self.handle.publish_batch(ps),
        }
        first
    }

    /// A snapshot of `shard` covering `seq` messages is stored: the messages this core's
    /// stored snapshots cover in all.
    pub(super) fn stored(&mut self, shard: u32, seq: u64) -> u64 {
        let e = self.stored.entry(shard).or_default();
        *e = (*e).max(seq);
        self.stored.values().sum()
    }

    /// Every `--cluster-snapshot-interval-secs`: each shard of this core that applied
    /// something since its last snapshot stores a new one (its streams in id order with their
    /// tails: O(streams)).
    pub(super) fn take_snapshots(&mut self, now: Instant, secs: u64, hub: &Hub) {
        if secs == 0 || self.next_snapshot.is_some_and(|t| now < t) {
            return;
        }
        self.next_snapshot = Some(now + Duration::from_secs(secs));
        for (&shard, &applied) in &self.applied {
            if applied == 0 || self.snapshotted.get(&shard) == Some(&applied) {
                continue;
            }
            let log = hub.log(shard);
            let streams: Vec<(String, u64)> = log
                .streams()
                .map(|(_, name, b)| (name.to_owned(), b.tail))
                .collect();
            // Cluster mode removes no stream: ids are dense, in the order recreated from this.
            assert_eq!(streams.len(), log.stream_count(), "no stream removed");
            let snap = cluster::Snapshot {
                epoch: log.epoch().0,
                seq: applied,
                streams,
            };
            self.handle.snapshot(shard, &snap);
            self.snapshotted.insert(shard, applied);
        }
    }

    /// One ticket's outcome: the request it completes, once none of its tickets is pending.
    pub(super) fn resolve(
        &mut self,
        ticket: u64,
        outcome: Ticket,
        reason: Option<String>,
    ) -> Option<Pending> {
        let Some((&first, p)) = self.pending.range_mut(..=ticket).next_back() else {
            return None; // answered already (an unconfirmed publish that was stored after all)
        };
        // Past that request's tickets: its request was answered.
        let t = p.tickets.get_mut((ticket - first) as usize)?;
        if !matches!(t, Ticket::Pending) {
            return None;
        }
        *t = outcome;
        if reason.is_some() {
            p.reason = reason;
        }
        if p.tickets.iter().any(|t| matches!(t, Ticket::Pending)) {
            return None;
        }
        self.pending.remove(&first)
    }
}

/// What the cluster part borrows of the core for one call (disjoint fields, never `Core`).
pub(super) struct ClusterCx<'a> {
    pub(super) hub: &'a mut Hub,
    pub(super) net: &'a mut Net,
    pub(super) idem: &'a mut Keys,
    /// Connections with an answer waiting for durability.
    pub(super) waits: &'a mut super::waits::Waits,
    pub(super) shared: &'a Shared,
    pub(super) m: &'a CoreMetrics,
    pub(super) now: Instant,
}

/// A held subscribe past its deadline: 503 with `Retry-After`.
pub(super) fn refuse_catchup(net: &mut Net, slot: u32) {
    let body = serde_json::json!({
        "error": "catching_up",
        "message": "this node has not yet applied the event named by Last-Event-ID; \
                    retry (here or on another node)",
    });
    let b = http::json_response(503, &body, true);
    let b = crate::proto::access::with_headers(b, "Retry-After: 1\r\n");
    net.respond(slot, b, true);
}
