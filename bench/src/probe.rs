//! The too-old-ID probe: publish N events to a fresh stream while one subscriber records their
//! IDs, then resume from an early ID and report what the server does — an explicit answer
//! (HTTP 410, or an in-band `event: truncated`), a correct replay, or a silent gap.
//!
//! Blocking std::net sockets with timeouts: this is a one-shot demonstration, not a load path.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::chunked::Dechunker;
use crate::payload::{parse_payload, write_payload};
use crate::sse::SseParser;
use crate::target::{Bearer, UrlTemplate};

/// Why the probe could not be carried out (as opposed to what the server answered).
#[derive(Debug)]
pub enum ProbeError {
    /// The flags cannot work.
    BadConfig(&'static str),
    /// TCP connect to the server failed.
    Connect {
        addr: std::net::SocketAddr,
        err: std::io::Error,
    },
    /// A socket operation failed during `step`.
    Io {
        step: &'static str,
        err: std::io::Error,
    },
    /// The server closed the connection during `step`.
    Closed { step: &'static str },
    /// Nothing arrived before the timeout during `step`.
    Timeout { step: &'static str },
    /// A response head did not parse.
    BadResponse {
        step: &'static str,
        why: httparse::Error,
    },
    /// A publish response had no `Content-Length`.
    NoContentLength,
    /// A publish was refused.
    PublishRefused { status: u16, body: String },
    /// The recorder's subscription was refused.
    RecorderRefused { status: u16 },
    /// The recorder itself was sent `event: truncated` (it fell behind).
    RecorderTruncated,
    /// The recorder never saw the event to resume from.
    RecorderMissed {
        counter: u64,
        seen: u64,
        events: u64,
    },
    /// A chunked body was malformed.
    Chunked(crate::chunked::ChunkError),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::BadConfig(s) => write!(f, "{s}"),
            ProbeError::Connect { addr, err } => write!(f, "connect {addr}: {err}"),
            ProbeError::Io { step, err } => write!(f, "{step}: {err}"),
            ProbeError::Closed { step } => write!(f, "{step}: the server closed the connection"),
            ProbeError::Timeout { step } => write!(f, "{step}: nothing before the timeout"),
            ProbeError::BadResponse { step, why } => write!(f, "{step}: bad response head: {why}"),
            ProbeError::NoContentLength => write!(f, "publish response without Content-Length"),
            ProbeError::PublishRefused { status, body } => {
                write!(f, "publish answered HTTP {status}: {body}")
            }
            ProbeError::RecorderRefused { status } => {
                write!(f, "recorder subscribe answered HTTP {status}")
            }
            ProbeError::RecorderTruncated => {
                write!(f, "the recorder itself was sent event: truncated")
            }
            ProbeError::RecorderMissed {
                counter,
                seen,
                events,
            } => {
                write!(
                    f,
                    "the recorder did not see event {counter} (saw {seen} of {events})"
                )
            }
            ProbeError::Chunked(e) => write!(f, "chunked body: {e}"),
        }
    }
}

/// What the server answered to the early resume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum ProbeOutcome {
    /// HTTP 410: explicit.
    Gone { body: String },
    /// 200 whose first event is `event: truncated`: explicit.
    TruncatedEvent {
        data: String,
        next_counter: Option<u64>,
    },
    /// The resume continued at exactly the next event: the history was still there.
    Contiguous,
    /// The resume continued later than the next event with no notice: a silent gap.
    SilentGap {
        expected_counter: u64,
        first_counter: u64,
        missing: u64,
    },
    /// Anything else (other status, no event before the timeout, foreign payloads).
    Other(String),
}

impl ProbeOutcome {
    /// True for outcomes that keep the invariant (explicit or contiguous).
    pub fn is_ok(&self) -> bool {
        matches!(
            self,
            ProbeOutcome::Gone { .. }
                | ProbeOutcome::TruncatedEvent { .. }
                | ProbeOutcome::Contiguous
        )
    }
}

/// The probe's report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeReport {
    pub label: String,
    pub stream: String,
    pub published: u64,
    pub resume_after_counter: u64,
    pub resume_id: String,
    pub outcome: ProbeOutcome,
}

