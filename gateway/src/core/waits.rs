//! Answers held until what they claim is durable: a publish's 201 (its group commit, or in
//! cluster mode JetStream's acknowledgement and the message applied here), a `DELETE`'s 200.
//! The part keeps which HTTP connections hold one; it releases them when their wait becomes
//! visible and turns them into explicit errors when the group commit they wait for fails.
//! One place for the publish answer, whatever the appender.

use super::State;
use super::net::Net;
use crate::proto::conn::Wait;
use crate::proto::http;
use crate::streams::SubRef;
use crate::streams::hub::Hub;
use crate::streams::publish::LOG_FAILED;

/// The connections with an answer waiting for durability, and those whose answers wait for
/// the end of the turn.
#[derive(Debug, Default)]
pub(super) struct Waits {
    conns: Vec<SubRef>,
    /// The connections that published while the turn's completions were handled: their
    /// ready answers go out at the end of the turn, after the deliveries when those are few
    /// ([`Waits::deliver_first`]).
    held: Vec<SubRef>,
    /// Whether answers are held now (from the turn's start to its end; at once otherwise).
    holding: bool,
}

/// Subscribers a turn may wake and still deliver before the publishers' answers go out: a
/// publish's subscriber then gets its event without waiting behind the `201`s (nginx + nchan
/// deliver first too), and no `201` waits behind more than this many sends. A turn that wakes
/// more (one stream's fan-out) answers first, as a publisher pipelining behind 100 sends
/// would lose throughput (session 11: -15 % on 1 x 100 when every answer waited).
pub(super) const DELIVER_FIRST_WOKEN_MAX: usize = 8;

impl Waits {
    /// Queues `answer` on `slot`'s HTTP connection, held while `wait` is not visible.
    pub(super) fn answer(
        &mut self,
        net: &mut Net,
        slot: u32,
        answer: Vec<u8>,
        wait: Option<Wait>,
        close: bool,
    ) {
        let r = (slot, net.io.generation(slot));
        if wait.is_some() && !self.conns.contains(&r) {
            self.conns.push(r);
        }
        if let State::Http(h) = &mut net.conn(slot).state {
            h.answer(answer, wait, close);
        }
    }

    /// The turn's completions are about to be handled: answers of publishes wait for its end.
    pub(super) fn open_turn(&mut self) {
        self.holding = true;
    }

    /// Holds `slot`'s ready answers to the end of the turn (`false`: none is open, send them
    /// now).
    pub(super) fn hold_to_turn_end(&mut self, net: &mut Net, slot: u32) -> bool {
        if !self.holding {
            return false;
        }
        // A connection held twice is flushed twice: the second finds nothing new to send.
        self.held.push((slot, net.io.generation(slot)));
        true
    }

    /// Whether the turn delivers before it answers: it wakes `woken` subscribers.
    pub(super) fn deliver_first(woken: usize) -> bool {
        woken <= DELIVER_FIRST_WOKEN_MAX
    }

    /// The end of the turn: the held answers go out (on connections still open); later ones
    /// go out at once until the next turn opens.
    pub(super) fn send_held(&mut self, net: &mut Net) {
        self.holding = false;
        for &r in &self.held {
            if net.conn_at(r).is_some_and(|c| !c.closing) {
                net.flush(r.0);
            }
        }
        self.held.clear();
    }

    /// Releases answers whose wait became visible (durable), then sends what is ready.
    pub(super) fn complete(&mut self, net: &mut Net, hub: &Hub) {
        if self.conns.is_empty() {
            return;
        }
        for r in std::mem::take(&mut self.conns) {
            let Some(c) = net.conns.get(r.0) else {
                continue;
            };
            if c.closing || net.io.generation(r.0) != r.1 {
                continue;
            }
            let State::Http(h) = &mut c.state else {
                continue;
            };
            let released = h.release_waits(|w| hub.visible(w));
            if released.still_waiting {
                self.conns.push(r);
            }
            // Nothing released, nothing new to send: what was ready went out when it was.
            if released.some {
                net.flush(r.0);
            }
        }
    }

    /// A group commit of `shard` failed (its log is poisoned): the answers waiting for it
    /// become explicit errors — the events may be lost, so no 201 may claim them.
    pub(super) fn fail(&mut self, net: &mut Net, shard: u32) {
        for &r in &self.conns {
            let Some(c) = net.conn_at(r).filter(|c| !c.closing) else {
                continue;
            };
            if let State::Http(h) = &mut c.state {
                h.fail_waits(
                    |w| w.shard() == shard,
                    |close| http::error_response(500, "log_failed", LOG_FAILED, close),
                );
            }
            net.flush(r.0);
        }
    }
}
