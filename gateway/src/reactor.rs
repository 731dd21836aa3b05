//! The per-core reactor: one thread per core, pinned, each with its own io_uring
//! (SINGLE_ISSUER + DEFER_TASKRUN, 32-byte CQEs), its own SO_REUSEPORT listener with multishot
//! accept, an eventfd read for cross-core handoffs and shutdown, and the connections and shard
//! logs it owns. It is the thin driver: HTTP decisions come from `http`/`route`, the
//! subscriber window from `window`, resume decisions from `log_store::resume`.
//!
//! Operations in flight are keyed by `user_data = slot << 32 | generation << 8 | op`; a
//! connection slot owns the fd and every buffer an operation points at until that operation's
//! completion arrives (a closing connection shuts the socket down, cancels, and waits for the
//! buffer-owning completions before it closes the fd and frees the slot; a completion whose
//! generation no longer matches is stale and ignored).

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime};

use crossbeam::channel::{Receiver, Sender};
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use log_store::{Bounds, Epoch, EventId, Log, LogSlice, ReadError, ResumePlan, Seq, StreamId};

use crate::config::Config;
use crate::http::{self, HeadLimits};
use crate::metrics::{self, CoreMetrics, ResumeClass};
use crate::route::{self, OnTruncated, Route};
use crate::shards;
use crate::sse::{self, TruncatedReason};
use crate::sys;
use crate::window::{Chunk, ParkedEvent, Run, Window};

// The MCP front's driver (child module: it uses the connection and subscriber machinery).
#[path = "mcp/glue.rs"]
mod mcp_glue;

/// State shared by all cores (read-mostly).
#[derive(Debug)]
pub struct Shared {
    pub cfg: Config,
    pub cores: usize,
    pub shards: u32,
    pub handoff_tx: Vec<Sender<Handoff>>,
    pub eventfds: Vec<RawFd>,
    pub metrics: Vec<CoreMetrics>,
    pub connections: AtomicUsize,
    pub shutdown: AtomicBool,
    /// Every shard's log epoch, so an ID of another shard is named "another stream".
    pub epochs: Vec<Epoch>,
    pub uring_cmd: bool,
}

/// A connection moving to the core that owns its stream: the fd and the bytes read so far.
#[derive(Debug)]
pub struct Handoff {
    pub fd: RawFd,
    pub bytes: Vec<u8>,
}

/// What one core thread is given at start.
#[derive(Debug)]
pub struct CoreSetup {
    pub id: usize,
    pub cpu: Option<usize>,
    pub listener: Option<RawFd>,
    pub eventfd: RawFd,
    pub rx: Receiver<Handoff>,
    pub logs: Vec<(u32, Log)>,
}

const OP_ACCEPT: u8 = 1;
const OP_EVENTFD: u8 = 2;
const OP_RECV: u8 = 3;
const OP_SEND: u8 = 4;
const OP_POLL: u8 = 5;
const OP_TXTS: u8 = 6;
const OP_CANCEL: u8 = 7;
const OP_WATCH: u8 = 8;

const F_RECV: u8 = 1;
const F_SEND: u8 = 2;
const F_POLL: u8 = 4;
const F_TXTS: u8 = 8;
/// A subscriber's multishot poll for input/hang-up (it replaces recv on subscriber sockets).
const F_WATCH: u8 = 16;
/// Operations that point at connection memory (or whose fd use we must see end) before the
/// fd may be closed and the slot reused. The TX timestamp command carries no buffer: its late
/// completions are recognized as stale by generation.
const F_OWNING: u8 = F_RECV | F_SEND | F_POLL | F_WATCH;

const SOCKET_URING_OP_TX_TIMESTAMP: u32 = 4;
const SCM_TSTAMP_ACK: u32 = 2;
const IORING_TIMESTAMP_TYPE_SHIFT: u32 = 17;
const IOV_MAX_PER_SEND: usize = 1024;
const RECV_BYTES_MIN: usize = 4096;
const PIPELINED_PER_CALL_MAX: usize = 256;
const TICK: Duration = Duration::from_millis(100);
/// How long a sampled TX ACK request may stay unanswered before the tick confirms by
/// `SIOCOUTQ` regardless.
const ACK_ANSWER_WAIT_MAX: Duration = Duration::from_secs(1);

/// Slots a core can hold (user_data carries 24 bits of slot; `--connections-max` is capped
/// below this).
pub const SLOTS_MAX: usize = 1 << 24;
/// Bits of a slot's generation carried in user_data.
const GEN_MASK: u32 = 0xffff;
/// Bits of an operation's serial carried in user_data.
const SERIAL_MASK: u32 = 0xf_ffff;

/// user_data: slot (24 bits) | slot generation (16) | op serial (20) | op (4). The serial
/// tells an operation from every other one issued on the same slot within the last 2^20
/// (it continues across the slot's connections), so a completion that arrives late, even
/// after the slot was reused, is not taken for the operation in flight.
fn ud_serial(slot: u32, gen_: u32, op: u8, serial: u32) -> u64 {
    (u64::from(slot & 0xff_ffff) << 40)
        | (u64::from(gen_ & GEN_MASK) << 24)
        | (u64::from(serial & SERIAL_MASK) << 4)
        | u64::from(op & 0x0f)
}

/// user_data of an operation that carries no serial (multishot, core-wide, cancels).
fn ud(slot: u32, gen_: u32, op: u8) -> u64 {
    ud_serial(slot, gen_, op, 0)
}

/// Advances a slot's serial counter and returns the new serial (wraps at 2^20).
fn next_serial(counter: &mut u32) -> u32 {
    *counter = counter.wrapping_add(1) & SERIAL_MASK;
    *counter
}

/// (slot, generation, serial, op) of a user_data.
fn ud_split(u: u64) -> (u32, u32, u32, u8) {
    (
        (u >> 40) as u32,
        ((u >> 24) as u32) & GEN_MASK,
        ((u >> 4) as u32) & SERIAL_MASK,
        (u & 0x0f) as u8,
    )
}

/// Bytes a subscriber window points at: a mapped log slice, or gateway-made framing.
#[derive(Clone, Debug)]
enum Bytes {
    Log(LogSlice),
    Owned(Rc<[u8]>),
    Static(&'static [u8]),
}

impl Chunk for Bytes {
    fn bytes(&self) -> &[u8] {
        match self {
            Bytes::Log(s) => s.as_bytes(),
            Bytes::Owned(b) => b,
            Bytes::Static(b) => b,
        }
    }
}

type StreamKey = (u32, StreamId);

/// How a subscriber learns which bytes the peer ACKed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AckMode {
    TxTimestamps,
    Outq,
}

#[derive(Debug)]
struct Sub {
    key: StreamKey,
    window: Window<Bytes>,
    /// Next sequence to read from the log.
    cursor: Seq,
    ack: AckMode,
    /// `event: truncated` queued; close once it is sent.
    finishing: bool,
    /// MCP: end the response after this sequence (the stream is complete).
    end_after: Option<Seq>,
    last_write: Instant,
    /// TX ACK sampling (see `--tx-ack-interval-ms`): when the last send asking for an ACK
    /// timestamp was submitted, whether the send in flight asks for one, and the window offset
    /// that request's timestamp will confirm (cleared once confirmed).
    ack_asked_at: Option<Instant>,
    ack_ask_in_send: bool,
    ack_awaited: Option<u64>,
    iov: Vec<libc::iovec>,
    msg: libc::msghdr,
}

impl Sub {
    /// Forgets the awaited TX ACK request once the window is confirmed up to its key.
    fn settle_ack_request(&mut self) {
        if self
            .ack_awaited
            .is_some_and(|end| self.window.acked() >= end)
        {
            self.ack_awaited = None;
        }
    }

    /// Releases from the window what `SIOCOUTQ` says the peer ACKed (`write_seq - snd_una`,
    /// still meaningful after a reset); returns the events that became confirmed (0 when the
    /// ioctl fails: nothing is released on a guess).
    fn confirm_from_outq(&mut self, fd: RawFd) -> usize {
        match sys::outq_bytes(fd) {
            Ok(q) => self
                .window
                .on_acked(crate::window::acked_from_outq(self.window.sent(), q)),
            Err(_) => 0,
        }
    }

    /// [`Sub::confirm_from_outq`] with the confirmation counted in the core's metrics.
    fn confirm_from_outq_counted(&mut self, fd: RawFd, m: &CoreMetrics) {
        let before = self.window.acked();
        let events = self.confirm_from_outq(fd);
        m.events_confirmed_total.fetch_add(events as u64, Relaxed);
        m.bytes_confirmed_total
            .fetch_add(self.window.acked() - before, Relaxed);
    }
}

#[derive(Debug)]
enum State {
    /// Reading / answering ordinary requests.
    Http,
    Sub(Box<Sub>),
}

/// A response waiting its turn on a keep-alive connection. Responses leave strictly in
/// request order; one whose `wait` is set (a publish not yet durable) holds back those after it.
#[derive(Debug)]
struct Outgoing {
    bytes: Vec<u8>,
    /// `(stream, seq)` that must be visible (durable under `--fsync`) before this is sent.
    wait: Option<(StreamKey, Seq)>,
    close: bool,
}

