//! A real browser against the gateway over HTTPS: headless Chromium (BoringSSL) loads a page
//! from another origin, subscribes with `EventSource` to `https://` through a TCP proxy that
//! cuts the TLS byte stream at random points (mid-record, sometimes mid-handshake), and
//! publishes with `fetch` straight to the gateway over HTTPS with a bearer JWT (preflighted
//! CORS). The gateway seals its subscribers' records with its own record layer
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
/// Each proxied connection is cut after this many bytes from the gateway (uniform): inside
/// the TLS handshake (~2 KB with its session tickets) at times, inside a record mostly.
const CUT_BYTES_MIN: usize = 2_500;
const CUT_BYTES_MAX: usize = 5_000;
/// After this many cut connections the proxy passes the rest whole (a run always ends).
const CUTS_MAX: usize = 40;
const RECONNECTS_MIN: u64 = 2;
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
    let (conns, cuts) = (proxy.connections.load(Relaxed), proxy.cuts.load(Relaxed));
    let Some(raw) = raw else {
        panic!(
            "the page reported nothing within {RESULT_WAIT:?}; proxy: {conns} connections, \
             {cuts} cuts\npage console:\n{}\nchromium log tail:\n{}",
            console.join("\n"),
            browser.log_tail(40)
        );
    };
    let r = json(&raw);
    let n = |k: &str| r[k].as_u64().unwrap_or(u64::MAX);
    let brief = support::page_brief(&r);
    let context = format!(
        "seed {seed}; proxy: {conns} connections, {cuts} cuts; page result: {brief}\n\
         page console:\n{}",
        console.join("\n")
    );
    println!("{context}");
    support::assert_exactly_once(&r, EVENTS, &context);
    assert_eq!(r["ids"], r["published_ids"], "{context}");
    assert!(n("reconnects") >= RECONNECTS_MIN, "{context}");
    assert!(cuts >= RECONNECTS_MIN as usize, "{context}");
    assert_eq!(r["forbidden_check"]["status"], 403, "{context}");
    assert_eq!(r["ok"], true, "{context}");
    // The browser read records the gateway's own record layer sealed.
    assert!(
        gw.metric("gateway_tls_record_layer_subscribers_total", "") >= RECONNECTS_MIN,
        "{context}"
    );
}

/// A TCP proxy that forwards bytes both ways and, for its first [`CUTS_MAX`] connections,
/// closes both sides after a random number of bytes from the upstream (it knows nothing of
/// TLS: the cut falls wherever the count does).
struct CutProxy {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    cuts: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl CutProxy {
    fn start(upstream: SocketAddr, seed: u64) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (connections, cuts) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let (c2, k2, s2) = (connections.clone(), cuts.clone(), stop.clone());
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
                let limit = (i < CUTS_MAX).then(|| rng.in_range(CUT_BYTES_MIN, CUT_BYTES_MAX));
                client.set_nonblocking(false).unwrap();
                let (c, s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pipe(c, s, None, None));
                let k = k2.clone();
                std::thread::spawn(move || pipe(server, client, limit, Some(k)));
            }
        });
        CutProxy {
            addr,
            connections,
            cuts,
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

/// Copies `from` → `to` until EOF or an error, or until `limit` bytes went through: then
/// both sockets are shut down (counted in `cuts`). Bounded: every read times out after 60 s.
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    limit: Option<usize>,
    cuts: Option<Arc<AtomicUsize>>,
) {
    let _ = from.set_read_timeout(Some(Duration::from_secs(60)));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut buf = [0u8; 4096];
    let mut total = 0usize;
    while Instant::now() < deadline {
        let want = limit.map_or(buf.len(), |l| (l - total).min(buf.len()));
        let n = match from.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        total += n;
        if limit == Some(total) {
            if let Some(c) = &cuts {
                c.fetch_add(1, Relaxed);
            }
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
