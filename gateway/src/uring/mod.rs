//! The io_uring driver of one core: the ring, the submission backlog, the op table and the
//! memory every in-flight operation points at. All of the reactor's `unsafe` io_uring code
//! lives here, and each block's proof is local: an operation's buffers are moved into the
//! driver when it is submitted and handed back only with its completion ([`Completion`]), so
//! nothing else can free, move or touch them meanwhile.
//!
//! It knows nothing of HTTP, SSE, streams or the log's meaning: it submits, reaps and matches.
//! Every completion is matched to exactly one submission by the [`OpTable`]; one that matches
//! nothing in flight is counted ([`Driver::unmatched`]) and never acted on.

pub mod lap;
mod mem;
pub mod op;
pub mod table;

pub use mem::{Bytes, SendMem, Vectored};

use std::collections::VecDeque;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use io_uring::{IoUring, cqueue, opcode, squeue, types};

pub use op::{Op, SLOTS_MAX, UserData};
pub use table::{Match, OpTable, Unmatched};

use crate::sys;

const SOCKET_URING_OP_TX_TIMESTAMP: u32 = 4;
/// Submission queue entries of a core's ring.
const SQ_ENTRIES: u32 = 1024;
/// The smallest completion ring a core runs with (see [`Driver::new`]).
const CQ_ENTRIES_MIN: u32 = 4096;
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
            Completion::Accept { .. } | Completion::EventFd { .. } | Completion::Fsync { .. } => {
                None
            }
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

/// One core's io_uring driver.
pub struct Driver {
    ring: IoUring<squeue::Entry, cqueue::Entry32>,
    /// Submissions that found the SQ full while the kernel could not take more (EBUSY with
    /// an overflowing CQ, EAGAIN/ENOMEM); submitted in order after the next reap.
    backlog: VecDeque<squeue::Entry>,
    table: OpTable,
    mem: Vec<SlotMem>,
    /// The eventfd read's 8-byte buffer (boxed: its address is fixed for the ring's life).
    efd_buf: Box<u64>,
    unmatched: UnmatchedCounts,
    lap: lap::LapGuard,
    /// Serial of the core-wide operations' armings (accept, eventfd read): no two armings
    /// share a user_data, so a genuine completion never repeats a stale one exactly.
    core_serial: u32,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("backlog", &self.backlog.len())
            .field("live", &self.table.live())
            .field("unmatched", &self.unmatched)
            .finish()
    }
}

/// io_uring_enter errors that pass once completions are reaped or memory frees up.
fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::EBUSY | libc::EAGAIN | libc::ENOMEM)
    )
}

