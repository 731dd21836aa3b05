//! A subscriber: its cursor in the log, its send window, how it learns ACKs (TX timestamps,
//! sampled, or `SIOCOUTQ`), and the decisions of its send path — refill from the log up to
//! the visible tail, what the next send carries and whether it asks for an ACK timestamp,
//! what a send or an ACK confirmed, keep-alives, lag and truncation. No I/O: the core passes
//! in the log, the time and `SIOCOUTQ` readings, and carries out the sends.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use log_store::{Log, ReadBatch, ReadError, Seq, StreamId};

use super::StreamKey;
use super::window::{ParkedEvent, Run, Window, acked_from_outq, acked_from_tskey};
use crate::proto::sse::{self, TruncatedReason};
use crate::uring::{Bytes, IOV_MAX_PER_SEND, Vectored};

/// How long a sampled TX ACK request may stay unanswered before the tick confirms by
/// `SIOCOUTQ` regardless.
const ACK_ANSWER_WAIT_MAX: Duration = Duration::from_secs(1);
/// `SCM_TSTAMP_ACK`: the timestamp type of an ACK report.
const SCM_TSTAMP_ACK: u32 = 2;
/// Where the timestamp type sits in a TX-timestamp completion's flags.
const IORING_TIMESTAMP_TYPE_SHIFT: u32 = 17;

/// The flags of the send path (units in names).
#[derive(Debug, Clone, Copy)]
pub struct SubLimits {
    pub lag_events_max: u64,
    pub send_bytes_max: usize,
    pub tx_ack_interval: Duration,
    pub keepalive: Duration,
}

/// How a subscriber learns which bytes the peer ACKed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    TxTimestamps,
    Outq,
}

/// Why a refill ended the stream with an in-band `event: truncated`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// More than `--lag-events-max` behind the tail.
    Lagging,
    /// The cursor fell below the retained floor.
    Truncated,
}

/// What the core does next with a subscriber that has no send in flight.
#[derive(Debug)]
pub enum Next {
    /// Send these runs (they come back with the completion: [`Sub::on_sent`]).
    Send(Box<Vectored>),
    /// Everything is sent and the stream is finished: close.
    Close,
    /// Nothing to send now.
    Idle,
}

/// What one send completion did (for the metrics, and whether to wait for `POLLOUT`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub bytes: u64,
    pub events_sent: usize,
    pub events_confirmed: usize,
    pub bytes_confirmed: u64,
    /// The kernel took less than the send carried: the socket is above `TCP_NOTSENT_LOWAT`.
    pub partial: bool,
}

/// What an ACK confirmation released.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Confirmed {
    pub events: usize,
    pub bytes: u64,
}

/// What a TX-timestamp completion was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxReport {
    /// An ACK timestamp, and what it confirmed.
    Ack(Confirmed),
    /// Another timestamp type: nothing to do.
    Other,
    /// The command failed: the subscriber now confirms by `SIOCOUTQ`.
    Fallback,
}

/// One subscriber connection's stream state.
#[derive(Debug)]
pub struct Sub {
    pub key: StreamKey,
    window: Window<Bytes>,
    /// Next sequence to read from the log.
    cursor: Seq,
    ack: AckMode,
    /// `event: truncated` queued (or the stream is complete): close once all is sent.
    finishing: bool,
    /// MCP: end the response after this sequence (the stream is complete).
    end_after: Option<Seq>,
    /// Whether its unconfirmed window is parked on disconnect (only where resumes use it).
    parkable: bool,
    last_write: Instant,
    /// TX ACK sampling (`--tx-ack-interval-ms`): when the last send asking for an ACK
    /// timestamp was submitted, whether the send in flight asks for one, and the window
    /// offset that request's timestamp will confirm (cleared once confirmed).
    ack_asked_at: Option<Instant>,
    ack_ask_in_send: bool,
    ack_awaited: Option<u64>,
    /// `Outq` mode: when a send completion last read `SIOCOUTQ` (sampled like TX ACK
    /// requests, `--tx-ack-interval-ms`: one reading confirms every byte before it).
    outq_read_at: Option<Instant>,
    /// A send is in flight (its memory, a [`Vectored`], is the driver's until it completes;
    /// between sends the subscriber holds none: `Vectored::take`/`give`, a per-core pool).
    sending: bool,
    /// A read-ahead just completed: the next send goes without checking residency again.
    prefetched: bool,
    /// When the subscriber's token expires (seconds since the Unix epoch): the stream is
    /// ended then with an in-band `event: expired`.
    expires_unix_secs: Option<u64>,
}

