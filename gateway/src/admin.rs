//! The admin listener (`--admin-listen`, loopback by default): `/metrics` and `/healthz`,
//! served by one plain thread with blocking sockets, apart from the reactors. Operators'
//! scrapers are few; the thread serves one connection at a time, each bounded by a head
//! limit and a read/write timeout, and closes it after one answer. `/metrics` is not on the
//! public listener: what it shows (stream counts, resume classes, per-stream series when
//! enabled) is for operators.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use crate::core::Shared;
use crate::metrics;
use crate::proto::http::{self, HeadLimits, Method};

/// Bytes of an admin request head.
const HEAD_BYTES_MAX: usize = 8 * 1024;
/// How long one admin client may take to send its head or take the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves the admin listener until the process exits.
pub fn spawn(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("admin".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(s) => serve(s, &shared),
                    Err(e) => {
                        crate::warn_limited!("admin accept: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
        .map(|_| ())
}

fn serve(mut s: TcpStream, shared: &Shared) {
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let _ = s.set_write_timeout(Some(IO_TIMEOUT));
    let limits = HeadLimits {
        header_bytes_max: HEAD_BYTES_MAX,
        header_count_max: 64,
    };
    let mut buf = vec![0u8; HEAD_BYTES_MAX];
    let mut len = 0;
    let answer = loop {
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
    let _ = s.write_all(&answer);
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
