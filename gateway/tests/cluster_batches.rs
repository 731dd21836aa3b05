//! Batches in cluster mode: each batch request is one JetStream atomic batch, so batches that
//! two nodes publish to one stream at the same time never interleave: every answer's IDs are
//! consecutive, and every node holds each batch whole and in its order, the same on every
//! node. A batch over JetStream's limit on an atomic batch is refused explicitly. Across a
//! kill of the shard's JetStream leader, batches (resent whole by the node while a new leader
//! is elected) are stored whole, once and in their order, or answered 503.
//! The harness (and what it needs installed) is `cluster_harness/`.

mod cluster_harness;
mod common;

use cluster_harness::{events_on, nats_and_gateways, shard_of};
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

/// `n` events labelled `{label}-e{i}` as an NDJSON batch body.
fn batch_body(label: &str, n: usize) -> String {
    (0..n)
        .map(|e| format!("{{\"data\":\"{label}-e{e}\"}}\n"))
        .collect()
}

/// A POST whose answer may take long: a publish is answered once this node applied it, and
/// after the kill its follower first recreates its consumer (bounded: 2 missed heartbeats,
/// then async-nats's backoff while JetStream elects a new leader).
fn post_slow(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, serde_json::Value) {
    let mut s = common::connect(addr);
    s.set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    std::io::Write::write_all(&mut s, head.as_bytes()).unwrap();
    std::io::Write::write_all(&mut s, body.as_bytes()).unwrap();
    let (st, _, resp) = common::read_response(&mut std::io::BufReader::new(s));
    (st, common::json(&resp))
}

#[test]
fn batches_across_a_kill_of_the_jetstream_leader_are_whole_once_and_in_order() {
    let Some((_dir, mut nats, gs)) = nats_and_gateways(2) else {
        return;
    };
    let stream = "batches-kill";
    let js_stream = format!("GW_{}", shard_of(stream, 4));
    let path = format!("/v1/streams/{stream}/events:batch");
    let (kill_at, batches) = (10, 40);
    let mut answers = Vec::new();
    for b in 0..batches {
        if b == kill_at {
            let leader = nats.leader_of(&js_stream).expect("a leader");
            nats.nodes[leader] = None; // SIGKILL
        }
        let body = batch_body(&format!("b{b}"), EVENTS);
        let (st, resp) = post_slow(gs[0].addr, &path, &body);
        assert!(st == 201 || st == 503, "{st} {resp}");
        answers.push((st, resp));
    }
    let stored: Vec<usize> = (0..batches).filter(|&b| answers[b].0 == 201).collect();
    eprintln!(
        "{} of {batches} batches answered 201, the others 503",
        stored.len()
    );
    assert!(
        stored.len() > batches / 2,
        "most batches stored: {answers:?}"
    );
    // A marker after the last batch, then everything up to it on each node (the other node's
    // follower may still be recreating its consumer after the kill: events_on waits for it).
    let (st, marker) = post_slow(gs[0].addr, &format!("/v1/streams/{stream}/events"), "after");
    assert_eq!(st, 201, "{marker}");
    let total = seq_of(marker["id"].as_str().unwrap()) as usize;
    let (bytes, ids) = events_on(gs[0].addr, stream, total);
    let t = std::time::Instant::now();
    let (b1, i1) = events_on(gs[1].addr, stream, total);
    eprintln!("the other node served them after {:?}", t.elapsed());
    assert_eq!((&i1, &b1), (&ids, &bytes), "both nodes hold the same");
    let text = String::from_utf8(bytes).unwrap();
    let datas: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(datas.len() % EVENTS, 0, "whole batches only: {datas:?}");
    let mut seen = Vec::new();
    for chunk in datas.chunks(EVENTS) {
        let label = chunk[0].rsplit_once('-').unwrap().0;
        let want: Vec<String> = (0..EVENTS).map(|e| format!("{label}-e{e}")).collect();
        assert_eq!(chunk, want, "a batch split or reordered in the stream");
        seen.push(label[1..].parse::<usize>().unwrap());
    }
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "once each, in order: {seen:?}"
    );
    for b in stored {
        assert!(
            seen.contains(&b),
            "batch {b} answered 201 but not stored: {seen:?}"
        );
    }
}
