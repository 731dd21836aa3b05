//! The world's client steps (pump, receive, ACKs, cuts, reconnects) and the crash: the steps
//! that cross between the node and its subscribers.
#![forbid(unsafe_code)]

use log_store::{Epoch, EventId, StreamId};

use crate::clients::{Client, Conn, Expect, expect_for};
use crate::node::{Check, Node};
use crate::world::World;

impl World {
    /// A random connected subscriber's index.
    fn connected(&mut self) -> Option<usize> {
        let live: Vec<usize> = (0..self.subs.len())
            .filter(|&k| self.subs[k].conn.is_some())
            .collect();
        (!live.is_empty()).then(|| live[self.rng.below(live.len() as u64) as usize])
    }

    /// The node feeds one connection from the log and the kernel takes some of its bytes.
    pub(crate) fn pump(&mut self) -> Check {
        let Some(k) = self.connected() else {
            return Ok(());
        };
        let sid = self.node.streams[self.subs[k].stream];
        let lim = self.cfg.limits;
        let conn = self.subs[k].conn.as_mut().expect("connected");
        conn.refill(&self.node, &self.disk, sid, lim)?;
        let max = if self.rng.chance(200) { 64 } else { 1 << 16 };
        conn.send(&mut self.rng, max, &mut self.trace)
    }

    /// One client receives some of the bytes in flight (a slow one, a few), and ACKs.
    pub(crate) fn receive(&mut self) -> Check {
        let Some(k) = self.connected() else {
            return Ok(());
        };
        let sub = &mut self.subs[k];
        let conn = sub.conn.as_mut().expect("connected");
        if conn.wire.is_empty() {
            if conn.finished() {
                return self.closed(k);
            }
            return Ok(());
        }
        let cap = if sub.slow { 64 } else { 1 << 16 };
        let n = self.rng.range(1, (conn.wire.len() as u64).min(cap)) as usize;
        let i = sub.stream;
        let mut client = Client {
            log: self.node.log(),
            sid: self.node.streams[i],
            truth: &mut self.truths[i],
        };
        client.receive(sub, n, &mut self.trace)?;
        let conn = sub.conn.as_mut().expect("connected");
        if !sub.slow || self.rng.chance(300) {
            conn.acks.push_back(conn.received);
        }
        if conn.expect == Expect::Done && conn.finished() {
            return self.closed(k);
        }
        Ok(())
    }

    /// The node closed after an explicit error and the client read it: it must have seen one.
    fn closed(&mut self, k: usize) -> Check {
        let sub = &mut self.subs[k];
        let conn = sub.conn.take().expect("connected");
        if conn.expect != Expect::Done {
            return Err(format!(
                "subscriber {k}: connection closed while expecting {:?}",
                conn.expect
            ));
        }
        sub.away_until = self.step + self.rng.range(1, 30);
        Ok(())
    }

    pub(crate) fn acks(&mut self) -> Check {
        let Some(k) = self.connected() else {
            return Ok(());
        };
        let conn = self.subs[k].conn.as_mut().expect("connected");
        conn.deliver_acks(&mut self.rng, &mut self.trace)
    }

    /// A reset at any byte: what was in flight is lost; the node may or may not learn the
    /// final ACK (SIOCOUTQ), then parks what is unconfirmed.
    pub(crate) fn cut(&mut self) -> Check {
        let Some(k) = self.connected() else {
            return Ok(());
        };
        let in_flight = self.subs[k].conn.as_ref().expect("connected").wire.len() as u64;
        let n = self.rng.below(in_flight + 1) as usize;
        if n > 0 {
            let i = self.subs[k].stream;
            let mut client = Client {
                log: self.node.log(),
                sid: self.node.streams[i],
                truth: &mut self.truths[i],
            };
            client.receive(&mut self.subs[k], n, &mut self.trace)?;
        }
        self.trace.fault("reset", &[k as u64, n as u64]);
        let sub = &mut self.subs[k];
        let mut conn = sub.conn.take().expect("connected");
        if self.rng.chance(500) {
            conn.confirmed = conn.confirmed.max(conn.received);
            conn.win.on_acked(conn.received);
            conn.check_released()?;
        } else {
            self.trace.fault("acks_lost", &[conn.acks.len() as u64]);
        }
        if !conn.closing {
            let sid = self.node.streams[sub.stream];
            let evs = conn.win.take_events();
            self.node.parking.park(sid, evs, self.step);
        }
        sub.away_until = self.step + self.rng.range(1, 30);
        let parked_max = self.node.parking.per_stream_max * self.cfg.streams;
        if self.node.parking.count() > parked_max {
            return Err(format!("{} windows parked", self.node.parking.count()));
        }
        Ok(())
    }

