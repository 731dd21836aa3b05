//! A request's events as one JetStream atomic batch (ADR-50, NATS server ≥ 2.12; the shard
//! streams allow it): JetStream stores all of them, contiguous and in their order, or none.
//! So a resend can never reorder a batch or split it around another node's publishes, and a
//! failed attempt leaves nothing behind to be overtaken.
//!
//! Every message but the last is published without a reply (JetStream stages it); the last
//! carries the commit and is answered with the batch's acknowledgement or its refusal. A failed
//! attempt is sent again whole (`client::confirm`) under a new batch ID (the old one may still
//! be staged until JetStream abandons it) with the same `Nats-Msg-Id`s, until the publish
//! timeout: if an attempt whose answer was lost had been committed, JetStream refuses the
//! resend as holding a stored message ID, which tells us the batch is stored.
#![forbid(unsafe_code)]

use async_nats::jetstream;

use crate::msg::{AckFuture, Msg};

/// The most messages JetStream takes in one atomic batch (a limit of the server).
pub const BATCH_MESSAGES_MAX: usize = 1000;

/// One request's messages, in order, and the batch ID its attempts derive theirs from.
pub(crate) struct Batch {
    pub(crate) msgs: Vec<Msg>,
    pub(crate) id: String,
}

impl Batch {
    pub(crate) fn keyed(&self) -> bool {
        self.msgs.iter().any(|m| m.keyed.is_some())
    }
}

/// Sends attempt `attempt` of `b`; returns the future of its commit's answer.
pub(crate) async fn send(
    js: &jetstream::Context,
    b: &Batch,
    attempt: u32,
) -> Result<AckFuture, String> {
    assert!(
        (2..=BATCH_MESSAGES_MAX).contains(&b.msgs.len()),
        "a batch of 2 to 1000"
    );
    let id = format!("{}.{attempt}", b.id);
    let client = js.client();
    let (last, staged) = b.msgs.split_last().expect("not empty");
    for (i, m) in staged.iter().enumerate() {
        let mut h = m.headers();
        h.insert(async_nats::header::NATS_BATCH_ID, id.as_str());
        h.insert(
            async_nats::header::NATS_BATCH_SEQUENCE,
            (i + 1).to_string().as_str(),
        );
        client
            .publish_with_headers(m.subject.clone(), h, m.data.clone())
            .await
            .map_err(|e| e.to_string())?;
    }
    let mut h = last.headers();
    h.insert(async_nats::header::NATS_BATCH_ID, id.as_str());
    let n = b.msgs.len().to_string();
    h.insert(async_nats::header::NATS_BATCH_SEQUENCE, n.as_str());
    h.insert(
        async_nats::header::NATS_BATCH_COMMIT,
        async_nats::header::NATS_BATCH_COMMIT_FINAL,
    );
    let p = jetstream::message::PublishMessage::build()
        .headers(h)
        .payload(last.data.clone());
    js.send_publish(last.subject.clone(), p)
        .await
        .map_err(|e| e.to_string())
}
