//! The seam under the [`Driver`](super::Driver): where its submissions go, where its
//! completions come from, and the clock the reactor reads. The driver keeps everything that
//! is the same whatever executes the operations — the op table, the memory each operation
//! owns, matching a completion to its submission — and hands each operation, described in
//! [`Sqe`], to a [`Ring`]. The kernel's io_uring ([`super::kernel::KernelRing`]) is the one
//! the gateway runs on; the simulator (`sim/`) has another, which executes the same
//! operations in an order and with partial results chosen by its seed, on a simulated clock.
//!
//! An [`Sqe`] carries raw pointers into memory the driver holds until the operation's
//! completion; [`Ring::push`] is `unsafe` for that reason, with the contract io_uring has.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::Cqe;

/// `IORING_CQE_F_MORE`: a multishot operation stays armed after this completion.
pub const CQE_F_MORE: u32 = 1 << 1;

/// One operation to execute, as the driver submits it (each with a `user_data`).
#[derive(Debug, Clone, Copy)]
pub enum Sqe {
    /// Multishot accept on a listener (the new fds `SOCK_CLOEXEC`).
    AcceptMulti { fd: RawFd },
    /// `fdatasync`.
    Fsync { fd: RawFd },
    /// `syncfs` of the filesystem holding `fd` (every file's dirty data and the journal).
    /// Not an io_uring operation: the kernel ring runs it on a helper thread, which posts
    /// the completion to the ring (`super::syncfs`).
    SyncFs { fd: RawFd },
    /// Cancel every operation on `fd`.
    CancelFd { fd: RawFd },
    /// Cancel the operation submitted with `user_data`.
    Cancel { user_data: u64 },
    /// `pread` of `len` bytes at `offset` into `ptr` (the eventfd's 8 bytes: offset 0).
    Read {
        fd: RawFd,
        ptr: *mut u8,
        len: u32,
        offset: u64,
    },
    /// `recv` into `ptr..ptr+len`.
    Recv { fd: RawFd, ptr: *mut u8, len: u32 },
    /// `send` of `ptr..ptr+len`, `MSG_NOSIGNAL`.
    Send { fd: RawFd, ptr: *const u8, len: u32 },
    /// `sendmsg` of a message header (iovecs, maybe a control message), `MSG_NOSIGNAL`.
    SendMsg { fd: RawFd, msg: *const libc::msghdr },
    /// A poll for `mask`, single-shot or multishot.
    Poll { fd: RawFd, mask: u32, multi: bool },
    /// The multishot TX-timestamp socket command.
    TxTimestamps { fd: RawFd },
}

/// Where a driver's operations are executed.
pub trait Ring {
    /// Queues `sqe` with `user_data`; it is executed at the latest by the next
    /// [`Ring::submit_and_wait`]. Never fails: what cannot be queued now waits in order.
    ///
    /// # Safety
    /// Every buffer, iovec and message header `sqe` points at must stay valid and unmoved
    /// until its completion is reaped (and, for a multishot operation, its last one).
    unsafe fn push(&mut self, sqe: Sqe, user_data: u64);

    /// Submits what is queued, then waits up to `timeout` for a completion (not at all when
    /// submissions are still waiting for room).
    fn submit_and_wait(&mut self, timeout: Duration);

    /// Every completion ready now, in the order they are to be matched.
    fn reap(&mut self, out: &mut Vec<Cqe>);

    /// The reactor's clock.
    fn now(&self) -> Instant;

    /// Completions this ring dropped before matching (the kernel's stale last slot, see
    /// [`super::lap`]).
    fn stale_dropped(&self) -> u64 {
        0
    }
}
