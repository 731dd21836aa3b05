//! Unit tests of the connection machine, driven without sockets: bytes in, steps and
//! answers out, time on a fake clock.

use super::*;

fn limits() -> ConnLimits {
    ConnLimits {
        head: HeadLimits {
            header_bytes_max: 8192,
            header_count_max: 64,
        },
        event_bytes_max: 65536,
        batch_bytes_max: 1 << 20,
        answer_bytes_max: 1024,
        mcp: Some(("/mcp".into(), 4096)),
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        body_timeout: Duration::from_secs(30),
    }
}

fn local(_: Target<'_>) -> Option<usize> {
    None
}

/// A gate with no access control and no allowed origin (the default flags).
fn open_gate() -> Gate {
    let v = auth::Verifier::load(&auth::AuthSettings::default()).expect("no files to read");
    Gate::new(Vec::new().into(), auth::Auth::new(std::sync::Arc::new(v)))
}

/// Feeds `bytes` as one receive: polls for the receive step, writes the bytes into its
/// buffer, completes it.
fn feed(c: &mut HttpConn, bytes: &[u8], now: Instant, lim: &ConnLimits) {
    match c.poll(now, lim, &local, &mut open_gate()) {
        Step::Recv { mut buf, from } => {
            buf[from..from + bytes.len()].copy_from_slice(bytes);
            c.on_recv(buf, bytes.len(), now);
        }
        other => panic!("expected a receive step, got {other:?}"),
    }
}

/// Sends everything ready, completely; returns the bytes.
fn drain(c: &mut HttpConn, now: Instant) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some((buf, from)) = c.poll_transmit() {
        out.extend_from_slice(&buf[from..]);
        let n = buf.len() - from;
        c.on_sent(buf, n, now);
    }
    out
}

fn publish(stream: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /v1/streams/{stream}/events HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn request(c: &mut HttpConn, now: Instant, lim: &ConnLimits) -> Request {
    match c.poll(now, lim, &local, &mut open_gate()) {
        Step::Request(r) => r,
        other => panic!("expected a request, got {other:?}"),
    }
}

#[test]
fn pipelined_requests_come_out_in_order_and_answers_keep_it() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let mut bytes = publish("a", "one");
    bytes.extend(publish("a", "two"));
    bytes.extend(b"GET /healthz HTTP/1.1\r\n\r\n");
    feed(&mut c, &bytes, t0, &lim);
    let bodies: Vec<Vec<u8>> = (0..3).map(|_| request(&mut c, t0, &lim).body).collect();
    assert_eq!(bodies, vec![b"one".to_vec(), b"two".to_vec(), Vec::new()]);
    // The first answer waits for durability: it holds back the two after it.
    let w = Wait::Durable {
        shard: 0,
        stream: 1,
        seq: 1,
    };
    c.answer(b"A1".to_vec(), Some(w), false);
    c.answer(b"A2".to_vec(), None, false);
    c.answer(b"A3".to_vec(), None, false);
    assert!(
        drain(&mut c, t0).is_empty(),
        "nothing passes a waiting answer"
    );
    assert_eq!(
        c.release_waits(|x| matches!(x, Wait::Durable { seq, .. } if seq > 1)),
        Released {
            some: false,
            still_waiting: true
        },
        "not visible yet: still waiting"
    );
    assert!(drain(&mut c, t0).is_empty());
    assert_eq!(
        c.release_waits(|x| matches!(x, Wait::Durable { seq, .. } if seq <= 1)),
        Released {
            some: true,
            still_waiting: false
        }
    );
    assert_eq!(drain(&mut c, t0), b"A1A2A3");
    assert!(matches!(
        c.poll(t0, &lim, &local, &mut open_gate()),
        Step::Recv { .. }
    ));
}

