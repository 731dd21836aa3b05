//! Adversarial end-to-end tests of the no-silent-gap invariant over real loopback sockets:
//! each test aims at one path that could skip or repeat an event (two resumers racing for one
//! parked window, requests pipelined before and after a subscribe, a handoff of a request that
//! arrives in pieces with more requests behind it, `Last-Event-ID` with sequence 0 or the
//! largest sequence, a resume at exactly the retained floor, `from=earliest` on a truncated
//! stream, restarts with another `--cores`, a lost shard map, a subscribe on a connection
//! that first carried publishes, producers forging the truncation notice, a batch that frames
//! too large, pipelined publishes answered to a slow reader, a client that pipelines without
//! reading). Every wait is bounded by the harness' read timeout or a loop count; only
//! correctness is asserted, never timing.
#![forbid(unsafe_code)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;

/// Reads events until the one with sequence `last_seq`; asserts they are exactly
/// `first_seq..=last_seq` (ids, in order) and returns their data.
fn expect_exact(s: &mut Sse, first_seq: u64, last_seq: u64) -> Vec<String> {
    let mut out = Vec::new();
    for want in first_seq..=last_seq {
        let e = s
            .next_event()
            .unwrap_or_else(|| panic!("stream ended before seq {want}"));
        let id =
            e.id.unwrap_or_else(|| panic!("event without id: {:?}", e.event));
        assert_eq!(seq_of(&id), want, "gap or duplicate");
        out.push(e.data);
    }
    out
}

/// `{epoch}-{stream}` of an event ID.
fn id_prefix(id: &str) -> &str {
    &id[..id.rfind('-').unwrap()]
}

/// Minimal reader for a subscription whose request was written by hand: the response head,
/// then events as `(id, event, data)`.
struct RawSse {
    r: BufReader<TcpStream>,
}

impl RawSse {
    /// Reads the head of a 200 event-stream response (after any earlier responses).
    fn head(r: BufReader<TcpStream>) -> RawSse {
        let mut r = r;
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "{line:?}");
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
        }
        RawSse { r }
    }

    fn next(&mut self) -> Option<(Option<String>, Option<String>, String)> {
        let (mut id, mut ev, mut data, mut any) = (None, None, Vec::new(), false);
        loop {
            let mut line = String::new();
            if self.r.read_line(&mut line).unwrap() == 0 {
                return None;
            }
            let line = line.strip_suffix('\n').expect("complete line");
            if line.is_empty() {
                if any {
                    return Some((id, ev, data.join("\n")));
                }
                continue;
            }
            if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_string());
                any = true;
            } else if let Some(v) = line.strip_prefix("event: ") {
                ev = Some(v.to_string());
                any = true;
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push(v.to_string());
                any = true;
            }
        }
    }
}

/// Every event of `stream` (from the earliest), read until `count` events arrived.
fn all_events(g: &Gateway, stream: &str, count: u64) -> Vec<(u64, String)> {
    let mut s = Sse::open(g.addr, &format!("/v1/streams/{stream}?from=earliest"), None);
    assert_eq!(s.status, 200);
    (0..count)
        .map(|_| {
            let e = s.next_event().expect("event");
            (seq_of(e.id.as_deref().unwrap()), e.data)
        })
        .collect()
}

