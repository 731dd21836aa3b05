//! Drives the MCP parts ([`Mcp`]) of the core from the core: the hooks the loop and the other
//! handlers call (a request on the MCP path, a connection closed, the turn, the deadline,
//! shutdown, a cluster ticket back, held resumes), each lending a part only the core's parts
//! it needs ([`McpCx`]) and carrying out the [`Effect`]s it returns, in order, with the core's
//! own machinery (answers, subscribers, closes).
//!
//! A core has one part per shard whose MCP sessions it serves: the first is the one it mints
//! sessions into (its MCP shard); more only after a restart with fewer `--cores`, for each
//! shard it now owns whose log holds sessions another core minted (replayed, never minted
//! into). Cluster mode has one part, on the legacy MCP shard's owner.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

use log_store::EventId;

use super::mcp::{self, Effect, Mcp, McpCx, McpRequest, McpSubscribe};
use super::net::Net;
use super::{Core, Shared, State};
use crate::shards::McpPlace;
use crate::streams::catalog::MCP_STREAM_PREFIX;
use crate::streams::hub::Hub;
use crate::streams::sub::Sub;
use crate::sys;

/// Upstream events handled per turn before the core yields to other work (it re-wakes
/// itself when more are queued).
const UPSTREAM_EVENTS_PER_TURN_MAX: usize = 4096;

/// The MCP parts of core `id`, if the MCP front is on and runs on this core (`place`):
/// its MCP shard's first, then (single node) one for each other shard of `hub` whose log
/// holds MCP streams. Called once when the core starts; each recovers the sessions whose
/// streams are in its shard's log.
pub(super) fn parts_on_core(
    shared: &Arc<Shared>,
    (id, place): (usize, McpPlace),
    hub: &Hub,
    now: Instant,
    outside: Option<mcp::McpOutside>,
) -> Vec<Mcp> {
    let Some(mine) = place.shard_of_core(id).filter(|_| shared.cfg.mcp.enabled()) else {
        return Vec::new();
    };
    let recovered = (0..place.shards).filter(|s| {
        *s != mine
            && place.everywhere
            && hub.has_shard(*s)
            && (hub.log(*s).streams()).any(|(_, n, _)| session_stream(n))
    });
    let mut outside = outside;
    let mut parts = Vec::new();
    for shard in std::iter::once(mine).chain(recovered) {
        let outside = outside.take().unwrap_or_else(|| {
            let waker = shared.clone();
            let wake: mcp::Wake = Arc::new(move || sys::eventfd_wake(waker.eventfds[id].as_fd()));
            mcp::McpOutside {
                upstreams: Box::new(mcp::upstreams(&shared.cfg, wake)),
                session_ids: None,
            }
        });
        let sessions = (place, &shared.mcp_sessions);
        let m = Mcp::new(&shared.cfg, (id, shard), sessions, outside, hub, now);
        parts.push(m);
    }
    parts
}

/// Whether log stream `name` is a stream of an MCP session (not of the 2026-07-28 era, whose
/// streams are not resumed after a restart).
fn session_stream(name: &str) -> bool {
    name.strip_prefix(MCP_STREAM_PREFIX)
        .is_some_and(|rest| !rest.starts_with('m'))
}

impl Core {
    /// MCP part `i` and what it may borrow of the core (and the connections, for what it
    /// answers itself).
    fn mcp_split(&mut self, i: usize) -> Option<(&mut Mcp, McpCx<'_>, &mut Net)> {
        let m = self.mcp.get_mut(i)?;
        let cx = McpCx {
            now: self.now,
            hub: &mut self.hub,
            cluster: self.cluster.as_deref_mut(),
            metrics: &self.shared.metrics[self.id],
            cfg: &self.shared.cfg,
            epochs: &self.shared.epochs,
        };
        Some((m, cx, &mut self.net))
    }

    /// A complete request on the MCP path, on a core that serves it: every header of `head`
    /// and the body go to the MCP core of the part whose shard the request's session names
    /// (else to the core's own), whose actions are then carried out.
    pub(super) fn mcp_request(
        &mut self,
        slot: u32,
        head: &[u8],
        body: Vec<u8>,
        close: bool,
        subject: Option<&str>,
    ) {
        let conn = (slot, self.net.io.generation(slot));
        let header_count_max = self.lim.conn.head.header_count_max;
        let shard = mcp::session_shard(head, self.shared.shards);
        let i = (self.mcp.iter())
            .position(|m| Some(m.shard) == shard)
            .unwrap_or(0);
        let Some((m, mut cx, _)) = self.mcp_split(i) else {
            let msg = "the MCP front is not running on this core";
            let b = crate::proto::http::error_response(503, "mcp_unavailable", msg, true);
            return self.net.respond(slot, b, true);
        };
        let req = McpRequest {
            conn,
            head,
            body,
            close,
            subject,
        };
        if m.handle_request(req, header_count_max, &mut cx) {
            self.mcp_apply(i);
        }
    }

    /// Hook from `close_conn`: an MCP connection (request or SSE) closed.
    pub(super) fn mcp_conn_closed(&mut self, slot: u32) {
        let now = self.now;
        for i in 0..self.mcp.len() {
            if self.mcp[i].conn_closed(now, slot) {
                self.mcp_apply(i);
            }
        }
    }

    /// Hook from `end_turn`: once an MCP part's log is poisoned (by a failed group commit or a
    /// failed flush of a segment), its MCP streams that could still be waited on end
    /// (`Mcp::log_failed`), once.
    pub(super) fn mcp_log_check(&mut self) {
        for i in 0..self.mcp.len() {
            let Some((m, cx, _)) = self.mcp_split(i) else {
                return;
            };
            if !m.log_poisoned && cx.hub.poisoned(m.shard) {
                m.log_poisoned = true;
                let effects = m.log_failed(&cx);
                self.mcp_carry_out(i, effects);
                self.mcp_apply(i); // the MCP core's actions for the connections that closed
            }
        }
    }

