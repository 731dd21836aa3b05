//! Idempotent publishing (`Idempotency-Key`) end to end on one node: a repeat stores nothing
//! and answers the original IDs with `Idempotent-Replay: true`; another body under the same
//! key is 422; a key is per stream; a bad key is 400; a client whose connection was cut before
//! the 201 retries and the event is stored once; the keys outlive a restart, graceful or
//! SIGKILL (they are in the log), and one past the window at the restart is forgotten. In
//! cluster mode: a publish answered 503 while NATS was paused, retried with its key once NATS
//! runs again, is stored once, and another node answers the same IDs, also after a restart.

mod cluster_harness;
mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Gateway, json, request, seq_of};

fn post(
    addr: SocketAddr,
    path: &str,
    key: &str,
    body: &str,
) -> (u16, Vec<(String, String)>, serde_json::Value) {
    let (st, h, b) = request(
        addr,
        "POST",
        path,
        &[("Idempotency-Key", key)],
        body.as_bytes(),
    );
    (st, h, json(&b))
}

fn replayed(h: &[(String, String)]) -> bool {
    h.iter()
        .any(|(k, v)| k == "idempotent-replay" && v == "true")
}

#[test]
fn a_repeat_with_the_same_key_stores_nothing_and_answers_the_original_ids() {
    let g = Gateway::start(&[]);
    let (st, h, first) = post(g.addr, "/v1/streams/idem/events", "order-17", "one");
    assert_eq!(st, 201, "{first}");
    assert!(!replayed(&h));
    let (st, h, again) = post(g.addr, "/v1/streams/idem/events", "order-17", "one");
    assert_eq!((st, &again), (201, &first));
    assert!(replayed(&h), "{h:?}");
    // Another body under the same key: refused, nothing stored.
    let (st, _, body) = post(g.addr, "/v1/streams/idem/events", "order-17", "two");
    assert_eq!(st, 422, "{body}");
    assert_eq!(body["error"], "idempotency_key_reused");
    // The same key on another stream is another publish.
    let (st, h, other) = post(g.addr, "/v1/streams/idem2/events", "order-17", "two");
    assert_eq!(st, 201, "{other}");
    assert!(!replayed(&h));
    // A batch: the same IDs again.
    let batch = "{\"data\":\"a\"}\n{\"data\":\"b\"}\n";
    let (st, _, ids) = post(g.addr, "/v1/streams/idem/events:batch", "b-1", batch);
    assert_eq!(st, 201, "{ids}");
    let (st, h, again) = post(g.addr, "/v1/streams/idem/events:batch", "b-1", batch);
    assert_eq!((st, &again), (201, &ids));
    assert!(replayed(&h));
    // Two replays counted (the 422 is not one).
    assert_eq!(g.metric("gateway_idempotent_replays_total", ""), 2);
    // One event and one batch of two were stored: the next is the fourth.
    let next = common::publish(g.addr, "idem", "after");
    assert_eq!(seq_of(&next), 4, "{next}");
    // A key that is not 1..=64 visible ASCII bytes: 400.
    for bad in ["k".repeat(65), "a b".to_string()] {
        let (st, _, body) = post(g.addr, "/v1/streams/idem/events", &bad, "x");
        assert_eq!(st, 400, "{body}");
        assert_eq!(body["error"], "bad_idempotency_key");
    }
}

#[test]
fn a_publish_cut_before_its_answer_and_retried_is_stored_once() {
    let g = Gateway::start(&[]);
    let req = "POST /v1/streams/cut/events HTTP/1.1\r\nHost: t\r\nIdempotency-Key: k-cut\r\n\
               Content-Length: 4\r\n\r\nonce";
    {
        let mut s = common::connect(g.addr);
        s.write_all(req.as_bytes()).unwrap();
        // Closed at once: whether the gateway stored it is unknown to the client.
    }
    // The retry is answered with the event's ID whether the cut publish was stored or not;
    // the gateway stored it at most once.
    let mut id = None;
    for _ in 0..2 {
        let (st, _, body) = post(g.addr, "/v1/streams/cut/events", "k-cut", "once");
        assert_eq!(st, 201, "{body}");
        let this = body["id"].as_str().unwrap().to_owned();
        assert_eq!(*id.get_or_insert_with(|| this.clone()), this);
    }
    let next = common::publish(g.addr, "cut", "after");
    assert_eq!(seq_of(&next), 2, "{next}");
}

/// Keyed publishes (an event and a batch, on streams of both cores), then restarts: after
/// SIGTERM and after SIGKILL a retry of each stores nothing and answers the original IDs and
/// status; another body is still 422. Keys are per stream, so other streams are not touched.
#[test]
fn keys_outlive_a_restart_graceful_or_killed() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--cores", "2"];
    let mut g = Gateway::start_in(dir.path(), &flags);
    let batch = "{\"data\":\"a\"}\n{\"event\":\"t\",\"data\":\"b\"}\n";
    let cases: Vec<(String, &str, &str)> = (0..4)
        .flat_map(|i| {
            let (ev, b) = (
                format!("/v1/streams/r{i}/events"),
                format!("/v1/streams/r{i}/events:batch"),
            );
            [(ev, "k-ev", "one"), (b, "k-b", batch)]
        })
        .collect();
    let first: Vec<serde_json::Value> = cases
        .iter()
        .map(|(path, key, body)| {
            let (st, _, b) = post(g.addr, path, key, body);
            assert_eq!(st, 201, "{path}: {b}");
            b
        })
        .collect();
    for how in ["SIGTERM", "SIGKILL"] {
        if how == "SIGTERM" {
            assert!(g.stop(), "clean exit");
        }
        drop(g); // SIGKILL if still running
        g = Gateway::start_in(dir.path(), &flags);
        for ((path, key, body), want) in cases.iter().zip(&first) {
            let (st, h, again) = post(g.addr, path, key, body);
            assert_eq!((st, &again), (201, want), "{how}: {path}");
            assert!(replayed(&h), "{how}: {path}: {h:?}");
            let (st, _, other) = post(g.addr, path, key, other_body(path));
            assert_eq!(
                (st, &other["error"]),
                (422, &"idempotency_key_reused".into()),
                "{how}: {path}"
            );
        }
    }
    // Stored once: each stream holds its event and its batch of two.
    for i in 0..4 {
        let next = common::publish(g.addr, &format!("r{i}"), "after");
        assert_eq!(seq_of(&next), 4, "{next}");
    }
}