/// A parked window can serve one resumer only. Two clients resuming from the same ID at the
/// same moment (the case "parked-window reuse by two resumers at once"): the first may be
/// served from the window (Aligned), the second must then replay from the log; both must see
/// exactly N+1..=tail. Repeated over several rounds, each round parking a fresh window.
#[test]
fn two_resumers_racing_for_one_parked_window() {
    let g = start_for_parked_window(&[]);
    let total = 6000u64;
    publish_numbered(g.addr, "race", 1, total, &"w".repeat(200));
    let mut last: Option<String> = None;
    let mut resumes = 0u64;
    for _round in 0..8 {
        // The parker: subscribes, lets the server fill the socket, drains what arrived
        // (bounded) and leaves mid-stream; its unconfirmed events are parked.
        let mut p = Sse::open(g.addr, "/v1/streams/race?from=earliest", last.as_deref());
        assert_eq!(p.status, 200);
        resumes += u64::from(last.is_some());
        std::thread::sleep(Duration::from_millis(20));
        p.drain_nonblocking(96 << 10);
        let mut n = last.as_deref().map_or(0, seq_of);
        while let Some(e) = p.take_buffered() {
            let id = e.id.unwrap();
            assert_eq!(seq_of(&id), n + 1, "parker saw a gap");
            n += 1;
            last = Some(id);
        }
        drop(p);
        let Some(lei) = last.clone() else { continue };
        if n >= total {
            break;
        }
        // Both resume requests are on the wire before either response is read.
        let mut a = Sse::open(g.addr, "/v1/streams/race", Some(&lei));
        let mut b = Sse::open(g.addr, "/v1/streams/race", Some(&lei));
        resumes += 2;
        assert_eq!((a.status, b.status), (200, 200));
        let da = expect_exact(&mut a, n + 1, total);
        let db = expect_exact(&mut b, n + 1, total);
        assert_eq!(da, db, "two resumers from the same ID saw different bytes");
        assert!(da[0].starts_with(&format!("{}:", n + 1)));
    }
    let aligned = g.metric("gateway_resumes_total", "class=\"aligned\"");
    let replay = g.metric("gateway_resumes_total", "class=\"replay\"");
    let up_to_date = g.metric("gateway_resumes_total", "class=\"up_to_date\"");
    eprintln!("resumes={resumes} aligned={aligned} replay={replay} up_to_date={up_to_date}");
    assert_eq!(
        aligned + replay + up_to_date,
        resumes,
        "every resume classified once"
    );
}

