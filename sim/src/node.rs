//! The simulated gateway node: the real log (`log_store::Log`) with the gateway's use of it —
//! publishes (single and batch, answered once their last event is visible), the group commit
//! begun and finished as the reactor does it (the fdatasync itself is the disk's snapshot),
//! retention, the background jobs in manual mode, where a subscription starts (the real
//! resume planner over the parked windows) and what a subscription's send window is fed from
//! the log. No sockets: the clients (`clients.rs`) are on the other side.
#![forbid(unsafe_code)]

use std::io;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gateway::proto::conn::Wait;
use gateway::proto::route::SubscribeQuery;
use gateway::streams::StreamKey;
use gateway::streams::parked::{ParkLimits, ParkedWindows};
use gateway::streams::publish;
use gateway::streams::resume::{self, Ask, Start};
use gateway::streams::sub::{AckMode, Sub};
use log_store::{Log, LogOptions, Seq, StreamId, SyncJob};

use crate::disk::{Disk, Snapshot};
use crate::rng::Rng;
use crate::trace::Trace;
use crate::truth::{Rec, Truth};

pub type Check = Result<(), String>;

/// A publish waiting for its answer: events `first..=last` of stream `stream` (an index).
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    pub stream: usize,
    pub first: Seq,
    pub last: Seq,
    /// The sequence the answer waits for (the batch's last).
    pub wait: Seq,
}

/// A group commit in flight: its job and the bytes of its files when it began.
#[derive(Debug)]
struct InFlight {
    job: SyncJob,
    snaps: Vec<Snapshot>,
}

/// The node's state.
#[derive(Debug)]
pub struct Node {
    pub log: Option<Log>,
    pub opts: LogOptions,
    pub background: bool,
    pub streams: Vec<StreamId>,
    sync: Option<InFlight>,
    pub pending: Vec<Pending>,
    pub parking: ParkedWindows,
    pub park_limits: ParkLimits,
    pub poisoned: bool,
    /// The origin of the simulated clock (`now`), also handed to `sync_due`, which ignores it
    /// under `group`: no wall clock in any decision.
    t0: Instant,
}

impl Node {
    pub fn open(dir: &std::path::Path, opts: LogOptions, background: bool) -> Result<Log, String> {
        let r = if background {
            Log::open_with_manual_background(dir, opts)
        } else {
            Log::open(dir, opts)
        };
        r.map_err(|e| format!("open failed: {e}"))
    }

    pub fn new(log: Log, opts: LogOptions, background: bool, streams: Vec<StreamId>) -> Node {
        Node {
            log: Some(log),
            opts,
            background,
            streams,
            sync: None,
            pending: Vec::new(),
            parking: ParkedWindows::default(),
            park_limits: ParkLimits {
                grace: Duration::from_millis(300),
                per_stream_max: 2,
            },
            poisoned: false,
            t0: Instant::now(),
        }
    }

    pub fn log(&self) -> &Log {
        self.log.as_ref().expect("log open")
    }

    fn log_mut(&mut self) -> &mut Log {
        self.log.as_mut().expect("log open")
    }

