//! The operator's view of the logs (`--log-format`, `--log-level`, `GATEWAY_LOG`): every line
//! of a JSON run is one object with the fields an ingester needs, the start and stop lines carry
//! their figures as fields, and no credential reaches a line.
#![forbid(unsafe_code)]

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::{Gateway, request};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

const SECRET: &[u8] = b"an hs256 secret of at least thirty-two bytes, for the log tests";

fn token(sub: &str) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let claims = json!({"sub": sub, "exp": exp, "gateway": {"publish": ["*"], "subscribe": ["*"]}});
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET).unwrap(),
    )
    .unwrap()
}

/// A gateway with JWT auth whose stderr the test keeps.
fn start(dir: &tempfile::TempDir, extra: &[&str]) -> Gateway {
    let secret = dir.path().join("hs256.secret");
    std::fs::write(&secret, SECRET).unwrap();
    let mut args = vec!["--jwt-hs256-secret-file", secret.to_str().unwrap()];
    args.extend_from_slice(extra);
    Gateway::start_logged(&args)
}

fn find<'a>(lines: &'a [Value], message: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["message"] == message)
        .unwrap_or_else(|| panic!("no line {message:?} in {lines:#?}"))
}

#[test]
fn json_lines_are_objects_with_the_fields_and_the_start_and_stop_figures() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = start(&dir, &["--log-format", "json", "--cores", "2"]);
    let auth = format!("Bearer {}", token("log-tester"));
    let (status, _, _) = request(
        g.addr,
        "POST",
        "/v1/streams/s/events",
        &[("Authorization", auth.as_str())],
        b"hello",
    );
    assert_eq!(status, 201);
    assert!(g.stop());
    let raw = g.stderr_lines();
    let lines: Vec<Value> = raw
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for l in &lines {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(l.get(key).is_some_and(|v| v.is_string()), "no {key}: {l}");
        }
    }
    let started = find(&lines, "gateway started");
    assert_eq!(started["cores"], 2, "{started}");
    assert_eq!(started["shards"], 8, "{started}");
    assert_eq!(started["auth"], "jwt", "{started}");
    assert_eq!(started["tls"], "off", "{started}");
    assert_eq!(started["version"], env!("CARGO_PKG_VERSION"), "{started}");
    assert!(started["commit"].as_str().is_some_and(|c| !c.is_empty()));
    let stopped = find(&lines, "gateway stopped");
    assert!(stopped["requests"].as_u64() >= Some(1), "{stopped}");
    assert!(stopped["events_appended"].as_u64() >= Some(1), "{stopped}");
}

#[test]
fn the_level_and_the_directives_filter_lines() {
    let dir = tempfile::tempdir().unwrap();
    // `warn` hides the info start line…
    let mut g = start(&dir, &["--log-level", "warn"]);
    assert!(g.stop());
    let quiet = g.stderr_lines();
    assert!(
        !quiet.iter().any(|l| l.contains("gateway started")),
        "{quiet:#?}"
    );
    // …and a text run shows it, with its fields as key=value.
    let mut g = start(&dir, &[]);
    let stopped = g.stop();
    let text = g.stderr_lines();
    assert!(stopped, "{text:#?}");
    let line = text
        .iter()
        .find(|l| l.contains("gateway started"))
        .unwrap_or_else(|| panic!("{text:#?}"));
    assert!(
        line.contains(" INFO ") && line.contains("auth=\"jwt\""),
        "{line}"
    );
}

#[test]
fn a_bad_directive_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path())
        .env("GATEWAY_LOG", "gateway=loud")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GATEWAY_LOG"), "{err}");
}

#[test]
fn no_token_reaches_a_log_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = start(&dir, &["--log-level", "trace", "--log-format", "json"]);
    let good = token("secret-subject");
    let forged = format!("{good}x");
    for (tok, want) in [(&good, 201), (&forged, 401)] {
        let auth = format!("Bearer {tok}");
        let (status, _, _) = request(
            g.addr,
            "POST",
            "/v1/streams/s/events",
            &[
                ("Authorization", auth.as_str()),
                ("Cookie", "c=cookie-value"),
            ],
            b"x",
        );
        assert_eq!(status, want);
    }
    assert!(g.stop());
    let lines = g.stderr_lines();
    assert!(!lines.is_empty());
    // The signature is the part no log may hold (the claims are base64 of the subject).
    let signature = good.rsplit('.').next().unwrap();
    for l in &lines {
        assert!(!l.contains(signature), "a token in the log: {l}");
        assert!(!l.contains("cookie-value"), "a cookie in the log: {l}");
    }
}

/// SIGTERM always reaches the thread that waits for it: every stop is graceful (exit 0 and a
/// stop line). Before the mask was set ahead of the log threads, one stop in ten was a death
/// by SIGTERM (exit status 143 from a shell) in one of them.
#[test]
fn every_sigterm_stops_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..12 {
        let mut g = start(&dir, &["--log-format", "json"]);
        let stopped = g.stop();
        let lines = g.stderr_lines();
        assert!(
            stopped,
            "round {round}: {:?} {lines:#?}",
            g.child.try_wait()
        );
        assert!(
            lines.iter().any(|l| l.contains("\"gateway stopped\"")),
            "round {round}: {lines:#?}"
        );
    }
}

