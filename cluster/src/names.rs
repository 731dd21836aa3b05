//! The cluster's names and the pure decisions over them: JetStream stream and subject per
//! shard, the epoch a shard's JetStream stream stands for, message IDs (`Nats-Msg-Id`) that
//! say which publishes are this process's, and the check every applied message passes.
#![forbid(unsafe_code)]

/// Header carrying the gateway stream a message belongs to.
pub const HDR_STREAM: &str = "Gw-Stream";
/// Header carrying the SSE event type (absent: no `event:` line).
pub const HDR_EVENT: &str = "Gw-Event";
/// Header carrying the per-stream seq the publisher expects the message to get (MCP records,
/// whose seqs the MCP core predicts): checked by every node on apply.
pub const HDR_SEQ: &str = "Gw-Seq";
/// Header carrying a keyed publish's key, body hash and place in its request (the gateway's
/// format).
pub const HDR_IDEMPOTENCY: &str = "Gw-Idempotency";
/// Header carrying a keyed publish's `<nonce>-<ticket>` (its `Nats-Msg-Id` is the key's).
pub const HDR_ORIGIN: &str = "Gw-Origin";
/// The KV bucket holding each shard's latest snapshot (key `shard-<k>`).
pub const SNAPSHOT_BUCKET: &str = "GW_SNAPSHOTS";

/// The snapshot key of a shard.
pub fn snapshot_key(shard: u32) -> String {
    format!("shard-{shard}")
}

/// The key of chunk `i` of a shard's chunked snapshot (reused by every chunked snapshot of
/// the shard; each keeps its last 64 revisions).
pub fn snapshot_chunk_key(shard: u32, i: usize) -> String {
    format!("shard-{shard}.chunk-{i}")
}

/// Metadata key on every shard's JetStream stream: the cluster's shard count.
pub const META_SHARDS: &str = "gw_shards";

/// A NATS URL as it may be printed: credentials (`user:password@`, `token@`) replaced.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let host_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(host_end);
    let host = match authority.rfind('@') {
        Some(at) => format!("<redacted>@{}", &authority[at + 1..]),
        None => authority.to_owned(),
    };
    let sep = if scheme.is_empty() { "" } else { "://" };
    format!("{scheme}{sep}{host}{tail}")
}

/// Whether a NATS server of `version` (its `INFO`, e.g. `2.12.1`) has JetStream atomic
/// batches: 2.12 or later. A version that does not parse is taken as too old.
pub fn atomic_batches(version: &str) -> bool {
    let mut parts = version.trim_start_matches('v').split(['.', '-']);
    let mut next = || parts.next().and_then(|p| p.parse::<u64>().ok());
    matches!((next(), next()), (Some(major), Some(minor)) if (major, minor) >= (2, 12))
}

/// The JetStream stream holding shard `shard`.
pub fn stream_name(shard: u32) -> String {
    format!("GW_{shard}")
}

/// The one subject of shard `shard`'s JetStream stream.
pub fn subject(shard: u32) -> String {
    format!("gw.{shard}")
}

/// The epoch of a shard: a function of its JetStream stream's identity (the stream's creation
/// time, which a deleted and recreated stream does not share) and the shard, never 0. Every
/// node derives the same one; a recreated JetStream stream gives a new one, so IDs from the old
/// incarnation are refused as another epoch's instead of being read against new content.
pub fn epoch(created_unix_nanos: i128, shard: u32) -> u64 {
    // splitmix64 over the two inputs: a fixed, portable mixing.
    let mut x = (created_unix_nanos as u128 as u64) ^ ((created_unix_nanos >> 64) as u64);
    x ^= u64::from(shard).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    x.max(1)
}

/// `Nats-Msg-Id` of this process's publish `ticket`: `<nonce>-<ticket>`, the nonce random per
/// process start, so a retry of the same publish is de-duplicated by JetStream and no two
/// publishes (of this or another node, now or after a restart) share an ID.
pub fn msg_id(nonce: &str, ticket: u64) -> String {
    format!("{nonce}-{ticket}")
}

/// The ticket of a message this process published (its `Nats-Msg-Id` carries our nonce).
pub fn own_ticket(nonce: &str, msg_id: Option<&str>) -> Option<u64> {
    let rest = msg_id?.strip_prefix(nonce)?.strip_prefix('-')?;
    if rest.is_empty() || (rest.len() > 1 && rest.starts_with('0')) {
        return None;
    }
    rest.parse().ok()
}

