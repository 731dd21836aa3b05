//! Cluster mode's flags and start-up (`--nats-url`): connect and find every shard's JetStream
//! stream (through the `cluster` crate's `nats` thread), open each shard's local log under the
//! shard's cluster epoch (a local log of another incarnation is rebuilt from JetStream), and
//! say where each shard's follower starts. The per-core side is `core/cluster.rs`.
#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use cluster::{Cluster, Inbox, ShardStream};

use crate::{shards, sys};

/// Cluster mode's flags (`Debug` prints the NATS URLs without their credentials).
#[derive(clap::Args, Clone)]
pub struct ClusterArgs {
    /// A NATS server of the JetStream cluster (repeatable; any one will do to connect). Turns
    /// cluster mode on: every publish goes through JetStream, every node follows every shard.
    #[arg(long = "nats-url", value_name = "URL")]
    pub nats_urls: Vec<String>,

    /// Replicas of each shard's JetStream stream when this node creates it.
    #[arg(long, default_value_t = 3)]
    pub nats_replicas: usize,

    /// Seconds to wait at start for NATS and every shard's stream.
    #[arg(long, default_value_t = 30)]
    pub nats_connect_timeout_secs: u64,

    /// Milliseconds a publish may take, retries included, before its answer is 503
    /// `publish_unconfirmed`.
    #[arg(long, default_value_t = 10_000)]
    pub nats_publish_timeout_ms: u64,

    /// Messages buffered per core between the NATS client and the core (followers pause
    /// beyond it; nothing is dropped).
    #[arg(long, default_value_t = 65_536)]
    pub nats_inbox_messages_max: usize,

    /// A resume at an ID this node has not applied yet (another node published it) waits this
    /// long for the node to catch up, then gets 503 with `Retry-After`.
    #[arg(long, default_value_t = 2_000)]
    pub cluster_catchup_wait_ms: u64,

    /// Messages a shard's JetStream stream keeps when this node creates it (0: no limit).
    /// JetStream then drops the shard's head; a node rebuilding starts from a snapshot.
    #[arg(long, default_value_t = 0)]
    pub nats_stream_messages_max: u64,

    /// Bytes a shard's JetStream stream keeps when this node creates it (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub nats_stream_bytes_max: u64,

    /// Seconds between snapshots of each shard this node applies (stored in JetStream KV
    /// `GW_SNAPSHOTS`, what a node on an empty data directory starts from when JetStream no
    /// longer holds a shard's head). 0: none from this node.
    #[arg(long, default_value_t = 10)]
    pub cluster_snapshot_interval_secs: u64,

    /// A shard snapshot larger than this is stored in chunks of this size (capped at the NATS
    /// server's `max_payload` less 4 KiB; at least 256): one KV value each, a manifest naming them.
    #[arg(long, default_value_t = 512 << 10)]
    pub cluster_snapshot_chunk_bytes: usize,

    /// MCP records of one MCP stream in flight to JetStream at once (the rest queue behind):
    /// an MCP stream's throughput is about this many records per JetStream round trip. A
    /// record re-sent after a failure (a leader fail-over) may then be overtaken by a later
    /// one, which breaks its stream explicitly; with 1, records wait for each other and
    /// survive fail-overs, at one round trip per record.
    #[arg(long, default_value_t = 64)]
    pub cluster_mcp_inflight_max: usize,

    /// Bytes of MCP messages (summed over the MCP streams) queued on the MCP core behind
    /// their streams' `--cluster-mcp-inflight-max` records in flight.
    /// Past this bound the stream whose message does not fit is broken explicitly (its
    /// connections close, a resume gets 503), never silently shortened.
    #[arg(long, default_value_t = 16 << 20)]
    pub cluster_mcp_queue_bytes_max: usize,
}

impl std::fmt::Debug for ClusterArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self
            .nats_urls
            .iter()
            .map(|u| cluster::names::redact_url(u))
            .collect();
        f.debug_struct("ClusterArgs")
            .field("nats_urls", &urls)
            .field("nats_replicas", &self.nats_replicas)
            .finish_non_exhaustive()
    }
}

impl ClusterArgs {
    pub fn enabled(&self) -> bool {
        !self.nats_urls.is_empty()
    }

    /// Zero and out-of-range limits.
    pub fn validate(&self) -> Result<(), String> {
        if !self.enabled() {
            return Ok(());
        }
        if self.nats_replicas == 0 || self.nats_replicas > 5 {
            return Err("--nats-replicas must be 1 to 5".into());
        }
        if self.cluster_snapshot_chunk_bytes < 256 {
            return Err("--cluster-snapshot-chunk-bytes must be at least 256".into());
        }
        if self.nats_inbox_messages_max == 0
            || self.nats_publish_timeout_ms == 0
            || self.cluster_mcp_queue_bytes_max == 0
            || self.cluster_mcp_inflight_max == 0
        {
            return Err("--nats-inbox-messages-max, --nats-publish-timeout-ms, \
                 --cluster-mcp-queue-bytes-max and --cluster-mcp-inflight-max must be > 0"
                .into());
        }
        Ok(())
    }
}

/// Cluster mode as the cores see it.
#[derive(Debug)]
pub struct Clustered {
    pub cluster: Cluster,
    pub inboxes: Vec<Inbox>,
    pub streams: Vec<ShardStream>,
}