#[derive(Debug)]
struct Conn {
    fd: RawFd,
    inflight: u8,
    closing: bool,
    rbuf: Vec<u8>,
    /// Received bytes are `rbuf[..rlen]`; those before `rpos` are consumed requests. Pipelined
    /// requests advance `rpos` instead of shifting the rest down after each one; the buffer is
    /// compacted (rpos = 0) before anything else reads it or a recv is armed.
    rpos: usize,
    rlen: usize,
    /// Bytes of the send in flight (a run of ready responses).
    wbuf: Vec<u8>,
    woff: usize,
    /// The latest serial given to an operation of this connection, and the serials of the recv
    /// / send / POLLOUT poll / TX-timestamp command / watch in flight (or last submitted); a
    /// multishot operation keeps its serial until it ends and is re-armed.
    serial: u32,
    recv_serial: u32,
    send_serial: u32,
    poll_serial: u32,
    txts_serial: u32,
    watch_serial: u32,
    /// Responses not yet in `wbuf`, in request order, and their bytes.
    outbox: VecDeque<Outgoing>,
    outbox_bytes: usize,
    close_after_write: bool,
    /// A request asked to close (or was refused with close): parse nothing more.
    close_requested: bool,
    sent_continue: bool,
    state: State,
    idle_since: Instant,
    head_started: Option<Instant>,
    /// The head is complete and the body is being received: the idle timeout applies (reset
    /// by every received byte), not the header timeout.
    awaiting_body: bool,
}

impl Conn {
    /// For a per-connection op: its in-flight flag and the serial of the one in flight.
    fn in_flight(&self, op: u8) -> Option<(u8, u32)> {
        match op {
            OP_RECV => Some((F_RECV, self.recv_serial)),
            OP_SEND => Some((F_SEND, self.send_serial)),
            OP_POLL => Some((F_POLL, self.poll_serial)),
            OP_TXTS => Some((F_TXTS, self.txts_serial)),
            OP_WATCH => Some((F_WATCH, self.watch_serial)),
            _ => None,
        }
    }

    /// Moves the unconsumed bytes to the front of `rbuf`. Only while no recv is in flight.
    fn compact(&mut self) {
        debug_assert_eq!(self.inflight & F_RECV, 0, "compacting under a recv");
        if self.rpos > 0 {
            self.rbuf.copy_within(self.rpos..self.rlen, 0);
            self.rlen -= self.rpos;
            self.rpos = 0;
        }
    }
}

#[derive(Debug)]
struct Slot {
    gen_: u32,
    /// The serial counter of the slot's last connection, continued by the next one.
    serial: u32,
    conn: Option<Conn>,
}

#[derive(Debug)]
struct Parked {
    head: Seq,
    last: Seq,
    events: Vec<ParkedEvent<Bytes>>,
    expires: Instant,
}

/// One core's reactor.
struct Core {
    id: usize,
    shared: Arc<Shared>,
    ring: IoUring<squeue::Entry, cqueue::Entry32>,
    listener: Option<RawFd>,
    efd: RawFd,
    efd_buf: Box<u64>,
    rx: Receiver<Handoff>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    logs: HashMap<u32, Log>,
    subs: HashMap<StreamKey, Vec<(u32, u32)>>,
    parked: HashMap<StreamKey, VecDeque<Parked>>,
    /// Connections with a response waiting for durability.
    waiting: Vec<(u32, u32)>,
    touched: Vec<StreamKey>,
    /// Scratch for `after_turn`: the subscribers of the touched streams.
    to_pump: Vec<(u32, u32)>,
    appended_shards: Vec<u32>,
    now: Instant,
    next_tick: Instant,
    next_retention: Instant,
    shutting_down: Option<Instant>,
    limits: HeadLimits,
    /// The multishot accept ended on an error; re-armed by the next tick.
    accept_paused: bool,
    /// Submissions that found the SQ full and could not be submitted right away (the kernel
    /// refused with EBUSY/EAGAIN: completion queue overflowing, memory pressure); queued in
    /// order ahead of later ones and submitted by the run loop after it reaped completions.
    sq_backlog: VecDeque<squeue::Entry>,
    /// The MCP front, on the core that owns the MCP shard when `--upstream-cmd` is set.
    mcp: Option<Box<mcp_glue::Mcp>>,
}

/// Why a core could not start.
#[derive(Debug)]
pub enum CoreError {
    Ring(std::io::Error),
}

/// Runs one core until shutdown. `ready` is called once the ring is armed.
pub fn run_core(setup: CoreSetup, shared: Arc<Shared>, ready: impl FnOnce(Result<(), String>)) {
    if let Some(cpu) = setup.cpu
        && let Err(e) = sys::pin_to_cpu(cpu)
    {
        eprintln!(
            "core {}: cannot pin to cpu {cpu}: {e} (continuing unpinned)",
            setup.id
        );
    }
    let ring = match build_ring(shared.cfg.connections_max) {
        Ok(r) => r,
        Err(CoreError::Ring(e)) => {
            ready(Err(format!(
                "core {}: io_uring setup failed: {e}",
                setup.id
            )));
            return;
        }
    };
    let now = Instant::now();
    let limits = HeadLimits {
        header_bytes_max: shared.cfg.header_bytes_max,
        header_count_max: shared.cfg.header_count_max,
    };
    let mut core = Core {
        id: setup.id,
        shared,
        ring,
        listener: setup.listener,
        efd: setup.eventfd,
        efd_buf: Box::new(0),
        rx: setup.rx,
        slots: Vec::new(),
        free: Vec::new(),
        logs: setup.logs.into_iter().collect(),
        subs: HashMap::new(),
        parked: HashMap::new(),
        waiting: Vec::new(),
        touched: Vec::new(),
        to_pump: Vec::new(),
        appended_shards: Vec::new(),
        now,
        next_tick: now + TICK,
        next_retention: now,
        shutting_down: None,
        limits,
        accept_paused: false,
        sq_backlog: VecDeque::new(),
        mcp: None,
    };
    core.arm_accept();
    core.arm_eventfd();
    core.mcp_setup();
    ready(Ok(()));
    core.run();
}

fn build_ring(
    connections_max: usize,
) -> Result<IoUring<squeue::Entry, cqueue::Entry32>, CoreError> {
    let entries = 1024u32;
    // Per connection at most: recv, send, poll, timestamp command (+ its many CQEs), cancel.
    let cq = (connections_max.saturating_mul(4) as u32).clamp(4096, 1 << 16);
    let mut b = IoUring::<squeue::Entry, cqueue::Entry32>::builder();
    b.setup_single_issuer()
        .setup_defer_taskrun()
        .setup_cqsize(cq);
    match b.build(entries) {
        Ok(r) => Ok(r),
        Err(_) => {
            let mut b = IoUring::<squeue::Entry, cqueue::Entry32>::builder();
            b.setup_coop_taskrun().setup_cqsize(cq);
            b.build(entries).map_err(CoreError::Ring)
        }
    }
}

impl Core {
    fn m(&self) -> &CoreMetrics {
        &self.shared.metrics[self.id]
    }

    /// Queues a submission.
    ///
    /// # Safety
    /// Every buffer and iovec the entry points at must stay valid and unmoved until its
    /// completion is reaped.
    ///
    /// Never panics on a full queue: when the kernel cannot take the queued entries now
    /// (EBUSY with the completion queue overflowing, EAGAIN/ENOMEM, EINTR), the entry waits
    /// in `sq_backlog` for the run loop (which reaps completions first), keeping its order.
    unsafe fn push(&mut self, e: squeue::Entry) {
        if self.sq_backlog.is_empty() {
            for attempt in 0..2 {
                // SAFETY: forwarded from the caller's contract.
                if unsafe { self.ring.submission().push(&e) }.is_ok() {
                    return;
                }
                if attempt == 0 {
                    match self.ring.submit() {
                        Ok(_) => {}
                        Err(err) if is_transient(&err) => break,
                        Err(err) => panic!("io_uring submit: {err}"),
                    }
                }
            }
        }
        self.sq_backlog.push_back(e);
    }

    /// Moves backlogged submissions into the SQ, as many as fit.
    fn drain_sq_backlog(&mut self) {
        while let Some(e) = self.sq_backlog.front() {
            // SAFETY: entries in the backlog were pushed under `push`'s contract: what they
            // point at stays valid until their completions (the in-flight flags were set).
            if unsafe { self.ring.submission().push(e) }.is_err() {
                return;
            }
            self.sq_backlog.pop_front();
        }
    }

    fn arm_accept(&mut self) {
        if let Some(l) = self.listener {
            let e = opcode::AcceptMulti::new(types::Fd(l))
                .flags(libc::SOCK_CLOEXEC)
                .build()
                .user_data(ud(0, 0, OP_ACCEPT));
            // SAFETY: multishot accept points at no memory of ours.
            unsafe { self.push(e) };
        }
    }

    fn arm_eventfd(&mut self) {
        let ptr: *mut u64 = &mut *self.efd_buf;
        let e = opcode::Read::new(types::Fd(self.efd), ptr.cast(), 8)
            .build()
            .user_data(ud(0, 0, OP_EVENTFD));
        // SAFETY: `efd_buf` is a Box owned by the core, which outlives the ring's use of it
        // (the core and its ring are dropped together after the loop ends), and it is not
        // touched until this read completes.
        unsafe { self.push(e) };
    }

