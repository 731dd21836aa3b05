//! End to end: who may do what. JWT authentication with per-stream grants (401 / 403 with
//! `WWW-Authenticate`, forged tokens refused), expiry in the middle of a subscription (closed
//! in-band; the client resumes with a fresh token and loses nothing), CORS (preflights,
//! origins, headers on every answer), `/metrics` only on the admin listener, and the refusal to
//! expose an unauthenticated gateway.
#![forbid(unsafe_code)]

mod common;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use common::{Gateway, Sse, json, request};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

const SECRET: &[u8] = b"an hs256 secret of at least thirty-two bytes, for the tests";
const ORIGIN: &str = "http://127.0.0.2:8000";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn secret_file(dir: &tempfile::TempDir) -> PathBuf {
    let p = dir.path().join("hs256.secret");
    std::fs::write(&p, SECRET).unwrap();
    p
}

fn token(claims: &Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(SECRET).unwrap(),
    )
    .unwrap()
}

fn grants(publish: &[&str], subscribe: &[&str], exp: u64) -> String {
    token(&json!({
        "sub": "tester",
        "exp": exp,
        "gateway": {"publish": publish, "subscribe": subscribe},
    }))
}

/// A gateway with the HS256 secret, the query-token source and one allowed origin.
fn start(dir: &tempfile::TempDir, extra: &[&str]) -> Gateway {
    let f = secret_file(dir);
    let mut args = vec![
        "--jwt-hs256-secret-file",
        f.to_str().unwrap(),
        "--jwt-allow-query-token",
        "--cors-allow-origin",
        ORIGIN,
    ];
    args.extend_from_slice(extra);
    Gateway::start(&args)
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn publish_as(
    g: &Gateway,
    stream: &str,
    tok: Option<&str>,
    data: &str,
) -> (u16, Vec<(String, String)>, Value) {
    let auth = tok.map(|t| format!("Bearer {t}"));
    let mut hs = Vec::new();
    if let Some(a) = &auth {
        hs.push(("Authorization", a.as_str()));
    }
    let (st, h, body) = request(
        g.addr,
        "POST",
        &format!("/v1/streams/{stream}/events"),
        &hs,
        data.as_bytes(),
    );
    let v = if body.is_empty() {
        Value::Null
    } else {
        json(&body)
    };
    (st, h, v)
}

/// alg=none: a header `{"alg":"none"}`, the payload, and an empty signature.
fn alg_none(claims: &Value) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.",
        b64.encode(br#"{"alg":"none","typ":"JWT"}"#),
        b64.encode(claims.to_string())
    )
}

/// The payload swapped for another (more grants), the signature kept.
fn tampered(tok: &str, claims: &Value) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = tok.split('.').collect();
    format!(
        "{}.{}.{}",
        parts[0],
        b64.encode(claims.to_string()),
        parts[2]
    )
}