#[test]
fn pipelining_stops_reading_at_the_answer_cap_and_resumes_when_answers_leave() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let mut bytes = Vec::new();
    for _ in 0..3 {
        bytes.extend(b"GET /healthz HTTP/1.1\r\n\r\n");
    }
    feed(&mut c, &bytes, t0, &lim);
    let _ = request(&mut c, t0, &lim);
    c.answer(vec![b'x'; lim.answer_bytes_max], None, false);
    // Answers at the cap: the next buffered request is not read.
    assert!(matches!(
        c.poll(t0, &lim, &local, &mut open_gate()),
        Step::Wait
    ));
    // A send in flight still counts until the kernel takes it.
    let (buf, from) = c.poll_transmit().expect("ready");
    assert_eq!(c.answer_bytes(), lim.answer_bytes_max);
    assert!(matches!(
        c.poll(t0, &lim, &local, &mut open_gate()),
        Step::Wait
    ));
    // A partial send: still over the cap by what is left.
    c.on_sent(buf, 10, t0);
    assert_eq!(c.answer_bytes(), lim.answer_bytes_max - 10);
    let (buf, from2) = c.poll_transmit().expect("the rest");
    assert_eq!((from, from2), (0, 10));
    let n = buf.len() - from2;
    c.on_sent(buf, n, t0);
    assert_eq!(c.answer_bytes(), 0);
    let _ = request(&mut c, t0, &lim);
    let _ = request(&mut c, t0, &lim);
}

#[test]
fn expect_continue_is_answered_once_before_the_body() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let head =
        b"POST /v1/streams/a/events HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n";
    feed(&mut c, head, t0, &lim);
    let Step::Recv { mut buf, from } = c.poll(t0, &lim, &local, &mut open_gate()) else {
        panic!("waits for the body");
    };
    assert_eq!(drain(&mut c, t0), CONTINUE, "100 Continue goes out first");
    buf[from..from + 2].copy_from_slice(b"he");
    c.on_recv(buf, 2, t0);
    // Still awaiting the body: another receive, and no second 100.
    assert!(matches!(
        c.poll(t0, &lim, &local, &mut open_gate()),
        Step::Recv { .. }
    ));
    assert!(drain(&mut c, t0).is_empty());
}

#[test]
fn expect_continue_body_arrives_whole() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let head =
        b"POST /v1/streams/a/events HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n";
    feed(&mut c, head, t0, &lim);
    feed(&mut c, b"hello", t0, &lim);
    assert_eq!(request(&mut c, t0, &lim).body, b"hello");
    assert_eq!(drain(&mut c, t0), CONTINUE);
}

#[test]
fn an_incomplete_head_times_out_with_408_exactly_at_the_deadline() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    feed(&mut c, b"GET /healthz HTTP/1.1\r\nHost:", t0, &lim);
    let Step::Recv { buf, .. } = c.poll(t0, &lim, &local, &mut open_gate()) else {
        panic!("waits for the rest of the head");
    };
    let just_before = t0 + lim.header_timeout - Duration::from_millis(1);
    assert_eq!(c.on_tick(just_before, &lim), Deadline::None);
    assert_eq!(c.on_tick(t0 + lim.header_timeout, &lim), Deadline::TimedOut);
    // The receive still holds the buffer: the 408 goes out anyway, then the connection closes.
    drop(buf);
    let out = drain(&mut c, t0);
    assert!(
        out.starts_with(b"HTTP/1.1 408 "),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert!(c.done(false));
}

#[test]
fn a_body_in_progress_is_under_the_idle_timeout_not_the_header_timeout() {
    let (mut lim, t0) = (limits(), Instant::now());
    lim.body_timeout = lim.idle_timeout * 2;
    let mut c = HttpConn::new(Vec::new(), t0);
    feed(
        &mut c,
        b"POST /v1/streams/a/events HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc",
        t0,
        &lim,
    );
    let _recv = c.poll(t0, &lim, &local, &mut open_gate());
    assert_eq!(c.on_tick(t0 + lim.header_timeout * 2, &lim), Deadline::None);
    assert_eq!(c.on_tick(t0 + lim.idle_timeout, &lim), Deadline::Idle);
}

/// Polls for the receive step (the machine holds no buffer until it is completed).
fn recv_step(c: &mut HttpConn, now: Instant, lim: &ConnLimits) -> (Vec<u8>, usize) {
    match c.poll(now, lim, &local, &mut open_gate()) {
        Step::Recv { buf, from } => (buf, from),
        other => panic!("expected a receive step, got {other:?}"),
    }
}

/// Completes the receive `r` with `bytes`.
fn complete(c: &mut HttpConn, r: (Vec<u8>, usize), bytes: &[u8], now: Instant) {
    let (mut buf, from) = r;
    buf[from..from + bytes.len()].copy_from_slice(bytes);
    c.on_recv(buf, bytes.len(), now);
}

