//! Upstream MCP server processes for `--upstream-cmd`: one child (`sh -c <cmd>`) per MCP
//! session (legacy) or one shared child (modern), speaking newline-delimited JSON-RPC on its
//! stdin/stdout. Each child has three small threads: a stdout reader (lines, bounded length,
//! into a bounded channel — when the reactor falls behind, the channel fills and the child
//! blocks on its pipe: a flood waits in the kernel and the log, not in our memory), a stderr
//! reader (into the gateway's log, i.e. our stderr) and a stdin writer (fed through a bounded
//! channel). After each event the reader wakes the owning reactor core (its eventfd).
//!
//! It does not interpret messages (that is `core`), and it uses no io_uring: pipes to child
//! processes are few and slow compared to client sockets, and blocking threads keep this
//! module free of `unsafe`. Kill = the MCP stdio shutdown (`2025-11-25/basic/lifecycle.mdx`):
//! close stdin; if the child has not exited after `kill_grace_ms`, SIGTERM (sent by running
//! `kill -TERM <pid>` on a helper thread, as std has no SIGTERM and this crate forbids
//! `unsafe`; the pid cannot have been reused because the child is not reaped until that
//! helper has finished); after
//! another `kill_grace_ms`, SIGKILL. Exited children are reaped by `poll`.
//!
//! With `--upstream-url` the same set holds HTTP clients instead of children
//! ([`crate::http_upstream`]), all built from one [`HttpEndpoint`] (the URL, the trust for
//! `https://`, the proxy, the connection counters), each with its own connections, shut down
//! when it stops; the interface and the events are the same, so the core and the driver do
//! not know which kind they talk to.
#![forbid(unsafe_code)]

use crate::core::UpstreamId;
use crate::credential::Credential;
use crate::http_upstream::{HttpEndpoint, HttpUpstream, Outbound, PoolStats};
pub use crate::upstream_event::{UpstreamEvent, UpstreamLimits};
use crossbeam::channel::{self, Receiver, Sender, TrySendError};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStderr, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

struct Proc {
    child: Child,
    stdin: Option<Sender<Vec<u8>>>,
    /// When SIGTERM is due (set by `kill`, cleared once sent).
    term_at: Option<Instant>,
    /// Set when a SIGTERM helper has finished; the child is not reaped before (pid reuse).
    term_sent: Option<Arc<AtomicBool>>,
    kill_at: Option<Instant>,
}

/// The stderr thread of a child: each line (at most 64 KiB) into the gateway's log.
fn log_stderr(id: UpstreamId, stderr: ChildStderr) {
    let mut r = BufReader::new(stderr);
    let mut line = Vec::new();
    while matches!(r.by_ref().take(64 * 1024).read_until(b'\n', &mut line), Ok(n) if n > 0) {
        // The child's own stderr, one event per line (target `mcp_front::upstream`).
        tracing::info!(
            upstream = id.0,
            "{}",
            String::from_utf8_lossy(&line).trim_end()
        );
        line.clear();
    }
}

/// The stdin thread of a child: writes each queued line until the queue closes or the pipe
/// breaks.
fn write_lines(in_rx: &Receiver<Vec<u8>>, mut stdin: ChildStdin) {
    for line in in_rx {
        if stdin.write_all(&line).and_then(|()| stdin.flush()).is_err() {
            break;
        }
    }
    // Dropping stdin closes the pipe: the MCP stdio shutdown signal.
}

/// Sends SIGTERM to an unreaped child of ours without blocking the caller; the flag is set
/// once the helper is done (the caller must not reap the child before).
fn sigterm(child: &Child) -> Arc<AtomicBool> {
    let pid = child.id().to_string();
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let started = std::thread::Builder::new()
        .name("mcp-sigterm".into())
        .spawn(move || {
            let _ = Command::new("kill")
                .args(["-TERM", &pid])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            d.store(true, Ordering::SeqCst);
        });
    if started.is_err() {
        done.store(true, Ordering::SeqCst); // no SIGTERM; SIGKILL follows after the grace
    }
    done
}

/// A SIGTERM helper is still running for this child.
fn term_pending(p: &Proc) -> bool {
    p.term_sent
        .as_ref()
        .is_some_and(|d| !d.load(Ordering::SeqCst))
}

