//! Test harness for end-to-end tests: spawns the built `gateway` binary on an ephemeral
//! loopback port with a temporary data directory, and provides plain blocking std TCP clients
//! (HTTP request/response and an SSE reader) with timeouts. Every wait is bounded.
#![allow(dead_code)]
#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// A running gateway process.
pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    /// The admin listener (`/metrics`, `/healthz`).
    pub admin_addr: SocketAddr,
    pub data_dir: PathBuf,
    /// Its stderr lines, when started with [`Gateway::start_logged`] (else stderr is the test's).
    pub stderr: Option<std::sync::Arc<std::sync::Mutex<Vec<String>>>>,
    _tmp: Option<tempfile::TempDir>,
}

impl Gateway {
    /// Starts a gateway with a fresh data directory and extra flags.
    pub fn start(args: &[&str]) -> Gateway {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let mut g = Gateway::start_in(&dir, args);
        g._tmp = Some(tmp);
        g
    }

    /// Starts a gateway with a fresh data directory, keeping its stderr lines in `stderr`.
    pub fn start_logged(args: &[&str]) -> Gateway {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut g = Gateway::spawn(tmp.path(), args, true);
        g._tmp = Some(tmp);
        g
    }

    /// All stderr lines so far (after [`Gateway::start_logged`]; waits for the process to end
    /// first if it was stopped, so nothing is missed).
    pub fn stderr_lines(&mut self) -> Vec<String> {
        let lines = self.stderr.as_ref().expect("started with start_logged");
        if self.child.try_wait().ok().flatten().is_some() {
            // The reader thread ends at EOF: give it a bounded moment to take the last lines.
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::sync::Arc::strong_count(lines) > 1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        lines.lock().unwrap().clone()
    }

    /// Starts a gateway on an existing data directory (for restarts).
    pub fn start_in(dir: &Path, args: &[&str]) -> Gateway {
        Gateway::spawn(dir, args, false)
    }

    pub fn spawn(dir: &Path, args: &[&str], keep_stderr: bool) -> Gateway {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
        if !args.contains(&"--segment-bytes") {
            // Small segments keep test data directories small.
            cmd.args(["--segment-bytes", "1048576"]);
        }
        if !args.contains(&"--admin-listen") {
            cmd.args(["--admin-listen", "127.0.0.1:0"]);
        }
        cmd.arg("--data-dir")
            .arg(dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(if keep_stderr {
                Stdio::piped()
            } else {
                Stdio::inherit()
            });
        let mut child = cmd.spawn().expect("spawn gateway");
        let stderr = child.stderr.take().map(|e| {
            let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let keep = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(e).lines().map_while(Result::ok) {
                    keep.lock().unwrap().push(line);
                }
            });
            lines
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            for _ in 0..2 {
                let mut line = String::new();
                let _ = r.read_line(&mut line);
                let _ = tx.send(line);
            }
            // Keep draining so the child never blocks on a full pipe.
            let mut sink = Vec::new();
            let _ = r.read_to_end(&mut sink);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("gateway printed its address");
        if line.is_empty() {
            // It exited before listening: say why (its stderr, when kept here).
            let st = child.wait();
            std::thread::sleep(Duration::from_millis(200));
            let err = stderr.as_ref().map(|l| l.lock().unwrap().join("\n"));
            panic!("the gateway exited before listening ({st:?}): {err:?}");
        }
        let addr = listening_addr(&line);
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("gateway printed its admin address");
        let admin = line
            .trim()
            .strip_prefix("admin listener on ")
            .unwrap_or_else(|| panic!("unexpected second line {line:?}"))
            .parse()
            .expect("admin address");
        Gateway {
            child,
            addr,
            admin_addr: admin,
            data_dir: dir.to_path_buf(),
            stderr,
            _tmp: None,
        }
    }

    /// SIGTERM, then wait (bounded) and return whether it exited 0.
    pub fn stop(&mut self) -> bool {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st.success();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends the gateway signal `sig` (`"HUP"`, `"TERM"`…).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id().to_string();
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &pid])
            .status();
        assert!(st.unwrap().success(), "kill -{sig} {pid}");
    }