/// Under systemd's `Type=notify`: `READY=1` once listening, `WATCHDOG=1` while the reactors
/// turn, `RELOADING=1` + `READY=1` around SIGHUP, `STOPPING=1` at SIGTERM — read from a
/// datagram socket standing in for `$NOTIFY_SOCKET`.
#[test]
fn systemd_notifications_follow_the_lifecycle() {
    use std::os::unix::net::UnixDatagram;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--log-level",
            "warn",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 512];
    let mut next = || {
        let n = sock.recv(&mut buf).expect("a notification within 20 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert!(next().starts_with("READY=1"));
    // At least two pings (every 200 ms), bounded by the read timeout.
    let mut pings = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while pings < 2 && Instant::now() < deadline {
        let m = next();
        assert_eq!(m, "WATCHDOG=1");
        pings += 1;
    }
    let kill = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .unwrap()
    };
    kill("-HUP");
    let mut seen = Vec::new();
    while !seen.iter().any(|m: &String| m == "READY=1") {
        seen.push(next());
    }
    let reloading = seen
        .iter()
        .position(|m| m.starts_with("RELOADING=1\nMONOTONIC_USEC="));
    assert!(reloading.is_some(), "{seen:?}");
    kill("-TERM");
    let mut seen = Vec::new();
    while !seen.iter().any(|m: &String| m == "STOPPING=1") {
        seen.push(next());
    }
    assert!(child.wait().unwrap().success());
}

/// The access lines of a JSON run (target `access`).
fn access_lines(g: &mut Gateway) -> Vec<Value> {
    g.stderr_lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["target"] == "access")
        .collect()
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// One access line per request, with the fields an operator searches by: the client's sane
/// `X-Request-Id` kept and echoed (a bad one replaced), route class and status, bytes and
/// duration, the peer, and a fingerprint of the subject instead of the subject.
#[test]
fn every_request_gets_an_access_line_with_its_request_id() {
    let dir = tempfile::tempdir().unwrap();
    // `warn` hides info lines, not the access log's.
    let mut g = start(&dir, &["--log-format", "json", "--log-level", "warn"]);
    let auth = format!("Bearer {}", token("alice"));
    let publish = |rid: &str| {
        request(
            g.addr,
            "POST",
            "/v1/streams/acc/events",
            &[("Authorization", auth.as_str()), ("X-Request-Id", rid)],
            b"hello",
        )
    };
    let (status, headers, _) = publish("client-req-42");
    assert_eq!(status, 201);
    assert_eq!(header(&headers, "x-request-id"), Some("client-req-42"));
    let (status, headers, _) = publish("not sane\"id");
    assert_eq!(status, 201);
    let generated = header(&headers, "x-request-id").unwrap().to_string();
    assert_eq!(generated.len(), 16, "{generated}");
    let (status, headers, _) = request(g.addr, "GET", "/nowhere", &[], b"");
    assert_eq!(status, 404);
    assert!(header(&headers, "x-request-id").is_some());
    let publishes = g.metric("gateway_requests_total", "route=\"publish\",status=\"2xx\"");
    let not_found = g.metric("gateway_requests_total", "route=\"other\",status=\"4xx\"");
    assert_eq!((publishes, not_found), (2, 1));
    assert!(g.stop());
    let lines = access_lines(&mut g);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let first = &lines[0];
    assert_eq!(first["request_id"], "client-req-42", "{first}");
    assert_eq!(first["method"], "POST");
    assert_eq!(first["route"], "publish");
    assert_eq!(first["status"], 201);
    assert_eq!(first["peer"], "127.0.0.1");
    assert!(first["bytes_in"].as_u64() > Some(5), "{first}");
    assert!(first["bytes_out"].as_u64() > Some(0), "{first}");
    assert!(first["duration_us"].is_u64(), "{first}");
    let subject = first["subject"].as_str().unwrap();
    assert_eq!(subject.len(), 16, "{first}");
    assert_ne!(subject, "alice");
    assert_eq!(lines[1]["request_id"], generated.as_str());
    assert_eq!(lines[2]["route"], "other");
    assert_eq!(lines[2]["status"], 404);
    assert_eq!(lines[2]["subject"], "-");
    for l in &lines {
        assert!(
            !l.to_string().contains("alice"),
            "the subject in a line: {l}"
        );
    }
}

