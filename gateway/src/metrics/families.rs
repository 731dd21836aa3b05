//! The table of per-core families: name, type, help and the counters of each series.
#![forbid(unsafe_code)]

use std::sync::atomic::AtomicU64;

use super::CoreMetrics;

/// Selects one counter of a core's block.
type Field = fn(&CoreMetrics) -> &AtomicU64;

/// A metric family: name (unit last), Prometheus type, `# HELP` text, and its series: each a
/// label set (`""` or `reason="x"`) and the counter. Every series is exported per core.
pub(super) struct Family {
    pub(super) name: &'static str,
    pub(super) kind: &'static str,
    pub(super) help: &'static str,
    pub(super) series: &'static [(&'static str, Field)],
}

const fn one(
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    f: &'static [(&'static str, Field)],
) -> Family {
    Family {
        name,
        kind,
        help,
        series: f,
    }
}

/// Every per-core family, in export order. Related outcomes are one family with a label
/// (`reason`, `direction`), not sibling metrics.
pub(super) const FAMILIES: &[Family] = &[
    one(
        "gateway_connections",
        "gauge",
        "Open client connections.",
        &[("", |m| &m.connections)],
    ),
    one(
        "gateway_subscribers",
        "gauge",
        "Open SSE subscriptions.",
        &[("", |m| &m.subscribers)],
    ),
    one(
        "gateway_accepted_total",
        "counter",
        "Connections accepted.",
        &[("", |m| &m.accepted_total)],
    ),
    one(
        "gateway_handoffs_total",
        "counter",
        "Connections moved between cores to the core that owns their stream.",
        &[
            ("direction=\"out\"", |m| &m.handoffs_out_total),
            ("direction=\"in\"", |m| &m.handoffs_in_total),
        ],
    ),
    one(
        "gateway_access_log_dropped_total",
        "counter",
        "Access-log lines dropped because the writer thread's queue (--access-log-queue-lines-max) was full.",
        &[("", |m| &m.access_log_dropped_total)],
    ),
    one(
        "gateway_events_appended_total",
        "counter",
        "Events appended to this node's logs.",
        &[("", |m| &m.events_appended_total)],
    ),
    one(
        "gateway_events_sent_total",
        "counter",
        "Events handed to the kernel for subscribers.",
        &[("", |m| &m.events_sent_total)],
    ),
    one(
        "gateway_events_confirmed_total",
        "counter",
        "Events whose bytes the subscriber's TCP stack acknowledged (TX ACK or SIOCOUTQ).",
        &[("", |m| &m.events_confirmed_total)],
    ),
    one(
        "gateway_sent_bytes_total",
        "counter",
        "Subscription bytes handed to the kernel.",
        &[("", |m| &m.bytes_sent_total)],
    ),
    one(
        "gateway_confirmed_bytes_total",
        "counter",
        "Subscription bytes the peer acknowledged.",
        &[("", |m| &m.bytes_confirmed_total)],
    ),
    one(
        "gateway_subscriber_closes_total",
        "counter",
        "Subscriptions ended by the gateway, by reason (truncated: the client's position left the retained log; lagging: over --lag-events-max; token_expired; tls_key_exhausted: a key sealed its record limit).",
        &[
            ("reason=\"truncated\"", |m| &m.truncated_closes_total),
            ("reason=\"lagging\"", |m| &m.lagging_closes_total),
            ("reason=\"token_expired\"", |m| {
                &m.token_expired_closes_total
            }),
            ("reason=\"tls_key_exhausted\"", |m| {
                &m.tls_key_exhausted_closes_total
            }),
        ],
    ),
    one(
        "gateway_refusals_total",
        "counter",
        "Requests and connections refused at the edge, by reason (auth: 401/403; origin: CORS 403; per_ip: --connections-per-ip-max; streams_exhausted: --streams-max; subject_quota: --streams-per-subject-max).",
        &[
            ("reason=\"auth\"", |m| &m.auth_refusals_total),
            ("reason=\"origin\"", |m| &m.origin_refusals_total),
            ("reason=\"per_ip\"", |m| &m.per_ip_refusals_total),
            ("reason=\"streams_exhausted\"", |m| {
                &m.streams_exhausted_total
            }),
            ("reason=\"subject_quota\"", |m| &m.subject_quota_total),
        ],
    ),
    one(
        "gateway_inflight_bytes",
        "gauge",
        "Subscription bytes sent and not yet acknowledged.",
        &[("", |m| &m.inflight_bytes)],
    ),
    one(
        "gateway_lag_events_max",
        "gauge",
        "The largest lag of a subscriber behind its stream's tail, in events.",
        &[("", |m| &m.lag_events_max)],
    ),
    one(
        "gateway_parked_windows",
        "gauge",
        "Disconnected subscribers' send windows kept for an aligned resume.",
        &[("", |m| &m.parked_windows)],
    ),
    one(
        "gateway_queued_answer_bytes",
        "gauge",
        "Answers queued on keep-alive connections, not yet taken by the kernel (sampled at the tick).",
        &[("", |m| &m.answer_bytes_queued)],
    ),
    one(
        "gateway_unmatched_completions_total",
        "counter",
        "io_uring completions that matched no operation in flight on their connection (ignored).",
        &[("", |m| &m.unmatched_completions_total)],
    ),
    one(
        "gateway_cq_stale_slots_total",
        "counter",
        "Stale last-slot completions dropped (kernel CQE32 skip).",
        &[("", |m| &m.cq_stale_slots_total)],
    ),
    one(
        "gateway_log_fsyncs_total",
        "counter",
        "fdatasync calls of group commits.",
        &[("", |m| &m.log_fsyncs_total)],
    ),
    one(
        "gateway_log_syncfs_total",
        "counter",
        "syncfs calls of group commits (--fsync-scope filesystem: one per round of several files).",
        &[("", |m| &m.log_syncfs_total)],
    ),
    one(
        "gateway_log_sync_failures_total",
        "counter",
        "Group commits that failed (the shard's log refuses appends until restart).",
        &[("", |m| &m.log_sync_failures_total)],
    ),
    one(
        "gateway_log_segment_rolls_total",
        "counter",
        "Log segment rolls by how the next segment came: prepared in the background (no system call), inline (created or waited for on the reactor: a stall), flushed (a synchronous flush first).",
        &[
            ("how=\"prepared\"", |m| &m.log_rolls_prepared_total),
            ("how=\"inline\"", |m| &m.log_rolls_inline_total),
            ("how=\"flushed\"", |m| &m.log_rolls_flushed_total),
        ],
    ),
    one(
        "gateway_streams",
        "gauge",
        "Streams in this core's logs.",
        &[("", |m| &m.streams)],
    ),
    one(
        "gateway_streams_removed_total",
        "counter",
        "Streams removed, by reason (deleted: DELETE; expired: --stream-idle-expire-secs).",
        &[
            ("reason=\"deleted\"", |m| &m.streams_deleted_total),
            ("reason=\"expired\"", |m| &m.streams_expired_total),
        ],
    ),
    one(
        "gateway_prefetches_total",
        "counter",
        "Read-aheads of cold log pages before a replay's send.",
        &[("", |m| &m.prefetches_total)],
    ),
    one(
        "gateway_tx_ack_timestamps_total",
        "counter",
        "Confirmations received as SO_TIMESTAMPING TX_ACK completions.",
        &[("", |m| &m.tx_ack_timestamps_total)],
    ),
    one(
        "gateway_outq_fallbacks_total",
        "counter",
        "Subscribers that fell back to SIOCOUTQ accounting.",
        &[("", |m| &m.outq_fallbacks_total)],
    ),
    one(
        "gateway_request_buffer_waits_total",
        "counter",
        "Receives deferred at --request-buffer-bytes-max.",
        &[("", |m| &m.request_buffer_waits_total)],
    ),
    one(
        "gateway_request_timeouts_total",
        "counter",
        "Requests answered 408 and closed, by the phase that was too slow (head: --header-timeout-secs; body: --body-timeout-secs, the whole body of an API request).",
        &[
            ("phase=\"head\"", |m| &m.head_timeouts_total),
            ("phase=\"body\"", |m| &m.body_timeouts_total),
        ],
    ),
    one(
        "gateway_tls_userspace",
        "gauge",
        "1 when the listener serves TLS (handshakes and answers in rustls).",
        &[("", |m| &m.tls_userspace)],
    ),
    one(
        "gateway_tls_kernel",
        "gauge",
        "1 while TLS subscribers' transmit keys go to the kernel (kernel TLS).",
        &[("", |m| &m.tls_kernel)],
    ),
    one(
        "gateway_tls_handshakes_total",
        "counter",
        "TLS handshakes completed.",
        &[("", |m| &m.tls_handshakes_total)],
    ),
    one(
        "gateway_tls_handshake_failures_total",
        "counter",
        "TLS sessions that failed (bad handshakes, plaintext on the TLS port, handshake timeouts).",
        &[("", |m| &m.tls_handshake_failures_total)],
    ),
    one(
        "gateway_tls_subscribers_total",
        "counter",
        "TLS subscribers by who seals their records (kernel TLS or the gateway's record layer).",
        &[
            ("sealer=\"kernel\"", |m| &m.tls_kernel_subscribers_total),
            ("sealer=\"record_layer\"", |m| {
                &m.tls_record_layer_subscribers_total
            }),
        ],
    ),
    one(
        "gateway_tls_kernel_refusals_total",
        "counter",
        "Hand-overs of keys the kernel refused.",
        &[("", |m| &m.tls_kernel_refusals_total)],
    ),
    one(
        "gateway_idempotent_replays_total",
        "counter",
        "Publishes with an Idempotency-Key seen before that stored nothing and were answered \
         with the original IDs (Idempotent-Replay: true).",
        &[("", |m| &m.idempotent_replays_total)],
    ),
    one(
        "gateway_cluster_publishes_total",
        "counter",
        "Cluster mode: events sent to JetStream.",
        &[("", |m| &m.cluster_publishes_total)],
    ),
    one(
        "gateway_cluster_applied_total",
        "counter",
        "Cluster mode: JetStream messages applied to the local logs.",
        &[("", |m| &m.cluster_applied_total)],
    ),
    one(
        "gateway_cluster_unconfirmed_total",
        "counter",
        "Cluster mode: publishes answered 503 publish_unconfirmed.",
        &[("", |m| &m.cluster_unconfirmed_total)],
    ),
    one(
        "gateway_cluster_apply_stalls_total",
        "counter",
        "Cluster mode: applies paused by a full disk.",
        &[("", |m| &m.cluster_apply_stalls_total)],
    ),
    one(
        "gateway_cluster_catchups_total",
        "counter",
        "Cluster mode: subscribes that waited for this node to catch up, by outcome.",
        &[
            ("outcome=\"waited\"", |m| &m.cluster_catchup_waits_total),
            ("outcome=\"timed_out\"", |m| {
                &m.cluster_catchup_timeouts_total
            }),
        ],
    ),
    one(
        "gateway_cluster_snapshot_messages",
        "gauge",
        "Cluster mode: messages covered by the latest stored snapshot of this core's shards.",
        &[("", |m| &m.cluster_snapshot_messages)],
    ),
    one(
        "gateway_cluster_snapshot_chunks_total",
        "counter",
        "Cluster mode: chunks written for snapshots over one KV value.",
        &[("", |m| &m.cluster_snapshot_chunks_total)],
    ),
    one(
        "gateway_cluster_seq_mismatches_total",
        "counter",
        "Cluster mode: applied MCP records whose publisher predicted another seq (stored as error records).",
        &[("", |m| &m.cluster_seq_mismatches_total)],
    ),
    one(
        "gateway_cluster_redeliveries_total",
        "counter",
        "Cluster mode: JetStream messages delivered again after this node applied them (ignored).",
        &[("", |m| &m.cluster_redeliveries_total)],
    ),
    one(
        "gateway_cluster_quarantined_total",
        "counter",
        "Cluster mode: JetStream messages that could not be applied as they were, by reason (skipped, or stored as an error record in their stream's place).",
        &[
            ("reason=\"no_stream_header\"", |m| {
                &m.cluster_quarantined_total[0]
            }),
            ("reason=\"invalid_stream_name\"", |m| {
                &m.cluster_quarantined_total[1]
            }),
            ("reason=\"wrong_shard\"", |m| {
                &m.cluster_quarantined_total[2]
            }),
            ("reason=\"bad_seq_header\"", |m| {
                &m.cluster_quarantined_total[3]
            }),
            ("reason=\"mcp_without_seq\"", |m| {
                &m.cluster_quarantined_total[4]
            }),
            ("reason=\"seq_mismatch\"", |m| {
                &m.cluster_quarantined_total[5]
            }),
            ("reason=\"data_not_utf8\"", |m| {
                &m.cluster_quarantined_total[6]
            }),
            ("reason=\"bad_event_type\"", |m| {
                &m.cluster_quarantined_total[7]
            }),
            ("reason=\"oversized\"", |m| &m.cluster_quarantined_total[8]),
        ],
    ),
];