    /// Resident set size of the gateway process in KiB.
    pub fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    /// Value of one metric line (exact label set), summed if `labels` matches several.
    pub fn metric(&self, name: &str, label_filter: &str) -> u64 {
        let (_, _, body) = request(self.admin_addr, "GET", "/metrics", &[], b"");
        let text = String::from_utf8(body).unwrap();
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
            .filter(|l| l.contains(label_filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// Reads one HTTP response with a Content-Length body from `r`.
pub fn read_response(r: &mut impl BufRead) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split(' ')
        .nth(1)
        .unwrap_or_else(|| panic!("bad status line {line:?}"))
        .parse()
        .unwrap();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).expect("header");
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').expect("header colon");
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0; len];
    r.read_exact(&mut body).expect("body");
    (status, headers, body)
}

/// One request on a fresh connection.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = connect(addr);
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    read_response(&mut BufReader::new(s))
}

pub fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

/// Publishes one event; returns its ID.
pub fn publish(addr: SocketAddr, stream: &str, data: &str) -> String {
    let (st, _, body) = request(
        addr,
        "POST",
        &format!("/v1/streams/{stream}/events"),
        &[],
        data.as_bytes(),
    );
    assert_eq!(st, 201, "{}", String::from_utf8_lossy(&body));
    json(&body)["id"].as_str().unwrap().to_string()
}

