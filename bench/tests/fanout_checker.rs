//! End-to-end over loopback: the bench's load driver against a tiny in-process SSE pub/sub
//! server (std::net, thread per connection) that can be told to misbehave — skip or repeat an
//! event — so the checker provably catches injected gaps and duplicates, and stays quiet when
//! the server is correct (including cut-and-resume with Last-Event-ID and chunked bodies).
//!
//! Small sizes, short timeouts, loopback only; every thread stops when the server is dropped.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use bench::load::{self, LoadConfig};
use bench::resume_class::ResumeClass;
use bench::target::{Bearer, IdStyle, PublishStyle, UrlTemplate};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Never send the event at this index (a silent gap).
    Skip(usize),
    /// Send the event at this index twice.
    Repeat(usize),
    /// Answer every resume (a subscribe with Last-Event-ID) with 410.
    GoneOnResume,
    /// Answer every resume with `event: truncated`, then continue this many events later.
    TruncateOnResume(usize),
    /// Close the subscriber's connection right after each event whose sequence is a multiple
    /// of this (the subscriber resumes with Last-Event-ID).
    CloseEvery(usize),
}

struct Shared {
    log: Mutex<HashMap<String, Vec<Vec<u8>>>>,
    cv: Condvar,
    stop: AtomicBool,
    fault: Fault,
    chunked: bool,
    /// Every request's method and `Authorization` header value (if any), in arrival order.
    auth_seen: Mutex<Vec<(String, Option<String>)>>,
}

struct TestServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.cv.notify_all();
        let _ = TcpStream::connect(self.addr); // unblock accept
    }
}

fn start_server(fault: Fault, chunked: bool) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let shared = Arc::new(Shared {
        log: Mutex::new(HashMap::new()),
        cv: Condvar::new(),
        stop: AtomicBool::new(false),
        fault,
        chunked,
        auth_seen: Mutex::new(Vec::new()),
    });
    let sh = shared.clone();
    thread::spawn(move || {
        for conn in listener.incoming() {
            if sh.stop.load(Ordering::SeqCst) {
                break;
            }
            let Ok(conn) = conn else { continue };
            let sh = sh.clone();
            thread::spawn(move || {
                let _ = serve(conn, &sh);
            });
        }
    });
    TestServer { addr, shared }
}

fn stream_of(path: &str) -> String {
    path.split("id=")
        .nth(1)
        .unwrap_or("")
        .split('&')
        .next()
        .unwrap_or("")
        .to_string()
}

fn serve(conn: TcpStream, sh: &Shared) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let mut content_length = 0usize;
        let mut last_id: Option<u64> = None;
        let mut authorization: Option<String> = None;
        loop {
            let mut h = String::new();
            r.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap_or((h, ""));
            match k.to_ascii_lowercase().as_str() {
                "content-length" => content_length = v.trim().parse().unwrap_or(0),
                "last-event-id" => {
                    last_id = v.trim().rsplit('-').next().and_then(|s| s.parse().ok())
                }
                "authorization" => authorization = Some(v.trim().to_string()),
                _ => {}
            }
        }
        let stream = stream_of(&path);
        sh.auth_seen
            .lock()
            .unwrap()
            .push((method.clone(), authorization));
        if method == "POST" {
            let mut body = vec![0; content_length];
            r.read_exact(&mut body)?;
            sh.log.lock().unwrap().entry(stream).or_default().push(body);
            sh.cv.notify_all();
            w.write_all(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")?;
            continue;
        }
        if sh.fault == Fault::GoneOnResume && last_id.is_some() {
            w.write_all(b"HTTP/1.1 410 Gone\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")?;
            return Ok(());
        }
        let te = if sh.chunked {
            "Transfer-Encoding: chunked\r\n"
        } else {
            ""
        };
        // Like the gateway, a resume says how it was served (this server always replays).
        let class = if last_id.is_some() {
            "X-Resume-Class: replay\r\n"
        } else {
            ""
        };
        w.write_all(
            format!("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{te}{class}\r\n")
                .as_bytes(),
        )?;
        // IDs are gateway-shaped: <epoch16hex>-<stream>-<seq>, seq = index + 1.
        let mut next = last_id.map(|s| s as usize).unwrap_or(0);
        let send = |w: &mut TcpStream, text: &[u8]| -> std::io::Result<()> {
            if sh.chunked {
                w.write_all(format!("{:x}\r\n", text.len()).as_bytes())?;
                w.write_all(text)?;
                w.write_all(b"\r\n")
            } else {
                w.write_all(text)
            }
        };
        send(&mut w, b": hello\n\n")?;
        if let (Fault::TruncateOnResume(skip), Some(_)) = (sh.fault, last_id) {
            send(&mut w, b"event: truncated\ndata: {\"floor\":1}\n\n")?;
            next += skip;
        }
        loop {
            let batch: Vec<(usize, Vec<u8>)> = {
                let mut log = sh.log.lock().unwrap();
                loop {
                    if sh.stop.load(Ordering::SeqCst) {
                        return Ok(());
                    }
                    let have = log.get(&stream).map(|v| v.len()).unwrap_or(0);
                    if have > next {
                        break;
                    }
                    log = sh
                        .cv
                        .wait_timeout(log, Duration::from_millis(50))
                        .unwrap()
                        .0;
                }
                let events = &log[&stream];
                (next..events.len())
                    .map(|i| (i, events[i].clone()))
                    .collect()
            };
            for (i, data) in batch {
                next = i + 1;
                if sh.fault == Fault::Skip(i) {
                    continue;
                }
                let reps = if sh.fault == Fault::Repeat(i) { 2 } else { 1 };
                for _ in 0..reps {
                    let mut ev = format!("id: 00000000000000aa-{stream}-{}\n", i + 1).into_bytes();
                    ev.extend_from_slice(b"data: ");
                    ev.extend_from_slice(&data);
                    ev.extend_from_slice(b"\n\n");
                    send(&mut w, &ev)?;
                }
                if let Fault::CloseEvery(k) = sh.fault
                    && (i + 1) % k == 0
                {
                    return Ok(()); // dropping both halves closes the connection
                }
            }
        }
    }
}

