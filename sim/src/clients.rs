//! Simulated subscribers: each holds a connection (`conn.rs`) or waits to reconnect with its
//! Last-Event-ID; what it must observe is decided from the oracle and the log's bounds when it
//! connects (never from the planner's answer), and every item it reads is checked.
#![forbid(unsafe_code)]

use gateway::proto::route::OnTruncated;
use gateway::streams::sub::AckMode;
use log_store::{EventId, Log, Seq, StreamId};

use crate::conn::{Conn, Expect};
use crate::node::Check;
use crate::sse::Item;
use crate::trace::Trace;
use crate::truth::Truth;

/// One subscriber.
#[derive(Debug)]
pub struct Subscriber {
    pub stream: usize,
    /// The ID of the last event observed (EventSource's `lastEventId`).
    pub last_id: Option<String>,
    pub slow: bool,
    pub ack: AckMode,
    pub on_truncated: OnTruncated,
    pub away_until: u64,
    pub conn: Option<Conn>,
}

/// What a client connecting to `sid` with `raw` must observe, from the log's bounds and the
/// rules of the invariant alone.
pub fn expect_for(log: &Log, sid: StreamId, raw: Option<&str>, on: OnTruncated) -> Expect {
    let b = log.bounds(sid).expect("stream exists");
    let Some(raw) = raw else {
        return Expect::Suffix { next: b.floor };
    };
    let Ok(id) = raw.parse::<EventId>() else {
        return Expect::Error;
    };
    let n = id.seq;
    if id.epoch != log.epoch() || id.stream != sid || n > b.visible_tail {
        return Expect::Error;
    }
    if n + 1 >= b.floor {
        return Expect::Suffix { next: n + 1 };
    }
    match on {
        OnTruncated::Error => Expect::Error,
        OnTruncated::Earliest => Expect::TruncatedThen { then: b.floor },
        OnTruncated::Latest => Expect::TruncatedThen {
            then: b.visible_tail + 1,
        },
    }
}

/// What a client does with the bytes it receives: parse, check each item against what it
/// must observe.
#[derive(Debug)]
pub struct Client<'a> {
    pub log: &'a Log,
    pub sid: StreamId,
    pub truth: &'a mut Truth,
    pub lag_events_max: u64,
}

impl Client<'_> {
    /// Receives `k` bytes from the wire and checks what they complete.
    pub fn receive(&mut self, sub: &mut Subscriber, k: usize, trace: &mut Trace) -> Check {
        let conn = sub.conn.as_mut().expect("connected");
        let bytes: Vec<u8> = conn.wire.drain(..k).collect();
        conn.parser.feed(&bytes);
        conn.received += k as u64;
        while conn.expect != Expect::Done {
            let Some(item) = conn.parser.poll_item()? else {
                break;
            };
            conn.expect = self.observe(conn.expect, &mut sub.last_id, item, trace)?;
        }
        Ok(())
    }

    /// Checks `item` against `e`; returns what is expected next.
    fn observe(
        &mut self,
        e: Expect,
        last_id: &mut Option<String>,
        item: Item,
        trace: &mut Trace,
    ) -> Result<Expect, String> {
        let sid = self.sid;
        match (item, e) {
            (Item::Head { status: 200 }, Expect::Suffix { .. } | Expect::TruncatedThen { .. })
            | (Item::Other, _) => Ok(e),
            (Item::Head { status }, Expect::Error) if status != 200 => {
                trace.note("refused", &[u64::from(status)]);
                Ok(Expect::Done)
            }
            (Item::Head { status }, _) => Err(format!(
                "subscriber of {sid} got {status} while expecting {e:?}"
            )),
            (Item::Truncated { .. }, Expect::TruncatedThen { then }) => {
                Ok(Expect::Suffix { next: then })
            }
            (Item::Truncated { data }, Expect::Suffix { next }) => self.ended(next, &data),
            (Item::Event { id, event, data }, Expect::Suffix { next }) => {
                self.event(next, &id, event.as_deref(), &data)?;
                trace.note("observed", &[u64::from(sid.0), next]);
                *last_id = Some(id);
                Ok(Expect::Suffix { next: next + 1 })
            }
            (item, e) => Err(format!("{sid}: observed {item:?} while expecting {e:?}")),
        }
    }

    /// An in-band end of a live stream: only below the floor, or lagging too far.
    fn ended(&mut self, next: Seq, data: &str) -> Result<Expect, String> {
        let b = self.log.bounds(self.sid).expect("stream exists");
        let lagging = data.contains("\"lagging\"") && b.tail + 1 - next > self.lag_events_max;
        if next >= b.floor && !lagging {
            return Err(format!(
                "{}: stream ended ({data}) at {next}, floor {}, tail {}",
                self.sid, b.floor, b.tail
            ));
        }
        Ok(Expect::Done)
    }

    fn event(&mut self, next: Seq, id: &str, event: Option<&str>, data: &[u8]) -> Check {
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
        Ok(())
    }
}