/// A subscription response carries `Connection: close`; RFC 9112 §9.6 says the server must
/// not process further requests on that connection. A publish pipelined behind a subscribe
/// must therefore not be appended (a half-processed tail would be an event nobody was told
/// about), and the subscription itself must be unaffected.
#[test]
fn requests_pipelined_after_a_subscribe_are_not_processed() {
    let g = Gateway::start(&["--cores", "1", "--fsync", "never"]);
    let first = publish(g.addr, "pipe-after", "before");
    let mut s = connect(g.addr);
    let ghost = "ghost";
    let req = format!(
        "GET /v1/streams/pipe-after HTTP/1.1\r\nHost: t\r\nLast-Event-ID: {first}\r\n\r\n\
         POST /v1/streams/pipe-after/events HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{ghost}",
        ghost.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut sub = RawSse::head(BufReader::new(s));
    let id2 = publish(g.addr, "pipe-after", "after");
    assert_eq!(seq_of(&id2), 2, "the pipelined publish was appended");
    let (id, ev, data) = sub.next().unwrap();
    assert_eq!(
        (id.as_deref(), ev, data.as_str()),
        (Some(id2.as_str()), None, "after")
    );
    let all = all_events(&g, "pipe-after", 2);
    assert_eq!(
        all,
        vec![(1, "before".to_string()), (2, "after".to_string())]
    );
}

/// A publish pipelined *before* a subscribe on the same connection: the subscribe waits until
/// the publish is answered (durable, `--fsync interval`), so `from=latest` starts after it and
/// a `Last-Event-ID` just before it sees it. Neither a gap nor a duplicate at the seam.
#[test]
fn publish_pipelined_before_a_subscribe_is_on_the_right_side_of_the_seam() {
    let g = Gateway::start(&["--cores", "1", "--fsync", "interval:30"]);
    let mut newest = publish(g.addr, "pipe-before", "z");
    for resume in [false, true] {
        let mut s = connect(g.addr);
        let mut req = String::from(
            "POST /v1/streams/pipe-before/events HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nA",
        );
        if resume {
            // Last-Event-ID = the newest event before A: A must come first.
            req.push_str(&format!(
                "GET /v1/streams/pipe-before HTTP/1.1\r\nHost: t\r\nLast-Event-ID: {newest}\r\n\r\n"
            ));
        } else {
            req.push_str("GET /v1/streams/pipe-before?from=latest HTTP/1.1\r\nHost: t\r\n\r\n");
        }
        s.write_all(req.as_bytes()).unwrap();
        let mut r = BufReader::new(s);
        let (st, _, body) = read_response(&mut r);
        assert_eq!(st, 201);
        let a_id = json(&body)["id"].as_str().unwrap().to_string();
        assert_eq!(seq_of(&a_id), seq_of(&newest) + 1);
        let mut sub = RawSse::head(r);
        let b_id = publish(g.addr, "pipe-before", "B");
        if resume {
            let (id, _, data) = sub.next().unwrap();
            assert_eq!((id.as_deref(), data.as_str()), (Some(a_id.as_str()), "A"));
        }
        let (id, _, data) = sub.next().unwrap();
        assert_eq!((id.as_deref(), data.as_str()), (Some(b_id.as_str()), "B"));
        assert_eq!(seq_of(&b_id), seq_of(&a_id) + 1);
        newest = b_id;
    }
}

/// A request for a stream owned by another core arrives in pieces (head split mid-line, body
/// in two parts), with two more requests pipelined behind it in the last piece: one for a
/// stream of the accepting core, one for /healthz. The connection is handed over with every
/// byte read so far and back again; each event is appended exactly once with its exact data
/// and the answers come back in request order.
#[test]
fn handoff_of_a_request_read_in_pieces_with_more_behind_it() {
    let g = Gateway::start(&[
        "--cores",
        "2",
        "--listen-cores-max",
        "1",
        "--fsync",
        "never",
    ]);
    let remote = stream_on_core(1, "remote");
    let local = stream_on_core(0, "local");
    let body1 = "0123456789";
    let head1 = format!(
        "POST /v1/streams/{remote}/events HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        body1.len()
    );
    let tail = format!(
        "{}POST /v1/streams/{local}/events HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nlocalGET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        &body1[4..]
    );
    let mut s = connect(g.addr);
    s.set_nodelay(true).unwrap();
    let cut = head1.len() / 2;
    for piece in [&head1[..cut], &head1[cut..], &body1[..4], tail.as_str()] {
        s.write_all(piece.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    let mut r = BufReader::new(s);
    let (st1, _, b1) = read_response(&mut r);
    let (st2, _, b2) = read_response(&mut r);
    let (st3, _, b3) = read_response(&mut r);
    assert_eq!((st1, st2, st3), (201, 201, 200));
    assert_eq!(seq_of(json(&b1)["id"].as_str().unwrap()), 1);
    assert_eq!(seq_of(json(&b2)["id"].as_str().unwrap()), 1);
    assert_eq!(json(&b3)["status"], "ok");
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "nothing after the last answer");
    assert_eq!(all_events(&g, &remote, 1), vec![(1, body1.to_string())]);
    assert_eq!(all_events(&g, &local, 1), vec![(1, "local".to_string())]);
    // And one more on each: sequence 2, so nothing was appended twice.
    assert_eq!(seq_of(&publish(g.addr, &remote, "x")), 2);
    assert_eq!(seq_of(&publish(g.addr, &local, "x")), 2);
    assert!(g.metric("gateway_handoffs_total", "direction=\"in\"") >= 2);
}

/// `Last-Event-ID` with sequence 0 means "before the first event": the whole stream from 1,
/// or live on an empty one; the largest sequence is beyond the tail (explicit 400).
#[test]
fn last_event_id_with_sequence_zero_and_max() {
    let g = Gateway::start(&["--cores", "1", "--fsync", "never"]);
    let ids: Vec<String> = (1..=5)
        .map(|i| publish(g.addr, "zero", &format!("e{i}")))
        .collect();
    let zero = format!("{}-0", id_prefix(&ids[0]));
    let mut s = Sse::open(g.addr, "/v1/streams/zero", Some(&zero));
    assert_eq!(s.status, 200);
    assert_eq!(
        expect_exact(&mut s, 1, 5),
        (1..=5).map(|i| format!("e{i}")).collect::<Vec<_>>()
    );
    // The query form too.
    let mut q = Sse::open(
        g.addr,
        &format!("/v1/streams/zero?last_event_id={zero}"),
        None,
    );
    expect_exact(&mut q, 1, 5);
    let id6 = publish(g.addr, "zero", "e6");
    assert_eq!(s.next_event().unwrap().id.as_deref(), Some(id6.as_str()));
    assert_eq!(q.next_event().unwrap().id.as_deref(), Some(id6.as_str()));
    let max = format!("{}-{}", id_prefix(&ids[0]), u64::MAX);
    let b = Sse::open(g.addr, "/v1/streams/zero", Some(&max));
    assert_eq!(b.status, 400);
    assert_eq!(json(&b.body)["error"], "beyond_tail");
    // A leading zero is not an event ID (strict parser), not "sequence 0".
    let lz = format!("{}-00", id_prefix(&ids[0]));
    let b = Sse::open(g.addr, "/v1/streams/zero", Some(&lz));
    assert_eq!(b.status, 400);
    assert_eq!(json(&b.body)["error"], "bad_last_event_id");
}

/// Publishes until retention raised the floor above 2; returns (the first ID, floor, tail).
fn publish_until_floor_moves(g: &Gateway, stream: &str) -> (String, u64, u64) {
    let payload = "p".repeat(1000);
    let first = publish(g.addr, stream, &payload);
    for round in 0..400 {
        publish_batch(g.addr, stream, &vec![payload.clone(); 50]);
        let s = Sse::open(g.addr, &format!("/v1/streams/{stream}"), Some(&first));
        if s.status == 410 {
            let v = json(&s.body);
            let (floor, tail) = (v["floor"].as_u64().unwrap(), v["tail"].as_u64().unwrap());
            if floor > 2 {
                return (first, floor, tail);
            }
        }
        if round > 20 {
            // Retention runs once a second on the reactor's tick.
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("retention never raised the floor");
}

/// Retention boundaries: a resume at exactly the floor (`Last-Event-ID` = floor - 1) is served
/// from the floor without a notice; one event further back is an explicit 410; sequence 0
/// after truncation is a 410 too; `from=earliest` (no ID) starts at the floor, gap-free.
#[test]
fn resume_at_exactly_the_floor_and_earliest_on_a_truncated_stream() {
    let g = Gateway::start(&[
        "--cores",
        "1",
        "--segment-bytes",
        "65536",
        "--retain-bytes",
        "65536",
        "--fsync",
        "never",
    ]);
    let (first, floor, tail) = publish_until_floor_moves(&g, "floor");
    let prefix = id_prefix(&first).to_string();
    let at = |seq: u64| format!("{prefix}-{seq}");
    // No publishes from here on, so retention cannot move the floor again.
    let mut s = Sse::open(g.addr, "/v1/streams/floor", Some(&at(floor - 1)));
    assert_eq!(s.status, 200);
    expect_exact(&mut s, floor, tail);
    for below in [floor - 2, 0] {
        let b = Sse::open(g.addr, "/v1/streams/floor", Some(&at(below)));
        assert_eq!(b.status, 410, "Last-Event-ID seq {below}, floor {floor}");
        let v = json(&b.body);
        assert_eq!(
            (v["requested"].as_u64(), v["floor"].as_u64()),
            (Some(below), Some(floor))
        );
    }
    let mut e = Sse::open(g.addr, "/v1/streams/floor?from=earliest", None);
    assert_eq!(e.status, 200);
    let first_ev = e.next_event().unwrap();
    assert_eq!(first_ev.event, None, "no notice without a Last-Event-ID");
    assert_eq!(seq_of(first_ev.id.as_deref().unwrap()), floor);
    expect_exact(&mut e, floor + 1, tail);
}

/// Restart with another `--cores` (1 → 3) between a disconnect and the resumes, for several
/// streams at once (spread over shards owned by different cores after the restart): each
/// resumes exactly after its Last-Event-ID and continues with events published after restart.
#[test]
fn restart_with_more_cores_resumes_every_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = Gateway::start_in(tmp.path(), &["--cores", "1", "--fsync", "always"]);
    let names: Vec<String> = (0..6).map(|i| format!("rc{i}")).collect();
    for n in &names {
        publish_batch(
            g.addr,
            n,
            &(1..=20).map(|i| format!("{n}-{i}")).collect::<Vec<_>>(),
        );
    }
    let mut lasts = Vec::new();
    for n in &names {
        let mut s = Sse::open(g.addr, &format!("/v1/streams/{n}?from=earliest"), None);
        let mut last = None;
        for _ in 0..7 {
            last = s.next_event().unwrap().id;
        }
        lasts.push(last.unwrap());
    }
    assert!(g.stop());
    let g = Gateway::start_in(tmp.path(), &["--cores", "3", "--fsync", "always"]);
    for n in &names {
        publish_batch(
            g.addr,
            n,
            &(21..=25).map(|i| format!("{n}-{i}")).collect::<Vec<_>>(),
        );
    }
    for (n, last) in names.iter().zip(&lasts) {
        let mut s = Sse::open(g.addr, &format!("/v1/streams/{n}"), Some(last));
        assert_eq!(s.status, 200, "{n}");
        let got = expect_exact(&mut s, 8, 25);
        assert_eq!(
            got,
            (8..=25).map(|i| format!("{n}-{i}")).collect::<Vec<_>>()
        );
    }
}

/// The shard count is fixed at creation (`shards.json`). If that file is lost next to existing
/// shard logs, a restart with another `--shards-on-create` used to recreate it with the new
/// count and silently re-route streams away from their history (a stream "restarting" at
/// sequence 1). It must refuse to start instead, naming the cause; restoring the file brings
/// every stream back intact.
#[test]
fn lost_shard_map_is_refused_not_guessed() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = Gateway::start_in(tmp.path(), &["--cores", "1", "--shards-on-create", "8"]);
    let ids: Vec<String> = (0..5)
        .map(|i| publish(g.addr, &format!("map{i}"), "kept"))
        .collect();
    assert!(g.stop());
    let map = std::fs::read(tmp.path().join("shards.json")).unwrap();
    std::fs::remove_file(tmp.path().join("shards.json")).unwrap();
    // Still running after 30 s would mean it started without its shard map.
    let (status, err) = run_to_exit(
        tmp.path(),
        &[
            "--cores",
            "1",
            "--shards-on-create",
            "3",
            "--segment-bytes",
            "1048576",
        ],
        30,
    );
    assert!(!status.success());
    assert!(err.contains("shards.json is missing"), "{err}");
    assert!(!tmp.path().join("shards.json").exists(), "nothing guessed");
    std::fs::write(tmp.path().join("shards.json"), map).unwrap();
    let g = Gateway::start_in(tmp.path(), &["--cores", "2"]);
    for (i, id) in ids.iter().enumerate() {
        let mut s = Sse::open(g.addr, &format!("/v1/streams/map{i}?from=earliest"), None);
        assert_eq!(s.next_event().unwrap().id.as_deref(), Some(id.as_str()));
    }
}

/// `event: truncated` is the gateway's in-band "you missed events" notice (no `id:`). A
/// producer publishing that type would let subscribers mistake an ordinary event for a
/// truncation (or learn to ignore real ones): refused, single and batch, appending nothing.
#[test]
fn producers_cannot_forge_the_truncation_notice() {
    let g = Gateway::start(&["--cores", "1", "--fsync", "never"]);
    let (st, _, body) = request(
        g.addr,
        "POST",
        "/v1/streams/forge/events",
        &[("Event-Type", "truncated")],
        b"{\"error\":\"truncated\",\"requested\":1,\"floor\":99,\"tail\":99}",
    );
    assert_eq!(
        (st, json(&body)["error"].as_str()),
        (400, Some("reserved_event_type"))
    );
    let (st, _, body) = request(
        g.addr,
        "POST",
        "/v1/streams/forge/events:batch",
        &[],
        b"{\"data\":\"ok\"}\n{\"event\":\"truncated\",\"data\":\"x\"}\n",
    );
    assert_eq!(
        (st, json(&body)["error"].as_str()),
        (400, Some("reserved_event_type"))
    );
    let id = publish(g.addr, "forge", "first");
    assert_eq!(seq_of(&id), 1, "a refused publish appended something");
    assert_eq!(all_events(&g, "forge", 1), vec![(1, "first".to_string())]);
}

/// A batch is validated as a whole before anything is appended (README). An event whose data
/// is within `--event-bytes-max` can still frame larger than the log's record limit (every
/// line break costs a `data: ` prefix): such a batch must be refused with nothing appended,
/// not half-appended behind an error a retrying client would duplicate.
#[test]
fn batch_whose_event_frames_too_large_appends_nothing() {
    let g = Gateway::start(&[
        "--cores",
        "1",
        "--fsync",
        "never",
        "--event-bytes-max",
        "4096",
    ]);
    let lines = "\n".repeat(4000); // 4000 bytes of data, ~28 KB framed
    let body = format!(
        "{}\n{}\n",
        serde_json::json!({ "data": "fits" }),
        serde_json::json!({ "data": lines })
    );
    let (st, _, resp) = request(
        g.addr,
        "POST",
        "/v1/streams/whole/events:batch",
        &[],
        body.as_bytes(),
    );
    let v = json(&resp);
    assert_eq!(
        (st, v["error"].as_str()),
        (413, Some("event_too_large")),
        "{v}"
    );
    assert!(
        v.get("appended_ids")
            .is_none_or(|a| a.as_array().is_some_and(|a| a.is_empty())),
        "part of a refused batch was appended: {v}"
    );
    let id = publish(g.addr, "whole", "next");
    assert_eq!(seq_of(&id), 1, "part of a refused batch was appended");
}

/// A subscription on a keep-alive connection that first carried publishes: the window's byte 0
/// is the first byte after the subscribe, while the socket may still hold unacknowledged bytes
/// of the earlier answers (they must not be counted as ACKs of events). The client reads part
/// of the stream, drops the connection with unread bytes (RST), and resumes: exactly N+1
/// onwards. Both ACK sources: TX timestamps and the SIOCOUTQ fallback.
#[test]
fn subscribe_after_publishes_on_the_same_connection_then_resume() {
    for extra in [&[][..], &["--no-tx-timestamps"][..]] {
        let g = start_for_parked_window(extra);
        let total = 3000u64;
        publish_numbered(g.addr, "keep", 1, total, &"k".repeat(300));
        let mut last: Option<String> = None;
        let mut n = 0u64;
        for _round in 0..40 {
            if n >= total {
                break;
            }
            // Two publishes to another stream, then the subscribe, all on one connection.
            let mut s = connect(g.addr);
            let mut req = String::new();
            for _ in 0..2 {
                req.push_str("POST /v1/streams/other/events HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nx");
            }
            req.push_str("GET /v1/streams/keep?from=earliest HTTP/1.1\r\nHost: t\r\n");
            if let Some(l) = &last {
                req.push_str(&format!("Last-Event-ID: {l}\r\n"));
            }
            req.push_str("\r\n");
            s.write_all(req.as_bytes()).unwrap();
            let mut r = BufReader::new(s);
            for _ in 0..2 {
                assert_eq!(read_response(&mut r).0, 201);
            }
            let mut sub = RawSse::head(r);
            // Read a bounded number of events, then leave with the rest unread.
            for _ in 0..150 {
                let Some((id, _, data)) = sub.next() else {
                    break;
                };
                let id = id.expect("event id");
                assert_eq!(seq_of(&id), n + 1, "gap or duplicate");
                assert!(data.starts_with(&format!("{}:", n + 1)));
                n += 1;
                last = Some(id);
                if n >= total {
                    break;
                }
            }
            drop(sub);
        }
        assert_eq!(n, total, "did not reach the tail within the rounds");
    }
}

/// A reader that hands out at most a few hundred bytes per read (odd sizes) and pauses now and
/// then, so the server's sends to it go partial and its answers queue.
struct SlowReader<R> {
    inner: R,
    reads: usize,
}

impl<R: Read> Read for SlowReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reads += 1;
        if self.reads == 1 {
            std::thread::sleep(Duration::from_millis(300)); // let the answers pile up first
        } else if self.reads.is_multiple_of(64) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let n = buf.len().min(1 + (self.reads * 7919) % 700);
        self.inner.read(&mut buf[..n])
    }
}

