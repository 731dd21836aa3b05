//! The subscriber send window: a pure state machine over byte offsets and sequence numbers.
//!
//! A subscriber connection's outgoing byte stream is numbered from 0 (the first byte written
//! after TX timestamping was enabled on the socket). The window holds, in order, the byte runs
//! queued for that connection (pointers into shared chunks — mapped log slices — never
//! copies) and the events they carry, each with its `[start, end)` byte range. Three offsets
//! advance monotonically: `queued >= sent >= acked`.
//!
//! - `sent` moves on a send completion (the kernel took the bytes: *not* delivery).
//! - `acked` moves only on a confirmed peer ACK (TX_ACK timestamp key or `SIOCOUTQ`
//!   accounting), and is clamped to `sent` so a run that an in-flight send points into is
//!   never released.
//! - An event leaves the window only when `acked >= end`: eviction is tied to confirmed
//!   completions, never to the send result.
//!
//! After a disconnect the unconfirmed events ([`Window::take_events`]) are parked for
//! `--resume-grace-secs`; the resume planner may serve them (Aligned) only when their head is
//! exactly N+1. This module knows nothing of sockets, io_uring or the log.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

/// Shared, immutable bytes a run points into (a mapped log slice, a static preamble, ...).
/// `bytes()` must return the same address and length for the chunk's whole lifetime.
pub trait Chunk: Clone {
    fn bytes(&self) -> &[u8];
}

/// A run of bytes: `chunk.bytes()[off..off + len]`.
#[derive(Debug, Clone)]
pub struct Run<C> {
    pub chunk: C,
    pub off: usize,
    pub len: usize,
}

impl<C: Chunk> Run<C> {
    /// The whole chunk.
    pub fn whole(chunk: C) -> Self {
        let len = chunk.bytes().len();
        Run { chunk, off: 0, len }
    }

    /// The bytes of the run.
    #[cfg(test)]
    pub fn bytes(&self) -> &[u8] {
        &self.chunk.bytes()[self.off..self.off + self.len]
    }
}

/// One event in the window: its sequence and byte range in the connection's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WinEvent {
    pub seq: u64,
    pub start: u64,
    pub end: u64,
}

/// The window of one subscriber connection.
#[derive(Debug)]
pub struct Window<C> {
    runs: VecDeque<Run<C>>,
    /// Byte offset of the first byte of `runs[0]`.
    runs_start: u64,
    /// Index in `runs` of the first run not wholly sent (`runs.len()` if none), and the byte
    /// offset where it starts: a send starts there without walking the sent, unconfirmed runs
    /// before it (there are many while ACKs are sampled).
    unsent_run: usize,
    unsent_run_start: u64,
    events: VecDeque<WinEvent>,
    /// Index in `events` of the first event not wholly sent (`events.len()` if none).
    unsent_event: usize,
    queued: u64,
    sent: u64,
    acked: u64,
    /// Highest ACK reported, possibly ahead of `sent` (a send CQE not yet processed).
    ack_hint: u64,
    /// Sequence of the last event ever pushed (0 = none), for the contiguity assertion.
    last_pushed: u64,
}

impl<C: Chunk> Default for Window<C> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Chunk> Window<C> {
    pub fn new() -> Self {
        Window {
            runs: VecDeque::new(),
            runs_start: 0,
            unsent_run: 0,
            unsent_run_start: 0,
            events: VecDeque::new(),
            unsent_event: 0,
            queued: 0,
            sent: 0,
            acked: 0,
            ack_hint: 0,
            last_pushed: 0,
        }
    }

    /// Queues bytes that are not an event (response head, `retry:`, keep-alive comments,
    /// `event: truncated`).
    pub fn push_bytes(&mut self, run: Run<C>) {
        if run.len == 0 {
            return;
        }
        self.queued += run.len as u64;
        self.runs.push_back(run);
    }