/// A valid body other than the cases' for `path` (an event or a batch).
fn other_body(path: &str) -> &'static str {
    if path.ends_with(":batch") {
        "{\"data\":\"z\"}\n"
    } else {
        "another"
    }
}

/// A key older than `--idempotency-window-secs` at the restart is not remembered: the repeat
/// is a new publish.
#[test]
fn a_key_past_the_window_at_a_restart_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--idempotency-window-secs", "1"];
    let g = Gateway::start_in(dir.path(), &flags);
    let (st, _, first) = post(g.addr, "/v1/streams/w/events", "k", "one");
    assert_eq!(st, 201, "{first}");
    drop(g);
    // The record's timestamp is coarse (a few ms): wait past the window with room.
    std::thread::sleep(Duration::from_millis(1500));
    let g = Gateway::start_in(dir.path(), &flags);
    let (st, h, again) = post(g.addr, "/v1/streams/w/events", "k", "one");
    assert_eq!(st, 201, "{again}");
    assert!(!replayed(&h));
    assert_eq!(seq_of(again["id"].as_str().unwrap()), 2, "{again}");
}

/// POSTs with `key` until the answer is not 503 (bounded); the last answer.
fn retry(addr: SocketAddr, path: &str, key: &str, body: &str) -> (u16, bool, serde_json::Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (st, h, b) = post(addr, path, key, body);
        if st != 503 {
            return (st, replayed(&h), b);
        }
        assert!(Instant::now() < deadline, "still 503: {b}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn cluster_a_publish_unconfirmed_while_nats_is_paused_and_retried_is_stored_once() {
    let Some((nats_bin, _)) = cluster_harness::tools() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let nats = cluster_harness::Nats::start(&nats_bin, dir.path());
    let flags = ["--nats-publish-timeout-ms", "1500"];
    let start =
        |name: &str| cluster_harness::start_gateway(&dir.path().join(name), &nats.urls(), &flags);
    let (g0, g1) = (start("g0"), start("g1"));
    let first = common::publish(g0.addr, "cl-idem", "before");
    let signal = |sig: &str| {
        for p in nats.nodes.iter().flatten() {
            let pid = p.0.id().to_string();
            let ok = std::process::Command::new("kill")
                .args([sig, &pid])
                .status();
            assert!(ok.unwrap().success());
        }
    };
    signal("-STOP");
    let path = "/v1/streams/cl-idem/events";
    let (st, _, body) = post(g0.addr, path, "pay-1", "paid");
    signal("-CONT");
    assert_eq!(st, 503, "{body}");
    assert_eq!(body["error"], "publish_unconfirmed");
    // The retry gets the event's one ID, on this node and on another (which learned the key
    // from JetStream's message); another body under the key is refused there too.
    let (st, _, got) = retry(g0.addr, path, "pay-1", "paid");
    assert_eq!(st, 201, "{got}");
    let id = got["id"].as_str().unwrap().to_owned();
    assert_eq!(seq_of(&id), seq_of(&first) + 1, "{id}");
    let (st, again, other) = retry(g1.addr, path, "pay-1", "paid");
    assert_eq!(
        (st, again, other["id"].as_str()),
        (201, true, Some(id.as_str()))
    );
    let (st, _, reused) = retry(g1.addr, path, "pay-1", "unpaid");
    assert_eq!(st, 422, "{reused}");
    assert_eq!(g1.metric("gateway_idempotent_replays_total", ""), 1);
    let next = common::publish(g1.addr, "cl-idem", "after");
    assert_eq!(seq_of(&next), seq_of(&id) + 1, "stored once: {next}");
    // A keyed batch: its IDs gather on every node as its events are applied.
    let batch = "{\"data\":\"a\"}\n{\"event\":\"t\",\"data\":\"b\"}\n";
    let path = "/v1/streams/cl-idem/events:batch";
    let (st, _, ids) = retry(g1.addr, path, "b-1", batch);
    assert_eq!(st, 201, "{ids}");
    let (st, again, other) = retry(g0.addr, path, "b-1", batch);
    assert_eq!((st, again, &other), (201, true, &ids));
    let last = common::publish(g0.addr, "cl-idem", "last");
    assert_eq!(seq_of(&last), seq_of(&next) + 3, "{last}");
    // A node restarted (SIGKILL) remembers the keys it applied: from its log, since it does
    // not apply those messages again (JetStream alone would answer the retry's duplicate
    // message ID with 503 until its duplicate window ends).
    let g1_dir = g1.data_dir.clone();
    drop(g1);
    let g1 = cluster_harness::start_gateway(&g1_dir, &nats.urls(), &flags);
    for (path, key, body, want) in [
        ("/v1/streams/cl-idem/events", "pay-1", "paid", &got),
        (path, "b-1", batch, &ids),
    ] {
        let (st, again, answer) = retry(g1.addr, path, key, body);
        assert_eq!((st, again, &answer), (201, true, want), "{path}");
    }
    let end = common::publish(g1.addr, "cl-idem", "end");
    assert_eq!(seq_of(&end), seq_of(&last) + 1, "{end}");
}
