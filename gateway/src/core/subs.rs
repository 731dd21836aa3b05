//! The subscribers part of a core (`Subs`): the subscribers and their windows. It turns a
//! connection into a subscriber (its ACK mode and watch from `Net`, the hub's registry),
//! pumps it (the streams layer decides what to send from the log, `Net` sends it through the
//! connection's transport, straight from the mapped log), plans where a subscription or
//! resume starts over the parked windows, parks a closing subscriber's unconfirmed window and
//! expires parked ones. What sends and TX timestamps confirm is `Net`'s (`net/mod.rs`). It
//! borrows what it needs per call (`SubCx`); what the core must do next comes back as
//! `Pumped`.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use log_store::{ResumeClass, Seq};

use super::net::{Net, Then};
use super::{Core, Shared, State};
use crate::metrics::CoreMetrics;
use crate::proto::route::SubscribeQuery;
use crate::streams::StreamKey;
use crate::streams::hub::{Hub, SubRef};
use crate::streams::parked::{ParkLimits, ParkedWindows};
use crate::streams::resume::{self, Ask, Start};
use crate::streams::sub::{Ended, Next, PENDING_STREAM, Sub, SubLimits};
use crate::streams::window::ParkedEvent;
use crate::sys;
use crate::uring::{Bytes, Op};

/// What a subscriber part's call borrows of the core.
pub(super) struct SubCx<'a> {
    pub(super) net: &'a mut Net,
    pub(super) hub: &'a mut Hub,
    pub(super) shared: &'a Shared,
    pub(super) m: &'a CoreMetrics,
    pub(super) now: Instant,
}

/// What a pump leaves the core to do.
pub(super) enum Pumped {
    /// Nothing (a send is in flight, nothing to send, or a read-ahead was started).
    Idle,
    /// The send was submitted; `Net` says what follows.
    Then(Then),
    /// The subscription ended (`Sub::next_send`): close the connection.
    Close,
}

/// The subscribers of a core and their windows.
#[derive(Debug)]
pub(super) struct Subs {
    /// Windows of subscribers that disconnected, for an aligned resume.
    pub(super) parked: ParkedWindows,
    lim: SubLimits,
    park: ParkLimits,
    /// Subscribers ask for TX ACK timestamps (the kernel has the command and the flag allows).
    want_ts: bool,
    /// The batch subscribers' log reads fill (its vectors reused: no allocation per read).
    read_scratch: log_store::ReadBatch,
    /// Scratch: the subscribers to pump at the end of a turn.
    pub(super) to_pump: Vec<SubRef>,
}

impl Subs {
    pub(super) fn new(lim: SubLimits, park: ParkLimits, want_ts: bool) -> Subs {
        Subs {
            parked: ParkedWindows::default(),
            lim,
            park,
            want_ts,
            read_scratch: log_store::ReadBatch::default(),
            to_pump: Vec::new(),
        }
    }

    /// Where a subscription of `key` (or a resume: `q`'s `Last-Event-ID`) starts (the planner
    /// over the parked windows), and its class.
    pub(super) fn start(
        &mut self,
        cx: &SubCx<'_>,
        key: StreamKey,
        q: &SubscribeQuery,
    ) -> (Start, Option<ResumeClass>) {
        let ask = Ask {
            key,
            q,
            retry_ms: cx.shared.cfg.retry_ms,
            known_epochs: &cx.shared.epochs,
            now: cx.now,
        };
        let out = resume::start(cx.hub.log(key.0), &mut self.parked, &ask);
        cx.m.parked_windows
            .store(self.parked.count() as u64, Relaxed);
        out
    }