    /// Queues events `first..first + record_lens.len()` whose framed bytes are exactly the
    /// concatenation of `chunks` (as the log returns them, adjacent records coalesced). Each
    /// chunk holds whole records: ACKs release runs whole, and parking cuts runs at event
    /// boundaries only.
    ///
    /// Panics if the bytes and lengths disagree or the sequence is not contiguous with the
    /// previous push: either would be a silent gap or duplicate.
    pub fn push_events(
        &mut self,
        first: u64,
        chunks: impl IntoIterator<Item = C>,
        record_lens: &[u32],
    ) {
        if self.last_pushed != 0 {
            assert_eq!(
                first,
                self.last_pushed + 1,
                "window events must be contiguous"
            );
        }
        let mut start = self.queued;
        for (i, &len) in record_lens.iter().enumerate() {
            // An empty event would sit at `sent` without ever being sent by a completion, and
            // the unsent cursors assume every event ends after its start. (Log records always
            // carry at least their `id:` line.)
            assert!(len > 0, "an event has bytes");
            let end = start + u64::from(len);
            self.events.push_back(WinEvent {
                seq: first + i as u64,
                start,
                end,
            });
            start = end;
        }
        if !record_lens.is_empty() {
            self.last_pushed = first + record_lens.len() as u64 - 1;
        }
        for c in chunks {
            self.push_bytes(Run::whole(c));
        }
        // Checked before anything of it can be sent (the caller sends after pushing).
        assert_eq!(
            self.queued, start,
            "record lengths must cover the chunks exactly"
        );
    }

    /// Queues events taken from a parked window (an Aligned resume), rebased onto this
    /// connection's byte stream.
    pub fn push_parked(&mut self, parked: Vec<ParkedEvent<C>>) {
        for ev in parked {
            if self.last_pushed != 0 {
                assert_eq!(
                    ev.seq,
                    self.last_pushed + 1,
                    "window events must be contiguous"
                );
            }
            let len: u64 = ev.runs.iter().map(|r| r.len as u64).sum();
            assert!(len > 0, "an event has bytes");
            self.events.push_back(WinEvent {
                seq: ev.seq,
                start: self.queued,
                end: self.queued + len,
            });
            self.last_pushed = ev.seq;
            for r in ev.runs {
                self.push_bytes(r);
            }
        }
    }

    /// Declares that the next event pushed must be `seq` (after a resume that skipped ahead).
    pub fn expect_next(&mut self, seq: u64) {
        assert!(self.events.is_empty() || self.last_pushed + 1 == seq);
        self.last_pushed = seq.saturating_sub(1);
    }

    /// Bytes queued but not yet taken by the kernel.
    pub fn unsent_bytes(&self) -> u64 {
        self.queued - self.sent
    }

    /// Bytes taken by the kernel but not confirmed by the peer's ACK.
    pub fn unconfirmed_bytes(&self) -> u64 {
        self.sent - self.acked
    }

    pub fn sent(&self) -> u64 {
        self.sent
    }

    pub fn acked(&self) -> u64 {
        self.acked
    }

    pub fn queued(&self) -> u64 {
        self.queued
    }

    /// First unconfirmed event.
    #[cfg(test)]
    pub fn head(&self) -> Option<u64> {
        self.events.front().map(|e| e.seq)
    }

    #[cfg(test)]
    /// The unsent bytes from `sent`, as at most `iov_max` slices totalling at most `bytes_max`
    /// (the first slice is cut to `bytes_max` if it alone exceeds it). Calls `f` per slice.
    pub fn for_each_unsent(&self, iov_max: usize, bytes_max: usize, mut f: impl FnMut(&[u8])) {
        self.for_each_unsent_run(iov_max, bytes_max, |c, off, len| {
            f(&c.bytes()[off..off + len]);
        });
    }

    /// Like [`Window::for_each_unsent`], naming each slice as `(chunk, offset, length)` in
    /// the chunk, so a caller can hold the chunk for as long as the kernel reads the slice.
    pub fn for_each_unsent_run(
        &self,
        iov_max: usize,
        bytes_max: usize,
        mut f: impl FnMut(&C, usize, usize),
    ) {
        let (mut n, mut bytes) = (0usize, 0usize);
        let mut skip = (self.sent - self.unsent_run_start) as usize;
        for run in self.runs.range(self.unsent_run..) {
            debug_assert!(skip < run.len, "the first unsent run holds unsent bytes");
            let take = (run.len - skip).min(bytes_max - bytes);
            if take == 0 || n == iov_max {
                return;
            }
            f(&run.chunk, run.off + skip, take);
            n += 1;
            bytes += take;
            skip = 0;
        }
    }