#[test]
fn a_trickled_body_gets_408_at_the_body_deadline_however_often_bytes_arrive() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let head = b"POST /v1/streams/a/events HTTP/1.1\r\nContent-Length: 100\r\n\r\n";
    feed(&mut c, head, t0, &lim);
    let mut r = recv_step(&mut c, t0, &lim);
    // One byte a second: every receive restarts the idle timer, never the body's.
    for i in 1..lim.body_timeout.as_secs() {
        let t = t0 + Duration::from_secs(i);
        complete(&mut c, r, b"x", t);
        r = recv_step(&mut c, t, &lim);
        assert_eq!(c.on_tick(t, &lim), Deadline::None, "at {i} s");
    }
    let t_end = t0 + lim.body_timeout;
    assert_eq!(c.on_tick(t_end, &lim), Deadline::BodyTimedOut);
    assert_eq!(c.on_tick(t_end, &lim), Deadline::None, "counted once");
    drop(r);
    let out = drain(&mut c, t_end);
    let text = String::from_utf8_lossy(&out);
    assert!(out.starts_with(b"HTTP/1.1 408 "), "{text}");
    assert!(text.contains("--body-timeout-secs"), "{text}");
    assert!(c.done(false));
}

#[test]
fn the_body_deadline_is_per_request_on_a_keep_alive_connection() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let head = "POST /v1/streams/a/events HTTP/1.1\r\nContent-Length: 2\r\n\r\n";
    feed(&mut c, format!("{head}x").as_bytes(), t0, &lim);
    let r = recv_step(&mut c, t0, &lim);
    let t1 = t0 + lim.body_timeout - Duration::from_secs(1);
    complete(&mut c, r, b"y", t1);
    assert_eq!(request(&mut c, t1, &lim).body, b"xy");
    // The next request's body starts its own deadline.
    let t2 = t1 + Duration::from_secs(1);
    feed(&mut c, head.as_bytes(), t2, &lim);
    let _r = recv_step(&mut c, t2, &lim);
    assert_eq!(c.on_tick(t0 + lim.body_timeout, &lim), Deadline::None);
    assert_eq!(
        c.on_tick(t2 + lim.body_timeout, &lim),
        Deadline::BodyTimedOut
    );
}

#[test]
fn an_idle_keep_alive_connection_closes_after_the_idle_timeout() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let _recv = c.poll(t0, &lim, &local, &mut open_gate());
    let t1 = t0 + lim.idle_timeout - Duration::from_millis(1);
    assert_eq!(c.on_tick(t1, &lim), Deadline::None);
    assert_eq!(c.on_tick(t0 + lim.idle_timeout, &lim), Deadline::Idle);
}

#[test]
fn no_deadline_runs_while_answers_are_pending() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    feed(&mut c, b"GET /healthz HTTP/1.1\r\n\r\nGET /hea", t0, &lim);
    let _ = request(&mut c, t0, &lim);
    c.answer(b"ok".to_vec(), None, false);
    assert_eq!(c.on_tick(t0 + lim.idle_timeout * 2, &lim), Deadline::None);
}

#[test]
fn a_request_for_another_core_hands_over_every_unconsumed_byte() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let mut bytes = b"GET /healthz HTTP/1.1\r\n\r\n".to_vec();
    let second = publish("elsewhere", "x");
    bytes.extend(&second);
    feed(&mut c, &bytes, t0, &lim);
    let remote = |t: Target<'_>| (t == Target::Stream("elsewhere")).then_some(3);
    let Step::Request(_) = c.poll(t0, &lim, &remote, &mut open_gate()) else {
        panic!("the local request first")
    };
    // An answer queued: the handoff waits for it to leave.
    c.answer(b"ok".to_vec(), None, false);
    assert!(matches!(
        c.poll(t0, &lim, &remote, &mut open_gate()),
        Step::Wait
    ));
    assert_eq!(drain(&mut c, t0), b"ok");
    match c.poll(t0, &lim, &remote, &mut open_gate()) {
        Step::HandOff { owner, bytes } => assert_eq!((owner, bytes), (3, second)),
        other => panic!("expected a handoff, got {other:?}"),
    }
}

