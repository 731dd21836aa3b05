//! The access log (`--access-log on|off`): one line per request, written by a thread of its
//! own so a reactor never formats or writes one. A core hands each finished request (the
//! connection machine's [`Finished`] record, stamped with its end) to a bounded queue
//! (`--access-log-queue-lines-max`); when the queue is full the line is dropped and counted
//! (`gateway_access_log_dropped_total`), never waited for. The writer emits each line as a
//! `tracing` event of target `access` (message `request`), so it follows `--log-format`.
//! A subscription's line is written when it ends.
//!
//! A line names the request ID, method, route class, status, bytes in and out, duration, the
//! resume class of a resume, the peer address and a fingerprint of the subject: never a
//! token, a cookie, a stream name or an MCP session ID.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

use crate::proto::request_log::{Finished, method_label};

/// `--access-log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    On,
    Off,
}

/// One request's line, as queued by a core.
#[derive(Debug)]
pub struct Line {
    pub finished: Finished,
    pub duration: Duration,
    pub peer: Option<IpAddr>,
}

/// Where cores queue lines (cloned into every core; a no-op when the log is off).
#[derive(Debug, Clone)]
pub struct Sink {
    tx: Option<Sender<Line>>,
}

impl Sink {
    /// A sink that drops everything (the log is off).
    pub fn off() -> Sink {
        Sink { tx: None }
    }

    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues a line: `false` if it was dropped because the queue is full.
    pub fn send(&self, line: Line) -> bool {
        match &self.tx {
            None => true,
            Some(tx) => match tx.try_send(line) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => false,
                // The writer is gone only at shutdown, after the cores.
                Err(TrySendError::Disconnected(_)) => true,
            },
        }
    }
}

/// The writer thread; [`Writer::stop`] drains what is queued and joins it.
#[derive(Debug)]
pub struct Writer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// Stops the writer (if one runs) once what is queued is written.
pub fn stop(writer: Option<Writer>) {
    if let Some(w) = writer {
        w.stop.store(true, Relaxed);
        let _ = w.thread.join();
    }
}

/// Starts the writer (`--access-log on`) with a queue of `--access-log-queue-lines-max`.
pub fn start(flags: &crate::config::LogArgs) -> Result<(Sink, Option<Writer>), String> {
    if flags.access_log == Switch::Off {
        return Ok((Sink::off(), None));
    }
    let (tx, rx) = crossbeam::channel::bounded(flags.access_log_queue_lines_max.max(1));
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("access-log".into())
        .spawn(move || write_until_stopped(&rx, &flag))
        .map_err(|e| format!("access-log thread: {e}"))?;
    Ok((Sink { tx: Some(tx) }, Some(Writer { stop, thread })))
}

fn write_until_stopped(rx: &Receiver<Line>, stop: &AtomicBool) {
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => write(&line),
            Err(RecvTimeoutError::Timeout) if stop.load(Relaxed) => break,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
    rx.try_iter().for_each(|l| write(&l));
}

fn write(line: &Line) {
    let f = &line.finished;
    let r = &f.record;
    let peer = line.peer.map_or_else(|| "-".to_string(), |p| p.to_string());
    tracing::info!(
        target: "access",
        request_id = %r.id,
        method = r.method.map_or("-", method_label),
        route = r.route.label(),
        status = f.status,
        bytes_in = r.bytes_in,
        bytes_out = f.bytes_out,
        duration_us = line.duration.as_micros() as u64,
        resume = r.resume.unwrap_or("-"),
        peer = %peer,
        subject = r.subject.as_deref().unwrap_or("-"),
        "request"
    );
}

/// The end of a request whose answer left at `now`.
pub fn line(finished: Finished, now: Instant, peer: Option<IpAddr>) -> Line {
    let duration = now.saturating_duration_since(finished.record.started);
    Line {
        finished,
        duration,
        peer,
    }
}
