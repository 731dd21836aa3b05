//! Simulated subscribers and the network between them and the node: each subscriber holds a
//! connection (the node's send window and cursor on one side; bytes in flight; the client's
//! parser, what it must observe next and the TCP ACKs it sends) or waits to reconnect with
//! its Last-Event-ID. Partial sends and receives, slow readers, late, batched, reordered and
//! (at a disconnect) lost ACKs, and resets at any byte are chosen by the seed.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use log_store::{EventId, Log, Seq, StreamId};

use crate::disk::Disk;
use crate::node::{Check, Node, Started};
use crate::rng::Rng;
use crate::sse::{Item, Parser};
use crate::trace::Trace;
use crate::truth::Truth;
use crate::window::SendWin;

/// What the client must observe next, decided from the oracle and the log's bounds when it
/// connected (never from the planner's answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The suffix of the stream from `next`.
    Suffix { next: Seq },
    /// An explicit error, and nothing else.
    Error,
    /// An explicit error was observed: the connection ends.
    Done,
}

/// One connection.
#[derive(Debug)]
pub struct Conn {
    pub win: SendWin,
    pub cursor: Seq,
    pub closing: bool,
    pub wire: VecDeque<u8>,
    pub parser: Parser,
    pub expect: Expect,
    /// Bytes the client received (what its TCP ACKs).
    pub received: u64,
    /// ACKs on their way to the node.
    pub acks: VecDeque<u64>,
    /// Highest ACK the node was given: the window may release nothing beyond it.
    pub confirmed: u64,
}

/// One subscriber.
#[derive(Debug)]
pub struct Sub {
    pub stream: usize,
    /// The ID of the last event observed (EventSource's `lastEventId`).
    pub last_id: Option<String>,
    pub slow: bool,
    pub away_until: u64,
    pub conn: Option<Conn>,
}

/// The limits a connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub window_bytes_max: u64,
    pub record_bytes_max: u64,
}

impl ConnLimits {
    /// Bytes a connection may hold unconfirmed: its window, one record past it (a read
    /// returns at least one), and as much again for a parked window served first, plus heads.
    pub fn held_bytes_max(&self) -> u64 {
        2 * (self.window_bytes_max + self.record_bytes_max) + 1024
    }
}

/// What a client connecting to `sid` with `raw` must observe, from the log's bounds and the
/// rules of the invariant alone.
pub fn expect_for(log: &Log, sid: StreamId, raw: Option<&str>) -> Expect {
    let b = log.bounds(sid).expect("stream exists");
    let Some(raw) = raw else {
        return Expect::Suffix { next: b.floor };
    };
    let Ok(id) = raw.parse::<EventId>() else {
        return Expect::Error;
    };
    let n = id.seq;
    if id.epoch != log.epoch() || id.stream != sid || n > b.visible_tail || n + 1 < b.floor {
        return Expect::Error;
    }
    Expect::Suffix { next: n + 1 }
}

impl Conn {
    pub fn new(s: Started, expect: Expect) -> Conn {
        Conn {
            win: s.win,
            cursor: s.cursor,
            closing: s.closing,
            wire: VecDeque::new(),
            parser: Parser::default(),
            expect,
            received: 0,
            acks: VecDeque::new(),
            confirmed: 0,
        }
    }

    /// The node reads the log into the window while it has room; every event it queues must
    /// be durable. Falling below the floor ends the stream with `event: truncated`.
    pub fn refill(&mut self, node: &Node, disk: &Disk, sid: StreamId, lim: ConnLimits) -> Check {
        let held = self.win.queued() - self.win.acked();
        if self.closing || held >= lim.window_bytes_max {
            return Ok(());
        }
        let want = (lim.window_bytes_max - held) as usize;
        match node.log().read(sid, self.cursor, want) {
            Ok(b) if b.is_empty() => {}
            Ok(b) => {
                for s in &b.slices {
                    if !disk.is_durable(s.segment_number(), s.file_offset(), s.as_bytes()) {
                        return Err(format!(
                            "events {}..={} of {sid} shown before they are durable",
                            s.first_seq(),
                            s.last_seq()
                        ));
                    }
                }
                self.win.push_events(b.first, &b.slices, &b.record_lens);
                self.cursor = b.last + 1;
            }
            Err(log_store::ReadError::Truncated { .. }) => {
                self.win.push_bytes(b"event: truncated\ndata: {}\n\n");
                self.closing = true;
            }
            Err(e) => return Err(format!("read of {sid} from {} failed: {e}", self.cursor)),
        }
        let held = self.win.queued() - self.win.acked();
        if held > lim.held_bytes_max() {
            return Err(format!("a connection holds {held} bytes unconfirmed"));
        }
        Ok(())
    }