#[test]
fn a_subscribe_waits_for_earlier_answers() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let mut bytes = publish("a", "x");
    bytes.extend(b"GET /v1/streams/a HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n");
    feed(&mut c, &bytes, t0, &lim);
    let _ = request(&mut c, t0, &lim);
    c.answer(b"201".to_vec(), None, false);
    assert!(matches!(
        c.poll(t0, &lim, &local, &mut open_gate()),
        Step::Wait
    ));
    drain(&mut c, t0);
    let r = request(&mut c, t0, &lim);
    assert!(matches!(
        r.kind,
        Kind::Api {
            route: Route::Subscribe { .. },
            ..
        }
    ));
}

#[test]
fn an_oversized_body_is_refused_with_413_and_close() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let head = format!(
        "POST /v1/streams/a/events HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        lim.event_bytes_max + 1
    );
    feed(&mut c, head.as_bytes(), t0, &lim);
    assert!(matches!(
        c.poll(t0, &lim, &local, &mut open_gate()),
        Step::Wait
    ));
    let out = drain(&mut c, t0);
    assert!(out.starts_with(b"HTTP/1.1 413 "));
    assert!(c.done(false));
}

#[test]
fn a_route_error_without_body_keeps_the_connection_and_reads_on() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    feed(
        &mut c,
        b"GET /nowhere HTTP/1.1\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n",
        t0,
        &lim,
    );
    let _ = request(&mut c, t0, &lim);
    let out = drain(&mut c, t0);
    assert!(out.starts_with(b"HTTP/1.1 404 "));
    assert!(!c.done(false));
}

#[test]
fn an_mcp_request_carries_its_head_and_body() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let req = b"POST /mcp HTTP/1.1\r\nContent-Length: 2\r\nMcp-Session-Id: s\r\n\r\n{}";
    feed(&mut c, req, t0, &lim);
    let r = request(&mut c, t0, &lim);
    match r.kind {
        Kind::Mcp { head } => assert_eq!(head, &req[..req.len() - 2]),
        other => panic!("expected MCP, got {other:?}"),
    }
    assert_eq!(r.body, b"{}");
}

#[test]
fn a_large_body_buffer_shrinks_back_after_the_request() {
    let lim = ConnLimits {
        event_bytes_max: 1 << 20,
        ..limits()
    };
    let t0 = Instant::now();
    let mut c = HttpConn::new(Vec::new(), t0);
    let body = "x".repeat(RECV_BYTES_KEEP_MAX + 1);
    let req = publish("a", &body);
    let mut sent = 0;
    while sent < req.len() {
        let Step::Recv { mut buf, from } = c.poll(t0, &lim, &local, &mut open_gate()) else {
            panic!("receiving");
        };
        let n = (buf.len() - from).min(req.len() - sent);
        buf[from..from + n].copy_from_slice(&req[sent..sent + n]);
        sent += n;
        c.on_recv(buf, n, t0);
    }
    assert_eq!(request(&mut c, t0, &lim).body.len(), body.len());
    let Step::Recv { buf, .. } = c.poll(t0, &lim, &local, &mut open_gate()) else {
        panic!("receiving");
    };
    assert!(buf.len() <= lim.head.header_bytes_max, "{}", buf.len());
}

#[test]
fn a_failed_wait_turns_its_answer_into_the_error_in_place() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    feed(&mut c, &publish("a", "x"), t0, &lim);
    let _ = request(&mut c, t0, &lim);
    let lost = Wait::Durable {
        shard: 3,
        stream: 1,
        seq: 7,
    };
    let kept = Wait::Applied {
        shard: 4,
        ticket: 7,
    };
    c.answer(b"201-lost".to_vec(), Some(lost), false);
    c.answer(b"201-kept".to_vec(), Some(kept), false);
    c.fail_waits(
        |w| w.shard() == 3,
        |close| format!("500 close={close}").into_bytes(),
    );
    assert_eq!(
        drain(&mut c, t0),
        b"500 close=false",
        "the error leaves; the next still waits"
    );
    assert_eq!(c.answer_bytes(), b"201-kept".len());
    assert_eq!(
        c.release_waits(|_| true),
        Released {
            some: true,
            still_waiting: false
        }
    );
    assert_eq!(drain(&mut c, t0), b"201-kept");
}