    /// A subscriber away long enough reconnects, with its Last-Event-ID or (by the seed) a
    /// stale, future, foreign, malformed one.
    pub(crate) fn reconnect(&mut self) -> Check {
        let away: Vec<usize> = (0..self.subs.len())
            .filter(|&k| self.subs[k].conn.is_none() && self.subs[k].away_until <= self.step)
            .collect();
        if away.is_empty() {
            return Ok(());
        }
        let k = away[self.rng.below(away.len() as u64) as usize];
        let i = self.subs[k].stream;
        let raw = if self.rng.chance(self.cfg.odd_id_per_mille) {
            Some(self.odd_id(i))
        } else {
            self.subs[k].last_id.clone()
        };
        let sid = self.node.streams[i];
        let expect = expect_for(self.node.log(), sid, raw.as_deref());
        let started = self.node.subscribe(i, raw.as_deref(), self.step);
        self.trace.note(started.class, &[k as u64, started.cursor]);
        self.subs[k].conn = Some(Conn::new(started, expect));
        Ok(())
    }

    /// An ID that is not the client's own: below the floor, beyond the tail, of another
    /// stream or epoch, malformed, or just an older one still retained.
    fn odd_id(&mut self, i: usize) -> String {
        let log = self.node.log();
        let sid = self.node.streams[i];
        let b = log.bounds(sid).expect("stream exists");
        let id =
            |epoch: Epoch, stream: StreamId, seq: u64| EventId { epoch, stream, seq }.to_string();
        let e = log.epoch();
        let (what, s) = match self.rng.below(7) {
            0 => ("stale", id(e, sid, self.rng.below(b.floor.max(1)))),
            1 => ("future", id(e, sid, b.visible_tail + self.rng.range(1, 3))),
            2 => ("other_stream", id(e, StreamId(sid.0 + 1), b.visible_tail)),
            3 => ("other_epoch", id(Epoch(e.0 ^ 0x55), sid, b.visible_tail)),
            4 => ("malformed", "12-zz".to_owned()),
            5 => ("zero", id(e, sid, 0)),
            _ => ("older", id(e, sid, self.rng.below(b.visible_tail + 1))),
        };
        self.trace.fault(what, &[]);
        s
    }

    /// A crash at this instant: the disk keeps what was durable (torn pages), every
    /// connection and everything in memory is gone, and the log is reopened and checked.
    pub(crate) fn crash(&mut self) -> Check {
        self.trace.fault("crash", &[]);
        let image = self.disk.crash_image(&mut self.rng);
        for sub in &mut self.subs {
            sub.conn = None;
            sub.away_until = self.step + self.rng.range(1, 30);
        }
        self.node.crash().simulate_crash();
        self.disk.restore(image);
        self.disk.pause_faults(true);
        let log = Node::open(
            self.disk.dir(),
            self.node.opts.clone(),
            self.node.background,
        );
        self.disk.pause_faults(false);
        let log = log?;
        let r = log.recovery();
        let torn = r.torn_tail_offset.unwrap_or(u64::MAX);
        self.trace.note("recovered", &[r.records_recovered, torn]);
        self.node.log = Some(log);
        self.check_recovered()
    }

    /// After a reopen: every stream is there, nothing acknowledged or observed is lost, and
    /// every record recovered is exactly what was appended under its sequence.
    fn check_recovered(&mut self) -> Check {
        let log = self.node.log();
        for t in &mut self.truths {
            let b = log
                .bounds(t.id)
                .ok_or_else(|| format!("stream {} lost in a crash", t.id))?;
            if b.tail < t.acked.max(t.observed) {
                return Err(format!(
                    "crash lost events of {}: tail {} after acknowledging {} and showing {}",
                    t.id, b.tail, t.acked, t.observed
                ));
            }
            for seq in b.floor..=b.tail {
                let s = log
                    .record(t.id, seq)
                    .map_err(|e| format!("record {seq} of {}: {e}", t.id))?;
                let block = s.as_bytes();
                let block = block.strip_suffix(b"\n\n").unwrap_or(block);
                match crate::sse::parse_block(block)? {
                    crate::sse::Item::Event { event, data, .. } => {
                        t.check(seq, event.as_deref(), &data)?;
                    }
                    other => return Err(format!("record {seq} of {} is {other:?}", t.id)),
                }
            }
            t.truncate(b.tail);
            t.observed = t.observed.min(b.tail);
        }
        Ok(())
    }
}
