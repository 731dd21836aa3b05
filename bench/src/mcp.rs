//! The `mcp` scenario: M sessions against the gateway's MCP front (streamable HTTP), each making
//! tool calls to the fixture's `progress_stream(count, interval_ms)` whose SSE response is cut
//! at random byte offsets and resumed with `GET` + `Last-Event-ID`. Per call the progress values
//! must be exactly 1..count, in order, once each, followed by the call's result; the SSE IDs'
//! sequence must move in step with them (checked by [`Checker`]).
//!
//! One blocking thread per session (sessions are few; this is not the event hot path, and it
//! allocates per message to decode JSON). It does not implement MCP beyond what the scenario
//! needs: initialize, notifications/initialized, tools/call, DELETE; protocol 2025-06-18.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::checker::{CheckCounts, Checker};
use crate::chunked::Dechunker;
use crate::load::Rng;
use crate::progress::Progress;
use crate::sse::SseParser;
use crate::target::{UrlTemplate, gateway_seq};

/// Bytes of each SSE data line kept for JSON decoding (MCP messages of the fixture are short).
const MCP_DATA_KEEP_BYTES: usize = 1024;
/// Cuts happen at least this many body bytes into a connection (after the priming event).
const CUT_BYTES_MIN: usize = 128;

/// Protocol version the bench speaks.
pub const MCP_PROTOCOL_VERSION: &str = "2025-06-18";

/// Why a session or a call could not be carried out (as opposed to what it observed).
#[derive(Debug)]
pub enum McpError {
    /// The flags cannot work.
    BadConfig(&'static str),
    /// TCP connect to the gateway failed.
    Connect {
        addr: std::net::SocketAddr,
        err: std::io::Error,
    },
    /// A socket operation failed during `step` (an HTTP method or "SSE").
    Io {
        step: &'static str,
        err: std::io::Error,
    },
    /// The gateway closed the connection before a response head.
    Closed { step: &'static str },
    /// A response head did not parse.
    BadResponse {
        step: &'static str,
        why: httparse::Error,
    },
    /// A request was answered with an unexpected status (or not as SSE where SSE is needed).
    Refused { step: &'static str, status: u16 },
    /// `initialize` came back without `Mcp-Session-Id`.
    NoSessionId,
    /// The response stream ended or was cut before any event ID: nothing to resume from.
    NoEventId,
    /// No result before `--timeout-secs`.
    Timeout,
    /// A chunked body was malformed.
    Chunked(crate::chunked::ChunkError),
}

impl std::fmt::Display for McpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpError::BadConfig(s) => write!(f, "{s}"),
            McpError::Connect { addr, err } => write!(f, "connect {addr}: {err}"),
            McpError::Io { step, err } => write!(f, "{step}: {err}"),
            McpError::Closed { step } => write!(f, "{step}: closed before the response head"),
            McpError::BadResponse { step, why } => write!(f, "{step}: bad response head: {why}"),
            McpError::Refused { step, status } => write!(f, "{step} answered HTTP {status}"),
            McpError::NoSessionId => write!(f, "initialize answered without Mcp-Session-Id"),
            McpError::NoEventId => write!(f, "stream ended or cut before its first event ID"),
            McpError::Timeout => write!(f, "no result before --timeout-secs"),
            McpError::Chunked(e) => write!(f, "chunked body: {e}"),
        }
    }
}

/// Scenario settings (flags).
#[derive(Debug, Clone)]
pub struct McpConfig {
    pub url: UrlTemplate,
    pub sessions: usize,
    pub calls_per_session: usize,
    pub progress_count: u64,
    pub interval_ms: u64,
    /// Cuts per call (each followed by a resume).
    pub cuts_per_call: u32,
    /// A cut happens this many bytes (drawn uniformly up to it) into a connection's body.
    pub cut_bytes_max: usize,
    pub timeout_secs: f64,
    pub seed: u64,
    /// A progress line on stderr every this many seconds (0 = none).
    pub progress_interval_secs: u64,
}

