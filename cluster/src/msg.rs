//! One event as one JetStream message: its headers (`Nats-Msg-Id` and the gateway's) and its
//! publish, whose acknowledgement the caller awaits (`client::confirm`).
#![forbid(unsafe_code)]

use async_nats::jetstream;

use crate::names::{HDR_EVENT, HDR_IDEMPOTENCY, HDR_ORIGIN, HDR_SEQ, HDR_STREAM};

/// One event as a JetStream message.
pub(crate) struct Msg {
    pub(crate) subject: String,
    pub(crate) id: String,
    pub(crate) stream: String,
    pub(crate) event: Option<String>,
    pub(crate) expect_seq: Option<u64>,
    /// A keyed publish's `Gw-Idempotency` and `Gw-Origin` headers.
    pub(crate) keyed: Option<(String, String)>,
    pub(crate) data: bytes::Bytes,
}

impl Msg {
    /// Its headers: `Nats-Msg-Id` and the gateway's.
    pub(crate) fn headers(&self) -> async_nats::HeaderMap {
        let mut h = async_nats::HeaderMap::new();
        h.insert(async_nats::header::NATS_MESSAGE_ID, self.id.as_str());
        h.insert(HDR_STREAM, self.stream.as_str());
        if let Some(ev) = &self.event {
            h.insert(HDR_EVENT, ev.as_str());
        }
        if let Some(seq) = self.expect_seq {
            h.insert(HDR_SEQ, seq.to_string().as_str());
        }
        if let Some((idem, origin)) = &self.keyed {
            h.insert(HDR_IDEMPOTENCY, idem.as_str());
            h.insert(HDR_ORIGIN, origin.as_str());
        }
        h
    }
}

pub(crate) type AckFuture = jetstream::context::PublishAckFuture;

pub(crate) async fn send(js: &jetstream::Context, m: &Msg) -> Result<AckFuture, String> {
    let p = jetstream::message::PublishMessage::build()
        .headers(m.headers())
        .payload(m.data.clone());
    js.send_publish(m.subject.clone(), p)
        .await
        .map_err(|e| e.to_string())
}
