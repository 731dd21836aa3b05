//! The kernel's io_uring as the driver's [`Ring`]: one ring per core (SINGLE_ISSUER |
//! DEFER_TASKRUN where the kernel has them, else COOP_TASKRUN; 32-byte CQEs for the
//! TX-timestamp command), a backlog for submissions that find the SQ full, and the guard
//! against the kernel's stale last CQ slot ([`super::lap`]). All of the reactor's `unsafe`
//! io_uring code lives here and in the driver's submissions.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use io_uring::{IoUring, cqueue, opcode, squeue, types};

use super::Cqe;
use super::lap::LapGuard;
use super::ring::{Ring, Sqe};
use super::syncfs::SyncfsThread;

const SOCKET_URING_OP_TX_TIMESTAMP: u32 = 4;
/// Submission queue entries of a core's ring.
const SQ_ENTRIES: u32 = 1024;
/// The smallest completion ring a core runs with (see [`KernelRing::new`]).
const CQ_ENTRIES_MIN: u32 = 4096;

/// One core's io_uring.
pub struct KernelRing {
    /// The `syncfs` helper, started at the first [`Sqe::SyncFs`]. Declared first, so it is
    /// dropped (its thread joined, its last completion posted) before the ring is closed.
    syncfs: Option<SyncfsThread>,
    ring: IoUring<squeue::Entry, cqueue::Entry32>,
    /// Submissions that found the SQ full while the kernel could not take more (EBUSY with
    /// an overflowing CQ, EAGAIN/ENOMEM); submitted in order after the next reap.
    backlog: VecDeque<squeue::Entry>,
    lap: LapGuard,
    stale_dropped: u64,
    /// Completions of operations that failed before reaching the kernel (a `syncfs` whose
    /// thread could not start), reaped first.
    failed: Vec<Cqe>,
}

impl std::fmt::Debug for KernelRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelRing")
            .field("backlog", &self.backlog.len())
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