/// What the scenario observed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct McpReport {
    pub label: String,
    pub sessions: usize,
    pub sessions_up: usize,
    pub calls: u64,
    pub calls_completed: u64,
    pub cuts: u64,
    pub resumes: u64,
    pub explicit_errors: u64,
    pub check: CheckCounts,
    /// Calls whose final result was missing or wrong.
    pub bad_results: u64,
    /// Duration of a whole tool call (POST to result), cuts and resumes included.
    pub call: crate::report::Percentiles,
    pub resume: crate::report::Percentiles,
    pub progress_per_sec: f64,
    /// Calls completed per second of the whole run (session setup included).
    pub calls_per_sec: f64,
    pub window_secs: f64,
    pub violations: u64,
    pub errors: Vec<String>,
}

#[derive(Debug)]
struct Shared {
    counts: CheckCounts,
    calls: u64,
    completed: u64,
    cuts: u64,
    resumes: u64,
    explicit: u64,
    bad_results: u64,
    sessions_up: usize,
    call_ns: Histogram<u64>,
    resume_ns: Histogram<u64>,
    errors: Vec<String>,
}

/// Run the scenario.
pub fn run(cfg: &McpConfig, label: &str) -> Result<McpReport, McpError> {
    if cfg.progress_count == 0 || cfg.sessions == 0 {
        return Err(McpError::BadConfig(
            "--sessions and --progress-count must be at least 1",
        ));
    }
    let hist = || Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("static bounds");
    let shared = Mutex::new(Shared {
        counts: CheckCounts::default(),
        calls: 0,
        completed: 0,
        cuts: 0,
        resumes: 0,
        explicit: 0,
        bad_results: 0,
        sessions_up: 0,
        call_ns: hist(),
        resume_ns: hist(),
        errors: Vec::new(),
    });
    let start = Instant::now();
    let end = run_sessions(cfg, &shared, start);
    let window = end.duration_since(start).as_secs_f64();
    let sh = shared.into_inner().expect("threads joined");
    let per_sec = |n: u64| if window > 0.0 { n as f64 / window } else { 0.0 };
    let session_failures = (cfg.sessions - sh.sessions_up) as u64;
    let violations =
        sh.counts.violations() + sh.bad_results + session_failures + (sh.calls - sh.completed);
    Ok(McpReport {
        label: label.into(),
        sessions: cfg.sessions,
        sessions_up: sh.sessions_up,
        calls: sh.calls,
        calls_completed: sh.completed,
        cuts: sh.cuts,
        resumes: sh.resumes,
        explicit_errors: sh.explicit,
        check: sh.counts,
        bad_results: sh.bad_results,
        call: crate::report::Percentiles::of(&sh.call_ns),
        resume: crate::report::Percentiles::of(&sh.resume_ns),
        progress_per_sec: per_sec(sh.counts.events),
        calls_per_sec: per_sec(sh.completed),
        window_secs: window,
        violations,
        errors: sh.errors,
    })
}

/// Runs every session on a thread of its own, with progress lines while they run; returns when
/// the last one ended (not when this thread noticed it).
fn run_sessions(cfg: &McpConfig, shared: &Mutex<Shared>, start: Instant) -> Instant {
    std::thread::scope(|s| {
        let sessions: Vec<_> = (0..cfg.sessions)
            .map(|i| {
                s.spawn(move || {
                    if let Err(e) = session(cfg, i, shared) {
                        let mut sh = shared.lock().expect("no panics while locked");
                        if sh.errors.len() < 16 {
                            sh.errors.push(format!("session {i}: {e}"));
                        }
                    }
                    Instant::now()
                })
            })
            .collect();
        let mut progress = Progress::new(cfg.progress_interval_secs, start);
        while !sessions.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            let (calls, events) = {
                let sh = shared.lock().expect("no panics while locked");
                (sh.completed, sh.counts.events)
            };
            let counts = [("calls completed", calls), ("progress events", events)];
            progress.tick(Instant::now(), &counts);
        }
        sessions
            .into_iter()
            .map(|h| h.join().expect("a session thread panicked"))
            .fold(start, Instant::max)
    })
}

