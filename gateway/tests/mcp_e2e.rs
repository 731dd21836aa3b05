//! End-to-end tests of the MCP front over real loopback sockets, with a real stdio upstream
//! process (`tests/mcp_upstream.awk`, so no Node is needed): session lifecycle and header
//! rules, a long progress stream cut at several points and resumed with GET + Last-Event-ID
//! (delivered exactly once, in order), the same across a gateway restart, an upstream death
//! answered with explicit errors. Clients are plain blocking std TCP with timeouts; every wait
//! is bounded. The official SDK clients and the conformance suite run in scripts/conformance.sh.
#![forbid(unsafe_code)]

mod common;
mod mcp_client;

use common::Gateway;
use mcp_client::{ACCEPT, Ev, Exchange, INIT, initialize, progress_of, upstream_cmd};
use std::net::SocketAddr;
use std::time::Duration;

fn start() -> Gateway {
    Gateway::start(&[
        "--cores",
        "2",
        "--upstream-cmd",
        &upstream_cmd(),
        "--mcp-retry-ms",
        "50",
    ])
}

#[test]
fn mcp_session_lifecycle_and_header_rules() {
    let g = start();
    let a = g.addr;
    let sid = initialize(a);
    assert!(sid.len() >= 32 && sid.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    // Origin / Host (DNS rebinding).
    let x = Exchange::send(
        a,
        "POST",
        &[
            ACCEPT,
            ("Mcp-Session-Id", &sid),
            ("Origin", "http://evil.example"),
        ],
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    );
    assert_eq!(x.status, 403);
    // Session rules.
    let x = Exchange::send(
        a,
        "POST",
        &[ACCEPT],
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    );
    assert_eq!(x.status, 400);
    let x = Exchange::send(
        a,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", "nope")],
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    );
    assert_eq!(x.status, 404);
    // Version header.
    let x = Exchange::send(
        a,
        "POST",
        &[
            ACCEPT,
            ("Mcp-Session-Id", &sid),
            ("MCP-Protocol-Version", "1999-01-01"),
        ],
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    );
    assert_eq!(x.status, 400);
    // Modern era: GET → 405; header mirror mismatch → 400 -32020.
    let x = Exchange::send(a, "GET", &[("MCP-Protocol-Version", "2026-07-28")], "");
    assert_eq!(x.status, 405);
    let x = Exchange::send(
        a,
        "POST",
        &[
            ACCEPT,
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/list"),
            ("Mcp-Name", "t"),
        ],
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"t"}}"#,
    );
    assert_eq!(
        (x.status, x.json()["error"]["code"].as_i64()),
        (400, Some(-32020))
    );
    // A request round trip on its own stream.
    let mut x = Exchange::send(
        a,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid)],
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    );
    assert_eq!(x.status, 200);
    assert!(x.next_event().unwrap().data.is_empty());
    assert!(x.next_event().unwrap().data.contains(r#""id":1"#));
    // DELETE, then 404.
    let x = Exchange::send(a, "DELETE", &[("Mcp-Session-Id", &sid)], "");
    assert_eq!(x.status, 200);
    let x = Exchange::send(
        a,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid)],
        r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#,
    );
    assert_eq!(x.status, 404);
}

