//! The driver of one core: the op table and the memory every in-flight operation points at,
//! over a [`Ring`] that executes the operations (the kernel's io_uring, [`KernelRing`], or
//! the simulator's). Each `unsafe` block's proof is local: an operation's buffers are moved
//! into the driver when it is submitted and handed back only with its completion
//! ([`Completion`]), so nothing else can free, move or touch them meanwhile.
//!
//! It knows nothing of HTTP, SSE, streams or the log's meaning: it submits, reaps and matches.
//! Every completion is matched to exactly one submission by the [`OpTable`]; one that matches
//! nothing in flight is counted ([`Driver::unmatched`]) and never acted on.

pub mod kernel;
pub mod lap;
mod mem;
pub mod op;
pub mod ring;
mod syncfs;
pub mod table;

pub use mem::{Bytes, SendMem, Vectored};

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

pub use kernel::KernelRing;
pub use op::{Op, SLOTS_MAX, UserData};
pub use ring::{CQE_F_MORE, Ring, Sqe};
pub use table::{Match, OpTable, Unmatched};

use crate::sys;

/// Iovecs one vectored send carries at most (`IOV_MAX`).
pub const IOV_MAX_PER_SEND: usize = 1024;

/// A matched completion, with the memory its operation owned.
#[derive(Debug)]
pub enum Completion {
    /// A connection accepted (its fd, owned from here on), or the accept's error (-errno).
    Accept {
        fd: Result<OwnedFd, i32>,
        more: bool,
    },
    EventFd {
        res: i32,
    },
    Recv {
        slot: u32,
        res: i32,
        buf: Vec<u8>,
    },
    Send {
        slot: u32,
        res: i32,
        mem: SendMem,
    },
    PollOut {
        slot: u32,
    },
    Watch {
        slot: u32,
        res: i32,
        more: bool,
    },
    TxTimestamp {
        slot: u32,
        res: i32,
        flags: u32,
        more: bool,
    },
    /// An `fdatasync` of one of `shard`'s segment files completed (`res` 0 or -errno).
    Fsync {
        shard: u32,
        res: i32,
    },
    /// A `syncfs` covering round `round` of group commits completed (`res` 0 or -errno).
    SyncFs {
        round: u32,
        res: i32,
    },
    /// A subscriber's read-ahead completed (the pages are in memory; the bytes read are
    /// dropped). Its result is not needed: a failed read-ahead only means the send faults the
    /// pages in itself, as it would have without one.
    Prefetch {
        slot: u32,
    },
}

impl Completion {
    /// The connection slot a connection's completion is for; `None` for an accept, the
    /// eventfd or an fsync (the core's own).
    pub fn conn_slot(&self) -> Option<u32> {
        match *self {
            Completion::Recv { slot, .. }
            | Completion::Send { slot, .. }
            | Completion::PollOut { slot }
            | Completion::Watch { slot, .. }
            | Completion::TxTimestamp { slot, .. }
            | Completion::Prefetch { slot, .. } => Some(slot),
            Completion::Accept { .. }
            | Completion::EventFd { .. }
            | Completion::Fsync { .. }
            | Completion::SyncFs { .. } => None,
        }
    }
}

/// A reaped CQE, not yet matched: `(user_data, result, flags)`.
pub type Cqe = (u64, i32, u32);

/// Memory of the operations in flight on one slot.
#[derive(Debug, Default)]
struct SlotMem {
    recv: Option<Vec<u8>>,
    send: Option<SendMem>,
    /// The scratch buffer of a read-ahead in flight.
    prefetch: Option<Vec<u8>>,
}

/// Counts of completions that matched nothing in flight, by kind.
#[derive(Debug, Default, Clone, Copy)]
pub struct UnmatchedCounts {
    pub repeat: u64,
    pub unknown: u64,
    /// Completions read back from a stale last ring slot ([`lap`]), dropped before matching.
    pub stale_slot: u64,
}

/// Where a driver's operations go: the kernel's io_uring, dispatched statically (the hot path
/// of every send), or another [`Ring`] (the simulator's).
// One per core: boxing the kernel ring would only add an indirection to every submission.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Kernel(KernelRing),
    Other(Box<dyn Ring>),
}

