//! The access log (`--access-log on|off`): one line per request, written by a thread of its
//! own so a reactor never formats or writes one. A core hands each finished request (the
//! connection machine's [`Finished`] record, stamped with its end) to a bounded lock-free
//! queue (`--access-log-queue-lines-max`); when the queue is full the line is dropped and
//! counted (`gateway_access_log_dropped_total`), never waited for. The writer formats each line as the
//! process's other lines are (`--log-format`: target `access`, message `request`) and writes
//! what is queued in one `write` to stderr: one system call per batch, not per line.
//! A subscription's line is written when it ends.
//!
//! A line names the request ID, method, route class, status, bytes in and out, duration, the
//! resume class of a resume, the peer address and a fingerprint of the subject: never a
//! token, a cookie, a stream name or an MCP session ID.

use std::io::Write as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crossbeam::queue::SegQueue;

use crate::logging::{LogArgs, LogFormat, Switch};
use crate::proto::request_log::{Finished, method_label};

/// One request's line, as queued by a core.
#[derive(Debug)]
pub struct Line {
    pub finished: Finished,
    pub duration: Duration,
    /// When the answer left (the line's timestamp).
    pub end: Instant,
    pub peer: Option<IpAddr>,
}

/// The queue between the cores and the writer. A segmented lock-free queue, so a core's push
/// never waits for the writer: with a bounded ring (crossbeam's channel) a push into a full
/// ring spins until the writer finishes reading the slot it claimed, and a writer preempted in
/// that window (it runs at `SCHED_IDLE`) stalled a reactor for up to 1.3 s. The bound is a
/// count beside it.
#[derive(Debug)]
struct Queue {
    lines: SegQueue<Line>,
    len: AtomicUsize,
    max: usize,
}

/// Where cores queue lines (cloned into every core; a no-op when the log is off).
#[derive(Debug, Clone)]
pub struct Sink {
    q: Option<Arc<Queue>>,
}

impl Sink {
    /// A sink that drops everything (the log is off).
    pub fn off() -> Sink {
        Sink { q: None }
    }

    pub fn enabled(&self) -> bool {
        self.q.is_some()
    }

    /// Queues a line: `false` if it was dropped because the queue is full. Never waits.
    pub fn send(&self, line: Line) -> bool {
        let Some(q) = &self.q else {
            return true;
        };
        // Reserve a place first: the count never exceeds the bound, whatever the cores race.
        if q.len.fetch_add(1, Relaxed) >= q.max {
            q.len.fetch_sub(1, Relaxed);
            return false;
        }
        q.lines.push(line);
        true
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
pub fn start(flags: &LogArgs) -> Result<(Sink, Option<Writer>), String> {
    if flags.access_log == Switch::Off {
        return Ok((Sink::off(), None));
    }
    let q = Arc::new(Queue {
        lines: SegQueue::new(),
        len: AtomicUsize::new(0),
        max: flags.access_log_queue_lines_max.max(1),
    });
    let format = flags.log_format;
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, rx) = (stop.clone(), q.clone());
    let thread = std::thread::Builder::new()
        .name("access-log".into())
        .spawn(move || write_until_stopped(&rx, &flag, format))
        .map_err(|e| format!("access-log thread: {e}"))?;
    Ok((Sink { q: Some(q) }, Some(Writer { stop, thread })))
}

/// How often the writer wakes to drain the queue. It never blocks on the queue: a reactor's
/// send then never wakes a sleeping thread (a futex system call per line), and what was
/// queued meanwhile goes out in a few writes of [`BATCH_LINES_MAX`] lines.
const DRAIN_INTERVAL: Duration = Duration::from_millis(20);

/// Lines formatted into one buffer before it is written (about 14 KiB, 60 µs of work here),
/// after which the writer yields its CPU.
const BATCH_LINES_MAX: usize = 64;

fn write_until_stopped(q: &Queue, stop: &AtomicBool, format: LogFormat) {
    // Formatting a drain's lines takes milliseconds under load: never at a reactor's expense
    // (it preempted the reactor on a shared CPU and made the delivery tail: BENCHMARKS.md).
    // Lines that cannot be written in time are dropped and counted, as for a full queue.
    if let Err(e) = crate::sys::become_background_thread() {
        tracing::warn!(error = %e, "the access log's writer runs at normal priority");
    }
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        let stopping = stop.load(Relaxed);
        loop {
            let mut n = 0;
            while n < BATCH_LINES_MAX
                && let Some(l) = q.lines.pop()
            {
                q.len.fetch_sub(1, Relaxed);
                format_line(&mut buf, &l, format);
                n += 1;
            }
            if n == 0 {
                break;
            }
            flush(&mut buf);
            // `SCHED_IDLE` alone does not keep the writer off a runnable reactor: a trace
            // (BENCHMARKS.md, "Session 18") showed the scheduler switching from a runnable
            // reactor to this thread, which then formatted and wrote for up to 3.7 ms. A
            // reactor waits at most one batch.
            std::thread::yield_now();
        }
        // Stopped after the last drain: the cores are gone, nothing more arrives.
        if stopping {
            return;
        }
        std::thread::sleep(DRAIN_INTERVAL);
    }
}

