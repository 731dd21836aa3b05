//! A real browser against the gateway over HTTPS: headless Chromium (BoringSSL) loads a page
//! from another origin, subscribes with `EventSource` to `https://` through a TCP proxy that
//! cuts the TLS byte stream at random points (mid-record, after the stream opened), and
//! publishes with `fetch` straight to the gateway over HTTPS with a bearer JWT (preflighted
//! CORS). The proxy reads TLS's record framing (its 5-byte headers are in the clear): it finds
//! the client's HTTP request and cuts inside a record that follows the response head, so the
//! page has seen the stream open before each cut, whatever the handshake's size (cuts counted
//! from the connection's first byte fell mostly in Chromium's handshake, and a record cut short
//! delivers nothing: the page then never saw the stream open). The gateway seals its subscribers' records with its own record layer
//! (`tls/record.rs`), or the kernel does where it has TLS (`--tls-kernel auto`); the browser
//! must decrypt every record and resume with the `Last-Event-ID` EventSource sends by itself,
//! gap-free and duplicate-free.
//!
//! The certificate is made here (rcgen; none is committed); Chromium runs with
//! `--ignore-certificate-errors` (a test CA in its trust store would need NSS tools).
//! Needs Debian's chromium (`scripts/setup-browser.sh`); `GATEWAY_TESTS_WITHOUT_BROWSER=1`
//! skips. Every wait is bounded; the gateway, the proxy's threads and the browser's process
//! group end on drop. No timed assertions.
#![forbid(unsafe_code)]

mod common;
#[path = "common/browser.rs"]
mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{Gateway, json};
use support::{Browser, PageServer, Rng};

const EVENTS: usize = 300;
/// After the client's request the gateway sends its session tickets (rustls sends 2, a record
/// each), then the response head in a record of its own, then events: a replay in records of
/// up to 16 KB, then a record per live event. The proxy passes this many records after the
/// request whole (uniform), then cuts the next one at a random byte inside it.
const RECORDS_WHOLE_MIN: usize = 3;
const RECORDS_WHOLE_MAX: usize = 6;
/// After this many cut connections the proxy passes the rest whole (a run always ends).
const CUTS_MAX: usize = 40;
/// Every cut falls after the head, so each cut connection opened and its cut is a reconnect;
/// events come at least one record per connection, so the page sees many.
const RECONNECTS_MIN: u64 = 3;
const PAGE_DEADLINE_MS: u64 = 60_000;
const RESULT_WAIT: Duration = Duration::from_secs(90);
const PAGE: &str = include_str!("common/browser_page.html");