impl McpReport {
    /// A plain-text table.
    pub fn table(&self) -> String {
        let mut o = format!("== mcp [{}]\n", self.label);
        let mut row = |k: &str, v: String| o.push_str(&format!("  {k:<34} {v}\n"));
        row(
            "sessions up / wanted",
            format!("{} / {}", self.sessions_up, self.sessions),
        );
        row(
            "calls completed / made (per s)",
            format!(
                "{} / {} ({:.0})",
                self.calls_completed, self.calls, self.calls_per_sec
            ),
        );
        row(
            "progress events (per s)",
            format!("{} ({:.0})", self.check.events, self.progress_per_sec),
        );
        row(
            "cuts / resumes",
            format!("{} / {}", self.cuts, self.resumes),
        );
        let r = &self.resume;
        row(
            "resume p50/p99/max us",
            format!("{:.0} / {:.0} / {:.0}", r.p50_us, r.p99_us, r.max_us),
        );
        let c = &self.call;
        row(
            "call duration p50/p99/max ms",
            format!(
                "{:.1} / {:.1} / {:.1}",
                c.p50_us / 1e3,
                c.p99_us / 1e3,
                c.max_us / 1e3
            ),
        );
        let k = &self.check;
        row(
            "gaps/missing/dups/reorders",
            format!(
                "{} / {} / {} / {}",
                k.gaps, k.missing_events, k.duplicates, k.reorders
            ),
        );
        row(
            "id-mismatch/malformed/undelivered",
            format!("{} / {} / {}", k.id_mismatches, k.malformed, k.undelivered),
        );
        row("missing or wrong results", self.bad_results.to_string());
        row(
            "explicit errors (410, JSON-RPC error)",
            self.explicit_errors.to_string(),
        );
        row("VIOLATIONS", self.violations.to_string());
        for e in &self.errors {
            o.push_str(&format!("  error: {e}\n"));
        }
        o
    }
}

/// One HTTP exchange's response head and the body bytes read with it.
struct Resp {
    status: u16,
    session_id: Option<String>,
    sse: bool,
    chunked: bool,
    content_length: Option<usize>,
    body_start: Vec<u8>,
    sock: TcpStream,
}

fn request(
    cfg: &McpConfig,
    method: &'static str,
    session: Option<&str>,
    last_id: Option<&[u8]>,
    body: Option<&str>,
) -> Result<Resp, McpError> {
    let timeout = Duration::from_secs_f64(cfg.timeout_secs);
    let mut sock =
        TcpStream::connect_timeout(&cfg.url.addr, timeout).map_err(|err| McpError::Connect {
            addr: cfg.url.addr,
            err,
        })?;
    sock.set_read_timeout(Some(timeout))
        .map_err(|err| McpError::Io { step: method, err })?;
    let _ = sock.set_nodelay(true);
    let req = build_request(cfg, method, session, last_id, body);
    sock.write_all(&req)
        .map_err(|err| McpError::Io { step: method, err })?;
    read_head(sock, method)
}

