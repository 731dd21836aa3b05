//! Cluster mode: gateways over NATS JetStream. Each shard is one JetStream stream (`GW_<k>`,
//! subject `gw.<k>`, file storage, replicated); a publish is one JetStream message per event,
//! and a batch's messages are one JetStream atomic batch (stored whole and in order, or not at
//! all: `batch.rs`); every node follows every shard with an ordered consumer and applies each message, in
//! JetStream order, to its local log. A stream's sequence numbers are a pure function of that
//! order (the n-th message naming a stream is its event n), so every node numbers every event
//! alike without any coordination of its own (see ARCHITECTURE.md, "Cluster mode").
//!
//! The client (`async-nats`, on tokio) runs on its own thread, `nats`; the cores talk to it
//! through [`Cluster`] (publishes, follows) and their [`Inbox`] (applied messages, failed
//! publishes), woken through a callback (the gateway writes the core's eventfd). This crate
//! knows nothing of the log, HTTP or io_uring.
#![forbid(unsafe_code)]

mod batch;
mod client;
mod msg;
pub mod names;
mod snapshot;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

pub use batch::BATCH_MESSAGES_MAX;
pub use names::{ChainBreak, Next};
pub use snapshot::Snapshot;

/// What the cluster needs to know at start.
#[derive(Debug, Clone)]
pub struct Config {
    /// NATS servers (`--nats-url`, repeatable).
    pub urls: Vec<String>,
    /// Replicas of each shard's JetStream stream (`--nats-replicas`).
    pub replicas: usize,
    /// The cluster's shard count (every node must agree; checked against the streams').
    pub shards: u32,
    /// How long to wait for the first connection and the streams (`--nats-connect-timeout-secs`).
    pub connect_timeout: Duration,
    /// How long a publish may take, retries included, before it is answered as unconfirmed
    /// (`--nats-publish-timeout-ms`).
    pub publish_timeout: Duration,
    /// Messages buffered per core between the client and the core (`--nats-inbox-messages-max`);
    /// a core that falls behind slows its shards' followers, nothing is dropped.
    pub inbox_messages_max: usize,
    /// Limits of the shard streams this node creates (0: none): JetStream then drops a shard's
    /// head, and a node rebuilding starts from a snapshot (`--nats-stream-messages-max`,
    /// `--nats-stream-bytes-max`).
    pub stream_messages_max: i64,
    pub stream_bytes_max: i64,
    /// A snapshot larger than this is stored in chunks of this size (at most the NATS
    /// server's `max_payload` less 4 KiB) (`--cluster-snapshot-chunk-bytes`).
    pub snapshot_chunk_bytes: usize,
}

/// One shard's JetStream stream as found at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardStream {
    pub shard: u32,
    /// The epoch every node uses for this shard ([`names::epoch`]).
    pub epoch: u64,
    /// First and last sequence JetStream holds (`first > last` when empty).
    pub first_seq: u64,
    pub last_seq: u64,
    /// The snapshots the bucket keeps for this shard, oldest first (of any epoch: check it).
    pub snapshots: Vec<Snapshot>,
}

/// A message for a core.
#[derive(Debug)]
pub enum Inbound {
    /// The next message of `shard`, in JetStream order.
    Message(Applied),
    /// JetStream did not confirm publish `ticket` within the publish timeout: it may or may
    /// not be stored (if it is, it will still be applied in order like any other).
    Unconfirmed {
        shard: u32,
        ticket: u64,
        reason: String,
    },
    /// A snapshot of `shard` at message `seq` is stored (or a newer one already was), in
    /// `chunks` chunks (0: whole).
    SnapshotStored { shard: u32, seq: u64, chunks: u64 },
    /// The answer to [`Cluster::last_seq`] `token`: the last sequence `shard`'s JetStream
    /// stream held when asked (a read barrier), or why JetStream could not say.
    LastSeq {
        shard: u32,
        token: u64,
        last: Result<u64, String>,
    },
}

/// One message of a shard's JetStream stream.
#[derive(Debug)]
pub struct Applied {
    pub shard: u32,
    /// Its JetStream stream sequence.
    pub seq: u64,
    /// The gateway stream it belongs to (`None`: not a gateway's message).
    pub stream: Option<String>,
    pub event: Option<String>,
    pub data: Vec<u8>,
    /// This process's publish ticket when this process published it.
    pub ticket: Option<u64>,
    /// The per-stream seq its publisher expects it to get (`Gw-Seq`; MCP records), as sent
    /// (any writer of the subject may send anything): every node checks it on apply.
    pub seq_header: Option<String>,
    /// Its `Gw-Idempotency` header (a keyed publish's key, body hash and place; the gateway
    /// reads it).
    pub idempotency: Option<String>,
}

/// One event to publish.
#[derive(Debug)]
pub struct Publish {
    pub shard: u32,
    /// The publishing core's ticket (unique within this process).
    pub ticket: u64,
    pub stream: String,
    pub event: Option<String>,
    pub data: Vec<u8>,
    /// The per-stream seq the publisher expects (sent as `Gw-Seq`), if it predicts one.
    pub expect_seq: Option<u64>,
    /// A keyed publish's (`Idempotency-Key`) message ID, the same for every retry of it, so
    /// JetStream stores it once within its duplicate window, and its `Gw-Idempotency` header.
    /// Then the ticket travels in `Gw-Origin`, and a duplicate acknowledgement (JetStream
    /// held the ID already) is reported as [`Inbound::Unconfirmed`]: a retry finds the IDs.
    pub keyed: Option<Keyed>,
}