fn config(addr: SocketAddr, subscribers: usize, events: u64) -> LoadConfig {
    LoadConfig {
        publish: UrlTemplate::parse(&format!("http://{addr}/pub?id={{stream}}")).unwrap(),
        subscribe: UrlTemplate::parse(&format!("http://{addr}/sub?id={{stream}}")).unwrap(),
        publish_style: PublishStyle::Nchan,
        id_style: IdStyle::Gateway,
        stream_prefix: "t".into(),
        streams: 2,
        subscribers_per_stream: subscribers,
        slow_subscribers_per_stream: 0,
        slow_rate_divisor: 20,
        events_per_stream: events,
        payload_bytes: 64,
        rate_events_per_sec: 0,
        publishers: 2,
        pipeline_depth: 8,
        batch_events: 1,
        publish_batch: None,
        publish_secs_max: 10.0,
        drain_secs_max: 20.0, // ends as soon as every subscriber has everything
        connect_secs_max: 30.0,
        idle_hold_secs: None,
        cuts_per_sec: 0.0,
        cut_at_boundary: false,
        cut_at_eagain: false,
        cut_pause_ms: 0,
        subscriber_rcvbuf_bytes: 0,
        source_addrs: 1,
        source_addr_first: 1,
        connects_inflight_max: 64,
        header_bytes_max: 8192,
        reconnects_max: 1000,
        target_pids: vec![std::process::id()],
        seed: 7,
        bearer: Bearer::none(),
        tls: None,
        progress_interval_secs: 0,
    }
}

#[test]
fn correct_server_gives_zero_violations() {
    for chunked in [false, true] {
        let srv = start_server(Fault::None, chunked);
        let r = load::run(&config(srv.addr, 3, 200)).unwrap();
        assert_eq!(r.fast.events, 2 * 3 * 200, "chunked={chunked}");
        assert_eq!(
            r.fast.violations(),
            0,
            "chunked={chunked}: {:?} {:?}",
            r.fast,
            r.errors
        );
        assert_eq!(r.published, 400);
        assert_eq!(r.latency_fast_ns.len(), 1200);
        assert!(r.server.is_some());
    }
}

#[test]
fn no_authorization_header_by_default() {
    let srv = start_server(Fault::None, false);
    let r = load::run(&config(srv.addr, 2, 20)).unwrap();
    assert_eq!(r.fast.violations(), 0, "{:?} {:?}", r.fast, r.errors);
    let seen = srv.shared.auth_seen.lock().unwrap();
    assert_eq!(seen.len(), 2 * 2 + 40, "4 subscribes and 40 publishes");
    assert!(seen.iter().all(|(_, a)| a.is_none()), "{seen:?}");
}

