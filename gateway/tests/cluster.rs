//! Cluster mode end to end (`--nats-url`): a 3-node NATS JetStream cluster (R=3,
//! `sync_interval: always`), 3 gateways and HAProxy round-robin in front with no affinity, all
//! on loopback. Subscribers cut at random reconnect through the balancer (so onto other nodes)
//! with `Last-Event-ID`; a gateway and the JetStream stream's leader are killed with SIGKILL
//! mid-run; a gateway restarted on an empty data directory serves old resumes. Every run must
//! show 0 gaps and 0 duplicates, and every acknowledged publish at its ID.
//! The harness (and what it needs installed) is `cluster_harness/`.

mod cluster_harness;
mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use cluster_harness::{Balancer, Nats, gateway_args, shard_of, start_gateway, tools};
use common::Gateway;

/// One POST through `addr` on a new connection: `Ok(id)` on 201, `Err(status)` otherwise
/// (0: the connection failed).
fn post(addr: SocketAddr, stream: &str, data: &str) -> Result<String, u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|_| 0u16)?;
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "POST /v1/streams/{stream}/events HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{data}",
        data.len()
    );
    s.write_all(req.as_bytes()).map_err(|_| 0u16)?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if status != 201 {
        return Err(status);
    }
    let body = &text[text.find("\r\n\r\n").ok_or(0u16)? + 4..];
    let v: serde_json::Value = serde_json::from_str(body).map_err(|_| 0u16)?;
    Ok(v["id"].as_str().ok_or(0u16)?.to_owned())
}

fn seq(id: &str) -> u64 {
    common::seq_of(id)
}

/// A subscriber through the balancer: reads, cuts after a random number of events, resumes
/// with the last ID it got; records every `(id, data)` in order. A 503 (the node has not
/// caught up) or a failed connection is retried after a pause.
fn subscriber(
    addr: SocketAddr,
    stream: &str,
    until_seq: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    deadline: Instant,
    seed: u64,
) -> Vec<(String, String)> {
    let mut got: Vec<(String, String)> = Vec::new();
    let mut rng = seed;
    let mut next_rand = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    loop {
        let last_seq = got.last().map_or(0, |(id, _)| seq(id));
        let target = until_seq.load(SeqCst);
        if done.load(SeqCst) && target > 0 && last_seq >= target {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "subscriber timed out at {last_seq}"
        );
        let cut_after = 1 + next_rand() % 40;
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut req = format!(
            "GET /v1/streams/{stream}?from=earliest HTTP/1.1\r\nHost: t\r\n\
             Accept: text/event-stream\r\n"
        );
        if let Some((id, _)) = got.last() {
            req.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        req.push_str("\r\n");
        if s.write_all(req.as_bytes()).is_err() {
            continue;
        }
        let mut r = BufReader::new(s);
        let mut status = String::new();
        if r.read_line(&mut status).is_err() || !status.contains(" 200 ") {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        read_events(&mut r, &mut got, cut_after);
    }
}

/// Reads events until `max` were read, the stream ends or stalls (3 s): a cut either way.
fn read_events(r: &mut impl BufRead, got: &mut Vec<(String, String)>, max: u64) {
    let (mut id, mut data) = (None::<String>, String::new());
    let mut n = 0;
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            if let Some(i) = id.take() {
                got.push((i, std::mem::take(&mut data)));
                n += 1;
                if n >= max {
                    return;
                }
            }
        } else if let Some(v) = l.strip_prefix("id: ") {
            id = Some(v.to_owned());
        } else if let Some(v) = l.strip_prefix("data: ") {
            data = v.to_owned();
        }
    }
}

