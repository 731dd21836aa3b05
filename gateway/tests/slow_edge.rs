//! Slow clients at the edge, over loopback: bodies trickled one byte at a time get 408 at
//! `--body-timeout-secs` and free their connection, and the admin listener keeps answering
//! `/healthz` while many clients trickle heads at it. Every wait is bounded; no assertion is
//! on a duration.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use common::{Gateway, connect, read_response};

/// A publish head declaring a 100-byte body, of which nothing is sent yet.
const SLOW_PUBLISH: &[u8] =
    b"POST /v1/streams/slow/events HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n";

/// Writes `head`, then one byte every `every` until a write fails (the peer closed) or `stop`
/// is set; returns how many body bytes went out.
fn trickle(mut s: TcpStream, head: &[u8], every: Duration, stop: Arc<AtomicBool>) -> usize {
    if s.write_all(head).is_err() {
        return 0;
    }
    let mut sent = 0;
    while !stop.load(Relaxed) {
        std::thread::sleep(every);
        if s.write_all(b"x").is_err() {
            break;
        }
        sent += 1;
    }
    sent
}

/// A publish on a fresh connection: its status, or `None` if the connection was refused or
/// closed without an answer.
fn try_publish(addr: SocketAddr) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(
        b"POST /v1/streams/ok/events HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
    )
    .ok()?;
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let line = std::str::from_utf8(all.split(|&b| b == b'\r').next()?).ok()?;
    line.split(' ').nth(1)?.parse().ok()
}

/// One byte a second with `--body-timeout-secs 2`: every byte restarts the idle timer, yet
/// the request gets 408 and the connection closes, and it is counted.
#[test]
fn a_body_trickled_byte_by_byte_gets_408_and_the_connection_closes() {
    let g = Gateway::start(&["--cores", "1", "--body-timeout-secs", "2"]);
    let s = connect(g.addr);
    let reader = s.try_clone().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || trickle(s, SLOW_PUBLISH, Duration::from_secs(1), stop))
    };
    // Bounded by the read timeout (20 s): the old code answered nothing before 100 bytes.
    let mut r = BufReader::new(reader);
    let (st, _, body) = read_response(&mut r);
    assert_eq!(st, 408, "{}", String::from_utf8_lossy(&body));
    assert_eq!(common::json(&body)["error"], "request_timeout");
    let mut rest = Vec::new();
    let n = r.read_to_end(&mut rest);
    assert!(
        matches!(n, Ok(0)) || n.is_err() && rest.is_empty(),
        "the connection closes after the 408: {n:?} {rest:?}"
    );
    stop.store(true, Relaxed);
    let sent = writer.join().unwrap();
    assert!(sent < 100, "the body was never complete ({sent} bytes)");
    assert_eq!(
        g.metric("gateway_request_timeouts_total", "phase=\"body\""),
        1
    );
    // Nothing was appended for it.
    assert_eq!(common::request(g.addr, "GET", "/healthz", &[], b"").0, 200);
}