/// A subscription's line is written when it ends, with the bytes it sent and the resume class.
#[test]
fn a_subscription_is_logged_when_it_ends_with_its_resume_class() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = start(&dir, &["--log-format", "json"]);
    let auth = format!("Bearer {}", token("bob"));
    let post = || {
        let (status, _, body) = request(
            g.addr,
            "POST",
            "/v1/streams/sub/events",
            &[("Authorization", auth.as_str())],
            b"event-data",
        );
        assert_eq!(status, 201);
        common::json(&body)["id"].as_str().unwrap().to_string()
    };
    let first = post();
    post();
    let mut sse = common::Sse::open_with(
        g.addr,
        "/v1/streams/sub",
        Some(&first),
        &[
            ("Authorization", auth.as_str()),
            ("X-Request-Id", "resume-1"),
        ],
    );
    assert_eq!(sse.status, 200);
    assert_eq!(sse.header("x-request-id"), Some("resume-1"));
    assert!(sse.next_event().is_some());
    let read = sse.bytes_read as u64;
    // Open: no line yet.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        !access_lines(&mut g)
            .iter()
            .any(|l| l["route"] == "subscribe")
    );
    drop(sse);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let line = loop {
        if let Some(l) = access_lines(&mut g)
            .into_iter()
            .find(|l| l["route"] == "subscribe")
        {
            break l;
        }
        assert!(std::time::Instant::now() < deadline, "no subscribe line");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(line["request_id"], "resume-1", "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["resume"], "replay", "{line}");
    assert!(
        line["bytes_out"].as_u64() >= Some(read),
        "{line} read {read}"
    );
    assert!(line["first_event_us"].as_u64() > Some(0), "{line}");
    let timed = g.metric(
        "gateway_resume_first_event_seconds_count",
        "class=\"replay\"",
    );
    assert_eq!(timed, 1);
    assert!(g.stop());
}

#[test]
fn the_access_log_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = start(&dir, &["--log-format", "json", "--access-log", "off"]);
    let (status, _, _) = request(g.addr, "GET", "/healthz", &[], b"");
    assert_eq!(status, 200);
    assert_eq!(g.metric("gateway_requests_total", "route=\"healthz\""), 1);
    assert!(g.stop());
    assert_eq!(access_lines(&mut g), Vec::<Value>::new());
}

/// A live subscriber's events are timed from the moment they became durable to the send that
/// took them (`gateway_delivery_lag_seconds`), one observation per woken send.
#[test]
fn delivery_lag_is_observed_for_live_subscribers() {
    let dir = tempfile::tempdir().unwrap();
    let g = start(&dir, &["--cores", "1"]);
    let auth = format!("Bearer {}", token("carol"));
    let headers = [("Authorization", auth.as_str())];
    let mut sse = common::Sse::open_with(g.addr, "/v1/streams/lag", None, &headers);
    assert_eq!(sse.status, 200);
    assert_eq!(lag_count(&g), 0);
    for i in 0..3 {
        let (status, _, _) = request(g.addr, "POST", "/v1/streams/lag/events", &headers, b"x");
        assert_eq!(status, 201);
        let ev = sse.next_event().expect("the event");
        assert_eq!(ev.data, "x", "event {i}");
    }
    // Each publish was answered after it was durable and its event read by this client: its
    // send completed before the next publish. The last send's completion may still be on its
    // way to the core when the client has read the event: wait for it (bounded).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut n = lag_count(&g);
    while n < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        n = lag_count(&g);
    }
    assert!(n >= 3, "{n}");
}

/// `gateway_delivery_lag_seconds_count` (a series without labels).
fn lag_count(g: &Gateway) -> u64 {
    count(g, "gateway_delivery_lag_seconds")
}

/// `<family>_count` of a histogram without labels.
fn count(g: &Gateway, family: &str) -> u64 {
    let (_, _, body) = request(g.admin_addr, "GET", "/metrics", &[], b"");
    let text = String::from_utf8(body).unwrap();
    let prefix = format!("{family}_count ");
    let line = text.lines().find(|l| l.starts_with(&prefix));
    line.and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .expect("the count")
}

/// Every turn of a core's loop is observed (`gateway_turn_duration_seconds`): each request
/// takes at least one turn (its bytes arrive in a completion), so the count grows by at least
/// the requests made, and the sum stays within the time the gateway has been up.
#[test]
fn every_turn_of_the_loop_is_observed() {
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let g = start(&dir, &["--cores", "1"]);
    let before = count(&g, "gateway_turn_duration_seconds");
    for _ in 0..5 {
        let (status, _, _) = request(g.addr, "GET", "/healthz", &[], b"");
        assert_eq!(status, 200);
    }
    let after = count(&g, "gateway_turn_duration_seconds");
    assert!(after >= before + 5, "{before} -> {after}");
    let (_, _, body) = request(g.admin_addr, "GET", "/metrics", &[], b"");
    let text = String::from_utf8(body).unwrap();
    let sum: f64 = (text.lines())
        .find_map(|l| l.strip_prefix("gateway_turn_duration_seconds_sum "))
        .and_then(|v| v.parse().ok())
        .expect("the sum");
    assert!(sum > 0.0 && sum <= started.elapsed().as_secs_f64(), "{sum}");
}
