//! Attacks on the gateway's memory, over loopback: each asserts that the gateway's RSS stays
//! bounded and that it keeps serving (and losing nothing) afterwards.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{Gateway, connect, publish, request};

/// 1,000 connections each declare a 4 MiB body and send one byte of it: the request buffers
/// grow only with the bytes that arrive, so RSS grows by far less than 1,000 × 4 MiB.
#[test]
fn half_sent_bodies_do_not_exhaust_memory() {
    let g = Gateway::start(&["--cores", "1"]);
    // Warm up the paths a publish takes, so their one-time allocations are not counted.
    publish(g.addr, "warm", "x");
    let before = g.rss_kib();
    let head = format!(
        "POST /v1/streams/victim/events:batch HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{{",
        4 << 20
    );
    let conns: Vec<_> = (0..1000)
        .map(|_| {
            let mut s = connect(g.addr);
            s.write_all(head.as_bytes()).unwrap();
            s
        })
        .collect();
    // Bounded wait until the gateway holds every connection.
    let deadline = Instant::now() + Duration::from_secs(20);
    while g.metric("gateway_connections", "") < 1000 {
        assert!(
            Instant::now() < deadline,
            "the gateway never held 1,000 connections"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300)); // every head parsed, every buffer sized
    let grown_kib = g.rss_kib().saturating_sub(before);
    assert!(
        grown_kib <= 64 * 1024,
        "RSS grew {grown_kib} KiB for 1,000 half-sent 4 MiB bodies"
    );
    // Still serving, and nothing was appended for the half-sent requests.
    assert_eq!(request(g.addr, "GET", "/healthz", &[], b"").0, 200);
    let id = publish(g.addr, "victim", "a real event");
    assert_eq!(
        common::seq_of(&id),
        1,
        "no half-sent request appended anything"
    );
    eprintln!("RSS grew {grown_kib} KiB for 1,000 half-sent 4 MiB bodies");
    drop(conns);
}
