//! Cluster mode's quarantine end to end: junk of every kind the gateway can be sent, published
//! straight to NATS on the shards' subjects (what a misconfigured client, a test script or an
//! old gateway version could send) while a 3-node cluster runs. No node stops; every node
//! decides alike, so every stream is byte for byte the same on every node and every resume
//! stays exact; a restarted node and a node rebuilt from JetStream agree too.
//! The harness (and what it needs installed) is `cluster_harness/`.

mod cluster_harness;
mod common;

use std::time::{Duration, Instant};

use cluster_harness::{
    events_on, nats_and_gateways, nats_publish_raw, shard_of, start_gateway, try_events,
};
use common::Gateway;

/// A name of shard `shard` (of 4) with `prefix`.
fn name_in_shard(prefix: &str, shard: u64) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|n| shard_of(n, 4) == shard)
        .unwrap()
}

/// A raw message: headers, payload, and whether it goes to another shard's subject than
/// its stream's.
type Junk<'a> = (Vec<(&'a str, &'a str)>, Vec<u8>, bool);

/// Every kind of junk (every quarantine reason; `a` and `fresh` are API streams of shard 1,
/// `mcp` an MCP stream), 5 of them in `a`'s place.
fn junk<'a>(a: &'a str, fresh: &'a str, mcp: &'a str) -> Vec<Junk<'a>> {
    let huge = vec![b'\n'; 150_000];
    vec![
        (vec![], b"junk".to_vec(), false),
        (vec![("Gw-Stream", "not a name!")], b"x".to_vec(), false),
        (vec![("Gw-Stream", "gw/quarantined")], b"x".to_vec(), false),
        (vec![("Gw-Stream", a)], b"elsewhere".to_vec(), true),
        (
            vec![("Gw-Stream", a), ("Gw-Seq", "zz")],
            b"x".to_vec(),
            false,
        ),
        (
            vec![("Gw-Stream", a), ("Gw-Seq", "999")],
            b"x".to_vec(),
            false,
        ),
        (vec![("Gw-Stream", a)], b"\xff\xfe".to_vec(), false),
        (
            vec![("Gw-Stream", a), ("Gw-Event", "truncated")],
            b"x".to_vec(),
            false,
        ),
        (vec![("Gw-Stream", a)], huge, false),
        (vec![("Gw-Stream", fresh)], b"\xc3".to_vec(), false),
        (vec![("Gw-Stream", mcp)], b"{}".to_vec(), false),
    ]
}

fn quarantined(g: &Gateway) -> u64 {
    g.metric("gateway_cluster_quarantined_total", "")
}

/// Waits (bounded) until `g` counted `n` quarantined messages.
fn wait_quarantined(g: &Gateway, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while quarantined(g) < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} quarantined",
            quarantined(g)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn alive(g: &mut Gateway) {
    assert!(
        g.child.try_wait().unwrap().is_none(),
        "a gateway stopped: {:?}",
        g.child.try_wait()
    );
}

/// Every node serves `stream`'s first `n` events byte for byte alike; resumes after each
/// of the first events give the exact suffix on every node. Returns the IDs.
fn agree(nodes: &[&Gateway], stream: &str, n: usize) -> Vec<String> {
    let (bytes, ids) = events_on(nodes[0].addr, stream, n);
    for g in &nodes[1..] {
        let (b, i) = events_on(g.addr, stream, n);
        assert_eq!(i, ids, "IDs of {stream} on {}", g.addr);
        assert_eq!(b, bytes, "bytes of {stream} on {}", g.addr);
    }
    for g in nodes.iter().filter(|_| n >= 3) {
        for k in [0, n / 2, n - 2] {
            let (_, i) = try_events(g.addr, stream, n - k - 1, Some(&ids[k])).expect("a resume");
            assert_eq!(i, ids[k + 1..], "resume after {} on {}", k + 1, g.addr);
        }
    }
    ids
}

#[test]
fn junk_on_the_shards_stops_no_node_and_every_node_agrees() {
    let Some((dir, nats, mut gs)) = nats_and_gateways(3) else {
        return;
    };
    let urls = nats.urls();
    let a = name_in_shard("quar-a", 1);
    let fresh = name_in_shard("quar-new", 1);
    let mcp_shard = shard_of("mcp/", 4);
    let mcp = "mcp/junk/1";
    for i in 1..=3 {
        common::publish(gs[i - 1].addr, &a, &format!("before-{i}"));
    }
    let port = nats.client_ports[0];
    let kinds = junk(&a, &fresh, mcp);
    let n = kinds.len() as u64;
    for (headers, payload, elsewhere) in &kinds {
        let stream = headers.iter().find(|(k, _)| *k == "Gw-Stream").map(|h| h.1);
        let shard = match stream {
            Some(s) if s.starts_with("mcp/") => mcp_shard,
            _ if *elsewhere => 2,
            _ => 1,
        };
        nats_publish_raw(port, &format!("gw.{shard}"), headers, payload);
    }
    // Applied, not quarantined: valid events whose `Gw-Idempotency` header is malformed (the
    // header is ignored; an event count of 2^64 - 1 once sized a buffer and aborted the node).
    for h in ["s/1/0/18446744073709551615/k", "b/1/5/2/k"] {
        let headers = [("Gw-Stream", a.as_str()), ("Gw-Idempotency", h)];
        nats_publish_raw(port, "gw.1", &headers, b"odd-key");
    }
    for i in 1..=3 {
        common::publish(gs[i - 1].addr, &a, &format!("after-{i}"));
    }
    for g in &mut gs {
        wait_quarantined(g, n);
        alive(g);
        assert_eq!(quarantined(g), n);
        for reason in [
            "no_stream_header",
            "invalid_stream_name",
            "wrong_shard",
            "bad_seq_header",
            "mcp_without_seq",
            "seq_mismatch",
            "data_not_utf8",
            "bad_event_type",
            "oversized",
        ] {
            let label = format!("reason=\"{reason}\"");
            assert!(
                g.metric("gateway_cluster_quarantined_total", &label) >= 1,
                "{reason}"
            );
        }
    }
    // a: 3 events, 5 error records in the junk's places, the 2 odd-key events, 3 events.
    let refs: Vec<&Gateway> = gs.iter().collect();
    let ids = agree(&refs, &a, 13);
    let (bytes, _) = events_on(gs[0].addr, &a, 13);
    let text = String::from_utf8(bytes).unwrap();
    assert_eq!(text.matches("event: error\n").count(), 5, "{text}");
    assert_eq!(text.matches("data: odd-key\n").count(), 2, "{text}");
    assert!(text.contains("data: before-3\n") && text.contains("data: after-1\n"));
    agree(&refs, &fresh, 1);
    // A restart reapplies nothing it stored; a node rebuilt from JetStream decides alike.
    assert!(gs[1].stop(), "a clean stop");
    gs[1] = start_gateway(&dir.path().join("g1"), &urls, &[]);
    let rebuilt = start_gateway(&dir.path().join("rebuilt"), &urls, &[]);
    wait_quarantined(&rebuilt, n);
    let next = common::publish(gs[1].addr, &a, "after-restart");
    assert_eq!(common::seq_of(&next), 14, "{next}");
    let mut refs: Vec<&Gateway> = gs.iter().collect();
    refs.push(&rebuilt);
    assert_eq!(agree(&refs, &a, 14)[..13], ids[..]);
    agree(&refs, &fresh, 1);
    for g in &mut gs {
        alive(g);
    }
}
