//! End-to-end tests of `--upstream-url`: the gateway in front of a streamable-HTTP MCP server
//! that keeps no history (a tiny in-test server on std::net, loopback, every wait bounded;
//! plain HTTP or TLS with a test CA made here by rcgen, none committed). It checks that the
//! upstream's JSON and SSE (chunked, multi-line `data`) answers reach the client, that the
//! upstream's session id and protocol version go on later requests, that its GET stream is
//! tried and its session DELETEd at the end, that a progress stream cut by the client resumes
//! exactly once from the gateway's log (the upstream cannot resume), that an upstream which
//! ends a stream without the response, answers 500, or forgets the session produces explicit
//! JSON-RPC errors; over `https://` the same round trip, a certificate that does not verify
//! (unknown CA, wrong IP) as an explicit error with the gateway serving on; keep-alive
//! (sequential calls on a handful of pooled connections, counted by the upstream) and a
//! server that closes pooled connections (idle, or as a request arrives) without a message
//! lost or duplicated.
#![forbid(unsafe_code)]

mod common;
mod mcp_client;

use common::Gateway;
use mcp_client::{ACCEPT, Ev, Exchange, send_initialized};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const UP_SESSION: &str = "up-session-1";

/// One request the upstream saw.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    headers: Vec<(String, String)>,
    body: Value,
    /// Which accepted connection carried it (0, 1, … in accept order).
    conn: usize,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How the in-test upstream behaves on the wire.
#[derive(Clone, Default)]
struct Wire {
    /// TLS with this configuration (else plain HTTP).
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Answer with `Connection: close` and close after each answer (no keep-alive).
    close_each: bool,
    /// Close a connection idle this long between requests (a server's idle timeout).
    idle_close: Option<Duration>,
    /// After this many answers on a connection, close it when the next request arrives,
    /// without reading it (a server closing a kept-alive connection as a request comes in:
    /// it never saw that request).
    drop_after: Option<usize>,
}

/// (ALPN, SNI) of one TLS connection.
type Negotiated = (Option<Vec<u8>>, Option<String>);

/// What every connection thread of the upstream shares.
#[derive(Default)]
struct State {
    seen: Mutex<Vec<Seen>>,
    accepted: AtomicUsize,
    /// Requests that arrived on a connection closed unread (`Wire::drop_after`).
    dropped: AtomicUsize,
    /// What each TLS connection negotiated.
    tls: Mutex<Vec<Negotiated>>,
}

