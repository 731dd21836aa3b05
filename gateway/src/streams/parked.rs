//! Parked windows: a disconnected subscriber's unconfirmed events (with their slice guards),
//! kept per stream for `--resume-grace-secs` so a resume whose `Last-Event-ID` is exactly
//! their head − 1 can be served from them (an aligned resume). A cache, never an authority:
//! the resume planner decides whether one may be used. No I/O; time is passed in.
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use log_store::{Epoch, Seq, WindowView};

use super::StreamKey;
use super::window::ParkedEvent;
use crate::uring::Bytes;

#[derive(Debug)]
struct Parked {
    head: Seq,
    last: Seq,
    events: Vec<ParkedEvent<Bytes>>,
    expires: Instant,
}

/// The parking limits (flags).
#[derive(Debug, Clone, Copy)]
pub struct ParkLimits {
    pub grace: Duration,
    pub per_stream_max: usize,
}

/// The parked windows of one core.
#[derive(Debug, Default)]
pub struct ParkedWindows {
    by_stream: HashMap<StreamKey, VecDeque<Parked>>,
    count: usize,
}

impl ParkedWindows {
    /// Parked windows held (the `gateway_parked_windows` gauge).
    pub fn count(&self) -> usize {
        self.count
    }

    /// Parks a disconnected subscriber's unconfirmed events (oldest window of the stream
    /// dropped first beyond the per-stream limit). Nothing is parked with no grace or limit.
    pub fn park(
        &mut self,
        key: StreamKey,
        events: Vec<ParkedEvent<Bytes>>,
        now: Instant,
        lim: ParkLimits,
    ) {
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return;
        };
        if lim.grace == Duration::ZERO || lim.per_stream_max == 0 {
            return;
        }
        let (head, last) = (first.seq, last.seq);
        let list = self.by_stream.entry(key).or_default();
        list.push_back(Parked {
            head,
            last,
            events,
            expires: now + lim.grace,
        });
        self.count += 1;
        if list.len() > lim.per_stream_max {
            list.pop_front();
            self.count -= 1;
        }
    }

    /// The view the resume planner judges for a resume after `requested` on `key`: the
    /// window whose head is `requested + 1`, else the newest one. Expired windows go first.
    pub fn view(
        &mut self,
        key: StreamKey,
        epoch: Epoch,
        requested: Seq,
        now: Instant,
    ) -> Option<WindowView> {
        let list = self.by_stream.get_mut(&key)?;
        let before = list.len();
        list.retain(|p| p.expires > now);
        self.count -= before - list.len();
        let want = requested.checked_add(1)?;
        list.iter()
            .find(|p| p.head == want)
            .or_else(|| list.back())
            .map(|p| WindowView {
                epoch,
                stream: key.1,
                head: p.head,
                last: p.last,
                contiguous: true,
            })
    }

    /// Takes the events `head..=last` of the window with that head, for an aligned resume.
    /// The planner said Aligned for exactly this window: anything else is a broken invariant.
    pub fn take(&mut self, key: StreamKey, head: Seq, last: Seq) -> Vec<ParkedEvent<Bytes>> {
        let list = self
            .by_stream
            .get_mut(&key)
            .expect("aligned implies a parked window");
        let i = list
            .iter()
            .position(|p| p.head == head)
            .expect("aligned implies a parked window with that head");
        let p = list.remove(i).expect("index valid");
        self.count -= 1;
        let evs: Vec<_> = p
            .events
            .into_iter()
            .filter(|e| e.seq >= head && e.seq <= last)
            .collect();
        assert!(
            evs.first().is_some_and(|e| e.seq == head)
                && evs.last().is_some_and(|e| e.seq == last)
                && evs.len() as u64 == last - head + 1,
            "aligned plan must be backed by the parked window"
        );
        evs
    }

    /// Drops every window of `key` (its stream was removed).
    pub fn forget(&mut self, key: StreamKey) {
        if let Some(list) = self.by_stream.remove(&key) {
            self.count -= list.len();
        }
    }

    /// Drops windows past their grace period.
    pub fn expire(&mut self, now: Instant) {
        for list in self.by_stream.values_mut() {
            let before = list.len();
            list.retain(|p| p.expires > now);
            self.count -= before - list.len();
        }
        self.by_stream.retain(|_, l| !l.is_empty());
    }
}
