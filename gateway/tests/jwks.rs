//! Key rotation through a JWKS URL, without a restart, against a JWKS server of the test's own
//! on loopback (a std::net thread serving what the test sets). Checked: a token of a key the
//! provider adds works — via the refresh an unknown `kid` asks for, and via the periodic
//! refresh —; a subscription opened with a key the provider then drops keeps streaming until
//! its token's `exp`, while a new token of that key is refused; failed refreshes (status,
//! broken document, oversized document) keep the last good set; a flood of made-up kids
//! causes a bounded number of fetches; a start where no key source works (an error status, a
//! server that never answers, a certificate from another CA) is refused with the URL named;
//! https:// against `--jwt-jwks-ca-file`.
#![forbid(unsafe_code)]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::{Gateway, Sse, request, run_to_exit};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

/// What the JWKS server answers: a status and a body.
type Answer = (u16, Vec<u8>);

/// The test's JWKS server: answers every request with the current answer, counts requests.
struct JwksServer {
    url: String,
    answer: Arc<Mutex<Answer>>,
    requests: Arc<AtomicU64>,
}

impl JwksServer {
    /// Over http:// on loopback.
    fn start(keys: &[&Key]) -> JwksServer {
        JwksServer::start_with(keys, None)
    }

    /// Over https:// with `tls`, or http:// without.
    fn start_with(keys: &[&Key], tls: Option<Arc<rustls::ServerConfig>>) -> JwksServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}/jwks.json", listener.local_addr().unwrap());
        let answer = Arc::new(Mutex::new((200, document(keys))));
        let requests = Arc::new(AtomicU64::new(0));
        let (a, n) = (answer.clone(), requests.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let Some(tls) = &tls else {
                    serve_one(conn, &a, &n);
                    continue;
                };
                let Ok(session) = rustls::ServerConnection::new(tls.clone()) else {
                    continue;
                };
                let mut stream = rustls::StreamOwned::new(session, conn);
                serve_one(&mut stream, &a, &n);
                stream.conn.send_close_notify();
                let _ = stream.flush();
            }
        });
        JwksServer {
            url,
            answer,
            requests,
        }
    }

    fn serve(&self, status: u16, body: Vec<u8>) {
        *self.answer.lock().unwrap() = (status, body);
    }

    fn serve_keys(&self, keys: &[&Key]) {
        self.serve(200, document(keys));
    }

    fn requests(&self) -> u64 {
        self.requests.load(Relaxed)
    }
}

/// Reads one request head and writes the current answer (the request counted).
fn serve_one(mut conn: impl Read + Write, answer: &Mutex<Answer>, requests: &AtomicU64) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).unwrap_or(0) != 1 {
            return;
        }
        head.push(byte[0]);
    }
    requests.fetch_add(1, Relaxed);
    let (status, body) = answer.lock().unwrap().clone();
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(&body);
}

/// A certificate authority made for the test (written to `dir` as PEM, for
/// `--jwt-jwks-ca-file`) and a server configuration with a certificate for 127.0.0.1 it issued.
fn test_ca(dir: &std::path::Path, name: &str) -> (String, Arc<rustls::ServerConfig>) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let pem_file = dir.join(format!("{name}-ca.pem"));
    std::fs::write(&pem_file, params.self_signed(&ca_key).unwrap().pem()).unwrap();
    let issuer = rcgen::Issuer::new(params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let key_der = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key_der.into())
        .unwrap();
    (pem_file.to_str().unwrap().to_owned(), Arc::new(cfg))
}

/// An ES256 key pair made for the test, and its `kid`.
struct Key {
    kid: String,
    signing: EncodingKey,
    jwk: Value,
}

impl Key {
    fn new(kid: &str) -> Key {
        let pair = rcgen::KeyPair::generate().unwrap();
        let point = pair.public_key_raw();
        assert_eq!(point.len(), 65, "an uncompressed P-256 point");
        let b64 = |b: &[u8]| URL_SAFE_NO_PAD.encode(b);
        Key {
            kid: kid.into(),
            signing: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
            jwk: json!({"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "use": "sig",
                        "x": b64(&point[1..33]), "y": b64(&point[33..])}),
        }
    }

    /// A token of this key (header `kid`: this key's), valid for `secs` more seconds.
    fn token(&self, secs: u64) -> String {
        self.token_as(&self.kid, secs)
    }

    /// A token signed by this key whose header names `kid`.
    fn token_as(&self, kid: &str, secs: u64) -> String {
        let now = unix_now();
        let claims = json!({"sub": "rotator", "exp": now + secs,
            "gateway": {"publish": ["*"], "subscribe": ["*"]}});
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.into());
        encode(&header, &claims, &self.signing).unwrap()
    }
}

fn document(keys: &[&Key]) -> Vec<u8> {
    let keys: Vec<&Value> = keys.iter().map(|k| &k.jwk).collect();
    serde_json::to_vec(&json!({ "keys": keys })).unwrap()
}

