//! HTTP connections on a core: pumps the connection machine (receives, requests, handoffs,
//! answers), carries out API requests (health, metrics, publish, subscribe) through the
//! streams layer, and releases answers once their publish is durable.

use super::{Core, PIPELINED_PER_CALL_MAX, Then};
use crate::proto::access;
use crate::proto::conn::{Kind, Request, Step};
use crate::proto::http;
use crate::proto::route::{self, Route};
use crate::streams::idempotency::Keyed;
use crate::streams::publish::{self, Event};
use crate::streams::resume::Start;
use crate::streams::sub::{PENDING_STREAM, Sub};

/// A request's connection and who sent it (the gate's verdict).
pub(super) type Caller<'a> = (u32, &'a auth::Access);

/// A publish's `Idempotency-Key`, if it has one.
type Idem = Option<String>;

impl Core {
    /// The machine's next steps, until it waits (bounded per call; a send completion or a
    /// receive continues), then whatever answers are ready go out.
    pub(super) fn drive_http(&mut self, slot: u32) {
        for _ in 0..PIPELINED_PER_CALL_MAX {
            let polled = self
                .net
                .poll_http(slot, &self.lim.conn, self.mcp_core, &mut self.gate);
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
                    if !self.carry_out(slot, r) {
                        return;
                    }
                }
            }
        }
        self.net.flush(slot);
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
                    self.publish(from, &stream, vec![(ev, r.body)], (close, false), key);
                    return true;
                }
                Route::PublishBatch { stream } => {
                    self.publish_batch((slot, &r.access), &stream, &r.body, close, key);
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

    // ---- publish ----

    fn publish_batch(
        &mut self,
        from: Caller<'_>,
        stream: &str,
        body: &[u8],
        close: bool,
        key: Idem,
    ) {
        match route::parse_batch(body, self.shared.cfg.event_bytes_max) {
            Ok(events) => {
                let evs = events.into_iter().map(|e| (e.event, e.data.into_bytes()));
                self.publish(from, stream, evs.collect(), (close, true), key);
            }
            Err(e) => {
                let (status, code, msg) = e.status();
                self.net.error(from.0, status, code, &msg, close);
            }
        }
    }

    /// A publish (`batch`: of `events:batch`); with an `Idempotency-Key`, a repeat stores
    /// nothing (`streams::idempotency::Keys::known`).
    fn publish(
        &mut self,
        from: Caller<'_>,
        stream: &str,
        events: Vec<Event>,
        how: (bool, bool),
        key: Idem,
    ) {
        let ((close, batch), keyed) = (how, key.map(|k| Keyed::new(k, &events)));
        let slot = from.0;
        if let Err((status, code, msg)) = publish::check_events(&events) {
            return self.net.error(slot, status, code, &msg, close);
        }
        if let Some(p) = self
            .idem
            .known(&self.hub, stream, keyed.as_ref(), self.now, close)
        {
            return self
                .waits
                .answer(&mut self.net, slot, p.answer, p.wait, close);
        }
        if let Some((cc, mut cx)) = self.cluster_cx() {
            // Through JetStream: the answer waits for the events to be applied here.
            return cc.publish_request(&mut cx, from, stream, events, how, keyed);
        }
        let key = self.hub.stream_key(stream);
        let (shard, sid) = key.unwrap_or((self.hub.shard_of(stream), PENDING_STREAM));
        if let Err((status, code, msg)) = publish::check_framed(self.hub.log(shard), sid, &events) {
            return self.net.error(slot, status, code, &msg, close);
        }
        let Some(key) = self.open_stream(from, stream, close) else {
            return;
        };
        let m = &self.shared.metrics[self.id];
        let p = self.hub.append_events(key, &events, (batch, close), m);
        self.idem
            .remember(stream, keyed, &p, events.len(), batch, self.now);
        self.waits
            .answer(&mut self.net, slot, p.answer, p.wait, close);
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
