//! The oracle: what each stream holds (every event as appended, by sequence, the latest
//! incarnation of a sequence after a crash took unsynced ones back), the highest acknowledged
//! sequence (publishes answered) and the highest one any subscriber observed. Checked against
//! what subscribers read and against what recovery finds.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use log_store::{Seq, StreamId};

/// One appended event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    pub event: Option<String>,
    pub data: Vec<u8>,
}

/// One stream's truth.
#[derive(Debug)]
pub struct Truth {
    pub id: StreamId,
    recs: Vec<Rec>,
    /// Highest sequence a publisher was answered for (acknowledged: synced first).
    pub acked: Seq,
    /// Highest sequence a subscriber observed.
    pub observed: Seq,
    /// Keyed publishes whose key record was written, by first sequence: (count, whether the
    /// key must survive a crash: its publish was answered, or recovery found it before).
    pub keys: BTreeMap<Seq, (u32, bool)>,
}

impl Truth {
    pub fn new(id: StreamId) -> Truth {
        Truth {
            id,
            recs: Vec::new(),
            acked: 0,
            observed: 0,
            keys: BTreeMap::new(),
        }
    }

    /// The log appended `rec` as `seq`: it must be the next one.
    pub fn appended(&mut self, seq: Seq, rec: Rec) -> Result<(), String> {
        let next = self.recs.len() as u64 + 1;
        if seq != next {
            return Err(format!(
                "stream {}: append got sequence {seq}, expected {next}",
                self.id
            ));
        }
        self.recs.push(rec);
        Ok(())
    }

    pub fn rec(&self, seq: Seq) -> Option<&Rec> {
        let i = usize::try_from(seq.checked_sub(1)?).ok()?;
        self.recs.get(i)
    }

    /// Highest sequence appended.
    pub fn tail(&self) -> Seq {
        self.recs.len() as u64
    }

    /// A crash took back everything after `tail`.
    pub fn truncate(&mut self, tail: Seq) {
        self.recs.truncate(tail as usize);
    }

    /// The key record of a publish of `first..first + count` names exactly that publish.
    pub fn key_bytes(first: Seq, count: u32) -> Vec<u8> {
        format!("k{first}/{count}").into_bytes()
    }

    /// After a reopen: the keys recovery found (`(first, count, bytes)`) must each be one this
    /// stream's publishes wrote, and every key that must survive and whose last event is
    /// retained (`>= floor`: the key is in that event's segment or a later one) must be among
    /// them. The recovered ones must survive from now on; the others are gone.
    pub fn check_keys(&mut self, found: &[(Seq, u32, Vec<u8>)], floor: Seq) -> Result<(), String> {
        for (first, count, bytes) in found {
            if self.keys.get(first).map(|k| k.0) != Some(*count)
                || *bytes != Truth::key_bytes(*first, *count)
            {
                return Err(format!(
                    "stream {}: recovery found a key for {first}+{count} that no publish wrote",
                    self.id
                ));
            }
        }
        for (&first, &(count, must)) in &self.keys {
            let last = first + u64::from(count) - 1;
            if must && last >= floor && !found.iter().any(|k| k.0 == first) {
                return Err(format!(
                    "stream {}: the key of answered publish {first}..={last} was lost in a crash",
                    self.id
                ));
            }
        }
        self.keys = found.iter().map(|k| (k.0, (k.1, true))).collect();
        Ok(())
    }

    /// Whether `(event, data)` is exactly what was appended as `seq`.
    pub fn check(&self, seq: Seq, event: Option<&str>, data: &[u8]) -> Result<(), String> {
        let Some(r) = self.rec(seq) else {
            return Err(format!(
                "stream {}: event {seq} was never appended",
                self.id
            ));
        };
        if r.event.as_deref() != event || r.data != data {
            return Err(format!(
                "stream {}: event {seq} differs from what was appended ({} bytes of data, \
                 {} read)",
                self.id,
                r.data.len(),
                data.len()
            ));
        }
        Ok(())
    }
}
