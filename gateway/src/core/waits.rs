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

/// The connections with an answer waiting for durability.
#[derive(Debug, Default)]
pub(super) struct Waits {
    conns: Vec<SubRef>,
}

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
            if h.release_waits(|w| hub.visible(w)) {
                self.conns.push(r);
            }
            net.flush(r.0);
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