/// Publishes a batch (NDJSON of data strings); returns the IDs.
pub fn publish_batch(addr: SocketAddr, stream: &str, datas: &[String]) -> Vec<String> {
    let mut body = String::new();
    for d in datas {
        body.push_str(&serde_json::json!({ "data": d }).to_string());
        body.push('\n');
    }
    let (st, _, resp) = request(
        addr,
        "POST",
        &format!("/v1/streams/{stream}/events:batch"),
        &[],
        body.as_bytes(),
    );
    assert_eq!(st, 201, "{}", String::from_utf8_lossy(&resp));
    json(&resp)["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The address in the gateway's first stdout line, `listening on <addr>`.
pub fn listening_addr(line: &str) -> SocketAddr {
    line.trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .expect("address")
}

/// Runs the gateway binary (`--data-dir dir --listen 127.0.0.1:0`, then `args`) expecting a
/// refused start: waits at most `secs` for it to exit by itself and returns its exit status and
/// stderr. Panics (after killing it) if it is still running then.
pub fn run_to_exit(dir: &Path, args: &[&str], secs: u64) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--admin-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gateway");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gateway with {args:?} did not exit within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    (status, err)
}

/// Publishes `count` events to `stream` in batches of 500, numbered from `first`: event `n`
/// has data `"{n}:{payload}"`.
pub fn publish_numbered(addr: SocketAddr, stream: &str, first: u64, count: u64, payload: &str) {
    let end = first + count;
    let mut next = first;
    while next < end {
        let upto = end.min(next + 500);
        let datas: Vec<String> = (next..upto).map(|i| format!("{i}:{payload}")).collect();
        publish_batch(addr, stream, &datas);
        next = upto;
    }
}

/// Starts a gateway as the parked-window tests run it (`--cores 1 --fsync never
/// --notsent-lowat-bytes 16384`), plus `extra` flags.
pub fn start_for_parked_window(extra: &[&str]) -> Gateway {
    let mut args = vec![
        "--cores",
        "1",
        "--fsync",
        "never",
        "--notsent-lowat-bytes",
        "16384",
    ];
    args.extend_from_slice(extra);
    Gateway::start(&args)
}

/// Flags for a log whose retention soon deletes events: 64 KiB segments, 64 KiB kept per shard.
pub const SMALL_RETENTION: [&str; 4] = ["--segment-bytes", "65536", "--retain-bytes", "65536"];

/// The sequence number of an event ID `{epoch}-{stream}-{seq}`.
pub fn seq_of(id: &str) -> u64 {
    id.rsplit('-').next().unwrap().parse().unwrap()
}

/// One parsed SSE event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// A blocking SSE subscription.
pub struct Sse {
    pub stream: TcpStream,
    pub status: u16,
    /// The response head as received (status line and headers, up to the blank line).
    pub head: String,
    pub body: Vec<u8>,
    buf: Vec<u8>,
    pos: usize,
    pub bytes_read: usize,
}

impl Sse {
    /// Sends the GET and reads the response head. For non-200 the body is in `body`.
    pub fn open(addr: SocketAddr, path: &str, last_event_id: Option<&str>) -> Sse {
        Sse::open_with(addr, path, last_event_id, &[])
    }

    /// [`Sse::open`] with extra request headers.
    pub fn open_with(
        addr: SocketAddr,
        path: &str,
        last_event_id: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Sse {
        let mut s = connect(addr);
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n");
        if let Some(id) = last_event_id {
            req.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut sse = Sse {
            stream: s,
            status: 0,
            head: String::new(),
            body: Vec::new(),
            buf: Vec::new(),
            pos: 0,
            bytes_read: 0,
        };
        // Read until the end of the head.
        let head_end = loop {
            if let Some(i) = sse.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(sse.fill() > 0, "connection closed before the response head");
        };
        let head = String::from_utf8(sse.buf[..head_end].to_vec()).unwrap();
        sse.status = head.split(' ').nth(1).unwrap().parse().unwrap();
        sse.pos = head_end;
        if sse.status != 200 {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            while sse.buf.len() - sse.pos < len {
                assert!(sse.fill() > 0);
            }
            sse.body = sse.buf[sse.pos..sse.pos + len].to_vec();
        }
        sse.head = head;
        sse
    }

    /// The value of response header `name` (case-insensitive), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.split("\r\n").find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn fill(&mut self) -> usize {
        let mut tmp = [0u8; 65536];
        match self.stream.read(&mut tmp) {
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                self.bytes_read += n;
                n
            }
            Err(e) => panic!("sse read: {e}"),
        }
    }

    /// Reads at most `n` more bytes from the socket (0 = EOF).
    pub fn fill_some(&mut self, n: usize) -> usize {
        let mut tmp = vec![0u8; n.max(1)];
        match self.stream.read(&mut tmp) {
            Ok(k) => {
                self.buf.extend_from_slice(&tmp[..k]);
                self.bytes_read += k;
                k
            }
            Err(e) => panic!("sse read: {e}"),
        }
    }

    /// Switches the socket to non-blocking and buffers what has already arrived, stopping once
    /// the socket is momentarily empty (or at EOF or a read error) or `cap_bytes` (checked
    /// between reads) have been read; the events are then in `take_buffered`.
    pub fn drain_nonblocking(&mut self, cap_bytes: usize) {
        self.stream.set_nonblocking(true).unwrap();
        let mut tmp = vec![0u8; 1 << 16];
        let mut drained = 0;
        while drained < cap_bytes {
            match self.stream.read(&mut tmp) {
                Ok(0) | Err(_) => break,
                Ok(k) => {
                    self.inject(&tmp[..k]);
                    drained += k;
                }
            }
        }
    }

    /// Appends bytes read from the socket by the caller.
    pub fn inject(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        self.bytes_read += bytes.len();
    }

    /// The next complete event already buffered (comments and `retry:` are skipped).
    pub fn take_buffered(&mut self) -> Option<Event> {
        loop {
            let rest = &self.buf[self.pos..];
            let end = rest.windows(2).position(|w| w == b"\n\n")?;
            let block = String::from_utf8(rest[..end].to_vec()).expect("utf8 event");
            self.pos += end + 2;
            let mut ev = Event {
                id: None,
                event: None,
                data: String::new(),
            };
            let mut has_data = false;
            for line in block.split('\n') {
                if let Some(v) = line.strip_prefix("id: ") {
                    ev.id = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("event: ") {
                    ev.event = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    if has_data {
                        ev.data.push('\n');
                    }
                    ev.data.push_str(v);
                    has_data = true;
                }
            }
            if has_data || ev.id.is_some() || ev.event.is_some() {
                return Some(ev);
            }
        }
    }

    /// Blocks (bounded by the read timeout) for the next event; None on EOF.
    pub fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.take_buffered() {
                return Some(e);
            }
            if self.fill() == 0 {
                return None;
            }
        }
    }
}

/// Names of streams owned by core 0 and by core 1 of a 2-core gateway with the default 8
/// shards (the gateway's documented FNV-1a 64 → shard → `shard % cores`).
pub fn stream_on_core(core: u64, tag: &str) -> String {
    (0..1000)
        .map(|i| format!("{tag}{i}"))
        .find(|n| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in n.bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            (h % 8) % 2 == core
        })
        .unwrap()
}