    /// The connection becomes a subscriber of `key` from `cursor`, after `preamble` (and the
    /// `aligned` parked events of an aligned resume); `setup` adjusts it before its first
    /// send. The core pumps it next.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attach(
        &mut self,
        cx: &mut SubCx<'_>,
        slot: u32,
        key: StreamKey,
        cursor: Seq,
        preamble: Vec<u8>,
        aligned: Option<Vec<ParkedEvent<Bytes>>>,
        setup: impl FnOnce(&mut Sub),
    ) {
        let generation = cx.net.io.generation(slot);
        let ack = cx.net.subscriber_socket(slot, self.want_ts);
        let mut sub = Box::new(Sub::new(key, cursor, ack, preamble, aligned, cx.now));
        setup(&mut sub);
        let conn = cx.net.conn(slot);
        super::requests::keep_for_subscription(conn);
        conn.state = State::Sub(sub);
        cx.hub.subscribe(key, (slot, generation));
        cx.m.subscribers.fetch_add(1, Relaxed);
        cx.net.watch_subscriber(slot, ack);
    }

    /// Moves a subscriber forward: refills its window from the log (up to the visible tail)
    /// and hands every unsent byte to the kernel in one send, unless a send or a `POLLOUT`
    /// wait is in flight.
    pub(super) fn pump(&mut self, cx: &mut SubCx<'_>, slot: u32) -> Pumped {
        let busy = [Op::Send, Op::PollOut, Op::Prefetch];
        if busy.iter().any(|&op| cx.net.io.in_flight(slot, op)) {
            return Pumped::Idle;
        }
        let Some(conn) = cx.net.conns.get(slot) else {
            return Pumped::Idle;
        };
        let State::Sub(sub) = &mut conn.state else {
            return Pumped::Idle;
        };
        if conn.closing {
            return Pumped::Idle;
        }
        let (m, lim) = (cx.m, &self.lim);
        let log = cx.hub.log(sub.key.0);
        match sub.refill(log, lim, &mut self.read_scratch) {
            Some(Ended::Lagging) => m.lagging_closes_total.fetch_add(1, Relaxed),
            Some(Ended::Truncated) => m.truncated_closes_total.fetch_add(1, Relaxed),
            None => 0,
        };
        if let Some(c) = sub.cold_run(log.active_segment(), lim, sys::resident) {
            // Replaying cold history: read it ahead through the ring first, so the send does
            // not fault the pages in on the reactor thread.
            m.prefetches_total.fetch_add(1, Relaxed);
            let (file, at) = (c.slice.file().as_raw_fd(), c.slice.file_offset());
            cx.net.io.prefetch(slot, file, at + c.off as u64, c.len);
            return Pumped::Idle;
        }
        match sub.next_send(cx.now, lim) {
            Next::Send(v) => Pumped::Then(cx.net.send_sub(slot, v)),
            Next::Close => Pumped::Close,
            Next::Idle => Pumped::Idle,
        }
    }

    /// A closing connection's subscription ends: out of the registry (and out of the unborn
    /// waiters), its unconfirmed events parked for an aligned resume (not when shutting down). Returns its stream, if it was a
    /// subscriber.
    pub(super) fn detach(
        &mut self,
        cx: &mut SubCx<'_>,
        slot: u32,
        shutting_down: bool,
    ) -> Option<StreamKey> {
        let State::Sub(sub) = &mut cx.net.conns.live(slot).state else {
            return None;
        };
        let key = sub.key;
        let events = sub.take_parkable();
        cx.hub.unsubscribe(key, slot);
        if key.1 == PENDING_STREAM {
            // It waited for a stream not created yet: it waits no more.
            let r = (slot, cx.net.io.generation(slot));
            cx.hub.unborn_mut().forget(r);
        }
        cx.m.subscribers.fetch_sub(1, Relaxed);
        if !shutting_down {
            self.parked.park(key, events, cx.now, self.park);
            cx.m.parked_windows
                .store(self.parked.count() as u64, Relaxed);
        }
        Some(key)
    }

    /// Parked windows past `--resume-grace-secs` are dropped.
    pub(super) fn expire(&mut self, m: &CoreMetrics, now: Instant) {
        self.parked.expire(now);
        m.parked_windows.store(self.parked.count() as u64, Relaxed);
    }
}

/// The stream `name` was just created as `key`: the subscribers waiting for it move to it.
pub(super) fn adopt_unborn(net: &mut Net, hub: &mut Hub, name: &str, key: StreamKey) {
    for r in hub.adopt_unborn(name, key) {
        if let Some(super::conns::Conn {
            state: State::Sub(sub),
            ..
        }) = net.conn_at(r).filter(|c| !c.closing)
        {
            sub.key = key;
        }
    }
}

impl Core {
    /// The subscribers part and what it borrows of the core.
    pub(super) fn subs_cx(&mut self) -> (&mut Subs, SubCx<'_>) {
        let cx = SubCx {
            net: &mut self.net,
            hub: &mut self.hub,
            shared: &self.shared,
            m: &self.shared.metrics[self.id],
            now: self.now,
        };
        (&mut self.subs, cx)
    }

    /// The connection becomes a subscriber (`Subs::attach`), then is pumped.
    pub(super) fn become_subscriber(
        &mut self,
        slot: u32,
        key: StreamKey,
        cursor: Seq,
        preamble: Vec<u8>,
        aligned: Option<Vec<ParkedEvent<Bytes>>>,
        setup: impl FnOnce(&mut Sub),
    ) {
        let (subs, mut cx) = self.subs_cx();
        subs.attach(&mut cx, slot, key, cursor, preamble, aligned, setup);
        self.pump(slot);
    }

    /// Pumps a subscriber (`Subs::pump`) and does what it leaves to the core.
    pub(super) fn pump(&mut self, slot: u32) {
        let (subs, mut cx) = self.subs_cx();
        match subs.pump(&mut cx, slot) {
            Pumped::Then(then) => self.then(slot, then),
            Pumped::Close => self.close_conn(slot),
            Pumped::Idle => {}
        }
    }
}