impl Backend {
    fn ring(&mut self) -> &mut dyn Ring {
        match self {
            Backend::Kernel(k) => k,
            Backend::Other(r) => r.as_mut(),
        }
    }
}

/// One core's driver.
pub struct Driver {
    /// First: dropped before the memory its operations point at.
    ring: Backend,
    table: OpTable,
    mem: Vec<SlotMem>,
    /// The eventfd read's 8-byte buffer (boxed: its address is fixed for the ring's life).
    efd_buf: Box<u64>,
    unmatched: UnmatchedCounts,
    /// Serial of the core-wide operations' armings (accept, eventfd read): no two armings
    /// share a user_data, so a genuine completion never repeats a stale one exactly.
    core_serial: u32,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("live", &self.table.live())
            .field("unmatched", &self.unmatched)
            .finish()
    }
}

impl Driver {
    /// A driver over the kernel's io_uring, sized for `connections_max`.
    pub fn new(connections_max: usize) -> std::io::Result<Driver> {
        Ok(Driver::with(Backend::Kernel(KernelRing::new(
            connections_max,
        )?)))
    }

    /// Starts the kernel ring's `syncfs` thread now (`--fsync-scope filesystem`), not at the
    /// first round; other rings need none.
    pub fn start_syncfs(&mut self) -> std::io::Result<()> {
        match &mut self.ring {
            Backend::Kernel(k) => k.start_syncfs(),
            Backend::Other(_) => Ok(()),
        }
    }

    /// A driver over `ring`.
    pub fn over(ring: Box<dyn Ring>) -> Driver {
        Driver::with(Backend::Other(ring))
    }

    fn with(ring: Backend) -> Driver {
        Driver {
            core_serial: 0,
            ring,
            table: OpTable::default(),
            mem: Vec::new(),
            efd_buf: Box::new(0),
            unmatched: UnmatchedCounts::default(),
        }
    }

    /// The reactor's clock (the ring's: the simulator's is simulated).
    pub fn now(&self) -> Instant {
        match &self.ring {
            Backend::Kernel(k) => k.now(),
            Backend::Other(r) => r.now(),
        }
    }

    /// Completions that matched nothing in flight so far.
    pub fn unmatched(&self) -> UnmatchedCounts {
        let stale_slot = match &self.ring {
            Backend::Kernel(k) => k.stale_dropped(),
            Backend::Other(r) => r.stale_dropped(),
        };
        UnmatchedCounts {
            stale_slot,
            ..self.unmatched
        }
    }

    // ---- slots ----

    /// A slot for a new connection.
    pub fn open_slot(&mut self) -> u32 {
        let (slot, _) = self.table.alloc();
        if self.mem.len() <= slot as usize {
            self.mem.resize_with(slot as usize + 1, SlotMem::default);
        }
        slot
    }

    /// Frees a slot whose memory-owning operations have all completed (asserted).
    pub fn close_slot(&mut self, slot: u32) {
        self.table.release(slot);
        let m = &self.mem[slot as usize];
        debug_assert!(m.recv.is_none() && m.send.is_none());
    }

    /// The generation of a live slot (to recognise it across turns).
    pub fn generation(&self, slot: u32) -> u32 {
        self.table.generation(slot)
    }

    pub fn in_flight(&self, slot: u32, op: Op) -> bool {
        self.table.in_flight(slot, op)
    }

    /// Whether an operation that owns connection memory is still in flight on `slot`.
    pub fn owning_in_flight(&self, slot: u32) -> bool {
        self.table.owning_in_flight(slot)
    }

    // ---- submissions ----

    /// Queues an operation with `user_data` on the ring.
    ///
    /// # Safety
    /// Every buffer and iovec the operation points at must stay valid and unmoved until its
    /// completion is reaped.
    unsafe fn push(&mut self, sqe: Sqe, user_data: u64) {
        match &mut self.ring {
            // SAFETY: forwarded from the caller's contract.
            Backend::Kernel(k) => unsafe { k.push(sqe, user_data) },
            // SAFETY: forwarded from the caller's contract.
            Backend::Other(r) => unsafe { r.push(sqe, user_data) },
        }
    }

