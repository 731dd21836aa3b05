//! Batches in cluster mode: each batch request is one JetStream atomic batch, so batches that
//! two nodes publish to one stream at the same time never interleave: every answer's IDs are
//! consecutive, and every node holds each batch whole and in its order, the same on every
//! node. A batch over JetStream's limit on an atomic batch is refused explicitly.
//! The harness (and what it needs installed) is `cluster_harness/`.

mod cluster_harness;
mod common;

use cluster_harness::{events_on, nats_and_gateways};
use common::seq_of;

/// Publishers per node, batches per publisher, events per batch.
const PUBLISHERS: usize = 4;
const BATCHES: usize = 10;
const EVENTS: usize = 50;

#[test]
fn concurrent_batches_on_two_nodes_stay_whole_and_in_order_on_every_node() {
    let Some((_dir, _nats, gs)) = nats_and_gateways(2) else {
        return;
    };
    let stream = "batches";
    let answers: Vec<(String, Vec<String>)> = std::thread::scope(|s| {
        let publishers: Vec<_> = (0..gs.len() * PUBLISHERS)
            .map(|p| {
                let addr = gs[p % gs.len()].addr;
                s.spawn(move || {
                    (0..BATCHES)
                        .map(|b| {
                            let label = format!("p{p}-b{b}");
                            let datas: Vec<String> =
                                (0..EVENTS).map(|e| format!("{label}-e{e}")).collect();
                            (label, common::publish_batch(addr, stream, &datas))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        publishers
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    for (label, ids) in &answers {
        let seqs: Vec<u64> = ids.iter().map(|id| seq_of(id)).collect();
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "batch {label} was not stored contiguously and in order: {seqs:?}"
        );
    }
    let total = answers.len() * EVENTS;
    // Over JetStream's limit on one atomic batch: refused before anything is sent.
    let body: String = (0..=cluster::BATCH_MESSAGES_MAX)
        .map(|i| format!("{{\"data\":\"{i}\"}}\n"))
        .collect();
    let path = format!("/v1/streams/{stream}/events:batch");
    let (st, _, resp) = common::request(gs[1].addr, "POST", &path, &[], body.as_bytes());
    let resp = common::json(&resp);
    assert_eq!(
        (st, resp["error"].as_str()),
        (413, Some("batch_too_many_events")),
        "{resp}"
    );
    let next = common::publish(gs[0].addr, stream, "after");
    assert_eq!(
        seq_of(&next),
        total as u64 + 1,
        "the refused batch stored nothing"
    );
    // Every node holds the same events; each batch is whole and in order among them (the
    // reader stops at the last `id:`, so "after"'s data line is not among the bytes).
    let (bytes, ids) = events_on(gs[0].addr, stream, total + 1);
    for g in &gs[1..] {
        let (b, i) = events_on(g.addr, stream, total + 1);
        assert_eq!(i, ids, "IDs on {}", g.addr);
        assert_eq!(b, bytes, "bytes on {}", g.addr);
    }
    let text = String::from_utf8(bytes).unwrap();
    let datas: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(datas.len(), total);
    for chunk in datas.chunks(EVENTS) {
        let label = chunk[0].rsplit_once('-').unwrap().0;
        let want: Vec<String> = (0..EVENTS).map(|e| format!("{label}-e{e}")).collect();
        assert_eq!(chunk, want, "a batch split or reordered in the stream");
    }
}
