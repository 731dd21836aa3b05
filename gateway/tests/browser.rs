//! A real browser against the gateway: headless Chromium loads a page from another origin
//! (`http://127.0.0.2:<port>`), subscribes with `EventSource` through a proxy that cuts the SSE
//! response mid-event again and again, and publishes with `fetch` straight to the gateway with
//! a bearer JWT (preflighted CORS). It checks what a browser app relies on: the gateway's own
//! CORS answers (preflight, errors readable cross-origin), HS256 tokens (in the query for
//! EventSource, in `Authorization` for fetch, 403 without the grant, 401 without a token), and
//! gap-free, duplicate-free resumption with the `Last-Event-ID` that EventSource sends by itself.
//! Needs Debian's chromium (`scripts/setup-browser.sh`); `GATEWAY_TESTS_WITHOUT_BROWSER=1` skips.
//! Every wait is bounded; the gateway, the helpers' threads and the browser's whole process group
//! are ended on drop, also when an assertion fails. No timed assertions.
#![forbid(unsafe_code)]

mod common;
#[path = "common/browser.rs"]
mod support;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::{Gateway, json, request};
use support::{Browser, CutPlan, CuttingProxy, PageServer, Rng};

/// Events the page publishes (each about 40 bytes on the stream: ~12 KB in all).
const EVENTS: usize = 300;
/// The proxy cuts each SSE response after this many body bytes (uniform), so a run makes about
/// 12 KB / 450 B ≈ 25 cuts and at least 12 KB / 800 B = 15.
const CUT_BODY_BYTES_MIN: usize = 100;
const CUT_BODY_BYTES_MAX: usize = 800;
/// After this many cut responses the proxy leaves the rest whole (a run always ends).
const CUTS_MAX: usize = 60;
/// What the test asserts happened: the cuts really made EventSource reconnect and resume.
const RECONNECTS_MIN: u64 = 8;
/// The page gives up (and reports what it has) after this; the test waits a little longer.
const PAGE_DEADLINE_MS: u64 = 60_000;
const RESULT_WAIT: Duration = Duration::from_secs(90);
/// The `retry:` the gateway tells EventSource (short: each cut costs one retry wait).
const RETRY_MS: &str = "200";
const PAGE: &str = include_str!("common/browser_page.html");