#[test]
fn eventsource_over_https_decrypts_every_record_and_resumes_exactly_once_across_cuts() {
    let Some(chromium) = support::chromium_or_skip("gateway/tests/browser_tls.rs") else {
        return;
    };
    let seed = support::test_seed();
    println!(
        "browser TLS test: {}; cut seed {seed} (rerun with BROWSER_TEST_SEED={seed})",
        support::chromium_version(&chromium)
    );
    let mut rng = Rng::new(seed);

    let page = PageServer::bind("127.0.0.2");
    let origin = page.origin();
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).expect("cert");
    let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let secret: String = (0..4).map(|_| format!("{:016x}", rng.next_u64())).collect();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, &secret).unwrap();
    let gw = Gateway::start(&[
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
        "--cors-allow-origin",
        &origin,
        "--jwt-hs256-secret-file",
        secret_file.to_str().unwrap(),
        "--jwt-allow-query-token",
        "--admin-listen",
        "127.0.0.1:0",
        "--retry-ms",
        "200",
    ]);
    let stream = format!("browser-{}", rng.next_u64() % 1_000_000);
    let proxy = CutProxy::start(gw.addr, seed);
    let config = serde_json::json!({
        "proxy": format!("https://127.0.0.1:{}", proxy.addr.port()),
        "gateway": format!("https://127.0.0.1:{}", gw.addr.port()),
        "stream": stream,
        "denied_stream": format!("denied-{stream}"),
        "token": support::mint_token(secret.as_bytes()),
        "events": EVENTS,
        "deadline_ms": PAGE_DEADLINE_MS,
    });
    page.set_page(PAGE.replace("/*CONFIG*/null", &config.to_string()));

    let mut browser = Browser::launch_with(
        &chromium,
        &format!("{origin}/"),
        &["--ignore-certificate-errors"],
    );
    let raw = page.wait_result(RESULT_WAIT, || {
        if let Some(st) = browser.exited() {
            panic!(
                "chromium exited ({st}) before the page reported; its log:\n{}",
                browser.log_tail(60)
            );
        }
    });
    let console = browser.console_lines();
    browser.kill();
    let conns = proxy.connections.load(Relaxed);
    let (cuts, requests) = (
        proxy.stats.cuts.load(Relaxed),
        proxy.stats.requests.load(Relaxed),
    );
    let Some(raw) = raw else {
        panic!(
            "the page reported nothing within {RESULT_WAIT:?}; proxy: {conns} connections, \
             {requests} requests, {cuts} cuts\npage console:\n{}\nchromium log tail:\n{}",
            console.join("\n"),
            browser.log_tail(40)
        );
    };
    let r = json(&raw);
    let n = |k: &str| r[k].as_u64().unwrap_or(u64::MAX);
    let brief = support::page_brief(&r);
    let context = format!(
        "seed {seed}; proxy: {conns} connections, {requests} requests, {cuts} cuts inside a \
         record after the head; page result: {brief}\n\
         page console:\n{}",
        console.join("\n")
    );
    println!("{context}");
    support::assert_exactly_once(&r, EVENTS, &context);
    assert_eq!(r["ids"], r["published_ids"], "{context}");
    assert!(n("reconnects") >= RECONNECTS_MIN, "{context}");
    assert!(cuts >= RECONNECTS_MIN as usize, "{context}");
    // Each cut connection had shown the page its open first (the cut follows the head).
    assert!(n("opens") > cuts as u64, "{context}");
    assert_eq!(r["forbidden_check"]["status"], 403, "{context}");
    assert_eq!(r["ok"], true, "{context}");
    // The browser read records the gateway's own record layer sealed.
    assert!(
        gw.metric("gateway_tls_subscribers_total", "sealer=\"record_layer\"") >= RECONNECTS_MIN,
        "{context}"
    );
}

