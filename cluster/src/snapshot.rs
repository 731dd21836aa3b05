//! Shard snapshots (what a node on an empty data directory starts from when JetStream no longer
//! holds a shard's head) and how they are stored in the KV bucket [`names::SNAPSHOT_BUCKET`]:
//! a snapshot that fits one value is stored whole at the shard's key `shard-<k>`; a larger one
//! is split into chunks stored at `shard-<k>.chunk-<i>` (each `put` returns the revision that
//! holds it), and the shard's key gets a [`Manifest`] naming those revisions. The shard's key
//! keeps 64 values (compare-and-set, never replaced by an older snapshot of the same epoch);
//! each chunk key keeps 64 revisions, so a manifest's chunks stay readable while it is among
//! the recent ones, and the bucket's size stays bounded (chunk keys are reused).
#![forbid(unsafe_code)]

#[cfg(doc)]
use crate::names;

/// A shard's state at one point of its JetStream stream, from which a node on an empty data
/// directory starts when JetStream no longer holds the shard's head: every stream in id order
/// with its tail at message `seq` (one event per message, so the tails sum to `seq`). Stored
/// in the KV bucket [`names::SNAPSHOT_BUCKET`], key `shard-<k>`, as JSON (or a [`Manifest`] of
/// its chunks when it is larger than one value may be); any node's snapshot at a given `seq`
/// is the same (the state is a function of JetStream's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub epoch: u64,
    pub seq: u64,
    pub streams: Vec<(String, u64)>,
}

impl Snapshot {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::json!({ "epoch": self.epoch, "seq": self.seq, "streams": self.streams })
            .to_string()
            .into_bytes()
    }

    /// The snapshot in `bytes`, if it is one whose tails sum to its `seq`.
    pub fn decode(bytes: &[u8]) -> Option<Snapshot> {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        let streams = v["streams"]
            .as_array()?
            .iter()
            .map(|s| Some((s[0].as_str()?.to_owned(), s[1].as_u64()?)))
            .collect::<Option<Vec<_>>>()?;
        let snap = Snapshot {
            epoch: v["epoch"].as_u64()?,
            seq: v["seq"].as_u64()?,
            streams,
        };
        let sum = snap
            .streams
            .iter()
            .try_fold(0u64, |a, (_, t)| a.checked_add(*t))?;
        (sum == snap.seq).then_some(snap)
    }
}

/// A snapshot stored in chunks: its epoch and seq (as the whole one's), its encoded length,
/// and the revision of each chunk key holding a piece of the encoding, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub epoch: u64,
    pub seq: u64,
    pub bytes: u64,
    pub chunks: Vec<u64>,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::json!({
            "epoch": self.epoch, "seq": self.seq, "bytes": self.bytes, "chunks": self.chunks,
        })
        .to_string()
        .into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Option<Manifest> {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        let chunks = v["chunks"]
            .as_array()?
            .iter()
            .map(serde_json::Value::as_u64)
            .collect::<Option<Vec<_>>>()?;
        Some(Manifest {
            epoch: v["epoch"].as_u64()?,
            seq: v["seq"].as_u64()?,
            bytes: v["bytes"].as_u64()?,
            chunks,
        })
    }

    /// The snapshot the chunks (read at this manifest's revisions, in order) hold, if they
    /// join into one of this manifest's length, epoch and seq.
    pub fn join(&self, chunks: &[Vec<u8>]) -> Option<Snapshot> {
        let whole: Vec<u8> = chunks.concat();
        let snap = Snapshot::decode(&whole)?;
        (whole.len() as u64 == self.bytes && snap.epoch == self.epoch && snap.seq == self.seq)
            .then_some(snap)
    }
}

/// What the shard's key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stored {
    Whole(Snapshot),
    Chunked(Manifest),
}

impl Stored {
    pub fn decode(bytes: &[u8]) -> Option<Stored> {
        Snapshot::decode(bytes)
            .map(Stored::Whole)
            .or_else(|| Manifest::decode(bytes).map(Stored::Chunked))
    }

    /// (epoch, seq) of the snapshot it stands for.
    pub fn head(&self) -> (u64, u64) {
        match self {
            Stored::Whole(s) => (s.epoch, s.seq),
            Stored::Chunked(m) => (m.epoch, m.seq),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Manifest, Snapshot, Stored};

    fn snap() -> Snapshot {
        Snapshot {
            epoch: 7,
            seq: 5,
            streams: vec![("a".into(), 2), ("b/c".into(), 3), ("empty".into(), 0)],
        }
    }

    #[test]
    fn a_snapshot_round_trips_and_one_whose_tails_do_not_sum_to_its_seq_is_refused() {
        let s = snap();
        assert_eq!(Snapshot::decode(&s.encode()), Some(s.clone()));
        let bad = Snapshot { seq: 6, ..s };
        assert_eq!(Snapshot::decode(&bad.encode()), None);
        assert_eq!(Snapshot::decode(b"{\"epoch\":1}"), None);
        assert_eq!(Snapshot::decode(b"not json"), None);
    }

    #[test]
    fn chunks_join_back_only_whole_in_order_and_of_the_manifests_snapshot() {
        let s = snap();
        let bytes = s.encode();
        let chunks: Vec<Vec<u8>> = bytes.chunks(7).map(<[u8]>::to_vec).collect();
        let m = Manifest {
            epoch: 7,
            seq: 5,
            bytes: bytes.len() as u64,
            chunks: (1..=chunks.len() as u64).collect(),
        };
        assert_eq!(Manifest::decode(&m.encode()), Some(m.clone()));
        assert_eq!(
            Stored::decode(&m.encode()),
            Some(Stored::Chunked(m.clone()))
        );
        assert_eq!(Stored::decode(&bytes), Some(Stored::Whole(s.clone())));
        assert_eq!(m.join(&chunks), Some(s.clone()));
        // A chunk missing, two swapped, or another snapshot's: refused, never half-read.
        assert_eq!(m.join(&chunks[1..]), None);
        let mut swapped = chunks.clone();
        swapped.swap(0, 1);
        assert_eq!(m.join(&swapped), None);
        let other = Manifest {
            seq: 4,
            ..m.clone()
        };
        assert_eq!(other.join(&chunks), None);
        let longer = Manifest {
            bytes: m.bytes + 1,
            ..m
        };
        assert_eq!(longer.join(&chunks), None);
    }
}
