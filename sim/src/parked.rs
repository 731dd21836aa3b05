//! A model of the gateway's parked windows (`gateway::streams::parked::ParkedWindows`), kept
//! here until the gateway is a library: per stream, the unconfirmed events of disconnected
//! subscribers for a grace period (in steps), the one whose head is N+1 (else the newest)
//! shown to the resume planner, taken whole for an aligned resume.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};

use log_store::{Epoch, Seq, StreamId, WindowView};

use crate::window::ParkedEvent;

#[derive(Debug)]
struct Parked {
    head: Seq,
    last: Seq,
    events: Vec<ParkedEvent>,
    expires_step: u64,
}

/// The parked windows of the simulated gateway.
#[derive(Debug, Default)]
pub struct Parking {
    by_stream: BTreeMap<StreamId, VecDeque<Parked>>,
    pub grace_steps: u64,
    pub per_stream_max: usize,
}

impl Parking {
    pub fn new(grace_steps: u64, per_stream_max: usize) -> Parking {
        Parking {
            by_stream: BTreeMap::new(),
            grace_steps,
            per_stream_max,
        }
    }

    pub fn count(&self) -> usize {
        self.by_stream.values().map(VecDeque::len).sum()
    }

    pub fn park(&mut self, stream: StreamId, events: Vec<ParkedEvent>, step: u64) {
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return;
        };
        let (head, last) = (first.seq, last.seq);
        let list = self.by_stream.entry(stream).or_default();
        list.push_back(Parked {
            head,
            last,
            events,
            expires_step: step + self.grace_steps,
        });
        if list.len() > self.per_stream_max {
            list.pop_front();
        }
    }

    pub fn view(
        &mut self,
        stream: StreamId,
        epoch: Epoch,
        requested: Seq,
        step: u64,
    ) -> Option<WindowView> {
        let list = self.by_stream.get_mut(&stream)?;
        list.retain(|p| p.expires_step > step);
        let want = requested.checked_add(1)?;
        list.iter()
            .find(|p| p.head == want)
            .or_else(|| list.back())
            .map(|p| WindowView {
                epoch,
                stream,
                head: p.head,
                last: p.last,
                contiguous: true,
            })
    }

    pub fn take(&mut self, stream: StreamId, head: Seq, last: Seq) -> Vec<ParkedEvent> {
        let list = self.by_stream.get_mut(&stream).expect("aligned: parked");
        let i = list
            .iter()
            .position(|p| p.head == head)
            .expect("aligned: a window with that head");
        let p = list.remove(i).expect("index valid");
        let evs: Vec<_> = p
            .events
            .into_iter()
            .filter(|e| e.seq >= head && e.seq <= last)
            .collect();
        assert_eq!(evs.len() as u64, last - head + 1, "aligned: backed");
        evs
    }

    /// Everything parked is gone (a crash of the process).
    pub fn clear(&mut self) {
        self.by_stream.clear();
    }
}