#[test]
fn bearer_token_is_sent_on_every_publish_and_subscribe() {
    // Resumes (subscribes with Last-Event-ID after a cut) must carry it too.
    let srv = start_server(Fault::None, false);
    let mut cfg = config(srv.addr, 2, 1500);
    storm(&mut cfg);
    cfg.bearer = Bearer::from_token_text("hdr.claims.sig\n").unwrap();
    let r = load::run(&cfg).unwrap();
    assert_eq!(r.fast.violations(), 0, "{:?} {:?}", r.fast, r.errors);
    assert!(r.cuts > 0, "no resume was exercised");
    let seen = srv.shared.auth_seen.lock().unwrap();
    let posts = seen.iter().filter(|(m, _)| m == "POST").count();
    let gets = seen.iter().filter(|(m, _)| m == "GET").count();
    assert_eq!(posts, 2 * 1500);
    assert!(
        gets as u64 >= 4 + r.cuts.min(1),
        "subscribes {gets}, cuts {}",
        r.cuts
    );
    for (method, auth) in seen.iter() {
        assert_eq!(auth.as_deref(), Some("Bearer hdr.claims.sig"), "{method}");
    }
}

#[test]
fn injected_gap_is_caught_per_subscriber() {
    let srv = start_server(Fault::Skip(50), false);
    let r = load::run(&config(srv.addr, 3, 100)).unwrap();
    // Both streams skip index 50, for each of their 3 subscribers.
    assert_eq!(r.fast.gaps, 6, "{:?}", r.fast);
    assert_eq!(r.fast.missing_events, 6);
    assert_eq!(r.fast.duplicates, 0);
    assert_eq!(r.fast.events, 6 * 99);
    assert!(r.fast.violations() >= 6);
}

#[test]
fn injected_duplicate_is_caught() {
    let srv = start_server(Fault::Repeat(10), true);
    let r = load::run(&config(srv.addr, 2, 50)).unwrap();
    assert_eq!(r.fast.duplicates, 4, "{:?}", r.fast);
    // The repeated event also repeats its ID's sequence: still in step with the counter.
    assert_eq!(r.fast.id_mismatches, 0);
    assert_eq!(r.fast.gaps, 0);
}

fn storm(cfg: &mut LoadConfig) {
    cfg.rate_events_per_sec = 6000;
    cfg.cuts_per_sec = 200.0;
}

#[test]
fn gone_on_resume_is_explicit_not_a_gap() {
    let srv = start_server(Fault::GoneOnResume, false);
    let mut cfg = config(srv.addr, 4, 1500);
    storm(&mut cfg);
    let r = load::run(&cfg).unwrap();
    assert!(r.http_410 > 0, "no resume was answered 410");
    assert_eq!(r.fast.explicit_truncations, r.http_410);
    assert_eq!(r.fast.gaps, 0);
    // A subscriber that got 410 stopped: its missing tail is explicit, not undelivered.
    assert_eq!(r.fast.violations(), 0, "{:?} {:?}", r.fast, r.errors);
}

#[test]
fn truncation_notice_on_resume_is_explicit_not_a_gap() {
    let srv = start_server(Fault::TruncateOnResume(5), true);
    let mut cfg = config(srv.addr, 4, 1500);
    storm(&mut cfg);
    let r = load::run(&cfg).unwrap();
    assert!(r.fast.explicit_truncations > 0);
    assert!(r.fast.skipped_explicitly > 0);
    assert_eq!(r.fast.gaps, 0);
    assert_eq!(r.fast.violations(), 0, "{:?} {:?}", r.fast, r.errors);
}

#[test]
fn gap_during_a_resume_storm_is_caught() {
    // Cuts and resumes must not mask a server that drops an event (here index 1400).
    let srv = start_server(Fault::Skip(1400), false);
    let mut cfg = config(srv.addr, 2, 1500);
    storm(&mut cfg);
    let r = load::run(&cfg).unwrap();
    assert!(r.fast.gaps >= 1, "{:?}", r.fast);
}

