//! The simulated kernel under a whole node: the gateway's [`Ring`] seam executed by the
//! simulator, on one thread, in an order the seed chooses.
//!
//! Sockets are real `AF_UNIX` stream socketpairs (the node's end has a small send buffer chosen
//! by the seed, so slow readers fill it). Their `SIOCOUTQ` counts the memory of the buffers the
//! client has not read to their end, more than the bytes: the node's windows are confirmed late
//! and in lumps (a fault of its own), and at once when the client closes. Files are the log's real
//! files on the simulated [`Disk`]. Each step ([`Kernel::step`]) visits the operations in
//! flight in a shuffled order (completions come back reordered, as io_uring may reorder
//! them); each one may wait a step longer, and a send or receive may move fewer bytes than
//! asked (partial). An `fdatasync` may be slow (steps later) or fail with `EIO`; one that
//! succeeds makes its file's bytes at that moment the durable image. A `syncfs` is the same
//! for every segment file of the disk at once. Time is the simulated
//! clock: the world advances it.
//!
//! What the kernel model keeps: a file (socket) an operation was submitted on stays that
//! file (an operation whose descriptor was closed and reused completes with `-EBADF`,
//! where io_uring would have held the old file); a cancel finds the operation if it is still
//! in flight (`-ENOENT` otherwise) and completes it with `-ECANCELED`.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use gateway::uring::{CQE_F_MORE, Cqe, Ring, Sqe};

use crate::disk::Disk;
use crate::rng::Rng;
use crate::trace::Trace;

/// Fault rates of the simulated kernel, per mille of visits.
#[derive(Debug, Clone, Copy)]
pub struct KernelFaults {
    /// An operation that could complete waits a step longer.
    pub defer_per_mille: u32,
    /// A send or receive moves a random part of what it could.
    pub partial_per_mille: u32,
    /// An `fdatasync` fails with `EIO`.
    pub fsync_eio_per_mille: u32,
    /// An `fdatasync` takes 2-40 steps.
    pub fsync_slow_per_mille: u32,
}

/// One operation in flight.
#[derive(Debug)]
struct InFlight {
    user_data: u64,
    sqe: Sqe,
    /// The inode of its descriptor when submitted (0: none).
    ino: u64,
    /// Not before this step (a slow fsync).
    not_before: Option<u64>,
    /// A multishot poll's last reported mask (it reports changes).
    last_mask: i16,
    /// A cancel found it: it completes with `-ECANCELED` when next visited.
    cancelled: bool,
    /// The ring (core) that submitted it.
    ring: usize,
}

/// The kernel's state, shared by the ring (inside the core) and the world.
#[derive(Debug)]
pub struct Kernel {
    pub now: Instant,
    pub step: u64,
    in_flight: Vec<InFlight>,
    /// Completions ready, per ring.
    ready: Vec<Vec<Cqe>>,
    /// Node ends of connections made, waiting for a ring's multishot accept (each core has a
    /// listener of its own, as with `SO_REUSEPORT`).
    backlog: Vec<VecDeque<OwnedFd>>,
    rng: Rng,
    faults: KernelFaults,
    disk: Rc<Disk>,
    /// The node end's send buffer (`SO_SNDBUF`).
    sndbuf: i32,
    failed_syncs: u64,
    /// Each connection's serial (its order of creation), by its node end's inode (unique while
    /// the node holds it).
    peers: std::collections::BTreeMap<u64, u64>,
    connections: u64,
    pub trace: Trace,
}

/// The [`Ring`] a simulated core (`ring`) is given.
#[derive(Debug)]
pub struct SimRing {
    pub kernel: Rc<RefCell<Kernel>>,
    pub ring: usize,
}

impl Ring for SimRing {
    unsafe fn push(&mut self, sqe: Sqe, user_data: u64) {
        let mut k = self.kernel.borrow_mut();
        let ino = fd_of(sqe).map_or(0, inode);
        k.in_flight.push(InFlight {
            user_data,
            sqe,
            ino,
            not_before: None,
            last_mask: 0,
            cancelled: false,
            ring: self.ring,
        });
    }

    fn submit_and_wait(&mut self, _timeout: Duration) {}

    fn reap(&mut self, out: &mut Vec<Cqe>) {
        out.append(&mut self.kernel.borrow_mut().ready[self.ring]);
    }

    fn now(&self) -> Instant {
        self.kernel.borrow().now
    }
}

