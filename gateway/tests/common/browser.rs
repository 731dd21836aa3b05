//! Helpers for the real-browser tests (`tests/browser.rs`, `tests/browser_tls.rs`): a tiny page origin server, a proxy
//! that cuts SSE responses after a seeded pseudo-random number of body bytes, and headless
//! Chromium in its own process group (the gateway itself is `common::Gateway`). Plain std
//! threads and blocking sockets with timeouts: every loop checks a stop flag or a deadline, and
//! every process and thread is ended on drop (also on panic). It gives the browser no CORS help
//! of any kind: the proxy forwards bytes unchanged (it only cuts), and publishes do not go
//! through it.
#![allow(dead_code)]
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often blocked reads wake up to look at the stop flag.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Write timeout on every helper socket (a stuck peer ends the connection, not the test).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// A request head larger than this is refused by the page server (and not scanned further by
/// the proxy).
const HEAD_BYTES_MAX: usize = 64 * 1024;
/// The page server accepts `POST /result` bodies up to this size.
const BODY_BYTES_MAX: usize = 4 * 1024 * 1024;

/// The xorshift64* generator: small, seeded, and the same on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform enough in `lo..=hi`.
    pub fn in_range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
}

/// Reads from `s` (whose read timeout is `POLL_INTERVAL`) until `until(buf)` or EOF, a read
/// error, `stop`, `deadline` or `HEAD_BYTES_MAX`. Returns whether `until` was met.
fn read_until(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    stop: &AtomicBool,
    deadline: Instant,
    until: impl Fn(&[u8]) -> bool,
) -> bool {
    let mut tmp = [0u8; 16 * 1024];
    while !until(buf) {
        if stop.load(Ordering::Relaxed) || Instant::now() > deadline || buf.len() > HEAD_BYTES_MAX {
            return false;
        }
        match s.read(&mut tmp) {
            Ok(0) => return false,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
            Err(e) if is_timeout(&e) => continue,
            Err(_) => return false,
        }
    }
    true
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// The end of the head (index after `\r\n\r\n`), if it has arrived.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The value of header `name` (case-insensitive) in a request or response head.
pub fn head_header(head: &str, name: &str) -> Option<String> {
    head.split("\r\n").skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// Accepts on a non-blocking listener until `stop`, handing each connection (read timeout
/// `POLL_INTERVAL`, write timeout `WRITE_TIMEOUT`) to `handle` on its own thread; joins them all
/// before returning. Each handler must end by itself once `stop` is set.
fn serve(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    handle: impl Fn(TcpStream) + Send + Sync + 'static,
) -> JoinHandle<()> {
    listener
        .set_nonblocking(true)
        .expect("nonblocking listener");
    let handle = Arc::new(handle);
    std::thread::spawn(move || {
        let mut conns: Vec<JoinHandle<()>> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).expect("blocking socket");
                    s.set_read_timeout(Some(POLL_INTERVAL)).unwrap();
                    s.set_write_timeout(Some(WRITE_TIMEOUT)).unwrap();
                    let _ = s.set_nodelay(true);
                    let h = Arc::clone(&handle);
                    conns.push(std::thread::spawn(move || h(s)));
                    conns.retain(|c| !c.is_finished());
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        for c in conns {
            let _ = c.join();
        }
    })
}

/// The page origin: `GET /` answers the page set with `set_page`, `POST /result` stores the
/// page's verdict (one JSON body), anything else is 404. One request per connection.
pub struct PageServer {
    pub addr: SocketAddr,
    page: Arc<Mutex<String>>,
    result: Arc<Mutex<Option<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PageServer {
    /// Binds `ip:0` (the page's origin is `http://ip:port`).
    pub fn bind(ip: &str) -> PageServer {
        let listener = TcpListener::bind((ip, 0)).expect("bind page server");
        let addr = listener.local_addr().unwrap();
        let page = Arc::new(Mutex::new(String::new()));
        let result = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, r, st) = (Arc::clone(&page), Arc::clone(&result), Arc::clone(&stop));
        let thread = serve(listener, Arc::clone(&stop), move |s| {
            page_conn(s, &p, &r, &st)
        });
        PageServer {
            addr,
            page,
            result,
            stop,
            thread: Some(thread),
        }
    }

    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_page(&self, html: String) {
        *self.page.lock().unwrap() = html;
    }

    /// Waits at most `timeout` for the page's `POST /result`, calling `check` every 100 ms (it
    /// may panic, e.g. when the browser died).
    pub fn wait_result(&self, timeout: Duration, mut check: impl FnMut()) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(r) = self.result.lock().unwrap().take() {
                return Some(r);
            }
            check();
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn page_conn(
    mut s: TcpStream,
    page: &Mutex<String>,
    result: &Mutex<Option<Vec<u8>>>,
    stop: &AtomicBool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = Vec::new();
    if !read_until(&mut s, &mut buf, stop, deadline, |b| head_end(b).is_some()) {
        return;
    }
    let end = head_end(&buf).unwrap();
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut words = head.split(' ');
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let len: usize = head_header(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if len > BODY_BYTES_MAX {
        let _ = s.write_all(b"HTTP/1.1 413 Too Large\r\nContent-Length: 0\r\n\r\n");
        return;
    }
    if !read_until(&mut s, &mut buf, stop, deadline, |b| b.len() >= end + len) {
        return;
    }
    let body = &buf[end..end + len];
    let answer = match (method, path) {
        ("GET", "/") => {
            let html = page.lock().unwrap().clone();
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\
                 Cache-Control: no-store\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
                html.len()
            )
        }
        ("POST", "/result") => {
            *result.lock().unwrap() = Some(body.to_vec());
            "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".to_string()
        }
        _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into(),
    };
    let _ = s.write_all(answer.as_bytes());
    let _ = s.shutdown(Shutdown::Write);
}

/// Where the proxy cuts SSE responses: after a number of body bytes drawn uniformly from
/// `body_bytes_min..=body_bytes_max`, on at most `cuts_max` responses (later ones are left
/// whole, so a run always ends).
#[derive(Debug, Clone)]
pub struct CutPlan {
    pub seed: u64,
    pub body_bytes_min: usize,
    pub body_bytes_max: usize,
    pub cuts_max: usize,
}

/// What the proxy saw.
#[derive(Debug, Default)]
pub struct ProxyStats {
    pub connections: AtomicUsize,
    pub sse_responses: AtomicUsize,
    pub cuts: AtomicUsize,
    /// Cuts whose last forwarded bytes were not an event's end (`\n\n`).
    pub cuts_mid_event: AtomicUsize,
    /// The `Last-Event-ID` header of every request that carried one, in arrival order.
    pub last_event_ids: Mutex<Vec<String>>,
    /// One line per cut: response number, body bytes forwarded, mid-event or not.
    pub cut_log: Mutex<Vec<String>>,
}

/// A TCP proxy in front of the gateway: forwards bytes both ways unchanged and cuts SSE
/// responses (`Content-Type: text/event-stream`) per its `CutPlan` by shutting both sockets
/// down, so the client sees the stream end mid-event and reconnects.
pub struct CuttingProxy {
    pub addr: SocketAddr,
    pub stats: Arc<ProxyStats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl CuttingProxy {
    pub fn start(upstream: SocketAddr, plan: CutPlan) -> CuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(ProxyStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let rng = Arc::new(Mutex::new(Rng::new(plan.seed)));
        let (st, sp) = (Arc::clone(&stats), Arc::clone(&stop));
        let thread = serve(listener, Arc::clone(&stop), move |client| {
            proxy_conn(client, upstream, &plan, &rng, &st, &sp)
        });
        CuttingProxy {
            addr,
            stats,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One proxied connection: a thread copies client → gateway (noting each request's
/// `Last-Event-ID`), this one copies gateway → client and cuts (the first response only: an SSE
/// response ends its connection).
fn proxy_conn(
    client: TcpStream,
    upstream: SocketAddr,
    plan: &CutPlan,
    rng: &Mutex<Rng>,
    stats: &Arc<ProxyStats>,
    stop: &Arc<AtomicBool>,
) {
    stats.connections.fetch_add(1, Ordering::Relaxed);
    let Ok(gw) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) else {
        return;
    };
    gw.set_read_timeout(Some(POLL_INTERVAL)).unwrap();
    gw.set_write_timeout(Some(WRITE_TIMEOUT)).unwrap();
    let _ = gw.set_nodelay(true);
    // Set when either direction is finished with the pair (EOF, error or cut).
    let done = Arc::new(AtomicBool::new(false));
    let up = {
        let (mut from, mut to) = (client.try_clone().unwrap(), gw.try_clone().unwrap());
        let (stats, stop, done) = (Arc::clone(stats), Arc::clone(stop), Arc::clone(&done));
        std::thread::spawn(move || copy_up(&mut from, &mut to, &stats, &stop, &done))
    };
    copy_down(gw, client, plan, rng, stats, stop, &done);
    let _ = up.join();
}

fn copy_up(
    from: &mut TcpStream,
    to: &mut TcpStream,
    stats: &ProxyStats,
    stop: &AtomicBool,
    done: &AtomicBool,
) {
    let mut scan = RequestScan::default();
    let mut tmp = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) && !done.load(Ordering::Relaxed) {
        match from.read(&mut tmp) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                for head in scan.feed(&tmp[..n]) {
                    if let Some(id) = head_header(&head, "last-event-id") {
                        stats.last_event_ids.lock().unwrap().push(id);
                    }
                }
                if to.write_all(&tmp[..n]).is_err() {
                    break;
                }
            }
            Err(e) if is_timeout(&e) => continue,
            Err(_) => break,
        }
    }
    done.store(true, Ordering::Relaxed);
}

/// Finds the request heads in a client's byte stream (a keep-alive connection may carry
/// several), skipping `Content-Length` bodies. Gives up (finds no more) on a head over
/// `HEAD_BYTES_MAX`.
#[derive(Default)]
struct RequestScan {
    pending: Vec<u8>,
    body_bytes_left: usize,
    gave_up: bool,
}

impl RequestScan {
    fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut heads = Vec::new();
        if self.gave_up {
            return heads;
        }
        self.pending.extend_from_slice(bytes);
        loop {
            if self.body_bytes_left > 0 {
                let k = self.body_bytes_left.min(self.pending.len());
                self.pending.drain(..k);
                self.body_bytes_left -= k;
                if self.body_bytes_left > 0 {
                    break;
                }
            }
            let Some(end) = head_end(&self.pending) else {
                self.gave_up = self.pending.len() > HEAD_BYTES_MAX;
                break;
            };
            let head = String::from_utf8_lossy(&self.pending[..end]).into_owned();
            self.pending.drain(..end);
            self.body_bytes_left = head_header(&head, "content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            heads.push(head);
        }
        heads
    }
}

#[allow(clippy::too_many_arguments)]
fn copy_down(
    mut from: TcpStream,
    mut to: TcpStream,
    plan: &CutPlan,
    rng: &Mutex<Rng>,
    stats: &ProxyStats,
    stop: &AtomicBool,
    done: &AtomicBool,
) {
    // The response head until it is complete, then None.
    let mut head = Some(Vec::new());
    // Body bytes this response may forward before the cut (None: no cut).
    let mut budget: Option<usize> = None;
    let mut body_sent = 0usize;
    let mut tail = [0u8; 2];
    let mut tmp = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) && !done.load(Ordering::Relaxed) {
        let n = match from.read(&mut tmp) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if is_timeout(&e) => continue,
            Err(_) => break,
        };
        let body = match head.as_mut() {
            None => tmp[..n].to_vec(),
            Some(h) => {
                h.extend_from_slice(&tmp[..n]);
                let Some(end) = head_end(h) else {
                    if h.len() > HEAD_BYTES_MAX {
                        break;
                    }
                    continue;
                };
                let body = h.split_off(end);
                let text = String::from_utf8_lossy(h).into_owned();
                let is_sse = head_header(&text, "content-type")
                    .is_some_and(|v| v.to_ascii_lowercase().starts_with("text/event-stream"));
                if is_sse && stats.sse_responses.fetch_add(1, Ordering::Relaxed) < plan.cuts_max {
                    let mut rng = rng.lock().unwrap();
                    budget = Some(rng.in_range(plan.body_bytes_min, plan.body_bytes_max));
                }
                if to.write_all(h).is_err() {
                    break;
                }
                head = None;
                body
            }
        };
        match forward_body(&mut to, &body, &mut budget, &mut body_sent, &mut tail) {
            Forward::Sent => {}
            Forward::Cut => {
                cut(&from, &to, stats, body_sent, &tail);
                break;
            }
            Forward::Failed => break,
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = to.shutdown(Shutdown::Write);
}

enum Forward {
    Sent,
    /// The budget ended within these bytes: the part within it was written; cut now.
    Cut,
    /// The client is gone.
    Failed,
}

/// Writes `bytes`, or only the part within the budget if it ends inside them.
fn forward_body(
    to: &mut TcpStream,
    bytes: &[u8],
    budget: &mut Option<usize>,
    body_sent: &mut usize,
    tail: &mut [u8; 2],
) -> Forward {
    let (part, cut_now) = match *budget {
        Some(b) if *body_sent + bytes.len() >= b => (&bytes[..b - *body_sent], true),
        _ => (bytes, false),
    };
    if to.write_all(part).is_err() {
        return Forward::Failed;
    }
    *body_sent += part.len();
    for &c in part {
        *tail = [tail[1], c];
    }
    if cut_now { Forward::Cut } else { Forward::Sent }
}

fn cut(from: &TcpStream, to: &TcpStream, stats: &ProxyStats, body_sent: usize, tail: &[u8; 2]) {
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
    let nth = stats.cuts.fetch_add(1, Ordering::Relaxed) + 1;
    let mid = tail != b"\n\n";
    if mid {
        stats.cuts_mid_event.fetch_add(1, Ordering::Relaxed);
    }
    stats.cut_log.lock().unwrap().push(format!(
        "cut {nth}: after {body_sent} body bytes{}",
        if mid {
            ", mid-event"
        } else {
            ", at an event boundary"
        }
    ));
}

/// The Chromium binary: `$CHROMIUM` if set, else `chromium` on `PATH`.
pub fn find_chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("chromium"))
        .find(|p| p.is_file())
}

/// `chromium --version`, for the log.
pub fn chromium_version(bin: &Path) -> String {
    Command::new(bin)
        .args(["--headless=new", "--no-sandbox", "--version"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// Headless Chromium on one URL, in its own process group (killed whole on drop), with a fresh
/// profile and its output (including the page's `console` lines) in a log file.
pub struct Browser {
    child: Child,
    pub log_path: PathBuf,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub fn launch(bin: &Path, url: &str) -> Browser {
        Browser::launch_with(bin, url, &[])
    }

    /// [`Browser::launch`] with more command-line flags.
    pub fn launch_with(bin: &Path, url: &str, extra: &[&str]) -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let log_path = profile.path().join("chromium.log");
        let log = std::fs::File::create(&log_path).expect("chromium log");
        let child = Command::new(bin)
            .args([
                "--headless=new",
                // As root Chromium refuses to start with its sandbox.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                // No connections of its own to the outside (this machine refuses them).
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-quic",
                "--disable-default-apps",
                "--metrics-recording-only",
                // A background tab must not be throttled while the test runs.
                "--disable-background-timer-throttling",
                "--disable-renderer-backgrounding",
                "--enable-logging=stderr",
                "--v=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(extra)
            .arg(url)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        Browser {
            child,
            log_path,
            _profile: profile,
        }
    }

    /// The exit status if Chromium has already exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `lines` lines of Chromium's output.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The page's `console` lines (Chromium logs them as `CONSOLE(...)`).
    pub fn console_lines(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains("CONSOLE"))
            .map(str::to_string)
            .collect()
    }

    /// SIGKILL to the whole process group (renderers, GPU and zygote processes included), then
    /// reap the main process.
    pub fn kill(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The browser binary, or None (after a loud SKIPPED line naming `test`) when it is missing
/// and `GATEWAY_TESTS_WITHOUT_BROWSER=1`; panics when it is missing otherwise.
pub fn chromium_or_skip(test: &str) -> Option<PathBuf> {
    if let Some(p) = find_chromium() {
        return Some(p);
    }
    if std::env::var("GATEWAY_TESTS_WITHOUT_BROWSER").as_deref() == Ok("1") {
        println!(
            "SKIPPED: {test}: chromium not found ($CHROMIUM / PATH) and \
             GATEWAY_TESTS_WITHOUT_BROWSER=1; the real-browser test did not run"
        );
        return None;
    }
    panic!(
        "chromium not found ($CHROMIUM or `chromium` on PATH): run `bash scripts/setup-browser.sh` \
         (or set GATEWAY_TESTS_WITHOUT_BROWSER=1 to skip this test)"
    );
}

/// An HS256 token for `sub: browser` that may publish to and subscribe to `browser-*` only.
pub fn mint_token(secret: &[u8]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "sub": "browser",
        "exp": now + 600,
        "gateway": { "publish": ["browser-*"], "subscribe": ["browser-*"] },
    });
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    let key = jsonwebtoken::EncodingKey::from_secret(secret).expect("HS256 key");
    jsonwebtoken::encode(&header, &claims, &key).expect("mint HS256 token")
}

/// The run's seed: `BROWSER_TEST_SEED`, or the clock (printed by the tests, to replay a run).
pub fn test_seed() -> u64 {
    std::env::var("BROWSER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

/// The page's verdict without its two ID lists (their lengths instead), for messages.
pub fn page_brief(r: &serde_json::Value) -> serde_json::Value {
    let mut brief = r.clone();
    for k in ["ids", "published_ids"] {
        brief[k] = serde_json::json!(r[k].as_array().map_or(0, Vec::len));
    }
    brief
}

/// The page got all `events`, with no error, gap, duplicate, reorder or altered data.
pub fn assert_exactly_once(r: &serde_json::Value, events: usize, context: &str) {
    let n = |k: &str| r[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(r["errors"], serde_json::json!([]), "{context}");
    assert_eq!(n("received"), events as u64, "{context}");
    assert_eq!(
        (
            n("gaps"),
            n("duplicates"),
            n("out_of_order"),
            n("data_mismatches")
        ),
        (0, 0, 0, 0),
        "{context}"
    );
}