fn publish(g: &Gateway, token: &str, data: &str) -> u16 {
    let auth = format!("Bearer {token}");
    let headers = [("Authorization", auth.as_str())];
    let path = "/v1/streams/rot/events";
    request(g.addr, "POST", path, &headers, data.as_bytes()).0
}

/// Publishes with `token` until the answer is `want` (a refresh runs on its own thread), at
/// most 20 s; returns the statuses seen before.
fn until_status(g: &Gateway, token: &str, want: u16) -> Vec<u16> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let got = publish(g, token, "probe");
        if got == want {
            return seen;
        }
        seen.push(got);
        assert!(Instant::now() < deadline, "still {got}, want {want}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A metric without labels, or the sum of a labelled family's series matching `labels`.
fn metric(g: &Gateway, name: &str, labels: &str) -> u64 {
    let (_, _, body) = request(g.admin_addr, "GET", "/metrics", &[], b"");
    let text = String::from_utf8(body).unwrap();
    text.lines()
        .filter(|l| {
            let rest = l.strip_prefix(name).unwrap_or("x");
            rest.starts_with(' ') || (rest.starts_with('{') && rest.contains(labels))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Waits (at most 20 s) until `f` holds.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads `sse` until an event with `data` (panics if the stream ends first).
fn until_event(sse: &mut Sse, data: &str) {
    loop {
        let ev = sse.next_event().expect("the subscription stayed open");
        if ev.data == data {
            return;
        }
    }
}

#[test]
fn keys_rotate_through_the_jwks_url_without_a_restart() {
    let (a, b) = (Key::new("key-a"), Key::new("key-b"));
    let server = JwksServer::start(&[&a]);
    let g = Gateway::start(&[
        "--jwt-jwks-url",
        &server.url,
        "--jwt-jwks-refresh-secs",
        "3600",
        "--jwt-jwks-refetch-min-secs",
        "1",
        "--cores",
        "2",
    ]);
    assert_eq!(publish(&g, &a.token(600), "first"), 201);
    // A's subscription, with a token that expires in 15 s.
    let a_exp = unix_now() + 15;
    let a_auth = format!("Bearer {}", a.token(15));
    let mut sse = Sse::open_with(
        g.addr,
        "/v1/streams/rot",
        None,
        &[("Authorization", &a_auth)],
    );
    assert_eq!(sse.status, 200);

    // The provider adds B: B's first token names an unknown kid, which asks for a refresh.
    assert_eq!(publish(&g, &b.token(600), "too early"), 401);
    server.serve_keys(&[&a, &b]);
    until_status(&g, &b.token(600), 201);
    assert!(metric(&g, "gateway_jwt_jwks_unknown_kid_fetches_total", "") >= 1);

    // The provider drops A. A refresh (asked for by a made-up kid) takes A's keys away: a new
    // token of A is refused, the subscription opened with A keeps streaming.
    server.serve_keys(&[&b]);
    until_status(&g, &b.token_as("made-up", 600), 401);
    until_status(&g, &a.token(600), 401);
    assert_eq!(publish(&g, &b.token(600), "after rotation"), 201);
    until_event(&mut sse, "after rotation");

    // Failed refreshes keep the last good set: an error status, a broken document, one over
    // --jwt-jwks-bytes-max. Each is asked for by a made-up kid and seen by the server.
    let oversized = format!(r#"{{"keys": [], "pad": "{}"}}"#, "x".repeat(300 * 1024));
    for (status, body) in [
        (503, b"down".to_vec()),
        (200, b"{\"keys\": 7}".to_vec()),
        (200, oversized.into_bytes()),
    ] {
        let failed = metric(&g, "gateway_jwt_jwks_fetches_total", "failed");
        server.serve(status, body);
        until("a failed fetch", || {
            publish(&g, &b.token_as("made-up", 600), "x");
            metric(&g, "gateway_jwt_jwks_fetches_total", "failed") > failed
        });
        assert_eq!(
            publish(&g, &b.token(600), "still B"),
            201,
            "status {status}"
        );
    }
    assert_eq!(metric(&g, "gateway_jwt_jwks_urls_failing", ""), 1);
    server.serve_keys(&[&b]);
    until("the URL working again", || {
        publish(&g, &b.token_as("made-up", 600), "x");
        metric(&g, "gateway_jwt_jwks_urls_failing", "") == 0
    });

    // A flood of made-up kids: every token refused and counted, the fetches bounded by
    // --jwt-jwks-refetch-min-secs (1 s here) over the flood's duration.
    let (before, requests_before) = (
        metric(&g, "gateway_jwt_unknown_kid_total", ""),
        server.requests(),
    );
    let flood_started = Instant::now();
    for i in 0..200 {
        assert_eq!(
            publish(&g, &b.token_as(&format!("forged-{i}"), 600), "x"),
            401
        );
    }
    let bound = flood_started.elapsed().as_secs() + 2;
    assert_eq!(
        metric(&g, "gateway_jwt_unknown_kid_total", ""),
        before + 200
    );
    let fetched = server.requests() - requests_before;
    let took = flood_started.elapsed();
    eprintln!("200 tokens with made-up kids in {took:?}: {fetched} JWKS fetches (bound {bound})");
    assert!(
        fetched <= bound,
        "{fetched} fetches for 200 unknown kids, bound {bound}"
    );

    // The subscription opened with A's token ends at its exp (in-band), not before.
    loop {
        let ev = sse
            .next_event()
            .expect("the subscription ends with event: expired");
        if ev.event.as_deref() == Some("expired") {
            break;
        }
    }
    assert!(unix_now() >= a_exp, "ended at its exp, not earlier");
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn the_periodic_refresh_takes_up_a_new_key() {
    let (a, c) = (Key::new("key-a"), Key::new("key-c"));
    let server = JwksServer::start(&[&a]);
    let g = Gateway::start(&[
        "--jwt-jwks-url",
        &server.url,
        "--jwt-jwks-refresh-secs",
        "1",
        "--jwt-jwks-refetch-min-secs",
        "3600",
    ]);
    assert_eq!(publish(&g, &a.token(600), "a"), 201);
    let changed = metric(&g, "gateway_jwt_jwks_fetches_total", "changed");
    server.serve_keys(&[&a, &c]);
    until("the periodic refresh", || {
        metric(&g, "gateway_jwt_jwks_fetches_total", "changed") > changed
    });
    // No unknown kid was met: the periodic refresh alone brought C.
    assert_eq!(publish(&g, &c.token(600), "c"), 201);
    assert_eq!(metric(&g, "gateway_jwt_unknown_kid_total", ""), 0);
    assert_eq!(metric(&g, "gateway_jwt_jwks_keys", ""), 2);
}

#[test]
fn a_start_where_no_key_source_works_is_refused_naming_the_url() {
    let server = JwksServer::start(&[]);
    server.serve(500, b"no".to_vec());
    let dir = tempfile::tempdir().unwrap();
    let (status, err) = run_to_exit(dir.path(), &["--jwt-jwks-url", &server.url], 30);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("no JWT key source works"), "{err}");
    assert!(err.contains(&server.url) && err.contains("500"), "{err}");

    // With a key file beside it the gateway starts, and says the URL failed.
    let secret = dir.path().join("hs256.secret");
    std::fs::write(&secret, [b'k'; 32]).unwrap();
    let mut g = Gateway::start_logged(&[
        "--jwt-jwks-url",
        &server.url,
        "--jwt-jwks-refetch-min-secs",
        "1",
        "--jwt-hs256-secret-file",
        secret.to_str().unwrap(),
    ]);
    until("the failure logged", || {
        let logged = g.stderr_lines().join("\n");
        logged.contains("JWKS fetch failed") && logged.contains(&server.url)
    });

    // The failed URL is retried and its keys are taken up once it works; a SIGHUP (which
    // re-reads the key file) keeps them.
    let a = Key::new("key-a");
    server.serve_keys(&[&a]);
    until_status(&g, &a.token(600), 201);
    g.signal("HUP");
    until("the reload logged", || {
        g.stderr_lines()
            .iter()
            .any(|l| l.contains("SIGHUP: JWT keys reloaded"))
    });
    assert_eq!(publish(&g, &a.token(600), "after SIGHUP"), 201);

    // http:// to another host than loopback is refused before any fetch.
    let (status, err) = run_to_exit(
        dir.path(),
        &["--jwt-jwks-url", "http://idp.example/jwks.json"],
        30,
    );
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("loopback"), "{err}");
}

#[test]
fn an_https_url_is_checked_against_the_given_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, tls) = test_ca(dir.path(), "idp");
    let a = Key::new("key-a");
    let server = JwksServer::start_with(&[&a], Some(tls));
    let g = Gateway::start(&["--jwt-jwks-url", &server.url, "--jwt-jwks-ca-file", &ca]);
    assert_eq!(publish(&g, &a.token(600), "over https"), 201);

    // Checked against another CA the certificate is not trusted: no key source works.
    let (other_ca, _) = test_ca(dir.path(), "other");
    let args = [
        "--jwt-jwks-url",
        &server.url,
        "--jwt-jwks-ca-file",
        &other_ca,
    ];
    let (status, err) = run_to_exit(dir.path(), &args, 30);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("no JWT key source works"), "{err}");
    assert!(
        err.to_lowercase().contains("certificate"),
        "a TLS refusal: {err}"
    );
}

#[test]
fn a_jwks_server_that_never_answers_times_out() {
    // Accepts connections and holds them without a byte of answer.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            held.push(conn);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let args = ["--jwt-jwks-url", &url, "--jwt-jwks-timeout-secs", "1"];
    let (status, err) = run_to_exit(dir.path(), &args, 30);
    eprintln!("refused after {:?}: {err}", started.elapsed());
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(&url) && err.contains("--jwt-jwks-timeout-secs"),
        "{err}"
    );
}