/// A long progress stream cut three times (after the priming event and mid-stream) and
/// resumed with GET + Last-Event-ID each time; then the gateway restarts and a resume from an
/// early id replays the rest of that stream from the log. Every progress value is seen exactly
/// once, in order, and the result last.
#[test]
fn mcp_progress_stream_resumes_exactly_once_across_cuts_and_restart() {
    let mut g = start();
    let a = g.addr;
    let sid = initialize(a);
    let count = 40u64;
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"p","arguments":{{"count":{count},"interval_ms":15}},"_meta":{{"progressToken":7}}}}}}"#
    );
    let mut x = Exchange::send(a, "POST", &[ACCEPT, ("Mcp-Session-Id", &sid)], &body);
    assert_eq!(x.status, 200);
    let mut seen: Vec<u64> = Vec::new();
    let mut ids: Vec<String> = Vec::new();
    let mut result = None;
    // Read a few events per connection, then drop it and resume from the last id.
    for take in [1usize, 6, 9, usize::MAX] {
        let mut n = 0;
        while n < take {
            let Some(ev) = x.next_event() else { break };
            n += 1;
            if let Some(id) = &ev.id {
                ids.push(id.clone());
            }
            if let Some(p) = progress_of(&ev) {
                seen.push(p);
            } else if ev.data.contains(r#""result""#) {
                result = Some(ev.data.clone());
            }
        }
        if result.is_some() {
            break;
        }
        drop(x);
        let last = ids.last().unwrap().clone();
        x = Exchange::send(
            a,
            "GET",
            &[
                ("Accept", "text/event-stream"),
                ("Mcp-Session-Id", &sid),
                ("Last-Event-ID", &last),
            ],
            "",
        );
        assert_eq!(x.status, 200, "resume from {last}");
        // A resumed response restates the client's position first (no message data).
        let re = x.next_event().unwrap();
        assert_eq!(
            (re.id.as_deref(), re.data.as_str()),
            (Some(last.as_str()), "")
        );
    }
    let result = result.expect("the result arrived");
    assert!(result.contains(&format!(r#""sent":{count}"#)));
    assert_eq!(
        seen,
        (1..=count).collect::<Vec<_>>(),
        "progress exactly once, in order"
    );
    // Restart; resume from the 10th event id: the rest of the stream comes from the log.
    assert!(g.stop(), "clean shutdown");
    let dir = g.data_dir.clone();
    let g2 = Gateway::start_in(
        &dir,
        &[
            "--cores",
            "2",
            "--upstream-cmd",
            &upstream_cmd(),
            "--mcp-retry-ms",
            "50",
        ],
    );
    let from = &ids[10];
    let mut r = Exchange::send(
        g2.addr,
        "GET",
        &[
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", &sid),
            ("Last-Event-ID", from),
        ],
        "",
    );
    assert_eq!(r.status, 200);
    let mut replay = Vec::new();
    let mut got_result = false;
    while let Some(ev) = r.next_event() {
        if let Some(p) = progress_of(&ev) {
            replay.push(p);
        }
        got_result |= ev.data.contains(r#""result""#);
    }
    // ids[0] is the priming event (seq 1): ids[10] is progress 10.
    assert_eq!(replay, (11..=count).collect::<Vec<_>>());
    assert!(got_result, "the replay ends with the result");
    // The recovered session takes no new requests (its upstream is gone): 404, re-initialize.
    let x = Exchange::send(
        g2.addr,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid)],
        r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#,
    );
    assert_eq!(x.status, 404);
    // An id from beyond the stream's tail is an explicit 400, never an empty 200.
    let (prefix, _) = from.rsplit_once('-').unwrap();
    let beyond = format!("{prefix}-999999");
    let x = Exchange::send(
        g2.addr,
        "GET",
        &[
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", &sid),
            ("Last-Event-ID", &beyond),
        ],
        "",
    );
    assert_eq!(x.status, 400);
    assert_eq!(x.json()["error"]["data"]["requested"], beyond);
}

/// The upstream dies mid-request: the request's stream ends with a JSON-RPC error, the
/// session is gone (404).
#[test]
fn mcp_upstream_death_ends_requests_with_errors() {
    let g = start();
    let a = g.addr;
    let sid = initialize(a);
    let mut x = Exchange::send(
        a,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid)],
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"die"}}"#,
    );
    assert_eq!(x.status, 200);
    let mut last = None;
    while let Some(ev) = x.next_event() {
        last = Some(ev);
    }
    let v: serde_json::Value = serde_json::from_str(&last.expect("an error event").data).unwrap();
    assert_eq!(v["id"], 3);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("upstream"),
        "{v}"
    );
    let x = Exchange::send(
        a,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid)],
        r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#,
    );
    assert_eq!(x.status, 404);
}