/// Every subscriber saw IDs 1..=n exactly once, in order, with the data acknowledged there.
fn check_exactly_once(got: &[(String, String)], acked: &HashMap<String, String>, n: u64) {
    let seqs: Vec<u64> = got.iter().map(|(id, _)| seq(id)).collect();
    let want: Vec<u64> = (1..=n).collect();
    assert_eq!(seqs.len(), want.len(), "count (gap or duplicate)");
    assert_eq!(seqs, want, "sequence");
    let epochs: std::collections::HashSet<&str> = got
        .iter()
        .map(|(id, _)| id.split('-').next().unwrap())
        .collect();
    assert_eq!(epochs.len(), 1, "one epoch across nodes: {epochs:?}");
    for (id, data) in got {
        if let Some(d) = acked.get(id) {
            assert_eq!(d, data, "acknowledged data at {id}");
        }
    }
}

struct Setup {
    dir: tempfile::TempDir,
    nats: Nats,
    gateways: Vec<Option<Gateway>>,
    lb: Balancer,
}

fn setup() -> Option<Setup> {
    let (nats_bin, haproxy_bin) = tools()?;
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(&nats_bin, dir.path());
    let urls = nats.urls();
    let gateways: Vec<Option<Gateway>> = (0..3)
        .map(|i| {
            let d = dir.path().join(format!("g{i}"));
            let mut u = urls.clone();
            u.rotate_left(i);
            Some(start_gateway(&d, &u, &[]))
        })
        .collect();
    let backends: Vec<SocketAddr> = gateways.iter().flatten().map(|g| g.addr).collect();
    let lb = Balancer::start(&haproxy_bin, dir.path(), &backends);
    Some(Setup {
        dir,
        nats,
        gateways,
        lb,
    })
}