/// The request's bytes: `method` on the MCP URL, the session's headers, `Last-Event-ID` when
/// resuming, the JSON body if any.
fn build_request(
    cfg: &McpConfig,
    method: &'static str,
    session: Option<&str>,
    last_id: Option<&[u8]>,
    body: Option<&str>,
) -> Vec<u8> {
    let mut req = format!("{method} ").into_bytes();
    cfg.url.render_path("", &mut req);
    req.extend_from_slice(
        format!(
            " HTTP/1.1\r\nHost: {}\r\nAccept: application/json, text/event-stream\r\n",
            cfg.url.host_header
        )
        .as_bytes(),
    );
    if let Some(s) = session {
        req.extend_from_slice(
            format!("Mcp-Session-Id: {s}\r\nMCP-Protocol-Version: {MCP_PROTOCOL_VERSION}\r\n")
                .as_bytes(),
        );
    }
    if let Some(id) = last_id {
        req.extend_from_slice(b"Last-Event-ID: ");
        req.extend_from_slice(id);
        req.extend_from_slice(b"\r\n");
    }
    match body {
        Some(b) => req.extend_from_slice(
            format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            )
            .as_bytes(),
        ),
        None => req.extend_from_slice(b"\r\n"),
    }
    req
}

/// Reads a response head (and the body bytes that came with it) for the request `method`.
fn read_head(mut sock: TcpStream, method: &'static str) -> Result<Resp, McpError> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    loop {
        let n = sock
            .read(&mut tmp)
            .map_err(|err| McpError::Io { step: method, err })?;
        if n == 0 {
            return Err(McpError::Closed { step: method });
        }
        buf.extend_from_slice(&tmp[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(len) = resp
            .parse(&buf)
            .map_err(|why| McpError::BadResponse { step: method, why })?
        {
            let header = |name: &str| {
                resp.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
            };
            return Ok(Resp {
                status: resp.code.unwrap_or(0),
                session_id: header("mcp-session-id"),
                sse: header("content-type").is_some_and(|c| c.starts_with("text/event-stream")),
                chunked: header("transfer-encoding").is_some_and(|t| t.contains("chunked")),
                content_length: header("content-length").and_then(|v| v.parse().ok()),
                body_start: buf[len..].to_vec(),
                sock,
            });
        }
    }
}

/// Read a plain (non-SSE) body.
fn read_body(r: &mut Resp) -> Result<Vec<u8>, McpError> {
    let mut body = std::mem::take(&mut r.body_start);
    let want = r.content_length.unwrap_or(usize::MAX);
    let mut tmp = [0u8; 8192];
    while body.len() < want {
        match r.sock.read(&mut tmp) {
            Ok(0) => break,
            Ok(n) => body.extend_from_slice(&tmp[..n]),
            Err(err) => return Err(McpError::Io { step: "body", err }),
        }
    }
    Ok(body)
}

/// Called per event with (id, event type, data); returns true when the call is complete.
type OnEvent<'a> = dyn FnMut(&[u8], &[u8], &[u8]) -> bool + 'a;

/// Feed one SSE response to `sse` until `on_event` says done, the server closes, or `cut_at`
/// body bytes were read (then the connection is cut: returns true).
fn read_sse(
    r: &mut Resp,
    sse: &mut SseParser,
    cut_at: Option<usize>,
    deadline: Instant,
    on_event: &mut OnEvent<'_>,
) -> Result<bool, McpError> {
    let mut dechunk = r.chunked.then(Dechunker::new);
    let mut pending = std::mem::take(&mut r.body_start);
    let mut seen = 0usize;
    let mut done = false;
    let mut tmp = [0u8; 16384];
    loop {
        let mut cut = false;
        if let Some(c) = cut_at
            && seen + pending.len() >= c
        {
            pending.truncate(c.saturating_sub(seen));
            cut = true;
        }
        seen += pending.len();
        let mut on = |e: crate::sse::Event<'_>| {
            if !done {
                done = on_event(e.id, e.event_type, e.data_prefix);
            }
        };
        match &mut dechunk {
            Some(d) => {
                let mut rest = &pending[..];
                while !rest.is_empty() && !d.is_done() {
                    let used = d
                        .feed(rest, &mut |b| sse.feed(b, &mut on))
                        .map_err(McpError::Chunked)?;
                    rest = &rest[used..];
                }
            }
            None => sse.feed(&pending, &mut on),
        }
        pending.clear();
        if done {
            return Ok(false);
        }
        if cut {
            return Ok(true);
        }
        if Instant::now() > deadline {
            return Err(McpError::Timeout);
        }
        match r.sock.read(&mut tmp) {
            Ok(0) => return Ok(false),
            Ok(n) => pending.extend_from_slice(&tmp[..n]),
            Err(err) => return Err(McpError::Io { step: "SSE", err }),
        }
    }
}