#[test]
fn publish_and_subscribe_need_a_granted_token() {
    let dir = tempfile::tempdir().unwrap();
    let g = start(&dir, &[]);
    let exp = now() + 600;
    let good = grants(&["orders-*"], &["orders-*"], exp);

    // No token: 401 without an error code (RFC 6750 §3.1: the request had no credentials).
    let (st, h, v) = publish_as(&g, "orders-1", None, "x");
    assert_eq!(st, 401, "{v}");
    assert_eq!(
        header(&h, "www-authenticate"),
        Some(r#"Bearer realm="gateway""#)
    );
    assert!(v["error"].is_string(), "{v}");

    // Forged and unacceptable tokens: 401 invalid_token, and nothing is appended.
    let wide = json!({"sub": "x", "exp": exp, "gateway": {"publish": ["*"], "subscribe": ["*"]}});
    let other_key = encode(
        &Header::new(Algorithm::HS256),
        &wide,
        &EncodingKey::from_secret(b"another secret of at least thirty-two bytes!!").unwrap(),
    )
    .unwrap();
    let forged = [
        ("alg none", alg_none(&wide)),
        ("tampered", tampered(&good, &wide)),
        ("other key", other_key),
        ("expired", grants(&["orders-*"], &[], now() - 10)),
        (
            "no exp",
            token(&json!({"sub": "x", "gateway": {"publish": ["*"]}})),
        ),
        ("garbage", "not.a.jwt".to_owned()),
    ];
    for (what, t) in &forged {
        let (st, h, v) = publish_as(&g, "orders-1", Some(t), "forged");
        assert_eq!(st, 401, "{what}: {v}");
        let w = header(&h, "www-authenticate").unwrap_or("");
        assert!(w.contains(r#"error="invalid_token""#), "{what}: {w}");
        assert!(
            !v.to_string().contains(t.as_str()),
            "{what}: the token is echoed"
        );
    }

    // Valid but not granted: 403.
    let (st, h, v) = publish_as(&g, "payments", Some(&good), "x");
    assert_eq!(st, 403, "{v}");
    assert!(
        header(&h, "www-authenticate")
            .unwrap()
            .contains("insufficient_scope")
    );
    let sub_only = grants(&[], &["orders-*"], exp);
    assert_eq!(publish_as(&g, "orders-1", Some(&sub_only), "x").0, 403);

    // Granted: 201, and a granted subscriber reads exactly the accepted events.
    for i in 0..3 {
        let (st, _, v) = publish_as(&g, "orders-1", Some(&good), &format!("e{i}"));
        assert_eq!(st, 201, "{v}");
    }
    let mut s = Sse::open(g.addr, "/v1/streams/orders-1?from=earliest", None);
    assert_eq!(s.status, 401, "subscribe without a token");
    let path = format!("/v1/streams/orders-1?from=earliest&access_token={good}");
    s = Sse::open(g.addr, &path, None);
    assert_eq!(s.status, 200);
    let datas: Vec<String> = (0..3).map(|_| s.next_event().unwrap().data).collect();
    assert_eq!(datas, ["e0", "e1", "e2"]);
    let bearer = format!("Bearer {sub_only}");
    let s = Sse::open_with(
        g.addr,
        "/v1/streams/payments",
        None,
        &[("Authorization", &bearer)],
    );
    assert_eq!(s.status, 403, "subscribe outside the grant");
}

#[test]
fn anonymous_access_is_an_explicit_pattern() {
    let g = Gateway::start(&[
        "--anonymous-subscribe",
        "public-*",
        "--anonymous-publish",
        "public-in",
    ]);
    assert_eq!(publish_as(&g, "public-in", None, "x").0, 201);
    assert_eq!(publish_as(&g, "public-out", None, "x").0, 401);
    assert_eq!(publish_as(&g, "private", None, "x").0, 401);
    let s = Sse::open(g.addr, "/v1/streams/public-in?from=earliest", None);
    assert_eq!(s.status, 200);
    let s = Sse::open(g.addr, "/v1/streams/private", None);
    assert_eq!(s.status, 401);
}

/// A subscription whose token expires is ended in-band at `exp` (`event: expired`, no `id:`),
/// and the client that comes back with a fresh token and its Last-Event-ID misses nothing and
/// sees nothing twice.
#[test]
fn expiry_mid_stream_closes_in_band_and_the_resume_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let g = start(&dir, &["--fsync", "never"]);
    let long = grants(&["live"], &["live"], now() + 600);
    let short = grants(&[], &["live"], now() + 2);
    for i in 0..5 {
        assert_eq!(publish_as(&g, "live", Some(&long), &format!("{i}")).0, 201);
    }
    let path = format!("/v1/streams/live?from=earliest&access_token={short}");
    let mut s = Sse::open(g.addr, &path, None);
    assert_eq!(s.status, 200);
    let mut seen = Vec::new();
    let mut last_id = None;
    // Keep publishing while subscribed, until the gateway ends the stream (bounded).
    let mut next = 5;
    let notice = loop {
        assert!(next < 200, "the subscription outlived its token");
        assert_eq!(
            publish_as(&g, "live", Some(&long), &format!("{next}")).0,
            201
        );
        next += 1;
        std::thread::sleep(Duration::from_millis(50));
        s.drain_nonblocking(1 << 20);
        let mut ended = None;
        while let Some(e) = s.take_buffered() {
            if e.event.as_deref() == Some("expired") {
                ended = Some(e);
                break;
            }
            last_id = e.id.clone();
            seen.push(e.data);
        }
        if let Some(e) = ended {
            break e;
        }
    };
    assert!(
        notice.id.is_none(),
        "the notice must not move Last-Event-ID"
    );
    assert_eq!(json(notice.data.as_bytes())["error"], "token_expired");
    assert!(s.next_event().is_none(), "closed after the notice");
    // Events published after the close, then the resume with a fresh token.
    for i in next..next + 5 {
        assert_eq!(publish_as(&g, "live", Some(&long), &format!("{i}")).0, 201);
    }
    let fresh = grants(&[], &["live"], now() + 600);
    let mut r = Sse::open(
        g.addr,
        &format!("/v1/streams/live?access_token={fresh}"),
        last_id.as_deref(),
    );
    assert_eq!(r.status, 200);
    while seen.len() < (next + 5) as usize {
        let e = r.next_event().expect("the resumed stream continues");
        seen.push(e.data);
    }
    let want: Vec<String> = (0..next + 5).map(|i| i.to_string()).collect();
    assert_eq!(seen, want, "every event exactly once, in order");
}

#[test]
fn cors_preflight_origins_and_headers() {
    let dir = tempfile::tempdir().unwrap();
    let g = start(&dir, &[]);
    let tok = grants(&["b-*"], &["b-*"], now() + 600);
    // Preflight from the allowed origin.
    let (st, h, _) = request(
        g.addr,
        "OPTIONS",
        "/v1/streams/b-1/events",
        &[
            ("Origin", ORIGIN),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization, content-type",
            ),
        ],
        b"",
    );
    assert_eq!(st, 204);
    assert_eq!(header(&h, "access-control-allow-origin"), Some(ORIGIN));
    assert_eq!(header(&h, "access-control-allow-credentials"), Some("true"));
    let allowed = header(&h, "access-control-allow-headers").unwrap();
    for want in [
        "Authorization",
        "Content-Type",
        "Last-Event-ID",
        "Event-Type",
        "Idempotency-Key",
    ] {
        assert!(allowed.contains(want), "{allowed}");
    }
    assert!(
        header(&h, "access-control-allow-methods")
            .unwrap()
            .contains("POST")
    );
    assert_eq!(header(&h, "vary"), Some("Origin"));
    // Another origin: refused, preflight and simple request alike, and nothing is appended.
    for method in ["OPTIONS", "POST"] {
        let bearer = format!("Bearer {tok}");
        let (st, h, body) = request(
            g.addr,
            method,
            "/v1/streams/b-1/events",
            &[
                ("Origin", "http://evil.example"),
                ("Authorization", &bearer),
            ],
            b"csrf",
        );
        assert_eq!(st, 403, "{method}");
        assert_eq!(json(&body)["error"], "origin_not_allowed");
        assert!(header(&h, "access-control-allow-origin").is_none());
    }
    // The allowed origin's answers carry the CORS headers, errors included.
    let bearer = format!("Bearer {tok}");
    let (st, h, _) = request(
        g.addr,
        "POST",
        "/v1/streams/b-1/events",
        &[("Origin", ORIGIN), ("Authorization", &bearer)],
        b"hello",
    );
    assert_eq!(st, 201);
    assert_eq!(header(&h, "access-control-allow-origin"), Some(ORIGIN));
    let exposed = header(&h, "access-control-expose-headers").unwrap();
    assert!(exposed.contains("Idempotent-Replay"), "{exposed}");
    let (st, h, _) = request(
        g.addr,
        "POST",
        "/v1/streams/b-1/events",
        &[("Origin", ORIGIN)],
        b"x",
    );
    assert_eq!(st, 401);
    assert_eq!(header(&h, "access-control-allow-origin"), Some(ORIGIN));
    assert!(header(&h, "www-authenticate").is_some());
    let s = Sse::open_with(
        g.addr,
        &format!("/v1/streams/b-1?from=earliest&access_token={tok}"),
        None,
        &[("Origin", ORIGIN)],
    );
    assert_eq!(s.status, 200);
    assert_eq!(s.header("access-control-allow-origin"), Some(ORIGIN));
    // Only b-1's one accepted event exists.
    let mut s = s;
    assert_eq!(s.next_event().unwrap().data, "hello");
}

#[test]
fn metrics_only_on_the_admin_listener() {
    let g = Gateway::start(&[]);
    let (st, _, body) = request(g.addr, "GET", "/metrics", &[], b"");
    assert_eq!(st, 404);
    assert!(String::from_utf8_lossy(&body).contains("--admin-listen"));
    let (st, _, body) = request(g.admin_addr, "GET", "/metrics", &[], b"");
    assert_eq!(st, 200);
    assert!(
        String::from_utf8_lossy(&body)
            .contains("gateway_refusals_total{core=\"0\",reason=\"auth\"}")
    );
    for a in [g.addr, g.admin_addr] {
        assert_eq!(request(a, "GET", "/healthz", &[], b"").0, 200);
    }
    assert_eq!(
        request(g.admin_addr, "GET", "/v1/streams/x", &[], b"").0,
        404
    );
}

/// Without authentication the gateway refuses a listener off loopback, unless told.
#[test]
fn refuses_to_expose_an_open_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args([
                "--listen",
                "0.0.0.0:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(dir.path())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let out = run(&[]).wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--insecure-no-auth"), "{err}");
    // With --insecure-no-auth it starts (and is stopped here).
    let mut child = run(&["--insecure-no-auth"]);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("listening on 0.0.0.0:"), "{line}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::io::stderr().flush();
}