/// `--connections-max 4` and four trickling bodies: a normal client is refused while they
/// hold every slot, and gets in once their body deadline passed, while they keep trickling.
#[test]
fn trickling_bodies_free_their_slots_at_the_body_deadline() {
    let g = Gateway::start(&[
        "--cores",
        "1",
        "--connections-max",
        "4",
        "--body-timeout-secs",
        "2",
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let tricklers: Vec<_> = (0..4)
        .map(|_| {
            let s = connect(g.addr);
            let stop = stop.clone();
            std::thread::spawn(move || trickle(s, SLOW_PUBLISH, Duration::from_secs(1), stop))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while g.metric("gateway_connections", "") < 4 {
        assert!(Instant::now() < deadline, "the tricklers never connected");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Bounded retries: each try takes at most a few seconds, the deadline passes after 2 s.
    let mut got = None;
    while Instant::now() < deadline {
        match try_publish(g.addr) {
            Some(201) => {
                got = Some(201);
                break;
            }
            other => got = other,
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Relaxed);
    for t in tricklers {
        t.join().unwrap();
    }
    assert_eq!(got, Some(201), "a normal client never got a slot back");
    // Every trickler was timed out (bounded wait: their deadlines are within a tick or two).
    while g.metric("gateway_request_timeouts_total", "phase=\"body\"") < 4 {
        assert!(Instant::now() < deadline, "not every trickler timed out");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `GET /healthz` on the admin listener: its status, or `None` if no answer came within
/// `wait` (the connection was closed, or the listener did not serve it in time).
fn healthz(admin: SocketAddr, wait: Duration) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&admin, wait).ok()?;
    s.set_read_timeout(Some(wait)).ok()?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .ok()?;
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let line = std::str::from_utf8(all.split(|&b| b == b'\r').next()?).ok()?;
    line.split(' ').nth(1)?.parse().ok()
}

/// Keeps one admin connection trickling a head that never ends (one byte every 300 ms),
/// reconnecting whenever the listener closes it, until `stop`.
fn admin_trickler(admin: SocketAddr, stop: Arc<AtomicBool>) {
    while !stop.load(Relaxed) {
        let Ok(s) = TcpStream::connect_timeout(&admin, Duration::from_secs(5)) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        trickle(
            s,
            b"GET /healthz HTTP/1.1\r\nX-Slow: ",
            Duration::from_millis(300),
            stop.clone(),
        );
    }
}

/// 50 clients trickle heads at the admin listener, never finishing one: `/healthz` is still
/// answered, again and again, each time within the probe's own wait (5 s, the admin deadline).
/// The old listener served one connection at a time and restarted its timeout on every byte.
#[test]
fn healthz_answers_while_fifty_clients_trickle_at_the_admin_listener() {
    let g = Gateway::start(&["--cores", "1"]);
    let stop = Arc::new(AtomicBool::new(false));
    let tricklers: Vec<_> = (0..50)
        .map(|_| {
            let (admin, stop) = (g.admin_addr, stop.clone());
            std::thread::spawn(move || admin_trickler(admin, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1)); // every trickler connected and sending
    let answers: Vec<_> = (0..10)
        .map(|_| {
            let a = healthz(g.admin_addr, Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(300));
            a
        })
        .collect();
    stop.store(true, Relaxed);
    for t in tricklers {
        t.join().unwrap();
    }
    assert_eq!(answers, vec![Some(200); 10]);
}

/// `--admin-timeout-secs 1`: a client trickling a head is closed once its total deadline
/// passed, however often its bytes arrive; over `--admin-connections-max` a connection is
/// closed at once while the others are served.
#[test]
fn admin_connections_have_a_total_deadline_and_a_cap() {
    let g = Gateway::start(&[
        "--cores",
        "1",
        "--admin-timeout-secs",
        "1",
        "--admin-connections-max",
        "2",
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let s = connect(g.admin_addr);
    let mut reader = s.try_clone().unwrap();
    let writer = {
        let stop = stop.clone();
        let head = b"GET /healthz HTTP/1.1\r\nX-Slow: ".as_slice();
        std::thread::spawn(move || trickle(s, head, Duration::from_millis(300), stop))
    };
    // Bounded by the read timeout (20 s): closed with no answer.
    let mut all = Vec::new();
    let n = reader.read_to_end(&mut all);
    assert!(
        matches!(n, Ok(0)) || n.is_err(),
        "closed at the deadline: {n:?}"
    );
    assert!(all.is_empty(), "{}", String::from_utf8_lossy(&all));
    stop.store(true, Relaxed);
    writer.join().unwrap();

    // Two idle connections take both places: a third is closed at once, unanswered.
    let idle: Vec<_> = (0..2).map(|_| connect(g.admin_addr)).collect();
    std::thread::sleep(Duration::from_millis(200)); // both accepted
    assert_eq!(healthz(g.admin_addr, Duration::from_millis(900)), None);
    drop(idle);
    // Bounded retries until the places are free again (the idle ones end at once or at 1 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = None;
    while got != Some(200) && Instant::now() < deadline {
        got = healthz(g.admin_addr, Duration::from_secs(2));
    }
    assert_eq!(got, Some(200));
}