/// A minimal streamable-HTTP MCP server without resumability, HTTP/1.1 keep-alive unless
/// told otherwise. Tools (by `params.name`): `progress` (`arguments.count` progress
/// notifications, then the result, as a chunked SSE stream), `cut` (one progress
/// notification, then the stream ends without a response), `fail` (HTTP 500), `gone` (404:
/// the session is unknown), `big` (a JSON result with a text of `arguments.bytes` bytes); any
/// other name: a JSON error response.
struct Upstream {
    url: String,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Upstream {
    fn start() -> Upstream {
        Upstream::start_wire(Wire::default())
    }

    fn start_wire(wire: Wire) -> Upstream {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let scheme = if wire.tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}/mcp", l.local_addr().unwrap());
        let state = Arc::new(State::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, stop2) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop2.load(Ordering::SeqCst) && Instant::now() < deadline {
                match l.accept() {
                    Ok((s, _)) => {
                        let n = st.accepted.fetch_add(1, Ordering::SeqCst);
                        let (st, wire) = (st.clone(), wire.clone());
                        std::thread::spawn(move || accept(s, n, &st, &wire));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Upstream { url, state, stop }
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until a request matching `f` was seen.
    fn wait_for(&self, what: &str, f: impl Fn(&Seen) -> bool) -> Seen {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.seen().into_iter().find(|s| f(s)) {
                return s;
            }
            assert!(Instant::now() < deadline, "upstream never saw {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// One accepted connection: TLS first if configured, then requests until it ends.
fn accept(s: TcpStream, n: usize, st: &State, wire: &Wire) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let tcp = s.try_clone().unwrap();
    let Some(cfg) = &wire.tls else {
        return serve_conn(s, &tcp, n, st, wire);
    };
    let mut tls = rustls::StreamOwned::new(rustls::ServerConnection::new(cfg.clone()).unwrap(), s);
    while tls.conn.is_handshaking() {
        if tls.conn.complete_io(&mut tls.sock).is_err() {
            return; // the client refused our certificate (or went away)
        }
    }
    let alpn = tls.conn.alpn_protocol().map(<[u8]>::to_vec);
    let sni = tls.conn.server_name().map(str::to_owned);
    st.tls.lock().unwrap().push((alpn, sni));
    serve_conn(tls, &tcp, n, st, wire);
}

/// Serves requests on one connection until the client closes it or `wire` says to close.
fn serve_conn<S: Read + Write>(s: S, tcp: &TcpStream, n: usize, st: &State, wire: &Wire) {
    let mut r = BufReader::new(s);
    for served in 0.. {
        if wire.drop_after.is_some_and(|k| served >= k) {
            // Wait for the next request's first bytes, then close without reading them.
            if tcp.peek(&mut [0u8; 1]).is_ok_and(|got| got > 0) {
                st.dropped.fetch_add(1, Ordering::SeqCst);
            }
            return;
        }
        if served > 0
            && let Some(idle) = wire.idle_close
        {
            tcp.set_read_timeout(Some(idle)).unwrap();
            if r.fill_buf().map_or(true, |b| b.is_empty()) {
                return; // idle too long (or closed by the client)
            }
            tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        }
        if !serve(&mut r, n, st, wire.close_each) {
            return;
        }
    }
}

/// Reads one request and answers it; false when the connection must end.
fn serve<S: Read + Write>(r: &mut BufReader<S>, conn: usize, st: &State, close_each: bool) -> bool {
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return false;
    }
    let method = line.split(' ').next().unwrap_or("").to_owned();
    let mut headers = Vec::new();
    let mut len = 0usize;
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return false;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        if k.eq_ignore_ascii_case("content-length") {
            len = v.trim().parse().unwrap();
        }
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let mut body = vec![0u8; len];
    if r.read_exact(&mut body).is_err() {
        return false;
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let seen = Seen {
        method,
        headers,
        body,
        conn,
    };
    let close = close_each || seen.header("connection") == Some("close");
    st.seen.lock().unwrap().push(seen.clone());
    let w = r.get_mut();
    answer(w, &seen, close);
    w.flush().is_ok() && !close
}

/// Writes the answer to one request.
fn answer(w: &mut impl Write, seen: &Seen, close: bool) {
    let conn_close = if close { "Connection: close\r\n" } else { "" };
    let plain = |w: &mut dyn Write, status: &str, extra: &str, body: &str| {
        let _ = write!(
            w,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}{conn_close}\r\n{body}",
            body.len()
        );
    };
    let body = &seen.body;
    match seen.method.as_str() {
        "GET" => {
            return plain(w, "405 Method Not Allowed", "Allow: POST, DELETE\r\n", "");
        }
        "DELETE" => return plain(w, "200 OK", "", ""),
        _ => {}
    }
    let Some(id) = body.get("id").cloned() else {
        return plain(w, "202 Accepted", "", ""); // notification or response
    };
    match body["method"].as_str() {
        Some("initialize") => {
            let v = body["params"]["protocolVersion"].clone();
            let resp = json!({"jsonrpc":"2.0","id":id,"result":{"protocolVersion":v,
                "capabilities":{"tools":{}},"serverInfo":{"name":"in-test","version":"1"}}});
            let extra = format!("Mcp-Session-Id: {UP_SESSION}\r\n");
            plain(w, "200 OK", &extra, &resp.to_string());
        }
        Some("tools/call") => answer_tool(w, body, &id, conn_close, plain),
        _ => {
            let resp = json!({"jsonrpc":"2.0","id":id,"result":{}});
            plain(w, "200 OK", "", &resp.to_string());
        }
    }
}

fn answer_tool(
    w: &mut impl Write,
    body: &Value,
    id: &Value,
    conn_close: &str,
    plain: impl Fn(&mut dyn Write, &str, &str, &str),
) {
    let token = body["params"]["_meta"]["progressToken"].clone();
    let progress = |p: u64| {
        json!({"jsonrpc":"2.0","method":"notifications/progress",
            "params":{"progressToken":token,"progress":p}})
    };
    let chunk = |w: &mut dyn Write, text: &str| {
        let _ = write!(w, "{:x}\r\n{text}\r\n", text.len());
    };
    let sse_head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n{conn_close}\r\n"
    );
    match body["params"]["name"].as_str() {
        Some("progress") => {
            let n = body["params"]["arguments"]["count"].as_u64().unwrap();
            let _ = w.write_all(sse_head.as_bytes());
            chunk(w, ": a comment\nid: up-1\ndata:\n\n"); // the SDK's priming
            for p in 0..n {
                // Every 7th event split over two data lines (joined with \n, which
                // is JSON whitespace between two tokens).
                let text = progress(p).to_string();
                let ev = if p % 7 == 3 {
                    let at = text.find(",\"params\"").unwrap();
                    let (a, b) = text.split_at(at);
                    format!("event: message\ndata: {a}\ndata: {b}\n\n")
                } else {
                    format!("data: {text}\r\n\r\n")
                };
                chunk(w, &ev);
            }
            let resp = json!({"jsonrpc":"2.0","id":id,"result":{"content":[{"type":"text","text":"done"}]}});
            chunk(w, &format!("data: {resp}\n\n"));
            let _ = w.write_all(b"0\r\n\r\n");
        }
        Some("cut") => {
            let _ = w.write_all(sse_head.as_bytes());
            chunk(w, &format!("data: {}\n\n", progress(0)));
            let _ = w.write_all(b"0\r\n\r\n");
        }
        Some("fail") => plain(w, "500 Internal Server Error", "", "boom"),
        Some("big") => {
            let n = body["params"]["arguments"]["bytes"].as_u64().unwrap() as usize;
            let resp = json!({"jsonrpc":"2.0","id":id,"result":{"content":[{"type":"text","text":"x".repeat(n)}]}});
            plain(w, "200 OK", "", &resp.to_string());
        }
        Some("gone") => plain(w, "404 Not Found", "", "{}"),
        _ => {
            let resp =
                json!({"jsonrpc":"2.0","id":id,"error":{"code":-32602,"message":"unknown tool"}});
            plain(w, "200 OK", "", &resp.to_string());
        }
    }
}

fn start(up: &Upstream) -> Gateway {
    start_with(up, &[])
}

fn start_with(up: &Upstream, extra: &[&str]) -> Gateway {
    let mut args = vec![
        "--cores",
        "2",
        "--upstream-url",
        &up.url,
        "--mcp-retry-ms",
        "50",
    ];
    args.extend_from_slice(extra);
    Gateway::start(&args)
}

fn initialize(addr: SocketAddr) -> String {
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}"#;
    let mut x = Exchange::send(addr, "POST", &[ACCEPT], init);
    assert_eq!(x.status, 200);
    let sid = x.header("mcp-session-id").expect("session id").to_owned();
    assert_ne!(sid, UP_SESSION, "the gateway mints its own session ids");
    let mut resp = None;
    while let Some(ev) = x.next_event() {
        if !ev.data.is_empty() {
            resp = Some(ev);
        }
    }
    let v: Value = serde_json::from_str(&resp.expect("initialize result").data).unwrap();
    assert_eq!(v["id"], 0);
    assert_eq!(v["result"]["protocolVersion"], "2025-06-18");
    send_initialized(addr, &sid);
    sid
}

fn call(addr: SocketAddr, sid: &str, id: u64, body: Value) -> Exchange {
    let mut b = body;
    b["jsonrpc"] = json!("2.0");
    b["id"] = json!(id);
    b["method"] = json!("tools/call");
    let x = Exchange::send(
        addr,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", sid)],
        &b.to_string(),
    );
    assert_eq!(x.status, 200, "{}", String::from_utf8_lossy(&x.body));
    x
}

/// Waits (bounded: the MCP metrics snapshot is refreshed every 250 ms) until every
/// `gateway_mcp_*` line named in `want` (exact text before the value) has that value.
fn wait_metrics(addr: SocketAddr, want: &[(&str, u64)]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _, body) = common::request(addr, "GET", "/metrics", &[], b"");
        assert_eq!(status, 200);
        let text = String::from_utf8(body).unwrap();
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
        };
        let got: Vec<Option<u64>> = want.iter().map(|(n, _)| value(n)).collect();
        if want.iter().zip(&got).all(|((_, v), g)| Some(*v) == *g) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "metrics never reached {want:?}: got {got:?}\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The messages (non-empty data) of a stream until it ends.
/// Asserts that `msg` is a JSON-RPC error whose message contains `text`.
fn assert_error_mentions(msg: &Value, text: &str) {
    let said = msg["error"]["message"].as_str().unwrap_or_default();
    assert!(
        said.contains(text),
        "expected an error mentioning {text:?}: {msg}"
    );
}

fn messages(x: &mut Exchange) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(Ev { data, .. }) = x.next_event() {
        if !data.is_empty() {
            out.push(serde_json::from_str(&data).unwrap());
        }
    }
    out
}

/// The whole legacy round trip through an upstream without resumability, with a client cut
/// in the middle of a progress stream resumed exactly once from the gateway's log.
#[test]
fn mcp_http_upstream_round_trip_and_resume_from_our_log() {
    let up = Upstream::start();
    let g = start(&up);
    round_trip_and_resume(&up, &g);
}

/// The round trip of `mcp_http_upstream_round_trip_and_resume_from_our_log` on `g`, in front
/// of `up` (plain or TLS).
fn round_trip_and_resume(up: &Upstream, g: &Gateway) {
    let a = g.addr;
    let sid = initialize(a);

    let count = 60u64;
    let mut x = call(
        a,
        &sid,
        7,
        json!({"params":{"name":"progress","arguments":{"count":count},"_meta":{"progressToken":"t7"}}}),
    );
    // Read a few messages, then drop the connection mid-stream.
    let mut got: Vec<Value> = Vec::new();
    let mut last_id = None;
    while got.len() < 11 {
        let ev = x.next_event().expect("stream open");
        last_id = ev.id.clone().or(last_id);
        if !ev.data.is_empty() {
            got.push(serde_json::from_str(&ev.data).unwrap());
        }
    }
    drop(x);
    let last_id = last_id.expect("events carry ids");
    let mut r = Exchange::send(
        a,
        "GET",
        &[
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", &sid),
            ("Last-Event-ID", &last_id),
        ],
        "",
    );
    assert_eq!(r.status, 200);
    got.extend(messages(&mut r));
    let progress: Vec<u64> = got
        .iter()
        .filter_map(|m| m["params"]["progress"].as_u64())
        .collect();
    assert_eq!(
        progress,
        (0..count).collect::<Vec<_>>(),
        "every progress notification exactly once, in order"
    );
    let last = got.last().unwrap();
    assert_eq!(last["id"], 7);
    assert_eq!(last["result"]["content"][0]["text"], "done");
    assert!(
        got.iter()
            .all(|m| m["params"]["progressToken"] != json!(null) || m["id"] == 7)
    );

    // The upstream's session id and negotiated version went on the later requests.
    let seen = up.seen();
    let init = seen
        .iter()
        .find(|s| s.body["method"] == "initialize")
        .unwrap();
    assert_eq!(init.header("mcp-session-id"), None);
    let tool = seen
        .iter()
        .find(|s| s.body["method"] == "tools/call")
        .unwrap();
    assert_eq!(tool.header("mcp-session-id"), Some(UP_SESSION));
    assert_eq!(tool.header("mcp-protocol-version"), Some("2025-06-18"));
    assert!(
        tool.body["params"]["_meta"]["progressToken"] == "t7",
        "{:?}",
        tool.body
    );
    up.wait_for("the GET stream", |s| {
        s.method == "GET" && s.header("mcp-session-id") == Some(UP_SESSION)
    });

    // A stream the upstream ends without the response: the progress, then an explicit error.
    let mut x = call(
        a,
        &sid,
        8,
        json!({"params":{"name":"cut","_meta":{"progressToken":8}}}),
    );
    let m = messages(&mut x);
    assert_eq!(m.len(), 2, "{m:?}");
    assert_eq!(m[0]["params"]["progress"], 0);
    assert_eq!(m[1]["id"], 8);
    assert_error_mentions(&m[1], "without a response");

    // An HTTP error from the upstream: an explicit JSON-RPC error naming it.
    let mut x = call(a, &sid, 9, json!({"params":{"name":"fail"}}));
    let m = messages(&mut x);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0]["id"], 9);
    assert_error_mentions(&m[0], "HTTP 500");

    // The session still works; DELETE ends it upstream too.
    let mut x = call(a, &sid, 10, json!({"params":{"name":"other"}}));
    let m = messages(&mut x);
    assert_eq!(m[0]["error"]["message"], "unknown tool");
    let d = Exchange::send(a, "DELETE", &[("Mcp-Session-Id", &sid)], "");
    assert_eq!(d.status, 200);
    up.wait_for("DELETE of its session", |s| {
        s.method == "DELETE" && s.header("mcp-session-id") == Some(UP_SESSION)
    });
    let x = Exchange::send(
        a,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid)],
        r#"{"jsonrpc":"2.0","id":11,"method":"ping"}"#,
    );
    assert_eq!(x.status, 404);
    // Up: initialize, initialized, four tools/call. Down (made-up errors count as upstream
    // messages): initialize result, 60 progress + result, cut's progress + made-up error,
    // fail's made-up error, unknown tool's error.
    wait_metrics(
        g.admin_addr,
        &[
            ("gateway_mcp_sessions_open", 0),
            ("gateway_mcp_sessions_created_total", 1),
            ("gateway_mcp_sessions_terminated_total", 1),
            ("gateway_mcp_messages_up_total", 6),
            ("gateway_mcp_messages_down_total", 1 + 61 + 2 + 1 + 1),
            ("gateway_mcp_upstream_deaths_total", 0),
            ("gateway_mcp_resumes_total{class=\"ok\"}", 1),
            ("gateway_mcp_records_refused_total", 0),
        ],
    );
}

