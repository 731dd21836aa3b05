//! The stream catalog's rules, decided in one place: which streams are the MCP front's and
//! which the API's ([`StreamKind`]), and the `--streams-max` quota that API streams count
//! against ([`StreamQuota`]; MCP streams are bounded by `--mcp-sessions-max` instead). Every
//! path that creates or removes a stream — an API publish (a subscribe creates nothing),
//! `DELETE`, idle expiry, a stream born from the cluster's replicated log, the count at start
//! — asks here (API creations through `subjects::reserve`, with the per-subject quota).
//!
//! It knows nothing of connections or answers: a refusal is a [`StreamsExhausted`] the caller
//! turns into its 507.
#![forbid(unsafe_code)]

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use log_store::Log;

/// Every MCP stream's name starts with this (`mcp/<session>/<n>`); one shard holds them all
/// (the shard of this very string).
pub const MCP_STREAM_PREFIX: &str = "mcp/";

/// Whose a stream is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// Published and subscribed through `/v1/streams`; counts against `--streams-max`.
    Api,
    /// An MCP session's stream: named with session IDs (never listed in `/metrics`), not idle
    /// expired (the MCP front owns its life), not counted against `--streams-max`.
    Mcp,
    /// The gateway's own (`gw/…`, e.g. cluster mode's quarantine record of skipped messages):
    /// unreachable from the API and the MCP front, not counted, listed or expired.
    Internal,
}

/// Every internal stream's name starts with this.
pub const INTERNAL_STREAM_PREFIX: &str = "gw/";

impl StreamKind {
    pub fn of(name: &str) -> StreamKind {
        if name.starts_with(MCP_STREAM_PREFIX) {
            StreamKind::Mcp
        } else if name.starts_with(INTERNAL_STREAM_PREFIX) {
            StreamKind::Internal
        } else {
            StreamKind::Api
        }
    }
}

/// A new API stream refused: the gateway holds `--streams-max` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamsExhausted {
    pub max: u64,
}

impl StreamsExhausted {
    /// The answer's status and error code.
    pub const STATUS: u16 = 507;
    pub const CODE: &'static str = "streams_exhausted";
}

impl fmt::Display for StreamsExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the gateway holds --streams-max {} streams; no new stream",
            self.max
        )
    }
}

/// `--streams-max`: live API streams across all cores and shards.
#[derive(Debug)]
pub struct StreamQuota {
    live: AtomicU64,
    max: u64,
}

impl StreamQuota {
    /// The quota with the API streams `logs` already hold (at start, after recovery).
    pub fn new<'a>(max: u64, logs: impl IntoIterator<Item = &'a Log>) -> StreamQuota {
        let live = logs.into_iter().map(api_stream_count).sum();
        StreamQuota {
            live: AtomicU64::new(live),
            max,
        }
    }

    /// Takes a place for a new stream named `name` before it is created (an MCP stream takes
    /// none). Give it back with [`StreamQuota::release`] if the creation fails.
    pub fn reserve(&self, name: &str) -> Result<(), StreamsExhausted> {
        if StreamKind::of(name) != StreamKind::Api {
            return Ok(());
        }
        if self.live.fetch_add(1, Relaxed) >= self.max {
            self.live.fetch_sub(1, Relaxed);
            return Err(StreamsExhausted { max: self.max });
        }
        Ok(())
    }

    /// Whether a new stream named `name` would be refused now, without taking a place (a
    /// cluster publish is checked before it goes out; the stream is born when it comes back).
    pub fn check(&self, name: &str) -> Result<(), StreamsExhausted> {
        match StreamKind::of(name) {
            StreamKind::Api if self.live.load(Relaxed) >= self.max => {
                Err(StreamsExhausted { max: self.max })
            }
            _ => Ok(()),
        }
    }

    /// Counts a stream that was created whatever the quota says: one born from the cluster's
    /// replicated log, which every node must apply alike.
    pub fn count_created(&self, name: &str) {
        if StreamKind::of(name) == StreamKind::Api {
            self.live.fetch_add(1, Relaxed);
        }
    }

    /// Gives back the place of a removed stream (or of a failed creation).
    pub fn release(&self, name: &str) {
        if StreamKind::of(name) == StreamKind::Api {
            let before = self.live.fetch_sub(1, Relaxed);
            assert!(before > 0, "a stream released that was never counted");
        }
    }

    /// Live API streams.
    pub fn live(&self) -> u64 {
        self.live.load(Relaxed)
    }
}

/// Live API streams in `log`.
pub fn api_stream_count(log: &Log) -> u64 {
    let others = log
        .streams()
        .filter(|(_, name, _)| StreamKind::of(name) != StreamKind::Api)
        .count();
    (log.live_stream_count() - others) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_name() {
        assert_eq!(StreamKind::of("mcp/abc/1"), StreamKind::Mcp);
        assert_eq!(StreamKind::of("orders"), StreamKind::Api);
        assert_eq!(StreamKind::of("mcp"), StreamKind::Api);
        assert_eq!(StreamKind::of("gw/quarantined"), StreamKind::Internal);
    }

    #[test]
    fn the_quota_counts_api_streams_only_and_refuses_past_its_max() {
        let q = StreamQuota::new(2, []);
        assert_eq!(q.reserve("a"), Ok(()));
        assert_eq!(q.reserve("mcp/s/1"), Ok(()), "MCP streams take no place");
        assert_eq!(q.reserve("gw/x"), Ok(()), "internal streams take no place");
        assert_eq!(q.check("b"), Ok(()));
        assert_eq!(q.reserve("b"), Ok(()));
        assert_eq!(q.live(), 2);
        assert_eq!(q.reserve("c"), Err(StreamsExhausted { max: 2 }));
        assert_eq!(q.check("c"), Err(StreamsExhausted { max: 2 }));
        assert_eq!(q.check("mcp/s/2"), Ok(()));
        assert_eq!(q.live(), 2, "a refusal takes nothing");
        q.release("mcp/s/1");
        assert_eq!(q.live(), 2);
        q.release("a");
        assert_eq!(q.reserve("c"), Ok(()));
        q.count_created("d");
        assert_eq!(q.live(), 3, "a replicated creation is counted past the max");
    }

    #[test]
    fn refusals_say_which_flag() {
        let e = StreamsExhausted { max: 7 };
        assert_eq!(
            e.to_string(),
            "the gateway holds --streams-max 7 streams; no new stream"
        );
    }
}