/// One client pipelines 30,000 publishes over 7 streams, written in odd-sized pieces, and
/// reads the answers slowly in odd-sized pieces. Every answer arrives exactly once, in request
/// order and well-formed (a 201 naming the next sequence of that request's stream), and each
/// stream's subscriber then reads exactly the events published to it: the response path loses,
/// repeats or reorders nothing under partial sends and queued answers.
#[test]
fn pipelined_publishes_to_a_slow_reader_are_answered_once_in_order() {
    const N: usize = 30_000;
    const STREAMS: usize = 7;
    let g = Gateway::start(&["--cores", "1", "--fsync", "never"]);
    let s = connect(g.addr);
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut buf = Vec::new();
        for i in 0..N {
            let body = format!("{i}");
            buf.extend_from_slice(
                format!(
                    "POST /v1/streams/pipe{}/events HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
                    i % STREAMS,
                    body.len()
                )
                .as_bytes(),
            );
        }
        let (mut off, mut k) = (0, 1usize);
        while off < buf.len() {
            let n = (1 + k * 7919 % 5000).min(buf.len() - off);
            w.write_all(&buf[off..off + n]).unwrap();
            off += n;
            k += 1;
        }
    });
    let mut r = BufReader::new(SlowReader { inner: s, reads: 0 });
    let mut sid = vec![None; STREAMS];
    for i in 0..N {
        let (status, _, body) = read_response(&mut r);
        assert_eq!(
            status,
            201,
            "answer {i}: {}",
            String::from_utf8_lossy(&body)
        );
        let id = json(&body)["id"].as_str().unwrap().to_string();
        let (prefix, seq) = id.rsplit_once('-').unwrap();
        assert_eq!(
            seq.parse::<u64>().unwrap(),
            (i / STREAMS) as u64 + 1,
            "answer {i}: {id}"
        );
        let first = sid[i % STREAMS].get_or_insert_with(|| prefix.to_string());
        assert_eq!(first, prefix, "answer {i} names another stream");
    }
    writer.join().unwrap();
    // Nothing more is owed: a further request's answer is the next thing on the wire.
    r.get_mut()
        .inner
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let (status, _, body) = read_response(&mut r);
    assert_eq!((status, json(&body)["status"].as_str()), (200, Some("ok")));
    for k in 0..STREAMS {
        let mut sub = Sse::open(g.addr, &format!("/v1/streams/pipe{k}?from=earliest"), None);
        for j in 0..N.div_ceil(STREAMS) {
            let i = j * STREAMS + k;
            if i >= N {
                break;
            }
            let e = sub.next_event().unwrap();
            assert_eq!(
                (seq_of(e.id.as_deref().unwrap()), e.data),
                ((j + 1) as u64, i.to_string())
            );
        }
    }
}

