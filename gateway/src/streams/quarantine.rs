//! Cluster mode's quarantine: what a node does with a JetStream message of one of its shards,
//! decided by one pure function ([`decide`]) over the message and what the shard's log says
//! about the stream it names. A message that cannot be applied as it is never stops a node:
//! it is applied, stored as an explicit error record in its stream's place, or skipped. Every
//! node (given the same `--record-bytes-max` and shard count) and every restart decides alike,
//! so every node numbers every event alike. No I/O, no clock: the core carries it out.
//!
//! The table, first match wins (each row's reason is a [`Reason`]):
//!
//! | # | the message                                        | verdict                     |
//! |---|----------------------------------------------------|-----------------------------|
//! | 1 | no `Gw-Stream` header                              | skip (`no_stream_header`)   |
//! | 2 | a name neither the API nor the MCP front can have  | skip (`invalid_stream_name`)|
//! | 3 | a name of another shard                            | skip (`wrong_shard`)        |
//! | 4 | `Gw-Seq` not a decimal sequence                    | error record (`bad_seq_header`) |
//! | 5 | an MCP stream's record without `Gw-Seq`            | error record (`mcp_without_seq`) |
//! | 6 | `Gw-Seq` not the stream's next sequence            | error record (`seq_mismatch`) |
//! | 7 | a body that is not UTF-8                           | error record (`data_not_utf8`) |
//! | 8 | an event type with CR/LF or reserved for notices   | error record (`bad_event_type`) |
//! | 9 | a record over the limit at the longest ID          | error record (`oversized`)  |
//! | - | anything else                                      | apply                       |
//!
//! A skipped message names no stream any client can read, so no stream's IDs depend on it;
//! it is still counted as applied by appending a small record to the shard's internal stream
//! [`QUARANTINE_STREAM`] (the node's applied count is the sum of its streams' tails, so a
//! restart resumes JetStream after it). A message naming a stream takes its place there as an
//! error record, so the stream's later events keep the numbers every node gives them.
#![forbid(unsafe_code)]

use super::catalog::{MCP_STREAM_PREFIX, StreamKind};
use super::publish::RecordLimit;
use crate::proto::route::{RESERVED_EVENT_TYPES, is_api_name};

/// The internal stream (in every shard's log) holding one record per skipped message. Its
/// name has a `/` outside the `mcp/` prefix: neither the API nor the MCP front can reach it.
pub const QUARANTINE_STREAM: &str = "gw/quarantined";

/// Why a message was quarantined (the `reason` label of `gateway_cluster_quarantined_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    NoStreamHeader,
    InvalidStreamName,
    WrongShard,
    BadSeqHeader,
    McpWithoutSeq,
    SeqMismatch,
    DataNotUtf8,
    BadEventType,
    Oversized,
}

impl Reason {
    pub const ALL: [Reason; 9] = [
        Reason::NoStreamHeader,
        Reason::InvalidStreamName,
        Reason::WrongShard,
        Reason::BadSeqHeader,
        Reason::McpWithoutSeq,
        Reason::SeqMismatch,
        Reason::DataNotUtf8,
        Reason::BadEventType,
        Reason::Oversized,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::NoStreamHeader => "no_stream_header",
            Reason::InvalidStreamName => "invalid_stream_name",
            Reason::WrongShard => "wrong_shard",
            Reason::BadSeqHeader => "bad_seq_header",
            Reason::McpWithoutSeq => "mcp_without_seq",
            Reason::SeqMismatch => "seq_mismatch",
            Reason::DataNotUtf8 => "data_not_utf8",
            Reason::BadEventType => "bad_event_type",
            Reason::Oversized => "oversized",
        }
    }

    /// Its index in [`Reason::ALL`] (the metric's counter).
    pub fn index(self) -> usize {
        Reason::ALL.iter().position(|r| *r == self).expect("listed")
    }

    /// What is wrong, for the error record (no header value is repeated: a name or a value
    /// may be anything a writer to the subject sent).
    pub fn describe(self) -> &'static str {
        match self {
            Reason::NoStreamHeader => "no Gw-Stream header",
            Reason::InvalidStreamName => "Gw-Stream is not a valid stream name",
            Reason::WrongShard => "Gw-Stream names a stream of another shard",
            Reason::BadSeqHeader => "Gw-Seq is not a decimal sequence number",
            Reason::McpWithoutSeq => "an MCP stream's record without Gw-Seq",
            Reason::SeqMismatch => "Gw-Seq is not the stream's next sequence",
            Reason::DataNotUtf8 => "the data is not UTF-8",
            Reason::BadEventType => "Gw-Event has a line break or is reserved for notices",
            Reason::Oversized => "the record is over --record-bytes-max",
        }
    }
}