/// A keyed publish's message ID and `Gw-Idempotency` header.
#[derive(Debug, Clone)]
pub struct Keyed {
    pub msg_id: String,
    pub header: String,
}

/// A core's side of its channel from the client.
#[derive(Debug)]
pub struct Inbox {
    rx: mpsc::Receiver<Inbound>,
    armed: Arc<AtomicBool>,
}

impl Inbox {
    /// Takes up to `max` waiting messages. A message that arrives after the drain wakes the
    /// core again; when `max` were taken, [`Inbox::more`] says to come back without a wake.
    pub fn drain(&mut self, max: usize, mut f: impl FnMut(Inbound)) -> usize {
        self.armed.store(false, Ordering::SeqCst);
        let mut n = 0;
        while n < max {
            match self.rx.try_recv() {
                Ok(m) => {
                    f(m);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        if n == max {
            // More may wait: make sure the next turn comes.
            self.armed.store(true, Ordering::SeqCst);
        }
        n
    }

    /// Whether messages may be waiting (a drain stopped at its maximum).
    pub fn more(&self) -> bool {
        self.armed.load(Ordering::SeqCst) && !self.rx.is_empty()
    }
}

/// Wakes a core (the gateway writes its eventfd).
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// The handle the cores share: publishes and follows go to the `nats` thread.
#[derive(Clone)]
pub struct Cluster {
    cmd: mpsc::UnboundedSender<client::Command>,
    /// This process's `Nats-Msg-Id` prefix.
    nonce: Arc<str>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").finish_non_exhaustive()
    }
}

impl Cluster {
    /// Connects, creates or checks every shard's JetStream stream, and starts the `nats`
    /// thread. `route[shard]` is the core (index into `wakes`) that applies the shard.
    /// Returns the handle, each core's inbox and every shard's stream.
    pub fn start(
        cfg: Config,
        route: Vec<usize>,
        wakes: Vec<Wake>,
    ) -> Result<(Cluster, Vec<Inbox>, Vec<ShardStream>), String> {
        assert_eq!(route.len(), cfg.shards as usize);
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| format!("random nonce: {e}"))?;
        let nonce: Arc<str> = nonce
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            .into();
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let mut inboxes = Vec::new();
        let mut outs = Vec::new();
        for wake in wakes {
            let (tx, rx) = mpsc::channel(cfg.inbox_messages_max.max(1));
            let armed = Arc::new(AtomicBool::new(false));
            inboxes.push(Inbox {
                rx,
                armed: armed.clone(),
            });
            outs.push(client::Out { tx, armed, wake });
        }
        let streams = client::spawn(cfg, route, outs, cmd_rx, nonce.clone())?;
        let cluster = Cluster { cmd: cmd_tx, nonce };
        Ok((cluster, inboxes, streams))
    }

    /// A handle and one inbox joined to no `nats` thread, for tests of what a core decides in
    /// cluster mode: what is sent to the handle is dropped, and nothing arrives in the inbox.
    pub fn detached() -> (Cluster, Inbox) {
        let (cmd, _) = mpsc::unbounded_channel();
        let (_, rx) = mpsc::channel(1);
        let inbox = Inbox {
            rx,
            armed: Arc::new(AtomicBool::new(false)),
        };
        let nonce: Arc<str> = "detached".into();
        (Cluster { cmd, nonce }, inbox)
    }

    /// Publishes one event; its outcome arrives as its [`Applied`] (with its ticket) or as
    /// [`Inbound::Unconfirmed`].
    pub fn publish(&self, p: Publish) {
        // The thread lives until the process exits: the send cannot fail before.
        let _ = self.cmd.send(client::Command::Publish(p));
    }

    /// Publishes one request's events (2 to [`BATCH_MESSAGES_MAX`], all of one shard) as one
    /// JetStream atomic batch: JetStream stores all of them, contiguous and in this order, or
    /// none (a resend can neither reorder nor split it). Each outcome arrives as for
    /// [`Cluster::publish`]; a batch not confirmed is reported unconfirmed ticket by ticket.
    pub fn publish_batch(&self, ps: Vec<Publish>) {
        let _ = self.cmd.send(client::Command::PublishBatch(ps));
    }

    /// Stores `snap` as shard `shard`'s latest snapshot unless a newer one of the same epoch
    /// is stored (a failure is printed; the next snapshot tries again).
    pub fn snapshot(&self, shard: u32, snap: &Snapshot) {
        let _ = self.cmd.send(client::Command::Snapshot {
            shard,
            snap: snap.clone(),
        });
    }

    /// Asks JetStream for `shard`'s last sequence now; the answer comes back to the shard's
    /// core as [`Inbound::LastSeq`] with `token` (within the publish timeout, else an error).
    /// Once the core has applied up to it, it has applied everything stored before it asked.
    pub fn last_seq(&self, shard: u32, token: u64) {
        let _ = self.cmd.send(client::Command::LastSeq { shard, token });
    }

    /// Starts following `shard` from JetStream sequence `from` (the first not yet applied).
    pub fn follow(&self, shard: u32, from: u64) {
        let _ = self.cmd.send(client::Command::Follow { shard, from });
    }

    /// This process's `Nats-Msg-Id` prefix (random per start).
    pub fn nonce(&self) -> &str {
        &self.nonce
    }
}