/// Connects and finds (or creates) every shard's JetStream stream; each core's inbox wakes it
/// through a duplicate of its eventfd.
pub fn start(
    args: &ClusterArgs,
    shard_count: u32,
    cores: usize,
    eventfds: &[OwnedFd],
) -> Result<Clustered, String> {
    let route = (0..shard_count)
        .map(|s| shards::core_of_shard(s, cores))
        .collect();
    let mut wakes: Vec<cluster::Wake> = Vec::with_capacity(cores);
    for fd in eventfds {
        let fd = fd.try_clone().map_err(|e| format!("eventfd: {e}"))?;
        wakes.push(Arc::new(move || {
            sys::eventfd_wake(std::os::fd::AsFd::as_fd(&fd))
        }));
    }
    let cfg = cluster::Config {
        urls: args.nats_urls.clone(),
        replicas: args.nats_replicas,
        shards: shard_count,
        connect_timeout: Duration::from_secs(args.nats_connect_timeout_secs),
        publish_timeout: Duration::from_millis(args.nats_publish_timeout_ms),
        inbox_messages_max: args.nats_inbox_messages_max,
        stream_messages_max: i64::try_from(args.nats_stream_messages_max).unwrap_or(i64::MAX),
        stream_bytes_max: i64::try_from(args.nats_stream_bytes_max).unwrap_or(i64::MAX),
        snapshot_chunk_bytes: args.cluster_snapshot_chunk_bytes,
    };
    let (cluster, inboxes, streams) = cluster::Cluster::start(cfg, route, wakes)?;
    Ok(Clustered {
        cluster,
        inboxes,
        streams,
    })
}

/// Messages of a shard already in its local log: every JetStream message is one event, so
/// the count is the sum of the streams' tails (no stream is ever removed in cluster mode).
pub fn applied(log: &log_store::Log) -> u64 {
    log.streams().map(|(_, _, b)| b.tail).sum()
}

/// The newest snapshot of the shard's epoch that reaches JetStream's first message from a log
/// ending at message `have`. Not the oldest usable one, though it would hold more history:
/// JetStream keeps dropping its head while the follower starts, and a snapshot right at the
/// head would lose that race (the first message delivered would not be the next: the node
/// stops).
fn newest_snapshot(js: &ShardStream, have: u64) -> Result<&cluster::Snapshot, String> {
    let snap = js
        .snapshots
        .iter()
        .filter(|s| s.epoch == js.epoch && s.seq + 1 >= js.first_seq && s.seq >= have)
        .max_by_key(|s| s.seq);
    snap.ok_or_else(|| {
        format!(
            "shard {}: the local log ends at message {have} but JetStream's stream {} now \
             starts at {} and no snapshot reaches it: this node cannot number what follows \
             (keep the nodes' --cluster-snapshot-interval-secs well below the time \
             JetStream's limits take to drop a shard's head)",
            js.shard,
            cluster::names::stream_name(js.shard),
            js.first_seq
        )
    })
}

/// Opens shard `shard`'s local log under the cluster's epoch: a log of another incarnation of
/// the JetStream stream (it was deleted and recreated) is removed and rebuilt. Refuses a log
/// that holds more than JetStream (acknowledged messages lost there) or that JetStream can no
/// longer continue (the messages after it are gone).
pub fn open_log(
    dir: &std::path::Path,
    mut opts: log_store::LogOptions,
    js: &ShardStream,
) -> Result<log_store::Log, String> {
    let epoch = log_store::Epoch(js.epoch);
    opts.epoch_on_create = Some(epoch);
    let open = |o: log_store::LogOptions| {
        log_store::Log::open(dir, o).map_err(|e| format!("opening {}: {e}", dir.display()))
    };
    let mut log = open(opts.clone())?;
    if log.epoch() != epoch {
        tracing::warn!(
            "shard {}: the local log belongs to an earlier JetStream stream {}; \
             rebuilding it from JetStream",
            js.shard,
            cluster::names::stream_name(js.shard)
        );
        drop(log);
        std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
        log = open(opts.clone())?;
    }
    let mut have = applied(&log);
    if js.last_seq > have && js.first_seq > have + 1 {
        // JetStream dropped what follows this log: start over from the newest snapshot.
        let snap = newest_snapshot(js, have)?;
        if have > 0 || log.stream_count() > 0 {
            drop(log);
            std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
            log = open(opts.clone())?;
        }
        tracing::info!(
            "shard {}: starting from the snapshot at message {} ({} streams)",
            js.shard,
            snap.seq,
            snap.streams.len()
        );
        for (name, tail) in &snap.streams {
            log.create_stream_after(name, *tail)
                .map_err(|e| format!("shard {}: snapshot stream: {e}", js.shard))?;
        }
        have = applied(&log);
        assert_eq!(have, snap.seq, "a decoded snapshot's tails sum to its seq");
    }
    if have > js.last_seq {
        return Err(format!(
            "shard {}: the local log holds {have} messages but JetStream's stream {} ends at \
             {}: JetStream lost acknowledged messages; refusing to serve a different history",
            js.shard,
            cluster::names::stream_name(js.shard),
            js.last_seq
        ));
    }
    Ok(log)
}
