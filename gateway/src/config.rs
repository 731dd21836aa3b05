//! Command-line configuration of the gateway (clap derive): every limit is a flag with its unit
//! in the name and a default that works on a laptop. Validation of flag combinations lives in
//! [`Config::validate`]. This module does not open sockets or files.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

/// io_uring thread-per-core SSE publish/subscribe gateway with gap-free resumption.
#[derive(Debug, Clone, Parser)]
#[command(name = "gateway", version, about)]
pub struct Config {
    /// Address to listen on (each core binds its own SO_REUSEPORT listener). Port 0 picks an
    /// ephemeral port; the chosen address is printed as "listening on <addr>".
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Directory holding the shard map and one log per shard.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,

    /// Reactor threads, one per core, pinned. 0 = all online cores.
    #[arg(long, default_value_t = 0)]
    pub cores: usize,

    /// Shard count used only when the data directory is created; afterwards the persisted count
    /// (data-dir/shards.json) wins so a restart with another --cores routes streams identically.
    /// 0 = 8.
    #[arg(long, default_value_t = 0)]
    pub shards_on_create: u32,

    /// Bytes per log segment file. Each shard's active segment is mapped and pre-touched, so
    /// resident memory starts near shards x this (16 MiB x 8 shards = 128 MiB by default).
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    pub segment_bytes: u64,

    /// Bytes of segments kept per shard before the oldest sealed segment is deleted. 0 = unbounded.
    #[arg(long, default_value_t = 0)]
    pub retain_bytes: u64,

    /// Seconds a sealed segment is kept after its newest record. 0 = unbounded.
    #[arg(long, default_value_t = 0)]
    pub retain_secs: u64,

    /// Durability before a publish is acknowledged and before subscribers see the event:
    /// "group" (a group commit starts as soon as records are unsynced and none is in flight;
    /// what arrives meanwhile waits for the next), "interval:<ms>" (at most one per interval),
    /// "always" (as group) or "never" (visible at once; survives a process crash, not a power
    /// loss). log-store/DESIGN.md, "Durability and visibility".
    #[arg(long, default_value = "group")]
    pub fsync: String,

    /// TCP_NOTSENT_LOWAT on subscriber sockets: unsent bytes the kernel may hold per subscriber;
    /// the rest of a slow subscriber's backlog stays in the log.
    #[arg(long, default_value_t = 64 * 1024)]
    pub notsent_lowat_bytes: u32,

    /// Open client connections across all cores; above it new connections get 503 and are closed.
    #[arg(long, default_value_t = 10_000)]
    pub connections_max: usize,

    /// Bytes of a request's line + headers; above it: 431.
    #[arg(long, default_value_t = 8 * 1024)]
    pub header_bytes_max: usize,

    /// Header fields per request; above it: 431.
    #[arg(long, default_value_t = 64)]
    pub header_count_max: usize,

    /// Bytes of one event's data (the body of a single publish); above it: 413.
    #[arg(long, default_value_t = 64 * 1024)]
    pub event_bytes_max: usize,

    /// Bytes of a batch publish body; above it: 413.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub batch_bytes_max: usize,

    /// Seconds a keep-alive connection may sit idle between requests before it is closed.
    #[arg(long, default_value_t = 60)]
    pub idle_timeout_secs: u64,

    /// Seconds a client has to send a complete request head once it started one (slow-loris).
    #[arg(long, default_value_t = 10)]
    pub header_timeout_secs: u64,

    /// Seconds a disconnected subscriber's unconfirmed send window is kept for an aligned resume.
    #[arg(long, default_value_t = 30)]
    pub resume_grace_secs: u64,

    /// Disconnected subscribers' windows kept per stream for aligned resumes (oldest dropped
    /// first). 0 = never park.
    #[arg(long, default_value_t = 64)]
    pub parked_windows_per_stream_max: usize,

    /// Events a subscriber may fall behind the stream's tail before it gets `event: truncated`
    /// and is closed.
    #[arg(long, default_value_t = 1_000_000)]
    pub lag_events_max: u64,

    /// Seconds between `:` keep-alive comments on an idle subscription.
    #[arg(long, default_value_t = 15)]
    pub keepalive_secs: u64,

    /// Milliseconds sent in the SSE `retry:` line of every subscription.
    #[arg(long, default_value_t = 1000)]
    pub retry_ms: u64,

    /// MCP front flags (`--upstream-cmd` turns it on).
    #[command(flatten)]
    pub mcp: crate::mcp::config::McpArgs,

    /// Bytes of answers a keep-alive connection may have queued (not yet taken by the kernel)
    /// before the gateway stops reading its further pipelined requests; reading resumes as the
    /// client drains them. Bounds what a client that pipelines without reading can make the
    /// gateway hold.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub pipeline_answer_bytes_max: usize,

    /// Also export one floor / tail / visible-tail series per stream in `/metrics` (off: only
    /// aggregates, so stream names — which may be private — are not exported). MCP streams are
    /// never listed: their names carry session IDs.
    #[arg(long)]
    pub metrics_per_stream: bool,