    /// The user_data of a new arming of a core-wide operation.
    fn core_arming(&mut self, op: Op) -> u64 {
        UserData {
            serial: op::next_serial(&mut self.core_serial),
            ..UserData::core(op)
        }
        .pack()
    }

    /// Multishot accept on `listener`.
    pub fn accept(&mut self, listener: RawFd) {
        let ud = self.core_arming(Op::Accept);
        // SAFETY: multishot accept points at no memory of ours.
        unsafe { self.push(Sqe::AcceptMulti { fd: listener }, ud) };
    }

    /// `fdatasync` of a log segment file of `shard` (`IORING_FSYNC_DATASYNC`); the file must
    /// stay open until the completion (the caller's `SyncJob` holds it).
    pub fn fsync(&mut self, shard: u32, fd: RawFd) {
        let ud = UserData {
            slot: shard,
            serial: op::next_serial(&mut self.core_serial),
            ..UserData::core(Op::Fsync)
        };
        // SAFETY: fsync points at no memory of ours.
        unsafe { self.push(Sqe::Fsync { fd }, ud.pack()) };
    }

    /// `syncfs` of the filesystem holding `fd`, for round `round` of group commits; `fd`
    /// must stay open until the completion (the caller's `Hub` holds it).
    pub fn syncfs(&mut self, round: u32, fd: RawFd) {
        let ud = UserData {
            slot: round,
            serial: op::next_serial(&mut self.core_serial),
            ..UserData::core(Op::SyncFs)
        };
        // SAFETY: syncfs points at no memory of ours.
        unsafe { self.push(Sqe::SyncFs { fd }, ud.pack()) };
    }

    /// Cancels every operation on `fd` (the listener, at shutdown).
    pub fn cancel_fd(&mut self, fd: RawFd) {
        let ud = UserData::core(Op::Cancel).pack();
        // SAFETY: cancel points at no memory of ours.
        unsafe { self.push(Sqe::CancelFd { fd }, ud) };
    }

    /// The 8-byte read on the core's eventfd.
    pub fn read_eventfd(&mut self, efd: RawFd) {
        let ud = self.core_arming(Op::EventFd);
        let ptr: *mut u64 = &mut *self.efd_buf;
        let e = Sqe::Read {
            fd: efd,
            ptr: ptr.cast(),
            len: 8,
            offset: 0,
        };
        // SAFETY: `efd_buf` is a Box owned by the driver, which owns the ring (dropped first,
        // as the first field): it outlives the ring's use of it, and nothing else reads or
        // writes it.
        unsafe { self.push(e, ud) };
    }

    /// A receive into `buf[from..]`; the buffer comes back with the completion.
    pub fn recv(&mut self, slot: u32, fd: RawFd, mut buf: Vec<u8>, from: usize) {
        assert!(from < buf.len(), "a recv needs room");
        let ud = self.table.begin(slot, Op::Recv);
        let ptr = buf[from..].as_mut_ptr();
        let len = (buf.len() - from) as u32;
        let m = &mut self.mem[slot as usize];
        debug_assert!(m.recv.is_none());
        m.recv = Some(buf); // moving a Vec does not move its heap buffer
        let e = Sqe::Recv { fd, ptr, len };
        // SAFETY: `ptr..ptr+len` lies in the heap buffer of the Vec now held in this slot's
        // `mem.recv`, which is handed back only with the op's completion (`complete`).
        unsafe { self.push(e, ud.pack()) };
    }

    /// Sends `buf[from..]`; the buffer comes back with the completion.
    pub fn send(&mut self, slot: u32, fd: RawFd, buf: Vec<u8>, from: usize) {
        assert!(from < buf.len(), "a send needs bytes");
        let ud = self.table.begin(slot, Op::Send);
        let ptr = buf[from..].as_ptr();
        let len = (buf.len() - from) as u32;
        let m = &mut self.mem[slot as usize];
        debug_assert!(m.send.is_none());
        m.send = Some(SendMem::Buf(buf));
        let e = Sqe::Send { fd, ptr, len };
        // SAFETY: the bytes lie in the heap buffer of the Vec held in this slot's `mem.send`
        // until the completion hands it back.
        unsafe { self.push(e, ud.pack()) };
    }