/// Probe settings.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub publish: UrlTemplate,
    pub subscribe: UrlTemplate,
    pub stream: String,
    pub events: u64,
    pub payload_bytes: usize,
    pub resume_after_counter: u64,
    pub timeout_secs: f64,
    /// Seconds to wait between the last publish and the resume.
    pub settle_secs: f64,
    /// Extra query appended to the resume request (e.g. `on_truncated=earliest`).
    pub resume_query: Option<String>,
    /// `Authorization: Bearer <token>` on every request (default: none).
    pub bearer: Bearer,
}

struct Sub {
    sock: TcpStream,
    status: u16,
    body_start: Vec<u8>,
    chunked: Option<Dechunker>,
    sse: SseParser,
}

fn subscribe(
    url: &UrlTemplate,
    bearer: &Bearer,
    stream: &str,
    last_id: Option<&str>,
    query: Option<&str>,
    timeout: Duration,
) -> Result<Sub, ProbeError> {
    const STEP: &str = "subscribe";
    let mut sock =
        TcpStream::connect_timeout(&url.addr, timeout).map_err(|err| ProbeError::Connect {
            addr: url.addr,
            err,
        })?;
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(|err| ProbeError::Io { step: STEP, err })?;
    let req = subscribe_request(url, bearer, stream, last_id, query);
    sock.write_all(&req)
        .map_err(|err| ProbeError::Io { step: STEP, err })?;
    read_sub_head(sock, timeout)
}