/// An upstream that forgets the session (404) ends the gateway session: the request in flight
/// gets an error, later requests 404.
#[test]
fn mcp_http_upstream_losing_its_session_ends_ours() {
    let up = Upstream::start();
    let g = start(&up);
    let a = g.addr;
    let sid = initialize(a);
    let mut x = call(a, &sid, 3, json!({"params":{"name":"gone"}}));
    let m = messages(&mut x);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0]["id"], 3);
    assert_error_mentions(&m[0], "upstream");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let x = Exchange::send(
            a,
            "POST",
            &[ACCEPT, ("Mcp-Session-Id", &sid)],
            r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#,
        );
        if x.status == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "session never ended: {}",
            x.status
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_metrics(
        g.admin_addr,
        &[
            ("gateway_mcp_upstream_deaths_total", 1),
            ("gateway_mcp_sessions_terminated_total", 1),
        ],
    );
}

/// Upstream flags that cannot work are refused at start, saying why: a CA file with a plain
/// `http://` upstream (or none), a CA file without a certificate, --upstream-cmd with
/// --upstream-url.
#[test]
fn mcp_upstream_flags_that_cannot_work_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let junk = junk.to_str().unwrap();
    for (args, want) in [
        (
            vec![
                "--upstream-url",
                "http://127.0.0.1:9/mcp",
                "--upstream-ca-file",
                junk,
            ],
            "needs an https:// --upstream-url",
        ),
        (
            vec!["--upstream-ca-file", junk],
            "needs an https:// --upstream-url",
        ),
        (
            vec![
                "--upstream-url",
                "https://127.0.0.1:9/mcp",
                "--upstream-ca-file",
                junk,
            ],
            "no PEM certificate",
        ),
        (
            vec![
                "--upstream-url",
                "http://127.0.0.1:9/mcp",
                "--upstream-cmd",
                "cat",
            ],
            "exclusive",
        ),
    ] {
        let (status, err) = common::run_to_exit(dir.path(), &args, 20);
        assert!(!status.success(), "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// A response the log refuses (record too large: 64 KiB segments cap records at 32 KiB while
/// --event-bytes-max stays 64 KiB) answers its request with an explicit JSON-RPC error at the
/// same stream position; the stream stays gap-free (a resume from its priming event replays
/// exactly the error), the session and the gateway keep working, and what was stored before
/// is intact.
#[test]
fn mcp_response_the_log_refuses_is_an_explicit_error() {
    let up = Upstream::start();
    let mut g = start_with(&up, &["--segment-bytes", "65536"]);
    let a = g.addr;
    let sid = initialize(a);
    let mut x = call(
        a,
        &sid,
        5,
        json!({"params":{"name":"big","arguments":{"bytes":8000}}}),
    );
    let m = messages(&mut x);
    assert_eq!(
        m[0]["result"]["content"][0]["text"].as_str().unwrap().len(),
        8000
    );

    let mut x = call(
        a,
        &sid,
        6,
        json!({"params":{"name":"big","arguments":{"bytes":40000}}}),
    );
    let priming = x.next_event().unwrap();
    assert!(priming.data.is_empty());
    let m = messages(&mut x);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0]["id"], 6);
    assert_eq!(m[0]["error"]["code"], -32005);
    let msg = m[0]["error"]["message"].as_str().unwrap();
    assert!(msg.contains("could not be stored"), "{msg}");
    // The session ID is the session's credential: no error names it (nor a stream).
    let text = serde_json::to_string(&m).unwrap();
    assert!(!text.contains(&sid) && !text.contains("mcp/"), "{text}");

    // The error is in the log at the response's position: a resume replays it, nothing else.
    let mut r = Exchange::send(
        a,
        "GET",
        &[
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", &sid),
            ("Last-Event-ID", priming.id.as_deref().unwrap()),
        ],
        "",
    );
    assert_eq!(r.status, 200);
    assert_eq!(messages(&mut r), m);

    // The session goes on; the gateway is alive and stops cleanly.
    let mut x = call(
        a,
        &sid,
        7,
        json!({"params":{"name":"big","arguments":{"bytes":10}}}),
    );
    assert_eq!(messages(&mut x)[0]["id"], 7);
    wait_metrics(
        g.admin_addr,
        &[
            ("gateway_mcp_records_refused_total", 1),
            ("gateway_mcp_streams_broken", 0),
            ("gateway_mcp_sessions_open", 1),
        ],
    );
    assert!(g.stop(), "the gateway exits 0 after a refused record");
}

