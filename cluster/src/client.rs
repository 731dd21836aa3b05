//! The `nats` thread: one async-nats connection on a single-threaded tokio runtime. It creates
//! or checks the shards' JetStream streams at start, publishes (each event one message with
//! its `Nats-Msg-Id`, retried with the same ID until the publish timeout, so JetStream
//! de-duplicates a retry of a stored message), and runs one ordered consumer per followed
//! shard, handing each message to the shard's core in order.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt as _;
use tokio::sync::mpsc;

use crate::batch::{self, Batch};
use crate::msg::{AckFuture, Msg, send};
use crate::names::{
    self, HDR_EVENT, HDR_IDEMPOTENCY, HDR_ORIGIN, HDR_SEQ, HDR_STREAM, META_SHARDS,
};
use crate::snapshot::{Manifest, Stored};
use crate::{Applied, Config, Inbound, Publish, ShardStream, Wake};

/// What the cores ask of the thread.
#[derive(Debug)]
pub(crate) enum Command {
    Publish(Publish),
    /// One request's events (2 to [`crate::BATCH_MESSAGES_MAX`], one shard): one atomic batch.
    PublishBatch(Vec<Publish>),
    Follow {
        shard: u32,
        from: u64,
    },
    Snapshot {
        shard: u32,
        snap: crate::Snapshot,
    },
    LastSeq {
        shard: u32,
        token: u64,
    },
}

/// The thread's side of one core's inbox.
pub(crate) struct Out {
    pub(crate) tx: mpsc::Sender<Inbound>,
    pub(crate) armed: Arc<AtomicBool>,
    pub(crate) wake: Wake,
}

impl Out {
    async fn send(&self, m: Inbound) {
        // The core only goes away at process exit.
        let _ = self.tx.send(m).await;
        if !self.armed.swap(true, Ordering::SeqCst) {
            (self.wake)();
        }
    }
}

struct Thread {
    cfg: Config,
    js: jetstream::Context,
    route: Vec<usize>,
    outs: Arc<Vec<Out>>,
    nonce: Arc<str>,
    streams: HashMap<u32, stream::Stream>,
    snapshots: jetstream::kv::Store,
    /// Snapshot chunk size: `Config::snapshot_chunk_bytes`, within the server's `max_payload`.
    chunk_bytes: usize,
}

/// Starts the thread; returns once every shard's stream exists (or the start failed).
pub(crate) fn spawn(
    cfg: Config,
    route: Vec<usize>,
    outs: Vec<Out>,
    cmd_rx: mpsc::UnboundedReceiver<Command>,
    nonce: Arc<str>,
) -> Result<Vec<ShardStream>, String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("nats".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return drop(ready_tx.send(Err(format!("tokio runtime: {e}")))),
            };
            rt.block_on(async move {
                let t = match Thread::start(cfg, route, outs, nonce).await {
                    Ok((t, shards)) => {
                        let _ = ready_tx.send(Ok(shards));
                        t
                    }
                    Err(e) => return drop(ready_tx.send(Err(e))),
                };
                t.serve(cmd_rx).await;
            });
        })
        .map_err(|e| format!("spawning the nats thread: {e}"))?;
    ready_rx
        .recv()
        .map_err(|_| "the nats thread ended during start".to_string())?
}

/// The client's connection events, as log lines with the server they concern (its name and
/// the address it announces in `INFO`, never the URL it was reached by, which may carry
/// credentials). async-nats's own lines are filtered to warnings by default:
/// `GATEWAY_LOG=async_nats=debug` shows them.
#[derive(Default)]
struct Events {
    /// The client, once `connect_with_options` returned it (events before: no server named).
    client: std::sync::OnceLock<async_nats::Client>,
    /// A connection was made before: the next `Connected` is a reconnection.
    connected_once: AtomicBool,
}

impl Events {
    /// The server of the current (or, after a disconnection, the last) connection.
    fn server(&self) -> String {
        match self.client.get().and_then(|c| c.try_server_info()) {
            Some(i) if !i.server_name.is_empty() => {
                format!("{} at {}:{}", i.server_name, i.host, i.port)
            }
            Some(i) => format!("{}:{}", i.host, i.port),
            None => "(not known yet)".into(),
        }
    }