    fn run(&mut self) {
        let mut cqes: Vec<(u64, i32, u32)> = Vec::with_capacity(4096);
        loop {
            self.drain_sq_backlog();
            let (want, wait) = if self.sq_backlog.is_empty() {
                (1, self.wait_duration())
            } else {
                (0, Duration::ZERO)
            };
            let ts = types::Timespec::new()
                .sec(wait.as_secs())
                .nsec(wait.subsec_nanos());
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(want, &args) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ETIME) || is_transient(&e) => {}
                Err(e) => panic!("io_uring_enter: {e}"),
            }
            self.now = Instant::now();
            cqes.clear();
            cqes.extend(
                self.ring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            for &(u, res, flags) in &cqes {
                self.handle_cqe(u, res, flags);
            }
            self.mcp_turn();
            self.after_turn();
            if self.now >= self.next_tick {
                self.tick();
                self.next_tick = self.now + TICK;
            }
            if let Some(deadline) = self.shutting_down
                && (self.live_connections() == 0 || self.now >= deadline)
            {
                break;
            }
        }
        for log in self.logs.values_mut() {
            if let Err(e) = log.sync_now() {
                eprintln!("core {}: final sync failed: {e:?}", self.id);
            }
        }
    }

    fn live_connections(&self) -> usize {
        self.slots.iter().filter(|s| s.conn.is_some()).count()
    }

    fn wait_duration(&self) -> Duration {
        let mut until = self.next_tick;
        if let Some(d) = self.mcp_deadline() {
            until = until.min(d);
        }
        for log in self.logs.values() {
            if let Some(d) = log.next_sync_deadline() {
                until = until.min(d);
            }
        }
        until
            .saturating_duration_since(Instant::now())
            .max(Duration::from_micros(50))
    }

    // ---- completions ----

    fn handle_cqe(&mut self, u: u64, res: i32, flags: u32) {
        let (slot, gen_, serial, op) = ud_split(u);
        match op {
            OP_ACCEPT => self.on_accept(res, flags),
            OP_EVENTFD => self.on_eventfd(res),
            OP_CANCEL => {}
            _ => {
                let Some(conn) = self.conn_mut(slot, gen_) else {
                    return; // stale: the slot was reused (only buffer-free ops can be late)
                };
                if let Some((bit, expected)) = conn.in_flight(op)
                    && (conn.inflight & bit == 0 || serial != expected)
                {
                    // A completion that is not the operation of its kind in flight (seen
                    // here: a send's completion delivered a second time, ~14 sends later).
                    // Acting on it would free or rewrite a buffer the real operation still
                    // uses; it is counted and ignored.
                    let inflight = conn.inflight & bit != 0;
                    let m = &self.shared.metrics[self.id];
                    let n = m.unmatched_completions_total.fetch_add(1, Relaxed);
                    if n < 10 {
                        eprintln!(
                            "core {}: ignored an unmatched completion on slot {slot}: op {op}, \
                             serial {serial}, expected {expected} (in flight: {inflight}), \
                             result {res}, flags {flags:#x}",
                            self.id
                        );
                    }
                    return;
                }
                let bit = match op {
                    OP_RECV => F_RECV,
                    OP_SEND => F_SEND,
                    OP_POLL => F_POLL,
                    OP_TXTS => F_TXTS,
                    OP_WATCH => F_WATCH,
                    _ => unreachable!("unknown op {op}"),
                };
                if !(matches!(op, OP_TXTS | OP_WATCH) && cqueue::more(flags)) {
                    conn.inflight &= !bit;
                }
                let closing = conn.closing;
                if closing {
                    self.maybe_free(slot);
                    return;
                }
                match op {
                    OP_RECV => self.on_recv(slot, res),
                    OP_SEND => self.on_send(slot, res),
                    OP_POLL => self.pump(slot),
                    OP_TXTS => self.on_tx_timestamp(slot, res, flags),
                    OP_WATCH => self.on_watch(slot, res, flags),
                    _ => unreachable!(),
                }
            }
        }
    }

    fn conn_mut(&mut self, slot: u32, gen_: u32) -> Option<&mut Conn> {
        let s = self.slots.get_mut(slot as usize)?;
        if s.gen_ & GEN_MASK != gen_ {
            return None;
        }
        s.conn.as_mut()
    }

    fn conn(&mut self, slot: u32) -> &mut Conn {
        self.slots[slot as usize].conn.as_mut().expect("live slot")
    }

    fn gen_of(&self, slot: u32) -> u32 {
        self.slots[slot as usize].gen_ & GEN_MASK
    }

    fn on_accept(&mut self, res: i32, flags: u32) {
        if res < 0 {
            if self.shutting_down.is_some() {
                return; // our own cancel at shutdown
            }
            eprintln!(
                "core {}: accept: {} (re-armed at the next tick)",
                self.id,
                std::io::Error::from_raw_os_error(-res)
            );
            // EMFILE/ENFILE/ENOMEM persist while the backlog is non-empty: re-arming now
            // would spin. The tick re-arms. A multishot accept ended any other way (even
            // ECANCELED, which we never ask for outside shutdown) is re-armed the same way:
            // a listener without an armed accept leaves clients in the backlog forever.
            self.accept_paused |= !cqueue::more(flags);
            return;
        }
        if !cqueue::more(flags) && self.shutting_down.is_none() && self.listener.is_some() {
            self.arm_accept();
        }
        let fd = res;
        self.m().accepted_total.fetch_add(1, Relaxed);
        if self.shutting_down.is_some() {
            sys::close(fd);
            return;
        }
        let total = self.shared.connections.fetch_add(1, Relaxed) + 1;
        if total > self.shared.cfg.connections_max {
            self.shared.connections.fetch_sub(1, Relaxed);
            let body = http::error_response(
                503,
                "too_many_connections",
                "the gateway is at --connections-max; retry later",
                true,
            );
            sys::send_now(fd, &body);
            sys::close(fd);
            return;
        }
        let _ = sys::set_nodelay(fd);
        let slot = self.insert_conn(fd, Vec::new());
        self.arm_recv(slot);
    }

    fn insert_conn(&mut self, fd: RawFd, bytes: Vec<u8>) -> u32 {
        let rlen = bytes.len();
        let mut rbuf = bytes;
        rbuf.resize(rlen.max(RECV_BYTES_MIN), 0);
        let conn = Conn {
            fd,
            inflight: 0,
            closing: false,
            rbuf,
            rpos: 0,
            rlen,
            wbuf: Vec::new(),
            woff: 0,
            outbox: VecDeque::new(),
            outbox_bytes: 0,
            serial: 0,
            recv_serial: 0,
            send_serial: 0,
            poll_serial: 0,
            txts_serial: 0,
            watch_serial: 0,
            close_after_write: false,
            close_requested: false,
            sent_continue: false,
            state: State::Http,
            idle_since: self.now,
            head_started: (rlen > 0).then_some(self.now),
            awaiting_body: false,
        };
        self.m().connections.fetch_add(1, Relaxed);
        let mut conn = conn;
        if let Some(slot) = self.free.pop() {
            let s = &mut self.slots[slot as usize];
            s.gen_ = s.gen_.wrapping_add(1);
            conn.serial = s.serial;
            s.conn = Some(conn);
            slot
        } else {
            self.slots.push(Slot {
                gen_: 0,
                serial: 0,
                conn: Some(conn),
            });
            (self.slots.len() - 1) as u32
        }
    }

    fn on_eventfd(&mut self, res: i32) {
        if res < 0 && res != -libc::EAGAIN {
            eprintln!("core {}: eventfd read: {res}", self.id);
        }
        if self.shared.shutdown.load(Relaxed) {
            self.begin_shutdown();
        } else {
            self.arm_eventfd();
        }
        while let Ok(h) = self.rx.try_recv() {
            self.m().handoffs_in_total.fetch_add(1, Relaxed);
            if self.shutting_down.is_some() {
                sys::close(h.fd);
                self.shared.connections.fetch_sub(1, Relaxed);
                continue;
            }
            let slot = self.insert_conn(h.fd, h.bytes);
            self.process_http(slot);
        }
    }

    fn arm_recv(&mut self, slot: u32) {
        let gen_ = self.gen_of(slot);
        let conn = self.conn(slot);
        debug_assert_eq!(conn.inflight & F_RECV, 0);
        conn.compact();
        if conn.rlen == conn.rbuf.len() {
            return; // full: the caller decides (limit errors are raised before this)
        }
        let ptr = conn.rbuf[conn.rlen..].as_mut_ptr();
        let len = (conn.rbuf.len() - conn.rlen) as u32;
        let fd = conn.fd;
        conn.inflight |= F_RECV;
        conn.recv_serial = next_serial(&mut conn.serial);
        let e = opcode::Recv::new(types::Fd(fd), ptr, len)
            .build()
            .user_data(ud_serial(slot, gen_, OP_RECV, conn.recv_serial));
        // SAFETY: `rbuf[rlen..]` belongs to the connection slot, which is neither freed nor
        // resized while F_RECV is set (maybe_free and the resize sites check inflight).
        unsafe { self.push(e) };
    }

    fn on_recv(&mut self, slot: u32, res: i32) {
        if res <= 0 {
            self.close_conn(slot);
            return;
        }
        let now = self.now;
        let conn = self.conn(slot);
        if let State::Sub(_) = conn.state {
            // A recv armed before the connection became a subscriber: discard, and watch for
            // EOF with the poll from now on.
            (conn.rpos, conn.rlen) = (0, 0);
            conn.rbuf.truncate(512);
            conn.rbuf.shrink_to_fit();
            self.arm_watch(slot);
            return;
        }
        conn.rlen += res as usize;
        conn.idle_since = now;
        if conn.head_started.is_none() {
            conn.head_started = Some(now);
        }
        self.process_http(slot);
    }

    /// Arms a subscriber's multishot poll for input and hang-up, unless it is armed.
    ///
    /// Why not a recv: a subscriber socket has TX ACK timestamps on, and every timestamp
    /// queued on its error queue wakes the socket's waiters with EPOLLERR. A recv parked on
    /// io_uring's internal poll is woken, retried, finds no data, and — having been polled
    /// once already — is punted to an io-wq worker thread that blocks in `tcp_recvmsg` (one
    /// thread per subscriber, woken by every ACK). A multishot poll stays armed in the
    /// kernel instead: a spurious wake costs one CQE, never a thread.
    fn arm_watch(&mut self, slot: u32) {
        let gen_ = self.gen_of(slot);
        let conn = self.conn(slot);
        if conn.inflight & F_WATCH != 0 || conn.closing {
            return;
        }
        conn.inflight |= F_WATCH;
        conn.watch_serial = next_serial(&mut conn.serial);
        let mask = (libc::POLLIN | libc::POLLRDHUP) as u32;
        let e = opcode::PollAdd::new(types::Fd(conn.fd), mask)
            .multi(true)
            .build()
            .user_data(ud_serial(slot, gen_, OP_WATCH, conn.watch_serial));
        // SAFETY: poll points at no memory of ours.
        unsafe { self.push(e) };
    }

    /// A subscriber's poll fired: hang-up or reset closes; input is read and discarded (a
    /// subscriber has nothing more to say); an error-queue wake (a TX timestamp) is ignored.
    fn on_watch(&mut self, slot: u32, res: i32, flags: u32) {
        if res < 0 {
            self.close_conn(slot);
            return;
        }
        let mask = res as u32 as i16;
        if mask & (libc::POLLHUP | libc::POLLRDHUP) != 0 {
            self.close_conn(slot);
            return;
        }
        if mask & libc::POLLIN != 0 && sys::discard_input(self.conn(slot).fd) == sys::Input::Gone {
            self.close_conn(slot);
            return;
        }
        // Ended without F_MORE (e.g. a full completion queue ends multishot polls): re-arm.
        if !cqueue::more(flags) {
            self.arm_watch(slot);
        }
    }

    /// Queues a response that is ready now (after any earlier ones) and sends what can go.
    fn send_response(&mut self, slot: u32, bytes: Vec<u8>, close: bool) {
        self.enqueue(
            slot,
            Outgoing {
                bytes,
                wait: None,
                close,
            },
        );
    }

    fn enqueue(&mut self, slot: u32, o: Outgoing) {
        let gen_ = self.gen_of(slot);
        let conn = self.conn(slot);
        conn.close_requested |= o.close;
        let waits = o.wait.is_some();
        conn.outbox_bytes += o.bytes.len();
        conn.outbox.push_back(o);
        if waits && !self.waiting.contains(&(slot, gen_)) {
            self.waiting.push((slot, gen_));
        }
        self.flush(slot);
    }

    /// Sends the ready prefix of the outbox as one send, unless a send is in flight.
    fn flush(&mut self, slot: u32) {
        let conn = self.conn(slot);
        if conn.inflight & F_SEND != 0 || conn.closing {
            return;
        }
        let mut buf = std::mem::take(&mut conn.wbuf);
        buf.clear();
        while conn.outbox.front().is_some_and(|o| o.wait.is_none()) {
            let o = conn.outbox.pop_front().expect("front exists");
            conn.outbox_bytes -= o.bytes.len();
            buf.extend_from_slice(&o.bytes);
            if o.close {
                conn.close_after_write = true;
                conn.outbox.clear();
                conn.outbox_bytes = 0;
                break;
            }
        }
        conn.wbuf = buf;
        conn.woff = 0;
        if !conn.wbuf.is_empty() {
            self.submit_wbuf(slot);
        }
    }

    fn submit_wbuf(&mut self, slot: u32) {
        let gen_ = self.gen_of(slot);
        let conn = self.conn(slot);
        let ptr = conn.wbuf[conn.woff..].as_ptr();
        let len = (conn.wbuf.len() - conn.woff) as u32;
        let fd = conn.fd;
        conn.inflight |= F_SEND;
        conn.send_serial = next_serial(&mut conn.serial);
        let e = opcode::Send::new(types::Fd(fd), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(ud_serial(slot, gen_, OP_SEND, conn.send_serial));
        // SAFETY: `wbuf` belongs to the connection slot and is not replaced or freed while
        // F_SEND is set (flush returns early while a send is in flight; maybe_free waits).
        unsafe { self.push(e) };
    }

    fn on_send(&mut self, slot: u32, res: i32) {
        if res < 0 {
            self.close_conn(slot);
            return;
        }
        let now = self.now;
        let shutting_down = self.shutting_down.is_some();
        let conn = self.conn(slot);
        if let State::Sub(_) = conn.state {
            self.on_sub_sent(slot, res as u64);
            return;
        }
        conn.woff += res as usize;
        if conn.woff < conn.wbuf.len() {
            self.submit_wbuf(slot);
            return;
        }
        conn.wbuf.clear();
        conn.woff = 0;
        conn.idle_since = now;
        if conn.close_after_write || (shutting_down && conn.outbox.is_empty()) {
            self.close_conn(slot);
            return;
        }
        self.flush(slot);
        // Pipelining: the next buffered request, if any.
        self.process_http(slot);
    }

    // ---- HTTP ----

    /// Processes buffered requests in order (bounded per call; the next send completion
    /// continues).
    fn process_http(&mut self, slot: u32) {
        for _ in 0..PIPELINED_PER_CALL_MAX {
            if !self.process_one(slot) {
                break;
            }
        }
    }

    /// Processes one buffered request; true if another may follow right away.
    fn process_one(&mut self, slot: u32) -> bool {
        let limits = self.limits;
        let mcp_path = self.mcp_path();
        let cfg_event = self.shared.cfg.event_bytes_max;
        let cfg_batch = self.shared.cfg.batch_bytes_max;
        let answer_max = self.shared.cfg.pipeline_answer_bytes_max;
        let conn = self.conn(slot);
        // Consuming buffered bytes is only sound while no recv writes into the buffer; a recv
        // is armed only when no complete request is buffered, so there is nothing to do then.
        if conn.closing
            || conn.close_requested
            || !matches!(conn.state, State::Http)
            || conn.inflight & F_RECV != 0
        {
            return false;
        }
        // Earlier responses still queued or sending: later requests may be processed (their
        // answers queue behind), except those that take the connection over.
        let busy = !conn.outbox.is_empty() || conn.inflight & F_SEND != 0;
        // Backpressure on pipelining: with this many answer bytes queued, read no further
        // request (and arm no recv) until the client takes some; on_send resumes here.
        if busy && conn.outbox_bytes + (conn.wbuf.len() - conn.woff) >= answer_max {
            // The header timer must not run while the gateway itself refuses to read: it
            // restarts with the next bytes received.
            conn.head_started = None;
            return false;
        }
        let base = conn.rpos;
        let head = match http::parse_head(&conn.rbuf[base..conn.rlen], &limits) {
            Ok(Some(h)) => h,
            Ok(None) => {
                conn.compact();
                if conn.rlen == 0 {
                    conn.head_started = None;
                }
                if conn.inflight & F_RECV == 0 {
                    if conn.rbuf.len() < limits.header_bytes_max {
                        let n = limits.header_bytes_max.max(RECV_BYTES_MIN);
                        conn.rbuf.resize(n, 0);
                    }
                    self.arm_recv(slot);
                }
                return false;
            }
            Err(e) => {
                let (status, code, msg) = e.status();
                self.error(slot, status, code, &msg, true);
                return false;
            }
        };
        // Below, every path but the plain requests' fast path (the end of this function) works
        // on a compacted buffer: the request then starts at 0.
        if mcp_path.as_deref() == Some(head.path.as_str()) {
            self.conn(slot).compact();
            if busy {
                return false;
            }
            self.mcp_process(slot, head);
            return false;
        }
        let route = match route::route(&head) {
            Ok(r) => r,
            Err(e) => {
                let (status, code, msg) = e.status();
                let close = head.close || status == 411;
                // The body (if any) was not read: only keep the connection if there is none.
                let close = close || head.content_length > 0;
                if !close {
                    let conn = self.conn(slot);
                    conn.compact();
                    conn.rbuf.copy_within(head.head_len..conn.rlen, 0);
                    conn.rlen -= head.head_len;
                }
                self.error(slot, status, code, &msg, close);
                return !close;
            }
        };
        let body_max = match route {
            Route::Publish { .. } => cfg_event,
            Route::PublishBatch { .. } => cfg_batch,
            _ => 0,
        };
        if head.content_length > body_max as u64 {
            let (code, msg) = if body_max == 0 {
                ("body_not_allowed", "this request takes no body".to_string())
            } else {
                (
                    "body_too_large",
                    format!(
                        "body of {} bytes exceeds the limit of {body_max}",
                        head.content_length
                    ),
                )
            };
            self.error(slot, 413, code, &msg, true);
            return false;
        }
        let total = head.head_len + head.content_length as usize;
        if conn.rlen - base < total {
            conn.compact();
            conn.awaiting_body = true;
            if conn.rbuf.len() < total && conn.inflight & F_RECV == 0 {
                conn.rbuf.resize(total, 0);
            }
            if head.expect_continue && !conn.sent_continue {
                conn.sent_continue = true;
                self.send_response(slot, b"HTTP/1.1 100 Continue\r\n\r\n".to_vec(), false);
            }
            let conn = self.conn(slot);
            if conn.inflight & F_RECV == 0 {
                self.arm_recv(slot);
            }
            return false;
        }
        // A whole request is buffered.
        let owner = route.stream().map(|stream| {
            shards::core_of_shard(
                shards::shard_of(stream, self.shared.shards),
                self.shared.cores,
            )
        });
        let takes_over =
            matches!(route, Route::Subscribe { .. }) || owner.is_some_and(|o| o != self.id);
        if busy && takes_over {
            return false; // resumed when the outbox drains (on_send → process_http)
        }
        self.m().requests_total.fetch_add(1, Relaxed);
        if let Some(owner) = owner
            && owner != self.id
        {
            self.handoff(slot, owner);
            return false;
        }
        let now = self.now;
        let conn = self.conn(slot);
        if takes_over {
            conn.compact(); // a subscribe: the connection's buffer is handed to the stream
        }
        let base = conn.rpos;
        let body = conn.rbuf[base + head.head_len..base + total].to_vec();
        conn.rpos += total;
        if conn.rpos == conn.rlen {
            (conn.rpos, conn.rlen) = (0, 0);
        }
        conn.sent_continue = false;
        conn.awaiting_body = false;
        conn.head_started = (conn.rlen > conn.rpos).then_some(now);
        // A large body grew the buffer: give the memory back (no recv is in flight here).
        if conn.rbuf.len() > 64 * 1024 && conn.rlen - conn.rpos <= RECV_BYTES_MIN {
            conn.compact();
            conn.rbuf.truncate(RECV_BYTES_MIN);
            conn.rbuf.shrink_to_fit();
        }
        let close = head.close;
        match route {
            Route::Healthz => {
                let b = http::json_response(200, &serde_json::json!({"status": "ok"}), close);
                self.send_response(slot, b, close);
            }
            Route::Metrics => {
                let text = metrics::render(&self.shared.metrics);
                let b = http::response(200, "text/plain; version=0.0.4", text.as_bytes(), close);
                self.send_response(slot, b, close);
            }
            Route::Publish { stream } => {
                let ev = head.event_type.filter(|t| !t.is_empty());
                self.publish(slot, &stream, vec![(ev, body)], close, false);
            }
            Route::PublishBatch { stream } => match route::parse_batch(&body, cfg_event) {
                Ok(events) => {
                    let evs = events
                        .into_iter()
                        .map(|e| (e.event, e.data.into_bytes()))
                        .collect();
                    self.publish(slot, &stream, evs, close, true);
                }
                Err(e) => {
                    let (status, code, msg) = e.status();
                    self.error(slot, status, code, &msg, close);
                }
            },
            Route::Subscribe { stream, q } => {
                self.subscribe(slot, &stream, q);
                return false;
            }
        }
        // Pipelining: answers to ordinary requests queue in order; keep going.
        true
    }

    fn error(&mut self, slot: u32, status: u16, code: &str, msg: &str, close: bool) {
        let b = http::error_response(status, code, msg, close);
        self.send_response(slot, b, close);
    }

    fn handoff(&mut self, slot: u32, owner: usize) {
        let mut conn = self.slots[slot as usize].conn.take().expect("live");
        self.slots[slot as usize].serial = conn.serial;
        assert_eq!(
            conn.inflight, 0,
            "a handed-off connection has no operation in flight"
        );
        conn.compact();
        self.free.push(slot);
        self.m().connections.fetch_sub(1, Relaxed);
        self.m().handoffs_out_total.fetch_add(1, Relaxed);
        let mut bytes = conn.rbuf;
        bytes.truncate(conn.rlen);
        let fd = conn.fd;
        if self.shared.handoff_tx[owner]
            .send(Handoff { fd, bytes })
            .is_err()
        {
            sys::close(fd);
            self.shared.connections.fetch_sub(1, Relaxed);
            return;
        }
        sys::eventfd_wake(self.shared.eventfds[owner]);
    }

    /// The shard owning `stream` and the stream's id in that shard's log, creating the stream
    /// if new; on a log refusal, answers `slot` with the matching error response and gives `None`.
    fn open_stream(&mut self, slot: u32, stream: &str, close: bool) -> Option<(u32, StreamId)> {
        let shard = self.shard_of(stream);
        let log = self
            .logs
            .get_mut(&shard)
            .expect("owner core holds the shard");
        match log.create_stream(stream) {
            Ok(sid) => Some((shard, sid)),
            Err(e) => {
                let (status, code) = append_status(&e);
                self.error(slot, status, code, &e.to_string(), close);
                None
            }
        }
    }

    /// Counts a resume refused as `class` and answers it with a 400 carrying `body`, then closes.
    fn refuse_resume(&mut self, slot: u32, class: ResumeClass, body: &serde_json::Value) {
        self.m().resume(class);
        self.send_response(slot, http::json_response(400, body, true), true);
    }

    fn shard_of(&self, stream: &str) -> u32 {
        shards::shard_of(stream, self.shared.shards)
    }

    // ---- publish ----

    fn publish(
        &mut self,
        slot: u32,
        stream: &str,
        events: Vec<(Option<String>, Vec<u8>)>,
        close: bool,
        batch: bool,
    ) {
        for (ev, data) in &events {
            if std::str::from_utf8(data).is_err() {
                self.error(slot, 400, "bad_data", "event data must be UTF-8", close);
                return;
            }
            if ev.as_deref().is_some_and(|t| t.contains(['\r', '\n'])) {
                self.error(
                    slot,
                    400,
                    "bad_event_type",
                    "event type must not contain CR or LF",
                    close,
                );
                return;
            }
        }
        let Some((shard, sid)) = self.open_stream(slot, stream, close) else {
            return;
        };
        let log = self
            .logs
            .get_mut(&shard)
            .expect("owner core holds the shard");
        // A batch is all or nothing: check every event's framed size against the log's record
        // limit before appending any (data within --event-bytes-max can still frame larger,
        // each line break costing a `data: ` prefix; the log would refuse it mid-batch).
        let (record_max, tail, epoch) = (
            log.options().record_bytes_max as usize,
            log.bounds(sid).expect("stream exists").tail,
            log.epoch(),
        );
        let too_large = events.iter().enumerate().find_map(|(i, (ev, data))| {
            let id = EventId {
                epoch,
                stream: sid,
                seq: tail.saturating_add(1 + i as u64),
            };
            let (id_len, ev) = (id.encoded_len(), ev.as_deref());
            if sse::framed_event_bytes_bound(id_len, ev, data.len()) <= record_max {
                return None; // fits however its lines break: no need to scan it
            }
            let framed = sse::framed_event_bytes(id_len, ev, data);
            (framed > record_max).then(|| {
                format!(
                    "event {i}: framed record of {framed} bytes exceeds the record limit \
                     {record_max} (each line of data costs a `data: ` prefix)"
                )
            })
        });
        if let Some(msg) = too_large {
            self.error(slot, 413, "event_too_large", &msg, close);
            return;
        }
        let log = self
            .logs
            .get_mut(&shard)
            .expect("owner core holds the shard");
        let mut ids: Vec<EventId> = Vec::with_capacity(events.len());
        let mut all_durable = true;
        let mut last_seq = 0;
        for (ev, data) in &events {
            match log.append(sid, ev.as_deref(), data) {
                Ok(a) => {
                    all_durable &= a.durable;
                    last_seq = a.id.seq;
                    ids.push(a.id);
                }
                Err(e) => {
                    // Events before this one of a batch are in the log; say which.
                    let (status, code) = append_status(&e);
                    let ids: Vec<String> = ids.iter().map(EventId::to_string).collect();
                    let body = serde_json::json!({
                        "error": code, "message": e.to_string(), "appended_ids": ids,
                    });
                    self.record_appends(shard, sid, ids.len());
                    let b = http::json_response(status, &body, close);
                    self.send_response(slot, b, close);
                    return;
                }
            }
        }
        self.record_appends(shard, sid, ids.len());
        let response = http::created_response(&ids, batch, close);
        let wait = (!all_durable).then_some(((shard, sid), last_seq));
        self.enqueue(
            slot,
            Outgoing {
                bytes: response,
                wait,
                close,
            },
        );
    }

    fn record_appends(&mut self, shard: u32, sid: StreamId, n: usize) {
        if n == 0 {
            return;
        }
        self.m().events_appended_total.fetch_add(n as u64, Relaxed);
        if !self.appended_shards.contains(&shard) {
            self.appended_shards.push(shard);
        }
        self.touched.push((shard, sid));
    }

    /// Group commit once per turn, answer publishes that became durable, wake subscribers.
    fn after_turn(&mut self) {
        let now = self.now;
        let mut shards: Vec<u32> = std::mem::take(&mut self.appended_shards);
        for (&s, log) in &self.logs {
            if !shards.contains(&s) && log.next_sync_deadline().is_some_and(|d| d <= now) {
                shards.push(s);
            }
        }
        for s in shards {
            let log = self.logs.get_mut(&s).expect("own shard");
            match log.poll_sync(now) {
                Ok(report) => {
                    for (sid, _) in report.advanced.iter() {
                        self.touched.push((s, *sid));
                    }
                }
                Err(e) => eprintln!("core {}: sync of shard {s} failed: {e:?}", self.id),
            }
        }
        if self.touched.is_empty() {
            return;
        }
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable_by_key(|(s, id)| (*s, id.0));
        touched.dedup();
        self.complete_waits(&touched);
        // Collected first (pumping may close a subscriber and edit `subs`); the buffer is kept.
        let mut to_pump = std::mem::take(&mut self.to_pump);
        for key in &touched {
            to_pump.extend_from_slice(self.subs.get(key).map_or(&[][..], Vec::as_slice));
        }
        for &(slot, gen_) in &to_pump {
            if self.conn_mut(slot, gen_).is_some() {
                self.pump(slot);
            }
        }
        to_pump.clear();
        self.to_pump = to_pump;
        touched.clear();
        self.touched = touched;
    }

    /// Releases responses whose publish became visible (durable), then sends what is ready.
    fn complete_waits(&mut self, touched: &[StreamKey]) {
        if self.waiting.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut self.waiting);
        for (slot, gen_) in waiting {
            let logs = &self.logs;
            let Some(conn) = self.slots.get_mut(slot as usize).and_then(|s| {
                (s.gen_ & GEN_MASK == gen_)
                    .then_some(s.conn.as_mut())
                    .flatten()
            }) else {
                continue;
            };
            if conn.closing {
                continue;
            }
            let mut still = false;
            for o in conn.outbox.iter_mut() {
                if let Some((key, seq)) = o.wait {
                    let visible = touched
                        .contains(&key)
                        .then(|| logs[&key.0].bounds(key.1))
                        .flatten()
                        .is_some_and(|b| b.visible_tail >= seq);
                    if visible {
                        o.wait = None;
                    } else {
                        still = true;
                    }
                }
            }
            if still {
                self.waiting.push((slot, gen_));
            }
            self.flush(slot);
        }
    }

    // ---- subscribe ----

    fn subscribe(&mut self, slot: u32, stream: &str, q: route::SubscribeQuery) {
        let retry_ms = self.shared.cfg.retry_ms;
        // Subscribing creates the stream: subscribers commonly connect before the first publish.
        let Some((shard, sid)) = self.open_stream(slot, stream, true) else {
            return;
        };
        let log = self
            .logs
            .get_mut(&shard)
            .expect("owner core holds the shard");
        let key = (shard, sid);
        let bounds = log.bounds(sid).expect("stream exists");
        let epoch = log.epoch();
        let mut preamble = sse::subscribe_head(retry_ms);
        let mut aligned: Option<Vec<ParkedEvent<Bytes>>> = None;
        let cursor = match q.last_event_id.as_deref() {
            None => match q.from {
                route::From::Earliest => bounds.floor,
                route::From::Latest => bounds.visible_tail + 1,
            },
            Some(raw) => {
                let requested: EventId = match raw.parse() {
                    Ok(id) => id,
                    Err(e) => {
                        let msg = format!("Last-Event-ID {raw:?} is not an event ID: {e:?}");
                        self.error(slot, 400, "bad_last_event_id", &msg, true);
                        return;
                    }
                };
                let plan = self.plan(key, epoch, bounds, requested);
                match plan {
                    ResumePlan::Aligned {
                        window_from,
                        window_to,
                        then_log_from,
                    } => {
                        self.m().resume(ResumeClass::Aligned);
                        preamble = sse::subscribe_head_resumed(retry_ms, "aligned");
                        let parked = self.take_parked(key, window_from);
                        let evs: Vec<_> = parked
                            .into_iter()
                            .filter(|e| e.seq >= window_from && e.seq <= window_to)
                            .collect();
                        assert!(
                            evs.first().is_some_and(|e| e.seq == window_from)
                                && evs.last().is_some_and(|e| e.seq == window_to)
                                && evs.len() as u64 == window_to - window_from + 1,
                            "aligned plan must be backed by the parked window"
                        );
                        aligned = Some(evs);
                        then_log_from
                    }
                    ResumePlan::Replay { from } => {
                        self.m().resume(ResumeClass::Replay);
                        preamble = sse::subscribe_head_resumed(retry_ms, "replay");
                        from
                    }
                    ResumePlan::UpToDate { from } => {
                        self.m().resume(ResumeClass::UpToDate);
                        preamble = sse::subscribe_head_resumed(retry_ms, "up-to-date");
                        from
                    }
                    ResumePlan::Truncated {
                        requested,
                        floor,
                        tail,
                    } => {
                        self.m().resume(ResumeClass::Truncated);
                        preamble = sse::subscribe_head_resumed(retry_ms, "truncated");
                        let json =
                            sse::truncated_json(TruncatedReason::Truncated, requested, floor, tail);
                        match q.on_truncated {
                            OnTruncated::Error => {
                                let b =
                                    http::response(410, "application/json", json.as_bytes(), true);
                                self.send_response(slot, b, true);
                                return;
                            }
                            OnTruncated::Earliest => {
                                preamble.extend_from_slice(&sse::truncated_event(&json));
                                floor
                            }
                            OnTruncated::Latest => {
                                preamble.extend_from_slice(&sse::truncated_event(&json));
                                bounds.visible_tail + 1
                            }
                        }
                    }
                    ResumePlan::BeyondTail { requested, tail } => {
                        let body = serde_json::json!({
                            "error": "beyond_tail",
                            "message": "Last-Event-ID is beyond the stream's tail",
                            "requested": requested, "tail": tail,
                        });
                        self.refuse_resume(slot, ResumeClass::BeyondTail, &body);
                        return;
                    }
                    ResumePlan::WrongEpoch { got, expected } => {
                        let body = serde_json::json!({
                            "error": "wrong_epoch",
                            "message": "Last-Event-ID belongs to another incarnation of this log",
                            "got": format!("{:016x}", got.0), "expected": format!("{:016x}", expected.0),
                        });
                        self.refuse_resume(slot, ResumeClass::WrongEpoch, &body);
                        return;
                    }
                    ResumePlan::OtherStream { got, expected } => {
                        let body = serde_json::json!({
                            "error": "other_stream",
                            "message": "Last-Event-ID belongs to another stream",
                            "got": got.0, "expected": expected.0,
                        });
                        self.refuse_resume(slot, ResumeClass::OtherStream, &body);
                        return;
                    }
                }
            }
        };
        self.become_subscriber(slot, key, cursor, preamble, aligned);
    }

    fn plan(
        &mut self,
        key: StreamKey,
        epoch: Epoch,
        bounds: Bounds,
        requested: EventId,
    ) -> ResumePlan {
        let now = self.now;
        let parked = self.parked.get_mut(&key);
        let mut expired = 0;
        let window = parked.and_then(|list| {
            let before = list.len();
            list.retain(|p| p.expires > now);
            expired = before - list.len();
            let want = requested.seq.checked_add(1)?;
            list.iter()
                .find(|p| p.head == want)
                .or_else(|| list.back())
                .map(|p| log_store::WindowView {
                    epoch,
                    stream: key.1,
                    head: p.head,
                    last: p.last,
                    contiguous: true,
                })
        });
        // Expired windows dropped here leave the gauge too (else it only ever grows).
        self.m().parked_windows.fetch_sub(expired as u64, Relaxed);
        let input = log_store::ResumeInput {
            log_epoch: epoch,
            stream: key.1,
            bounds,
            requested,
            window,
            known_epochs: &self.shared.epochs,
        };
        log_store::plan_resume(&input)
    }

    fn take_parked(&mut self, key: StreamKey, head: Seq) -> Vec<ParkedEvent<Bytes>> {
        let list = self
            .parked
            .get_mut(&key)
            .expect("aligned implies a parked window");
        let i = list
            .iter()
            .position(|p| p.head == head)
            .expect("aligned implies a parked window with that head");
        let p = list.remove(i).expect("index valid");
        self.m().parked_windows.fetch_sub(1, Relaxed);
        p.events
    }

    fn become_subscriber(
        &mut self,
        slot: u32,
        key: StreamKey,
        cursor: Seq,
        preamble: Vec<u8>,
        aligned: Option<Vec<ParkedEvent<Bytes>>>,
    ) {
        let lowat = self.shared.cfg.notsent_lowat_bytes;
        let want_ts = self.shared.uring_cmd && !self.shared.cfg.no_tx_timestamps;
        let now = self.now;
        let gen_ = self.gen_of(slot);
        let conn = self.conn(slot);
        let fd = conn.fd;
        let _ = sys::set_notsent_lowat(fd, lowat);
        // Byte 0 of the window is the first byte written after this option is set: nothing is
        // in flight on this connection now (requests are answered one at a time).
        let ack = if want_ts && sys::enable_tx_ack_timestamps(fd).is_ok() {
            AckMode::TxTimestamps
        } else {
            AckMode::Outq
        };
        let mut window = Window::new();
        window.push_bytes(Run::whole(Bytes::Owned(preamble.into())));
        match aligned {
            Some(evs) => window.push_parked(evs),
            None => window.expect_next(cursor),
        }
        let sub = Sub {
            key,
            window,
            cursor,
            ack,
            finishing: false,
            end_after: None,
            last_write: now,
            ack_asked_at: None,
            ack_ask_in_send: false,
            ack_awaited: None,
            iov: Vec::with_capacity(64),
            // SAFETY: msghdr is plain data; all-zero is a valid empty header.
            msg: unsafe { std::mem::zeroed() },
        };
        conn.state = State::Sub(Box::new(sub));
        (conn.rpos, conn.rlen) = (0, 0);
        // A subscriber reads nothing more; the buffer shrinks now, or when a recv still in
        // flight from the HTTP phase completes (on_recv): never under a recv.
        if conn.inflight & F_RECV == 0 {
            conn.rbuf.truncate(512);
            conn.rbuf.shrink_to_fit();
        }
        self.subs.entry(key).or_default().push((slot, gen_));
        self.m().subscribers.fetch_add(1, Relaxed);
        if ack == AckMode::TxTimestamps {
            let conn = self.conn(slot);
            conn.inflight |= F_TXTS;
            conn.txts_serial = next_serial(&mut conn.serial);
            let e = opcode::UringCmd16::new(types::Fd(fd), SOCKET_URING_OP_TX_TIMESTAMP)
                .build()
                .user_data(ud_serial(slot, gen_, OP_TXTS, conn.txts_serial));
            // SAFETY: the command points at no memory of ours.
            unsafe { self.push(e) };
        }
        // EOF detection: the multishot poll (see arm_watch). A recv still in flight from the
        // HTTP phase hands over to the poll when it completes (on_recv).
        if self.conn(slot).inflight & F_RECV == 0 {
            self.arm_watch(slot);
        }
        self.pump(slot);
    }

    /// Moves a subscriber forward: refills its window from the log (up to the visible tail)
    /// and hands all unsent bytes to the kernel in one sendmsg, unless a send or a POLLOUT
    /// wait is already in flight.
    fn pump(&mut self, slot: u32) {
        let lag_max = self.shared.cfg.lag_events_max;
        let ack_interval = Duration::from_millis(self.shared.cfg.tx_ack_interval_ms);
        let send_max = self.shared.cfg.send_bytes_max;
        let now = self.now;
        let gen_ = self.gen_of(slot);
        let Some(conn) = self.slots[slot as usize].conn.as_mut() else {
            return;
        };
        if conn.closing || conn.inflight & (F_SEND | F_POLL) != 0 {
            return;
        }
        let fd = conn.fd;
        let State::Sub(sub) = &mut conn.state else {
            return;
        };
        let m = &self.shared.metrics[self.id];
        if !sub.finishing {
            let log = &self.logs[&sub.key.0];
            let b = log.bounds(sub.key.1).expect("subscribed stream exists");
            let behind = b.tail.saturating_sub(sub.cursor.saturating_sub(1));
            let unsent = sub.window.unsent_bytes() as usize;
            if behind > lag_max {
                let json =
                    sse::truncated_json(TruncatedReason::Lagging, sub.cursor, b.floor, b.tail);
                sub.window
                    .push_bytes(Run::whole(Bytes::Owned(sse::truncated_event(&json).into())));
                sub.finishing = true;
                m.lagging_closes_total.fetch_add(1, Relaxed);
            } else if unsent < send_max && sub.cursor <= b.visible_tail {
                match log.read(sub.key.1, sub.cursor, send_max - unsent) {
                    Ok(batch) => {
                        if !batch.record_lens.is_empty() {
                            assert_eq!(batch.first, sub.cursor, "log read starts at the cursor");
                            let chunks = batch.slices.into_iter().map(Bytes::Log).collect();
                            sub.window
                                .push_events(batch.first, chunks, &batch.record_lens);
                            sub.cursor = batch.last + 1;
                        }
                    }
                    Err(ReadError::Truncated {
                        requested,
                        floor,
                        tail,
                    }) => {
                        let json =
                            sse::truncated_json(TruncatedReason::Truncated, requested, floor, tail);
                        sub.window.push_bytes(Run::whole(Bytes::Owned(
                            sse::truncated_event(&json).into(),
                        )));
                        sub.finishing = true;
                        m.truncated_closes_total.fetch_add(1, Relaxed);
                    }
                    Err(e) => panic!("read of a subscribed stream failed: {e:?}"),
                }
            }
        }
        if sub.end_after.is_some_and(|e| sub.cursor > e) {
            sub.finishing = true;
        }
        if sub.window.unsent_bytes() == 0 {
            if sub.finishing {
                self.close_conn(slot);
            }
            return;
        }
        sub.iov.clear();
        let iov = &mut sub.iov;
        sub.window.for_each_unsent(IOV_MAX_PER_SEND, send_max, |s| {
            iov.push(libc::iovec {
                iov_base: s.as_ptr() as *mut libc::c_void,
                iov_len: s.len(),
            });
        });
        sub.msg.msg_iov = sub.iov.as_mut_ptr();
        sub.msg.msg_iovlen = sub.iov.len();
        // Ask for an ACK timestamp only when the previous one was answered and the interval
        // passed: one ACK confirms every byte before it, so the rest need none.
        sub.settle_ack_request();
        sub.ack_ask_in_send = sub.ack == AckMode::TxTimestamps
            && sub.ack_awaited.is_none()
            && sub
                .ack_asked_at
                .is_none_or(|t| now.duration_since(t) >= ack_interval);
        (sub.msg.msg_control, sub.msg.msg_controllen) = if sub.ack_ask_in_send {
            sub.ack_asked_at = Some(now);
            sys::tx_ack_cmsg()
        } else {
            (std::ptr::null_mut(), 0)
        };
        sub.last_write = now;
        let msg: *const libc::msghdr = &sub.msg;
        conn.inflight |= F_SEND;
        conn.send_serial = next_serial(&mut conn.serial);
        // One contiguous run and no control message (the common case for a live subscriber: the
        // next records of its stream lie side by side in the log): a plain send, which spares
        // the kernel importing a msghdr and an iovec array.
        let single = (sub.iov.len() == 1 && sub.msg.msg_controllen == 0)
            .then(|| u32::try_from(sub.iov[0].iov_len).ok())
            .flatten();
        let e = if let Some(len) = single {
            opcode::Send::new(types::Fd(fd), sub.iov[0].iov_base as *const u8, len)
                .flags(libc::MSG_NOSIGNAL)
                .build()
        } else {
            opcode::SendMsg::new(types::Fd(fd), msg)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build()
        }
        .user_data(ud_serial(slot, gen_, OP_SEND, conn.send_serial));
        // SAFETY: the msghdr and iovec array live in the boxed `Sub` of this slot, and every
        // iovec points into a chunk held by the window (a LogSlice keeps its segment mapped);
        // the control buffer, if any, is the never-freed `sys::tx_ack_cmsg`.
        // While F_SEND is set: the Sub is not dropped (close waits for F_SEND before freeing),
        // `iov`/`msg` are not modified (pump returns early), and the window releases no run at
        // or after `sent` (eviction stops at `acked <= sent`).
        unsafe { self.push(e) };
    }

    fn on_sub_sent(&mut self, slot: u32, n: u64) {
        let conn = self.conn(slot);
        let fd = conn.fd;
        let State::Sub(sub) = &mut conn.state else {
            unreachable!("checked by caller")
        };
        let before = sub.window.sent();
        let requested: u64 = sub.iov.iter().map(|v| v.iov_len as u64).sum();
        let sent_events = sub.window.events_ending_within(before, before + n);
        let mut confirmed = sub.window.on_sent(n);
        if std::mem::take(&mut sub.ack_ask_in_send) && n > 0 {
            // The timestamp key is the last byte this sendmsg queued (a send that queued
            // nothing stamps nothing).
            sub.ack_awaited = Some(sub.window.sent());
        }
        let acked_before = sub.window.acked();
        if sub.ack == AckMode::Outq {
            confirmed += sub.confirm_from_outq(fd);
        }
        let acked_bytes = sub.window.acked() - acked_before;
        let partial = n < requested;
        let m = &self.shared.metrics[self.id];
        m.bytes_confirmed_total.fetch_add(acked_bytes, Relaxed);
        m.bytes_sent_total.fetch_add(n, Relaxed);
        m.events_sent_total.fetch_add(sent_events as u64, Relaxed);
        m.events_confirmed_total
            .fetch_add(confirmed as u64, Relaxed);
        if partial {
            // The socket is above TCP_NOTSENT_LOWAT: wait until it drains below it; the rest
            // of the backlog stays in the log meanwhile.
            let gen_ = self.gen_of(slot);
            let conn = self.conn(slot);
            conn.inflight |= F_POLL;
            conn.poll_serial = next_serial(&mut conn.serial);
            let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLOUT as u32)
                .build()
                .user_data(ud_serial(slot, gen_, OP_POLL, conn.poll_serial));
            // SAFETY: poll points at no memory of ours.
            unsafe { self.push(e) };
        } else {
            self.pump(slot);
        }
    }

    fn on_tx_timestamp(&mut self, slot: u32, res: i32, flags: u32) {
        let gen_ = self.gen_of(slot);
        let conn = self.slots[slot as usize].conn.as_mut().expect("live");
        let fd = conn.fd;
        let more = cqueue::more(flags);
        let State::Sub(sub) = &mut conn.state else {
            return;
        };
        if res < 0 {
            // Not supported on this socket/kernel (or the command ended): fall back to
            // SIOCOUTQ accounting for this connection.
            sub.ack = AckMode::Outq;
            self.shared.metrics[self.id]
                .outq_fallbacks_total
                .fetch_add(1, Relaxed);
            return;
        }
        let kind = flags >> IORING_TIMESTAMP_TYPE_SHIFT;
        if kind == SCM_TSTAMP_ACK {
            self.shared.metrics[self.id]
                .tx_ack_timestamps_total
                .fetch_add(1, Relaxed);
            let acked = crate::window::acked_from_tskey(res as u32, sub.window.queued());
            let before = sub.window.acked();
            let confirmed = sub.window.on_acked(acked);
            let bytes = sub.window.acked() - before;
            let m = &self.shared.metrics[self.id];
            m.events_confirmed_total
                .fetch_add(confirmed as u64, Relaxed);
            m.bytes_confirmed_total.fetch_add(bytes, Relaxed);
        }
        if !more {
            conn.inflight |= F_TXTS;
            conn.txts_serial = next_serial(&mut conn.serial);
            let e = opcode::UringCmd16::new(types::Fd(fd), SOCKET_URING_OP_TX_TIMESTAMP)
                .build()
                .user_data(ud_serial(slot, gen_, OP_TXTS, conn.txts_serial));
            // SAFETY: the command points at no memory of ours.
            unsafe { self.push(e) };
        }
    }

    // ---- closing ----

    fn close_conn(&mut self, slot: u32) {
        self.mcp_conn_closed(slot);
        let grace = Duration::from_secs(self.shared.cfg.resume_grace_secs);
        let parked_max = self.shared.cfg.parked_windows_per_stream_max;
        let now = self.now;
        let conn = self.slots[slot as usize].conn.as_mut().expect("live slot");
        if conn.closing {
            return;
        }
        conn.closing = true;
        let fd = conn.fd;
        let inflight = conn.inflight;
        if let State::Sub(sub) = &mut conn.state {
            let key = sub.key;
            // ACKs whose timestamp completions are not reaped yet: SIOCOUTQ (write_seq -
            // snd_una, still meaningful after a reset) tightens the window to what the peer
            // really confirmed, so the parked head is as exact as the kernel knows it.
            sub.confirm_from_outq_counted(fd, &self.shared.metrics[self.id]);
            let events = sub.window.take_events();
            if let Some(list) = self.subs.get_mut(&key) {
                list.retain(|(s, _)| *s != slot);
            }
            self.shared.metrics[self.id]
                .subscribers
                .fetch_sub(1, Relaxed);
            if !events.is_empty()
                && grace > Duration::ZERO
                && parked_max > 0
                && self.shutting_down.is_none()
            {
                let list = self.parked.entry(key).or_default();
                list.push_back(Parked {
                    head: events[0].seq,
                    last: events[events.len() - 1].seq,
                    events,
                    expires: now + grace,
                });
                self.shared.metrics[self.id]
                    .parked_windows
                    .fetch_add(1, Relaxed);
                if list.len() > parked_max {
                    list.pop_front();
                    self.shared.metrics[self.id]
                        .parked_windows
                        .fetch_sub(1, Relaxed);
                }
            }
        }
        sys::shutdown(fd);
        // Cancel each operation still in flight by its user_data. Not by fd: the kernel
        // matches a cancel by fd by walking every armed poll entry of the ring (its poll table
        // is hashed by user_data), so with N subscribers each close cost O(N) and closing them
        // all O(N^2) — seconds of a stalled reactor at 20k connections (perf: 81 % in
        // io_cancel_req_match), with the listener's backlog unserved meanwhile. By user_data
        // it is one hash bucket, and it cannot hit a socket that reuses the fd number either.
        let gen_ = self.gen_of(slot);
        let c = self.conn(slot);
        let serials = [
            (F_RECV, OP_RECV, c.recv_serial),
            (F_SEND, OP_SEND, c.send_serial),
            (F_POLL, OP_POLL, c.poll_serial),
            (F_TXTS, OP_TXTS, c.txts_serial),
            (F_WATCH, OP_WATCH, c.watch_serial),
        ];
        for (bit, op, serial) in serials {
            if inflight & bit != 0 {
                let e = opcode::AsyncCancel::new(ud_serial(slot, gen_, op, serial))
                    .build()
                    .user_data(ud(0, 0, OP_CANCEL));
                // SAFETY: cancel points at no memory of ours.
                unsafe { self.push(e) };
            }
        }
        self.maybe_free(slot);
    }

    fn maybe_free(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        let conn = s.conn.as_ref().expect("live");
        if !conn.closing || conn.inflight & F_OWNING != 0 {
            return;
        }
        let conn = s.conn.take().expect("live");
        s.serial = conn.serial;
        sys::close(conn.fd);
        self.free.push(slot);
        self.shared.connections.fetch_sub(1, Relaxed);
        self.m().connections.fetch_sub(1, Relaxed);
    }

    // ---- timers ----

    fn tick(&mut self) {
        let now = self.now;
        if self.accept_paused && self.shutting_down.is_none() {
            self.accept_paused = false;
            self.arm_accept();
        }
        let cfg = &self.shared.cfg;
        let idle = Duration::from_secs(cfg.idle_timeout_secs);
        let header = Duration::from_secs(cfg.header_timeout_secs);
        let keepalive = Duration::from_secs(cfg.keepalive_secs);
        let mut to_close = Vec::new();
        let mut to_pump = Vec::new();
        let mut timeouts = Vec::new();
        let (mut inflight_bytes, mut lag_max, mut answers) = (0u64, 0u64, 0u64);
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Some(conn) = s.conn.as_mut() else {
                continue;
            };
            if conn.closing {
                continue;
            }
            match &mut conn.state {
                State::Http => {
                    answers += (conn.outbox_bytes + (conn.wbuf.len() - conn.woff)) as u64;
                    if conn.inflight & F_SEND != 0 || !conn.outbox.is_empty() {
                        continue;
                    }
                    if let Some(t) = conn.head_started
                        && !conn.awaiting_body
                        && now.duration_since(t) >= header
                    {
                        timeouts.push(i as u32);
                    } else if (conn.head_started.is_none() || conn.awaiting_body)
                        && now.duration_since(conn.idle_since) >= idle
                    {
                        to_close.push(i as u32);
                    }
                }
                State::Sub(sub) => {
                    // Outq mode, or sampled ACK timestamps with no request outstanding: the
                    // bytes sent since the last request are confirmed by polling SIOCOUTQ.
                    sub.settle_ack_request();
                    // (An answer that never comes, say on a connection the peer stopped
                    // ACKing, must not stop confirmation: after a second, poll anyway.)
                    let stale = sub
                        .ack_asked_at
                        .is_some_and(|t| now.duration_since(t) >= ACK_ANSWER_WAIT_MAX);
                    let poll = sub.ack == AckMode::Outq || sub.ack_awaited.is_none() || stale;
                    if poll && sub.window.unconfirmed_bytes() > 0 {
                        sub.confirm_from_outq_counted(conn.fd, &self.shared.metrics[self.id]);
                    }
                    inflight_bytes += sub.window.unconfirmed_bytes();
                    if let Some(b) = self.logs[&sub.key.0].bounds(sub.key.1) {
                        lag_max = lag_max.max(b.tail.saturating_sub(sub.cursor.saturating_sub(1)));
                    }
                    if conn.inflight & (F_SEND | F_POLL) == 0
                        && sub.window.unsent_bytes() == 0
                        && now.duration_since(sub.last_write) >= keepalive
                    {
                        sub.window
                            .push_bytes(Run::whole(Bytes::Static(sse::KEEPALIVE)));
                    }
                    to_pump.push(i as u32);
                }
            }
        }
        let m = &self.shared.metrics[self.id];
        m.inflight_bytes.store(inflight_bytes, Relaxed);
        m.answer_bytes_queued.store(answers, Relaxed);
        m.lag_events_max.store(lag_max, Relaxed);
        for slot in timeouts {
            self.error(
                slot,
                408,
                "request_timeout",
                "request head not completed within --header-timeout-secs",
                true,
            );
        }
        for slot in to_close {
            self.close_conn(slot);
        }
        for slot in to_pump {
            self.pump(slot);
        }
        // Parked windows past their grace period.
        let mut expired = 0;
        for list in self.parked.values_mut() {
            let before = list.len();
            list.retain(|p| p.expires > now);
            expired += before - list.len();
        }
        self.m().parked_windows.fetch_sub(expired as u64, Relaxed);
        if now >= self.next_retention {
            self.next_retention = now + Duration::from_secs(1);
            let wall = SystemTime::now();
            for (s, log) in self.logs.iter_mut() {
                if let Err(e) = log.enforce_retention(wall) {
                    eprintln!("core {}: retention on shard {s}: {e:?}", self.id);
                }
            }
            self.snapshot_streams();
        }
        if self.shared.shutdown.load(Relaxed) && self.shutting_down.is_none() {
            self.begin_shutdown();
        }
    }

    fn snapshot_streams(&mut self) {
        let mut out = String::new();
        let mut shards: Vec<_> = self.logs.keys().copied().collect();
        shards.sort_unstable();
        for s in shards {
            for (_, name, b) in self.logs[&s].streams() {
                metrics::stream_lines(&mut out, s, name, b.floor, b.tail, b.visible_tail);
            }
        }
        *self.m().streams_snapshot.lock().expect("metrics lock") = out;
    }

    /// Stop accepting, make everything durable, answer waiting publishes, close the rest.
    fn begin_shutdown(&mut self) {
        if self.shutting_down.is_some() {
            return;
        }
        self.shutting_down = Some(self.now + Duration::from_secs(3));
        self.mcp_shutdown();
        if let Some(l) = self.listener.take() {
            let e = opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(l)).all())
                .build()
                .user_data(ud(0, 0, OP_CANCEL));
            // SAFETY: cancel points at no memory of ours.
            unsafe { self.push(e) };
            sys::close(l);
        }
        let mut touched = Vec::new();
        for (&s, log) in self.logs.iter_mut() {
            match log.sync_now() {
                Ok(r) => touched.extend(r.advanced.iter().map(|(sid, _)| (s, *sid))),
                Err(e) => eprintln!("core {}: shutdown sync of shard {s}: {e:?}", self.id),
            }
        }
        for (slot, gen_) in self.waiting.clone() {
            if let Some(conn) = self.conn_mut(slot, gen_) {
                touched.extend(conn.outbox.iter().filter_map(|o| o.wait.map(|w| w.0)));
            }
        }
        touched.sort_unstable_by_key(|(s, id)| (*s, id.0));
        touched.dedup();
        self.complete_waits(&touched);
        for i in 0..self.slots.len() as u32 {
            let Some(conn) = self.slots[i as usize].conn.as_mut() else {
                continue;
            };
            if conn.inflight & F_SEND != 0 && matches!(conn.state, State::Http) {
                conn.close_after_write = true;
            } else if !conn.closing {
                self.close_conn(i);
            }
        }
    }
}