impl KernelRing {
    /// A ring sized for `connections_max`.
    pub fn new(connections_max: usize) -> std::io::Result<KernelRing> {
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
        let lap = LapGuard::new(ring.params().cq_entries());
        Ok(KernelRing {
            syncfs: None,
            ring,
            backlog: VecDeque::new(),
            lap,
            stale_dropped: 0,
            failed: Vec::new(),
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

    /// Starts the `syncfs` thread if it is not running.
    pub fn start_syncfs(&mut self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        if self.syncfs.is_none() {
            self.syncfs = Some(SyncfsThread::start(self.ring.as_raw_fd())?);
        }
        Ok(())
    }

    /// Hands a `syncfs` to the helper thread (started now if it is not running); if that
    /// fails, the operation completes at once with the error, through the ring.
    fn push_syncfs(&mut self, fd: std::os::fd::RawFd, user_data: u64) {
        let res = match self.start_syncfs() {
            Ok(()) => (self.syncfs.as_ref()).expect("started").push(fd, user_data),
            Err(e) => {
                tracing::error!("syncfs: cannot start its thread: {e}");
                Err(-e.raw_os_error().unwrap_or(libc::EIO))
            }
        };
        if let Err(res) = res {
            self.failed.push((user_data, res, 0));
        }
    }

    /// Moves backlogged submissions into the SQ, as many as fit.
    fn drain_backlog(&mut self) {
        while let Some(e) = self.backlog.front() {
            // SAFETY: entries in the backlog were pushed under `push`'s contract: what they
            // point at is held by the driver's memory until their completions.
            if unsafe { self.ring.submission().push(e) }.is_err() {
                return;
            }
            self.backlog.pop_front();
        }
    }
}

/// The io_uring entry of `sqe`.
#[inline]
fn entry(sqe: Sqe) -> squeue::Entry {
    match sqe {
        Sqe::AcceptMulti { fd } => opcode::AcceptMulti::new(types::Fd(fd))
            .flags(libc::SOCK_CLOEXEC)
            .build(),
        Sqe::Fsync { fd } => opcode::Fsync::new(types::Fd(fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        Sqe::SyncFs { .. } => unreachable!("a syncfs goes to its thread (KernelRing::push)"),
        Sqe::CancelFd { fd } => {
            opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(fd)).all()).build()
        }
        Sqe::Cancel { user_data } => opcode::AsyncCancel::new(user_data).build(),
        Sqe::Read {
            fd,
            ptr,
            len,
            offset,
        } => opcode::Read::new(types::Fd(fd), ptr, len)
            .offset(offset)
            .build(),
        Sqe::Recv { fd, ptr, len } => opcode::Recv::new(types::Fd(fd), ptr, len).build(),
        Sqe::Send { fd, ptr, len } => opcode::Send::new(types::Fd(fd), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build(),
        Sqe::SendMsg { fd, msg } => opcode::SendMsg::new(types::Fd(fd), msg)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build(),
        Sqe::Poll { fd, mask, multi } => opcode::PollAdd::new(types::Fd(fd), mask)
            .multi(multi)
            .build(),
        Sqe::TxTimestamps { fd } => {
            opcode::UringCmd16::new(types::Fd(fd), SOCKET_URING_OP_TX_TIMESTAMP).build()
        }
    }
}

impl Ring for KernelRing {
    #[inline]
    unsafe fn push(&mut self, sqe: Sqe, user_data: u64) {
        if let Sqe::SyncFs { fd } = sqe {
            return self.push_syncfs(fd, user_data);
        }
        let e = entry(sqe).user_data(user_data);
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

    fn submit_and_wait(&mut self, timeout: Duration) {
        self.drain_backlog();
        let (want, wait) = if self.backlog.is_empty() && self.failed.is_empty() {
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

    fn reap(&mut self, out: &mut Vec<Cqe>) {
        out.append(&mut self.failed);
        for c in self.ring.completion() {
            let cqe = (c.user_data(), c.result(), c.flags());
            if self.lap.is_stale(cqe) {
                self.stale_dropped += 1;
                if self.stale_dropped <= 10 {
                    tracing::warn!(
                        "dropped a stale last-slot completion {cqe:?} (kernel CQE32 skip)"
                    );
                }
                continue;
            }
            out.push(cqe);
        }
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn stale_dropped(&self) -> u64 {
        self.stale_dropped
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

#[cfg(test)]
mod syncfs_tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// Completions reaped until `n` came or `waits` waits of 50 ms passed, by `user_data`.
    fn reap_n(r: &mut KernelRing, n: usize, waits: usize) -> Vec<Cqe> {
        let mut got = Vec::new();
        for _ in 0..waits {
            if got.len() >= n {
                break;
            }
            r.submit_and_wait(Duration::from_millis(50));
            r.reap(&mut got);
        }
        got.sort_unstable();
        got
    }

    #[test]
    fn a_syncfs_completes_through_the_ring_with_its_user_data_and_result() {
        let mut r = KernelRing::new(16).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let fd = std::fs::File::open(dir.path()).unwrap();
        // A descriptor that is not open (999999) fails at once, through the ring too.
        for (fd, ud) in [(fd.as_raw_fd(), 41), (fd.as_raw_fd(), 42), (999_999, 43)] {
            // SAFETY: a syncfs points at no memory; the directory stays open until reaped.
            unsafe { r.push(Sqe::SyncFs { fd }, ud) };
        }
        let got = reap_n(&mut r, 3, 200);
        assert_eq!(got, [(41, 0, 0), (42, 0, 0), (43, -libc::EBADF, 0)]);
        // Nothing more arrives: each completion was posted once.
        assert!(reap_n(&mut r, 1, 4).is_empty());
    }

    #[test]
    fn a_ring_dropped_with_a_syncfs_in_flight_waits_for_its_thread() {
        let mut r = KernelRing::new(16).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let fd = std::fs::File::open(dir.path()).unwrap();
        // SAFETY: as above.
        unsafe { r.push(Sqe::SyncFs { fd: fd.as_raw_fd() }, 7) };
        // Dropping joins the helper after it posted to this ring, which is still open.
        drop(r);
        drop(fd);
    }
}
