//! The world's connection steps (pump, receive, ACKs, ticks, cuts, reconnects) and the crash:
//! the steps that cross between the node and its subscribers.
#![forbid(unsafe_code)]

use gateway::proto::route::{From, SubscribeQuery};
use log_store::{Epoch, EventId, StreamId};

use crate::clients::{Client, expect_for};
use crate::conn::Conn;
use crate::conn::Expect;
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

    /// Subscriber `k` receives `n` bytes from its wire.
    fn receive_bytes(&mut self, k: usize, n: usize) -> Check {
        let sub = &mut self.subs[k];
        let i = sub.stream;
        let mut client = Client {
            log: self.node.log(),
            sid: self.node.streams[i],
            truth: &mut self.truths[i],
            lag_events_max: self.cfg.limits.sub.lag_events_max,
        };
        client.receive(sub, n, &mut self.trace)
    }

    /// The node's turn for one connection: a send completes, or it refills and sends.
    pub(crate) fn pump(&mut self) -> Check {
        let Some(k) = self.connected() else {
            return Ok(());
        };
        let now = self.node.now(self.step);
        let conn = self.subs[k].conn.as_mut().expect("connected");
        let (rng, lim) = (&mut self.rng, &self.cfg.limits);
        conn.pump(&self.node, &self.disk, now, rng, lim, &mut self.trace)
    }

    /// A tick of the node for one connection (`SIOCOUTQ`, keep-alives).
    pub(crate) fn tick(&mut self) -> Check {
        let Some(k) = self.connected() else {
            return Ok(());
        };
        let now = self.node.now(self.step);
        let conn = self.subs[k].conn.as_mut().expect("connected");
        conn.tick(now, &self.cfg.limits.sub)
    }

    /// One client receives some of the bytes in flight (a slow one, a few), and ACKs.
    pub(crate) fn receive(&mut self) -> Check {
        let Some(k) = self.connected() else {
            return Ok(());
        };
        let slow = self.subs[k].slow;
        let conn = self.subs[k].conn.as_mut().expect("connected");
        if conn.wire.is_empty() {
            return if conn.finished() {
                self.closed(k)
            } else {
                Ok(())
            };
        }
        let cap = if slow { 64 } else { 1 << 16 };
        let n = self.rng.range(1, (conn.wire.len() as u64).min(cap)) as usize;
        self.receive_bytes(k, n)?;
        let ack = !slow || self.rng.chance(300);
        let conn = self.subs[k].conn.as_mut().expect("connected");
        if ack {
            conn.acks.push_back(conn.received);
        }
        if conn.finished() {
            return self.closed(k);
        }
        Ok(())
    }

    /// The node closed and the client read everything: it must have seen an explicit error.
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
    /// final ACKs, then parks what is unconfirmed.
    pub(crate) fn cut(&mut self) -> Check {
        let Some(k) = self.connected() else {
            return Ok(());
        };
        let in_flight = self.subs[k].conn.as_ref().expect("connected").wire.len() as u64;
        let n = self.rng.below(in_flight + 1) as usize;
        if n > 0 {
            self.receive_bytes(k, n)?;
        }
        self.trace.fault("reset", &[k as u64, n as u64]);
        let final_acks = self.rng.chance(500);
        if !final_acks {
            self.trace.fault("acks_lost", &[]);
        }
        let now = self.node.now(self.step);
        let sub = &mut self.subs[k];
        let mut conn = sub.conn.take().expect("connected");
        let parked = conn.close(now, &self.cfg.limits.sub, final_acks)?;
        let lim = self.node.park_limits;
        self.node.parking.park(conn.key, parked, now, lim);
        sub.away_until = self.step + self.rng.range(1, 30);
        let parked_max = lim.per_stream_max * self.cfg.streams;
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
        let (on, ack) = (self.subs[k].on_truncated, self.subs[k].ack);
        let q = SubscribeQuery {
            from: From::Earliest,
            last_event_id: raw.clone(),
            on_truncated: on,
        };
        let expect = expect_for(self.node.log(), sid, raw.as_deref(), on);
        let (sub, refused, class) = self.node.subscribe(i, &q, ack, self.step);
        self.trace.note(class, &[k as u64]);
        self.subs[k].conn = Some(Conn::new((0, sid), sub, refused, expect));
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
        let keys = self
            .node
            .log
            .as_mut()
            .expect("log open")
            .take_recovered_keys();
        let log = self.node.log();
        for t in &mut self.truths {
            let found: Vec<_> = keys
                .iter()
                .filter(|k| k.stream == t.id)
                .map(|k| (k.first, k.count, k.key.clone()))
                .collect();
            let floor = log.bounds(t.id).map_or(0, |b| b.floor);
            t.check_keys(&found, floor)?;
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
        }
        Ok(())
    }
}
