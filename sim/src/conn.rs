//! The node's side of one subscriber connection, driven as the per-core loop drives it: the
//! gateway's own `streams::sub::Sub` (its send window, refill, next send, send completions,
//! TX-timestamp and `SIOCOUTQ` confirmations, parking on disconnect) over a simulated kernel:
//! a send buffer that takes partial sends, completions processed steps later (ACK reports may
//! come first), ACK packets that arrive late, batched or reordered.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::Instant;

use gateway::streams::StreamKey;
use gateway::streams::sub::{Next, Sub, SubLimits, TxReport};
use gateway::uring::Vectored;
use log_store::Seq;

use crate::disk::Disk;
use crate::node::{Check, Node};
use crate::rng::Rng;
use crate::sse::Parser;
use crate::trace::Trace;

/// What the client must observe next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The suffix of the stream from `next`.
    Suffix { next: Seq },
    /// `event: truncated` first (an in-band truncation: `on_truncated=earliest|latest`), then
    /// the suffix from `then`.
    TruncatedThen { then: Seq },
    /// An explicit error, and nothing else.
    Error,
    /// An explicit error was observed: the connection ends.
    Done,
}

/// A disconnected subscriber's unconfirmed events.
pub type Parked = Vec<gateway::streams::window::ParkedEvent<gateway::uring::Bytes>>;

/// `SCM_TSTAMP_ACK << IORING_TIMESTAMP_TYPE_SHIFT`: an ACK timestamp's completion flags.
const TS_ACK_FLAGS: u32 = 2 << 17;
/// Far beyond any tail: `Sub::lag` against it tells the cursor.
const FAR: Seq = 1 << 62;

/// The limits a connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub sub: SubLimits,
    /// The kernel's send buffer: bytes sent and not yet ACKed at the TCP level.
    pub sndbuf_bytes: u64,
    pub record_bytes_max: u64,
}

impl ConnLimits {
    /// Bytes a connection may hold unconfirmed: what the send buffer holds, what was sent
    /// since the last confirmation (a few sends, each within the buffer), and a parked window
    /// served first (itself within `--send-bytes-max` and a record of unsent bytes when parked).
    pub fn held_bytes_max(&self) -> u64 {
        let parked = 2 * (self.sub.send_bytes_max as u64 + self.record_bytes_max) + 4096;
        parked + 8 * self.sndbuf_bytes
    }
}

/// One connection, node side and wire.
#[derive(Debug)]
pub struct Conn {
    pub key: StreamKey,
    pub sub: Sub,
    /// An explicit error was queued as the preamble: nothing is read from the log.
    pub refused: bool,
    /// A send the kernel took `n` bytes of, whose completion is not processed yet.
    inflight: Option<(Box<Vectored>, u64)>,
    /// Bytes the kernel took (completions processed).
    sent: u64,
    /// Ends of sends that asked for an ACK timestamp, not reported yet.
    ts_awaited: VecDeque<u64>,
    /// The node closed the connection (`Next::Close`).
    pub closed: bool,
    pub wire: VecDeque<u8>,
    pub parser: Parser,
    pub expect: Expect,
    /// Bytes the client received, and ACK packets on their way to the node's kernel.
    pub received: u64,
    pub acks: VecDeque<u64>,
    /// What the node's kernel knows the peer ACKed.
    tcp_acked: u64,
    /// Highest confirmation handed to the window: it may release nothing beyond it.
    confirmed: u64,
}

impl Conn {
    pub fn new(key: StreamKey, sub: Sub, refused: bool, expect: Expect) -> Conn {
        Conn {
            key,
            sub,
            refused,
            inflight: None,
            sent: 0,
            ts_awaited: VecDeque::new(),
            closed: false,
            wire: VecDeque::new(),
            parser: Parser::default(),
            expect,
            received: 0,
            acks: VecDeque::new(),
            tcp_acked: 0,
            confirmed: 0,
        }
    }

    /// One turn of the node for this connection: the pending send completion, or a refill
    /// (every event it queues must be durable) and the next send.
    pub fn pump(
        &mut self,
        node: &Node,
        disk: &Disk,
        now: Instant,
        rng: &mut Rng,
        lim: &ConnLimits,
        trace: &mut Trace,
    ) -> Check {
        if self.inflight.is_some() {
            return self.complete(now, &lim.sub);
        }
        if !self.refused {
            self.refill(node, disk, &lim.sub)?;
        }
        match self.sub.next_send(now, &lim.sub) {
            Next::Send(v) => {
                let room = lim.sndbuf_bytes - (self.sent - self.tcp_acked).min(lim.sndbuf_bytes);
                let n = rng.range(0, v.len().min(room));
                if n < v.len() {
                    trace.fault("partial_send", &[n, v.len()]);
                }
                let mut left = n as usize;
                for run in v.run_slices() {
                    let take = run.len().min(left);
                    self.wire.extend(&run[..take]);
                    left -= take;
                }
                self.inflight = Some((v, n));
            }
            Next::Close => self.closed = true,
            Next::Idle => {}
        }
        let held = self.sub.unconfirmed_bytes();
        if held > lim.held_bytes_max() {
            return Err(format!("a connection holds {held} bytes unconfirmed"));
        }
        Ok(())
    }