/// One JetStream message of shard `shard`, as it arrived.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub shard: u32,
    pub stream: Option<&'a str>,
    pub event: Option<&'a str>,
    /// The raw `Gw-Seq` header.
    pub seq_header: Option<&'a str>,
    pub data: &'a [u8],
}

/// What the node knows that the decision depends on.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    /// The cluster's shard count.
    pub shards: u32,
    pub limit: RecordLimit,
}

/// What to do with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Append it to `stream` as it is.
    Apply { stream: &'a str },
    /// Append an error record to `stream` in its place (`expected`: the seq its publisher
    /// predicted, for [`Reason::SeqMismatch`]).
    Substitute {
        stream: &'a str,
        reason: Reason,
        expected: Option<u64>,
    },
    /// Count it as applied in [`QUARANTINE_STREAM`] only.
    Skip { reason: Reason },
}

/// The decision table (see the module's doc). `next_seq(name)`: the seq the stream's next
/// event gets in this shard's log (1 for a stream not created yet).
pub fn decide<'a>(m: &Message<'a>, cx: &Context, next_seq: impl Fn(&str) -> u64) -> Verdict<'a> {
    let skip = |reason| Verdict::Skip { reason };
    let Some(stream) = m.stream else {
        return skip(Reason::NoStreamHeader);
    };
    let kind = StreamKind::of(stream);
    let valid = match kind {
        StreamKind::Api => is_api_name(stream),
        StreamKind::Mcp => log_store::Log::check_stream_name(stream).is_ok(),
        StreamKind::Internal => false,
    };
    if !valid {
        return skip(Reason::InvalidStreamName);
    }
    if crate::shards::shard_of(stream, cx.shards) != m.shard {
        return skip(Reason::WrongShard);
    }
    let sub = |reason, expected| Verdict::Substitute {
        stream,
        reason,
        expected,
    };
    let expected = match m.seq_header.map(parse_seq) {
        Some(None) => return sub(Reason::BadSeqHeader, None),
        Some(Some(e)) => Some(e),
        None if kind == StreamKind::Mcp => return sub(Reason::McpWithoutSeq, None),
        None => None,
    };
    if let Some(e) = expected
        && e != next_seq(stream)
    {
        return sub(Reason::SeqMismatch, Some(e));
    }
    if std::str::from_utf8(m.data).is_err() {
        return sub(Reason::DataNotUtf8, None);
    }
    if m.event.is_some_and(|t| {
        t.contains(['\r', '\n']) || (kind == StreamKind::Api && RESERVED_EVENT_TYPES.contains(&t))
    }) {
        return sub(Reason::BadEventType, None);
    }
    if cx.limit.overflow_any_id(m.event, m.data).is_some() {
        return sub(Reason::Oversized, None);
    }
    Verdict::Apply { stream }
}

/// A sequence as `Gw-Seq` carries it: canonical decimal, 1 or more.
fn parse_seq(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) || v.starts_with('0') {
        return None;
    }
    v.parse().ok()
}

/// The error record an API stream stores in a quarantined message's place: event `error`,
/// a JSON body naming the reason (at most ~200 bytes: within any record limit a log accepts
/// events under).
pub fn error_record(reason: Reason) -> (Option<&'static str>, Vec<u8>) {
    let body = serde_json::json!({
        "error": "quarantined",
        "reason": reason.label(),
        "message": format!("a message of this stream could not be applied: {}", reason.describe()),
    });
    (Some("error"), body.to_string().into_bytes())
}

/// The record a skipped message leaves in [`QUARANTINE_STREAM`].
pub fn skip_record(reason: Reason, jetstream_seq: u64) -> (Option<&'static str>, Vec<u8>) {
    let body = serde_json::json!({ "reason": reason.label(), "jetstream_seq": jetstream_seq });
    (Some("quarantined"), body.to_string().into_bytes())
}

/// Whether `name` is an MCP stream's (its error records are the MCP front's kind).
pub fn is_mcp(name: &str) -> bool {
    name.starts_with(MCP_STREAM_PREFIX)
}

#[cfg(test)]
#[path = "quarantine_tests.rs"]
mod tests;
