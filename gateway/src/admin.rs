//! The admin listener (`--admin-listen`, loopback by default): `/metrics` and `/healthz`,
//! served apart from the reactors with blocking sockets. An accept loop hands each connection
//! to a thread of its own, at most `--admin-connections-max` at once (above it a connection is
//! closed at once: the accept loop never waits on a client). Each connection has one total
//! deadline, `--admin-timeout-secs`, for sending its head and taking the answer, however it
//! trickles its bytes, and is closed after one answer. So no set of slow or idle clients delays
//! `/healthz` beyond its deadline: they only take threads, and those are capped.
//!
//! Why threads and not a poll loop: the admin listener serves a few scrapers and balancers'
//! health checks; a thread per connection keeps the blocking code (read, parse, render,
//! write) plain, and the cap bounds the threads. `/metrics` renders for milliseconds, which
//! a poll loop would have to hand to a thread anyway.
//!
//! `/metrics` is not on the public listener: what it shows (stream counts, resume classes,
//! per-stream series when enabled) is for operators.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::core::Shared;
use crate::metrics;
use crate::proto::http::{self, HeadLimits, Method};

/// Bytes of an admin request head.
const HEAD_BYTES_MAX: usize = 8 * 1024;

/// Serves the admin listener until the process exits.
pub fn spawn(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("admin".into())
        .spawn(move || {
            let open = Arc::new(AtomicUsize::new(0));
            for conn in listener.incoming() {
                match conn {
                    Ok(s) => admit(s, &shared, &open),
                    Err(e) => {
                        crate::warn_limited!("admin accept: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
        .map(|_| ())
}

/// Gives `s` a thread of its own if fewer than `--admin-connections-max` are open; else
/// closes it at once (dropping it).
fn admit(s: TcpStream, shared: &Arc<Shared>, open: &Arc<AtomicUsize>) {
    let max = shared.cfg.admin_connections_max;
    if open
        .fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
        .is_err()
    {
        crate::warn_limited!("admin listener: --admin-connections-max {max} reached, closing");
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(shared.cfg.admin_timeout_secs);
    let (shared, done) = (shared.clone(), open.clone());
    let spawned = std::thread::Builder::new()
        .name("admin-conn".into())
        .spawn(move || {
            serve(s, &shared, deadline);
            done.fetch_sub(1, Relaxed);
        });
    if let Err(e) = spawned {
        open.fetch_sub(1, Relaxed);
        crate::warn_limited!("admin listener: no thread for a connection: {e}");
    }
}

/// The time left before `deadline`, or `None` once it passed.
fn left(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Reads one head and writes its answer, all before `deadline` (else the connection is
/// dropped: a client that cannot send a head in time gets no answer).
fn serve(mut s: TcpStream, shared: &Shared, deadline: Instant) {
    let limits = HeadLimits {
        header_bytes_max: HEAD_BYTES_MAX,
        header_count_max: 64,
    };
    let mut buf = vec![0u8; HEAD_BYTES_MAX];
    let mut len = 0;
    let answer = loop {
        let Some(t) = left(deadline) else { return };
        let _ = s.set_read_timeout(Some(t));
        match s.read(&mut buf[len..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => len += n,
        }
        match http::parse_head(&buf[..len], &limits) {
            Ok(None) => continue,
            Ok(Some(head)) => break answer(&head, shared),
            Err(e) => {
                let (status, code, msg) = e.status();
                break http::error_response(status, code, &msg, true);
            }
        }
    };
    let mut sent = 0;
    while sent < answer.len() {
        let Some(t) = left(deadline) else { return };
        let _ = s.set_write_timeout(Some(t));
        match s.write(&answer[sent..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => sent += n,
        }
    }
}

fn answer(head: &http::Head, shared: &Shared) -> Vec<u8> {
    if !matches!(head.method, Method::Get | Method::Head) {
        return http::error_response(405, "method_not_allowed", "GET only", true);
    }
    match head.path.as_str() {
        "/metrics" => {
            let text = metrics::render(&shared.metrics);
            http::response(200, "text/plain; version=0.0.4", text.as_bytes(), true)
        }
        "/healthz" => http::json_response(200, &serde_json::json!({"status": "ok"}), true),
        _ => http::error_response(
            404,
            "not_found",
            "the admin listener serves /metrics and /healthz",
            true,
        ),
    }
}