#[test]
fn cut_and_resume_stays_gap_free() {
    let srv = start_server(Fault::None, false);
    let mut cfg = config(srv.addr, 4, 3000);
    storm(&mut cfg);
    let r = load::run(&cfg).unwrap();
    assert!(r.cuts > 20, "cuts {}", r.cuts);
    assert!(
        r.resume_ns.len() > 20,
        "resumes measured {}",
        r.resume_ns.len()
    );
    // A first event after a resume implies its head came first; every head follows a cut.
    assert!(r.resume_headers_ns.len() >= r.resume_ns.len());
    assert!(r.resume_headers_ns.len() <= r.cuts);
    assert_eq!(r.fast.violations(), 0, "{:?} {:?}", r.fast, r.errors);
    assert_eq!(r.fast.events, 2 * 4 * 3000);
    // Every resume carried `X-Resume-Class: replay`; each timed one is in that class.
    let b = &r.resume_by_class;
    let replay = ResumeClass::Replay.index();
    assert!(b.resumes[replay] >= r.resume_ns.len());
    assert_eq!(b.resumes.iter().sum::<u64>(), b.resumes[replay]);
    assert_eq!(b.to_first_event_ns[replay].len(), r.resume_ns.len());
    assert_eq!(b.to_head_ns[replay].len(), r.resume_headers_ns.len());
}

#[test]
fn boundary_cuts_stay_gap_free_and_are_classified() {
    let srv = start_server(Fault::None, false);
    let mut cfg = config(srv.addr, 4, 3000);
    storm(&mut cfg);
    cfg.cut_at_boundary = true;
    cfg.subscriber_rcvbuf_bytes = 4096;
    let r = load::run(&cfg).unwrap();
    assert!(r.cuts > 20, "cuts {}", r.cuts);
    assert_eq!(r.fast.violations(), 0, "{:?} {:?}", r.fast, r.errors);
    assert_eq!(r.fast.events, 2 * 4 * 3000);
    let b = &r.resume_by_class;
    let replay = ResumeClass::Replay.index();
    assert!(b.to_first_event_ns[replay].len() > 20);
    assert_eq!(b.resumes.iter().sum::<u64>(), b.resumes[replay]);
}

#[test]
fn stalled_eagain_cuts_stay_gap_free() {
    let srv = start_server(Fault::None, false);
    let mut cfg = config(srv.addr, 4, 3000);
    storm(&mut cfg);
    cfg.cut_at_eagain = true;
    cfg.cut_pause_ms = 5;
    cfg.subscriber_rcvbuf_bytes = 4096;
    let r = load::run(&cfg).unwrap();
    assert!(r.cuts > 20, "cuts {}", r.cuts);
    assert_eq!(r.fast.violations(), 0, "{:?} {:?}", r.fast, r.errors);
    assert_eq!(r.fast.events, 2 * 4 * 3000);
}

#[test]
fn gap_during_a_stalled_eagain_storm_is_caught() {
    let srv = start_server(Fault::Skip(1400), false);
    let mut cfg = config(srv.addr, 2, 1500);
    storm(&mut cfg);
    cfg.cut_at_eagain = true;
    cfg.cut_pause_ms = 5;
    cfg.subscriber_rcvbuf_bytes = 4096;
    let r = load::run(&cfg).unwrap();
    assert!(r.fast.gaps >= 1, "{:?}", r.fast);
}

/// A server that answers one publish twice (more responses than requests — what a server that
/// speaks first, or duplicates an answer, looks like) makes the run fail with an explicit
/// publisher error, never a panic of the load driver.
#[test]
fn unsolicited_response_is_an_error_not_a_panic() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let t = thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            if stop2.load(Ordering::SeqCst) {
                break;
            }
            let Ok(mut c) = conn else { continue };
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && c.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            if head.starts_with(b"GET") {
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n");
                held.push(c); // an idle subscription until the test ends
            } else {
                // Both answers in one write, so they arrive together: written apart, a loaded
                // machine could let the client send its next request in between, and the
                // second answer would look solicited.
                let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
                let _ = c.write_all(&[&ok[..], &ok[..]].concat());
                held.push(c);
            }
        }
    });
    let mut cfg = config(addr, 1, 10);
    cfg.publishers = 1;
    cfg.pipeline_depth = 1;
    cfg.connect_secs_max = 5.0;
    cfg.publish_secs_max = 2.0;
    cfg.drain_secs_max = 2.0;
    let r = load::run(&cfg);
    stop.store(true, Ordering::SeqCst);
    let _ = TcpStream::connect(addr);
    t.join().unwrap();
    let err = format!(
        "{:?}",
        r.expect_err("a second answer to one request must fail the run")
    );
    assert!(err.contains("unsolicited HTTP 200"), "{err}");
}