#[test]
fn a_declared_body_is_buffered_only_as_its_bytes_arrive() {
    let lim = ConnLimits {
        batch_bytes_max: 4 << 20,
        ..limits()
    };
    let t0 = Instant::now();
    let mut c = HttpConn::new(Vec::new(), t0);
    let head = format!(
        "POST /v1/streams/a/events:batch HTTP/1.1\r\nContent-Length: {}\r\n\r\n{{",
        4 << 20
    );
    feed(&mut c, head.as_bytes(), t0, &lim);
    let Step::Recv { buf, from } = c.poll(t0, &lim, &local, &mut open_gate()) else {
        panic!("waits for the body");
    };
    assert!(
        buf.len() <= head.len() + BODY_GROWTH_BYTES_MIN,
        "4 MiB declared, 1 byte sent: a {} byte buffer",
        buf.len()
    );
    // Each receive that fills the buffer lets it grow (doubling), never past the request.
    let mut have = from;
    let mut buf = buf;
    let total = head.len() - 1 + (4 << 20);
    while have < total {
        let n = buf.len() - have;
        c.on_recv(buf, n, t0);
        have += n;
        match c.poll(t0, &lim, &local, &mut open_gate()) {
            Step::Recv { buf: b, from } => {
                assert_eq!(from, have);
                assert!(b.len() <= total && b.len() <= 2 * have.max(BODY_GROWTH_BYTES_MIN));
                buf = b;
            }
            Step::Request(r) => {
                assert_eq!(r.body.len(), 4 << 20);
                return;
            }
            other => panic!("{other:?}"),
        }
    }
    panic!("the request never completed");
}

