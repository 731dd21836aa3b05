//! End-to-end tests of `--upstream-url`: the gateway in front of a streamable-HTTP MCP server
//! that keeps no history (a tiny in-test server on std::net, loopback, every wait bounded). It
//! checks that the upstream's JSON and SSE (chunked, multi-line `data`) answers reach the
//! client, that the upstream's session id and protocol version go on later requests, that its
//! GET stream is tried and its session DELETEd at the end, that a progress stream cut by the
//! client resumes exactly once from the gateway's log (the upstream cannot resume), that an
//! upstream which ends a stream without the response, answers 500, or forgets the session
//! produces explicit JSON-RPC errors, and that `https://` is refused at start.
#![forbid(unsafe_code)]

mod common;
mod mcp_client;

use common::Gateway;
use mcp_client::{ACCEPT, Ev, Exchange, send_initialized};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const UP_SESSION: &str = "up-session-1";

/// One request the upstream saw.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A minimal streamable-HTTP MCP server without resumability. Tools (by `params.name`):
/// `progress` (`arguments.count` progress notifications, then the result, as a chunked SSE
/// stream), `cut` (one progress notification, then the stream ends without a response),
/// `fail` (HTTP 500), `gone` (404: the session is unknown), `big` (a JSON result with a text
/// of `arguments.bytes` bytes).
struct Upstream {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Upstream {
    fn start() -> Upstream {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let url = format!("http://{}/mcp", l.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop2.load(Ordering::SeqCst) && Instant::now() < deadline {
                match l.accept() {
                    Ok((s, _)) => {
                        let seen = seen2.clone();
                        std::thread::spawn(move || serve(s, &seen));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Upstream { url, seen, stop }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
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

fn serve(s: TcpStream, seen: &Mutex<Vec<Seen>>) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let method = line.split(' ').next().unwrap_or("").to_owned();
    let mut headers = Vec::new();
    let mut len = 0usize;
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
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
    r.read_exact(&mut body).unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.lock().unwrap().push(Seen {
        method: method.clone(),
        headers,
        body: body.clone(),
    });
    let mut w = s;
    let plain = |w: &mut TcpStream, status: &str, extra: &str, body: &str| {
        let _ = write!(
            w,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
            body.len()
        );
    };
    match method.as_str() {
        "GET" => {
            return plain(
                &mut w,
                "405 Method Not Allowed",
                "Allow: POST, DELETE\r\n",
                "",
            );
        }
        "DELETE" => return plain(&mut w, "200 OK", "", ""),
        _ => {}
    }
    let id = body.get("id").cloned();
    let Some(id) = id else {
        return plain(&mut w, "202 Accepted", "", ""); // notification or response
    };
    match body["method"].as_str() {
        Some("initialize") => {
            let v = body["params"]["protocolVersion"].clone();
            let resp = json!({"jsonrpc":"2.0","id":id,"result":{"protocolVersion":v,
                "capabilities":{"tools":{}},"serverInfo":{"name":"in-test","version":"1"}}});
            let extra = format!("Mcp-Session-Id: {UP_SESSION}\r\n");
            plain(&mut w, "200 OK", &extra, &resp.to_string());
        }
        Some("tools/call") => {
            let token = body["params"]["_meta"]["progressToken"].clone();
            let progress = |p: u64| {
                json!({"jsonrpc":"2.0","method":"notifications/progress",
                    "params":{"progressToken":token,"progress":p}})
            };
            let chunk = |w: &mut TcpStream, text: &str| {
                let _ = write!(w, "{:x}\r\n{text}\r\n", text.len());
            };
            let sse_head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
            match body["params"]["name"].as_str() {
                Some("progress") => {
                    let n = body["params"]["arguments"]["count"].as_u64().unwrap();
                    let _ = w.write_all(sse_head.as_bytes());
                    chunk(&mut w, ": a comment\nid: up-1\ndata:\n\n"); // the SDK's priming
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
                        chunk(&mut w, &ev);
                    }
                    let resp = json!({"jsonrpc":"2.0","id":id,"result":{"content":[{"type":"text","text":"done"}]}});
                    chunk(&mut w, &format!("data: {resp}\n\n"));
                    let _ = w.write_all(b"0\r\n\r\n");
                }
                Some("cut") => {
                    let _ = w.write_all(sse_head.as_bytes());
                    chunk(&mut w, &format!("data: {}\n\n", progress(0)));
                    let _ = w.write_all(b"0\r\n\r\n");
                }
                Some("fail") => plain(&mut w, "500 Internal Server Error", "", "boom"),
                Some("big") => {
                    let n = body["params"]["arguments"]["bytes"].as_u64().unwrap() as usize;
                    let resp = json!({"jsonrpc":"2.0","id":id,"result":{"content":[{"type":"text","text":"x".repeat(n)}]}});
                    plain(&mut w, "200 OK", "", &resp.to_string());
                }
                Some("gone") => plain(&mut w, "404 Not Found", "", "{}"),
                _ => {
                    let resp = json!({"jsonrpc":"2.0","id":id,"error":{"code":-32602,"message":"unknown tool"}});
                    plain(&mut w, "200 OK", "", &resp.to_string());
                }
            }
        }
        _ => {
            let resp = json!({"jsonrpc":"2.0","id":id,"result":{}});
            plain(&mut w, "200 OK", "", &resp.to_string());
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

/// No TLS client: an https:// upstream is refused at start with a message saying so, and so
/// is the combination with --upstream-cmd.
#[test]
fn mcp_https_upstream_is_refused_at_start() {
    for args in [
        vec!["--upstream-url", "https://127.0.0.1:9/mcp"],
        vec![
            "--upstream-url",
            "http://127.0.0.1:9/mcp",
            "--upstream-cmd",
            "cat",
        ],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (status, err) = common::run_to_exit(dir.path(), &args, 20);
        assert!(!status.success(), "{args:?}");
        let want = if args[1].starts_with("https") {
            "no TLS"
        } else {
            "exclusive"
        };
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

/// A signed HS256 token for `sub`, valid for 10 minutes; `jti` makes each one distinct.
fn token(sub: &str, jti: u32) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &json!({"sub": sub, "exp": now + 600, "jti": jti.to_string()}),
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