/// Backpressure per stream: a client that never reads its (large) stream does not stall the
/// session's upstream or its other streams — the flood goes to the log — and when it finally
/// reads, it gets every event exactly once.
#[test]
fn mcp_unread_stream_does_not_stall_other_streams() {
    let g = start();
    let a = g.addr;
    let sid = initialize(a);
    let big = 20_000u64;
    let call = |id: u64, count: u64| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"p","arguments":{{"count":{count}}},"_meta":{{"progressToken":{id}}}}}}}"#
        )
    };
    // ~2 MB of progress for a client that does not read.
    let mut slow = Exchange::send(
        a,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid)],
        &call(1, big),
    );
    assert_eq!(slow.status, 200);
    // Another request of the same session completes meanwhile.
    let mut fast = Exchange::send(a, "POST", &[ACCEPT, ("Mcp-Session-Id", &sid)], &call(2, 3));
    assert_eq!(fast.status, 200);
    let mut fast_progress = Vec::new();
    let mut fast_result = false;
    while let Some(ev) = fast.next_event() {
        if let Some(p) = progress_of(&ev) {
            fast_progress.push(p);
        }
        fast_result |= ev.data.contains(r#""result""#);
    }
    assert_eq!(fast_progress, vec![1, 2, 3]);
    assert!(
        fast_result,
        "the fast request finished while the slow stream was unread"
    );
    // Now the slow client reads everything: exactly once, in order, then the result.
    let mut n = 0u64;
    let mut slow_result = false;
    while let Some(ev) = slow.next_event() {
        if let Some(p) = progress_of(&ev) {
            n += 1;
            assert_eq!(p, n, "progress in order without gaps");
        }
        slow_result |= ev.data.contains(r#""result""#);
    }
    assert_eq!(n, big);
    assert!(slow_result);
}

/// The 2026-07-28 (stateless) front: no session, no priming; the gateway's upstream id and
/// progress token rewriting is invisible to the client (its own id and token come back).
#[test]
fn mcp_modern_request_round_trip() {
    let g = start();
    let a = g.addr;
    let body = r#"{"jsonrpc":"2.0","id":"client-7","method":"tools/call","params":{"name":"p","arguments":{"count":3},"_meta":{"progressToken":"tok-a","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
    let mut x = Exchange::send(
        a,
        "POST",
        &[
            ACCEPT,
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "p"),
        ],
        body,
    );
    assert_eq!(x.status, 200);
    assert_eq!(
        x.header("mcp-session-id"),
        None,
        "no session in the modern era"
    );
    let mut msgs = Vec::new();
    while let Some(ev) = x.next_event() {
        assert!(!ev.data.is_empty(), "no priming event in the modern era");
        msgs.push(serde_json::from_str::<serde_json::Value>(&ev.data).unwrap());
    }
    assert_eq!(msgs.len(), 4, "{msgs:?}");
    for (i, m) in msgs[..3].iter().enumerate() {
        assert_eq!(m["params"]["progressToken"], "tok-a");
        assert_eq!(m["params"]["progress"], i as u64 + 1);
    }
    assert_eq!(msgs[3]["id"], "client-7");
    assert_eq!(msgs[3]["result"]["structuredContent"]["sent"], 3);
    // The call was timed, request to response (`gateway_mcp_upstream_call_seconds`).
    let (_, _, body) = common::request(g.admin_addr, "GET", "/metrics", &[], b"");
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.contains("\ngateway_mcp_upstream_call_seconds_count 1\n"),
        "{text}"
    );
    // GET is 405 in this era, whatever the session header says.
    let x = Exchange::send(
        a,
        "GET",
        &[
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Session-Id", "x"),
        ],
        "",
    );
    assert_eq!(x.status, 405);
}