    /// The kernel took `n` more bytes (a send completion's result). Returns how many events
    /// this send completed (their last byte is now sent), and how many an ACK reported
    /// earlier (ahead of this completion) now confirms.
    pub fn on_sent(&mut self, n: u64) -> (usize, usize) {
        assert!(
            self.sent + n <= self.queued,
            "kernel took more than was queued"
        );
        self.sent += n;
        while let Some(r) = self.runs.get(self.unsent_run)
            && self.unsent_run_start + r.len as u64 <= self.sent
        {
            self.unsent_run_start += r.len as u64;
            self.unsent_run += 1;
        }
        let first = self.unsent_event;
        while self
            .events
            .get(self.unsent_event)
            .is_some_and(|e| e.end <= self.sent)
        {
            self.unsent_event += 1;
        }
        let hint = self.ack_hint;
        (self.unsent_event - first, self.apply_ack(hint))
    }

    /// The peer confirmed bytes `[0, acked_total)`. Returns how many events this confirmed.
    /// Values not ahead of the current ACK are ignored (ACKs may be reported out of order).
    pub fn on_acked(&mut self, acked_total: u64) -> usize {
        self.ack_hint = self.ack_hint.max(acked_total);
        self.apply_ack(self.ack_hint)
    }

    fn apply_ack(&mut self, hint: u64) -> usize {
        let acked = hint.min(self.sent);
        if acked <= self.acked {
            return 0;
        }
        self.acked = acked;
        let mut confirmed = 0;
        // What is confirmed was sent (`acked <= sent`): it lies before both unsent cursors.
        while self.events.front().is_some_and(|e| e.end <= acked) {
            self.events.pop_front();
            self.unsent_event -= 1;
            confirmed += 1;
        }
        while let Some(r) = self.runs.front() {
            let end = self.runs_start + r.len as u64;
            if end > acked {
                break;
            }
            self.runs_start = end;
            self.runs.pop_front();
            self.unsent_run -= 1;
        }
        confirmed
    }

    /// Takes the unconfirmed events with their byte runs (for parking on disconnect).
    pub fn take_events(&mut self) -> Vec<ParkedEvent<C>> {
        let mut out = Vec::with_capacity(self.events.len());
        for ev in &self.events {
            out.push(ParkedEvent {
                seq: ev.seq,
                runs: self.runs_between(ev.start, ev.end),
            });
        }
        self.events.clear();
        self.unsent_event = 0;
        out
    }

    fn runs_between(&self, start: u64, end: u64) -> Vec<Run<C>> {
        let mut out = Vec::new();
        let mut pos = self.runs_start;
        for r in &self.runs {
            let (rs, re) = (pos, pos + r.len as u64);
            pos = re;
            if re <= start {
                continue;
            }
            if rs >= end {
                break;
            }
            let from = start.max(rs);
            let to = end.min(re);
            out.push(Run {
                chunk: r.chunk.clone(),
                off: r.off + (from - rs) as usize,
                len: (to - from) as usize,
            });
        }
        debug_assert_eq!(
            out.iter().map(|r| r.len as u64).sum::<u64>(),
            end - start,
            "runs must cover every unconfirmed event"
        );
        out
    }
}

/// An unconfirmed event kept after a disconnect: its sequence and exact framed bytes.
#[derive(Debug, Clone)]
pub struct ParkedEvent<C> {
    pub seq: u64,
    pub runs: Vec<Run<C>>,
}

/// Rebuilds the 64-bit byte offset of the last byte of an ACKed send from the 32-bit TX
/// timestamp key (`SOF_TIMESTAMPING_OPT_ID_TCP`: offset of the send's last byte, wrapping at
/// 2^32) and returns the number of bytes the ACK confirms (`offset + 1`). `queued` bounds the
/// answer from above (the kernel cannot have written more than was ever queued).
pub fn acked_from_tskey(key: u32, queued: u64) -> u64 {
    if queued == 0 {
        return 0;
    }
    let top = queued - 1;
    let mut k = (top & !0xffff_ffff) | u64::from(key);
    if k > top {
        if k < 1 << 32 {
            return 0;
        }
        k -= 1 << 32;
    }
    k + 1
}