/// What the reactor asks of its upstreams. [`UpstreamSet`] is the real one (children or HTTP
/// clients); a test or the simulator may bring its own, deterministic one. The reactor never
/// blocks on it: events are taken with [`Upstreams::try_recv`] when the core's eventfd is
/// woken, exits with [`Upstreams::poll`].
pub trait Upstreams: Send + std::fmt::Debug {
    /// Upstreams running (children, HTTP clients) or not yet reaped.
    fn children(&self) -> usize;

    /// The HTTP upstream's connection counters (`None` for stdio children).
    fn http_stats(&self) -> Option<PoolStats>;

    /// Starts the upstream for `id`. `session` is exported as `MCP_GATEWAY_SESSION`.
    fn spawn(&mut self, id: UpstreamId, session: Option<&str>) -> Result<(), String>;

    /// Queues a line (ending in `\n`) for the upstream. A child that does not read its
    /// input fast enough to keep the queue under the limit is reported stuck (the caller
    /// treats it as exited). `authorization` goes with the line to an HTTP upstream (see
    /// [`Outbound`]); a stdio child has nowhere to put it (`--mcp-forward-authorization` is
    /// refused with `--upstream-cmd`, so the core gives it none).
    fn send(
        &mut self,
        id: UpstreamId,
        line: Vec<u8>,
        authorization: Option<Credential>,
    ) -> Result<(), String>;

    /// The `Authorization` an HTTP upstream's requests carry from now on
    /// ([`HttpUpstream::set_authorization`]); nothing for a stdio child.
    fn set_authorization(&mut self, id: UpstreamId, authorization: Option<Credential>);

    /// Closes the child's stdin now; SIGTERM after the grace period and SIGKILL after another
    /// one if it is still running (`poll` sends them).
    fn kill(&mut self, id: UpstreamId, now: Instant);

    /// Next reader event, if any (non-blocking).
    fn try_recv(&self) -> Option<UpstreamEvent>;

    /// Reaps exited children and SIGKILLs those past their grace. Returns how they ended.
    fn poll(&mut self, now: Instant) -> Vec<(UpstreamId, String)>;

    /// Shutdown: close every stdin, wait up to the grace period, SIGTERM the rest, wait up to
    /// another grace period, then SIGKILL what is left.
    fn stop_all(&mut self);
}

/// All upstream children of one reactor core.
pub struct UpstreamSet {
    cmd: String,
    limits: UpstreamLimits,
    tx: Sender<UpstreamEvent>,
    rx: Receiver<UpstreamEvent>,
    wake: Arc<dyn Fn() + Send + Sync>,
    procs: HashMap<UpstreamId, Proc>,
    /// `--upstream-url`: HTTP clients instead of children, all of them built from this endpoint
    /// (and counted in its connection counters).
    target: Option<Arc<HttpEndpoint>>,
    http: HashMap<UpstreamId, (HttpUpstream, Option<Instant>)>,
}

impl std::fmt::Debug for UpstreamSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamSet")
            .field("cmd", &self.cmd)
            .field("children", &self.procs.len())
            .field("http", &self.http.len())
            .finish()
    }
}

/// `sh -c cmd` with piped stdio, `MCP_GATEWAY_SESSION` when there is a session, and without the
/// service manager's variables (its sockets are the gateway's, not its children's).
fn child_command(cmd: &str, session: Option<&str>) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(cmd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID");
    if let Some(s) = session {
        c.env("MCP_GATEWAY_SESSION", s);
    }
    c
}

impl UpstreamSet {
    /// `wake` is called from reader threads after each event (the core's eventfd).
    pub fn new(
        cmd: String,
        limits: UpstreamLimits,
        wake: Arc<dyn Fn() + Send + Sync>,
    ) -> UpstreamSet {
        let (tx, rx) = channel::bounded(limits.queue_lines_max.max(1));
        UpstreamSet {
            cmd,
            limits,
            tx,
            rx,
            wake,
            procs: HashMap::new(),
            target: None,
            http: HashMap::new(),
        }
    }

    /// A set of HTTP clients towards `target` (`--upstream-url`).
    pub fn new_http(
        target: Arc<HttpEndpoint>,
        limits: UpstreamLimits,
        wake: Arc<dyn Fn() + Send + Sync>,
    ) -> UpstreamSet {
        let mut s = UpstreamSet::new(String::new(), limits, wake);
        s.target = Some(target);
        s
    }
}