/// Bytes of a cold log segment the next send would point at: read them ahead first.
#[derive(Debug)]
pub struct ColdRun {
    pub slice: log_store::LogSlice,
    /// Where the run starts in the slice, and its length.
    pub off: usize,
    pub len: usize,
}

/// The stream id of a subscriber whose stream does not exist yet (cluster mode: a stream is
/// created where its first event is applied). It sends its preamble and keep-alives, reads
/// nothing, and is moved to the real id when the stream is created (its cursor is 1). Never a
/// real id: the log refuses to create id `u32::MAX`.
pub const PENDING_STREAM: StreamId = StreamId(u32::MAX);

impl Sub {
    /// A subscriber whose window starts with `preamble`, then the `aligned` parked events (an
    /// aligned resume) or the log from `cursor`.
    pub fn new(
        key: StreamKey,
        cursor: Seq,
        ack: AckMode,
        preamble: Vec<u8>,
        aligned: Option<Vec<ParkedEvent<Bytes>>>,
        now: Instant,
    ) -> Sub {
        let mut window = Window::new();
        window.push_bytes(Run::whole(Bytes::Owned(preamble.into())));
        match aligned {
            Some(evs) => window.push_parked(evs),
            None => window.expect_next(cursor),
        }
        Sub {
            key,
            window,
            cursor,
            ack,
            finishing: false,
            end_after: None,
            parkable: true,
            last_write: now,
            ack_asked_at: None,
            ack_ask_in_send: false,
            ack_awaited: None,
            outq_read_at: None,
            sending: false,
            prefetched: false,
            expires_unix_secs: None,
        }
    }

    /// The first run of the next send that lies in a segment other than the log's active one
    /// (`active_segment`) and whose pages `resident` says are not all in memory — a replay
    /// from cold history. `None` right after a read-ahead (the send goes then).
    pub fn cold_run(
        &mut self,
        active_segment: u64,
        lim: &SubLimits,
        resident: impl Fn(&[u8]) -> bool,
    ) -> Option<ColdRun> {
        if std::mem::take(&mut self.prefetched) {
            return None;
        }
        let mut cold = None;
        self.window
            .for_each_unsent_run(IOV_MAX_PER_SEND, lim.send_bytes_max, |c, off, len| {
                if cold.is_some() {
                    return;
                }
                if let Bytes::Log(s) = c
                    && s.segment_number() != active_segment
                    && !resident(&s.as_bytes()[off..off + len])
                {
                    cold = Some(ColdRun {
                        slice: s.clone(),
                        off,
                        len,
                    });
                }
            });
        cold
    }

    /// A read-ahead of a cold run completed.
    pub fn on_prefetched(&mut self) {
        self.prefetched = true;
    }

    /// Ends the response after `seq` (an MCP stream that is complete).
    pub fn end_after(&mut self, seq: Seq) {
        self.end_after = Some(seq);
    }

    /// The subscriber's credentials expire at `exp` (seconds since the Unix epoch).
    pub fn expire_at(&mut self, exp: Option<u64>) {
        self.expires_unix_secs = exp;
    }

    /// Ends the stream in-band if its credentials expired by `now_unix_secs`: an
    /// `event: expired` notice (no `id:`, so the client's Last-Event-ID stays on the last event
    /// it got) goes after what is already queued, then the connection closes. The client comes
    /// back with a fresh token and its Last-Event-ID and misses nothing. True if it ended now.
    pub fn expire(&mut self, now_unix_secs: u64) -> bool {
        if self.finishing || self.expires_unix_secs.is_none_or(|e| now_unix_secs < e) {
            return false;
        }
        let json = serde_json::json!({
            "error": "token_expired",
            "exp": self.expires_unix_secs,
            "message": "the subscription's token expired: reconnect with a fresh token and \
                        Last-Event-ID",
        });
        self.window.push_bytes(Run::whole(Bytes::Owned(
            format!("event: expired\ndata: {json}\n\n")
                .into_bytes()
                .into(),
        )));
        self.finishing = true;
        true
    }