/// io_uring_enter errors that pass once completions are reaped or memory frees up.
fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::EBUSY | libc::EAGAIN | libc::ENOMEM)
    )
}

/// Status and code for a failed append or stream creation.
fn append_status(e: &log_store::AppendError) -> (u16, &'static str) {
    use log_store::AppendError as E;
    match e {
        E::DiskFull => (507, "insufficient_storage"),
        E::RecordTooLarge { .. } => (413, "event_too_large"),
        E::EventTypeHasLineBreak => (400, "bad_event_type"),
        E::DataNotUtf8 { .. } => (400, "bad_data"),
        E::StreamNameInvalid(_) => (400, "bad_stream_name"),
        E::TooManyStreams => (507, "too_many_streams"),
        _ => (500, "append_failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every field survives the round trip, within its width.
        #[test]
        fn user_data_round_trips(slot in 0u32..(SLOTS_MAX as u32), gen_: u32, serial: u32, op in 0u8..16) {
            let (s, g, n, o) = ud_split(ud_serial(slot, gen_, op, serial));
            prop_assert_eq!((s, g, n, o), (slot, gen_ & GEN_MASK, serial & SERIAL_MASK, op));
        }
    }

    /// Two operations of one slot fewer than 2^20 apart never share a user_data: a stray
    /// completion of an earlier one cannot pass for the one in flight unless 2^20 operations
    /// separate them.
    #[test]
    fn consecutive_serials_differ_until_they_wrap() {
        let mut seen = std::collections::HashSet::new();
        let mut counter = 0u32;
        for _ in 0..=SERIAL_MASK {
            let serial = next_serial(&mut counter);
            assert!(seen.insert(ud_serial(7, 3, OP_SEND, serial)));
        }
        let serial = next_serial(&mut counter);
        assert!(
            !seen.insert(ud_serial(7, 3, OP_SEND, serial)),
            "wraps at 2^20"
        );
    }
}
