//! A model of the gateway's subscriber send window (`gateway::streams::window::Window`), kept
//! here until the gateway is a library the simulator can drive (then this file goes): byte
//! offsets `queued >= sent >= acked`, events released only once the peer's ACK covers their
//! last byte, the unconfirmed ones taken whole for parking. It copies bytes (the real one
//! points into mapped log slices).
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use log_store::{LogSlice, Seq};

/// An unconfirmed event taken at a disconnect: its sequence and framed bytes.
#[derive(Debug, Clone)]
pub struct ParkedEvent {
    pub seq: Seq,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Copy)]
struct WinEvent {
    seq: Seq,
    start: u64,
    end: u64,
}

/// One connection's window.
#[derive(Debug, Default)]
pub struct SendWin {
    /// Bytes `base..queued`: `base` is `acked`, or the start of the first event if the ACK
    /// fell inside it (an event is parked whole).
    bytes: VecDeque<u8>,
    base: u64,
    events: VecDeque<WinEvent>,
    queued: u64,
    sent: u64,
    acked: u64,
    ack_hint: u64,
}

impl SendWin {
    pub fn push_bytes(&mut self, b: &[u8]) {
        self.bytes.extend(b);
        self.queued += b.len() as u64;
    }

    /// Events `first..` whose framed bytes are the slices, `lens` each.
    pub fn push_events(&mut self, first: Seq, slices: &[LogSlice], lens: &[u32]) {
        let mut start = self.queued;
        for (i, &len) in lens.iter().enumerate() {
            let end = start + u64::from(len);
            self.events.push_back(WinEvent {
                seq: first + i as u64,
                start,
                end,
            });
            start = end;
        }
        for s in slices {
            self.push_bytes(s.as_bytes());
        }
        assert_eq!(self.queued, start, "record lengths cover the slices");
    }

    /// Events of a parked window, first (an aligned resume).
    pub fn push_parked(&mut self, evs: Vec<ParkedEvent>) {
        for ev in evs {
            let start = self.queued;
            self.push_bytes(&ev.bytes);
            self.events.push_back(WinEvent {
                seq: ev.seq,
                start,
                end: self.queued,
            });
        }
    }

    /// Up to `max` unsent bytes, copied.
    pub fn unsent(&self, max: usize) -> Vec<u8> {
        let from = (self.sent - self.base) as usize;
        let n = ((self.queued - self.sent) as usize).min(max);
        self.bytes.range(from..from + n).copied().collect()
    }

    /// The kernel took `n` more bytes.
    pub fn on_sent(&mut self, n: u64) {
        assert!(self.sent + n <= self.queued, "sent more than queued");
        self.sent += n;
        let hint = self.ack_hint;
        self.apply_ack(hint);
    }

    /// The peer confirmed bytes `[0, total)`.
    pub fn on_acked(&mut self, total: u64) {
        self.ack_hint = self.ack_hint.max(total);
        self.apply_ack(self.ack_hint);
    }

    fn apply_ack(&mut self, hint: u64) {
        let acked = hint.min(self.sent);
        if acked <= self.acked {
            return;
        }
        self.acked = acked;
        while self.events.front().is_some_and(|e| e.end <= acked) {
            self.events.pop_front();
        }
        let base = self.events.front().map_or(acked, |e| e.start.min(acked));
        self.bytes.drain(..(base - self.base) as usize);
        self.base = base;
    }

    /// Takes the unconfirmed events with their bytes (for parking).
    pub fn take_events(&mut self) -> Vec<ParkedEvent> {
        let base = self.base;
        let out = self
            .events
            .iter()
            .map(|e| {
                let (a, b) = ((e.start - base) as usize, (e.end - base) as usize);
                ParkedEvent {
                    seq: e.seq,
                    bytes: self.bytes.range(a..b).copied().collect(),
                }
            })
            .collect();
        self.events.clear();
        out
    }

    pub fn queued(&self) -> u64 {
        self.queued
    }

    pub fn sent(&self) -> u64 {
        self.sent
    }

    pub fn acked(&self) -> u64 {
        self.acked
    }
}