/// An upstream that cannot be reached: initialize is answered with an explicit JSON-RPC error
/// (on its stream), the session is gone (404), the gateway keeps serving.
#[test]
fn mcp_unreachable_http_upstream_is_an_explicit_error() {
    // A port nobody listens on: bind, note it, close.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let g = Gateway::start(&["--cores", "2", "--upstream-url", &url]);
    let a = g.addr;
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}"#;
    let mut x = Exchange::send(a, "POST", &[ACCEPT], init);
    assert_eq!(x.status, 200);
    let sid = x.header("mcp-session-id").unwrap().to_owned();
    let m = messages(&mut x);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0]["id"], 0);
    assert_error_mentions(&m[0], "upstream");
    let x = Exchange::send(
        a,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid)],
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    );
    assert_eq!(x.status, 404);
    wait_metrics(g.admin_addr, &[("gateway_mcp_upstream_deaths_total", 1)]);
}

// ------------------------------------------------------------ --mcp-forward-authorization

const SECRET: &[u8] = b"an hs256 secret of at least thirty-two bytes, for the MCP upstream tests";

/// A signed HS256 token for `sub` granting the MCP endpoint, valid for 10 minutes; `jti` makes
/// each one distinct.
fn token(sub: &str, jti: u32) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &json!({"sub": sub, "exp": now + 600, "jti": jti.to_string(), "gateway": {"mcp": true}}),
        &jsonwebtoken::EncodingKey::from_secret(SECRET).unwrap(),
    )
    .unwrap()
}

