//! What every upstream driver shares: the events its threads report to the reactor
//! ([`UpstreamEvent`]) and the limits they obey ([`UpstreamLimits`]). Both kinds of upstream —
//! stdio children (`upstream`) and streamable-HTTP clients (`http_upstream`) — import this
//! module, so the dependency between the two drivers goes one way (`upstream` →
//! `http_upstream` → here). Types only: no threads, no I/O.
#![forbid(unsafe_code)]

use crate::core::UpstreamId;

/// What the reader threads report.
#[derive(Debug)]
pub enum UpstreamEvent {
    /// One stdout line without its `\n`.
    Line(UpstreamId, Vec<u8>),
    /// A stdout line longer than the limit was skipped (counted, logged).
    LineTooLong(UpstreamId, usize),
    /// stdout reached EOF (the child exited or closed it): the MCP channel is gone.
    Closed(UpstreamId),
    /// An HTTP upstream is gone, and why (it cannot be connected — refused, a TLS handshake
    /// that failed, a certificate that does not verify —, or it forgot our session). The
    /// reason names no address and no credential: the core quotes it to clients.
    Failed(UpstreamId, String),
}

/// Limits (CLI flags with units).
#[derive(Debug, Clone)]
pub struct UpstreamLimits {
    /// Longest stdout line accepted (`--mcp-upstream-line-bytes-max`).
    pub line_bytes_max: usize,
    /// Lines queued towards a child's stdin before it counts as stuck and is killed
    /// (`--mcp-upstream-queue-lines-max`); also the capacity of the shared stdout channel.
    pub queue_lines_max: usize,
    /// Time between closing stdin and SIGKILL (`--mcp-upstream-kill-grace-ms`).
    pub kill_grace_ms: u64,
}