/// Why a delivered message cannot be taken: the chain is broken. Every node must apply every
/// message of a shard in JetStream order, once; anything else would number events differently
/// on different nodes (a silent gap or duplicate for a client that resumes elsewhere), so the
/// node stops instead. (What a message carries never breaks the chain: the gateway
/// quarantines what it cannot apply.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainBreak {
    /// The message is not the next one (JetStream moved a consumer past messages it no longer
    /// holds, or a message was skipped).
    NotNext { expected: u64, got: u64 },
}

impl std::fmt::Display for ChainBreak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChainBreak::NotNext { expected, got } => write!(
                f,
                "JetStream delivered sequence {got} where {expected} was next: sequences \
                 {expected}..{} are gone (retention or a purge) and this node cannot number \
                 what follows; rebuild it from a node that has them",
                got.saturating_sub(1)
            ),
        }
    }
}

/// What a delivered message is to its shard's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The next one: apply it.
    Apply,
    /// One applied already (the ordered consumer delivered it again, as async-nats does when
    /// it recreates its consumer around a reset): nothing to do, the node holds it.
    Again,
}

/// The check every delivered message passes: the next one of its shard, or one applied
/// already; a message past the next is a gap no node can number.
pub fn check_next(applied: u64, seq: u64) -> Result<Next, ChainBreak> {
    if seq == applied + 1 {
        Ok(Next::Apply)
    } else if seq <= applied {
        Ok(Next::Again)
    } else {
        Err(ChainBreak::NotNext {
            expected: applied + 1,
            got: seq,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_batches_from_server_2_12() {
        for v in ["2.12.0", "2.12.1", "v2.14.0-beta.1", "2.15.1", "3.0.0"] {
            assert!(atomic_batches(v), "{v}");
        }
        for v in ["2.11.9", "2.10.0", "1.99.0", "", "two", "2"] {
            assert!(!atomic_batches(v), "{v}");
        }
    }

    #[test]
    fn printed_urls_carry_no_credentials() {
        assert_eq!(
            redact_url("nats://gw:s3cret@10.0.0.1:4222"),
            "nats://<redacted>@10.0.0.1:4222"
        );
        assert_eq!(
            redact_url("tls://tok@h:4222/x"),
            "tls://<redacted>@h:4222/x"
        );
        assert_eq!(redact_url("nats://h:4222"), "nats://h:4222");
        assert_eq!(redact_url("u:p@h"), "<redacted>@h");
        assert!(!redact_url("nats://a:b@c@h:1").contains('b'));
    }

    #[test]
    fn own_tickets_are_recognised_and_nothing_else() {
        let n = "0123456789abcdef";
        assert_eq!(own_ticket(n, Some(&msg_id(n, 0))), Some(0));
        assert_eq!(own_ticket(n, Some(&msg_id(n, u64::MAX))), Some(u64::MAX));
        assert_eq!(own_ticket(n, Some("fedcba9876543210-5")), None);
        assert_eq!(own_ticket(n, Some("0123456789abcdef-")), None);
        assert_eq!(own_ticket(n, Some("0123456789abcdef-05")), None);
        assert_eq!(own_ticket(n, Some("0123456789abcdef5")), None);
        assert_eq!(own_ticket(n, Some("0123456789abcdef-5x")), None);
        assert_eq!(own_ticket(n, None), None);
    }

    #[test]
    fn epochs_differ_by_incarnation_and_shard_and_are_never_zero() {
        let t = 1_780_000_000_123_456_789i128;
        assert_eq!(epoch(t, 3), epoch(t, 3));
        assert_ne!(epoch(t, 3), epoch(t + 1, 3));
        assert_ne!(epoch(t, 3), epoch(t, 4));
        assert_ne!(epoch(0, 0), 0);
    }

    #[test]
    fn only_the_next_sequence_applies() {
        assert_eq!(check_next(0, 1), Ok(Next::Apply));
        assert_eq!(check_next(41, 42), Ok(Next::Apply));
        assert_eq!(check_next(41, 41), Ok(Next::Again), "a redelivery");
        assert_eq!(check_next(41, 1), Ok(Next::Again));
        let skip = check_next(41, 50).unwrap_err();
        assert_eq!(
            skip,
            ChainBreak::NotNext {
                expected: 42,
                got: 50
            }
        );
        assert!(skip.to_string().contains("42..49 are gone"));
    }
}