/// The body budget (`--request-buffer-bytes-max`): a body reserves its whole size before its
/// buffer grows; a second body that does not fit waits (no receive armed) with what it has,
/// and goes on once the first gives its reservation back — so connections cannot each hold a
/// part of the budget while all wait for more.
#[test]
fn body_budget_admits_whole_bodies_and_starved_ones_resume() {
    let lim = limits();
    let t0 = Instant::now();
    let budget = std::sync::Arc::new(BodyBudget::new(300 * 1024));
    let body = "x".repeat(200 * 1024);
    let req = format!(
        "POST /v1/streams/a/events:batch HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut a = HttpConn::new(Vec::new(), t0);
    let mut b = HttpConn::new(Vec::new(), t0);
    a.set_budget(budget.clone());
    b.set_budget(budget.clone());
    // Both send the head and a full head buffer of body.
    let first = format!("{req}{}", &body[..8192 - req.len()]);
    feed(&mut a, first.as_bytes(), t0, &lim);
    feed(&mut b, first.as_bytes(), t0, &lim);
    // `a` reserves its body; `b` cannot and waits, starved.
    assert!(matches!(
        a.poll(t0, &lim, &local, &mut open_gate()),
        Step::Recv { .. }
    ));
    assert!(matches!(
        b.poll(t0, &lim, &local, &mut open_gate()),
        Step::Wait
    ));
    assert!(b.starved() && !a.starved());
    // `a` ends (its reservation is given back): `b` goes on and gets its whole body.
    drop(a);
    let gives = budget.gives();
    assert!(gives > 0);
    let mut have = 8192;
    let mut step = b.poll(t0, &lim, &local, &mut open_gate());
    loop {
        match step {
            Step::Recv { mut buf, from } => {
                let total = req.len() + body.len();
                let n = (buf.len() - from).min(total - have);
                buf[from..from + n].copy_from_slice(
                    &req.as_bytes()
                        .iter()
                        .chain(body.as_bytes())
                        .copied()
                        .collect::<Vec<u8>>()[have..have + n],
                );
                have += n;
                b.on_recv(buf, n, t0);
            }
            Step::Request(r) => {
                assert_eq!(r.body, body.as_bytes());
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
        step = b.poll(t0, &lim, &local, &mut open_gate());
    }
    assert!(!b.starved());
}

/// A chunked publish's head (HTTP/1.1, no Content-Length).
fn chunked_head(path: &str) -> String {
    format!("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
}

#[test]
fn a_chunked_body_arriving_in_pieces_is_one_request_and_the_next_one_follows() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let mut bytes = chunked_head("/v1/streams/a/events").into_bytes();
    bytes.extend(b"3;x=y\r\nhel\r\n2\r\nlo\r\n0\r\nT: 1\r\n\r\n");
    bytes.extend(publish("a", "next"));
    let (first, second) = bytes.split_at(50);
    feed(&mut c, first, t0, &lim);
    let r = recv_step(&mut c, t0, &lim);
    complete(&mut c, r, second, t0);
    let req = request(&mut c, t0, &lim);
    assert_eq!(req.body, b"hello");
    assert!(matches!(
        req.kind,
        Kind::Api {
            route: Route::Publish { .. },
            ..
        }
    ));
    assert_eq!(request(&mut c, t0, &lim).body, b"next");
}

#[test]
fn a_chunked_body_over_the_limit_is_refused_with_413_and_close() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let mut bytes = chunked_head("/v1/streams/a/events").into_bytes();
    bytes.extend(format!("{:x}\r\n", lim.event_bytes_max + 1).as_bytes());
    feed(&mut c, &bytes, t0, &lim);
    assert!(matches!(
        c.poll(t0, &lim, &local, &mut open_gate()),
        Step::Wait
    ));
    let out = drain(&mut c, t0);
    assert!(
        out.starts_with(b"HTTP/1.1 413 "),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert!(c.done(false));
}

#[test]
fn a_chunked_body_where_none_is_taken_is_refused_and_closes() {
    // No body taken (413), refused by the router with its body unread (405), MCP (411).
    for (method, path, status) in [
        ("DELETE", "/v1/streams/a", "413"),
        ("POST", "/v1/streams/a", "405"),
        ("POST", "/mcp", "411"),
    ] {
        let (lim, t0) = (limits(), Instant::now());
        let mut c = HttpConn::new(Vec::new(), t0);
        let head = chunked_head(path).replacen("POST", method, 1);
        feed(&mut c, format!("{head}0\r\n\r\n").as_bytes(), t0, &lim);
        assert!(matches!(
            c.poll(t0, &lim, &local, &mut open_gate()),
            Step::Wait
        ));
        let out = String::from_utf8(drain(&mut c, t0)).unwrap();
        assert!(
            out.starts_with(&format!("HTTP/1.1 {status} ")),
            "{path}: {out}"
        );
        assert!(c.done(false), "{path}");
    }
}

#[test]
fn a_chunked_publish_for_another_core_hands_over_its_raw_bytes() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let mut bytes = chunked_head("/v1/streams/elsewhere/events").into_bytes();
    bytes.extend(b"5\r\nhel");
    feed(&mut c, &bytes, t0, &lim);
    let remote = |t: Target<'_>| (t == Target::Stream("elsewhere")).then_some(2);
    match c.poll(t0, &lim, &remote, &mut open_gate()) {
        Step::HandOff { owner, bytes: b } => assert_eq!((owner, b), (2, bytes)),
        other => panic!("expected a handoff, got {other:?}"),
    }
}

#[test]
fn a_chunked_body_without_its_final_chunk_gets_408_at_the_body_deadline() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let mut bytes = chunked_head("/v1/streams/a/events").into_bytes();
    bytes.extend(b"5\r\nhello\r\n");
    feed(&mut c, &bytes, t0, &lim);
    let _r = recv_step(&mut c, t0, &lim);
    assert_eq!(
        c.on_tick(t0 + lim.body_timeout, &lim),
        Deadline::BodyTimedOut
    );
}

/// Feeds `input[*have..]` through receives as large as the machine offers, until a step
/// other than a receive comes out.
fn pump(c: &mut HttpConn, input: &[u8], have: &mut usize, now: Instant, lim: &ConnLimits) -> Step {
    loop {
        match c.poll(now, lim, &local, &mut open_gate()) {
            Step::Recv { mut buf, from } => {
                let n = (buf.len() - from).min(input.len() - *have);
                assert!(n > 0, "the input ran out before a request");
                buf[from..from + n].copy_from_slice(&input[*have..*have + n]);
                *have += n;
                c.on_recv(buf, n, now);
            }
            other => return other,
        }
    }
}

/// A chunked batch larger than the head buffer reserves the most its buffer can hold (the
/// batch limit and one line of framing) from the body budget, like a `Content-Length` body
/// reserves its size: a second one waits, starved, until the first gives its reservation back.
#[test]
fn a_chunked_body_takes_its_buffer_from_the_body_budget() {
    let (lim, t0) = (limits(), Instant::now());
    let cap = lim.batch_bytes_max + 2 * lim.head.header_bytes_max;
    let budget = std::sync::Arc::new(BodyBudget::new(cap as u64));
    let mut input = chunked_head("/v1/streams/a/events:batch").into_bytes();
    let body: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    for chunk in body.chunks(4000) {
        input.extend(format!("{:x}\r\n", chunk.len()).as_bytes());
        input.extend(chunk);
        input.extend(b"\r\n");
    }
    input.extend(b"0\r\n\r\n");
    let (mut a, mut b) = (HttpConn::new(Vec::new(), t0), HttpConn::new(Vec::new(), t0));
    a.set_budget(budget.clone());
    b.set_budget(budget.clone());
    // `a` fills its head buffer and reserves; `b` then fills its own and waits, starved.
    feed(&mut a, &input[..lim.head.header_bytes_max], t0, &lim);
    let ra = recv_step(&mut a, t0, &lim);
    let mut have = 0;
    assert!(matches!(
        pump(&mut b, &input, &mut have, t0, &lim),
        Step::Wait
    ));
    assert!(b.starved());
    drop(ra);
    drop(a);
    let Step::Request(req) = pump(&mut b, &input, &mut have, t0, &lim) else {
        panic!("the body completes once the budget is back");
    };
    assert_eq!(req.body, body);
    assert_eq!(have, input.len());
}

/// A complete body whose request waits for earlier answers (it moves the connection to
/// another core) is past the client's part: its body deadline no longer runs.
#[test]
fn a_complete_body_waiting_for_earlier_answers_does_not_time_out() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let mut bytes = b"GET /healthz HTTP/1.1\r\n\r\n".to_vec();
    let second = publish("elsewhere", "xy");
    bytes.extend(&second[..second.len() - 1]);
    feed(&mut c, &bytes, t0, &lim);
    let remote = |t: Target<'_>| (t == Target::Stream("elsewhere")).then_some(1);
    let Step::Request(_) = c.poll(t0, &lim, &remote, &mut open_gate()) else {
        panic!("the local request first")
    };
    c.answer(b"ok".to_vec(), None, false); // not sent yet: the connection is busy
    let Step::Recv { mut buf, from } = c.poll(t0, &lim, &remote, &mut open_gate()) else {
        panic!("receives the rest of the body")
    };
    buf[from] = b'y';
    c.on_recv(buf, 1, t0);
    assert!(matches!(
        c.poll(t0, &lim, &remote, &mut open_gate()),
        Step::Wait
    ));
    assert_eq!(c.on_tick(t0 + lim.body_timeout, &lim), Deadline::None);
    assert_eq!(drain(&mut c, t0), b"ok");
    match c.poll(t0, &lim, &remote, &mut open_gate()) {
        Step::HandOff { owner, bytes } => assert_eq!((owner, bytes), (1, second)),
        other => panic!("expected a handoff, got {other:?}"),
    }
}