    /// Carries out part `i`'s MCP core's actions, in order, until it has none.
    pub(super) fn mcp_apply(&mut self, i: usize) {
        loop {
            let Some((m, mut cx, _)) = self.mcp_split(i) else {
                return;
            };
            let Some(action) = m.next_action() else {
                return;
            };
            let effects = m.act(action, &mut cx);
            self.mcp_carry_out(i, effects);
        }
    }

    /// Carries out what part `i` returned, in order (each on a connection that may have
    /// closed meanwhile: checked at its turn).
    fn mcp_carry_out(&mut self, i: usize, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::Respond { conn, bytes, close } => {
                    if self.net.conn_at(conn).is_some_and(|c| !c.closing) {
                        self.net.respond(conn.0, bytes, close);
                    }
                }
                Effect::Close(conn) => {
                    if self.net.conn_at(conn).is_some_and(|c| !c.closing) {
                        self.close_conn(conn.0);
                    }
                }
                Effect::EndAfter { conn, last_seq } => {
                    if let Some(c) = self.net.conn_at(conn)
                        && let State::Sub(sub) = &mut c.state
                    {
                        sub.end_after(last_seq);
                        self.pump(conn.0);
                    }
                }
                Effect::Subscribe(s) => self.mcp_subscribe(i, s),
            }
        }
    }

    /// An `Effect::Subscribe` of part `i`: the connection becomes a subscriber of the MCP
    /// stream.
    fn mcp_subscribe(&mut self, i: usize, e: McpSubscribe) {
        if self.net.conn_at(e.conn).is_none_or(|c| c.closing) {
            let now = self.now;
            return self.mcp[i].conn_gone(now, e.cid);
        }
        let end_after = e.end_after;
        let setup = |sub: &mut Sub| {
            sub.never_park();
            if let Some(last) = end_after {
                sub.end_after(last);
            }
        };
        let slot = e.conn.0;
        match e.key {
            Some(key) => self.become_subscriber(slot, key, e.from_seq, e.head, None, setup),
            // Cluster mode: its first message is not applied here yet.
            None if self.cluster.is_some() => {
                self.subscribe_unborn_at(slot, &e.stream, e.from_seq, e.head, setup)
            }
            None => unreachable!("the core creates a stream before opening it"),
        }
    }

    /// Hook once per reactor turn, for each part: upstream lines and exits, then the MCP
    /// core's timers. Actions are carried out after each event, so queued appends never pile
    /// up in memory. Then the parts' figures, summed, when one is due.
    pub(super) fn mcp_turn(&mut self) {
        let now = self.now;
        for i in 0..self.mcp.len() {
            for handled in 0.. {
                if handled == UPSTREAM_EVENTS_PER_TURN_MAX {
                    // More may be queued: come back next turn.
                    sys::eventfd_wake(self.shared.eventfds[self.id].as_fd());
                    break;
                }
                if !self.mcp[i].handle_upstream_event(now) {
                    break;
                }
                self.mcp_apply(i);
            }
            self.mcp[i].handle_timers(now);
            self.mcp_apply(i);
        }
        let due = self
            .mcp
            .iter_mut()
            .fold(false, |d, m| m.metrics_due(now) | d);
        if due {
            let mut figures = crate::metrics::mcp::McpFigures::default();
            for m in &self.mcp {
                figures.add(&super::mcp_metrics::figures(m));
            }
            *self.m().mcp_snapshot.lock().expect("metrics lock") = Some(figures);
        }
    }

    /// Hook for the reactor's wait: the MCP parts' next timer.
    pub(super) fn mcp_deadline(&self) -> Option<std::time::Instant> {
        self.mcp.iter().filter_map(|m| m.deadline()).min()
    }

    /// Hook from `begin_shutdown` (before the logs are synced): every session ends with
    /// explicit errors in the log, upstream children are stopped.
    pub(super) fn mcp_shutdown(&mut self) {
        for i in 0..self.mcp.len() {
            self.mcp[i].core.shutdown();
            self.mcp_apply(i);
            self.mcp[i].stop();
        }
    }

    /// Whether MCP records are on their way through JetStream (shutdown waits for them).
    pub(super) fn mcp_cluster_sending(&self) -> bool {
        self.mcp.iter().any(|m| m.cluster_sending())
    }

    /// A cluster ticket came back (applied as `Ok(id)`, or unconfirmed): true if it was an
    /// MCP record's (see `Mcp::ticket_done`; cluster mode has one MCP part).
    pub(super) fn mcp_ticket_done(&mut self, ticket: u64, outcome: Result<EventId, &str>) -> bool {
        let Some((m, mut cx, _)) = self.mcp_split(0) else {
            return false;
        };
        let mut effects = Vec::new();
        let mcp = m.ticket_done(ticket, outcome, &mut cx, &mut effects);
        self.mcp_carry_out(0, effects);
        mcp
    }

    /// Carries out the held resumes now due (`Mcp::due_catchups`); refuses those whose read
    /// barrier failed and, on `deadlines`, those past theirs (503 with `Retry-After`; cluster
    /// mode has one MCP part).
    pub(super) fn mcp_serve_catchups(&mut self, deadlines: bool) {
        let Some((m, cx, net)) = self.mcp_split(0) else {
            return;
        };
        for w in m.serve_catchups(deadlines, &cx, net) {
            self.mcp_request(w.conn.0, &w.head, w.body, w.close, w.subject.as_deref());
        }
    }
}