#[test]
fn eventsource_resumes_exactly_once_across_cuts_with_cors_and_jwt() {
    let Some(chromium) = support::chromium_or_skip("gateway/tests/browser.rs") else {
        return;
    };
    let version = support::chromium_version(&chromium);
    let seed = support::test_seed();
    println!("browser test: {version}; cut seed {seed} (rerun with BROWSER_TEST_SEED={seed})");
    let mut rng = Rng::new(seed);

    // The page's origin must exist before the gateway starts: its flag names it.
    let page = PageServer::bind("127.0.0.2");
    let origin = page.origin();
    let secret: String = (0..4).map(|_| format!("{:016x}", rng.next_u64())).collect();
    let secret_file = tempfile::NamedTempFile::new().expect("secret file");
    std::fs::write(secret_file.path(), &secret).expect("write secret");
    let secret_path = secret_file.path().to_str().expect("utf-8 path");
    let gw = Gateway::start(&[
        "--cors-allow-origin",
        &origin,
        "--jwt-hs256-secret-file",
        secret_path,
        "--jwt-allow-query-token",
        "--admin-listen",
        "127.0.0.1:0",
        "--retry-ms",
        RETRY_MS,
    ]);
    let stream = format!("browser-{}", rng.next_u64() % 1_000_000);
    assert_preflight_answered(&gw, &origin, &stream);
    let token = support::mint_token(secret.as_bytes());

    let proxy = CuttingProxy::start(
        gw.addr,
        CutPlan {
            seed,
            body_bytes_min: CUT_BODY_BYTES_MIN,
            body_bytes_max: CUT_BODY_BYTES_MAX,
            cuts_max: CUTS_MAX,
        },
    );
    let config = serde_json::json!({
        "proxy": format!("http://{}", proxy.addr),
        "gateway": format!("http://{}", gw.addr),
        "stream": stream,
        "denied_stream": format!("denied-{stream}"),
        "token": token,
        "events": EVENTS,
        "deadline_ms": PAGE_DEADLINE_MS,
    });
    page.set_page(PAGE.replace("/*CONFIG*/null", &config.to_string()));

    let started = Instant::now();
    let mut browser = Browser::launch(&chromium, &format!("{origin}/"));
    let raw = page.wait_result(RESULT_WAIT, || {
        if let Some(st) = browser.exited() {
            panic!(
                "chromium exited ({st}) before the page reported; its log:\n{}",
                browser.log_tail(60)
            );
        }
    });
    let elapsed = started.elapsed();
    let console = browser.console_lines();
    browser.kill();
    let stats = &proxy.stats;
    let cuts = stats.cuts.load(Relaxed);
    let cuts_mid = stats.cuts_mid_event.load(Relaxed);
    let sse = stats.sse_responses.load(Relaxed);
    let last_ids = stats.last_event_ids.lock().unwrap().clone();
    let proxy_summary = format!(
        "proxy: {} connections, {sse} SSE responses, {cuts} cuts ({cuts_mid} mid-event), {} \
         requests with Last-Event-ID\n{}",
        stats.connections.load(Relaxed),
        last_ids.len(),
        stats.cut_log.lock().unwrap().join("\n")
    );
    let Some(raw) = raw else {
        panic!(
            "the page reported nothing within {RESULT_WAIT:?}\n{proxy_summary}\npage console:\n{}\n\
             chromium log tail:\n{}",
            console.join("\n"),
            browser.log_tail(40)
        );
    };
    println!("page console:\n{}", console.join("\n"));
    let r = json(&raw);
    let n = |k: &str| r[k].as_u64().unwrap_or(u64::MAX);
    println!(
        "browser test: result in {elapsed:.1?} (page {} ms): received {}/{EVENTS}, reconnects {}, \
         gaps {}, duplicates {}, out of order {}, 403 check {}, 401 check {}, errors {}\n\
         {proxy_summary}",
        n("elapsed_ms"),
        n("received"),
        n("reconnects"),
        n("gaps"),
        n("duplicates"),
        n("out_of_order"),
        r["forbidden_check"],
        r["unauthenticated_check"],
        r["errors"],
    );
    println!(
        "gateway resumes (admin /metrics): {}",
        resume_metrics(&gw).unwrap_or_else(|| "not readable".into())
    );

    // The page's verdict without its two ID lists (300 IDs each), which are compared below.
    let brief = support::page_brief(&r);
    let context = format!("seed {seed}; page result: {brief}");
    support::assert_exactly_once(&r, EVENTS, &context);
    let ids = |k: &str| -> Vec<String> {
        r[k].as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (received, published) = (ids("ids"), ids("published_ids"));
    let first_difference = received.iter().zip(&published).position(|(a, b)| a != b);
    assert!(
        received == published,
        "the page received other IDs than it published: first difference at index \
         {first_difference:?} of {} received / {} published; {context}",
        received.len(),
        published.len()
    );
    assert!(
        n("reconnects") >= RECONNECTS_MIN,
        "only {} reconnects (want >= {RECONNECTS_MIN}); {proxy_summary}; {context}",
        n("reconnects")
    );
    assert_eq!(r["forbidden_check"]["ok"], true, "{context}");
    assert_eq!(r["forbidden_check"]["status"], 403, "{context}");
    assert_eq!(r["unauthenticated_check"]["ok"], true, "{context}");
    assert_eq!(r["ok"], true, "{context}");
    // The resumes were EventSource's own: it sent Last-Event-ID, always an ID it had received.
    assert!(
        !last_ids.is_empty(),
        "no reconnect carried Last-Event-ID; {proxy_summary}"
    );
    for id in &last_ids {
        assert!(
            received.contains(id),
            "Last-Event-ID {id} was never delivered to the page; {context}"
        );
    }
    assert!(
        cuts >= RECONNECTS_MIN as usize && cuts_mid * 2 >= cuts,
        "{proxy_summary}"
    );
}

/// The preflight the browser will send, asked first from Rust: a missing CORS feature then
/// fails here with the gateway's answer instead of as an opaque `fetch` failure in the page.
fn assert_preflight_answered(gw: &Gateway, origin: &str, stream: &str) {
    let (st, headers, body) = request(
        gw.addr,
        "OPTIONS",
        &format!("/v1/streams/{stream}/events"),
        &[
            ("Origin", origin),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization,content-type",
            ),
        ],
        b"",
    );
    let header = |k: &str| {
        headers
            .iter()
            .find(|(h, _)| h == k)
            .map(|(_, v)| v.as_str())
    };
    assert!(
        (200..300).contains(&st) && header("access-control-allow-origin") == Some(origin),
        "the gateway did not allow the preflight from {origin}: {st} {headers:?} {}",
        String::from_utf8_lossy(&body)
    );
}

/// `gateway_resumes_total` lines from the admin listener's `/metrics` (for the log only).
fn resume_metrics(gw: &Gateway) -> Option<String> {
    let (st, _, body) = request(gw.admin_addr, "GET", "/metrics", &[], b"");
    (st == 200).then(|| {
        String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| l.starts_with("gateway_resumes_total") && !l.ends_with(" 0"))
            .collect::<Vec<_>>()
            .join(", ")
    })
}