    /// Sends the runs of `v` (one plain `SEND` when it is a single run with no control
    /// message, else a `SENDMSG` with iovecs); `v` comes back with the completion.
    pub fn send_vectored(&mut self, slot: u32, fd: RawFd, mut v: Box<Vectored>) {
        assert!(!v.is_empty() && v.runs.len() <= IOV_MAX_PER_SEND);
        let ud = self.table.begin(slot, Op::Send);
        let ask_tx_ack = v.ask_tx_ack;
        let Vectored { runs, iov, msg, .. } = &mut *v;
        iov.clear();
        iov.extend(runs.iter().map(|(b, off, len)| libc::iovec {
            iov_base: b.as_slice()[*off..].as_ptr() as *mut libc::c_void,
            iov_len: *len,
        }));
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len();
        (msg.msg_control, msg.msg_controllen) = if ask_tx_ack {
            sys::tx_ack_cmsg()
        } else {
            (std::ptr::null_mut(), 0)
        };
        let single = (v.iov.len() == 1 && !v.ask_tx_ack)
            .then(|| u32::try_from(v.iov[0].iov_len).ok())
            .flatten();
        let e = match single {
            Some(len) => Sqe::Send {
                fd,
                ptr: v.iov[0].iov_base as *const u8,
                len,
            },
            None => Sqe::SendMsg {
                fd,
                msg: &raw const v.msg,
            },
        };
        self.mem[slot as usize].send = Some(SendMem::Vectored(v));
        // SAFETY: the msghdr and iovec array live in the boxed `Vectored` now held in this
        // slot's `mem.send` (moving the Box does not move them); every iovec points into the
        // bytes of a run that the same `Vectored` holds (`Bytes` never moves its bytes); the
        // control buffer, if any, is the static `sys::tx_ack_cmsg`. All of it is handed back
        // only with the op's completion.
        unsafe { self.push(e, ud.pack()) };
    }

    /// Reads `len` bytes of `file` at `offset` into a scratch buffer, so that the pages of a cold
    /// log segment are in memory before a send points at them (a send from the mapping would
    /// otherwise fault them in synchronously, stalling the reactor). `file` must stay open until
    /// the completion (the subscriber's window holds the segment).
    pub fn prefetch(&mut self, slot: u32, file: RawFd, offset: u64, len: usize) {
        let ud = self.table.begin(slot, Op::Prefetch);
        let mut buf = vec![0u8; len];
        let ptr = buf.as_mut_ptr();
        let m = &mut self.mem[slot as usize];
        debug_assert!(m.prefetch.is_none());
        m.prefetch = Some(buf);
        let e = Sqe::Read {
            fd: file,
            ptr,
            len: len as u32,
            offset,
        };
        // SAFETY: the buffer is the heap allocation of the Vec now held in this slot's
        // `mem.prefetch`, handed back (dropped) only with the op's completion.
        unsafe { self.push(e, ud.pack()) };
    }

    /// A single-shot `POLLOUT` wait.
    pub fn poll_out(&mut self, slot: u32, fd: RawFd) {
        let ud = self.table.begin(slot, Op::PollOut);
        let e = Sqe::Poll {
            fd,
            mask: libc::POLLOUT as u32,
            multi: false,
        };
        // SAFETY: poll points at no memory of ours.
        unsafe { self.push(e, ud.pack()) };
    }

    /// A multishot `POLLIN | POLLRDHUP` watch.
    pub fn watch(&mut self, slot: u32, fd: RawFd) {
        let ud = self.table.begin(slot, Op::Watch);
        let mask = (libc::POLLIN | libc::POLLRDHUP) as u32;
        let e = Sqe::Poll {
            fd,
            mask,
            multi: true,
        };
        // SAFETY: poll points at no memory of ours.
        unsafe { self.push(e, ud.pack()) };
    }

    /// The multishot TX-timestamp command.
    pub fn tx_timestamps(&mut self, slot: u32, fd: RawFd) {
        let ud = self.table.begin(slot, Op::TxTimestamps);
        // SAFETY: the command points at no memory of ours.
        unsafe { self.push(Sqe::TxTimestamps { fd }, ud.pack()) };
    }