/// A gateway with JWT authentication in front of `up`, plus `extra` flags.
fn start_authenticated(up: &Upstream, dir: &tempfile::TempDir, extra: &[&str]) -> Gateway {
    let secret = dir.path().join("hs256.secret");
    std::fs::write(&secret, SECRET).unwrap();
    let mut args = vec!["--jwt-hs256-secret-file", secret.to_str().unwrap()];
    args.extend_from_slice(extra);
    start_with(up, &args)
}

/// `initialize` and `notifications/initialized` with `auth` as the Authorization header.
fn initialize_as(addr: SocketAddr, auth: &str) -> String {
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}"#;
    let mut x = Exchange::send(addr, "POST", &[ACCEPT, ("Authorization", auth)], init);
    assert_eq!(x.status, 200, "{}", String::from_utf8_lossy(&x.body));
    let sid = x.header("mcp-session-id").expect("session id").to_owned();
    assert_eq!(messages(&mut x)[0]["id"], 0);
    let n = Exchange::send(
        addr,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid), ("Authorization", auth)],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(n.status, 202);
    sid
}

/// A legacy `tools/call` of the unknown tool `name` (answered with an error by the upstream)
/// as `auth`; returns its messages.
fn call_as(addr: SocketAddr, sid: &str, auth: &str, id: u64, name: &str) -> Vec<Value> {
    let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name}});
    let mut x = Exchange::send(
        addr,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", sid), ("Authorization", auth)],
        &body.to_string(),
    );
    assert_eq!(x.status, 200, "{}", String::from_utf8_lossy(&x.body));
    messages(&mut x)
}

/// A 2026-07-28 (stateless) `tools/call` of the unknown tool `name` as `auth`.
fn modern_call_as(addr: SocketAddr, auth: &str, id: u64, name: &str) -> Vec<Value> {
    let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,
        "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}});
    let mut x = Exchange::send(
        addr,
        "POST",
        &[
            ACCEPT,
            ("Authorization", auth),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", name),
        ],
        &body.to_string(),
    );
    assert_eq!(x.status, 200, "{}", String::from_utf8_lossy(&x.body));
    messages(&mut x)
}

/// The request the upstream saw for `tools/call` of `name`.
fn seen_call(up: &Upstream, name: &str) -> Seen {
    up.wait_for(name, |s| s.body["params"]["name"] == name)
}

/// With the flag, the upstream gets exactly the client's Authorization header: on a session's
/// requests the value of the session's latest request (a token refreshed mid-session is what
/// the upstream sees next, on the DELETE too), on 2026-07-28 requests each request's own.
/// Another subject holding the session's ID is refused (404) and the upstream never sees its
/// token.
#[test]
fn mcp_forward_authorization_passes_the_clients_latest_header() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let g = start_authenticated(&up, &dir, &["--mcp-forward-authorization"]);
    let a = g.addr;
    let (t1, t2) = (
        format!("Bearer {}", token("alice", 1)),
        format!("Bearer {}", token("alice", 2)),
    );
    let mallory = format!("Bearer {}", token("mallory", 3));
    let sid = initialize_as(a, &t1);
    let m = call_as(a, &sid, &t1, 1, "first");
    assert_eq!(m[0]["id"], 1);
    let init = up.wait_for("initialize", |s| s.body["method"] == "initialize");
    assert_eq!(init.header("authorization"), Some(t1.as_str()));
    let note = up.wait_for("initialized", |s| {
        s.body["method"] == "notifications/initialized"
    });
    assert_eq!(note.header("authorization"), Some(t1.as_str()));
    assert_eq!(
        seen_call(&up, "first").header("authorization"),
        Some(t1.as_str())
    );

    // The client refreshes its token: the next upstream request carries the new one.
    let m = call_as(a, &sid, &t2, 2, "refreshed");
    assert_eq!(m[0]["id"], 2);
    assert_eq!(
        seen_call(&up, "refreshed").header("authorization"),
        Some(t2.as_str())
    );

    // Mallory with alice's session ID: 404, nothing reaches the upstream on her behalf.
    let x = Exchange::send(
        a,
        "POST",
        &[
            ACCEPT,
            ("Mcp-Session-Id", &sid),
            ("Authorization", &mallory),
        ],
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"stolen"}}"#,
    );
    assert_eq!(x.status, 404);

    // 2026-07-28: one shared upstream client, each request with its own header.
    let bob = format!("Bearer {}", token("bob", 4));
    assert_eq!(modern_call_as(a, &t2, 5, "modern-alice")[0]["id"], 5);
    assert_eq!(modern_call_as(a, &bob, 6, "modern-bob")[0]["id"], 6);
    assert_eq!(
        seen_call(&up, "modern-alice").header("authorization"),
        Some(t2.as_str())
    );
    assert_eq!(
        seen_call(&up, "modern-bob").header("authorization"),
        Some(bob.as_str())
    );

    // DELETE (with the refreshed token): the upstream session is ended with it.
    let d = Exchange::send(
        a,
        "DELETE",
        &[("Mcp-Session-Id", &sid), ("Authorization", &t2)],
        "",
    );
    assert_eq!(d.status, 200);
    let del = up.wait_for("DELETE", |s| s.method == "DELETE");
    assert_eq!(del.header("authorization"), Some(t2.as_str()));
    let get = up.wait_for("the GET stream", |s| s.method == "GET");
    let on_get = get.header("authorization");
    assert!(on_get == Some(&t1) || on_get == Some(&t2), "{on_get:?}");

    for s in up.seen() {
        assert!(s.body["params"]["name"] != "stolen", "{s:?}");
        let values: Vec<&str> = s
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("authorization"))
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(values.len(), 1, "exactly one Authorization: {s:?}");
        assert!(
            [&t1, &t2, &bob].iter().any(|t| t.as_str() == values[0]),
            "{s:?}"
        );
    }
}

