//! The MCP front in cluster mode, end to end: 3 NATS JetStream nodes, 3 gateways with the
//! stdio fixture upstream (`tests/mcp_upstream.awk`), and HAProxy with the documented
//! session affinity of deploy/haproxy-mcp-cluster.cfg. Every MCP record goes through JetStream,
//! so:
//! - a progress stream cut several times and resumed through the balancer arrives exactly
//!   once, in order;
//! - every node replays the same stream from the same IDs (`GET` + `Last-Event-ID` sent to
//!   each gateway directly), and answers a 2026-07-28 (sessionless) request;
//! - `kill -9` of the node holding the session: a resume through the balancer lands on
//!   another node and gets the logged records after its ID with no gap and no duplicate, then
//!   an explicit end (410 once nothing follows); the session's new requests get 404, and the
//!   client re-initializes on a live node.
//!
//! The harness (and what it needs installed) is `cluster_harness/`.

mod cluster_harness;
mod common;
mod mcp_client;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cluster_harness::{Balancer, Nats, nats_publish_raw, shard_of, start_gateway, tools};
use common::Gateway;
use mcp_client::{ACCEPT, Exchange, initialize, progress_of, upstream_cmd};

/// The backend rules of deploy/haproxy-mcp-cluster.cfg (what the docs tell users to run):
/// a session's requests go to the node that minted its ID.
fn mcp_affinity_rules() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/haproxy-mcp-cluster.cfg"
    );
    let text = std::fs::read_to_string(path).expect("deploy/haproxy-mcp-cluster.cfg");
    let rules: String = text
        .lines()
        .skip_while(|l| !l.starts_with("backend "))
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with("server "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(rules.contains("stick store-response"), "{rules}");
    rules
}

fn call(addr: SocketAddr, sid: &str, id: u64, count: u64, interval_ms: u64) -> Exchange {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"p","arguments":{{"count":{count},"interval_ms":{interval_ms}}},"_meta":{{"progressToken":{id}}}}}}}"#
    );
    let x = Exchange::send(addr, "POST", &[ACCEPT, ("Mcp-Session-Id", sid)], &body);
    assert_eq!(x.status, 200, "tools/call");
    x
}

fn resume(addr: SocketAddr, sid: &str, last: &str) -> Exchange {
    Exchange::send(
        addr,
        "GET",
        &[
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", sid),
            ("Last-Event-ID", last),
        ],
        "",
    )
}

/// What a stream delivered: (id, progress or None for the result).
#[derive(Default)]
struct Seen {
    ids: Vec<String>,
    progress: Vec<u64>,
    result: bool,
}

impl Seen {
    /// Reads up to `take` events (None: to the end); the reprime event of a resume restates
    /// `last` and is not a record.
    fn read(&mut self, x: &mut Exchange, take: Option<usize>) {
        let mut n = 0;
        while take.is_none_or(|t| n < t) {
            let Some(ev) = x.next_event() else { return };
            if ev.data.is_empty() {
                // The priming event of a new stream, or the reprime of a resume.
                if let (Some(id), Some(last)) = (&ev.id, self.ids.last()) {
                    assert_eq!(id, last, "a resume restates its Last-Event-ID");
                    continue;
                }
            }
            n += 1;
            self.ids
                .push(ev.id.clone().expect("every MCP record has an id"));
            if let Some(p) = progress_of(&ev) {
                self.progress.push(p);
            } else if ev.data.contains(r#""result""#) {
                assert!(!self.result, "one result");
                self.result = true;
            }
        }
    }
}

