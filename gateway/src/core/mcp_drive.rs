//! Drives the MCP part ([`Mcp`]) from the core: the hooks the loop and the other handlers
//! call (a request on the MCP path, a connection closed, the turn, the deadline, shutdown, a
//! cluster ticket back, held resumes), each lending the part only the core's parts it needs
//! ([`McpCx`]) and carrying out the [`Effect`]s it returns, in order, with the core's own
//! machinery (answers, subscribers, closes).

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

use log_store::EventId;

use super::mcp::{self, Effect, Mcp, McpCx, McpRequest, McpSubscribe};
use super::net::Net;
use super::{Core, Shared, State};
use crate::shards::McpPlace;
use crate::streams::hub::Hub;
use crate::streams::sub::Sub;
use crate::sys;

/// Upstream events handled per turn before the core yields to other work (it re-wakes
/// itself when more are queued).
const UPSTREAM_EVENTS_PER_TURN_MAX: usize = 4096;

impl Mcp {
    /// The MCP part of core `id`, if the MCP front is on and runs on this core (`place`);
    /// called once when the core starts, it recovers the sessions whose streams are in its
    /// MCP shard's log.
    pub(super) fn on_core(
        shared: &Arc<Shared>,
        (id, place): (usize, McpPlace),
        hub: &Hub,
        now: Instant,
        outside: Option<mcp::McpOutside>,
    ) -> Option<Box<Mcp>> {
        if !shared.cfg.mcp.enabled() {
            return None;
        }
        let shard = place.shard_of_core(id)?;
        let outside = outside.unwrap_or_else(|| {
            let waker = shared.clone();
            let wake: mcp::Wake = Arc::new(move || sys::eventfd_wake(waker.eventfds[id].as_fd()));
            mcp::McpOutside {
                upstreams: Box::new(mcp::upstreams(&shared.cfg, wake)),
                session_ids: None,
            }
        });
        let m = Mcp::new(&shared.cfg, (id, shard), place, outside, hub, now);
        Some(Box::new(m))
    }
}

impl Core {
    /// The MCP part and what it may borrow of the core, if the MCP front runs on this core
    /// (and the connections, for what it answers itself).
    fn mcp_split(&mut self) -> Option<(&mut Mcp, McpCx<'_>, &mut Net)> {
        let m = self.mcp.as_deref_mut()?;
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

    /// A complete request on the MCP path, on the MCP owner core: every header of `head`
    /// and the body go to the MCP core, whose actions are then carried out.
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
        let Some((m, mut cx, _)) = self.mcp_split() else {
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
            self.mcp_apply();
        }
    }

    /// Hook from `close_conn`: an MCP connection (request or SSE) closed.
    pub(super) fn mcp_conn_closed(&mut self, slot: u32) {
        let now = self.now;
        if self.mcp.as_mut().is_some_and(|m| m.conn_closed(now, slot)) {
            self.mcp_apply();
        }
    }

    /// Hook from `end_turn`: once the MCP shard's log is poisoned (by a failed group commit or
    /// a failed flush of a segment), the MCP streams that could still be waited on end
    /// (`Mcp::log_failed`), once.
    pub(super) fn mcp_log_check(&mut self) {
        let Some((m, cx, _)) = self.mcp_split() else {
            return;
        };
        if !m.log_poisoned && cx.hub.poisoned(m.shard) {
            m.log_poisoned = true;
            let effects = m.log_failed(&cx);
            self.mcp_carry_out(effects);
            self.mcp_apply(); // the MCP core's actions for the connections that closed
        }
    }

    /// Carries out the MCP core's actions, in order, until it has none.
    pub(super) fn mcp_apply(&mut self) {
        loop {
            let Some((m, mut cx, _)) = self.mcp_split() else {
                return;
            };
            let Some(action) = m.next_action() else {
                return;
            };
            let effects = m.act(action, &mut cx);
            self.mcp_carry_out(effects);
        }
    }

    /// Carries out what the MCP part returned, in order (each on a connection that may have
    /// closed meanwhile: checked at its turn).
    fn mcp_carry_out(&mut self, effects: Vec<Effect>) {
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
                Effect::Subscribe(s) => self.mcp_subscribe(s),
            }
        }
    }

    /// An `Effect::Subscribe`: the connection becomes a subscriber of the MCP stream.
    fn mcp_subscribe(&mut self, e: McpSubscribe) {
        if self.net.conn_at(e.conn).is_none_or(|c| c.closing) {
            let now = self.now;
            return self.mcp.as_mut().expect("MCP part").conn_gone(now, e.cid);
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

    /// Hook once per reactor turn: upstream lines and exits, then the MCP core's timers.
    /// Actions are carried out after each event, so queued appends never pile up in memory.
    pub(super) fn mcp_turn(&mut self) {
        let now = self.now;
        for handled in 0.. {
            let Some(m) = self.mcp.as_mut() else { return };
            if handled == UPSTREAM_EVENTS_PER_TURN_MAX {
                // More may be queued: come back next turn.
                sys::eventfd_wake(self.shared.eventfds[self.id].as_fd());
                break;
            }
            if !m.handle_upstream_event(now) {
                break;
            }
            self.mcp_apply();
        }
        let Some(m) = self.mcp.as_mut() else { return };
        m.handle_timers(now);
        self.mcp_apply();
        if let Some(figures) = self.mcp.as_mut().and_then(|m| m.metrics_due(now)) {
            *self.m().mcp_snapshot.lock().expect("metrics lock") = Some(figures);
        }
    }

    /// Hook for the reactor's wait: the MCP part's next timer.
    pub(super) fn mcp_deadline(&self) -> Option<std::time::Instant> {
        self.mcp.as_ref()?.deadline()
    }

    /// Hook from `begin_shutdown` (before the logs are synced): every session ends with
    /// explicit errors in the log, upstream children are stopped.
    pub(super) fn mcp_shutdown(&mut self) {
        let Some(m) = self.mcp.as_mut() else { return };
        m.core.shutdown();
        self.mcp_apply();
        if let Some(m) = self.mcp.as_mut() {
            m.stop();
        }
    }

    /// Whether MCP records are on their way through JetStream (shutdown waits for them).
    pub(super) fn mcp_cluster_sending(&self) -> bool {
        self.mcp.as_ref().is_some_and(|m| m.cluster_sending())
    }

    /// A cluster ticket came back (applied as `Ok(id)`, or unconfirmed): true if it was an
    /// MCP record's (see `Mcp::ticket_done`).
    pub(super) fn mcp_ticket_done(&mut self, ticket: u64, outcome: Result<EventId, &str>) -> bool {
        let Some((m, mut cx, _)) = self.mcp_split() else {
            return false;
        };
        let mut effects = Vec::new();
        let mcp = m.ticket_done(ticket, outcome, &mut cx, &mut effects);
        self.mcp_carry_out(effects);
        mcp
    }

    /// Carries out the held resumes now due (`Mcp::due_catchups`); refuses those whose read
    /// barrier failed and, on `deadlines`, those past theirs (503 with `Retry-After`).
    pub(super) fn mcp_serve_catchups(&mut self, deadlines: bool) {
        let Some((m, cx, net)) = self.mcp_split() else {
            return;
        };
        for w in m.serve_catchups(deadlines, &cx, net) {
            self.mcp_request(w.conn.0, &w.head, w.body, w.close, w.subject.as_deref());
        }
    }
}