/// Without the flag no Authorization reaches the upstream, whatever the clients send.
#[test]
fn mcp_authorization_is_not_forwarded_by_default() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let g = start_authenticated(&up, &dir, &[]);
    let t1 = format!("Bearer {}", token("alice", 1));
    let sid = initialize_as(g.addr, &t1);
    assert_eq!(call_as(g.addr, &sid, &t1, 1, "plain")[0]["id"], 1);
    assert_eq!(modern_call_as(g.addr, &t1, 2, "modern-plain")[0]["id"], 2);
    seen_call(&up, "plain");
    seen_call(&up, "modern-plain");
    for s in up.seen() {
        assert_eq!(s.header("authorization"), None, "{s:?}");
    }
}

/// The flag needs an HTTP upstream: with a stdio one (or none) the gateway refuses to start
/// and says why.
#[test]
fn mcp_forward_authorization_needs_an_http_upstream() {
    for args in [
        vec!["--upstream-cmd", "cat", "--mcp-forward-authorization"],
        vec!["--mcp-forward-authorization"],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (status, err) = common::run_to_exit(dir.path(), &args, 20);
        assert!(!status.success(), "{args:?}");
        assert!(
            err.contains("--mcp-forward-authorization needs --upstream-url"),
            "{args:?}: {err}"
        );
    }
}

// ------------------------------------------------------------ https:// and keep-alive

/// A test certificate authority (made here by rcgen; nothing is committed) and its
/// certificate as a PEM file, for `--upstream-ca-file`.
struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem_file: PathBuf,
}

impl TestCa {
    fn new(dir: &Path, name: &str) -> TestCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let pem_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&pem_file, cert.pem()).unwrap();
        TestCa {
            issuer: rcgen::Issuer::new(params, key),
            pem_file,
        }
    }

    fn path(&self) -> &str {
        self.pem_file.to_str().unwrap()
    }

    /// A server configuration (ALPN `http/1.1`) with a certificate for `san` — an IP literal
    /// becomes an IP SAN — issued by this CA.
    fn server(&self, san: &str) -> Arc<rustls::ServerConfig> {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![san.to_owned()]).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let key_der = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key_der.into())
            .unwrap();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(cfg)
    }
}

/// An upstream behind TLS with a certificate for 127.0.0.1 from `ca`, plus `wire`.
fn tls_upstream(ca: &TestCa, wire: Wire) -> Upstream {
    Upstream::start_wire(Wire {
        tls: Some(ca.server("127.0.0.1")),
        ..wire
    })
}

/// The value of an unlabelled `/metrics` line, if present.
fn metric(admin: SocketAddr, name: &str) -> Option<u64> {
    let (_, _, body) = common::request(admin, "GET", "/metrics", &[], b"");
    String::from_utf8(body)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Waits (bounded; the snapshot is refreshed every 250 ms) until `f` holds for a metric.
fn wait_metric(admin: SocketAddr, name: &str, f: impl Fn(u64) -> bool) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = metric(admin, name);
        if let Some(v) = v.filter(|v| f(*v)) {
            return v;
        }
        assert!(Instant::now() < deadline, "{name} stayed at {v:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `n` sequential calls from id `first`, alternating a JSON answer (an unknown tool: the
/// upstream's error response) and an SSE one (`progress` with 3 notifications); each gets
/// exactly its messages, once, in order.
fn sequential_calls(a: SocketAddr, sid: &str, first: u64, n: u64) {
    for id in first..first + n {
        if id % 2 == 0 {
            let m = messages(&mut call(a, sid, id, json!({"params":{"name":"other"}})));
            assert_eq!(m.len(), 1, "{m:?}");
            assert_eq!(
                (&m[0]["id"], &m[0]["error"]["message"]),
                (&json!(id), &json!("unknown tool"))
            );
        } else {
            let token = format!("p{id}");
            let body = json!({"params":{"name":"progress","arguments":{"count":3},
                "_meta":{"progressToken":token}}});
            let m = messages(&mut call(a, sid, id, body));
            assert_eq!(m.len(), 4, "{m:?}");
            for (p, msg) in m[..3].iter().enumerate() {
                assert_eq!(msg["params"]["progressToken"], json!(token));
                assert_eq!(msg["params"]["progress"], json!(p));
            }
            assert_eq!(
                (&m[3]["id"], &m[3]["result"]["content"][0]["text"]),
                (&json!(id), &json!("done"))
            );
        }
    }
}

/// Every `tools/call` with an id in `ids` reached the upstream exactly once.
fn assert_each_call_seen_once(up: &Upstream, ids: std::ops::Range<u64>) {
    let seen = up.seen();
    for id in ids {
        let n = seen
            .iter()
            .filter(|s| s.body["method"] == "tools/call" && s.body["id"] == id)
            .count();
        assert_eq!(n, 1, "tools/call {id} reached the upstream {n} times");
    }
}

/// The round trip over `https://` with `--upstream-ca-file` (a test CA): initialize, a
/// progress stream cut by the client and resumed exactly once, explicit errors; the upstream
/// saw no ALPN (HTTP/1.1 by default) and no SNI (the host is an IP literal, RFC 6066).
#[test]
fn mcp_https_upstream_round_trip_and_resume_from_our_log() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "good");
    let up = tls_upstream(&ca, Wire::default());
    assert!(up.url.starts_with("https://127.0.0.1:"), "{}", up.url);
    let g = start_with(&up, &["--upstream-ca-file", ca.path()]);
    round_trip_and_resume(&up, &g);
    let tls = up.state.tls.lock().unwrap().clone();
    assert!(!tls.is_empty());
    for (alpn, sni) in tls {
        // No ALPN offered (the client speaks HTTP/1.1 only, the default without ALPN), and
        // no SNI for an IP address.
        assert_eq!(alpn, None);
        assert_eq!(sni, None);
    }
}