    /// Cancels every operation in flight on `slot`, each by its user_data. Not by fd: the
    /// kernel matches a cancel by fd by walking every armed poll entry of the ring, which made
    /// closing N subscribers O(N²); by user_data it is one hash bucket, and it cannot hit a
    /// socket that reuses the fd number either.
    pub fn cancel_slot(&mut self, slot: u32) {
        for ud in self.table.in_flight_ops(slot) {
            let e = Sqe::Cancel {
                user_data: ud.pack(),
            };
            // SAFETY: cancel points at no memory of ours.
            unsafe { self.push(e, UserData::core(Op::Cancel).pack()) };
        }
    }

    // ---- completions ----

    /// Submits, then waits up to `timeout` for a completion (not at all while submissions
    /// wait for room).
    pub fn submit_and_wait(&mut self, timeout: Duration) {
        self.ring.ring().submit_and_wait(timeout);
    }

    /// Every CQE ready now, unmatched (match each with [`Driver::complete`] in order: acting
    /// on one may close a connection the next one names).
    pub fn reap(&mut self, out: &mut Vec<Cqe>) {
        self.ring.ring().reap(out);
    }

    /// Matches one CQE against the op table: the completion to act on, with its memory, or
    /// `None` for a cancel's own CQE, a stale one, or one that matches nothing in flight
    /// (counted).
    pub fn complete(&mut self, (u, res, flags): Cqe) -> Option<Completion> {
        let more = flags & CQE_F_MORE != 0;
        let Some(ud) = UserData::unpack(u) else {
            self.unmatched.unknown += 1;
            return None;
        };
        if ud.op.conn_index().is_none() {
            return core_completion(ud, res, more);
        }
        match self.table.complete(ud, more) {
            Match::Genuine { .. } => {}
            Match::Stale => return None,
            Match::Unmatched(kind) => {
                self.count_unmatched(ud, kind, res, flags);
                return None;
            }
        }
        let slot = ud.slot;
        let m = &mut self.mem[slot as usize];
        Some(match ud.op {
            Op::Recv => Completion::Recv {
                slot,
                res,
                buf: m.recv.take().expect("a recv in flight holds its buffer"),
            },
            Op::Send => Completion::Send {
                slot,
                res,
                mem: m.send.take().expect("a send in flight holds its memory"),
            },
            Op::PollOut => Completion::PollOut { slot },
            Op::Watch => Completion::Watch { slot, res, more },
            Op::Prefetch => {
                m.prefetch
                    .take()
                    .expect("a read-ahead in flight holds its buffer");
                Completion::Prefetch { slot }
            }
            Op::TxTimestamps => Completion::TxTimestamp {
                slot,
                res,
                flags,
                more,
            },
            Op::Accept | Op::EventFd | Op::Cancel | Op::Fsync | Op::SyncFs => {
                unreachable!("handled above")
            }
        })
    }

    fn count_unmatched(&mut self, ud: UserData, kind: Unmatched, res: i32, flags: u32) {
        let n = self.unmatched.repeat + self.unmatched.unknown;
        match kind {
            Unmatched::Repeat => self.unmatched.repeat += 1,
            Unmatched::Unknown => self.unmatched.unknown += 1,
        }
        if n < 10 {
            tracing::warn!(
                "ignored an unmatched completion ({kind:?}) on slot {}: {:?}, serial {}, \
                 result {res}, flags {flags:#x}",
                ud.slot,
                ud.op,
                ud.serial
            );
        }
    }
}

/// A core-wide operation's completion (accept, the eventfd, a sync; a cancel's own is
/// nothing): not in the op table, acted on as it comes.
fn core_completion(ud: UserData, res: i32, more: bool) -> Option<Completion> {
    Some(match ud.op {
        Op::Accept => {
            let fd = if res < 0 {
                Err(res)
            } else {
                // SAFETY: a successful accept's result is a new descriptor the kernel
                // created for this ring's owner; nothing else holds or closes it.
                Ok(unsafe { OwnedFd::from_raw_fd(res) })
            };
            Completion::Accept { fd, more }
        }
        Op::EventFd => Completion::EventFd { res },
        Op::Fsync => Completion::Fsync {
            shard: ud.slot,
            res,
        },
        Op::SyncFs => Completion::SyncFs {
            round: ud.slot,
            res,
        },
        Op::Cancel => return None,
        _ => unreachable!("a connection's operation is matched in the op table"),
    })
}