    /// The kernel takes up to `max` unsent bytes (fewer: a partial send).
    pub fn send(&mut self, rng: &mut Rng, max: u64, trace: &mut Trace) -> Check {
        let unsent = self.win.queued() - self.win.sent();
        if unsent == 0 {
            return Ok(());
        }
        let n = rng.range(1, unsent.min(max));
        if n < unsent {
            trace.fault("partial_send", &[n]);
        }
        self.wire.extend(self.win.unsent(n as usize));
        self.win.on_sent(n);
        self.check_released()
    }

    /// The window released nothing the peer has not confirmed.
    pub fn check_released(&self) -> Check {
        if self.win.acked() > self.confirmed {
            return Err(format!(
                "window released bytes up to {} but the peer confirmed only {}",
                self.win.acked(),
                self.confirmed
            ));
        }
        Ok(())
    }

    /// The node is given ACKs: the oldest, all at once (batched: the highest), or a newer one
    /// before older ones (which then arrive stale).
    pub fn deliver_acks(&mut self, rng: &mut Rng, trace: &mut Trace) -> Check {
        if self.acks.is_empty() {
            return Ok(());
        }
        let v = match rng.below(3) {
            0 => self.acks.pop_front().expect("non-empty"),
            1 => {
                trace.fault("acks_batched", &[self.acks.len() as u64]);
                self.acks.drain(..).max().expect("non-empty")
            }
            _ => {
                trace.fault("ack_reordered", &[]);
                self.acks.pop_back().expect("non-empty")
            }
        };
        self.confirmed = self.confirmed.max(v);
        self.win.on_acked(v);
        self.check_released()
    }

    /// Whether the node closed after an explicit error and everything reached the client.
    pub fn finished(&self) -> bool {
        self.closing && self.win.queued() == self.win.sent() && self.wire.is_empty()
    }
}

/// What a client does with the bytes it receives: parse, check each item against what it
/// must observe, and ACK.
#[derive(Debug)]
pub struct Client<'a> {
    pub log: &'a Log,
    pub sid: StreamId,
    pub truth: &'a mut Truth,
}

impl Client<'_> {
    /// Receives `k` bytes from the wire and checks what they complete.
    pub fn receive(&mut self, sub: &mut Sub, k: usize, trace: &mut Trace) -> Check {
        let conn = sub.conn.as_mut().expect("connected");
        let bytes: Vec<u8> = conn.wire.drain(..k).collect();
        conn.parser.feed(&bytes);
        conn.received += k as u64;
        while conn.expect != Expect::Done {
            let Some(item) = conn.parser.poll_item()? else {
                break;
            };
            self.observe(conn, &mut sub.last_id, item, trace)?;
        }
        Ok(())
    }

    fn observe(
        &mut self,
        conn: &mut Conn,
        last_id: &mut Option<String>,
        item: Item,
        trace: &mut Trace,
    ) -> Check {
        let sid = self.sid;
        match (item, conn.expect) {
            (Item::Head { status: 200 }, Expect::Suffix { .. }) | (Item::Other, _) => Ok(()),
            (Item::Head { status }, Expect::Error) if status != 200 => {
                trace.note("refused", &[u64::from(status)]);
                conn.expect = Expect::Done;
                Ok(())
            }
            (Item::Head { status }, Expect::Suffix { next }) => Err(format!(
                "resume of {sid} got the explicit error {status} though {next}.. was servable"
            )),
            (Item::Head { .. } | Item::Event { .. }, Expect::Error) => Err(format!(
                "resume of {sid} was served though an explicit error was due"
            )),
            (Item::Truncated, Expect::Suffix { next }) => {
                let floor = self.log.bounds(sid).map_or(0, |b| b.floor);
                if next >= floor {
                    return Err(format!(
                        "truncated at {next} of {sid} above its floor {floor}"
                    ));
                }
                conn.expect = Expect::Done;
                Ok(())
            }
            (Item::Event { id, event, data }, Expect::Suffix { next }) => {
                self.event(conn, next, &id, event.as_deref(), &data)?;
                trace.note("observed", &[u64::from(sid.0), next]);
                *last_id = Some(id);
                Ok(())
            }
            (item, e) => Err(format!("{sid}: observed {item:?} while expecting {e:?}")),
        }
    }

    fn event(
        &mut self,
        conn: &mut Conn,
        next: Seq,
        id: &str,
        event: Option<&str>,
        data: &[u8],
    ) -> Check {
        let sid = self.sid;
        let got: EventId = id.parse().map_err(|e| format!("bad id {id:?}: {e:?}"))?;
        if got.epoch != self.log.epoch() || got.stream != sid {
            return Err(format!("subscriber of {sid} observed {got}"));
        }
        if got.seq != next {
            let what = if got.seq > next { "gap" } else { "duplicate" };
            return Err(format!(
                "{what}: subscriber of {sid} observed {} where {next} was due",
                got.seq
            ));
        }
        self.truth.check(next, event, data)?;
        self.truth.observed = self.truth.observed.max(next);
        conn.expect = Expect::Suffix { next: next + 1 };
        Ok(())
    }
}