/// A certificate that does not verify — issued by a CA the gateway was not told to trust,
/// or for another IP address — is an explicit JSON-RPC error naming the certificate for the
/// client, nothing reaches the upstream (no plaintext fallback), and the gateway serves on.
#[test]
fn mcp_https_upstream_with_a_bad_certificate_is_an_explicit_error() {
    let dir = tempfile::tempdir().unwrap();
    let (good, other) = (
        TestCa::new(dir.path(), "good"),
        TestCa::new(dir.path(), "other"),
    );
    let unknown_ca = tls_upstream(&good, Wire::default());
    let wrong_ip = Upstream::start_wire(Wire {
        tls: Some(good.server("127.0.0.2")),
        ..Wire::default()
    });
    for (up, ca, want) in [
        (&unknown_ca, &other, "UnknownIssuer"),
        (&wrong_ip, &good, "not valid for name"),
    ] {
        let g = start_with(up, &["--upstream-ca-file", ca.path()]);
        for attempt in 0..2 {
            let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}"#;
            let mut x = Exchange::send(g.addr, "POST", &[ACCEPT], init);
            assert_eq!(x.status, 200);
            let m = messages(&mut x);
            assert_eq!(m.len(), 1, "{m:?}");
            assert_eq!(m[0]["id"], 0);
            assert_error_mentions(&m[0], "certificate");
            assert_error_mentions(&m[0], want);
            wait_metrics(
                g.admin_addr,
                &[("gateway_mcp_upstream_deaths_total", attempt + 1)],
            );
        }
        let (status, _, _) = common::request(g.addr, "GET", "/healthz", &[], b"");
        assert_eq!(status, 200, "the gateway serves on");
        assert!(up.seen().is_empty(), "{:?}", up.seen());
        assert!(up.accepted() >= 2);
    }
}

/// Keep-alive, plain and TLS: 60 sequential calls (JSON and SSE answers) with
/// `--upstream-pool-connections-max 3` reach the upstream over at most 3 POST connections
/// (plus the GET stream's own); the gateway counts the reuses and the connections opened and
/// open.
#[test]
fn mcp_http_upstream_reuses_pooled_connections() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "good");
    for tls in [false, true] {
        let up = match tls {
            true => tls_upstream(&ca, Wire::default()),
            false => Upstream::start(),
        };
        let mut extra = vec!["--upstream-pool-connections-max", "3"];
        if tls {
            extra.extend(["--upstream-ca-file", ca.path()]);
        }
        let g = start_with(&up, &extra);
        let sid = initialize(g.addr);
        let calls = 60;
        sequential_calls(g.addr, &sid, 1, calls);
        assert_each_call_seen_once(&up, 1..calls + 1);
        let seen = up.seen();
        let mut post_conns: Vec<usize> = seen
            .iter()
            .filter(|s| s.method == "POST")
            .map(|s| s.conn)
            .collect();
        let posts = post_conns.len();
        post_conns.sort_unstable();
        post_conns.dedup();
        eprintln!(
            "tls={tls}: {posts} POSTs over {} connection(s); {} accepted in all",
            post_conns.len(),
            up.accepted()
        );
        assert_eq!(
            posts as u64,
            calls + 2,
            "initialize, initialized, the calls"
        );
        assert!(post_conns.len() <= 3, "{post_conns:?}");
        assert!(
            up.accepted() <= 4,
            "3 pooled + the GET stream: {}",
            up.accepted()
        );
        let reused = wait_metric(
            g.admin_addr,
            "gateway_mcp_upstream_requests_reused_total",
            |v| v + 3 >= posts as u64,
        );
        assert!(reused >= calls - 1, "{reused}");
        assert_eq!(
            metric(g.admin_addr, "gateway_mcp_upstream_requests_retried_total"),
            Some(0)
        );
        // Every connection the upstream accepted was counted, and what is open now is at
        // most the pool and the GET stream.
        assert_eq!(
            metric(
                g.admin_addr,
                "gateway_mcp_upstream_connections_opened_total"
            ),
            Some(up.accepted() as u64)
        );
        let open = metric(g.admin_addr, "gateway_mcp_upstream_connections_open").unwrap();
        assert!((1..=4).contains(&open), "{open}");
    }
}

/// A server that closes kept-alive connections loses and duplicates nothing. (1) It closes
/// each connection when the third request arrives on it, without reading it (plain and TLS):
/// the gateway sends that request again on a fresh connection — it reached the upstream
/// exactly once, every call is answered once, and the retries equal the requests dropped.
/// (2) It closes connections idle for 300 ms (TLS): the gateway's probe sees the close before
/// reusing one, so nothing needs a retry.
#[test]
fn mcp_http_upstream_survives_the_server_closing_pooled_connections() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "good");
    for tls in [false, true] {
        let wire = Wire {
            drop_after: Some(2),
            ..Wire::default()
        };
        let up = match tls {
            true => tls_upstream(&ca, wire),
            false => Upstream::start_wire(wire),
        };
        let g = start_with(
            &up,
            &["--upstream-ca-file", ca.path()][if tls { 0.. } else { 2.. }],
        );
        let sid = initialize(g.addr);
        let calls = 30;
        sequential_calls(g.addr, &sid, 1, calls);
        assert_each_call_seen_once(&up, 1..calls + 1);
        let dropped = up.state.dropped.load(Ordering::SeqCst) as u64;
        assert!(dropped >= 5, "the upstream dropped {dropped} request(s)");
        let retried = wait_metric(
            g.admin_addr,
            "gateway_mcp_upstream_requests_retried_total",
            |v| v >= dropped,
        );
        eprintln!(
            "tls={tls}: {calls} calls, {dropped} dropped by the upstream, {retried} retried, {} connections",
            up.accepted()
        );
        assert_eq!(retried, dropped);
    }

    let up = tls_upstream(
        &ca,
        Wire {
            idle_close: Some(Duration::from_millis(300)),
            ..Wire::default()
        },
    );
    let g = start_with(&up, &["--upstream-ca-file", ca.path()]);
    let sid = initialize(g.addr);
    for id in 1..=4 {
        std::thread::sleep(Duration::from_millis(700));
        sequential_calls(g.addr, &sid, id, 1);
    }
    assert_each_call_seen_once(&up, 1..5);
    assert!(
        up.accepted() >= 5,
        "idle connections were closed: {}",
        up.accepted()
    );
    wait_metric(
        g.admin_addr,
        "gateway_mcp_upstream_requests_reused_total",
        |_| true,
    );
    assert_eq!(
        metric(g.admin_addr, "gateway_mcp_upstream_requests_retried_total"),
        Some(0)
    );
}