/// 2026-07-28: closing the response stream is the cancellation; the gateway tells the stdio
/// upstream with `notifications/cancelled` naming the request (by the id the upstream saw).
#[test]
fn mcp_modern_stream_close_cancels_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("upstream-input.log");
    let script = format!("{}/tests/mcp_upstream.awk", env!("CARGO_MANIFEST_DIR"));
    let cmd = format!(
        "if awk -W version 2>&1 | grep -q mawk; then exec awk -W interactive -v trace='{l}' -f '{script}'; else exec awk -v trace='{l}' -f '{script}'; fi",
        l = log.display()
    );
    let g = Gateway::start(&["--cores", "2", "--upstream-cmd", &cmd]);
    let body = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"p","arguments":{"count":50,"interval_ms":20},"_meta":{"progressToken":5,"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
    let mut x = Exchange::send(
        g.addr,
        "POST",
        &[
            ACCEPT,
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "p"),
        ],
        body,
    );
    assert_eq!(x.status, 200);
    let first = x.next_event().expect("a first progress event");
    assert!(first.data.contains(r#""progressToken":5"#), "{first:?}");
    drop(x); // the client closes the stream
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (up_id, cancelled) = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let up_id = lines
            .iter()
            .find(|v| v["method"] == "tools/call")
            .map(|v| v["id"].clone());
        let cancel = lines
            .iter()
            .find(|v| v["method"] == "notifications/cancelled")
            .cloned();
        if let (Some(id), Some(c)) = (up_id, cancel) {
            break (id, c);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no notifications/cancelled upstream within 20 s: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        cancelled["params"]["requestId"], up_id,
        "cancels the request the upstream knows"
    );
    assert_ne!(
        up_id, 5,
        "the upstream saw the gateway's id, not the client's"
    );
}

/// An MCP session ID is the session's only credential: `/metrics` never shows it, not even
/// with per-stream series on, while ordinary streams are listed then (and not by default).
#[test]
fn metrics_never_show_an_mcp_session_id() {
    let mut flags = vec!["--metrics-per-stream"];
    let cmd = upstream_cmd();
    flags.extend(["--cores", "2", "--upstream-cmd", &cmd]);
    let g = Gateway::start(&flags);
    let sid = initialize(g.addr);
    common::publish(g.addr, "public-stream", "x");
    let metrics = |g: &Gateway| {
        let (st, _, body) = common::request(g.admin_addr, "GET", "/metrics", &[], b"");
        assert_eq!(st, 200);
        String::from_utf8(body).unwrap()
    };
    // The per-stream snapshot is refreshed once a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let t = metrics(&g);
        if t.contains("stream=\"public-stream\"") {
            break t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no per-stream series:\n{t}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(!text.contains(&sid), "the session ID leaked into /metrics");
    assert!(!text.contains("stream=\"mcp/"), "an MCP stream is listed");
    assert!(text.contains("gateway_streams{"), "the aggregate is there");
    drop(g);
    // By default: no stream names at all.
    let g = start();
    let sid = initialize(g.addr);
    common::publish(g.addr, "public-stream", "x");
    std::thread::sleep(Duration::from_millis(1200));
    let text = metrics(&g);
    assert!(
        !text.contains(&sid) && !text.contains("stream=\""),
        "{text}"
    );
}

const JWT_SECRET: &[u8] = b"an hs256 secret of at least thirty-two bytes, for the MCP e2e tests";

/// `Authorization: Bearer <token for sub>`, HS256, valid for 10 minutes, granting the MCP
/// endpoint and no stream.
fn bearer(sub: &str) -> String {
    bearer_of(serde_json::json!({ "sub": sub, "gateway": { "mcp": true } }))
}

/// `Authorization: Bearer <token>` with `claims` and an `exp` 10 minutes away, HS256.
fn bearer_of(mut claims: serde_json::Value) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    claims["exp"] = exp.into();
    let key = jsonwebtoken::EncodingKey::from_secret(JWT_SECRET).unwrap();
    let tok = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap();
    format!("Bearer {tok}")
}

/// The flags of a gateway with the MCP front and JWT authentication (the secret written into
/// `dir`), plus `extra`.
fn authenticated_args(dir: &tempfile::TempDir, extra: &[&str]) -> Vec<String> {
    let secret = dir.path().join("hs256.secret");
    std::fs::write(&secret, JWT_SECRET).unwrap();
    let mut args: Vec<String> = ["--cores", "2", "--jwt-hs256-secret-file"]
        .map(String::from)
        .to_vec();
    args.push(secret.to_str().unwrap().to_owned());
    args.extend(["--upstream-cmd".into(), upstream_cmd()]);
    args.extend(["--mcp-retry-ms", "50"].map(String::from));
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// A gateway with the MCP front and JWT authentication, plus `extra` flags.
fn start_authenticated(dir: &tempfile::TempDir, extra: &[&str]) -> Gateway {
    let args = authenticated_args(dir, extra);
    Gateway::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `initialize` + `notifications/initialized` as `auth`: the session ID and the priming
/// event's id.
fn initialize_as(addr: SocketAddr, auth: &str) -> (String, String) {
    let mut x = Exchange::send(addr, "POST", &[ACCEPT, ("Authorization", auth)], INIT);
    assert_eq!(x.status, 200, "{}", String::from_utf8_lossy(&x.body));
    let sid = x.header("mcp-session-id").expect("session id").to_owned();
    let priming = x.next_event().unwrap().id.expect("priming id");
    while x.next_event().is_some() {}
    let n = Exchange::send(
        addr,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid), ("Authorization", auth)],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(n.status, 202);
    (sid, priming)
}

/// A POST `ping`, a GET resuming from `last_event_id` and a DELETE on session `sid` as
/// `auth`: (status, body) of each.
fn probe_session(
    addr: SocketAddr,
    sid: &str,
    auth: &str,
    last_event_id: &str,
) -> Vec<(u16, Vec<u8>)> {
    let session = ("Mcp-Session-Id", sid);
    let who = ("Authorization", auth);
    let ping = r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#;
    let resume = [
        ("Accept", "text/event-stream"),
        session,
        who,
        ("Last-Event-ID", last_event_id),
    ];
    [
        Exchange::send(addr, "POST", &[ACCEPT, session, who], ping),
        Exchange::send(addr, "GET", &resume, ""),
        Exchange::send(addr, "DELETE", &[session, who], ""),
    ]
    .into_iter()
    .map(|x| (x.status, x.body))
    .collect()
}

/// With JWT authentication every MCP request needs a token, and a session answers only the
/// subject that initialized it: another subject's POST, resume and DELETE with its ID get the
/// same 404 as an unknown session, guessed IDs (random, or the owner's random part with the
/// other subject's tag) too, and the owner keeps working.
#[test]
fn mcp_sessions_are_bound_to_the_token_subject() {
    let dir = tempfile::tempdir().unwrap();
    let g = start_authenticated(&dir, &[]);
    let a = g.addr;
    let (alice, mallory) = (bearer("alice"), bearer("mallory"));
    let (sid, priming) = initialize_as(a, &alice);
    let (_, alice_tag) = sid.split_once('.').unwrap();
    // The tag is keyed (HMAC of issuer and subject): it neither is nor confirms a guessed
    // subject's unkeyed hash.
    assert_ne!(
        format!(".{alice_tag}"),
        mcp_front::core::subject_tag("alice")
    );

    // No token: 401 before the MCP front sees the request.
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let x = Exchange::send(a, "POST", &[ACCEPT, ("Mcp-Session-Id", &sid)], ping);
    assert_eq!(x.status, 401);
    let x = Exchange::send(a, "POST", &[ACCEPT], INIT);
    assert_eq!(x.status, 401);

    // An unknown session: the answer every refusal below must be indistinguishable from.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let random = format!(
        "{:032x}",
        nanos.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
    );
    let unknown = probe_session(a, &random, &mallory, &priming);
    assert!(unknown.iter().all(|(st, _)| *st == 404), "{unknown:?}");
    let body_404 = unknown[0].1.clone();
    assert!(unknown.iter().all(|(_, b)| *b == body_404));

    // Mallory with alice's session ID: POST, resume and DELETE all answer exactly that.
    assert_eq!(probe_session(a, &sid, &mallory, &priming), unknown);

    // Guessed IDs: alice's random part with mallory's tag (she learns her tag from a session
    // of her own), and a random one with alice's tag.
    let (own, _) = initialize_as(a, &mallory);
    let (alice_random, _) = sid.split_once('.').unwrap();
    let (_, mallory_tag) = own.split_once('.').unwrap();
    assert_ne!(mallory_tag, alice_tag);
    let swapped = format!("{alice_random}.{mallory_tag}");
    let with_alice_tag = format!("{random}.{alice_tag}");
    for (guess, who, name) in [
        (&swapped, &mallory, "mallory"),
        (&swapped, &alice, "alice"),
        (&random, &alice, "alice"),
        (&with_alice_tag, &mallory, "mallory"),
        (&with_alice_tag, &alice, "alice"),
    ] {
        let got = probe_session(a, guess, who, &priming);
        assert_eq!(got, unknown, "{guess} as {name}");
    }

    // Alice keeps working: a request round trip and a resume of her first stream.
    let mut x = Exchange::send(
        a,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid), ("Authorization", &alice)],
        ping,
    );
    assert_eq!(x.status, 200, "{}", String::from_utf8_lossy(&x.body));
    assert!(x.next_event().unwrap().data.is_empty(), "priming");
    assert!(x.next_event().unwrap().data.contains(r#""id":1"#));
    let mut r = Exchange::send(
        a,
        "GET",
        &[
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", &sid),
            ("Authorization", &alice),
            ("Last-Event-ID", &priming),
        ],
        "",
    );
    assert_eq!(r.status, 200);
    let replay: Vec<Ev> = std::iter::from_fn(|| r.next_event()).collect();
    assert!(
        replay
            .iter()
            .any(|e| e.data.contains(r#""protocolVersion""#)),
        "{replay:?}"
    );
    // Her DELETE ends the session; then it is unknown to her as well.
    let d = Exchange::send(
        a,
        "DELETE",
        &[("Mcp-Session-Id", &sid), ("Authorization", &alice)],
        "",
    );
    assert_eq!(d.status, 200);
    let x = Exchange::send(
        a,
        "POST",
        &[ACCEPT, ("Mcp-Session-Id", &sid), ("Authorization", &alice)],
        ping,
    );
    assert_eq!((x.status, x.body), (404, body_404));
}

/// With authentication the MCP endpoint needs a grant and a subject: a token without
/// `{"gateway": {"mcp": true}}` gets 403, one without `sub` a 401 naming it (sub-less tokens
/// no longer share one identity). The session key is made once, private, in the data
/// directory.
#[test]
fn mcp_needs_a_grant_and_a_subject() {
    let dir = tempfile::tempdir().unwrap();
    let g = start_authenticated(&dir, &[]);
    let a = g.addr;
    let streams_only =
        bearer_of(serde_json::json!({"sub": "bob", "gateway": {"subscribe": ["*"]}}));
    let x = Exchange::send(a, "POST", &[ACCEPT, ("Authorization", &streams_only)], INIT);
    assert_eq!(x.status, 403, "{}", String::from_utf8_lossy(&x.body));
    let no_sub = bearer_of(serde_json::json!({"gateway": {"mcp": true}}));
    let x = Exchange::send(a, "POST", &[ACCEPT, ("Authorization", &no_sub)], INIT);
    assert_eq!(x.status, 401);
    assert!(String::from_utf8_lossy(&x.body).contains("sub claim"));
    initialize_as(a, &bearer("alice"));
    let key = g.data_dir.join("mcp-session.key");
    let meta = std::fs::metadata(&key).expect("the session key file");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!((meta.len(), meta.permissions().mode() & 0o777), (32, 0o600));
}

/// Past `--mcp-sessions-per-subject-max` live sessions an `initialize` gets 429, while other
/// subjects still get theirs.
#[test]
fn mcp_sessions_per_subject_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let g = start_authenticated(&dir, &["--mcp-sessions-per-subject-max", "2"]);
    let alice = bearer("alice");
    initialize_as(g.addr, &alice);
    initialize_as(g.addr, &alice);
    let x = Exchange::send(g.addr, "POST", &[ACCEPT, ("Authorization", &alice)], INIT);
    assert_eq!(x.status, 429, "{}", String::from_utf8_lossy(&x.body));
    initialize_as(g.addr, &bearer("carol"));
}

/// Anonymous patterns never open the MCP endpoint: with `--anonymous-subscribe` and no key,
/// `initialize` without a token is refused (403) on loopback, and a gateway that would listen
/// off loopback so refuses to start (unless `--insecure-no-auth`).
#[test]
fn anonymous_patterns_never_open_mcp() {
    let cmd = upstream_cmd();
    let args = ["--anonymous-subscribe", "*", "--upstream-cmd", &cmd];
    let g = Gateway::start(&args);
    let x = Exchange::send(g.addr, "POST", &[ACCEPT], INIT);
    assert_eq!(x.status, 403, "{}", String::from_utf8_lossy(&x.body));
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--listen", "0.0.0.0:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path())
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the MCP front is on with no JWT key"), "{err}");
}

/// The session key stays in the data directory: after a restart a session resumes for its
/// owner (the same key, the same identity) and for no one else; with another key file (a node
/// that does not share it) the owner's identity is another, and the session answers 404.
#[test]
fn the_session_key_binds_sessions_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let args = authenticated_args(&dir, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut first = Gateway::start(&args); // owns the data directory: kept to the end
    let alice = bearer("alice");
    let (sid, priming) = initialize_as(first.addr, &alice);
    assert!(first.stop(), "clean shutdown");
    let data = first.data_dir.clone();
    let resume = |g: &Gateway, who: &str| {
        let h = [
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", sid.as_str()),
            ("Authorization", who),
            ("Last-Event-ID", priming.as_str()),
        ];
        Exchange::send(g.addr, "GET", &h, "").status
    };
    let mut g = Gateway::start_in(&data, &args);
    assert_eq!(resume(&g, &alice), 200, "the same key: the same identity");
    assert_eq!(resume(&g, &bearer("mallory")), 404);
    assert!(g.stop(), "clean shutdown");
    std::fs::write(data.join("mcp-session.key"), [9u8; 32]).unwrap();
    let g = Gateway::start_in(&data, &args);
    assert_eq!(resume(&g, &alice), 404, "another key: another identity");
}

/// An MCP and auth run at `--log-level trace` in JSON, through a call, a cut and a resume, a
/// forged resume and the session's end: no log line holds the session ID (the session's only
/// credential, part of every MCP stream name), the token's signature, or a cookie.
#[test]
fn no_session_id_token_or_cookie_reaches_a_log_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = authenticated_args(&dir, &["--log-level", "trace", "--log-format", "json"]);
    args.push("--access-log".into());
    args.push("on".into());
    let mut g = Gateway::start_logged(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let auth = bearer("log-grepper");
    let (sid, _) = initialize_as(g.addr, &auth);
    let headers = [
        ACCEPT,
        ("Mcp-Session-Id", sid.as_str()),
        ("Authorization", auth.as_str()),
        ("Cookie", "session=cookie-secret-value"),
    ];
    let body = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"p","arguments":{"count":4,"interval_ms":10},"_meta":{"progressToken":5}}}"#;
    let mut x = Exchange::send(g.addr, "POST", &headers, body);
    assert_eq!(x.status, 200);
    let first = x.next_event().and_then(|e| e.id).expect("an event id");
    drop(x);
    let get = |last: &str| {
        let h = [
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", sid.as_str()),
            ("Authorization", auth.as_str()),
            ("Last-Event-ID", last),
        ];
        Exchange::send(g.addr, "GET", &h, "")
    };
    let mut r = get(&first);
    assert_eq!(r.status, 200);
    while r.next_event().is_some() {}
    let forged = get(&format!("{first}9"));
    assert_ne!(forged.status, 0);
    let end = Exchange::send(g.addr, "DELETE", &headers, "");
    assert!(end.status < 300, "{}", end.status);
    assert!(g.stop());
    let lines = g.stderr_lines();
    assert!(
        lines.iter().any(|l| l.contains("\"route\":\"mcp\"")),
        "{lines:#?}"
    );
    let signature = auth.rsplit('.').next().unwrap();
    for l in &lines {
        assert!(!l.contains(&sid), "the session ID in a log line: {l}");
        assert!(!l.contains(signature), "a token in a log line: {l}");
        assert!(
            !l.contains("cookie-secret-value"),
            "a cookie in a log line: {l}"
        );
    }
}