impl Upstreams for UpstreamSet {
    fn children(&self) -> usize {
        self.procs.len() + self.http.len()
    }

    fn http_stats(&self) -> Option<PoolStats> {
        self.target.as_ref().map(|t| t.stats())
    }

    fn spawn(&mut self, id: UpstreamId, session: Option<&str>) -> Result<(), String> {
        if let Some(t) = &self.target {
            let h = HttpUpstream::start(
                id,
                t.clone(),
                self.limits.line_bytes_max,
                self.limits.queue_lines_max,
                self.tx.clone(),
                self.wake.clone(),
            )?;
            self.http.insert(id, (h, None));
            return Ok(());
        }
        let mut child = child_command(&self.cmd, session)
            .spawn()
            .map_err(|e| format!("cannot start upstream `{}`: {e}", self.cmd))?;
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let stdin = child.stdin.take().expect("piped");
        let (in_tx, in_rx) = channel::bounded::<Vec<u8>>(self.limits.queue_lines_max.max(1));
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name).spawn(f).map(|_| ())
        };
        let (tx, wake, max) = (
            self.tx.clone(),
            self.wake.clone(),
            self.limits.line_bytes_max,
        );
        let started = spawn(
            format!("mcp-up{}-out", id.0),
            Box::new(move || read_lines(id, stdout, max, &tx, &*wake)),
        )
        .and_then(|()| {
            spawn(
                format!("mcp-up{}-err", id.0),
                Box::new(move || log_stderr(id, stderr)),
            )
        })
        .and_then(|()| {
            spawn(
                format!("mcp-up{}-in", id.0),
                Box::new(move || write_lines(&in_rx, stdin)),
            )
        });
        if let Err(e) = started {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("cannot start upstream threads: {e}"));
        }
        self.procs.insert(
            id,
            Proc {
                child,
                stdin: Some(in_tx),
                term_at: None,
                term_sent: None,
                kill_at: None,
            },
        );
        Ok(())
    }

    fn send(
        &mut self,
        id: UpstreamId,
        line: Vec<u8>,
        authorization: Option<Credential>,
    ) -> Result<(), String> {
        if let Some((h, _)) = self.http.get(&id) {
            let Some(tx) = h.lines() else {
                return Err("upstream is being stopped".into());
            };
            return match tx.try_send(Outbound {
                line,
                authorization,
            }) {
                Ok(()) => Ok(()),
                Err(TrySendError::Full(_)) => Err(format!(
                    "upstream backlog over {} messages (--mcp-upstream-queue-lines-max)",
                    self.limits.queue_lines_max
                )),
                Err(TrySendError::Disconnected(_)) => Err("upstream client stopped".into()),
            };
        }
        let Some(p) = self.procs.get_mut(&id) else {
            return Err("upstream is gone".into());
        };
        let Some(tx) = &p.stdin else {
            return Err("upstream is being stopped".into());
        };
        match tx.try_send(line) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(format!(
                "upstream stdin backlog over {} lines (--mcp-upstream-queue-lines-max)",
                self.limits.queue_lines_max
            )),
            Err(TrySendError::Disconnected(_)) => Err("upstream stdin closed".into()),
        }
    }

    fn set_authorization(&mut self, id: UpstreamId, authorization: Option<Credential>) {
        if let Some((h, _)) = self.http.get(&id) {
            h.set_authorization(authorization);
        }
    }

    fn kill(&mut self, id: UpstreamId, now: Instant) {
        if let Some((h, at)) = self.http.get_mut(&id) {
            h.stop();
            at.get_or_insert(now + Duration::from_millis(self.limits.kill_grace_ms));
        }
        if let Some(p) = self.procs.get_mut(&id) {
            p.stdin = None;
            if p.kill_at.is_none() {
                let grace = Duration::from_millis(self.limits.kill_grace_ms);
                p.term_at = Some(now + grace);
                p.kill_at = Some(now + 2 * grace);
            }
        }
    }

    fn try_recv(&self) -> Option<UpstreamEvent> {
        self.rx.try_recv().ok()
    }

    fn poll(&mut self, now: Instant) -> Vec<(UpstreamId, String)> {
        let mut ended = Vec::new();
        for (id, p) in &mut self.procs {
            if term_pending(p) {
                continue;
            }
            match p.child.try_wait() {
                Ok(Some(status)) => ended.push((*id, status.to_string())),
                Ok(None) => {
                    if p.term_at.is_some_and(|t| t <= now) {
                        p.term_sent = Some(sigterm(&p.child));
                        p.term_at = None;
                        continue; // SIGKILL, if due, on a later poll (after the helper)
                    }
                    if p.kill_at.is_some_and(|t| t <= now) {
                        let _ = p.child.kill();
                        p.kill_at = None;
                    }
                }
                Err(e) => ended.push((*id, format!("wait failed: {e}"))),
            }
        }
        for (id, _) in &ended {
            self.procs.remove(id);
        }
        let mut finished = Vec::new();
        for (id, (h, at)) in &mut self.http {
            if h.finished() {
                finished.push(*id);
            } else if at.is_some_and(|t| t <= now) {
                h.force();
                *at = None;
            }
        }
        for id in finished {
            self.http.remove(&id);
            ended.push((id, "HTTP upstream client stopped".into()));
        }
        ended
    }

    fn stop_all(&mut self) {
        for p in self.procs.values_mut() {
            p.stdin = None;
        }
        for (h, _) in self.http.values_mut() {
            h.stop();
        }
        let grace = Duration::from_millis(self.limits.kill_grace_ms);
        for step in 0..2 {
            let deadline = Instant::now() + grace;
            while !(self.procs.is_empty() && self.http.is_empty()) && Instant::now() < deadline {
                self.procs.retain(|_, p| {
                    term_pending(p) || !matches!(p.child.try_wait(), Ok(Some(_)) | Err(_))
                });
                self.http.retain(|_, (h, _)| !h.finished());
                std::thread::sleep(Duration::from_millis(5));
            }
            if step == 0 {
                for p in self.procs.values_mut() {
                    p.term_sent = Some(sigterm(&p.child));
                }
            }
        }
        for (h, _) in self.http.values() {
            h.force();
        }
        self.http.clear();
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.procs.values().any(term_pending) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        for p in self.procs.values_mut() {
            let _ = p.child.kill();
            if !term_pending(p) {
                let _ = p.child.wait(); // else left unreaped rather than risk a reused pid
            }
        }
        self.procs.clear();
    }
}

