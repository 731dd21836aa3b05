//! Streams coming and going on a core (an API stream's creation under `--streams-max` is the
//! publishing path's, `publishing.rs`): the subscribers waiting for a stream not created yet
//! (unborn, moved to it at its creation), `DELETE`, and
//! idle expiry (`--stream-idle-expire-secs`). A removed stream's name is free again; a stream
//! created later under it has a new stream id, so the old incarnation's IDs are refused as
//! another stream's and never read as the new one's.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use log_store::RemoveError;

use super::Core;
use crate::proto::conn::Wait;
use crate::proto::http;
use crate::streams::StreamKey;
use crate::streams::sub::{PENDING_STREAM, Sub};
use crate::streams::subjects;

impl Core {
    /// A subscriber of a stream that does not exist here yet, reading from `cursor` once it
    /// is created ([`super::subs::adopt_unborn`]).
    pub(super) fn subscribe_unborn_at(
        &mut self,
        slot: u32,
        stream: &str,
        cursor: u64,
        preamble: Vec<u8>,
        setup: impl FnOnce(&mut Sub),
    ) {
        let key = (self.hub.shard_of(stream), PENDING_STREAM);
        let r = (slot, self.net.io.generation(slot));
        self.hub.unborn_mut().wait(stream, r);
        self.become_subscriber(slot, key, cursor, preamble, None, setup);
    }

    /// `DELETE /v1/streams/{name}`: its subscribers are closed (a resume gets the new
    /// incarnation's refusal of a foreign ID, never a gap), its parked windows dropped, a
    /// durable *stream removed* record written; the answer (200) waits until it is durable.
    pub(super) fn delete_stream(&mut self, slot: u32, stream: &str, close: bool) {
        if self.cluster.is_some() {
            let msg = "streams cannot be deleted in cluster mode (every node would have to \
                       remove it at the same point of the replicated log)";
            return self.net.error(slot, 501, "not_in_cluster_mode", msg, close);
        }
        let Some(key) = self.hub.stream_key(stream) else {
            return self
                .net
                .error(slot, 404, "unknown_stream", "no stream of that name", close);
        };
        match self.remove_stream(key) {
            Ok(removed) => {
                self.m().streams_deleted_total.fetch_add(1, Relaxed);
                let (answer, wait) = deleted_answer(stream, key, &removed, close);
                self.waits.answer(&mut self.net, slot, answer, wait, close);
            }
            Err(e) => {
                let (status, code) = remove_status(&e);
                self.net.error(slot, status, code, &e.to_string(), close);
            }
        }
    }

    /// Removes `key` after closing its subscribers and dropping its parked windows.
    fn remove_stream(&mut self, key: StreamKey) -> Result<log_store::Removed, RemoveError> {
        let subs: Vec<_> = self.hub.subscribers(key).to_vec();
        for r in subs {
            if self.net.conn_at(r).is_some_and(|c| !c.closing) {
                self.close_conn(r.0);
            }
        }
        let name = self.hub.log(key.0).stream_name(key.1).map(str::to_owned);
        let removed = self.hub.remove_stream(key)?;
        self.subs.parked.forget(key);
        let name = name.expect("a live stream has a name");
        subjects::release(&self.shared.quota, &self.shared.subjects, &name);
        Ok(removed)
    }

    /// Idle expiry (`--stream-idle-expire-secs`), at the retention tick.
    pub(super) fn expire_idle_streams(&mut self) {
        let secs = self.shared.cfg.stream_idle_expire_secs;
        if secs == 0 {
            return;
        }
        for key in self.hub.idle_streams(self.now, Duration::from_secs(secs)) {
            match self.remove_stream(key) {
                Ok(_) => {
                    self.m().streams_expired_total.fetch_add(1, Relaxed);
                }
                Err(e) => tracing::error!(core = self.id, "idle stream expiry: {e}"),
            }
        }
    }
}

/// A `DELETE`'s 200, held until the removal is durable (every append before it is then).
fn deleted_answer(
    stream: &str,
    key: StreamKey,
    removed: &log_store::Removed,
    close: bool,
) -> (Vec<u8>, Option<Wait>) {
    let wait = (!removed.durable).then_some(Wait::Durable {
        shard: key.0,
        stream: key.1.0,
        seq: u64::MAX,
    });
    let body = serde_json::json!({"stream": stream, "deleted": true});
    (http::json_response(200, &body, close), wait)
}

/// The status and code of a removal the log refused.
fn remove_status(e: &RemoveError) -> (u16, &'static str) {
    match e {
        RemoveError::DiskFull => (507, "insufficient_storage"),
        RemoveError::Poisoned => (500, "log_failed"),
        _ => (500, "remove_failed"),
    }
}