fn session(cfg: &McpConfig, index: usize, shared: &Mutex<Shared>) -> Result<(), McpError> {
    let mut rng = Rng::new(cfg.seed.wrapping_add(index as u64 * 0x9e37_79b9));
    let init = format!(
        r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"{MCP_PROTOCOL_VERSION}","capabilities":{{}},"clientInfo":{{"name":"bench","version":"0"}}}}}}"#
    );
    let mut r = request(cfg, "POST", None, None, Some(&init))?;
    if r.status != 200 {
        return Err(McpError::Refused {
            step: "initialize",
            status: r.status,
        });
    }
    let sid = r.session_id.clone().ok_or(McpError::NoSessionId)?;
    if r.sse {
        let mut p = SseParser::with_data_keep_bytes(MCP_DATA_KEEP_BYTES);
        let deadline = Instant::now() + Duration::from_secs_f64(cfg.timeout_secs);
        read_sse(&mut r, &mut p, None, deadline, &mut |_, _, d| !d.is_empty())?;
    } else {
        read_body(&mut r)?;
    }
    drop(r);
    let mut r = request(
        cfg,
        "POST",
        Some(&sid),
        None,
        Some(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
    )?;
    if r.status != 202 && r.status != 200 {
        return Err(McpError::Refused {
            step: "notifications/initialized",
            status: r.status,
        });
    }
    let _ = read_body(&mut r);
    shared.lock().expect("lock").sessions_up += 1;
    for call in 1..=cfg.calls_per_session as u64 {
        let outcome = one_call(cfg, &sid, call, &mut rng, shared);
        let mut sh = shared.lock().expect("lock");
        sh.calls += 1;
        match outcome {
            Ok(()) => sh.completed += 1,
            Err(e) if sh.errors.len() < 16 => {
                sh.errors.push(format!("session {index} call {call}: {e}"))
            }
            Err(_) => {}
        }
    }
    if let Ok(mut r) = request(cfg, "DELETE", Some(&sid), None, None) {
        let _ = read_body(&mut r);
    }
    Ok(())
}

fn one_call(
    cfg: &McpConfig,
    sid: &str,
    call: u64,
    rng: &mut Rng,
    shared: &Mutex<Shared>,
) -> Result<(), McpError> {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{call},"method":"tools/call","params":{{"name":"progress_stream","arguments":{{"count":{},"interval_ms":{}}},"_meta":{{"progressToken":"t{call}"}}}}}}"#,
        cfg.progress_count, cfg.interval_ms
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(cfg.timeout_secs);
    let mut r = request(cfg, "POST", Some(sid), None, Some(&body))?;
    if r.status != 200 || !r.sse {
        return Err(McpError::Refused {
            step: "tools/call (SSE expected)",
            status: r.status,
        });
    }
    let mut check = CallCheck::new(call);
    let mut sse = SseParser::with_data_keep_bytes(MCP_DATA_KEEP_BYTES);
    let mut cuts_left = cfg.cuts_per_call;
    let mut cuts = 0u64;
    let mut resumes = 0u64;
    loop {
        // Past the `retry:` line and the priming event, so there is an ID to resume from.
        let cut_at =
            (cuts_left > 0).then(|| CUT_BYTES_MIN + rng.below(cfg.cut_bytes_max as u64) as usize);
        let cut = read_sse(&mut r, &mut sse, cut_at, deadline, &mut |id, ty, data| {
            check.handle_event(id, ty, data)
        })?;
        if check.result.is_some() {
            break;
        }
        if !cut {
            // The server ended the stream before the result: resume like a client would.
            if sse.last_id().is_empty() {
                return Err(McpError::NoEventId);
            }
        } else {
            cuts += 1;
            cuts_left -= 1;
        }
        if sse.last_id().is_empty() {
            return Err(McpError::NoEventId);
        }
        drop(r);
        check.resume_started = Some(Instant::now());
        sse.reset();
        r = request(cfg, "GET", Some(sid), Some(sse.last_id()), None)?;
        resumes += 1;
        if r.status == 410 {
            check.explicit += 1;
            check.checker.handle_truncation();
            break;
        }
        if r.status != 200 || !r.sse {
            return Err(McpError::Refused {
                step: "GET resume (SSE expected)",
                status: r.status,
            });
        }
    }
    check.finish(cfg, started, (cuts, resumes), shared);
    Ok(())
}