fn fd_of(sqe: Sqe) -> Option<RawFd> {
    match sqe {
        Sqe::AcceptMulti { fd }
        | Sqe::Fsync { fd }
        | Sqe::SyncFs { fd }
        | Sqe::CancelFd { fd }
        | Sqe::Read { fd, .. }
        | Sqe::Recv { fd, .. }
        | Sqe::Send { fd, .. }
        | Sqe::SendMsg { fd, .. }
        | Sqe::Poll { fd, .. }
        | Sqe::TxTimestamps { fd } => Some(fd),
        Sqe::Cancel { .. } => None,
    }
}

/// The inode behind `fd` (0 when it is not open).
fn inode(fd: RawFd) -> u64 {
    // SAFETY: fstat writes one stat into the zeroed value (plain data); a closed fd only
    // makes it fail.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointer is to a live local.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return 0;
    }
    st.st_ino
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// What visiting an operation did.
enum Visit {
    /// Not now.
    Wait,
    /// Completed with this result and flags (and is gone).
    Done(i32),
    /// A multishot operation reported (and stays).
    More(i32),
}

impl Kernel {
    /// A kernel for `rings` cores.
    pub fn new(
        rng: Rng,
        faults: KernelFaults,
        disk: Rc<Disk>,
        (sndbuf, rings): (i32, usize),
        now: Instant,
    ) -> Self {
        Kernel {
            now,
            step: 0,
            in_flight: Vec::new(),
            ready: vec![Vec::new(); rings],
            backlog: (0..rings).map(|_| VecDeque::new()).collect(),
            rng,
            faults,
            disk,
            sndbuf,
            failed_syncs: 0,
            peers: std::collections::BTreeMap::new(),
            connections: 0,
            trace: Trace::default(),
        }
    }

    /// A new connection to the node: its client end and its serial. The node's end waits for
    /// an accept.
    pub fn connect(&mut self) -> (OwnedFd, u64) {
        let (node, client) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let (node, client) = (OwnedFd::from(node), OwnedFd::from(client));
        self.connections += 1;
        self.peers.insert(inode(node.as_raw_fd()), self.connections);
        let v = self.sndbuf;
        // SAFETY: the option value is a live c_int of the size given.
        let r = unsafe {
            libc::setsockopt(
                node.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&raw const v).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "SO_SNDBUF");
        let r = self.rng.below(self.backlog.len() as u64) as usize;
        self.backlog[r].push_back(node);
        (client, self.connections)
    }

    /// No more faults from here on (the quiet end of a run).
    pub fn quiet(&mut self) {
        self.faults = KernelFaults {
            defer_per_mille: 0,
            partial_per_mille: 0,
            fsync_eio_per_mille: 0,
            fsync_slow_per_mille: 0,
        };
        for op in &mut self.in_flight {
            op.not_before = None;
        }
    }

    /// `fdatasync`s that failed since the last call.
    pub fn take_failed_syncs(&mut self) -> u64 {
        std::mem::take(&mut self.failed_syncs)
    }

    /// The node crashed: what was in flight, ready or waiting for an accept is gone.
    pub fn crashed(&mut self) {
        self.in_flight.clear();
        self.ready.iter_mut().for_each(Vec::clear);
        self.backlog.iter_mut().for_each(VecDeque::clear);
    }

    /// The serial of the connection whose node end is `node_fd`.
    pub fn peer_of(&self, node_fd: RawFd) -> Option<u64> {
        self.peers.get(&inode(node_fd)).copied()
    }