    /// Never park this subscriber's window (its resumes replay from the log).
    pub fn never_park(&mut self) {
        self.parkable = false;
    }

    /// Bytes handed to the kernel since the subscription began.
    pub fn bytes_sent(&self) -> u64 {
        self.window.sent()
    }

    #[cfg(test)]
    pub fn ack_mode(&self) -> AckMode {
        self.ack
    }

    pub fn unconfirmed_bytes(&self) -> u64 {
        self.window.unconfirmed_bytes()
    }

    /// Bytes of the window the peer confirmed (released).
    pub fn acked_bytes(&self) -> u64 {
        self.window.acked()
    }

    /// Events between the cursor and `tail` (how far behind the tail the subscriber is).
    pub fn lag(&self, tail: Seq) -> u64 {
        tail.saturating_sub(self.cursor.saturating_sub(1))
    }

    /// Refills the window from the log (up to the visible tail and `--send-bytes-max` of
    /// unsent bytes), or ends the stream in-band when it lags too far or fell below the floor.
    /// `batch` is scratch memory for the read (left empty of slices).
    pub fn refill(&mut self, log: &Log, lim: &SubLimits, batch: &mut ReadBatch) -> Option<Ended> {
        if self.finishing || self.key.1 == PENDING_STREAM {
            return None;
        }
        let b = log.bounds(self.key.1).expect("subscribed stream exists");
        let unsent = self.window.unsent_bytes() as usize;
        if self.lag(b.tail) > lim.lag_events_max {
            let json = sse::truncated_json(TruncatedReason::Lagging, self.cursor, b.floor, b.tail);
            self.finish_with(&json);
            return Some(Ended::Lagging);
        }
        if unsent >= lim.send_bytes_max || self.cursor > b.visible_tail {
            return None;
        }
        match log.read_into(self.key.1, self.cursor, lim.send_bytes_max - unsent, batch) {
            Ok(()) => {
                if !batch.record_lens.is_empty() {
                    assert_eq!(batch.first, self.cursor, "log read starts at the cursor");
                    let chunks = batch.slices.drain(..).map(Bytes::Log);
                    self.window
                        .push_events(batch.first, chunks, &batch.record_lens);
                    self.cursor = batch.last + 1;
                }
                None
            }
            Err(ReadError::Truncated {
                requested,
                floor,
                tail,
            }) => {
                let json = sse::truncated_json(TruncatedReason::Truncated, requested, floor, tail);
                self.finish_with(&json);
                Some(Ended::Truncated)
            }
            Err(e) => panic!("read of a subscribed stream failed: {e:?}"),
        }
    }

    fn finish_with(&mut self, json: &str) {
        self.window
            .push_bytes(Run::whole(Bytes::Owned(sse::truncated_event(json).into())));
        self.finishing = true;
    }

    /// The next send: every unsent byte (≤ 1024 runs, ≤ `--send-bytes-max`), asking for an
    /// ACK timestamp only when the previous request was answered and the interval passed.
    pub fn next_send(&mut self, now: Instant, lim: &SubLimits) -> Next {
        if self.end_after.is_some_and(|e| self.cursor > e) {
            self.finishing = true;
        }
        if self.window.unsent_bytes() == 0 {
            return if self.finishing {
                Next::Close
            } else {
                Next::Idle
            };
        }
        assert!(!self.sending, "no send in flight");
        self.sending = true;
        let mut v = Vectored::take();
        self.window
            .for_each_unsent_run(IOV_MAX_PER_SEND, lim.send_bytes_max, |c, off, len| {
                v.push(c.clone(), off, len);
            });
        self.settle_ack_request();
        self.ack_ask_in_send = self.ack == AckMode::TxTimestamps
            && self.ack_awaited.is_none()
            && self
                .ack_asked_at
                .is_none_or(|t| now.duration_since(t) >= lim.tx_ack_interval);
        if self.ack_ask_in_send {
            self.ack_asked_at = Some(now);
        }
        v.ask_tx_ack(self.ack_ask_in_send);
        self.last_write = now;
        Next::Send(v)
    }