// ---- https:// ----------------------------------------------------------------------------
// The same server behind a TLS-terminating proxy (rustls server, ring): the load driver's
// sans-IO TLS client over its non-blocking sockets must deliver everything, gap-free, in plain
// fan-out, with pipelined publishes, in a resume storm (cuts mid-record), and must fail cleanly
// (no hang) against a certificate it does not trust.

/// Self-signed P-256 test certificate for `IP:127.0.0.1` and `DNS:localhost` (valid 100 years;
/// `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 36500
/// -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost`).
const TEST_CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBmjCCAUGgAwIBAgIUcGOmPkv5bfo5frxzZXmSFVQWIJ8wCgYIKoZIzj0EAwIw\nFDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTIwMzA3NTk1MloYDzIxMjYxMTA5\nMDc1OTUyWjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjO\nPQMBBwNCAARDorsPXbsbY7zCnyBIeeT+7qLux524e1PRCV0yL6AqjdHsKSWR98Fs\nWvlco3pBWjrAmw5t9WIDO126i9k1Yea2o28wbTAdBgNVHQ4EFgQUr5tQgqx8SAJR\n/ro+0wey2yI4jHswHwYDVR0jBBgwFoAUr5tQgqx8SAJR/ro+0wey2yI4jHswDwYD\nVR0TAQH/BAUwAwEB/zAaBgNVHREEEzARhwR/AAABgglsb2NhbGhvc3QwCgYIKoZI\nzj0EAwIDRwAwRAIgNkbUIjiZ5tT8p7BHIbGnIQh+XHD9EZqxNW/rhJ3sob0CIB4q\nZtuNAU4EecXBGNzu9N8kkAfPXsthfNHaeqaCVvjC\n-----END CERTIFICATE-----\n";
const TEST_KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgvYF5gY2GfHVBILod\nhLrCThuNCLr/4h583fqKnDaotS6hRANCAARDorsPXbsbY7zCnyBIeeT+7qLux524\ne1PRCV0yL6AqjdHsKSWR98FsWvlco3pBWjrAmw5t9WIDO126i9k1Yea2\n-----END PRIVATE KEY-----\n";
/// Another self-signed certificate (not the one the proxy serves).
const OTHER_CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBiDCCAS6gAwIBAgIUK6EqXxK343FS6iD9qWXEKPAqZ6swCgYIKoZIzj0EAwIw\nEDEOMAwGA1UEAwwFb3RoZXIwIBcNMjYxMjAzMDc1OTUyWhgPMjEyNjExMDkwNzU5\nNTJaMBAxDjAMBgNVBAMMBW90aGVyMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\nw3BP8tzcK5lY2icUJIwz7FnMe+6poDUfsok85TK4aADqGvzeHH4HfqYpe7TZgviM\nmndF5ONXyRmUeIRo4npV9KNkMGIwHQYDVR0OBBYEFF2tZDUiKoWlITvIiaAWml7E\n/rCjMB8GA1UdIwQYMBaAFF2tZDUiKoWlITvIiaAWml7E/rCjMA8GA1UdEwEB/wQF\nMAMBAf8wDwYDVR0RBAgwBocEfwAAATAKBggqhkjOPQQDAgNIADBFAiBpNykkUaeM\n88GusB6T/kWDQ/8qpyh0qNMcX7B3fHPXIwIhAIePBD/Po96uMy46ijbjR2XIWk3k\nPkYysy490ASo65Wg\n-----END CERTIFICATE-----\n";