    async fn log(&self, e: async_nats::Event) {
        use async_nats::Event;
        match e {
            Event::Connected => {
                // async-nats announces the connection before it publishes the server's INFO.
                tokio::task::yield_now().await;
                let server = self.server();
                if self.connected_once.swap(true, Ordering::Relaxed) {
                    tracing::info!(server, "NATS reconnected");
                } else {
                    tracing::info!(server, "NATS connected");
                }
            }
            Event::Disconnected => {
                tracing::warn!(server = self.server(), "NATS disconnected; reconnecting")
            }
            Event::LameDuckMode => tracing::warn!(
                server = self.server(),
                "NATS server entered lame duck mode: it will close this connection soon"
            ),
            Event::SlowConsumer(sid) => tracing::warn!(
                server = self.server(),
                sid,
                "NATS slow consumer: the server dropped messages of this subscription"
            ),
            Event::Draining => tracing::info!(server = self.server(), "NATS connection draining"),
            Event::Closed => tracing::warn!(server = self.server(), "NATS connection closed"),
            Event::ServerError(err) => {
                tracing::warn!(server = self.server(), "NATS server error: {err}")
            }
            Event::ClientError(err) => {
                // Repeats at every reconnect attempt while a server is down: once a minute.
                static LAST: std::sync::Mutex<Option<std::time::Instant>> =
                    std::sync::Mutex::new(None);
                let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
                if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    *last = Some(std::time::Instant::now());
                    tracing::warn!(
                        "NATS client error: {err} (repeats are not logged for a minute)"
                    );
                }
            }
        }
    }
}

impl Thread {
    async fn start(
        cfg: Config,
        route: Vec<usize>,
        outs: Vec<Out>,
        nonce: Arc<str>,
    ) -> Result<(Thread, Vec<ShardStream>), String> {
        let events = Arc::new(Events::default());
        let on_event = events.clone();
        let opts = async_nats::ConnectOptions::new()
            .name("gateway")
            .retry_on_initial_connect()
            .event_callback(move |e| {
                let events = on_event.clone();
                async move { events.log(e).await }
            });
        // With `retry_on_initial_connect` the client comes back before any connection: the
        // flush is what waits for the first one (its server's INFO gives `max_payload` below).
        let connect = async {
            let client = async_nats::connect_with_options(cfg.urls.clone(), opts)
                .await
                .map_err(|e| e.to_string())?;
            let _ = events.client.set(client.clone());
            client.flush().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(client)
        };
        // URLs may carry credentials (user:password@): only their redacted form is printed.
        let shown: Vec<String> = cfg.urls.iter().map(|u| names::redact_url(u)).collect();
        let deadline = tokio::time::Instant::now() + cfg.connect_timeout;
        let client = tokio::time::timeout_at(deadline, connect)
            .await
            .map_err(|_| {
                format!(
                    "no NATS server of {shown:?} answered within {:?}",
                    cfg.connect_timeout
                )
            })?
            .map_err(|e| format!("connecting to NATS {shown:?}: {e}"))?;
        let info = client.server_info();
        if !names::atomic_batches(&info.version) {
            return Err(format!(
                "NATS server {} is version {}: cluster mode needs 2.12 or later (JetStream \
                 atomic batches keep a batch's events together and in order)",
                info.server_name, info.version
            ));
        }
        // A value must fit one message: room for the KV headers below `max_payload`.
        let payload_max = info.max_payload;
        let chunk_bytes = cfg
            .snapshot_chunk_bytes
            .min(payload_max.saturating_sub(4096))
            .max(256);
        let js = jetstream::new(client);
        let snapshots = snapshot_bucket(&js, cfg.replicas, deadline).await?;
        let mut t = Thread {
            cfg,
            js,
            route,
            outs: Arc::new(outs),
            nonce,
            streams: HashMap::new(),
            snapshots,
            chunk_bytes,
        };
        let mut shards = Vec::new();
        for shard in 0..t.cfg.shards {
            shards.push(t.open_shard(shard, deadline).await?);
        }
        Ok((t, shards))
    }