/// What one tool call's events showed: its progress checked in order, its result, explicit
/// truncations, and how long each resume took to its first event.
struct CallCheck {
    call: u64,
    /// Progress k is the k-th event; the checker wants 0-based counters.
    checker: Checker,
    result: Option<serde_json::Value>,
    explicit: u64,
    resume_started: Option<Instant>,
    resume_ns: Vec<u64>,
}

impl CallCheck {
    fn new(call: u64) -> Self {
        CallCheck {
            call,
            checker: Checker::new(0),
            result: None,
            explicit: 0,
            resume_started: None,
            resume_ns: Vec::new(),
        }
    }

    /// One event of the call's stream (id, event type, data); true once it is the result.
    fn handle_event(&mut self, id: &[u8], ty: &[u8], data: &[u8]) -> bool {
        let checker = &mut self.checker;
        if let Some(t0) = self.resume_started.take() {
            self.resume_ns.push(t0.elapsed().as_nanos() as u64);
        }
        if data.is_empty() {
            return false; // priming event
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
            checker.handle_malformed();
            return false;
        };
        if ty == b"truncated" {
            checker.handle_truncation();
            self.explicit += 1;
            return false;
        }
        if v.get("method").and_then(|m| m.as_str()) == Some("notifications/progress") {
            let p = v.pointer("/params/progress").and_then(|p| p.as_u64());
            match p {
                Some(p) if p >= 1 => {
                    let seq = gateway_seq(id).ok();
                    if seq.is_none() {
                        checker.handle_bad_id();
                    }
                    checker.handle_event(p - 1, seq);
                }
                _ => checker.handle_malformed(),
            }
            return false;
        }
        if v.get("id").and_then(|i| i.as_u64()) == Some(self.call) {
            self.result = Some(v);
            return true;
        }
        false
    }

    /// Judges the result, ends the check and adds the call's figures (with its `(cuts,
    /// resumes)`) to the shared totals.
    fn finish(
        mut self,
        cfg: &McpConfig,
        started: Instant,
        (cuts, resumes): (u64, u64),
        shared: &Mutex<Shared>,
    ) {
        let mut bad = 0;
        match &self.result {
            Some(v)
                if v.pointer("/result/structuredContent/sent")
                    .and_then(|s| s.as_u64())
                    == Some(cfg.progress_count) => {}
            Some(v) if v.get("error").is_some() => self.explicit += 1,
            _ if self.explicit > 0 => {}
            _ => bad = 1,
        }
        let explicit = self.explicit;
        self.checker.handle_end(cfg.progress_count, explicit > 0);
        let mut sh = shared.lock().expect("lock");
        sh.counts.add(self.checker.counts());
        sh.cuts += cuts;
        sh.resumes += resumes;
        sh.explicit += explicit;
        sh.bad_results += bad;
        let _ = sh
            .call_ns
            .record(started.elapsed().as_nanos().max(1) as u64);
        for ns in self.resume_ns {
            let _ = sh.resume_ns.record(ns.max(1));
        }
    }
}