/// Browser `EventSource` with credentials sends cookies, not headers: with
/// `--jwt-cookie-name` the token may come from that cookie (others are ignored).
#[test]
fn token_from_the_named_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let f = secret_file(&dir);
    let g = Gateway::start(&[
        "--jwt-hs256-secret-file",
        f.to_str().unwrap(),
        "--jwt-cookie-name",
        "gw_token",
    ]);
    let tok = grants(&["c"], &["c"], now() + 600);
    let cookie = format!("theme=dark; gw_token={tok}");
    let (st, _, _) = request(
        g.addr,
        "POST",
        "/v1/streams/c/events",
        &[("Cookie", &cookie)],
        b"x",
    );
    assert_eq!(st, 201);
    let mut s = Sse::open_with(
        g.addr,
        "/v1/streams/c?from=earliest",
        None,
        &[("Cookie", &cookie)],
    );
    assert_eq!(s.status, 200);
    assert_eq!(s.next_event().unwrap().data, "x");
    // Another cookie name, or the query string without --jwt-allow-query-token: no token.
    let other = format!("token={tok}");
    let s = Sse::open_with(g.addr, "/v1/streams/c", None, &[("Cookie", &other)]);
    assert_eq!(s.status, 401);
    let s = Sse::open(g.addr, &format!("/v1/streams/c?access_token={tok}"), None);
    assert_eq!(s.status, 401);
}