fn flush(buf: &mut Vec<u8>) {
    // stderr is where every log line goes; a failed write loses lines, never blocks a core.
    let _ = std::io::stderr().lock().write_all(buf);
    buf.clear();
}

/// One line in the process's log format: the fields of a `tracing` event of target `access`
/// and message `request`, as `--log-format` writes them.
fn format_line(out: &mut Vec<u8>, line: &Line, format: LogFormat) {
    let f = &line.finished;
    let r = &f.record;
    let ago = Instant::now().saturating_duration_since(line.end);
    let at = timestamp(SystemTime::now() - ago);
    let peer = line.peer.map_or_else(|| "-".to_string(), |p| p.to_string());
    let method = r.method.map_or("-", method_label);
    let resume = r.resume.unwrap_or("-");
    let first_event_us = r.first_event.map_or(0, |d| d.as_micros() as u64);
    let subject = r.subject.as_deref().unwrap_or("-");
    let (duration_us, route) = (line.duration.as_micros() as u64, r.route.label());
    match format {
        LogFormat::Json => {
            let v = serde_json::json!({
                "timestamp": at, "level": "INFO", "target": "access", "message": "request",
                "request_id": r.id, "method": method, "route": route, "status": f.status,
                "bytes_in": r.bytes_in, "bytes_out": f.bytes_out, "duration_us": duration_us,
                "resume": resume, "first_event_us": first_event_us, "peer": peer,
                "subject": subject,
            });
            let _ = serde_json::to_writer(&mut *out, &v);
            out.push(b'\n');
        }
        LogFormat::Text => {
            let _ = writeln!(
                out,
                "{at}  INFO access: request request_id={} method=\"{method}\" route=\"{route}\" \
                 status={} bytes_in={} bytes_out={} duration_us={duration_us} resume=\"{resume}\" \
                 first_event_us={first_event_us} peer={peer} subject=\"{subject}\"",
                r.id, f.status, r.bytes_in, f.bytes_out
            );
        }
    }
}

/// RFC 3339 in UTC with microseconds, as the other log lines: `2026-12-05T08:24:38.130429Z`.
fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let (days, secs) = (d.as_secs() / 86_400, d.as_secs() % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        secs / 3_600,
        secs / 60 % 60,
        secs % 60,
        d.subsec_micros()
    )
}

/// The end of a request whose answer left at `now`.
pub fn line(finished: Finished, now: Instant, peer: Option<IpAddr>) -> Line {
    let duration = now.saturating_duration_since(finished.record.started);
    Line {
        finished,
        duration,
        end: now,
        peer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::request_log::Record;

    fn a_line() -> Line {
        let f = Finished {
            record: Record::unparsed(10, Instant::now()),
            status: 400,
            bytes_out: 0,
        };
        line(f, Instant::now(), None)
    }

    /// The queue holds at most its bound and refuses the rest (counted by the caller); what
    /// the writer took makes room again. Pushes never wait for the writer.
    #[test]
    fn the_queue_is_bounded_and_never_waits() {
        let q = Arc::new(Queue {
            lines: SegQueue::new(),
            len: AtomicUsize::new(0),
            max: 3,
        });
        let sink = Sink { q: Some(q.clone()) };
        let sent: Vec<bool> = (0..5).map(|_| sink.send(a_line())).collect();
        assert_eq!(sent, [true, true, true, false, false]);
        assert_eq!((q.lines.len(), q.len.load(Relaxed)), (3, 3));
        assert!(q.lines.pop().is_some());
        q.len.fetch_sub(1, Relaxed);
        assert!(sink.send(a_line()));
        assert!(!sink.send(a_line()));
        assert!(Sink::off().send(a_line()), "off: nothing to drop");
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |s: u64, us: u32| {
            timestamp(
                SystemTime::UNIX_EPOCH + Duration::from_secs(s) + Duration::from_micros(us.into()),
            )
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(at(1_796_459_078, 130_429), "2026-12-05T08:24:38.130429Z");
        assert_eq!(at(4_107_542_399, 999_999), "2100-02-28T23:59:59.999999Z");
    }
}