    /// In `Outq` mode, whether this send completion reads `SIOCOUTQ` to confirm what the peer
    /// ACKed: at most once per `--tx-ack-interval-ms` (an `ioctl` per delivery costs more than
    /// a sampled one; what it would have confirmed is confirmed by the next reading, the tick's
    /// or the disconnect's). Never in `TxTimestamps` mode.
    pub fn outq_due(&mut self, now: Instant, lim: &SubLimits) -> bool {
        if self.ack != AckMode::Outq
            || self
                .outq_read_at
                .is_some_and(|t| now.duration_since(t) < lim.tx_ack_interval)
        {
            return false;
        }
        self.outq_read_at = Some(now);
        true
    }

    /// A send completed: the kernel took `n` bytes. `outq`: a `SIOCOUTQ` reading taken now
    /// (in `Outq` mode), which confirms what the peer ACKed.
    pub fn on_sent(&mut self, v: Box<Vectored>, n: u64, outq: Option<u64>) -> Sent {
        let requested = v.len();
        let (events_sent, mut events_confirmed) = self.window.on_sent(n);
        if std::mem::take(&mut self.ack_ask_in_send) && n > 0 {
            // The timestamp key is the last byte this send queued (a send that queued
            // nothing stamps nothing).
            self.ack_awaited = Some(self.window.sent());
        }
        let acked_before = self.window.acked();
        if let Some(q) = outq {
            events_confirmed += self.window.on_acked(acked_from_outq(self.window.sent(), q));
        }
        Vectored::give(v);
        self.sending = false;
        Sent {
            bytes: n,
            events_sent,
            events_confirmed,
            bytes_confirmed: self.window.acked() - acked_before,
            partial: n < requested,
        }
    }

    /// A TX-timestamp completion. A failed command (unsupported here, or ended) switches the
    /// subscriber to `SIOCOUTQ` accounting.
    pub fn on_tx_timestamp(&mut self, res: i32, flags: u32) -> TxReport {
        if res < 0 {
            self.ack = AckMode::Outq;
            return TxReport::Fallback;
        }
        if flags >> IORING_TIMESTAMP_TYPE_SHIFT != SCM_TSTAMP_ACK {
            return TxReport::Other;
        }
        let acked = acked_from_tskey(res as u32, self.window.queued());
        TxReport::Ack(self.confirm(acked))
    }

    /// Releases what a `SIOCOUTQ` reading (`write_seq - snd_una`) says the peer ACKed.
    pub fn confirm_outq(&mut self, outq: u64) -> Confirmed {
        self.confirm(acked_from_outq(self.window.sent(), outq))
    }

    fn confirm(&mut self, acked: u64) -> Confirmed {
        let before = self.window.acked();
        let events = self.window.on_acked(acked);
        Confirmed {
            events,
            bytes: self.window.acked() - before,
        }
    }

    /// Forgets the awaited TX ACK request once the window is confirmed up to its key.
    fn settle_ack_request(&mut self) {
        if self
            .ack_awaited
            .is_some_and(|end| self.window.acked() >= end)
        {
            self.ack_awaited = None;
        }
    }

    /// At a tick: whether to confirm by `SIOCOUTQ` now (`Outq` mode, or sampled timestamps
    /// with no request outstanding, or one unanswered for a second) — only when something is
    /// unconfirmed.
    pub fn wants_outq_poll(&mut self, now: Instant) -> bool {
        self.settle_ack_request();
        let stale = self
            .ack_asked_at
            .is_some_and(|t| now.duration_since(t) >= ACK_ANSWER_WAIT_MAX);
        let poll = self.ack == AckMode::Outq || self.ack_awaited.is_none() || stale;
        poll && self.window.unconfirmed_bytes() > 0
    }

    /// At a tick with no send in flight: a `:` keep-alive comment after `--keepalive-secs`
    /// without a write.
    pub fn keepalive(&mut self, now: Instant, lim: &SubLimits) {
        if self.window.unsent_bytes() == 0 && now.duration_since(self.last_write) >= lim.keepalive {
            self.window
                .push_bytes(Run::whole(Bytes::Static(sse::KEEPALIVE)));
        }
    }

    /// On disconnect: the unconfirmed events to park (none if this subscriber is not parkable).
    pub fn take_parkable(&mut self) -> Vec<ParkedEvent<Bytes>> {
        let events = self.window.take_events();
        if self.parkable { events } else { Vec::new() }
    }
}

#[cfg(test)]
#[path = "sub_tests.rs"]
mod tests;
