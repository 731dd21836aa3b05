//! The publishing path behind one entry ([`Publishing::publish`]): the events checked, the
//! idempotent replay, then one of two appenders — JetStream in cluster mode
//! ([`ClusterCore::publish_request`]: the answer waits until the events are applied here) or
//! the local log (the stream created if new under the catalog's quotas, its unborn
//! subscribers adopted, `Hub::append_events`) — and one held answer (`Waits`). It borrows the
//! parts it needs for one request, never `Core`.

use super::cluster_state::ClusterCore;
use super::cluster_state::ClusterCx;
use super::http::Caller;
use crate::proto::route;
use crate::streams::StreamKey;
use crate::streams::hub::Hub;
use crate::streams::idempotency::{Durable, Keyed};
use crate::streams::publish::{self, Event};
use crate::streams::sub::PENDING_STREAM;
use crate::streams::subjects::Subject;

/// A publish's `Idempotency-Key`, if it has one.
pub(super) type Idem = Option<String>;

/// What a publish borrows of the core: the cluster part's view (`Hub`, `Net`, the
/// idempotency keys, `Waits`, `Shared`, metrics, clock) and, in cluster mode, the cluster part.
pub(super) struct Publishing<'a> {
    pub(super) cx: ClusterCx<'a>,
    pub(super) cluster: Option<&'a mut ClusterCore>,
}

impl Publishing<'_> {
    /// `POST .../events:batch`: the body parsed into events, then [`Publishing::publish`].
    pub(super) fn publish_batch(
        &mut self,
        from: Caller<'_>,
        stream: &str,
        body: &[u8],
        close: bool,
        key: Idem,
    ) {
        match route::parse_batch(body, self.cx.shared.cfg.event_bytes_max) {
            Ok(events) => {
                let evs = events.into_iter().map(|e| (e.event, e.data.into_bytes()));
                self.publish(from, stream, evs.collect(), (close, true), key);
            }
            Err(e) => {
                let (status, code, msg) = e.status();
                self.cx.net.error(from.0, status, code, &msg, close);
            }
        }
    }

    /// A publish (`batch`: of `events:batch`); with an `Idempotency-Key`, a repeat stores
    /// nothing (`streams::idempotency::Keys::known`).
    pub(super) fn publish(
        &mut self,
        from: Caller<'_>,
        stream: &str,
        events: Vec<Event>,
        how: (bool, bool),
        key: Idem,
    ) {
        let ((close, batch), keyed) = (how, key.map(|k| Keyed::new(k, &events)));
        let (slot, cx) = (from.0, &mut self.cx);
        if let Err((status, code, msg)) = publish::check_events(&events) {
            return cx.net.error(slot, status, code, &msg, close);
        }
        if let Some(p) = cx.idem.known(cx.hub, stream, keyed.as_ref(), cx.now, close) {
            return cx.waits.answer(cx.net, slot, p.answer, p.wait, close);
        }
        if let Some(cc) = self.cluster.as_deref_mut() {
            // Through JetStream: the answer waits for the events to be applied here.
            return cc.publish_request(cx, from, stream, events, how, keyed);
        }
        let key = cx.hub.stream_key(stream);
        let (shard, sid) = key.unwrap_or((cx.hub.shard_of(stream), PENDING_STREAM));
        if let Err((status, code, msg)) = publish::check_framed(cx.hub.log(shard), sid, &events) {
            return cx.net.error(slot, status, code, &msg, close);
        }
        let Some(key) = self.open_stream(from, stream, close) else {
            return;
        };
        let cx = &mut self.cx;
        let p = cx.hub.append_events(key, &events, (batch, close), cx.m);
        let n = events.len();
        if let Some(d) = cx.idem.remember(stream, keyed, &p, n, batch, cx.now) {
            write_key(cx.hub, key.0, &d);
        }
        cx.waits.answer(cx.net, slot, p.answer, p.wait, close);
    }

    /// The API stream `stream`, created if new and `--streams-max` and the `--streams-per-
    /// subject-max` of who asked (`access`) allow; `None` after an error answer was queued
    /// (closing when `close`).
    fn open_stream(
        &mut self,
        (slot, access): Caller<'_>,
        stream: &str,
        close: bool,
    ) -> Option<StreamKey> {
        let cx = &mut self.cx;
        if let Some(key) = cx.hub.stream_key(stream) {
            return Some(key);
        }
        let (sh, m) = (cx.shared, cx.m);
        let who = Subject::of(access, cx.net.conns.live(slot).peer);
        match cx
            .hub
            .create_api_stream((&sh.quota, &sh.subjects), &who, stream, m)
        {
            Ok(k) => {
                super::subs::adopt_unborn(cx.net, cx.hub, stream, k);
                Some(k)
            }
            Err((status, code, msg)) => {
                cx.net.error(slot, status, code, &msg, close);
                None
            }
        }
    }
}

/// Writes a stored keyed publish's key record after its events, so the key outlives a
/// restart. A refusal (a full disk, a poisoned log) leaves the key in memory only: the events
/// are stored and their answer stands; a restart would forget the key.
pub(super) fn write_key(hub: &mut Hub, shard: u32, d: &Durable) {
    if let Err(e) = hub.append_key(shard, (d.first, d.count), &d.bytes) {
        crate::warn_limited!(error = %e, "an Idempotency-Key was not written to the log: a restart forgets it");
    }
}