    /// Publishes `events` to stream `i` through the gateway's own `streams::publish`: checked,
    /// appended all or up to the first refused one, answered `201` once the answer's `Wait`
    /// (the batch's last event) is visible, or an explicit error.
    pub fn publish(
        &mut self,
        i: usize,
        recs: Vec<Rec>,
        truth: &mut Truth,
        disk: &Disk,
        trace: &mut Trace,
    ) -> Check {
        let sid = self.streams[i];
        let events: Vec<publish::Event> = recs
            .iter()
            .map(|r| (r.event.clone(), r.data.clone()))
            .collect();
        let log = self.log.as_mut().expect("log open");
        let before = log.bounds(sid).expect("stream exists").tail;
        if before != truth.tail() {
            return Err(format!(
                "{sid}: log tail {before}, appended {}",
                truth.tail()
            ));
        }
        if publish::check_events(&events)
            .and_then(|()| publish::check_framed(log, sid, &events))
            .is_err()
        {
            trace.note("publish_refused", &[i as u64]);
            return Ok(());
        }
        let p = publish::append(log, 0, sid, &events, events.len() > 1, false);
        for (k, rec) in recs.into_iter().take(p.appended).enumerate() {
            truth.appended(before + 1 + k as u64, rec)?;
            trace.events += 1;
        }
        let (first, last) = (before + 1, before + p.appended as u64);
        // Every other stored publish is keyed, as the gateway writes an `Idempotency-Key`:
        // its key record right after its events.
        let count = p.appended as u32;
        if count > 0 && count as usize == events.len() && first % 2 == 1 {
            match log.append_key(sid, first, count, &Truth::key_bytes(first, count)) {
                Ok(()) => {
                    truth.keys.insert(first, (count, false));
                    trace.note("keyed", &[i as u64, first]);
                }
                Err(_) => trace.note("key_refused", &[i as u64]),
            }
        }
        let status = &p.answer[9..12];
        match (status, p.wait) {
            (b"201", Some(Wait::Durable { seq, .. })) => {
                trace.note("published", &[i as u64, first, last, seq]);
                self.pending.push(Pending {
                    stream: i,
                    first,
                    last,
                    wait: seq,
                });
                Ok(())
            }
            // Answered at once: every event must be durable already.
            (b"201", None) => self.acknowledge(disk, sid, (first, last), truth, trace),
            _ => {
                trace.note("append_refused", &[i as u64, p.appended as u64]);
                if p.answer.windows(10).any(|w| w == b"log_failed") {
                    self.fail_log(trace);
                }
                Ok(())
            }
        }
    }

    /// The reactor's end of turn for the log: begin a group commit when one is due, or carry
    /// the one in flight on (finished now, later — a slow fsync — or failed with EIO).
    pub fn sync_step(
        &mut self,
        rng: &mut Rng,
        eio_per_mille: u32,
        disk: &Disk,
        truths: &mut [Truth],
        trace: &mut Trace,
    ) -> Check {
        let Some(f) = self.sync.take() else {
            let t0 = self.t0;
            if self.log().sync_due(t0)
                && let Some(job) = self.log_mut().begin_sync()
            {
                let snaps = disk.snapshot(job.fds());
                trace.note("sync_begin", &[snaps.len() as u64]);
                self.sync = Some(InFlight { job, snaps });
            }
            return Ok(());
        };
        if rng.chance(250) {
            trace.fault("sync_slow", &[]);
            self.sync = Some(f);
            return Ok(());
        }
        let outcome = if rng.chance(eio_per_mille) {
            trace.fault("sync_eio", &[]);
            Err(io::Error::from_raw_os_error(5))
        } else {
            disk.commit(f.snaps);
            Ok(())
        };
        match self.log_mut().finish_sync(f.job, outcome) {
            Ok(report) => {
                for (sid, seq) in &report.advanced {
                    trace.note("visible", &[u64::from(sid.0), *seq]);
                }
                self.answer(disk, truths, trace)
            }
            Err(_) => {
                self.fail_log(trace);
                Ok(())
            }
        }
    }

    /// The log is poisoned: waiting publishes get `500 log_failed` (not acknowledged).
    pub fn fail_log(&mut self, trace: &mut Trace) {
        self.poisoned = true;
        trace.note("poisoned", &[self.pending.len() as u64]);
        self.pending.clear();
    }

    /// Answers the publishes whose awaited event is visible; each answered event must be
    /// durable (its bytes in the disk's durable image).
    pub fn answer(&mut self, disk: &Disk, truths: &mut [Truth], trace: &mut Trace) -> Check {
        let mut keep = Vec::with_capacity(self.pending.len());
        for p in std::mem::take(&mut self.pending) {
            let sid = self.streams[p.stream];
            let visible = self.log().bounds(sid).map_or(0, |b| b.visible_tail);
            if visible < p.wait {
                keep.push(p);
                continue;
            }
            self.acknowledge(disk, sid, (p.first, p.last), &mut truths[p.stream], trace)?;
        }
        self.pending = keep;
        Ok(())
    }