// ------------------------------------------------------------ proxies

/// A gateway in front of `up` (plus `extra` flags) with its environment's proxy variables
/// replaced by `vars`; killed when dropped.
struct EnvGateway {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for EnvGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const PROXY_VARS: [&str; 8] = [
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
];

fn start_with_env(up: &Upstream, vars: &[(&str, &str)], extra: &[&str]) -> EnvGateway {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"));
    PROXY_VARS.iter().for_each(|v| _ = cmd.env_remove(v));
    let mut child = cmd
        .envs(vars.iter().copied())
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--cores", "2", "--upstream-url", &up.url])
        .args(extra)
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    // Keep draining so the gateway never blocks on (or fails writing to) its stdout.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    EnvGateway {
        child,
        addr: common::listening_addr(&line),
        _dir: dir,
    }
}

/// A `CONNECT` proxy of the test's own: records each request line, then tunnels bytes both
/// ways between the client and the target.
fn tunnel_proxy() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let targets = Arc::new(Mutex::new(Vec::new()));
    let t = targets.clone();
    std::thread::spawn(move || {
        for s in l.incoming().map_while(Result::ok) {
            let t = t.clone();
            std::thread::spawn(move || tunnel(s, &t));
        }
    });
    (addr, targets)
}

fn tunnel(mut down: TcpStream, targets: &Mutex<Vec<String>>) {
    let mut r = BufReader::new(down.try_clone().unwrap());
    let head: Vec<String> = r
        .by_ref()
        .lines()
        .map_while(Result::ok)
        .take_while(|l| !l.is_empty())
        .collect();
    let line = head.first().cloned().unwrap_or_default();
    targets.lock().unwrap().push(line.clone());
    let Some(Ok(up)) = line.split(' ').nth(1).map(TcpStream::connect) else {
        return;
    };
    down.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .unwrap();
    let (mut up_r, mut up_w) = (up.try_clone().unwrap(), up);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut r, &mut up_w);
        let _ = up_w.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut up_r, &mut down);
    let _ = down.shutdown(std::net::Shutdown::Write);
}

/// The gateway takes its proxy from its environment: under `https_proxy` an `https://`
/// upstream is reached through the proxy's `CONNECT` tunnel, TLS end to end inside it (the
/// certificate checked against `--upstream-ca-file` and the URL's host); with `NO_PROXY`
/// naming the upstream's host the same setup goes direct.
#[test]
fn mcp_https_upstream_goes_through_the_environments_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "good");
    let up = tls_upstream(&ca, Wire::default());
    let (proxy, targets) = tunnel_proxy();
    let via = format!("http://{proxy}");
    let authority = up
        .url
        .trim_start_matches("https://")
        .trim_end_matches("/mcp");
    let connect = format!("CONNECT {authority} HTTP/1.1");
    for (vars, tunnelled, first) in [
        (vec![("https_proxy", via.as_str())], true, 1),
        (
            vec![("https_proxy", &via), ("NO_PROXY", "127.0.0.1")],
            false,
            3,
        ),
    ] {
        targets.lock().unwrap().clear();
        let g = start_with_env(&up, &vars, &["--upstream-ca-file", ca.path()]);
        let sid = initialize(g.addr);
        sequential_calls(g.addr, &sid, first, 2);
        let seen = targets.lock().unwrap().clone();
        assert_eq!(seen.is_empty(), !tunnelled, "{vars:?}: {seen:?}");
        assert!(seen.iter().all(|t| *t == connect), "{seen:?}");
    }
    assert_each_call_seen_once(&up, 1..5);
    assert!(!up.state.tls.lock().unwrap().is_empty());
}

/// At `--log-level trace` nothing the HTTP client sends or receives reaches the log: the
/// forwarded token appears in no line, not even cut into the 16-byte rows of a hex dump (any
/// 12 bytes of it), and neither does the upstream's session id.
#[test]
fn mcp_http_upstream_logs_no_credential_at_trace_level() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("hs256.secret");
    std::fs::write(&secret, SECRET).unwrap();
    let mut g = Gateway::start_logged(&[
        "--cores",
        "2",
        "--upstream-url",
        &up.url,
        "--jwt-hs256-secret-file",
        secret.to_str().unwrap(),
        "--mcp-forward-authorization",
        "--log-level",
        "trace",
    ]);
    let jwt = token("alice", 1);
    let auth = format!("Bearer {jwt}");
    let sid = initialize_as(g.addr, &auth);
    assert_eq!(call_as(g.addr, &sid, &auth, 1, "first")[0]["id"], 1);
    assert_eq!(
        seen_call(&up, "first").header("authorization"),
        Some(auth.as_str())
    );
    g.stop();
    let lines = g.stderr_lines();
    assert!(lines.len() > 10, "a trace-level run logs: {lines:?}");
    let pieces: Vec<&str> = (0..=jwt.len() - 12).map(|i| &jwt[i..i + 12]).collect();
    for line in &lines {
        assert!(!line.contains(UP_SESSION), "{line}");
        if let Some(p) = pieces.iter().find(|p| line.contains(**p)) {
            panic!("a piece of the token ({p}) is logged: {line}");
        }
    }
}