    /// With --metrics-per-stream: at most this many streams' series per core.
    #[arg(long, default_value_t = 1000)]
    pub metrics_per_stream_max: usize,

    /// Bytes handed to the kernel in one sendmsg to a subscriber (at most 1024 iovecs).
    #[arg(long, default_value_t = 256 * 1024)]
    pub send_bytes_max: usize,

    /// Testing aid: only the first N cores open a listener (0 = all), so connections that land
    /// there for streams owned elsewhere exercise the cross-core handoff.
    #[arg(long, default_value_t = 0, hide = true)]
    pub listen_cores_max: usize,

    /// Disable SO_TIMESTAMPING TX_ACK confirmation and use SIOCOUTQ accounting only.
    #[arg(long, default_value_t = false)]
    pub no_tx_timestamps: bool,

    /// Milliseconds between TX ACK timestamp requests on one subscriber: a send asks the kernel
    /// for an ACK timestamp only when the previous one was answered and this long has passed
    /// (one ACK confirms every byte before it). 0 = on every send once the previous request
    /// was answered. Bytes sent in between are
    /// confirmed by the next answered request, by SIOCOUTQ at the 100 ms tick, or at
    /// disconnect; a longer interval trades a little send-window memory for fewer wake-ups.
    #[arg(long, default_value_t = 20)]
    pub tx_ack_interval_ms: u64,
}

/// A flag combination that cannot work, named exactly.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// `--fsync` is not one of the accepted forms.
    BadFsync(String),
    /// A limit that must be positive is zero.
    Zero(&'static str),
    /// `--send-bytes-max` below the largest single event would stall a subscriber.
    SendBytesBelowEvent,
    /// A limit above what the gateway can represent (flag, largest accepted value).
    TooLarge(&'static str, u64),
    /// An MCP front flag is invalid (the message names it).
    Mcp(String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::BadFsync(s) => {
                write!(
                    f,
                    "--fsync {s:?}: expected never, group, always or interval:<ms>"
                )
            }
            ConfigError::Zero(flag) => write!(f, "{flag} must be greater than 0"),
            ConfigError::SendBytesBelowEvent => {
                write!(f, "--send-bytes-max must be at least --event-bytes-max")
            }
            ConfigError::TooLarge(flag, max) => write!(f, "{flag} must be at most {max}"),
            ConfigError::Mcp(m) => write!(f, "{m}"),
        }
    }
}

impl Config {
    /// Checks flag values that clap's types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        parse_fsync(&self.fsync)?;
        self.mcp.validate().map_err(ConfigError::Mcp)?;
        for (v, name) in [
            (self.connections_max as u64, "--connections-max"),
            (self.header_bytes_max as u64, "--header-bytes-max"),
            (self.header_count_max as u64, "--header-count-max"),
            (self.event_bytes_max as u64, "--event-bytes-max"),
            (self.batch_bytes_max as u64, "--batch-bytes-max"),
            (self.idle_timeout_secs, "--idle-timeout-secs"),
            (self.header_timeout_secs, "--header-timeout-secs"),
            (self.keepalive_secs, "--keepalive-secs"),
            (self.lag_events_max, "--lag-events-max"),
            (self.send_bytes_max as u64, "--send-bytes-max"),
            (
                self.pipeline_answer_bytes_max as u64,
                "--pipeline-answer-bytes-max",
            ),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.send_bytes_max < self.event_bytes_max {
            return Err(ConfigError::SendBytesBelowEvent);
        }
        // One core holds at most this many connections in its slot table (the slot number is
        // 24 bits of every io_uring user_data).
        let slots_max = crate::uring::SLOTS_MAX as u64 - 1;
        if self.connections_max as u64 > slots_max {
            return Err(ConfigError::TooLarge("--connections-max", slots_max));
        }
        Ok(())
    }

    /// The fsync policy as the log store takes it.
    pub fn fsync_policy(&self) -> log_store::FsyncPolicy {
        parse_fsync(&self.fsync).expect("validated at start")
    }
}

fn parse_fsync(s: &str) -> Result<log_store::FsyncPolicy, ConfigError> {
    s.parse::<log_store::FsyncPolicy>()
        .map_err(|_| ConfigError::BadFsync(s.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        let c = Config::parse_from(["gateway"]);
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn rejects_bad_values() {
        let c = Config::parse_from(["gateway", "--fsync", "sometimes"]);
        assert_eq!(c.validate(), Err(ConfigError::BadFsync("sometimes".into())));
        let c = Config::parse_from(["gateway", "--header-bytes-max", "0"]);
        assert_eq!(c.validate(), Err(ConfigError::Zero("--header-bytes-max")));
        let c = Config::parse_from(["gateway", "--connections-max", "16777216"]);
        assert_eq!(
            c.validate(),
            Err(ConfigError::TooLarge("--connections-max", 16_777_215))
        );
        let c = Config::parse_from(["gateway", "--connections-max", "16777215"]);
        assert_eq!(c.validate(), Ok(()));
    }
}
