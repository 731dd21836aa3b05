//! Stress end-to-end tests of the reactor's resource handling against the built `gateway`
//! binary over loopback: subscriber sockets do not cost a kernel io-wq thread each (their EOF
//! watch must stay on poll, even with TX ACK timestamps waking the socket on every ACK), a
//! subscriber's hang-up and stray input are still noticed, and a gateway at its descriptor
//! limit (EMFILE on accept) keeps serving and never aborts. No timed assertions: every wait is
//! bounded and only correctness and resource counts are asserted.
#![forbid(unsafe_code)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn threads_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Polls `f` every 20 ms for at most `secs`; returns its last value.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn subscribers_do_not_park_kernel_worker_threads() {
    const SUBS: usize = 64;
    const EVENTS: usize = 100; // batches of 10
    let g = Gateway::start(&["--cores", "1"]);
    let mut subs: Vec<Sse> = (0..SUBS)
        .map(|_| Sse::open(g.addr, "/v1/streams/wq", None))
        .collect();
    assert!(subs.iter().all(|s| s.status == 200));
    // Many small sends and ACKs per subscriber, read while they arrive: every ACK queues a
    // timestamp on the socket's error queue and wakes it.
    let ids: Vec<String> = (0..EVENTS)
        .flat_map(|i| {
            let batch: Vec<String> = (0..10).map(|k| format!("e{i}-{k}")).collect();
            publish_batch(g.addr, "wq", &batch)
        })
        .collect();
    for s in &mut subs {
        for id in &ids {
            assert_eq!(
                s.next_event().expect("event").id.as_deref(),
                Some(id.as_str())
            );
        }
    }
    // Every subscriber got its events and ACKed them; with TX ACK timestamps each ACK woke
    // its socket. A recv punted to io-wq would now hold one kernel thread per subscriber.
    let ts = g.metric("gateway_tx_ack_timestamps_total", "");
    let threads = threads_of(g.child.id());
    eprintln!("tx ack timestamps {ts}, gateway threads {threads}");
    assert!(
        threads < SUBS / 2,
        "{threads} threads for {SUBS} subscribers: subscriber sockets park io-wq workers"
    );
    // Stray input from a subscriber is read and dropped; it keeps receiving.
    subs[0].stream.write_all(b"hello?\r\n").unwrap();
    let id = publish(g.addr, "wq", "after-input");
    for s in &mut subs {
        assert_eq!(
            s.next_event().expect("event").id.as_deref(),
            Some(id.as_str())
        );
    }
    // Hang-ups are still noticed: every subscriber slot is released.
    assert_eq!(g.metric("gateway_subscribers", ""), SUBS as u64);
    drop(subs);
    assert!(
        eventually(20, || g.metric("gateway_subscribers", "") == 0),
        "closed subscribers were not noticed"
    );
    // ... and their slots freed: each close cancels the subscriber's multishot watch and TX
    // timestamp command by user_data, and the slot is released only when those completions
    // arrive. (/metrics is served by the admin listener: no reactor connection remains.)
    assert!(
        eventually(20, || g.metric("gateway_connections", "") == 0),
        "closed subscribers' operations were not cancelled: slots never freed"
    );
}

/// Starts the gateway under `prlimit --nofile=N:N` (it cannot raise its own limit past it).
fn start_with_nofile(
    nofile: u32,
    dir: &std::path::Path,
) -> (std::process::Child, std::net::SocketAddr) {
    let mut child = Command::new("prlimit")
        .arg(format!("--nofile={nofile}:{nofile}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_gateway"))
        .args([
            "--segment-bytes",
            "1048576",
            "--cores",
            "1",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn prlimit gateway");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("first line");
    let addr = listening_addr(&line);
    (child, addr)
}

#[test]
fn descriptor_limit_on_accept_neither_aborts_nor_stops_serving() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("skipped: prlimit (util-linux) not installed");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let (mut child, addr) = start_with_nofile(96, tmp.path());
    // Far more subscribers than descriptors: accepts fail with EMFILE for a while.
    let mut conns: Vec<TcpStream> = Vec::new();
    for i in 0..300 {
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
            continue; // the listen backlog is full: that is the point
        };
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        let req = format!("GET /v1/streams/fd{} HTTP/1.1\r\nHost: t\r\n\r\n", i % 7);
        if s.write_all(req.as_bytes()).is_ok() {
            conns.push(s);
        }
    }
    // Publishing still works through the pressure (answered once descriptors free up).
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().expect("wait").is_none(),
        "gateway died at EMFILE"
    );
    drop(conns);
    let mut served = false;
    let ok = eventually(30, || {
        if child.try_wait().ok().flatten().is_some() {
            return true;
        }
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        served = out.starts_with(b"HTTP/1.1 200");
        served
    });
    let status = child.try_wait().expect("wait");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        status.is_none(),
        "gateway exited at the descriptor limit: {status:?}"
    );
    assert!(ok && served, "gateway stopped serving after EMFILE");
}

#[test]
fn a_second_gateway_cannot_share_the_port() {
    let a = Gateway::start(&["--cores", "2"]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut b = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(["--segment-bytes", "1048576", "--cores", "1", "--listen"])
        .arg(a.addr.to_string())
        .arg("--data-dir")
        .arg(tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn second gateway");
    let exited = eventually(20, || b.try_wait().ok().flatten().is_some());
    if !exited {
        let _ = b.kill();
    }
    let status = b.wait().expect("wait");
    let mut err = String::new();
    let _ = b.stderr.take().expect("stderr").read_to_string(&mut err);
    assert!(
        exited && !status.success(),
        "second gateway started on {}",
        a.addr
    );
    assert!(
        err.contains("another process already listens"),
        "stderr: {err}"
    );
    // The first one still owns every connection: all IDs carry its one epoch.
    let epochs: std::collections::HashSet<String> = (0..8)
        .map(|i| publish(a.addr, "p", &format!("x{i}")))
        .map(|id| id.split('-').next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(epochs.len(), 1, "{epochs:?}");
}