struct TlsProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn start_tls_proxy(backend: SocketAddr) -> TlsProxy {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = vec![CertificateDer::from_pem_slice(TEST_CERT.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(TEST_KEY.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    thread::spawn(move || {
        for c in listener.incoming() {
            if st.load(Ordering::SeqCst) {
                break;
            }
            let Ok(c) = c else { continue };
            let cfg = cfg.clone();
            thread::spawn(move || {
                let _ = proxy_one(c, backend, cfg);
            });
        }
    });
    TlsProxy { addr, stop }
}

/// One proxied connection: this thread moves client → backend, a second backend → client;
/// the rustls session is shared under a mutex. Small TLS writes (one per backend read) so the
/// client sees many records, split across its reads.
fn proxy_one(
    client: TcpStream,
    backend: SocketAddr,
    cfg: Arc<rustls::ServerConfig>,
) -> std::io::Result<()> {
    let tls = Arc::new(Mutex::new(
        rustls::ServerConnection::new(cfg).map_err(std::io::Error::other)?,
    ));
    let back = TcpStream::connect(backend)?;
    back.set_nodelay(true)?;
    client.set_nodelay(true)?;
    let (mut back_r, mut back_w) = (back.try_clone()?, back);
    let (mut cli_r, cli_w) = (client.try_clone()?, client);
    let cli_w = Arc::new(Mutex::new(cli_w));
    let (tls2, cli_w2) = (tls.clone(), cli_w.clone());
    thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        loop {
            let n = match back_r.read(&mut buf) {
                Ok(0) | Err(_) => 0,
                Ok(n) => n,
            };
            let mut t = tls2.lock().unwrap();
            let mut w = cli_w2.lock().unwrap();
            if n == 0 {
                t.send_close_notify();
            } else if t.writer().write_all(&buf[..n]).is_err() {
                return;
            }
            while t.wants_write() {
                if t.write_tls(&mut *w).is_err() {
                    return;
                }
            }
            if n == 0 {
                let _ = w.shutdown(std::net::Shutdown::Write);
                return;
            }
        }
    });
    let mut buf = vec![0u8; 16384];
    loop {
        let n = cli_r.read(&mut buf)?;
        let mut plain = Vec::new();
        {
            let mut t = tls.lock().unwrap();
            if n == 0 {
                let _ = back_w.shutdown(std::net::Shutdown::Both);
                return Ok(());
            }
            let mut rd = &buf[..n];
            while !rd.is_empty() {
                t.read_tls(&mut rd)?;
                if t.process_new_packets().is_err() {
                    let mut w = cli_w.lock().unwrap();
                    let _ = t.write_tls(&mut *w);
                    let _ = back_w.shutdown(std::net::Shutdown::Both);
                    return Ok(());
                }
            }
            let _ = t.reader().read_to_end(&mut plain);
            let mut w = cli_w.lock().unwrap();
            while t.wants_write() {
                t.write_tls(&mut *w)?;
            }
        }
        if !plain.is_empty() {
            back_w.write_all(&plain)?;
        }
    }
}

fn tls_config(
    addr: SocketAddr,
    host: &str,
    subscribers: usize,
    events: u64,
    ca: &str,
) -> LoadConfig {
    let mut cfg = config(addr, subscribers, events);
    let port = addr.port();
    cfg.publish = UrlTemplate::parse(&format!("https://{host}:{port}/pub?id={{stream}}")).unwrap();
    cfg.subscribe =
        UrlTemplate::parse(&format!("https://{host}:{port}/sub?id={{stream}}")).unwrap();
    let dir = std::env::temp_dir().join(format!("bench-tls-test-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_path = dir.join("ca.pem");
    std::fs::write(&ca_path, ca).unwrap();
    cfg.tls = Some(bench::tls::client_config(&ca_path).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    cfg
}

#[test]
fn https_fanout_is_gap_free() {
    for chunked in [false, true] {
        for host in ["127.0.0.1", "localhost"] {
            let srv = start_server(Fault::None, chunked);
            let proxy = start_tls_proxy(srv.addr);
            let r = load::run(&tls_config(proxy.addr, host, 3, 500, TEST_CERT)).unwrap();
            assert_eq!(
                r.fast.events,
                2 * 3 * 500,
                "chunked={chunked} {host}: {:?}",
                r.errors
            );
            assert_eq!(r.fast.violations(), 0, "{:?} {:?}", r.fast, r.errors);
            assert_eq!(r.published, 1000);
        }
    }
}

#[test]
fn https_catches_an_injected_gap() {
    let srv = start_server(Fault::Skip(50), false);
    let proxy = start_tls_proxy(srv.addr);
    let r = load::run(&tls_config(proxy.addr, "127.0.0.1", 3, 100, TEST_CERT)).unwrap();
    assert_eq!(r.fast.gaps, 6, "{:?} {:?}", r.fast, r.errors);
    assert_eq!(r.fast.events, 6 * 99);
}

#[test]
fn https_cut_and_resume_stays_gap_free() {
    let srv = start_server(Fault::None, false);
    let proxy = start_tls_proxy(srv.addr);
    let mut cfg = tls_config(proxy.addr, "127.0.0.1", 3, 2000, TEST_CERT);
    storm(&mut cfg);
    let r = load::run(&cfg).unwrap();
    assert_eq!(r.fast.violations(), 0, "{:?} {:?}", r.fast, r.errors);
    assert!(r.cuts > 0, "no resume was exercised");
}

#[test]
fn https_with_an_untrusted_certificate_fails_cleanly() {
    let srv = start_server(Fault::None, false);
    let proxy = start_tls_proxy(srv.addr);
    let mut cfg = tls_config(proxy.addr, "127.0.0.1", 1, 10, OTHER_CERT);
    cfg.connect_secs_max = 5.0;
    let t0 = std::time::Instant::now();
    let err = load::run(&cfg).unwrap_err().to_string();
    assert!(err.contains("TLS") || err.contains("certificate"), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
}

#[test]
fn https_without_a_ca_is_a_configuration_error() {
    let mut cfg = config("127.0.0.1:9".parse().unwrap(), 1, 1);
    cfg.subscribe = UrlTemplate::parse("https://127.0.0.1:9/sub?id={stream}").unwrap();
    let err = load::run(&cfg).unwrap_err().to_string();
    assert!(err.contains("--ca-file"), "{err}");
}

#[test]
fn server_closes_after_events_are_resumed_gap_free() {
    // The close often arrives with the last events in one read (over TLS: the records, the
    // close_notify and the FIN): the subscriber must still see the end and resume.
    for tls in [false, true] {
        let srv = start_server(Fault::CloseEvery(97), false);
        let proxy = start_tls_proxy(srv.addr);
        let mut cfg = if tls {
            tls_config(proxy.addr, "127.0.0.1", 3, 1000, TEST_CERT)
        } else {
            config(srv.addr, 3, 1000)
        };
        cfg.drain_secs_max = 10.0;
        let t0 = std::time::Instant::now();
        let r = load::run(&cfg).unwrap();
        assert_eq!(
            r.fast.violations(),
            0,
            "tls={tls}: {:?} {:?}",
            r.fast,
            r.errors
        );
        assert!(
            r.server_closes >= 6 * 10,
            "tls={tls}: closes {}",
            r.server_closes
        );
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "tls={tls}: took {:?}",
            t0.elapsed()
        );
    }
}

/// The `bench` binary itself: `--json` on stdout is one JSON document carrying the `meta`
/// object, `--json-file` holds the same document, and a run longer than the progress interval
/// writes progress lines to stderr only. The run is at least 1.5 s long (300 events at 200/s),
/// so an interval of 1 s gives at least one line whatever the machine's speed.
#[test]
fn the_binary_reports_meta_in_json_and_progress_on_stderr() {
    let srv = start_server(Fault::None, false);
    let addr = srv.addr;
    let dir = tempfile::tempdir().unwrap();
    let json_file = dir.path().join("report.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bench"))
        .args([
            "fanout",
            "--publish-style",
            "nchan",
            "--id-style",
            "gateway",
        ])
        .arg("--publish-url")
        .arg(format!("http://{addr}/pub?id={{stream}}"))
        .arg("--subscribe-url")
        .arg(format!("http://{addr}/sub?id={{stream}}"))
        .args(["--streams", "1", "--subscribers-per-stream", "2"])
        .args(["--events-per-stream", "300", "--rate-events-per-sec", "200"])
        .args(["--progress-interval-secs", "1", "--json", "--json-file"])
        .arg(&json_file)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("stdout is one JSON value");
    let meta = &v["meta"];
    let commit = meta["commit"].as_str().unwrap();
    assert!(commit == "unknown" || commit.len() == 12, "{commit}");
    assert_eq!(meta["argv"][1], "fanout");
    assert!(
        meta["argv"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--json")
    );
    assert!(meta["cpus_online"].as_u64().unwrap() >= 1);
    assert!(!meta["kernel_release"].as_str().unwrap().is_empty());
    assert_eq!(meta["loadavg_start"].as_array().unwrap().len(), 3);
    assert_eq!(v["reports"][0]["delivered"], 600, "{stdout}");
    let from_file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_file).unwrap()).unwrap();
    assert_eq!(from_file, v);
    let progress: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("progress: "))
        .collect();
    assert!(!progress.is_empty(), "no progress line on stderr: {stderr}");
    assert!(
        progress[0].contains("; published ") && progress[0].contains("; delivered "),
        "{}",
        progress[0]
    );
    assert!(!stdout.contains("progress:"));
}