    /// Operations in flight (a bound on memory: every connection has a few).
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// One step of the kernel: every operation in flight visited once, in a shuffled order.
    pub fn step(&mut self) {
        self.step += 1;
        let n = self.in_flight.len();
        for i in (1..n).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            self.in_flight.swap(i, j);
        }
        let mut i = 0;
        while i < self.in_flight.len() {
            if !self.in_flight[i].cancelled && self.rng.chance(self.faults.defer_per_mille) {
                i += 1;
                continue;
            }
            match self.visit(i) {
                Visit::Wait => i += 1,
                Visit::More(res) => {
                    let (ud, r) = (self.in_flight[i].user_data, self.in_flight[i].ring);
                    self.ready[r].push((ud, res, CQE_F_MORE));
                    i += 1;
                }
                Visit::Done(res) => {
                    let op = self.in_flight.remove(i);
                    self.ready[op.ring].push((op.user_data, res, 0));
                }
            }
        }
    }

    fn visit(&mut self, i: usize) -> Visit {
        let (sqe, ino) = (self.in_flight[i].sqe, self.in_flight[i].ino);
        if self.in_flight[i].cancelled {
            return Visit::Done(-libc::ECANCELED);
        }
        if let Some(fd) = fd_of(sqe)
            && inode(fd) != ino
        {
            return Visit::Done(-libc::EBADF);
        }
        match sqe {
            Sqe::AcceptMulti { .. } => match self.backlog[self.in_flight[i].ring].pop_front() {
                Some(fd) => Visit::More(fd.into_raw_fd()),
                None => Visit::Wait,
            },
            Sqe::Cancel { user_data } => {
                let r = self.in_flight[i].ring;
                Visit::Done(self.cancel(|op| {
                    op.ring == r
                        && op.user_data == user_data
                        && !matches!(op.sqe, Sqe::Cancel { .. })
                }))
            }
            Sqe::CancelFd { fd } => {
                let n = self.cancel_all(self.in_flight[i].ring, fd);
                Visit::Done(if n > 0 { n } else { -libc::ENOENT })
            }
            Sqe::Fsync { fd } => self.fsync(i, fd),
            Sqe::SyncFs { fd } => self.syncfs(i, fd),
            Sqe::Read {
                fd,
                ptr,
                len,
                offset,
            } => read(fd, ptr, len, offset),
            Sqe::Recv { fd, ptr, len } => {
                let len = self.partial(len as usize, "partial receive");
                // SAFETY: the driver holds `ptr..ptr+len` until the completion.
                let r = unsafe { libc::recv(fd, ptr.cast(), len, libc::MSG_DONTWAIT) };
                would_block_or(r)
            }
            Sqe::Send { fd, ptr, len } => {
                let len = self.partial(len as usize, "partial send");
                // SAFETY: the driver holds `ptr..ptr+len` until the completion.
                let r = unsafe {
                    libc::send(fd, ptr.cast(), len, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                };
                would_block_or(r)
            }
            Sqe::SendMsg { fd, msg } => self.sendmsg(fd, msg),
            Sqe::Poll { fd, mask, multi } => {
                let got = poll(fd, mask as i16);
                if got == 0 {
                    self.in_flight[i].last_mask = 0;
                    return Visit::Wait;
                }
                if !multi {
                    return Visit::Done(i32::from(got));
                }
                let op = &mut self.in_flight[i];
                if got == op.last_mask {
                    return Visit::Wait; // multishot reports changes
                }
                op.last_mask = got;
                Visit::More(i32::from(got))
            }
            Sqe::TxTimestamps { .. } => Visit::Done(-libc::EOPNOTSUPP),
        }
    }

    /// `len`, or by the seed a random part of it (at least 1).
    fn partial(&mut self, len: usize, what: &'static str) -> usize {
        if len > 1 && self.rng.chance(self.faults.partial_per_mille) {
            let n = self.rng.range(1, len as u64) as usize;
            self.trace.fault(what, &[len as u64, n as u64]);
            n
        } else {
            len
        }
    }

    fn sendmsg(&mut self, fd: RawFd, msg: *const libc::msghdr) -> Visit {
        // SAFETY: the driver holds the message header and its iovecs until the completion.
        let m = unsafe { &*msg };
        // SAFETY: as above: `msg_iov` points at `msg_iovlen` live iovecs.
        let iov = unsafe { std::slice::from_raw_parts(m.msg_iov, m.msg_iovlen) };
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        let mut left = self.partial(total, "partial send");
        let mut cut: Vec<libc::iovec> = Vec::with_capacity(iov.len());
        for v in iov {
            if left == 0 {
                break;
            }
            let n = v.iov_len.min(left);
            cut.push(libc::iovec {
                iov_base: v.iov_base,
                iov_len: n,
            });
            left -= n;
        }
        // A copy of the header over the cut iovecs (no control message: the simulated node
        // asks for no TX timestamps).
        // SAFETY: msghdr is plain data (all-zero valid).
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_iov = cut.as_mut_ptr();
        h.msg_iovlen = cut.len();
        // SAFETY: `h` and `cut` are live locals; every iovec points into memory the driver
        // holds until the completion.
        let r = unsafe { libc::sendmsg(fd, &h, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        would_block_or(r)
    }

    /// Whether a sync waits this visit: by the seed it becomes slow (2-40 steps) at its first.
    fn sync_waits(&mut self, i: usize, what: &'static str) -> bool {
        let op = &mut self.in_flight[i];
        match op.not_before {
            None if self.rng.chance(self.faults.fsync_slow_per_mille) => {
                let later = self.step + self.rng.range(2, 40);
                op.not_before = Some(later);
                self.trace.fault(what, &[later]);
                true
            }
            Some(t) => self.step < t,
            None => false,
        }
    }

    /// A `syncfs`: by the seed slow or failing (`EIO`); once it succeeds, every segment file's
    /// bytes at that moment are durable (as an `fdatasync` makes its one file's).
    fn syncfs(&mut self, i: usize, fd: RawFd) -> Visit {
        if self.sync_waits(i, "slow syncfs") {
            return Visit::Wait;
        }
        if self.rng.chance(self.faults.fsync_eio_per_mille) {
            self.trace.fault("syncfs EIO", &[]);
            self.failed_syncs += 1;
            return Visit::Done(-libc::EIO);
        }
        let snaps = self.disk.snapshot_all();
        // SAFETY: the hub keeps its directory open until the completion.
        if unsafe { libc::syncfs(fd) } < 0 {
            return Visit::Done(-errno());
        }
        self.disk.commit(snaps);
        Visit::Done(0)
    }

    fn fsync(&mut self, i: usize, fd: RawFd) -> Visit {
        if self.sync_waits(i, "slow fsync") {
            return Visit::Wait;
        }
        if self.rng.chance(self.faults.fsync_eio_per_mille) {
            self.trace.fault("fsync EIO", &[]);
            self.failed_syncs += 1;
            return Visit::Done(-libc::EIO);
        }
        // SAFETY: the log keeps the file open until the completion (its `SyncJob`).
        let file = unsafe { BorrowedFd::borrow_raw(fd) };
        let snaps = self.disk.snapshot(std::iter::once(file));
        // SAFETY: as above.
        if unsafe { libc::fdatasync(fd) } < 0 {
            return Visit::Done(-errno());
        }
        self.disk.commit(snaps);
        Visit::Done(0)
    }

    /// Cancels the first operation in flight `which` picks (not cancelled yet): it completes
    /// with `-ECANCELED` at its next visit, this step or the next.
    fn cancel(&mut self, which: impl Fn(&InFlight) -> bool) -> i32 {
        match self
            .in_flight
            .iter_mut()
            .find(|op| !op.cancelled && which(op))
        {
            Some(op) => {
                op.cancelled = true;
                0
            }
            None => -libc::ENOENT,
        }
    }

    fn cancel_all(&mut self, ring: usize, fd: RawFd) -> i32 {
        let mut n = 0;
        while self.cancel(|op| {
            op.ring == ring
                && fd_of(op.sqe) == Some(fd)
                && !matches!(op.sqe, Sqe::CancelFd { .. } | Sqe::Cancel { .. })
        }) == 0
        {
            n += 1;
        }
        n
    }
}

/// A read of a file at `offset`, or of the eventfd (no offset), once it is readable.
fn read(fd: RawFd, ptr: *mut u8, len: u32, offset: u64) -> Visit {
    if poll(fd, libc::POLLIN) == 0 {
        return Visit::Wait;
    }
    // SAFETY: the driver holds `ptr..ptr+len` until this operation's completion (the
    // `Ring::push` contract).
    let r = unsafe { libc::pread(fd, ptr.cast(), len as usize, offset as i64) };
    if r < 0 && errno() == libc::ESPIPE {
        // SAFETY: as above (an eventfd: no offset).
        let r = unsafe { libc::read(fd, ptr.cast(), len as usize) };
        return result(r);
    }
    result(r)
}

/// The events of `mask` (and errors, hang-ups) ready on `fd` now.
fn poll(fd: RawFd, mask: i16) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events: mask,
        revents: 0,
    };
    // SAFETY: one live pollfd, no wait.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    if r <= 0 { 0 } else { p.revents }
}

fn result(r: isize) -> Visit {
    if r < 0 {
        Visit::Done(-errno())
    } else {
        Visit::Done(r as i32)
    }
}

/// A socket call's result; `EAGAIN` waits (io_uring would arm a poll and retry).
fn would_block_or(r: isize) -> Visit {
    if r < 0 && errno() == libc::EAGAIN {
        Visit::Wait
    } else {
        result(r)
    }
}
