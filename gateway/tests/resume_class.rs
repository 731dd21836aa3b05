//! End-to-end tests of the `X-Resume-Class` response header over real loopback sockets against
//! the built `gateway` binary: a resume says how the server classified it (`replay`,
//! `up-to-date`, `aligned`, `truncated`), a plain subscription carries no such header, and the
//! headers agree with the `gateway_resumes_total` counters. No timed assertions: every wait is
//! bounded and only correctness is asserted. Uses the helpers of `tests/common`.
#![forbid(unsafe_code)]

mod common;

use std::time::Duration;

use common::*;

/// The `X-Resume-Class` header's value, if present.
fn class(s: &Sse) -> Option<String> {
    s.header("x-resume-class").map(str::to_string)
}

/// Blocks (bounded by the read timeout) for the next event's ID; None on EOF.
fn next_id(s: &mut Sse) -> Option<String> {
    loop {
        if let Some(id) = s.next_event()?.id {
            return Some(id);
        }
    }
}

/// Replay (no parked window, the successor is in the log), up-to-date (the newest ID) and no
/// header at all on a subscription that is not a resume, by header and by query parameter.
#[test]
fn replay_and_up_to_date_resumes_say_so() {
    let g = Gateway::start(&["--cores", "1", "--fsync", "never"]);
    let ids = publish_batch(g.addr, "rc", &["a".into(), "b".into(), "c".into()]);

    let plain = Sse::open(g.addr, "/v1/streams/rc?from=earliest", None);
    assert_eq!((plain.status, class(&plain)), (200, None));

    let mut replay = Sse::open(g.addr, "/v1/streams/rc", Some(&ids[0]));
    assert_eq!(replay.status, 200);
    assert_eq!(class(&replay).as_deref(), Some("replay"));
    assert_eq!(next_id(&mut replay).as_deref(), Some(ids[1].as_str()));

    let by_query = Sse::open(
        g.addr,
        &format!("/v1/streams/rc?last_event_id={}", ids[1]),
        None,
    );
    assert_eq!(class(&by_query).as_deref(), Some("replay"));

    let mut latest = Sse::open(g.addr, "/v1/streams/rc", Some(&ids[2]));
    assert_eq!(latest.status, 200);
    assert_eq!(class(&latest).as_deref(), Some("up-to-date"));
    let id4 = publish(g.addr, "rc", "d");
    assert_eq!(next_id(&mut latest).as_deref(), Some(id4.as_str()));

    assert_eq!(g.metric("gateway_resumes_total", "class=\"replay\""), 2);
    assert_eq!(g.metric("gateway_resumes_total", "class=\"up_to_date\""), 1);
    assert_eq!(g.metric("gateway_resumes_total", "class=\"aligned\""), 0);
}

/// The in-band truncated answer (`?on_truncated=earliest`) is a 200 that says `truncated`; the
/// default answer is a 410 without the header.
#[test]
fn truncated_in_band_resume_says_truncated() {
    let g = Gateway::start(&[
        "--cores",
        "1",
        "--fsync",
        "never",
        "--segment-bytes",
        "65536",
        "--retain-bytes",
        "65536",
    ]);
    let first = publish(g.addr, "tr", "x");
    let payload = "t".repeat(500);
    let mut floor = 1;
    for round in 0..300 {
        if round > 20 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let datas: Vec<String> = (0..100).map(|_| payload.clone()).collect();
        publish_batch(g.addr, "tr", &datas);
        let (_, _, body) = request(
            g.addr,
            "GET",
            &format!("/v1/streams/tr?last_event_id={first}"),
            &[],
            b"",
        );
        if let Some(f) = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["floor"].as_u64())
        {
            floor = f;
            break;
        }
    }
    assert!(floor > 2, "retention never deleted the first event");
    let gone = Sse::open(g.addr, "/v1/streams/tr", Some(&first));
    assert_eq!((gone.status, class(&gone)), (410, None));
    let mut s = Sse::open(g.addr, "/v1/streams/tr?on_truncated=earliest", Some(&first));
    assert_eq!(s.status, 200);
    assert_eq!(class(&s).as_deref(), Some("truncated"));
    assert!(seq_of(&next_id(&mut s).unwrap()) >= floor);
}

/// The parked-window setup of `e2e.rs` (`parked_window_resume`): a client that lets the server
/// fill its socket, drains what arrived and leaves; resumes that the server can serve from the
/// parked window say `aligned`, the others `replay`, and the headers seen equal the counters.
#[test]
fn parked_window_resume_says_aligned() {
    let g = start_for_parked_window(&[]);
    let n = 20_000usize;
    publish_numbered(g.addr, "park", 0, n as u64, &"z".repeat(200));
    let mut got: Vec<u64> = Vec::new();
    let mut last: Option<String> = None;
    let (mut aligned, mut replay, mut up_to_date) = (0u64, 0u64, 0u64);
    for _attempt in 0..2000 {
        if got.len() >= n {
            break;
        }
        let mut s = Sse::open(g.addr, "/v1/streams/park?from=earliest", last.as_deref());
        assert_eq!(s.status, 200);
        match (last.is_some(), class(&s).as_deref()) {
            (false, None) => {}
            (true, Some("aligned")) => aligned += 1,
            (true, Some("replay")) => replay += 1,
            (true, Some("up-to-date")) => up_to_date += 1,
            (resumed, other) => panic!("resume={resumed}: unexpected X-Resume-Class {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
        s.drain_nonblocking(128 << 10);
        while let Some(e) = s.take_buffered() {
            if let Some(id) = e.id {
                got.push(seq_of(&id));
                last = Some(id);
            }
        }
    }
    assert_eq!(got.len(), n);
    assert!(
        got.iter().enumerate().all(|(i, &s)| s == i as u64 + 1),
        "gap or duplicate"
    );
    eprintln!("headers: aligned={aligned} replay={replay} up-to-date={up_to_date}");
    assert!(aligned > 0, "no resume said aligned (replay={replay})");
    assert_eq!(
        (aligned, replay, up_to_date),
        (
            g.metric("gateway_resumes_total", "class=\"aligned\""),
            g.metric("gateway_resumes_total", "class=\"replay\""),
            g.metric("gateway_resumes_total", "class=\"up_to_date\""),
        )
    );
}