    /// Creates shard `shard`'s stream, or checks the existing one was made for this shard
    /// count; retried until `deadline` (a JetStream cluster elects its meta leader first).
    async fn open_shard(
        &mut self,
        shard: u32,
        deadline: tokio::time::Instant,
    ) -> Result<ShardStream, String> {
        let config = self.shard_stream_config(shard);
        let mut s = loop {
            match self.js.get_or_create_stream(config.clone()).await {
                Ok(s) => break s,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(format!("JetStream stream {}: {e}", config.name)),
            }
        };
        // Until `deadline` as well: right after the stream exists (or the cluster formed), its
        // leader or the snapshot bucket's may not answer yet ("no responders").
        let info = loop {
            match s.info().await {
                Ok(i) => break i.clone(),
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(format!("JetStream stream {}: {e}", config.name)),
            }
        };
        if !info.config.allow_atomic_publish {
            // Made by an older gateway: batches need atomic publishes (batch.rs).
            let mut c = info.config.clone();
            c.allow_atomic_publish = true;
            self.js.update_stream(c).await.map_err(|e| {
                format!(
                    "JetStream stream {}: allowing atomic batches: {e}",
                    config.name
                )
            })?;
        }
        let theirs = info.config.metadata.get(META_SHARDS).cloned();
        if theirs.as_deref() != Some(self.cfg.shards.to_string().as_str()) {
            return Err(format!(
                "JetStream stream {} was made for {} shards, this node has {} (shards.json): \
                 every node of a cluster must use the same shard count",
                config.name,
                theirs.as_deref().unwrap_or("an unknown number of"),
                self.cfg.shards
            ));
        }
        let snapshots = loop {
            match self.stored_snapshots(shard).await {
                Ok(v) => break v,
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let out = ShardStream {
            shard,
            epoch: names::epoch(info.created.unix_timestamp_nanos(), shard),
            first_seq: info.state.first_sequence,
            last_seq: info.state.last_sequence,
            snapshots,
        };
        self.streams.insert(shard, s);
        Ok(out)
    }

    /// Shard `shard`'s JetStream stream: replicated file storage, deduplicated by message ID,
    /// no deletes or purges, the limits of the configuration, the shard count in its metadata.
    fn shard_stream_config(&self, shard: u32) -> stream::Config {
        stream::Config {
            name: names::stream_name(shard),
            subjects: vec![names::subject(shard)],
            storage: stream::StorageType::File,
            num_replicas: self.cfg.replicas,
            duplicate_window: Duration::from_secs(120),
            deny_delete: true,
            deny_purge: true,
            // A batch request is one atomic batch (batch.rs).
            allow_atomic_publish: true,
            max_messages: if self.cfg.stream_messages_max > 0 {
                self.cfg.stream_messages_max
            } else {
                -1
            },
            max_bytes: if self.cfg.stream_bytes_max > 0 {
                self.cfg.stream_bytes_max
            } else {
                -1
            },
            metadata: HashMap::from([(META_SHARDS.to_string(), self.cfg.shards.to_string())]),
            ..Default::default()
        }
    }

    /// The snapshots the bucket keeps for `shard` (its history), decoded: every whole one, and
    /// of the chunked ones the newest of each epoch whose chunks can still be read (a node
    /// starts from the newest it can continue from; reading every chunked one would read up
    /// to 64 large snapshots).
    async fn stored_snapshots(&self, shard: u32) -> Result<Vec<crate::Snapshot>, String> {
        let err = |e: String| format!("reading shard {shard}'s snapshots: {e}");
        let key = names::snapshot_key(shard);
        // A history of a key with no value never ends (its consumer waits for one): look first.
        let latest = self
            .snapshots
            .get(&key)
            .await
            .map_err(|e| err(e.to_string()))?;
        let Some(latest) = latest else {
            return Ok(Vec::new());
        };
        let mut stored = Vec::new();
        let read = async {
            let mut h = self
                .snapshots
                .history(&key)
                .await
                .map_err(|e| err(e.to_string()))?;
            while let Some(entry) = h.next().await {
                let entry = entry.map_err(|e| err(e.to_string()))?;
                stored.extend(Stored::decode(&entry.value));
            }
            Ok::<(), String>(())
        };
        // Bounded: on a timeout the latest value alone still serves.
        match tokio::time::timeout(Duration::from_secs(10), read).await {
            Ok(r) => r?,
            Err(_) => stored.clear(),
        }
        stored.extend(Stored::decode(&latest));
        let mut out = Vec::new();
        let mut manifests = Vec::new();
        for st in stored {
            match st {
                Stored::Whole(s) => out.push(s),
                Stored::Chunked(m) => manifests.push(m),
            }
        }
        manifests.sort_by_key(|m| std::cmp::Reverse((m.epoch, m.seq)));
        let mut done_epochs = Vec::new();
        for m in manifests {
            if done_epochs.contains(&m.epoch) {
                continue;
            }
            match read_chunks(&self.snapshots, shard, &m).await {
                Some(snap) => {
                    done_epochs.push(m.epoch);
                    out.push(snap);
                }
                None => tracing::warn!(
                    "shard {shard}: the chunks of the snapshot at message {} are gone \
                     or damaged; trying an older one",
                    m.seq
                ),
            }
        }
        Ok(out)
    }

    async fn serve(self, mut cmd_rx: mpsc::UnboundedReceiver<Command>) {
        while let Some(cmd) = cmd_rx.recv().await {
            match cmd {
                Command::Publish(p) => self.publish(p).await,
                Command::PublishBatch(ps) => self.publish_batch(ps).await,
                Command::Follow { shard, from } => self.follow(shard, from),
                Command::LastSeq { shard, token } => self.last_seq(shard, token),
                Command::Snapshot { shard, snap } => {
                    let (kv, chunk_bytes) = (self.snapshots.clone(), self.chunk_bytes);
                    let (outs, out) = (self.outs.clone(), self.route[shard as usize]);
                    tokio::spawn(async move {
                        match store_snapshot(&kv, shard, &snap, chunk_bytes).await {
                            Ok(chunks) => {
                                let m = Inbound::SnapshotStored {
                                    shard,
                                    seq: snap.seq,
                                    chunks,
                                };
                                outs[out].send(m).await;
                            }
                            Err(e) => tracing::warn!("storing shard {shard}'s snapshot: {e}"),
                        }
                    });
                }
            }
        }
    }

    /// Publish `p` as a JetStream message: its `Nats-Msg-Id` is its ticket's, or its key's
    /// (the ticket then in `Gw-Origin`).
    fn msg(&self, p: Publish) -> Msg {
        let origin = names::msg_id(&self.nonce, p.ticket);
        let (id, keyed) = match p.keyed {
            Some(k) => (k.msg_id, Some((k.header, origin))),
            None => (origin, None),
        };
        Msg {
            subject: names::subject(p.shard),
            id,
            stream: p.stream,
            event: p.event,
            expect_seq: p.expect_seq,
            keyed,
            data: p.data.into(),
        }
    }

    /// Sends the message now (so messages leave in the order the cores asked), then awaits
    /// its acknowledgement in a task.
    async fn publish(&self, p: Publish) {
        let out = self.route[p.shard as usize];
        let (shard, ticket) = (p.shard, p.ticket);
        let msg = self.msg(p);
        let first = send(&self.js, &msg).await;
        let (js, outs, timeout) = (self.js.clone(), self.outs.clone(), self.cfg.publish_timeout);
        tokio::spawn(async move {
            let keyed = msg.keyed.is_some();
            let resend = |_| send(&js, &msg);
            if let Err(reason) = confirm(first, timeout, keyed, resend).await {
                let m = Inbound::Unconfirmed {
                    shard,
                    ticket,
                    reason,
                };
                outs[out].send(m).await;
            }
        });
    }

    /// Sends one request's events now as one atomic batch (`batch.rs`), then awaits its
    /// commit in a task; if it is not confirmed, every ticket of it is reported unconfirmed.
    async fn publish_batch(&self, ps: Vec<Publish>) {
        let shard = ps[0].shard;
        assert!(
            ps.iter().all(|p| p.shard == shard),
            "a batch is of one shard"
        );
        let out = self.route[shard as usize];
        let tickets: Vec<u64> = ps.iter().map(|p| p.ticket).collect();
        let b = Batch {
            id: names::msg_id(&self.nonce, tickets[0]),
            msgs: ps.into_iter().map(|p| self.msg(p)).collect(),
        };
        let first = batch::send(&self.js, &b, 0).await;
        let (js, outs, timeout) = (self.js.clone(), self.outs.clone(), self.cfg.publish_timeout);
        tokio::spawn(async move {
            let keyed = b.keyed();
            let resend = |attempt| batch::send(&js, &b, attempt);
            if let Err(reason) = confirm(first, timeout, keyed, resend).await {
                for ticket in tickets {
                    let reason = reason.clone();
                    let m = Inbound::Unconfirmed {
                        shard,
                        ticket,
                        reason,
                    };
                    outs[out].send(m).await;
                }
            }
        });
    }

    /// Reads `shard`'s stream info from JetStream in a task (publishes keep going) and
    /// answers its core with the stream's last sequence, or an error after the publish timeout.
    fn last_seq(&self, shard: u32, token: u64) {
        let s = self.streams.get(&shard).cloned();
        let (outs, out) = (self.outs.clone(), self.route[shard as usize]);
        let timeout = self.cfg.publish_timeout;
        tokio::spawn(async move {
            let last = match s {
                None => Err(format!("shard {shard} has no stream here")),
                Some(s) => match tokio::time::timeout(timeout, s.get_info()).await {
                    Ok(Ok(info)) => Ok(info.state.last_sequence),
                    Ok(Err(e)) => Err(format!("JetStream stream info: {e}")),
                    Err(_) => Err(format!("no stream info within {timeout:?}")),
                },
            };
            outs[out]
                .send(Inbound::LastSeq { shard, token, last })
                .await;
        });
    }

    /// One ordered consumer from `from`; re-created from the next sequence if it ends.
    fn follow(&self, shard: u32, from: u64) {
        let Some(s) = self.streams.get(&shard).cloned() else {
            return;
        };
        let (outs, out, nonce) = (
            self.outs.clone(),
            self.route[shard as usize],
            self.nonce.clone(),
        );
        tokio::spawn(async move {
            let mut next = from;
            loop {
                match follow_from(&s, shard, next, &outs[out], &nonce).await {
                    Ok(n) => next = n,
                    Err((n, e)) => {
                        next = n;
                        tracing::warn!("following shard {shard} from {next}: {e}; retrying");
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }
}

/// The snapshot bucket, created if missing (each key keeps its last 64 values, so a rebuilding
/// node can pick the oldest one JetStream can still continue; replicated like the shards).
async fn snapshot_bucket(
    js: &jetstream::Context,
    replicas: usize,
    deadline: tokio::time::Instant,
) -> Result<jetstream::kv::Store, String> {
    loop {
        let r = match js.get_key_value(names::SNAPSHOT_BUCKET).await {
            Ok(kv) => Ok(kv),
            Err(_) => js
                .create_key_value(jetstream::kv::Config {
                    bucket: names::SNAPSHOT_BUCKET.into(),
                    history: 64,
                    storage: stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string()),
        };
        match r {
            Ok(kv) => return Ok(kv),
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(format!("KV bucket {}: {e}", names::SNAPSHOT_BUCKET)),
        }
    }
}

/// The chunks of a chunked snapshot, read at the manifest's revisions, joined and checked.
async fn read_chunks(
    kv: &jetstream::kv::Store,
    shard: u32,
    m: &Manifest,
) -> Option<crate::Snapshot> {
    let mut chunks = Vec::with_capacity(m.chunks.len());
    for (i, &rev) in m.chunks.iter().enumerate() {
        let key = names::snapshot_chunk_key(shard, i);
        let entry = kv.entry_for_revision(key.clone(), rev).await.ok()??;
        if entry.key != key {
            return None;
        }
        chunks.push(entry.value.to_vec());
    }
    m.join(&chunks)
}

/// Stores `snap` unless the bucket holds a snapshot as new of the same epoch: compare-and-set
/// on the key's revision, so a node that lags never replaces a newer snapshot with its older
/// one (a fresh node could then not start). A snapshot over `chunk_bytes` is stored in
/// chunks first, then its manifest. Returns the chunks written (0: stored whole, or a newer
/// one was there).
async fn store_snapshot(
    kv: &jetstream::kv::Store,
    shard: u32,
    snap: &crate::Snapshot,
    chunk_bytes: usize,
) -> Result<u64, String> {
    let key = names::snapshot_key(shard);
    let newer = |e: &Option<jetstream::kv::Entry>| {
        e.as_ref()
            .filter(|e| !e.value.is_empty())
            .and_then(|e| Stored::decode(&e.value))
            .is_some_and(|t| {
                let (epoch, seq) = t.head();
                epoch == snap.epoch && seq >= snap.seq
            })
    };
    let mut entry = kv.entry(key.clone()).await.map_err(|e| e.to_string())?;
    if newer(&entry) {
        return Ok(0);
    }
    let whole = snap.encode();
    let mut chunks = 0;
    let value: bytes::Bytes = if whole.len() <= chunk_bytes {
        whole.into()
    } else {
        let mut revs = Vec::new();
        for (i, c) in whole.chunks(chunk_bytes).enumerate() {
            let k = names::snapshot_chunk_key(shard, i);
            let rev = kv
                .put(&k, bytes::Bytes::copy_from_slice(c))
                .await
                .map_err(|e| format!("chunk {i}: {e}"))?;
            revs.push(rev);
        }
        chunks = revs.len() as u64;
        let m = Manifest {
            epoch: snap.epoch,
            seq: snap.seq,
            bytes: whole.len() as u64,
            chunks: revs,
        };
        m.encode().into()
    };
    for _ in 0..5 {
        if newer(&entry) {
            return Ok(0);
        }
        let stored = match &entry {
            Some(e) => kv.update(&key, value.clone(), e.revision).await.is_ok(),
            None => kv.create(&key, value.clone()).await.is_ok(),
        };
        if stored {
            return Ok(chunks);
        }
        // Another node wrote in between: look again.
        entry = kv.entry(key.clone()).await.map_err(|e| e.to_string())?;
    }
    Err("five concurrent writers in a row".into())
}

/// JetStream's error code for an atomic batch holding a message ID it stored already.
const BATCH_DUPLICATE_MSG_ID: u64 = 10201;

/// Awaits the acknowledgement; on a failure sends again with `resend(attempt)` (the same
/// `Nats-Msg-Id`s) until `timeout`. `Ok`: stored, to be applied under its tickets. A message
/// ID JetStream held already (a duplicate acknowledgement; for an atomic batch, its refusal
/// 10201) is ours when not `keyed` (our IDs are unique to this process's tickets: only an
/// earlier attempt stored it, and an atomic batch is stored whole); a keyed one's may be an
/// earlier request's, whose tickets are not ours: not applied under this one's.
pub(crate) async fn confirm<F: Future<Output = Result<AckFuture, String>>>(
    first: Result<AckFuture, String>,
    timeout: Duration,
    keyed: bool,
    mut resend: impl FnMut(u32) -> F,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let (mut attempt, mut sent) = (0, first);
    loop {
        let err = match sent {
            Ok(ack) => match tokio::time::timeout_at(deadline, ack).await {
                Ok(r) => match stored(r) {
                    Ok(true) if keyed => {
                        return Err(
                            "JetStream already holds a publish with this Idempotency-Key: retry \
                             it to get its IDs"
                                .into(),
                        );
                    }
                    Ok(_) => return Ok(()),
                    Err(e) => e,
                },
                Err(_) => return Err(format!("no acknowledgement within {timeout:?}")),
            },
            Err(e) => e,
        };
        if tokio::time::Instant::now() + Duration::from_millis(100) >= deadline {
            return Err(err);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        attempt += 1;
        sent = resend(attempt).await;
    }
}

/// An acknowledgement as stored (`true`: its message ID was stored already) or why not.
fn stored(
    r: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
) -> Result<bool, String> {
    match r {
        Ok(a) => Ok(a.duplicate),
        Err(e) => match error_code(&e) {
            Some(BATCH_DUPLICATE_MSG_ID) => Ok(true),
            _ => Err(e.to_string()),
        },
    }
}

/// JetStream's error code of a refused publish (`None`: not an answer of JetStream's, such as
/// a timeout or a closed connection).
fn error_code(e: &jetstream::context::PublishError) -> Option<u64> {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .map(|e| e.error_code().0)
}

/// The longest a follower's pull waits (its idle heartbeats come at half of it).
const FOLLOW_PULL_EXPIRES: Duration = Duration::from_secs(4);

/// How long a follower waits for a message before it asks JetStream whether the shard holds
/// one it has not delivered (then its consumer is stuck, and it recreates it).
const FOLLOW_STALL_CHECK: Duration = Duration::from_secs(8);

/// Delivers `shard`'s messages from `from` to its core until the consumer ends or is stuck;
/// returns the next sequence to ask for.
///
/// async-nats recreates an ordered consumer after two missed idle heartbeats, but not in
/// every case: a node whose server was killed with the stream's leader (the consumer on it)
/// was seen to deliver nothing for over a minute after reconnecting elsewhere, with no error.
/// So a follower that got nothing for [`FOLLOW_STALL_CHECK`] reads the stream's last
/// sequence, and when it is at or past the next one to apply, drops its consumer and creates
/// one from there. And async-nats recreates an ordered consumer that has delivered nothing
/// yet from the stream's first message: a follower handed one below its next drops it too.
async fn follow_from(
    s: &stream::Stream,
    shard: u32,
    from: u64,
    out: &Out,
    nonce: &str,
) -> Result<u64, (u64, String)> {
    let cfg = consumer::pull::OrderedConfig {
        deliver_policy: consumer::DeliverPolicy::ByStartSequence {
            start_sequence: from,
        },
        filter_subject: names::subject(shard),
        // Each pull waits at most this long, with idle heartbeats at half of it; two missed
        // heartbeats make async-nats recreate the consumer. Its default (30 s, heartbeats of
        // 15 s) left a node applying nothing, and its publishes unanswered, for 30 to 40 s
        // after a kill of the server holding the consumer (the stream's leader).
        max_expires: FOLLOW_PULL_EXPIRES,
        ..Default::default()
    };
    let c = s
        .create_consumer(cfg)
        .await
        .map_err(|e| (from, e.to_string()))?;
    let mut msgs = c.messages().await.map_err(|e| (from, e.to_string()))?;
    let mut next = from;
    let last_seq = || async move { s.get_info().await.ok().map(|i| i.state.last_sequence) };
    loop {
        let m = match next_or_stuck(&mut msgs, next, last_seq).await {
            Wait::Message(m) => m.map_err(|e| (next, e.to_string()))?,
            Wait::Ended => return Ok(next),
            Wait::Stuck(last) => {
                return Err((
                    next,
                    format!("consumer stuck: JetStream holds up to {last}"),
                ));
            }
        };
        let seq = m.info().map_err(|e| (next, e.to_string()))?.stream_sequence;
        if seq < next {
            // async-nats recreated the consumer before it delivered anything (after missed
            // heartbeats or a deletion), and then from the stream's first message: the whole
            // shard would come again. Recreated here from the next one instead.
            return Err((next, format!("consumer restarted at {seq}, below {next}")));
        }
        out.send(Inbound::Message(applied(&m, shard, seq, nonce)))
            .await;
        next = seq + 1;
    }
}

/// What a follower's wait for its next message came to.
#[derive(Debug, PartialEq)]
enum Wait<T> {
    Message(T),
    /// The consumer ended.
    Ended,
    /// Nothing came for [`FOLLOW_STALL_CHECK`] though JetStream holds up to this sequence, at
    /// or past the next one to apply.
    Stuck(u64),
}

/// The next of `msgs`; each time none came for [`FOLLOW_STALL_CHECK`], asks `last_seq` for
/// the stream's last sequence (`None`: JetStream cannot say now) and reports the consumer
/// stuck when that is at or past `next`. An idle shard waits on.
async fn next_or_stuck<S, F>(msgs: &mut S, next: u64, last_seq: impl Fn() -> F) -> Wait<S::Item>
where
    S: futures::Stream + Unpin,
    F: Future<Output = Option<u64>>,
{
    loop {
        match tokio::time::timeout(FOLLOW_STALL_CHECK, msgs.next()).await {
            Ok(Some(m)) => return Wait::Message(m),
            Ok(None) => return Wait::Ended,
            Err(_) => {
                if let Some(last) = last_seq().await.filter(|&last| last >= next) {
                    return Wait::Stuck(last);
                }
            }
        }
    }
}

/// A delivered message as its core applies it.
fn applied(m: &jetstream::Message, shard: u32, seq: u64, nonce: &str) -> Applied {
    let header = |k: &str| {
        m.headers
            .as_ref()
            .and_then(|h| h.get(k))
            .map(|v| v.as_str().to_owned())
    };
    Applied {
        shard,
        seq,
        stream: header(HDR_STREAM),
        event: header(HDR_EVENT),
        seq_header: header(HDR_SEQ),
        idempotency: header(HDR_IDEMPOTENCY),
        data: m.payload.to_vec(),
        ticket: names::own_ticket(
            nonce,
            m.headers
                .as_ref()
                .and_then(|h| {
                    h.get(HDR_ORIGIN)
                        .or(h.get(async_nats::header::NATS_MESSAGE_ID))
                })
                .map(|v| v.as_str()),
        ),
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