/// `build(want)`, retried once and then at half the size, down to [`CQ_ENTRIES_MIN`], while
/// it fails with ENOMEM; the value and the size it was built with.
fn shrink_on_enomem<T>(
    want: u32,
    mut build: impl FnMut(u32) -> std::io::Result<T>,
) -> std::io::Result<(T, u32)> {
    let mut cq = want;
    let mut retried = false;
    loop {
        match build(cq) {
            Ok(r) => return Ok((r, cq)),
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && !retried => {
                retried = true;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && cq > CQ_ENTRIES_MIN => {
                cq = (cq / 2).max(CQ_ENTRIES_MIN);
            }
            Err(e) => return Err(e),
        }
    }
}

impl Driver {
    /// A ring sized for `connections_max` (SINGLE_ISSUER | DEFER_TASKRUN, falling back to
    /// COOP_TASKRUN; 32-byte CQEs for the TX-timestamp command).
    pub fn new(connections_max: usize) -> std::io::Result<Driver> {
        // Per connection at most: recv, send, poll, timestamp command (+ its CQEs), cancel.
        let want = (connections_max.saturating_mul(4) as u32).clamp(CQ_ENTRIES_MIN, 1 << 16);
        // A large completion ring is one physically contiguous allocation (2 MiB of 32-byte
        // CQEs at 64 Ki entries): on a host whose memory is fragmented the kernel refuses it
        // with ENOMEM. Retry once, then halve it down to the floor: a smaller ring only sends
        // a burst of completions through the kernel's overflow list (none is dropped,
        // IORING_FEAT_NODROP), slower but the same.
        let (ring, cq) = shrink_on_enomem(want, Self::build_ring)?;
        if cq < want {
            tracing::warn!(
                cq_entries = cq,
                wanted = want,
                "io_uring: the kernel refused the completion ring's size (ENOMEM: memory too \
                 fragmented for one contiguous block); running with a smaller one"
            );
        }
        let lap = lap::LapGuard::new(ring.params().cq_entries());
        Ok(Driver {
            core_serial: 0,
            lap,
            ring,
            backlog: VecDeque::new(),
            table: OpTable::default(),
            mem: Vec::new(),
            efd_buf: Box::new(0),
            unmatched: UnmatchedCounts::default(),
        })
    }

    /// A ring with `cq` completion entries: SINGLE_ISSUER | DEFER_TASKRUN where the kernel
    /// has them, else COOP_TASKRUN.
    fn build_ring(cq: u32) -> std::io::Result<IoUring<squeue::Entry, cqueue::Entry32>> {
        let mut b = IoUring::<squeue::Entry, cqueue::Entry32>::builder();
        b.setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize(cq);
        match b.build(SQ_ENTRIES) {
            Ok(r) => Ok(r),
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => Err(e),
            Err(_) => {
                let mut b = IoUring::<squeue::Entry, cqueue::Entry32>::builder();
                b.setup_coop_taskrun().setup_cqsize(cq);
                b.build(SQ_ENTRIES)
            }
        }
    }

    /// Completions that matched nothing in flight so far.
    pub fn unmatched(&self) -> UnmatchedCounts {
        self.unmatched
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

    /// Queues an entry; when the kernel cannot take it now, it waits in the backlog.
    ///
    /// # Safety
    /// Every buffer and iovec the entry points at must stay valid and unmoved until its
    /// completion is reaped.
    unsafe fn push(&mut self, e: squeue::Entry) {
        if self.backlog.is_empty() {
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
        self.backlog.push_back(e);
    }

    /// Moves backlogged submissions into the SQ, as many as fit.
    fn drain_backlog(&mut self) {
        while let Some(e) = self.backlog.front() {
            // SAFETY: entries in the backlog were pushed under `push`'s contract: what they
            // point at is held by the op table's memory until their completions.
            if unsafe { self.ring.submission().push(e) }.is_err() {
                return;
            }
            self.backlog.pop_front();
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
        let e = opcode::AcceptMulti::new(types::Fd(listener))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(ud);
        // SAFETY: multishot accept points at no memory of ours.
        unsafe { self.push(e) };
    }

    /// `fdatasync` of a log segment file of `shard` (`IORING_FSYNC_DATASYNC`); the file must
    /// stay open until the completion (the caller's `SyncJob` holds it).
    pub fn fsync(&mut self, shard: u32, fd: RawFd) {
        let ud = UserData {
            slot: shard,
            serial: op::next_serial(&mut self.core_serial),
            ..UserData::core(Op::Fsync)
        };
        let e = opcode::Fsync::new(types::Fd(fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(ud.pack());
        // SAFETY: fsync points at no memory of ours.
        unsafe { self.push(e) };
    }

    /// Cancels every operation on `fd` (the listener, at shutdown).
    pub fn cancel_fd(&mut self, fd: RawFd) {
        let e = opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(fd)).all())
            .build()
            .user_data(UserData::core(Op::Cancel).pack());
        // SAFETY: cancel points at no memory of ours.
        unsafe { self.push(e) };
    }

    /// The 8-byte read on the core's eventfd.
    pub fn read_eventfd(&mut self, efd: RawFd) {
        let ud = self.core_arming(Op::EventFd);
        let ptr: *mut u64 = &mut *self.efd_buf;
        let e = opcode::Read::new(types::Fd(efd), ptr.cast(), 8)
            .build()
            .user_data(ud);
        // SAFETY: `efd_buf` is a Box owned by the driver, which owns the ring: it outlives
        // the ring's use of it, and nothing else reads or writes it.
        unsafe { self.push(e) };
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
        let e = opcode::Recv::new(types::Fd(fd), ptr, len)
            .build()
            .user_data(ud.pack());
        // SAFETY: `ptr..ptr+len` lies in the heap buffer of the Vec now held in this slot's
        // `mem.recv`, which is handed back only with the op's completion (`complete`).
        unsafe { self.push(e) };
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
        let e = opcode::Send::new(types::Fd(fd), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(ud.pack());
        // SAFETY: the bytes lie in the heap buffer of the Vec held in this slot's `mem.send`
        // until the completion hands it back.
        unsafe { self.push(e) };
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
            Some(len) => opcode::Send::new(types::Fd(fd), v.iov[0].iov_base as *const u8, len)
                .flags(libc::MSG_NOSIGNAL)
                .build(),
            None => opcode::SendMsg::new(types::Fd(fd), &raw const v.msg)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build(),
        }
        .user_data(ud.pack());
        self.mem[slot as usize].send = Some(SendMem::Vectored(v));
        // SAFETY: the msghdr and iovec array live in the boxed `Vectored` now held in this
        // slot's `mem.send` (moving the Box does not move them); every iovec points into the
        // bytes of a run that the same `Vectored` holds (`Bytes` never moves its bytes); the
        // control buffer, if any, is the static `sys::tx_ack_cmsg`. All of it is handed back
        // only with the op's completion.
        unsafe { self.push(e) };
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
        let e = opcode::Read::new(types::Fd(file), ptr, len as u32)
            .offset(offset)
            .build()
            .user_data(ud.pack());
        // SAFETY: the buffer is the heap allocation of the Vec now held in this slot's
        // `mem.prefetch`, handed back (dropped) only with the op's completion.
        unsafe { self.push(e) };
    }

    /// A single-shot `POLLOUT` wait.
    pub fn poll_out(&mut self, slot: u32, fd: RawFd) {
        let ud = self.table.begin(slot, Op::PollOut);
        let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLOUT as u32)
            .build()
            .user_data(ud.pack());
        // SAFETY: poll points at no memory of ours.
        unsafe { self.push(e) };
    }

    /// A multishot `POLLIN | POLLRDHUP` watch.
    pub fn watch(&mut self, slot: u32, fd: RawFd) {
        let ud = self.table.begin(slot, Op::Watch);
        let mask = (libc::POLLIN | libc::POLLRDHUP) as u32;
        let e = opcode::PollAdd::new(types::Fd(fd), mask)
            .multi(true)
            .build()
            .user_data(ud.pack());
        // SAFETY: poll points at no memory of ours.
        unsafe { self.push(e) };
    }

    /// The multishot TX-timestamp command.
    pub fn tx_timestamps(&mut self, slot: u32, fd: RawFd) {
        let ud = self.table.begin(slot, Op::TxTimestamps);
        let e = opcode::UringCmd16::new(types::Fd(fd), SOCKET_URING_OP_TX_TIMESTAMP)
            .build()
            .user_data(ud.pack());
        // SAFETY: the command points at no memory of ours.
        unsafe { self.push(e) };
    }

    /// Cancels every operation in flight on `slot`, each by its user_data. Not by fd: the
    /// kernel matches a cancel by fd by walking every armed poll entry of the ring, which made
    /// closing N subscribers O(N²); by user_data it is one hash bucket, and it cannot hit a
    /// socket that reuses the fd number either.
    pub fn cancel_slot(&mut self, slot: u32) {
        for ud in self.table.in_flight_ops(slot) {
            let e = opcode::AsyncCancel::new(ud.pack())
                .build()
                .user_data(UserData::core(Op::Cancel).pack());
            // SAFETY: cancel points at no memory of ours.
            unsafe { self.push(e) };
        }
    }

    // ---- completions ----

    /// Submits, then waits up to `timeout` for a completion (not at all with a backlog).
    pub fn submit_and_wait(&mut self, timeout: Duration) {
        self.drain_backlog();
        let (want, wait) = if self.backlog.is_empty() {
            (1, timeout)
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
    }

    /// Every CQE ready now, unmatched (match each with [`Driver::complete`] in order: acting
    /// on one may close a connection the next one names).
    pub fn reap(&mut self, out: &mut Vec<Cqe>) {
        for c in self.ring.completion() {
            let cqe = (c.user_data(), c.result(), c.flags());
            if self.lap.is_stale(cqe) {
                self.unmatched.stale_slot += 1;
                if self.unmatched.stale_slot <= 10 {
                    tracing::warn!(
                        "dropped a stale last-slot completion {cqe:?} (kernel CQE32 skip)"
                    );
                }
                continue;
            }
            out.push(cqe);
        }
    }

    /// Matches one CQE against the op table: the completion to act on, with its memory, or
    /// `None` for a cancel's own CQE, a stale one, or one that matches nothing in flight
    /// (counted).
    pub fn complete(&mut self, (u, res, flags): Cqe) -> Option<Completion> {
        let more = cqueue::more(flags);
        let Some(ud) = UserData::unpack(u) else {
            self.unmatched.unknown += 1;
            return None;
        };
        match ud.op {
            Op::Accept => {
                let fd = if res < 0 {
                    Err(res)
                } else {
                    // SAFETY: a successful accept's result is a new descriptor the kernel
                    // created for this ring's owner; nothing else holds or closes it.
                    Ok(unsafe { OwnedFd::from_raw_fd(res) })
                };
                return Some(Completion::Accept { fd, more });
            }
            Op::EventFd => return Some(Completion::EventFd { res }),
            Op::Fsync => {
                return Some(Completion::Fsync {
                    shard: ud.slot,
                    res,
                });
            }
            Op::Cancel => return None,
            _ => {}
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
            Op::Accept | Op::EventFd | Op::Cancel | Op::Fsync => unreachable!("handled above"),
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

#[cfg(test)]
mod ring_size_tests {
    use super::*;

    fn enomem<T>() -> std::io::Result<T> {
        Err(std::io::Error::from_raw_os_error(libc::ENOMEM))
    }

    #[test]
    fn a_refused_ring_is_retried_then_halved_to_the_floor() {
        let mut asked = Vec::new();
        let got = shrink_on_enomem(1 << 16, |cq| {
            asked.push(cq);
            if cq > 8192 { enomem() } else { Ok(cq) }
        });
        assert_eq!(got.unwrap(), (8192, 8192));
        assert_eq!(asked, [65536, 65536, 32768, 16384, 8192]);
        // Never below the floor, and the last error is reported.
        let mut asked = Vec::new();
        let e = shrink_on_enomem(8192, |cq| {
            asked.push(cq);
            enomem::<u32>()
        });
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::ENOMEM));
        assert_eq!(asked, [8192, 8192, CQ_ENTRIES_MIN]);
        // Another error is not retried.
        let mut n = 0;
        let e = shrink_on_enomem(8192, |_| {
            n += 1;
            Err::<u32, _>(std::io::Error::from_raw_os_error(libc::EPERM))
        });
        assert_eq!((e.unwrap_err().raw_os_error(), n), (Some(libc::EPERM), 1));
    }
}
