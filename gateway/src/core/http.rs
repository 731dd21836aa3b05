//! HTTP connections on a core: pumps the connection machine (receives, requests, handoffs,
//! answers), carries out API requests (health, `DELETE`, subscribe; a publish goes through
//! the publishing path, `publishing.rs`) through the streams layer.

use super::{Core, PIPELINED_PER_CALL_MAX, Then};
use crate::proto::access;
use crate::proto::conn::{Kind, Request, Step};
use crate::proto::http;
use crate::proto::route::{self, Route};
use crate::streams::resume::Start;
use crate::streams::sub::{PENDING_STREAM, Sub};

/// A publish (one event or a batch): its answer may wait for the turn's deliveries.
fn is_publish(r: &Request) -> bool {
    matches!(
        &r.kind,
        Kind::Api {
            route: Route::Publish { .. } | Route::PublishBatch { .. },
            ..
        }
    )
}

/// A request's connection and who sent it (the gate's verdict).
pub(super) type Caller<'a> = (u32, &'a auth::Access);

impl Core {
    /// The machine's next steps, until it waits (bounded per call; a send completion or a
    /// receive continues), then whatever answers are ready go out: at once, or at the end of
    /// the turn if it published (`Waits::hold_to_turn_end`).
    pub(super) fn drive_http(&mut self, slot: u32) {
        let mut published = false;
        for _ in 0..PIPELINED_PER_CALL_MAX {
            let polled = self
                .net
                .poll_http(slot, &self.lim.conn, &self.mcp_place, &mut self.gate);
            let Some(step) = polled else {
                return;
            };
            match step {
                Step::Wait => {
                    self.net.note_starved(slot);
                    break;
                }
                Step::Recv { buf, from } => match self.net.want_plain(slot, buf, from) {
                    Then::Drive => continue, // decrypted plaintext was waiting
                    // The session ended (or failed): the slot may be freed already, so
                    // nothing after the close may touch it.
                    Then::Close => return self.close_conn(slot),
                    Then::Wait | Then::Pump => break, // a receive is armed
                },
                Step::HandOff { owner, bytes } => {
                    return self.net.hand_off_when_sent(slot, owner, bytes);
                }
                Step::Request(r) => {
                    published |= is_publish(&r);
                    if !self.carry_out(slot, r) {
                        return;
                    }
                }
            }
        }
        if !(published && self.waits.hold_to_turn_end(&mut self.net, slot)) {
            self.net.flush(slot);
        }
    }

    /// Carries out one request; false if the connection left HTTP (a subscriber, an MCP
    /// response) so the caller stops pumping it.
    fn carry_out(&mut self, slot: u32, r: Request) -> bool {
        let close = r.close;
        let route = match r.kind {
            Kind::Mcp { head } => {
                // With access control every MCP request carries a verified token with a `sub`
                // (the gate's rule): its session is bound to the keyed identity of its issuer
                // and subject (`mcp/identity.rs`).
                let key = self.shared.mcp_key.as_ref();
                let who = key.and_then(|k| k.identity(&r.access));
                self.mcp_request(slot, &head, r.body, close, who.as_deref());
                return false;
            }
            Kind::Api {
                route,
                event_type,
                idempotency_key: key,
            } => match route {
                Route::Publish { stream } => {
                    let ev = event_type.filter(|t| !t.is_empty());
                    let from = (slot, &r.access);
                    let evs = vec![(ev, r.body)];
                    self.publishing()
                        .publish(from, &stream, evs, (close, false), key);
                    return true;
                }
                Route::PublishBatch { stream } => {
                    let from = (slot, &r.access);
                    self.publishing()
                        .publish_batch(from, &stream, &r.body, close, key);
                    return true;
                }
                other => other,
            },
        };
        match route {
            Route::Healthz => {
                let b = http::json_response(200, &serde_json::json!({"status": "ok"}), close);
                self.net.answer(slot, b, close);
            }
            Route::Delete { stream } => self.delete_stream(slot, &stream, close),
            Route::Preflight => unreachable!("preflights are answered by the connection machine"),
            Route::Subscribe { stream, q } => {
                self.subscribe(slot, &stream, &q, &r.headers, r.access.expires_unix_secs);
                return false;
            }
            Route::Publish { .. } | Route::PublishBatch { .. } => unreachable!("handled above"),
        }
        true
    }

    /// Retries the receives starved by the body budget (oldest first), once some budget was
    /// given back since they starved.
    pub(super) fn retry_deferred_recvs(&mut self) {
        for r in self.net.deferred_due() {
            if self.net.conn_at(r).is_some_and(|c| !c.closing) {
                self.drive_http(r.0);
            }
        }
        self.net.retried();
    }

    // ---- subscribe ----

    pub(super) fn subscribe(
        &mut self,
        slot: u32,
        stream: &str,
        q: &route::SubscribeQuery,
        headers: &str,
        expires: Option<u64>,
    ) {
        // In cluster mode streams are created only where JetStream's messages are applied:
        // a subscribe waits (bounded) for what it names.
        if self.cluster_hold(slot, stream, q, headers, expires) {
            return;
        }
        // A stream not created yet is subscribed to as unborn: nothing is created (and no
        // place taken under the quotas) until its first publish; a refusal creates nothing.
        let key = self.hub.stream_key(stream);
        let key = key.unwrap_or((self.hub.shard_of(stream), PENDING_STREAM));
        let (subs, cx) = self.subs_cx();
        let (start, class) = subs.start(&cx, key, q);
        super::requests::resumed(cx.m, cx.net.conns.live(slot), class);
        match start {
            Start::Serve {
                cursor,
                preamble,
                aligned,
            } => {
                let preamble = access::with_headers(preamble, headers);
                let setup = |s: &mut Sub| s.expire_at(expires);
                if key.1 == PENDING_STREAM {
                    return self.subscribe_unborn_at(slot, stream, cursor, preamble, setup);
                }
                self.become_subscriber(slot, key, cursor, preamble, aligned, setup)
            }
            Start::Refuse(answer) => self.net.respond(slot, answer, true),
        }
    }
}