/// A client that pipelines 100,000 publishes and reads nothing for a while: the gateway
/// queues at most `--pipeline-answer-bytes-max` of answers (then stops reading the client, so
/// TCP pushes back) instead of buffering one answer per request it can read. Once the client
/// reads, every answer arrives, in order.
#[test]
fn a_client_that_pipelines_without_reading_is_pushed_back() {
    const N: usize = 100_000;
    const CAP: u64 = 64 * 1024;
    let g = Gateway::start(&[
        "--cores",
        "1",
        "--fsync",
        "never",
        "--pipeline-answer-bytes-max",
        &CAP.to_string(),
    ]);
    let s = connect(g.addr);
    s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut buf = Vec::new();
        for i in 0..N {
            buf.extend_from_slice(
                format!("POST /v1/streams/hoard/events HTTP/1.1\r\nHost: t\r\nContent-Length: 8\r\n\r\n{i:08}")
                    .as_bytes(),
            );
        }
        w.write_all(&buf).unwrap();
    });
    // The gauge is sampled every 100 ms; watch it while nothing is read.
    let mut most = 0;
    for _ in 0..15 {
        std::thread::sleep(Duration::from_millis(100));
        most = most.max(g.metric("gateway_queued_answer_bytes", ""));
    }
    let appended = g.metric("gateway_events_appended_total", "");
    assert!(
        most > 0,
        "answers were queued while the client did not read"
    );
    // One answer may cross the line (it is queued before the check stops the next request).
    assert!(
        most <= CAP + 512,
        "{most} bytes of answers queued (cap {CAP})"
    );
    assert!(
        (appended as usize) < N,
        "the gateway stopped reading: {appended} appended"
    );
    let mut r = BufReader::new(s);
    for i in 0..N {
        let (status, _, body) = read_response(&mut r);
        assert_eq!(status, 201, "answer {i}");
        assert_eq!(seq_of(json(&body)["id"].as_str().unwrap()), i as u64 + 1);
    }
    writer.join().unwrap();
}
