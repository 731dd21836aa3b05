//! Logs: `tracing` events written to stderr as text or one JSON object per line
//! (`--log-format`), filtered by `--log-level` refined by `RUST_LOG`-style directives in
//! `GATEWAY_LOG`. The `log` records of rustls and the `tracing` events of async-nats go through
//! the same filter and writer. [`Gate`] rate-limits a call site whose input an attacker controls,
//! so a flood cannot fill the disk with logs.
//!
//! Invariant: no token, `Authorization` or `Cookie` value, MCP session ID or MCP stream name is
//! ever a field or part of a message (MCP stream names are logged through
//! `mcp::redacted`, which drops the session ID).
#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tracing_subscriber::EnvFilter;

/// Logging flags (`--log-*`, `--access-log*`; the command line is `config.rs`).
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Least severe level written (to stderr). `GATEWAY_LOG` adds `RUST_LOG`-style directives
    /// that refine it per target, e.g. `GATEWAY_LOG=async_nats=debug`.
    #[arg(long, value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,

    /// `text` (one human-readable line per event) or `json` (one object per line with
    /// `timestamp`, `level`, `target`, `message` and the event's fields).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// One line per request (target `access`, message `request`; a subscription's when it
    /// ends), in `--log-format`, written by a thread of its own: request ID, method, route
    /// class, status, bytes in and out, duration, resume class, peer, subject fingerprint.
    /// Independent of `--log-level`.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub access_log: Switch,

    /// Access-log lines queued for the writer thread; beyond it lines are dropped (counted in
    /// `gateway_access_log_dropped_total`), never waited for.
    #[arg(long, default_value_t = 65_536)]
    pub access_log_queue_lines_max: usize,
}

/// `--access-log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    On,
    Off,
}

/// The environment variable with `RUST_LOG`-style directives (`gateway::core=debug,async_nats=warn`)
/// that refine `--log-level`.
pub const DIRECTIVES_ENV: &str = "GATEWAY_LOG";

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `2026-12-04T20:00:00.000000Z  INFO gateway: message key=value`.
    Text,
    /// One object per line: `timestamp`, `level`, `target`, `message` and the event's fields.
    Json,
}

/// `--log-level`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    fn directive(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// The filter: `level` for every target, then the directives of `GATEWAY_LOG` (`env`), which
/// win where they are more specific. A directive that does not parse is an error naming it.
pub fn filter(level: LogLevel, env: Option<&str>) -> Result<EnvFilter, String> {
    let mut spec = level.directive().to_string();
    // async-nats logs each connection event at info itself; the cluster client logs them
    // once, in the gateway's words.
    if level > LogLevel::Warn {
        spec.push_str(",async_nats=warn");
    }
    if let Some(extra) = env.map(str::trim).filter(|e| !e.is_empty()) {
        spec = format!("{spec},{extra}");
    }
    EnvFilter::builder()
        .parse(&spec)
        .map_err(|e| format!("{DIRECTIVES_ENV}={:?}: {e}", env.unwrap_or_default()))
}

/// Installs the process's subscriber (once; later calls are ignored, as in tests that start
/// several gateways in one process). Also routes `log` records (rustls) into it.
pub fn init(log: &LogArgs) -> Result<(), String> {
    let (level, format) = (log.log_level, log.log_format);
    let env = std::env::var(DIRECTIVES_ENV).ok();
    let filter = filter(level, env.as_deref())?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let done = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
    // Err: a subscriber is already installed (a second gateway in one test process).
    drop(done);
    Ok(())
}

/// Time since the first call, the clock of every [`Gate`].
fn uptime() -> Duration {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// One call site's rate limit: at most one line per [`Gate::PERIOD`]; the lines held back in
/// between are counted and reported as `suppressed` on the next line that passes.
#[derive(Debug)]
pub struct Gate {
    /// Milliseconds of [`uptime`] before which the next line is held back (0: none passed yet).
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl Gate {
    pub const PERIOD: Duration = Duration::from_secs(60);

    #[allow(clippy::new_without_default)] // used in statics
    pub const fn new() -> Gate {
        Gate {
            next_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines held back since the last one)` when a line may be written now.
    pub fn pass(&self) -> Option<u64> {
        self.pass_at(uptime().as_millis() as u64)
    }

    fn pass_at(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Relaxed);
        let open = next == 0 || now_ms >= next;
        let until = now_ms.max(1) + Self::PERIOD.as_millis() as u64;
        if open
            && self
                .next_ms
                .compare_exchange(next, until, Relaxed, Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Relaxed));
        }
        self.suppressed.fetch_add(1, Relaxed);
        None
    }
}

/// `tracing::warn!` at most once a minute from this call site, with the count of the lines
/// held back since the last one in the field `suppressed`. For call sites a client can trigger
/// at will (bad handshakes, refused connections).
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => {{
        static GATE: $crate::logging::Gate = $crate::logging::Gate::new();
        if let Some(suppressed) = GATE.pass() {
            ::tracing::warn!(suppressed, $($arg)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_passes_one_line_a_period_and_counts_the_rest() {
        let g = Gate::new();
        assert_eq!(g.pass_at(0), Some(0));
        assert_eq!(g.pass_at(10), None);
        assert_eq!(g.pass_at(59_999), None);
        assert_eq!(g.pass_at(60_001), Some(2));
        assert_eq!(g.pass_at(60_002), None);
        assert_eq!(g.pass_at(200_000), Some(1));
    }

    #[test]
    fn directives_refine_the_level_and_bad_ones_name_the_flag() {
        let f = filter(LogLevel::Warn, Some("gateway::core=debug")).unwrap();
        let s = f.to_string();
        assert!(
            s.contains("gateway::core=debug") && s.contains("warn"),
            "{s}"
        );
        let e = filter(LogLevel::Info, Some("gateway=loud")).unwrap_err();
        assert!(e.contains("GATEWAY_LOG"), "{e}");
        assert!(filter(LogLevel::Info, Some("  ")).is_ok());
    }
}
