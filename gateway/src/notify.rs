//! systemd's service notifications (`sd_notify(3)`), without libsystemd: datagrams to
//! `$NOTIFY_SOCKET` saying `READY=1` once every core listens, `RELOADING=1` / `READY=1` around a
//! SIGHUP reload, `STOPPING=1` at shutdown, and `WATCHDOG=1` every half `$WATCHDOG_USEC` while
//! every reactor still turns (a stuck reactor stops the pings, and systemd restarts the
//! service). Without `$NOTIFY_SOCKET` every call does nothing.
#![forbid(unsafe_code)]

use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::core::Shared;

/// The service manager's socket, when there is one.
#[derive(Debug)]
pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// From `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket).
    pub fn from_env() -> Option<Notifier> {
        let path = std::env::var_os("NOTIFY_SOCKET")?;
        let path = path.to_str()?;
        let addr = match path.strip_prefix('@') {
            Some(name) => SocketAddr::from_abstract_name(name.as_bytes()).ok()?,
            None => SocketAddr::from_pathname(path).ok()?,
        };
        let sock = UnixDatagram::unbound().ok()?;
        Some(Notifier { sock, addr })
    }

    /// Sends one notification (newline-separated `KEY=value` lines). Failures are logged, never
    /// fatal: the service runs the same without a manager listening.
    pub fn send(&self, msg: &str) {
        if let Err(e) = self.sock.send_to_addr(msg.as_bytes(), &self.addr) {
            crate::warn_limited!("sd_notify: {e}");
        }
    }
}

/// Sends `msg` if a service manager listens.
pub fn notify(n: Option<&Notifier>, msg: &str) {
    if let Some(n) = n {
        n.send(msg);
    }
}

/// `RELOADING=1` with the `MONOTONIC_USEC` that `Type=notify-reload` asks for.
pub fn reloading_message() -> String {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let usec = now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000;
    format!("RELOADING=1\nMONOTONIC_USEC={usec}")
}

/// The watchdog period from `$WATCHDOG_USEC` (ignored when `$WATCHDOG_PID` names another
/// process).
pub fn watchdog_period() -> Option<Duration> {
    if let Some(pid) = std::env::var_os("WATCHDOG_PID")
        && pid.to_str() != Some(&std::process::id().to_string())
    {
        return None;
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Pings `WATCHDOG=1` every half period while every core's tick counter moved since the
/// previous ping.
pub fn spawn_watchdog(
    n: Arc<Notifier>,
    period: Duration,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    let every = period / 2;
    std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            let ticks = || -> Vec<u64> {
                shared
                    .metrics
                    .iter()
                    .map(|m| m.ticks.load(Relaxed))
                    .collect()
            };
            let mut last = ticks();
            loop {
                std::thread::sleep(every);
                let now = ticks();
                let stuck: Vec<usize> = (0..now.len()).filter(|&c| now[c] == last[c]).collect();
                if stuck.is_empty() {
                    n.send("WATCHDOG=1");
                } else {
                    tracing::error!(
                        ?stuck,
                        "reactor(s) did not tick for {every:?}: no watchdog ping"
                    );
                }
                last = now;
            }
        })
        .map(|_| ())
}