    fn refill(&mut self, node: &Node, disk: &Disk, lim: &SubLimits) -> Check {
        let before = FAR - self.sub.lag(FAR);
        let mut batch = log_store::ReadBatch::default();
        // An end (`event: truncated`: below the floor, or lagging) is checked by the client.
        let _ended = self.sub.refill(node.log(), lim, &mut batch);
        let after = FAR - self.sub.lag(FAR);
        for seq in before + 1..=after {
            if !node.is_durable(disk, self.key.1, seq) {
                return Err(format!(
                    "event {seq} of {} shown before it is durable",
                    self.key.1
                ));
            }
        }
        Ok(())
    }

    /// The send in flight completes; in `SIOCOUTQ` mode the completion may read the queue.
    pub fn complete(&mut self, now: Instant, lim: &SubLimits) -> Check {
        let Some((v, n)) = self.inflight.take() else {
            return Ok(());
        };
        let asked = v.asks_tx_ack();
        let outq = self
            .sub
            .outq_due(now, lim)
            .then(|| self.sent + n - self.tcp_acked);
        self.sub.on_sent(v, n, outq);
        self.sent += n;
        if outq.is_some() {
            self.confirmed = self.confirmed.max(self.tcp_acked);
        }
        if asked && n > 0 {
            self.ts_awaited.push_back(self.sent);
        }
        self.check_released()
    }

    /// The window released nothing the peer has not confirmed: its confirmed offset
    /// (`sent - unconfirmed`, read from the window itself, not from what the calls report)
    /// is within the highest confirmation it was handed.
    pub fn check_released(&self) -> Check {
        let released = self.sent - self.sub.unconfirmed_bytes();
        if released > self.confirmed {
            return Err(format!(
                "window released {released} bytes but the peer confirmed only {}",
                self.confirmed
            ));
        }
        Ok(())
    }

    /// ACK packets reach the node's kernel: the oldest, all at once, or a newer one first;
    /// then the TX timestamps they answer are reported (or the command fails: fallback).
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
        self.tcp_acked = self.tcp_acked.max(v);
        while let Some(&end) = self.ts_awaited.front() {
            if end > self.tcp_acked {
                break;
            }
            self.ts_awaited.pop_front();
            let res = if rng.chance(5) {
                -95
            } else {
                ((end - 1) as u32) as i32
            };
            match self.sub.on_tx_timestamp(res, TS_ACK_FLAGS) {
                TxReport::Ack(_) => self.confirmed = self.confirmed.max(end),
                TxReport::Fallback => trace.fault("tx_timestamp_fallback", &[]),
                TxReport::Other => {}
            }
        }
        self.check_released()
    }

    /// A tick: `SIOCOUTQ` when the subscriber wants it (no send in flight), keep-alives.
    pub fn tick(&mut self, now: Instant, lim: &SubLimits) -> Check {
        if self.inflight.is_some() {
            return Ok(());
        }
        if self.sub.wants_outq_poll(now) {
            self.sub.confirm_outq(self.sent - self.tcp_acked);
            self.confirmed = self.confirmed.max(self.tcp_acked);
        }
        self.sub.keepalive(now, lim);
        self.check_released()
    }

    /// A reset: the send in flight completes, the node may learn the final ACKs (a last
    /// `SIOCOUTQ`) or not, and takes what is unconfirmed for parking.
    pub fn close(
        &mut self,
        now: Instant,
        lim: &SubLimits,
        final_acks: bool,
    ) -> Result<Parked, String> {
        self.complete(now, lim)?;
        if final_acks {
            if let Some(v) = self.acks.drain(..).max() {
                self.tcp_acked = self.tcp_acked.max(v);
            }
            self.sub.confirm_outq(self.sent - self.tcp_acked);
            self.confirmed = self.confirmed.max(self.tcp_acked);
            self.check_released()?;
        }
        Ok(self.sub.take_parkable())
    }

    /// Whether the node closed and everything reached the client.
    pub fn finished(&self) -> bool {
        self.closed && self.wire.is_empty()
    }
}