/// A sequential publisher through the balancer: `n` events, data `p-<i>`; a refused or
/// failed publish is retried (a retried event may then be stored twice, at two IDs: the
/// checks are on IDs and on acknowledged data). Returns every acknowledged `(id, data)`.
fn publish_all(
    addr: SocketAddr,
    stream: &str,
    n: u64,
    acked_count: &AtomicU64,
    deadline: Instant,
) -> HashMap<String, String> {
    let mut acked = HashMap::new();
    for i in 1..=n {
        let data = format!("p-{i}");
        loop {
            assert!(Instant::now() < deadline, "publisher timed out at {i}");
            match post(addr, stream, &data) {
                Ok(id) => {
                    assert!(
                        acked.insert(id, data.clone()).is_none(),
                        "an ID acked twice"
                    );
                    acked_count.fetch_add(1, SeqCst);
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
    acked
}

/// What each subscriber saw, the acknowledged publishes and the last sequence.
type Outcome = (Vec<Vec<(String, String)>>, HashMap<String, String>, u64);

/// Runs `subs` cutting subscribers and one publisher of `n` events; `during(acked)` is called
/// as publishes are acknowledged (to kill things). Returns what each subscriber saw, the
/// acknowledged publishes and the last sequence.
fn run(lb: SocketAddr, stream: &str, n: u64, subs: usize, mut during: impl FnMut(u64)) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(150);
    let until = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..subs)
        .map(|i| {
            let (until, done, stream) = (until.clone(), done.clone(), stream.to_owned());
            std::thread::spawn(move || {
                subscriber(lb, &stream, until, done, deadline, 0x9e37_79b9 + i as u64)
            })
        })
        .collect();
    let count = Arc::new(AtomicU64::new(0));
    let publisher = {
        let (count, stream) = (count.clone(), stream.to_owned());
        std::thread::spawn(move || publish_all(lb, &stream, n, &count, deadline))
    };
    while !publisher.is_finished() {
        during(count.load(SeqCst));
        std::thread::sleep(Duration::from_millis(20));
    }
    let acked = publisher.join().expect("publisher");
    let last = acked.keys().map(|id| seq(id)).max().unwrap();
    until.store(last, SeqCst);
    done.store(true, SeqCst);
    let got = handles
        .into_iter()
        .map(|h| h.join().expect("subscriber"))
        .collect();
    (got, acked, last)
}

fn resumes(g: &Gateway) -> u64 {
    g.metric("gateway_resumes_total", "")
}

#[test]
fn cut_subscribers_resume_on_other_nodes_exactly_once() {
    let Some(s) = setup() else { return };
    // A subscriber that comes before the stream's first event, on another node than the
    // publisher's, is served from event 1 once it is applied there.
    let (g0, g2) = (
        s.gateways[0].as_ref().unwrap(),
        s.gateways[2].as_ref().unwrap(),
    );
    let mut early = TcpStream::connect(g2.addr).unwrap();
    early
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        early,
        "GET /v1/streams/cl-early HTTP/1.1\r\nHost: t\r\n\r\n"
    )
    .unwrap();
    let mut early = BufReader::new(early);
    let mut status = String::new();
    early.read_line(&mut status).unwrap();
    assert!(status.contains(" 200 "), "{status}");
    let id = post(g0.addr, "cl-early", "first").expect("publish");
    assert_eq!(seq(&id), 1);
    let mut seen = Vec::new();
    read_events(&mut early, &mut seen, 1);
    assert_eq!(seen, vec![(id, "first".to_string())]);

    let (got, acked, last) = run(s.lb.addr, "cl-cuts", 300, 3, |_| {});
    assert_eq!(
        last, 300,
        "one sequential publisher, nothing failed: IDs 1..=300"
    );
    for g in &got {
        check_exactly_once(g, &acked, last);
    }
    // Round-robin with no affinity: every node served resumes.
    for g in s.gateways.iter().flatten() {
        assert!(resumes(g) > 0, "a node served no resume");
    }
}

#[test]
fn kills_of_a_gateway_and_the_jetstream_leader_lose_nothing() {
    let Some(mut s) = setup() else { return };
    let stream = "cl-kill";
    let js_stream = format!("GW_{}", shard_of(stream, 4));
    let (mut killed_gw, mut killed_js) = (false, None);
    let (got, acked, last) = run(s.lb.addr, stream, 400, 3, |acked| {
        if acked >= 100 && !killed_gw {
            killed_gw = true;
            let mut g = s.gateways[1].take().unwrap();
            let _ = g.child.kill(); // SIGKILL
            let _ = g.child.wait();
        }
        if acked >= 200 && killed_js.is_none() {
            let leader = s.nats.leader_of(&js_stream).expect("a leader");
            s.nats.nodes[leader] = None; // SIGKILL
            killed_js = Some(leader);
        }
    });
    assert!(
        killed_gw && killed_js.is_some(),
        "both kills happened mid-run"
    );
    assert!(last >= 400, "every event acknowledged: {last}");
    for g in &got {
        check_exactly_once(g, &acked, last);
    }
    // A gateway on an empty data directory rebuilds from JetStream and serves old resumes.
    let fresh = s.dir.path().join("fresh");
    let live: Vec<String> = s
        .nats
        .urls()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != killed_js)
        .map(|(_, u)| u)
        .collect();
    let mid = &got[0][(last / 2) as usize - 1].0;
    let g = start_gateway(&fresh, &live, &[]);
    let suffix = resume_on(g.addr, stream, mid, last - last / 2);
    assert_eq!(
        &suffix[..],
        &got[0][(last / 2) as usize..],
        "the fresh node's suffix"
    );
    // The killed gateway, restarted on its own data directory, continues from what it had.
    let again = start_gateway(&s.dir.path().join("g1"), &live, &[]);
    let first = &got[0][9].0;
    let suffix = resume_on(again.addr, stream, first, last - 10);
    assert_eq!(&suffix[..], &got[0][10..], "the restarted node's suffix");
}