/// A TCP proxy that forwards bytes both ways and, for its first [`CUTS_MAX`] connections,
/// closes both sides inside a record that follows the response head.
///
/// It finds the client's HTTP request by the records' content types: the request is the
/// client's first `application_data` record under TLS 1.2, and its second under TLS 1.3, whose
/// encrypted Finished is one too (1.3 is told by the server sending `application_data` before
/// the client has). From there it counts the gateway's records, passes a random number of them
/// whole ([`RECORDS_WHOLE_MIN`]..=[`RECORDS_WHOLE_MAX`]) and cuts the next at a random byte
/// strictly inside it.
struct CutProxy {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    stats: Arc<CutStats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct CutStats {
    cuts: AtomicUsize,
    /// Connections whose request the proxy saw go upstream (each is a subscription).
    requests: AtomicUsize,
}

/// What the two directions of one proxied connection know of each other.
#[derive(Default)]
struct ConnState {
    /// The server sent an `application_data` record before the client did: TLS 1.3.
    tls13: AtomicBool,
    client_app_records: AtomicUsize,
    /// Set before the client's request record is forwarded, so whatever the server sends in
    /// answer is read after it is set.
    requested: AtomicBool,
}

/// Where one connection is cut: inside its record number `whole + 1` after the request, at
/// `at % record_len` (never its first byte).
#[derive(Clone, Copy)]
struct CutPlan {
    whole: usize,
    at: u64,
}

impl CutProxy {
    fn start(upstream: SocketAddr, seed: u64) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let stats = Arc::new(CutStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (c2, st2, s2) = (connections.clone(), stats.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ 0x5eed);
            while !s2.load(Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let i = c2.fetch_add(1, Relaxed);
                let plan = (i < CUTS_MAX).then(|| CutPlan {
                    whole: rng.in_range(RECORDS_WHOLE_MIN, RECORDS_WHOLE_MAX),
                    at: rng.next_u64(),
                });
                client.set_nonblocking(false).unwrap();
                let conn = Arc::new(ConnState::default());
                let (c, s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (conn2, st) = (conn.clone(), st2.clone());
                std::thread::spawn(move || pipe_up(c, s, &conn2, &st));
                let st = st2.clone();
                std::thread::spawn(move || pipe_down(server, client, plan, &conn, &st));
            }
        });
        CutProxy {
            addr,
            connections,
            stats,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Walks a byte stream's TLS record framing across reads.
#[derive(Default)]
struct Records {
    header: [u8; 5],
    header_have: usize,
    /// Body bytes left in the current record.
    body_left: usize,
    /// Bytes fed so far.
    fed: usize,
}

impl Records {
    /// Feeds `bytes`; calls `on_start(content_type, start, len)` at each record whose header
    /// completes, with the stream offset of its first header byte and its whole length.
    fn feed(&mut self, mut bytes: &[u8], mut on_start: impl FnMut(u8, usize, usize)) {
        while !bytes.is_empty() {
            let n = if self.body_left > 0 {
                let n = self.body_left.min(bytes.len());
                self.body_left -= n;
                n
            } else {
                let n = (5 - self.header_have).min(bytes.len());
                self.header[self.header_have..self.header_have + n].copy_from_slice(&bytes[..n]);
                self.header_have += n;
                if self.header_have == 5 {
                    self.header_have = 0;
                    let [kind, _, _, hi, lo] = self.header;
                    self.body_left = u16::from_be_bytes([hi, lo]) as usize;
                    on_start(kind, self.fed + n - 5, 5 + self.body_left);
                }
                n
            };
            self.fed += n;
            bytes = &bytes[n..];
        }
    }
}

const APPLICATION_DATA: u8 = 23;
/// Every read times out after this; a pipe gives up after `PIPE_DEADLINE` in all.
const PIPE_READ_TIMEOUT: Duration = Duration::from_secs(60);
const PIPE_DEADLINE: Duration = Duration::from_secs(120);

/// Client → gateway: forwards everything, and marks the connection `requested` just before its
/// request record goes upstream.
fn pipe_up(mut from: TcpStream, mut to: TcpStream, conn: &ConnState, stats: &CutStats) {
    let _ = from.set_read_timeout(Some(PIPE_READ_TIMEOUT));
    let deadline = Instant::now() + PIPE_DEADLINE;
    let (mut buf, mut records) = ([0u8; 4096], Records::default());
    while Instant::now() < deadline {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        records.feed(&buf[..n], |kind, _, _| {
            if kind != APPLICATION_DATA {
                return;
            }
            let k = conn.client_app_records.fetch_add(1, Relaxed) + 1;
            let request_at = if conn.tls13.load(Relaxed) { 2 } else { 1 };
            if k == request_at {
                conn.requested.store(true, Relaxed);
                stats.requests.fetch_add(1, Relaxed);
            }
        });
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Gateway → client: forwards everything until EOF or an error, or up to the planned cut:
/// then both sockets are shut down.
fn pipe_down(
    mut from: TcpStream,
    mut to: TcpStream,
    plan: Option<CutPlan>,
    conn: &ConnState,
    stats: &CutStats,
) {
    let _ = from.set_read_timeout(Some(PIPE_READ_TIMEOUT));
    let deadline = Instant::now() + PIPE_DEADLINE;
    let (mut buf, mut records) = ([0u8; 4096], Records::default());
    // Records begun after the request, and the stream offset to cut at once it is known.
    let (mut after_request, mut cut_at) = (0usize, None::<usize>);
    while Instant::now() < deadline {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Read after the read returned: what was read while it was false, the gateway sent
        // before it had the request (the handshake).
        let requested = conn.requested.load(Relaxed);
        let fed = records.fed;
        records.feed(&buf[..n], |kind, start, len| {
            if kind != APPLICATION_DATA {
                return;
            }
            if conn.client_app_records.load(Relaxed) == 0 {
                conn.tls13.store(true, Relaxed);
            }
            if !requested {
                return;
            }
            after_request += 1;
            if let Some(p) = plan.filter(|p| after_request == p.whole + 1 && cut_at.is_none()) {
                cut_at = Some(start + 1 + (p.at % (len as u64 - 1)) as usize);
            }
        });
        let take = cut_at.map_or(n, |at| n.min(at.saturating_sub(fed)));
        if to.write_all(&buf[..take]).is_err() {
            break;
        }
        if take < n || cut_at == Some(fed + n) {
            stats.cuts.fetch_add(1, Relaxed);
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