/// An unlabelled metric's value.
fn plain_metric(g: &Gateway, name: &str) -> u64 {
    let (_, _, body) = common::request(g.admin_addr, "GET", "/metrics", &[], b"");
    let text = String::from_utf8(body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// The gateway whose MCP core holds an upstream (the session's node).
fn owner(gateways: &[Option<Gateway>]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for (i, g) in gateways.iter().enumerate() {
            if let Some(g) = g
                && plain_metric(g, "gateway_mcp_upstreams") > 0
            {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no gateway holds the upstream");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn mcp_sessions_replay_on_any_node_and_outlive_their_node() {
    let Some((nats_bin, haproxy_bin)) = tools() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(&nats_bin, dir.path());
    let urls = nats.urls();
    let up = upstream_cmd();
    let extra = ["--upstream-cmd", up.as_str(), "--mcp-retry-ms", "50"];
    let mut gateways: Vec<Option<Gateway>> = (0..3)
        .map(|i| {
            Some(start_gateway(
                &dir.path().join(format!("g{i}")),
                &urls,
                &extra,
            ))
        })
        .collect();
    let backends: Vec<SocketAddr> = gateways.iter().flatten().map(|g| g.addr).collect();
    let lb = Balancer::start_with(&haproxy_bin, dir.path(), &backends, &mcp_affinity_rules());
    let lb = lb.addr;

    // Cuts through the balancer (the session's requests all reach its node).
    let sid = initialize(lb);
    let count = 40u64;
    let mut x = call(lb, &sid, 7, count, 15);
    let mut seen = Seen::default();
    for take in [2usize, 7, 9] {
        seen.read(&mut x, Some(take));
        drop(x);
        x = resume(lb, &sid, seen.ids.last().unwrap());
        assert_eq!(x.status, 200, "resume through the balancer");
    }
    seen.read(&mut x, None);
    assert!(seen.result, "the result arrived");
    assert_eq!(
        seen.progress,
        (1..=count).collect::<Vec<_>>(),
        "exactly once"
    );

    // Every node replays the same records under the same IDs.
    for g in gateways.iter().flatten() {
        for from in [0usize, 17] {
            let mut r = resume(g.addr, &sid, &seen.ids[from]);
            assert_eq!(r.status, 200, "resume on {}", g.addr);
            let mut again = Seen {
                ids: seen.ids[..=from].to_vec(),
                ..Seen::default()
            };
            again.read(&mut r, None);
            assert_eq!(again.ids, seen.ids, "node {} replays the same IDs", g.addr);
            assert!(again.result);
        }
    }

    // Another writer of the session's stream (a message whose predicted seq is not the one
    // JetStream's order gives it): every node stores an explicit error record in its place.
    let mcp_shard = shard_of("mcp/", 4);
    let rogue = br#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#;
    let stream = format!("mcp/{sid}/2");
    let headers = [("Gw-Stream", stream.as_str()), ("Gw-Seq", "999")];
    nats_publish_raw(
        nats.client_ports[0],
        &format!("gw.{mcp_shard}"),
        &headers,
        rogue,
    );
    for g in gateways.iter().flatten() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while g.metric("gateway_cluster_seq_mismatches_total", "") == 0 {
            assert!(
                Instant::now() < deadline,
                "{} did not apply the rogue record",
                g.addr
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut r = resume(g.addr, &sid, seen.ids.last().unwrap());
        assert_eq!(r.status, 200);
        let _reprime = r.next_event().unwrap();
        let ev = r.next_event().expect("the error record");
        assert_eq!(ev.event.as_deref(), Some("error"), "{ev:?}");
        assert!(ev.data.contains("expected seq 999"), "{ev:?}");
    }

    // The 2026-07-28 era (no session) on every node: its records go through JetStream too.
    for g in gateways.iter().flatten() {
        let body = r#"{"jsonrpc":"2.0","id":"c-1","method":"tools/call","params":{"name":"p","arguments":{"count":3},"_meta":{"progressToken":"t","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        let headers = [
            ACCEPT,
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "p"),
        ];
        let mut x = Exchange::send(g.addr, "POST", &headers, body);
        assert_eq!(x.status, 200);
        let mut msgs = Vec::new();
        while let Some(ev) = x.next_event() {
            msgs.push(serde_json::from_str::<serde_json::Value>(&ev.data).unwrap());
        }
        assert_eq!(msgs.len(), 4, "{msgs:?}");
        assert_eq!(msgs[2]["params"]["progress"], 3);
        assert_eq!(msgs[3]["result"]["structuredContent"]["sent"], 3);
    }

    // The session's node dies mid-call: the stream replays elsewhere, then ends explicitly.
    let mut x = call(lb, &sid, 8, 400, 20);
    let mut seen = Seen::default();
    seen.read(&mut x, Some(10));
    // The node goes on logging records this client does not read before it dies.
    std::thread::sleep(Duration::from_millis(500));
    let dead = owner(&gateways);
    let _ = gateways[dead].as_mut().unwrap().child.kill(); // SIGKILL
    drop(x);
    // HAProxy notices the dead server (health checks every 200 ms) and rehashes its keys.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ended = false;
    while !ended {
        assert!(
            Instant::now() < deadline,
            "no explicit end after the node died"
        );
        let last = seen.ids.last().unwrap().clone();
        let mut r = resume(lb, &sid, &last);
        match r.status {
            200 => seen.read(&mut r, None),
            410 => ended = true,
            // 502: the balancer has not seen the node die yet; 503: catching up.
            502 | 503 => std::thread::sleep(Duration::from_millis(200)),
            s => panic!("resume at {last} after the node died: {s}"),
        }
    }
    let n = seen.progress.len() as u64;
    eprintln!("after the kill: {n} progress records in order, then 410");
    // 10 events were read before the kill (the first was the priming event); the node logged
    // more in the 500 ms before it died: they replay elsewhere.
    assert!(
        n > 9,
        "records the client never read from the dead node replay elsewhere"
    );
    assert_eq!(
        seen.progress,
        (1..=n).collect::<Vec<_>>(),
        "no gap, no duplicate"
    );
    assert!(!seen.result, "the dead node's call never finished");
    // New requests of the dead node's session: 404, as the spec says; re-initialize.
    let ping = r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#;
    let p = Exchange::send(lb, "POST", &[ACCEPT, ("Mcp-Session-Id", &sid)], ping);
    assert_eq!(p.status, 404, "the dead node's session");
    let sid2 = initialize(lb);
    assert_ne!(sid2, sid);
    let mut x = call(lb, &sid2, 1, 3, 1);
    let mut fresh = Seen::default();
    fresh.read(&mut x, None);
    assert_eq!((fresh.progress, fresh.result), (vec![1, 2, 3], true));

    // Knowing a stream's event ID is not enough to recover its session on a node: the
    // request must carry that session's ID (else 404, as for any unknown session).
    let live: Vec<&Gateway> = gateways
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != dead)
        .filter_map(|(_, g)| g.as_ref())
        .collect();
    let other = live
        .iter()
        .find(|g| plain_metric(g, "gateway_mcp_upstreams") == 0);
    if let Some(g) = other {
        let r = resume(g.addr, &sid2, seen.ids.last().unwrap());
        assert!(
            matches!(r.status, 400 | 404),
            "another session's stream: {}",
            r.status
        );
    }

    // A request whose JSON-RPC id is too large for any record (the upstream echoes it in a
    // line over --event-bytes-max, so it is killed, and the error record naming the id cannot
    // be stored): the stream breaks explicitly on its node; no node stops (every node must
    // apply every record, so such a record is never sent).
    let huge = "x".repeat(200_000);
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":"{huge}","method":"tools/call","params":{{"name":"p","arguments":{{"count":1}}}}}}"#
    );
    let x = Exchange::send(lb, "POST", &[ACCEPT, ("Mcp-Session-Id", &sid2)], &body);
    drop(x);
    let sid3 = initialize(lb);
    let mut x = call(lb, &sid3, 1, 2, 1);
    let mut after = Seen::default();
    after.read(&mut x, None);
    assert_eq!((after.progress, after.result), (vec![1, 2], true));
    for (i, g) in gateways.iter_mut().enumerate() {
        if i != dead {
            let g = g.as_mut().unwrap();
            assert!(
                g.child.try_wait().unwrap().is_none(),
                "gateway {i} is running"
            );
        }
    }
}