/// A tool call of `count` progress notifications on session `sid`, its stream cut after a
/// few events and resumed with GET + `Last-Event-ID` on a fresh connection each time (a fresh
/// connection may reach either core): every progress exactly once, in order, then the result.
/// Returns the stream's event IDs.
fn call_across_cuts(a: SocketAddr, sid: &str, count: u64) -> Vec<String> {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"p","arguments":{{"count":{count},"interval_ms":5}},"_meta":{{"progressToken":3}}}}}}"#
    );
    let mut x = Exchange::send(a, "POST", &[ACCEPT, ("Mcp-Session-Id", sid)], &body);
    assert_eq!(x.status, 200);
    let (mut seen, mut ids, mut result) = (Vec::new(), Vec::<String>::new(), false);
    for take in [2usize, 3, 1, 4, usize::MAX] {
        for _ in 0..take {
            let Some(ev) = x.next_event() else { break };
            ids.extend(ev.id.clone());
            match progress_of(&ev) {
                Some(p) => seen.push(p),
                None => result |= ev.data.contains(r#""result""#),
            }
        }
        if result {
            break;
        }
        let last = ids.last().expect("the priming event at least").clone();
        let headers = [
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", sid),
            ("Last-Event-ID", &last),
        ];
        x = Exchange::send(a, "GET", &headers, "");
        assert_eq!(x.status, 200, "resume from {last}");
        let re = x.next_event().expect("the restated position");
        assert_eq!(
            (re.id.as_deref(), re.data.as_str()),
            (Some(last.as_str()), "")
        );
    }
    assert!(result, "the result arrived");
    assert_eq!(
        seen,
        (1..=count).collect::<Vec<_>>(),
        "exactly once, in order"
    );
    ids
}

