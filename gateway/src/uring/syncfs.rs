//! `syncfs` for a core's ring. io_uring has no `syncfs` operation, so the kernel ring hands
//! each one to this helper thread (one per ring, started with the core under `--fsync-scope
//! filesystem`, else at the first `syncfs`; it inherits the core's CPU): it runs `syncfs(2)`
//! and posts the result to the core's ring as an ordinary completion with the operation's
//! `user_data`, through `IORING_OP_MSG_RING` on a small ring of its own. The reactor never
//! blocks, and the completion is matched like any other (the driver's `Op::SyncFs`).
//!
//! Lifetimes: each job carries a duplicate of the caller's descriptor (the same open file
//! description, so `syncfs` reports the writeback errors that description has not seen yet),
//! closed after its `syncfs`; the thread is joined when the ring is dropped, after its last
//! message was posted, so no message ever targets a closed (or reused) ring descriptor.

use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use io_uring::{IoUring, opcode, types};

/// One ring's helper thread.
#[derive(Debug)]
pub(super) struct SyncfsThread {
    tx: Option<mpsc::Sender<(OwnedFd, u64)>>,
    handle: Option<JoinHandle<()>>,
}

impl SyncfsThread {
    /// Starts the thread that posts to the ring `target` (the core's ring descriptor, which
    /// must stay open until this value is dropped).
    pub(super) fn start(target: RawFd) -> std::io::Result<SyncfsThread> {
        let own = IoUring::new(4)?;
        let (tx, rx) = mpsc::channel::<(OwnedFd, u64)>();
        let handle = std::thread::Builder::new()
            .name("log-syncfs".into())
            .spawn(move || run(own, target, &rx))?;
        Ok(SyncfsThread {
            tx: Some(tx),
            handle: Some(handle),
        })
    }

    /// Queues a `syncfs` of the filesystem holding `fd`; its completion (0 or -errno) reaches
    /// the ring with `user_data`. A descriptor that cannot be duplicated completes at once
    /// with that error.
    pub(super) fn push(&self, fd: RawFd, user_data: u64) -> Result<(), i32> {
        // SAFETY: the caller's contract (`Ring::push`): `fd` is open until the completion;
        // it is only duplicated here.
        let dup = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
            .try_clone_to_owned()
            .map_err(|e| -e.raw_os_error().unwrap_or(libc::EBADF))?;
        let tx = self.tx.as_ref().expect("present until drop");
        tx.send((dup, user_data)).map_err(|_| -libc::ECANCELED)
    }
}

impl Drop for SyncfsThread {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The thread: each job's `syncfs`, then its result posted to `target`.
fn run(mut own: IoUring, target: RawFd, rx: &mpsc::Receiver<(OwnedFd, u64)>) {
    while let Ok((fd, user_data)) = rx.recv() {
        let res = match rustix::fs::syncfs(fd.as_fd()) {
            Ok(()) => 0,
            Err(e) => -e.raw_os_error(),
        };
        drop(fd);
        post(&mut own, target, res, user_data);
    }
}

/// Posts one completion to `target`. The message is queued again only once its own
/// completion says it was refused (the target's completion ring full and its overflow list out
/// of memory) and nothing is queued, so the core never gets it twice; a failed submission
/// leaves it queued for the next try. Up to a second of tries: a completion that cannot be
/// delivered would leave a group commit in flight for good, so the process stops then
/// (fail-stop, as for a failed sync): a restart recovers from what is durable.
fn post(own: &mut IoUring, target: RawFd, res: i32, user_data: u64) {
    let msg = opcode::MsgRingData::new(types::Fd(target), res, user_data, None).build();
    let mut last = 0;
    for attempt in 0..100 {
        if own.submission().is_empty() {
            // SAFETY: a ring message points at no memory of ours.
            unsafe { own.submission().push(&msg) }.expect("an empty submission queue has room");
        }
        match wait_one(own) {
            Ok(r) if r >= 0 => return,
            Ok(r) | Err(r) => last = r,
        }
        if attempt == 0 {
            tracing::warn!(
                "syncfs: posting a completion to the core's ring failed ({last}); retrying"
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    tracing::error!(
        "syncfs: cannot post a group commit's completion to the core's ring ({last}); \
         stopping the process (a restart recovers what is durable)"
    );
    std::process::abort();
}

/// Submits what is queued and waits for one completion of `own`: its result, or the
/// submission's error (-errno; then the message is still queued).
fn wait_one(own: &mut IoUring) -> Result<i32, i32> {
    loop {
        if let Some(c) = own.completion().next() {
            return Ok(c.result());
        }
        match own.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(-e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }
}