/// `--streams-per-subject-max`: each subject's publishes create at most that many streams
/// (429 `subject_quota` beyond, counted); publishing to a stream that exists is free, a
/// removal gives the place back, another subject has its own places, and anonymous requests
/// count as one subject per source address.
#[test]
fn each_subject_creates_a_bounded_number_of_streams() {
    let dir = tempfile::tempdir().unwrap();
    let extra = [
        "--streams-per-subject-max",
        "3",
        "--anonymous-publish",
        "anon-*",
    ];
    let g = start(&dir, &extra);
    let exp = now() + 600;
    let alice = token(&json!({"sub": "alice", "exp": exp, "gateway": {"publish": ["m-*"]}}));
    let bob = token(&json!({"sub": "bob", "exp": exp, "gateway": {"publish": ["m-*"]}}));
    for i in 0..3 {
        assert_eq!(publish_as(&g, &format!("m-a{i}"), Some(&alice), "x").0, 201);
    }
    let (st, _, v) = publish_as(&g, "m-a3", Some(&alice), "x");
    assert_eq!((st, v["error"].as_str()), (429, Some("subject_quota")));
    assert_eq!(publish_as(&g, "m-a0", Some(&alice), "again").0, 201);
    assert_eq!(publish_as(&g, "m-b0", Some(&bob), "x").0, 201);
    for i in 0..3 {
        assert_eq!(publish_as(&g, &format!("anon-{i}"), None, "x").0, 201);
    }
    assert_eq!(publish_as(&g, "anon-3", None, "x").0, 429);
    let h = format!("Bearer {alice}");
    let auth = [("Authorization", h.as_str())];
    assert_eq!(
        request(g.addr, "DELETE", "/v1/streams/m-a0", &auth, b"").0,
        200
    );
    assert_eq!(publish_as(&g, "m-a3", Some(&alice), "x").0, 201);
    assert_eq!(
        g.metric("gateway_refusals_total", "reason=\"subject_quota\""),
        2
    );
}