/// Replays session `sid`'s stream from its first event ID after a restart: the status, and
/// the progress values that came.
fn replay(a: SocketAddr, sid: &str, from: &str) -> (u16, Vec<u64>) {
    let headers = [
        ("Accept", "text/event-stream"),
        ("Mcp-Session-Id", sid),
        ("Last-Event-ID", from),
    ];
    let mut r = Exchange::send(a, "GET", &headers, "");
    let mut got = Vec::new();
    while r.status == 200
        && let Some(ev) = r.next_event()
    {
        got.extend(progress_of(&ev));
    }
    (r.status, got)
}

/// Every call's stream replays whole (`count` progress values) from its first event ID.
fn every_call_replays(a: SocketAddr, calls: &[(String, Vec<String>)], count: u64) {
    for (sid, ids) in calls {
        let want = (200, (1..=count).collect());
        assert_eq!(replay(a, sid, &ids[0]), want, "session of shard {sid:.2}");
    }
}

/// The MCP front runs on every core: each core mints its sessions into its own shard, named
/// in the session ID, and serves them — calls and resumes — whichever core a connection
/// reaches (the others hand it over). After a restart with the same cores every stream
/// replays from the log, and after one with a single core too: that core mints into the
/// legacy shard and replays the sessions of the other shard it now owns.
#[test]
fn mcp_sessions_live_on_every_core_and_are_served_wherever_a_request_lands() {
    let mut g = start();
    let a = g.addr;
    // Sessions by the shard their ID names, until both cores have minted one (connections
    // reach a core by the kernel's SO_REUSEPORT hash: 64 tries leave a 2^-63 chance).
    let mut by_shard = std::collections::BTreeMap::new();
    for _ in 0..64 {
        let sid = initialize(a);
        let (shard, rest) = sid.split_once('-').expect("a shard-prefixed session ID");
        assert!(rest.len() >= 32, "128 random bits after the shard");
        by_shard.entry(shard.to_owned()).or_insert(sid);
        if by_shard.len() == 2 {
            break;
        }
    }
    assert_eq!(
        by_shard.len(),
        2,
        "both cores mint sessions: {:?}",
        by_shard.keys()
    );
    let count = 12;
    let calls: Vec<(String, Vec<String>)> = (by_shard.values())
        .map(|sid| (sid.clone(), call_across_cuts(a, sid, count)))
        .collect();
    // Requests of each session reach both cores; the other core hands them over (up to 64
    // pings until one is seen handed over: a 2^-64 chance of none).
    let handed = || g.metric("gateway_handoffs_total", "direction=\"in\"");
    for sid in by_shard.values() {
        let before = handed();
        for i in 0..64 {
            // A fresh id each time, and the answer read whole: an id still in flight in the
            // session would be refused (400).
            let ping = format!(r#"{{"jsonrpc":"2.0","id":{},"method":"ping"}}"#, 100 + i);
            let mut x = Exchange::send(a, "POST", &[ACCEPT, ("Mcp-Session-Id", sid)], &ping);
            assert_eq!(x.status, 200, "ping {sid:.2}");
            let answered = std::iter::from_fn(|| x.next_event()).any(|e| e.data.contains("result"));
            assert!(answered, "ping {sid:.2} answered");
            if handed() > before {
                break;
            }
        }
        assert!(
            handed() > before,
            "a request of {sid:.2} was handed to its core"
        );
    }
    // Restart with the same cores: both sessions' streams replay whole from the log.
    assert!(g.stop(), "clean shutdown");
    let dir = g.data_dir.clone();
    let args = ["--cores", "2", "--upstream-cmd", &upstream_cmd()];
    let mut g2 = Gateway::start_in(&dir, &args);
    every_call_replays(g2.addr, &calls, count);
    // One core: it mints into the legacy shard (where sessions lived before the front ran on
    // every core), and replays the sessions of both shards.
    assert!(g2.stop(), "clean shutdown");
    let g1 = Gateway::start_in(&dir, &["--cores", "1", "--upstream-cmd", &upstream_cmd()]);
    let fresh = initialize(g1.addr);
    let legacy_shard = fresh.split_once('-').expect("prefixed").0;
    assert!(
        by_shard.contains_key(legacy_shard),
        "the legacy shard's owner keeps it"
    );
    every_call_replays(g1.addr, &calls, count);
    // A recovered session takes no new request (its upstream is gone), whichever part has it.
    let ping = r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#;
    for sid in by_shard.values() {
        let x = Exchange::send(g1.addr, "POST", &[ACCEPT, ("Mcp-Session-Id", sid)], ping);
        assert_eq!(x.status, 404, "{sid:.2}");
    }
    let x = Exchange::send(g1.addr, "POST", &[ACCEPT, ("Mcp-Session-Id", &fresh)], ping);
    assert_eq!(x.status, 200, "the fresh session is served");
    // And back to two cores: every session still replays, the one-core run's included.
    let mut g1 = g1;
    assert!(g1.stop(), "clean shutdown");
    let g2 = Gateway::start_in(&dir, &args);
    every_call_replays(g2.addr, &calls, count);
    let x = Exchange::send(g2.addr, "POST", &[ACCEPT, ("Mcp-Session-Id", &fresh)], ping);
    assert_eq!(x.status, 404, "recovered: replay-only");
}
