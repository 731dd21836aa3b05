//! The trace of one seed: a hash of every decision and observation (FNV-1a, 64 bits), and the
//! counts the summary line prints. Two runs of a seed must give the same hash.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

/// What one seed did, hashed and counted.
#[derive(Debug, Clone)]
pub struct Trace {
    hash: u64,
    /// Events accepted by the log (appended by publishers).
    pub events: u64,
    /// Faults injected (cuts, crashes, failed or slow syncs, full disks, lost or late ACKs,
    /// partial sends and receives, foreign or stale IDs).
    pub faults: u64,
    /// How often each label was noted (printed for one seed: what the run exercised).
    pub counts: BTreeMap<&'static str, u64>,
}

impl Default for Trace {
    fn default() -> Self {
        Trace {
            hash: 0xcbf2_9ce4_8422_2325,
            events: 0,
            faults: 0,
            counts: BTreeMap::new(),
        }
    }
}

impl Trace {
    /// Adds a labelled record of numbers to the hash.
    pub fn note(&mut self, what: &'static str, nums: &[u64]) {
        *self.counts.entry(what).or_insert(0) += 1;
        self.bytes(what.as_bytes());
        for n in nums {
            self.bytes(&n.to_le_bytes());
        }
    }

    /// Counts a fault and records it.
    pub fn fault(&mut self, what: &'static str, nums: &[u64]) {
        self.faults += 1;
        self.note(what, nums);
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.hash ^= u64::from(x);
            self.hash = self.hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