#[test]
fn the_peers_end_closes_after_every_answer_to_what_it_sent() {
    let (lim, t0) = (limits(), Instant::now());
    let mut c = HttpConn::new(Vec::new(), t0);
    let mut bytes = publish("a", "one");
    bytes.extend(b"GET /nowhere HTTP/1.1\r\n\r\n");
    feed(&mut c, &bytes, t0, &lim);
    let _ = request(&mut c, t0, &lim);
    let w = Wait::Durable {
        shard: 0,
        stream: 1,
        seq: 1,
    };
    c.answer(b"A1".to_vec(), Some(w), false);
    // The route error is answered by the machine; then it wants more bytes and the receive
    // comes back empty (FIN, close_notify).
    let (buf, _) = recv_step(&mut c, t0, &lim);
    assert!(
        c.close_after_answers(buf),
        "answers are pending: not closing yet"
    );
    assert!(matches!(
        c.poll(t0, &lim, &local, &mut open_gate()),
        Step::Wait
    ));
    assert!(drain(&mut c, t0).is_empty() && !c.done(false));
    c.release_waits(|_| true);
    let out = String::from_utf8(drain(&mut c, t0)).unwrap();
    assert!(out.starts_with("A1HTTP/1.1 404"), "{out}");
    assert!(c.done(false), "closes once the last answer is out");

    // Nothing pending: close at once.
    let mut idle = HttpConn::new(Vec::new(), t0);
    let (buf, _) = recv_step(&mut idle, t0, &lim);
    assert!(!idle.close_after_answers(buf));
}