/// Resumes `stream` on one node after `id` and reads `n` events (retrying while the node
/// catches up: 503, or fewer events within the read timeout).
fn resume_on(addr: SocketAddr, stream: &str, id: &str, n: u64) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < n as usize {
        assert!(
            Instant::now() < deadline,
            "{addr} served {} of {n}",
            got.len()
        );
        got.clear();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        write!(
            s,
            "GET /v1/streams/{stream} HTTP/1.1\r\nHost: t\r\nLast-Event-ID: {id}\r\n\r\n"
        )
        .unwrap();
        let mut r = BufReader::new(s);
        let mut status = String::new();
        r.read_line(&mut status).unwrap();
        if status.contains(" 200 ") {
            read_events(&mut r, &mut got, n);
        } else {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    got
}

/// One request on a new connection: status, head, body.
fn exchange(addr: SocketAddr, req: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

#[test]
fn explicit_answers_for_what_a_cluster_cannot_do_now() {
    let Some(mut s) = setup() else { return };
    let g = s.gateways[0].as_ref().unwrap();
    let id = post(g.addr, "cl-edge", "one").expect("publish");
    // DELETE would be one node's alone: refused.
    let (status, _, body) = exchange(
        g.addr,
        "DELETE /v1/streams/cl-edge HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 501, "{body}");
    assert!(body.contains("not_in_cluster_mode"), "{body}");
    // An ID of this stream's epoch that no node has applied: 503 with Retry-After after the
    // catch-up wait, never a 200 that skips.
    let ahead = format!("{}-{}", id.rsplit_once('-').unwrap().0, seq(&id) + 1000);
    let req =
        format!("GET /v1/streams/cl-edge HTTP/1.1\r\nHost: t\r\nLast-Event-ID: {ahead}\r\n\r\n");
    let (status, head, body) = exchange(g.addr, &req);
    assert_eq!(status, 503, "{body}");
    assert!(head.contains("Retry-After: 1"), "{head}");
    assert!(body.contains("catching_up"), "{body}");
    // --streams-per-subject-max counts the creations published through this node: one new
    // stream (its 201 comes once it is applied here), then 429 subject_quota; publishing to
    // the stream that exists stays free.
    let mut args = gateway_args(&s.nats.urls(), &[]);
    args.extend(["--streams-per-subject-max".into(), "1".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let quota = Gateway::start_in(&s.dir.path().join("quota"), &args);
    post(quota.addr, "cl-quota-1", "x").expect("the subject's one new stream");
    post(quota.addr, "cl-quota-1", "y").expect("a stream that exists is free");
    let req = "POST /v1/streams/cl-quota-2/events HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\
               Connection: close\r\n\r\nx";
    let (status, _, body) = exchange(quota.addr, req);
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("subject_quota"), "{body}");
    drop(quota);
    // Without a JetStream quorum a publish is answered 503 publish_unconfirmed once its
    // timeout passes, not left hanging and not claimed.
    let dir = s.dir.path().join("short");
    let mut args = gateway_args(&s.nats.urls(), &[]);
    args.extend(["--nats-publish-timeout-ms".into(), "1500".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let short = Gateway::start_in(&dir, &args);
    s.nats.nodes[1] = None;
    s.nats.nodes[2] = None;
    let started = Instant::now();
    let req = "POST /v1/streams/cl-edge/events HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\
               Connection: close\r\n\r\ntwo";
    let (status, _, body) = exchange(short.addr, req);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("publish_unconfirmed"), "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "answered within its timeout"
    );
    assert!(short.metric("gateway_cluster_unconfirmed_total", "") >= 1);
}

/// Waits (bounded) until `g` stored snapshots covering `messages`.
fn wait_snapshot(g: &Gateway, messages: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while g.metric("gateway_cluster_snapshot_messages", "") < messages {
        assert!(
            Instant::now() < deadline,
            "no snapshot of {messages} messages stored"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A name of shard `shard` (of 4) with `prefix`.
fn name_in_shard(prefix: &str, shard: u64) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|n| shard_of(n, 4) == shard)
        .unwrap()
}

#[test]
fn a_node_starts_from_a_snapshot_when_jetstream_dropped_the_shards_head() {
    let Some((nats_bin, _)) = tools() else { return };
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(&nats_bin, dir.path());
    let mut args = gateway_args(&nats.urls(), &[]);
    args.extend(
        [
            "--nats-stream-messages-max",
            "100",
            "--cluster-snapshot-interval-secs",
            "1",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // g0's snapshots (what the first fresh node starts from) are stored in 256-byte chunks:
    // streams b and c0..c2 with ~190-byte names make them about 850 bytes (4 chunks).
    let mut g0_args = args.clone();
    g0_args.extend(["--cluster-snapshot-chunk-bytes", "256"]);
    let g0 = Gateway::start_in(&dir.path().join("g0"), &g0_args);
    let a = "snap-a".to_string();
    let long = |p: &str| name_in_shard(&format!("{p}-{}-", "x".repeat(180)), shard_of(&a, 4));
    let b = long("snap-b");
    for i in 1..=5 {
        post(g0.addr, &b, &format!("b{i}")).unwrap();
    }
    for k in 0..3 {
        post(g0.addr, &long(&format!("snap-c{k}")), "c").unwrap();
    }
    let mut ids = Vec::new();
    for i in 1..=300 {
        ids.push(post(g0.addr, &a, &format!("a{i}")).unwrap());
    }
    // JetStream keeps the last 100 of the shard's 308 messages; a snapshot after them is
    // stored before the fresh node starts.
    wait_snapshot(&g0, 308);
    assert!(
        g0.metric("gateway_cluster_snapshot_chunks_total", "") > 0,
        "g0's snapshots are chunked"
    );
    let fresh = Gateway::start_in(&dir.path().join("fresh"), &args);
    // Below JetStream's first retained message (every usable snapshot is above it): an
    // explicit 410 on this node, never a skip.
    let req = format!(
        "GET /v1/streams/{a} HTTP/1.1\r\nHost: t\r\nLast-Event-ID: {}\r\nConnection: close\r\n\r\n",
        ids[99]
    );
    let (status, _, body) = exchange(fresh.addr, &req);
    assert_eq!(status, 410, "{body}");
    // Between: the node started from the oldest snapshot JetStream can continue, so it serves
    // the exact suffix when it holds it, else says 410.
    let mut s250 = TcpStream::connect(fresh.addr).unwrap();
    s250.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = format!(
        "GET /v1/streams/{a} HTTP/1.1\r\nHost: t\r\nLast-Event-ID: {}\r\n\r\n",
        ids[249]
    );
    s250.write_all(req.as_bytes()).unwrap();
    let mut r250 = BufReader::new(s250);
    let mut status = String::new();
    r250.read_line(&mut status).unwrap();
    if status.contains(" 200 ") {
        let mut got = Vec::new();
        read_events(&mut r250, &mut got, 50);
        let want: Vec<(String, String)> = (250..300)
            .map(|i| (ids[i].clone(), format!("a{}", i + 1)))
            .collect();
        assert_eq!(got, want, "the suffix after 250 on the rebuilt node");
    } else {
        assert!(status.contains(" 410 "), "{status}");
    }
    // What follows the snapshot: the same IDs as the node that published them.
    let mut more = Vec::new();
    for i in 301..=320 {
        more.push((
            post(g0.addr, &a, &format!("a{i}")).unwrap(),
            format!("a{i}"),
        ));
    }
    assert_eq!(seq(&more[0].0), 301);
    let got = resume_on(fresh.addr, &a, &ids[299], 20);
    assert_eq!(
        got, more,
        "the rebuilt node serves the suffix under the same IDs"
    );
    // A stream whose every message JetStream dropped continues at its next sequence.
    let b6 = post(fresh.addr, &b, "b6").unwrap();
    assert_eq!(seq(&b6), 6, "{b6}");
    // The rebuilt node's own snapshots never replace a newer one: a second fresh node, after
    // a few more snapshot intervals, still finds one that reaches JetStream's head.
    wait_snapshot(&g0, 329);
    let second = Gateway::start_in(&dir.path().join("fresh2"), &args);
    let last = post(g0.addr, &a, "a321").unwrap();
    let got = resume_on(second.addr, &a, &more[19].0, 1);
    assert_eq!(
        got,
        vec![(last, "a321".to_string())],
        "a second rebuilt node"
    );
}