/// Bytes confirmed by the peer from `SIOCOUTQ` accounting: what we know the kernel took minus
/// what it still holds (unsent + unacknowledged). Conservative when a send is in flight.
pub fn acked_from_outq(sent: u64, outq: u64) -> u64 {
    sent.saturating_sub(outq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::rc::Rc;

    #[derive(Clone, Debug)]
    struct B(Rc<Vec<u8>>);
    impl Chunk for B {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
    }
    fn b(s: &[u8]) -> B {
        B(Rc::new(s.to_vec()))
    }
    fn unsent(w: &Window<B>) -> Vec<u8> {
        let mut v = Vec::new();
        w.for_each_unsent(usize::MAX, usize::MAX, |s| v.extend_from_slice(s));
        v
    }

    #[test]
    fn eviction_only_on_ack_not_on_send() {
        let mut w: Window<B> = Window::new();
        w.push_bytes(Run::whole(b(b"HEAD")));
        w.push_events(1, vec![b(b"aaabb"), b(b"c")], &[3, 2, 1]);
        assert_eq!(unsent(&w), b"HEADaaabbc");
        assert_eq!(w.on_sent(10), (3, 0), "three events sent, none confirmed");
        assert_eq!(w.head(), Some(1), "a send completion confirms nothing");
        assert_eq!(w.on_acked(6), 0, "event 1 ends at 7");
        assert_eq!(w.on_acked(7), 1);
        assert_eq!(w.head(), Some(2));
        assert_eq!(w.on_acked(5), 0, "stale ACK ignored");
        assert_eq!(w.on_acked(10), 2);
        assert_eq!(w.head(), None);
    }

    #[test]
    fn ack_ahead_of_send_completion_is_clamped() {
        let mut w: Window<B> = Window::new();
        w.push_events(1, vec![b(b"aabb")], &[2, 2]);
        assert_eq!(w.on_acked(4), 0, "nothing sent yet");
        assert_eq!(w.acked(), 0);
        assert_eq!(w.on_sent(2), (1, 1));
        assert_eq!(w.acked(), 2);
        assert_eq!(w.head(), Some(2));
        w.on_sent(2);
        assert_eq!(w.head(), None);
    }

    #[test]
    fn partial_sends_continue_from_exact_byte() {
        let mut w: Window<B> = Window::new();
        w.push_events(1, vec![b(b"abc"), b(b"defg")], &[3, 4]);
        w.on_sent(4);
        assert_eq!(unsent(&w), b"efg");
        let mut parts = Vec::new();
        w.for_each_unsent(1, 2, |s| parts.push(s.to_vec()));
        assert_eq!(parts, vec![b"ef".to_vec()]);
    }

    #[test]
    fn parked_events_rebase_exactly() {
        let mut w: Window<B> = Window::new();
        w.push_bytes(Run::whole(b(b"H")));
        w.push_events(5, vec![b(b"xxyyyz")], &[2, 3, 1]);
        w.on_sent(7);
        w.on_acked(3); // event 5 confirmed
        let parked = w.take_events();
        assert_eq!(parked.iter().map(|p| p.seq).collect::<Vec<_>>(), vec![6, 7]);
        let mut w2: Window<B> = Window::new();
        w2.push_bytes(Run::whole(b(b"NEWHEAD")));
        w2.push_parked(parked);
        w2.push_events(8, vec![b(b"q")], &[1]);
        assert_eq!(unsent(&w2), b"NEWHEADyyyzq");
        assert_eq!(w2.head(), Some(6));
    }

    #[test]
    #[should_panic(expected = "contiguous")]
    fn gap_is_an_assertion() {
        let mut w: Window<B> = Window::new();
        w.push_events(1, vec![b(b"a")], &[1]);
        w.push_events(3, vec![b(b"a")], &[1]);
    }

    #[test]
    #[should_panic(expected = "cover the chunks exactly")]
    fn lengths_not_covering_the_bytes_is_an_assertion() {
        let mut w: Window<B> = Window::new();
        w.push_events(1, vec![b(b"abc"), b(b"d")], &[2, 1]);
    }

    #[test]
    fn tskey_reconstruction() {
        assert_eq!(acked_from_tskey(9, 10), 10);
        assert_eq!(acked_from_tskey(4, 10), 5);
        assert_eq!(acked_from_tskey(20, 10), 0, "key beyond anything queued");
        let q = (1u64 << 32) + 100;
        assert_eq!(acked_from_tskey(50, q), (1 << 32) + 51);
        assert_eq!(acked_from_tskey(u32::MAX, q), 1 << 32);
        assert_eq!(acked_from_outq(100, 30), 70);
        assert_eq!(acked_from_outq(10, 30), 0);
    }

    proptest! {
        /// Random pushes, partial sends and ACKs: events leave strictly in order, only when
        /// the ACK covers their last byte, and the parked remainder is byte-exact.
        #[test]
        fn model(ops in proptest::collection::vec((0u8..4, 1usize..50), 1..200)) {
            let mut w: Window<B> = Window::new();
            let mut stream: Vec<u8> = Vec::new();
            let mut ends: Vec<(u64, u64, u64)> = Vec::new(); // (seq, start, end)
            let mut next_seq = 1u64;
            let mut confirmed = 0u64;
            let mut events_sent = 0u64;
            let mut hint = 0u64;
            for (op, n) in ops {
                match op {
                    0 => {
                        let lens: Vec<u32> = (0..(n % 4 + 1)).map(|i| (i as u32 % 3) + 1).collect();
                        let bytes: Vec<u8> = (0..lens.iter().sum::<u32>()).map(|i| (next_seq as u8).wrapping_add(i as u8)).collect();
                        let mut s = stream.len() as u64;
                        for (i, &l) in lens.iter().enumerate() {
                            ends.push((next_seq + i as u64, s, s + u64::from(l)));
                            s += u64::from(l);
                        }
                        stream.extend_from_slice(&bytes);
                        w.push_events(next_seq, vec![b(&bytes)], &lens);
                        next_seq += lens.len() as u64;
                    }
                    1 => {
                        let k = (n as u64).min(w.unsent_bytes());
                        let (s, c) = w.on_sent(k);
                        events_sent += s as u64;
                        confirmed += c as u64;
                        let expect = ends.iter().filter(|e| e.2 <= w.sent()).count() as u64;
                        prop_assert_eq!(events_sent, expect, "events sent counted exactly once");
                    }
                    2 => {
                        // A real ACK never covers bytes the kernel was not given; a TX
                        // timestamp may arrive before its send's completion (ahead of `sent`).
                        let target = (w.acked() + n as u64).min(w.queued());
                        confirmed += w.on_acked(target) as u64;
                        hint = hint.max(target);
                    }
                    _ => {
                        w.push_bytes(Run::whole(b(b":\n")));
                        stream.extend_from_slice(b":\n");
                    }
                }
                let upto = hint.min(w.sent());
                let expect = ends.iter().filter(|e| e.2 <= upto).count() as u64;
                prop_assert_eq!(confirmed, expect, "confirmed exactly what was sent and ACKed");
                let mut u = Vec::new();
                w.for_each_unsent(usize::MAX, usize::MAX, |s| u.extend_from_slice(s));
                prop_assert_eq!(&u[..], &stream[w.sent() as usize..]);
            }
            let head = w.head();
            let parked = w.take_events();
            let left: Vec<_> = ends.iter().filter(|e| e.2 > w.acked()).collect();
            prop_assert_eq!(parked.len(), left.len());
            prop_assert_eq!(head, left.first().map(|e| e.0));
            for (p, e) in parked.iter().zip(left) {
                prop_assert_eq!(p.seq, e.0);
                let bytes: Vec<u8> = p.runs.iter().flat_map(|r| r.bytes().to_vec()).collect();
                prop_assert_eq!(&bytes[..], &stream[e.1 as usize..e.2 as usize]);
            }
        }
    }

    proptest! {
        /// The disconnect/resume seam, simulated end to end without sockets: a connection
        /// queues events, the kernel takes some (`sent`), the peer ACKs some (`acked`), the
        /// client has parsed a prefix of what was ACKed (a client can only read delivered
        /// bytes) and disconnects; the window is parked and the log-store planner decides.
        /// Whatever the plan, window bytes + log bytes from the plan equal the log from N+1,
        /// and the window is used exactly when its head is N+1.
        #[test]
        fn resume_seam_is_gap_free(
            lens in proptest::collection::vec(1u32..40, 1..40),
            groups in proptest::collection::vec(1usize..5, 1..40),
            sent_frac in 0u32..=100, acked_frac in 0u32..=100, read_frac in 0u32..=100,
            read_all_acked in proptest::bool::ANY,
        ) {
            use log_store::{Bounds, Epoch, EventId, ResumeInput, ResumePlan, StreamId, WindowView};
            let m = lens.len() as u64;
            let rec = |seq: u64| vec![seq as u8; lens[seq as usize - 1] as usize];
            let log_from = |from: u64| -> Vec<u8> { (from..=m).flat_map(rec).collect() };
            let mut w: Window<B> = Window::new();
            let head_bytes = b"HTTP/1.1 200 OK\r\n\r\nretry: 1000\n\n";
            w.push_bytes(Run::whole(b(head_bytes)));
            let mut seq = 1u64;
            for g in groups.iter().cycle() {
                if seq > m {
                    break;
                }
                let last = (seq + *g as u64 - 1).min(m);
                let bytes: Vec<u8> = (seq..=last).flat_map(rec).collect();
                let lens: Vec<u32> = (seq..=last).map(|s| lens[s as usize - 1]).collect();
                w.push_events(seq, vec![b(&bytes)], &lens);
                seq = last + 1;
            }
            let sent = w.queued() * u64::from(sent_frac) / 100;
            w.on_sent(sent);
            let acked = sent * u64::from(acked_frac) / 100;
            w.on_acked(acked);
            // Half the cases: the client read everything that was ACKed (alignment provable).
            let read = if read_all_acked { acked } else { acked * u64::from(read_frac) / 100 };
            // The client's last complete event within `read` bytes.
            let mut end = head_bytes.len() as u64;
            let mut n = 0u64;
            for s in 1..=m {
                end += u64::from(lens[s as usize - 1]);
                if end > read {
                    break;
                }
                n = s;
            }
            let parked = w.take_events();
            let (epoch, stream) = (Epoch(7), StreamId(0));
            let window = (!parked.is_empty()).then(|| WindowView {
                epoch,
                stream,
                head: parked[0].seq,
                last: parked[parked.len() - 1].seq,
                contiguous: true,
            });
            let plan = log_store::plan_resume(&ResumeInput {
                log_epoch: epoch,
                stream,
                bounds: Bounds { floor: 1, tail: m, visible_tail: m },
                requested: EventId { epoch, stream, seq: n },
                window,
                known_epochs: &[],
            });
            let aligned_expected = n < m && window.is_some_and(|wv| wv.head == n + 1);
            prop_assert_eq!(matches!(plan, ResumePlan::Aligned { .. }), aligned_expected);
            let served: Vec<u8> = match plan {
                ResumePlan::Aligned { window_from, window_to, then_log_from } => {
                    prop_assert_eq!(window_from, n + 1);
                    let mut v: Vec<u8> = parked
                        .iter()
                        .filter(|e| e.seq >= window_from && e.seq <= window_to)
                        .flat_map(|e| e.runs.iter().flat_map(|r| r.bytes().to_vec()))
                        .collect();
                    v.extend(log_from(then_log_from));
                    v
                }
                ResumePlan::Replay { from } | ResumePlan::UpToDate { from } => log_from(from),
                other => return Err(TestCaseError::fail(format!("unexpected plan {other:?}"))),
            };
            prop_assert_eq!(served, log_from(n + 1));
            // Eviction only on ACK: a client that read every ACKed byte always finds the
            // window's head exactly at N+1 (or nothing unconfirmed left).
            if read == acked && let Some(wv) = window {
                prop_assert_eq!(wv.head, n + 1);
            }
        }
    }

    proptest! {
        /// The TX-timestamp key is the low 32 bits of the last ACKed byte's offset; any true
        /// ACK position within 2^32 bytes below `queued` is rebuilt exactly (the wrap case
        /// included), and a key that cannot be (beyond anything queued) confirms nothing.
        #[test]
        fn tskey_rebuilds_every_position_within_the_wrap(
            queued in 1u64..(1 << 40), back in 0u64..(1 << 32),
        ) {
            let acked = queued.saturating_sub(back).max(1);
            prop_assert_eq!(acked_from_tskey((acked - 1) as u32, queued), acked);
            if queued < (1 << 32) {
                // A key above `queued - 1` names a byte never written.
                for key in [queued as u32, u32::MAX] {
                    if u64::from(key) >= queued {
                        prop_assert_eq!(acked_from_tskey(key, queued), 0);
                    }
                }
            }
        }

        /// A disconnect racing a send completion: the kernel took `taken >= sent` bytes (the
        /// last send's CQE is not processed), the peer ACKed `peer <= taken`, TX-timestamp ACKs
        /// up to `ts <= peer` may have arrived ahead of the CQE, and the close path tightens
        /// with SIOCOUTQ (`taken - peer`). Whatever the interleaving, the parked window holds
        /// every event the peer did not ACK completely, contiguously and byte-exact: nothing
        /// the client may lack is ever released on a send result or a stale count.
        #[test]
        fn disconnect_racing_a_send_completion_releases_nothing_unacked(
            lens in proptest::collection::vec(1u32..30, 1..30),
            sent_frac in 0u32..=100, taken_frac in 0u32..=100,
            peer_frac in 0u32..=100, ts_frac in 0u32..=100,
        ) {
            let mut w: Window<B> = Window::new();
            let head = b"HTTP/1.1 200 OK\r\n\r\n";
            w.push_bytes(Run::whole(b(head)));
            let mut stream = head.to_vec();
            let mut ends = Vec::new();
            for (i, &l) in lens.iter().enumerate() {
                let bytes = vec![i as u8; l as usize];
                stream.extend_from_slice(&bytes);
                ends.push((i as u64 + 1, stream.len() as u64 - u64::from(l), stream.len() as u64));
                w.push_events(i as u64 + 1, vec![b(&bytes)], &[l]);
            }
            let q = w.queued();
            let sent = q * u64::from(sent_frac) / 100;
            let taken = sent + (q - sent) * u64::from(taken_frac) / 100;
            let peer = taken * u64::from(peer_frac) / 100;
            let ts = peer * u64::from(ts_frac) / 100;
            w.on_sent(sent);
            if ts > 0 {
                // A TX-timestamp ACK of byte `ts - 1`, possibly ahead of the send's CQE.
                w.on_acked(acked_from_tskey((ts - 1) as u32, q));
            }
            w.on_acked(acked_from_outq(w.sent(), taken - peer));
            prop_assert!(w.acked() <= peer, "confirmed more than the peer ACKed");
            let parked = w.take_events();
            let unacked: Vec<_> = ends.iter().filter(|e| e.2 > peer).collect();
            prop_assert!(parked.len() >= unacked.len());
            for (k, p) in parked.iter().enumerate() {
                prop_assert_eq!(p.seq, parked[0].seq + k as u64, "parked window not contiguous");
                let e = ends[p.seq as usize - 1];
                let bytes: Vec<u8> = p.runs.iter().flat_map(|r| r.bytes().to_vec()).collect();
                prop_assert_eq!(&bytes[..], &stream[e.1 as usize..e.2 as usize]);
            }
            if let Some(first_unacked) = unacked.first() {
                prop_assert!(parked[0].seq <= first_unacked.0);
                prop_assert_eq!(parked.last().map(|p| p.seq), Some(lens.len() as u64));
            }
        }
    }

    proptest! {
        /// The cursors against a naive reference (the old walk from the window's start): pushes of
        /// several whole-record chunks, parked pushes, take_events mid-life, ACKs ahead of `sent`,
        /// and iov/byte limits on the unsent walk; sent and confirmed counts at every step.
        #[test]
        fn cursors_match_a_walk_from_the_start(ops in proptest::collection::vec((0u8..7, 0usize..60, 0usize..8), 1..300)) {
            let mut w: Window<B> = Window::new();
            // Reference: every non-empty run ever pushed (global start, bytes).
            let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
            let mut queued = 0u64;
            // Events in the window (seq, start, end).
            let mut evs: std::collections::VecDeque<(u64, u64, u64)> = Default::default();
            let mut next_seq = 1u64;
            let mut sent = 0u64;
            let mut hint = 0u64;
            let mut acked = 0u64;
            let mut stash: Vec<ParkedEvent<B>> = Vec::new();
            for (op, n, m) in ops {
                match op {
                    0 => {
                        let k = n % 5 + 1;
                        let lens: Vec<u32> = (0..k).map(|i| ((i * 7 + n) % 4) as u32 + 1).collect();
                        let total: usize = lens.iter().map(|&l| l as usize).sum();
                        let bytes: Vec<u8> = (0..total).map(|i| (next_seq as u8).wrapping_mul(31).wrapping_add(i as u8)).collect();
                        let mut chunks = Vec::new();
                        // Chunks are whole records (as the log returns them), grouped by `m`.
                        let mut at = 0;
                        for (i, &l) in lens.iter().enumerate() {
                            let e = at + l as usize;
                            if (i + m) % 2 == 0 || i + 1 == lens.len() {
                                let from = chunks.iter().map(|c: &B| c.0.len()).sum::<usize>();
                                chunks.push(b(&bytes[from..e]));
                            }
                            at = e;
                        }
                        let mut s = queued;
                        for (i, &l) in lens.iter().enumerate() { evs.push_back((next_seq + i as u64, s, s + l as u64)); s += l as u64; }
                        for c in &chunks { runs.push((queued, c.0.to_vec())); queued += c.0.len() as u64; }
                        w.push_events(next_seq, chunks, &lens);
                        next_seq += k as u64;
                    }
                    1 => {
                        let k = (n as u64).min(queued - sent);
                        let (s, c) = w.on_sent(k);
                        let old = sent;
                        sent += k;
                        let es = evs.iter().filter(|e| e.2 > old && e.2 <= sent).count();
                        prop_assert_eq!(s, es, "events sent");
                        let a = hint.min(sent);
                        let mut cc = 0;
                        if a > acked { acked = a; while evs.front().is_some_and(|e| e.2 <= acked) { evs.pop_front(); cc += 1; } }
                        prop_assert_eq!(c, cc, "confirmed at send");
                    }
                    2 => {
                        let target = (acked + n as u64).min(queued);
                        let c = w.on_acked(target);
                        hint = hint.max(target);
                        let a = hint.min(sent);
                        let mut cc = 0;
                        if a > acked { acked = a; while evs.front().is_some_and(|e| e.2 <= acked) { evs.pop_front(); cc += 1; } }
                        prop_assert_eq!(c, cc, "confirmed at ack");
                    }
                    3 => {
                        let bytes = vec![b':'; n % 3];
                        if !bytes.is_empty() { runs.push((queued, bytes.clone())); queued += bytes.len() as u64; }
                        w.push_bytes(Run::whole(b(&bytes)));
                    }
                    4 if n % 4 == 0 => {
                        // A disconnect mid-life: the events leave, the runs stay; later pushes
                        // continue after an expect_next (as a resume would do).
                        let p = w.take_events();
                        prop_assert_eq!(p.len(), evs.len());
                        evs.clear();
                        stash = p;
                        w.expect_next(next_seq);
                    }
                    5 if !stash.is_empty() && n % 3 == 0 => {
                        // Re-push parked events (renumbered to stay contiguous).
                        let mut p = std::mem::take(&mut stash);
                        for ev in p.iter_mut() {
                            ev.seq = next_seq; next_seq += 1;
                            let len: u64 = ev.runs.iter().map(|r| r.len as u64).sum();
                            evs.push_back((ev.seq, queued, queued + len));
                            for r in &ev.runs { runs.push((queued, r.bytes().to_vec())); queued += r.len as u64; }
                        }
                        w.push_parked(p);
                    }
                    _ => {}
                }
                prop_assert_eq!(w.sent(), sent);
                prop_assert_eq!(w.acked(), acked);
                prop_assert_eq!(w.queued(), queued);
                // Unsent walk with limits against the reference walk.
                let (iov, bmax) = (m % 4 + 1, n % 40 + 1);
                let mut got: Vec<Vec<u8>> = Vec::new();
                w.for_each_unsent(iov, bmax, |s| got.push(s.to_vec()));
                let mut want: Vec<Vec<u8>> = Vec::new();
                let (mut k, mut bytes) = (0usize, 0usize);
                for (st, r) in &runs {
                    let end = st + r.len() as u64;
                    if end <= sent { continue; }
                    let skip = sent.saturating_sub(*st) as usize;
                    let take = (r.len() - skip).min(bmax - bytes);
                    if take == 0 || k == iov { break; }
                    want.push(r[skip..skip + take].to_vec());
                    k += 1; bytes += take;
                }
                prop_assert_eq!(got, want);
                prop_assert_eq!(w.head(), evs.front().map(|e| e.0));
            }
        }
    }

    #[test]
    #[should_panic(expected = "an event has bytes")]
    fn an_empty_event_is_an_assertion() {
        let mut w: Window<B> = Window::new();
        w.push_bytes(Run::whole(b(b"HEAD")));
        w.on_sent(4);
        w.push_events(1, Vec::<B>::new(), &[0]);
    }
}
