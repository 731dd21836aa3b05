//! Subscriber connections on a core: turning a connection into a subscriber (its ACK mode and
//! watch from `Net`, the registry), and pumping it: the streams layer decides what to send,
//! `Net` sends it through the connection's transport (straight from the mapped log). What the
//! sends and TX timestamps confirm is `Net`'s (`net/mod.rs`).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;

use log_store::Seq;

use super::{Core, State};
use crate::streams::StreamKey;
use crate::streams::sub::{Ended, Next, Sub};
use crate::streams::window::ParkedEvent;
use crate::sys;
use crate::uring::{Bytes, Op};

impl Core {
    /// The connection becomes a subscriber of `key` from `cursor`, after `preamble` (and the
    /// `aligned` parked events of an aligned resume); `setup` adjusts it before its first send.
    pub(super) fn become_subscriber(
        &mut self,
        slot: u32,
        key: StreamKey,
        cursor: Seq,
        preamble: Vec<u8>,
        aligned: Option<Vec<ParkedEvent<Bytes>>>,
        setup: impl FnOnce(&mut Sub),
    ) {
        let want_ts = self.shared.uring_cmd && !self.shared.cfg.no_tx_timestamps;
        let (now, generation) = (self.now, self.net.io.generation(slot));
        let ack = self.net.subscriber_socket(slot, want_ts);
        let mut sub = Box::new(Sub::new(key, cursor, ack, preamble, aligned, now));
        setup(&mut sub);
        let conn = self.net.conn(slot);
        super::requests::keep_for_subscription(conn);
        conn.state = State::Sub(sub);
        self.hub.subscribe(key, (slot, generation));
        self.m().subscribers.fetch_add(1, Relaxed);
        self.net.watch_subscriber(slot, ack);
        self.pump(slot);
    }

    /// Moves a subscriber forward: refills its window from the log (up to the visible tail)
    /// and hands every unsent byte to the kernel in one send, unless a send or a `POLLOUT`
    /// wait is in flight.
    pub(super) fn pump(&mut self, slot: u32) {
        let busy = [Op::Send, Op::PollOut, Op::Prefetch];
        if busy.iter().any(|&op| self.net.io.in_flight(slot, op)) {
            return;
        }
        let (now, lim) = (self.now, self.lim.sub);
        let Some(conn) = self.net.conns.get(slot) else {
            return;
        };
        let State::Sub(sub) = &mut conn.state else {
            return;
        };
        if conn.closing {
            return;
        }
        let m = &self.shared.metrics[self.id];
        let log = self.hub.log(sub.key.0);
        match sub.refill(log, &lim, &mut self.read_scratch) {
            Some(Ended::Lagging) => m.lagging_closes_total.fetch_add(1, Relaxed),
            Some(Ended::Truncated) => m.truncated_closes_total.fetch_add(1, Relaxed),
            None => 0,
        };
        if let Some(c) = sub.cold_run(log.active_segment(), &lim, sys::resident) {
            // Replaying cold history: read it ahead through the ring first, so the send does
            // not fault the pages in on the reactor thread.
            m.prefetches_total.fetch_add(1, Relaxed);
            let (file, at) = (c.slice.file().as_raw_fd(), c.slice.file_offset());
            return self.net.io.prefetch(slot, file, at + c.off as u64, c.len);
        }
        match sub.next_send(now, &lim) {
            Next::Send(v) => {
                let then = self.net.send_sub(slot, v);
                self.then(slot, then);
            }
            Next::Close => self.close_conn(slot),
            Next::Idle => {}
        }
    }
}