/// Reads `\n`-terminated lines of at most `max` bytes; longer lines are skipped whole.
fn read_lines(
    id: UpstreamId,
    out: impl Read,
    max: usize,
    tx: &Sender<UpstreamEvent>,
    wake: &(dyn Fn() + Send + Sync),
) {
    let mut r = BufReader::with_capacity(64 * 1024, out);
    let mut line = Vec::new();
    let mut skipping = 0usize;
    loop {
        let buf = match r.fill_buf() {
            Ok([]) | Err(_) => break,
            Ok(b) => b,
        };
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if skipping > 0 || line.len() + chunk.len() > max {
            skipping += line.len() + chunk.len();
            line.clear();
        } else {
            line.extend_from_slice(chunk);
        }
        let used = done.unwrap_or(buf.len());
        r.consume(used);
        if done.is_some() {
            let ev = if skipping > 0 {
                let n = std::mem::take(&mut skipping);
                UpstreamEvent::LineTooLong(id, n)
            } else {
                UpstreamEvent::Line(id, std::mem::take(&mut line))
            };
            if tx.send(ev).is_err() {
                return;
            }
            wake();
        }
    }
    let _ = tx.send(UpstreamEvent::Closed(id));
    wake();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn set(cmd: &str, line_max: usize) -> (UpstreamSet, Arc<AtomicUsize>) {
        let wakes = Arc::new(AtomicUsize::new(0));
        let w = wakes.clone();
        let limits = UpstreamLimits {
            line_bytes_max: line_max,
            queue_lines_max: 64,
            kill_grace_ms: 2_000,
        };
        (
            UpstreamSet::new(
                cmd.into(),
                limits,
                Arc::new(move || {
                    w.fetch_add(1, Ordering::Relaxed);
                }),
            ),
            wakes,
        )
    }

    fn next(s: &UpstreamSet) -> UpstreamEvent {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(e) = s.try_recv() {
                return e;
            }
            assert!(Instant::now() < deadline, "no upstream event within 10 s");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A child echoing its stdin: lines go both ways in order; closing stdin ends it.
    #[test]
    fn lines_round_trip_and_kill_closes_stdin() {
        let (mut s, wakes) = set("cat", 1 << 20);
        let id = UpstreamId(7);
        s.spawn(id, Some("sess")).unwrap();
        for i in 0..20 {
            s.send(id, format!("{{\"n\":{i}}}\n").into_bytes(), None)
                .unwrap();
        }
        for i in 0..20 {
            match next(&s) {
                UpstreamEvent::Line(got, l) => {
                    assert_eq!(got, id);
                    assert_eq!(l, format!("{{\"n\":{i}}}").into_bytes());
                }
                e => panic!("unexpected {e:?}"),
            }
        }
        s.kill(id, Instant::now());
        assert!(matches!(next(&s), UpstreamEvent::Closed(x) if x == id));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut ended = Vec::new();
        while ended.is_empty() && Instant::now() < deadline {
            ended = s.poll(Instant::now());
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(ended.len(), 1, "cat exits on stdin EOF");
        assert!(wakes.load(Ordering::Relaxed) >= 21);
        assert!(s.send(id, b"x\n".to_vec(), None).is_err());
    }

    /// Over-long lines are skipped whole and reported; the next line is intact.
    #[test]
    fn long_lines_are_skipped() {
        let (mut s, _) = set("printf 'aaaaaaaaaaaaaaaaaaaa\\nok\\n'", 8);
        let id = UpstreamId(1);
        s.spawn(id, None).unwrap();
        assert!(matches!(next(&s), UpstreamEvent::LineTooLong(_, 20)));
        assert!(matches!(next(&s), UpstreamEvent::Line(_, l) if l == b"ok"));
        assert!(matches!(next(&s), UpstreamEvent::Closed(_)));
    }

    /// Polls with a clock `ahead` of real time until the child ends (bounded).
    fn ended_within(s: &mut UpstreamSet, ahead: Duration) -> Vec<(UpstreamId, String)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut ended = Vec::new();
        while ended.is_empty() && Instant::now() < deadline {
            ended = s.poll(Instant::now() + ahead);
            std::thread::sleep(Duration::from_millis(5));
        }
        ended
    }

    /// A child that ignores stdin EOF but not SIGTERM ends by SIGTERM after one grace period.
    #[test]
    fn child_ignoring_eof_gets_sigterm_after_grace() {
        let (mut s, _) = set("exec sleep 30", 1024);
        let id = UpstreamId(4);
        s.spawn(id, None).unwrap();
        let t0 = Instant::now();
        s.kill(id, t0);
        assert!(
            s.poll(t0).is_empty(),
            "nothing is signalled before the grace"
        );
        // 1.5 grace periods ahead: SIGTERM is due, SIGKILL is not.
        let ended = ended_within(&mut s, Duration::from_millis(3_000));
        assert_eq!(ended.len(), 1);
        assert!(ended[0].1.contains("SIGTERM"), "{}", ended[0].1);
    }

    /// A child that ignores stdin EOF and SIGTERM is SIGKILLed after the second grace period.
    #[test]
    fn stubborn_child_is_killed_after_grace() {
        // The child says when its SIGTERM trap is in place: a SIGTERM that arrived before
        // `trap` ran would end it by SIGTERM and make the test race the shell.
        let (mut s, _) = set("trap '' TERM; echo ready; exec sleep 30", 1024);
        let id = UpstreamId(2);
        s.spawn(id, None).unwrap();
        assert!(matches!(next(&s), UpstreamEvent::Line(_, l) if l == b"ready"));
        let t0 = Instant::now();
        s.kill(id, t0);
        assert!(s.poll(t0).is_empty());
        let ended = ended_within(&mut s, Duration::from_millis(4_500));
        assert_eq!(ended.len(), 1);
        assert!(ended[0].1.contains("SIGKILL"), "{}", ended[0].1);
    }

    #[test]
    fn spawn_failure_is_reported_by_exit() {
        let (mut s, _) = set("exit 3", 1024);
        s.spawn(UpstreamId(3), None).unwrap();
        assert!(matches!(next(&s), UpstreamEvent::Closed(_)));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut ended = Vec::new();
        while ended.is_empty() && Instant::now() < deadline {
            ended = s.poll(Instant::now());
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(ended[0].1.contains('3'), "{}", ended[0].1);
    }
}