    /// A publisher got its `201` for events `first..=last`: each must be durable.
    fn acknowledge(
        &self,
        disk: &Disk,
        sid: StreamId,
        (first, last): (Seq, Seq),
        truth: &mut Truth,
        trace: &mut Trace,
    ) -> Check {
        for seq in first..=last {
            if !self.is_durable(disk, sid, seq) {
                return Err(format!(
                    "publish of {sid} {first}..={last} answered while event {seq} is not durable"
                ));
            }
        }
        truth.acked = truth.acked.max(last);
        if let Some(k) = truth.keys.get_mut(&first) {
            k.1 = true; // answered: its key is as durable as its events
        }
        trace.note("answered", &[u64::from(sid.0), last]);
        Ok(())
    }

    /// Whether event `seq` of `sid` is in the disk's durable image (or retention deleted it
    /// already, which it does only to durable records: nothing left to check).
    pub fn is_durable(&self, disk: &Disk, sid: StreamId, seq: Seq) -> bool {
        match self.log().record(sid, seq) {
            Ok(s) => disk.is_durable(s.segment_number(), s.file_offset(), s.as_bytes()),
            Err(log_store::ReadError::Truncated { .. }) => true,
            Err(_) => false,
        }
    }

    /// Retention by bytes (the clock it is handed is fixed: age never decides).
    pub fn retention(&mut self, trace: &mut Trace) {
        let now = UNIX_EPOCH + Duration::from_secs(4_000_000_000);
        let now: SystemTime = now;
        match self.log_mut().enforce_retention(now) {
            Ok(r) => trace.note("retention", &[r.segments_deleted as u64]),
            Err(_) => trace.note("retention_failed", &[]),
        }
    }

    pub fn background_jobs(&mut self, trace: &mut Trace) {
        if self.background {
            let n = self.log_mut().run_background_jobs();
            trace.note("background", &[n as u64]);
        }
    }

    /// Forgets everything a process crash loses; returns the log to be dropped as crashed.
    pub fn crash(&mut self) -> Log {
        self.sync = None;
        self.pending.clear();
        self.parking = ParkedWindows::default();
        self.poisoned = false;
        self.log.take().expect("log open")
    }

    /// The simulated clock: one millisecond per step from an arbitrary origin (only
    /// differences are ever taken).
    pub fn now(&self, step: u64) -> Instant {
        self.t0 + Duration::from_millis(step)
    }

    /// Where a subscription to stream `i` starts, by the gateway's own
    /// `streams::resume::start` (the planner over the parked windows): a `Sub` whose window
    /// starts with the head (and an aligned resume's parked events), or one that only sends
    /// the explicit error and closes. Returns it, whether it was refused, and its class.
    pub fn subscribe(
        &mut self,
        i: usize,
        q: &SubscribeQuery,
        ack: AckMode,
        step: u64,
    ) -> (Sub, bool, &'static str) {
        let key: StreamKey = (0, self.streams[i]);
        let now = self.now(step);
        let ask = Ask {
            key,
            q,
            retry_ms: 1000,
            known_epochs: &[],
            now,
        };
        let log = self.log.as_ref().expect("log open");
        let (start, class) = resume::start(log, &mut self.parking, &ask);
        let label = class.map_or("fresh", |c| c.label());
        match start {
            Start::Serve {
                cursor,
                preamble,
                aligned,
            } => (
                Sub::new(key, cursor, ack, preamble, aligned, now),
                false,
                label,
            ),
            Start::Refuse(answer) => {
                let mut sub = Sub::new(key, 1, ack, answer, None, now);
                sub.end_after(0);
                sub.never_park();
                (sub, true, "refused")
            }
        }
    }
}