/// A subscribe request, with `Last-Event-ID` and an extra query when given.
fn subscribe_request(
    url: &UrlTemplate,
    bearer: &Bearer,
    stream: &str,
    last_id: Option<&str>,
    query: Option<&str>,
) -> Vec<u8> {
    let mut req = b"GET ".to_vec();
    url.render_path(stream, &mut req);
    if let Some(q) = query {
        req.push(if url.has_query() { b'&' } else { b'?' });
        req.extend_from_slice(q.as_bytes());
    }
    req.extend_from_slice(
        format!(
            " HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n",
            url.host_header
        )
        .as_bytes(),
    );
    bearer.append_header(&mut req);
    if let Some(id) = last_id {
        req.extend_from_slice(format!("Last-Event-ID: {id}\r\n").as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    req
}

/// Reads a subscribe response's head within `timeout`; the body bytes read with it are kept.
fn read_sub_head(mut sock: TcpStream, timeout: Duration) -> Result<Sub, ProbeError> {
    const STEP: &str = "subscribe";
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        if Instant::now() > deadline {
            return Err(ProbeError::Timeout { step: STEP });
        }
        match sock.read(&mut tmp) {
            Ok(0) => return Err(ProbeError::Closed { step: STEP }),
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(err) => return Err(ProbeError::Io { step: STEP, err }),
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(len) = resp
            .parse(&buf)
            .map_err(|why| ProbeError::BadResponse { step: STEP, why })?
        {
            let chunked = resp
                .headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding"));
            return Ok(Sub {
                status: resp.code.unwrap_or(0),
                body_start: buf[len..].to_vec(),
                chunked: chunked.then(Dechunker::new),
                sock,
                sse: SseParser::new(),
            });
        }
    }
}

/// Read events until `stop` says so or the deadline passes. Each event: (id, type, data prefix).
/// Called per event with (id, event type, data prefix); returns true to stop reading.
type StopFn<'a> = dyn FnMut(&[u8], &[u8], &[u8]) -> bool + 'a;

fn read_events(sub: &mut Sub, deadline: Instant, stop: &mut StopFn<'_>) -> Result<(), ProbeError> {
    let mut pending = std::mem::take(&mut sub.body_start);
    let mut tmp = [0u8; 16384];
    let mut stopped = false;
    loop {
        if !pending.is_empty() {
            let mut on_event = |e: crate::sse::Event<'_>| {
                if !stopped {
                    stopped = stop(e.id, e.event_type, e.data_prefix);
                }
            };
            match &mut sub.chunked {
                Some(d) => {
                    let mut rest = &pending[..];
                    while !rest.is_empty() {
                        let used = d
                            .feed(rest, &mut |b| sub.sse.feed(b, &mut on_event))
                            .map_err(ProbeError::Chunked)?;
                        rest = &rest[used..];
                    }
                }
                None => sub.sse.feed(&pending, &mut on_event),
            }
            pending.clear();
        }
        if stopped || Instant::now() > deadline {
            return Ok(());
        }
        match sub.sock.read(&mut tmp) {
            Ok(0) => return Ok(()),
            Ok(n) => pending.extend_from_slice(&tmp[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(err) => {
                return Err(ProbeError::Io {
                    step: "read events",
                    err,
                });
            }
        }
    }
}

fn publish(
    url: &UrlTemplate,
    bearer: &Bearer,
    stream: &str,
    n: u64,
    payload_bytes: usize,
    timeout: Duration,
    after_window: &mut dyn FnMut(u64) -> Result<(), ProbeError>,
) -> Result<(), ProbeError> {
    let mut sock =
        TcpStream::connect_timeout(&url.addr, timeout).map_err(|err| ProbeError::Connect {
            addr: url.addr,
            err,
        })?;
    sock.set_read_timeout(Some(timeout))
        .map_err(|err| ProbeError::Io {
            step: "publish",
            err,
        })?;
    let mut path = Vec::new();
    url.render_path(stream, &mut path);
    let path = String::from_utf8_lossy(&path).into_owned();
    let mut buf = Vec::new();
    // Pipelined in windows of PROBE_PIPELINE_DEPTH requests (one stream, one connection: the
    // server keeps their order), then every response of the window is read.
    let mut c = 0;
    while c < n {
        let window = (n - c).min(PROBE_PIPELINE_DEPTH);
        let mut req = Vec::new();
        for k in c..c + window {
            let mut payload = Vec::new();
            write_payload(&mut payload, k, 0, payload_bytes);
            req.extend_from_slice(
                format!("POST {path} HTTP/1.1\r\nHost: {}\r\n", url.host_header).as_bytes(),
            );
            bearer.append_header(&mut req);
            req.extend_from_slice(format!("Content-Length: {}\r\n\r\n", payload.len()).as_bytes());
            req.extend_from_slice(&payload);
        }
        sock.write_all(&req).map_err(|err| ProbeError::Io {
            step: "publish",
            err,
        })?;
        c += window;
        for _ in 0..window {
            read_response(&mut sock, &mut buf)?;
        }
        after_window(c)?;
    }
    Ok(())
}

/// Pipelined publishes per window in the probe.
const PROBE_PIPELINE_DEPTH: u64 = 64;

/// Read one complete publish response (Content-Length framed) from `sock`, buffering extra bytes.
fn read_response(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(), ProbeError> {
    const STEP: &str = "publish response";
    {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(len) = resp
                .parse(buf)
                .map_err(|why| ProbeError::BadResponse { step: STEP, why })?
            {
                let code = resp.code.unwrap_or(0);
                let cl: usize = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                    .ok_or(ProbeError::NoContentLength)?;
                if buf.len() >= len + cl {
                    if code / 100 != 2 {
                        return Err(ProbeError::PublishRefused {
                            status: code,
                            body: String::from_utf8_lossy(&buf[len..len + cl]).into_owned(),
                        });
                    }
                    buf.drain(..len + cl);
                    return Ok(());
                }
            }
            let mut tmp = [0u8; 4096];
            match sock.read(&mut tmp) {
                Ok(0) => return Err(ProbeError::Closed { step: STEP }),
                Ok(k) => buf.extend_from_slice(&tmp[..k]),
                Err(err) => return Err(ProbeError::Io { step: STEP, err }),
            }
        }
    }
}

/// Run the probe.
pub fn run(cfg: &ProbeConfig, label: &str) -> Result<ProbeReport, ProbeError> {
    if cfg.resume_after_counter + 1 >= cfg.events {
        return Err(ProbeError::BadConfig(
            "--resume-after-counter must be below --events - 1",
        ));
    }
    let timeout = Duration::from_secs_f64(cfg.timeout_secs);
    let resume_id = publish_recorded(cfg, timeout)?;
    // Step 2: resume from that early ID.
    let mut sub = subscribe(
        &cfg.subscribe,
        &cfg.bearer,
        &cfg.stream,
        Some(&resume_id),
        cfg.resume_query.as_deref(),
        timeout,
    )?;
    let outcome = resume_outcome(cfg, &mut sub, timeout)?;
    Ok(ProbeReport {
        label: label.into(),
        stream: cfg.stream.clone(),
        published: cfg.events,
        resume_after_counter: cfg.resume_after_counter,
        resume_id,
        outcome,
    })
}

/// Step 1 of the probe: a recorder subscribed before the first publish sees every event and
/// its ID. Publishes the events, lets the server apply its retention, and returns the ID of
/// the event to resume after.
fn publish_recorded(cfg: &ProbeConfig, timeout: Duration) -> Result<String, ProbeError> {
    let mut rec = subscribe(
        &cfg.subscribe,
        &cfg.bearer,
        &cfg.stream,
        None,
        None,
        timeout,
    )?;
    if rec.status != 200 {
        return Err(ProbeError::RecorderRefused { status: rec.status });
    }
    // The recorder keeps up with the publisher (it must not become a slow consumer itself).
    let mut resume_id = None;
    let mut seen = 0u64;
    let mut recorder_truncated = false;
    publish(
        &cfg.publish,
        &cfg.bearer,
        &cfg.stream,
        cfg.events,
        cfg.payload_bytes,
        timeout,
        &mut |published| {
            read_events(&mut rec, Instant::now() + timeout, &mut |id, ty, data| {
                if ty == b"truncated" {
                    recorder_truncated = true;
                    return true;
                }
                if let Ok((c, _)) = parse_payload(data) {
                    seen = seen.max(c + 1);
                    if c == cfg.resume_after_counter {
                        resume_id = Some(String::from_utf8_lossy(id).into_owned());
                    }
                }
                seen >= published
            })?;
            if recorder_truncated {
                return Err(ProbeError::RecorderTruncated);
            }
            Ok(())
        },
    )?;
    drop(rec);
    // Let the server apply its retention (the gateway enforces it about once a second).
    std::thread::sleep(Duration::from_secs_f64(cfg.settle_secs));
    resume_id.ok_or(ProbeError::RecorderMissed {
        counter: cfg.resume_after_counter,
        seen,
        events: cfg.events,
    })
}

/// What the resume's answer shows: a 410, another status, or what its first event (and with
/// `event: truncated`, the one after it) says.
fn resume_outcome(
    cfg: &ProbeConfig,
    sub: &mut Sub,
    timeout: Duration,
) -> Result<ProbeOutcome, ProbeError> {
    if sub.status == 410 {
        let mut body = std::mem::take(&mut sub.body_start);
        let mut tmp = [0u8; 4096];
        if let Ok(n) = sub.sock.read(&mut tmp) {
            body.extend_from_slice(&tmp[..n]);
        }
        return Ok(ProbeOutcome::Gone {
            body: String::from_utf8_lossy(&body).trim().to_string(),
        });
    }
    if sub.status != 200 {
        return Ok(ProbeOutcome::Other(format!(
            "resume answered HTTP {}",
            sub.status
        )));
    }
    let expected = cfg.resume_after_counter + 1;
    let mut first: Option<(Vec<u8>, Vec<u8>)> = None;
    let mut after_truncated: Option<u64> = None;
    read_events(sub, Instant::now() + timeout, &mut |_, ty, data| {
        if first.is_none() {
            first = Some((ty.to_vec(), data.to_vec()));
            return ty != b"truncated";
        }
        after_truncated = parse_payload(data).ok().map(|(c, _)| c);
        true
    })?;
    Ok(match first {
        None => ProbeOutcome::Other("no event after the resume before the timeout".into()),
        Some((ty, data)) if ty == b"truncated" => ProbeOutcome::TruncatedEvent {
            data: String::from_utf8_lossy(&data).into_owned(),
            next_counter: after_truncated,
        },
        Some((_, data)) => match parse_payload(&data) {
            Ok((c, _)) if c == expected => ProbeOutcome::Contiguous,
            Ok((c, _)) if c > expected => ProbeOutcome::SilentGap {
                expected_counter: expected,
                first_counter: c,
                missing: c - expected,
            },
            Ok((c, _)) => {
                ProbeOutcome::Other(format!("resume repeated event {c} (expected {expected})"))
            }
            Err(e) => ProbeOutcome::Other(format!("foreign payload: {e:?}")),
        },
    })
}
