//! The fault-injection seam of the deterministic simulator (the `sim` crate), compiled only with
//! the `sim` feature. A hook, set per thread, sees every flush of a mapped file (the only way
//! the log makes mapped bytes durable: its own group commits run outside, through
//! [`crate::SyncJob::fds`]) and every preallocation of a segment file, and may fail either:
//! `EIO` from a flush, `ENOSPC` from a preallocation. Without the feature this module is absent
//! and the two call sites compile to nothing.
//!
//! Why a seam at all: a simulated crash keeps only what was made durable, so the simulator
//! must know each moment the log made a file durable on its own (a roll's flush, inline
//! retention's `sync_now`, recovery's repair of a torn tail, a spare's zeroed header), and
//! which file, and it must be able to make that fail the way a disk does.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::io;

/// A storage call the hook sees before the log makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// `msync(MS_SYNC)` of the mapping of the file with inode `ino`: all of it (`range` None)
    /// or the pages covering `(offset, length)`.
    Flush {
        ino: u64,
        range: Option<(usize, usize)>,
    },
    /// `posix_fallocate` of `bytes` for a new segment file.
    Allocate { bytes: u64 },
}

/// What the hook is: `Err` is returned to the log as the call's outcome, and the call is not
/// made.
pub type Hook = Box<dyn FnMut(Point) -> io::Result<()>>;

thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// Sets this thread's hook (`None`: none); returns the previous one.
pub fn set_hook(hook: Option<Hook>) -> Option<Hook> {
    HOOK.with(|h| std::mem::replace(&mut *h.borrow_mut(), hook))
}

/// Asks this thread's hook about `p` (`Ok` when there is none).
pub(crate) fn at(p: Point) -> io::Result<()> {
    HOOK.with(|h| match h.borrow_mut().as_mut() {
        Some(f) => f(p),
        None => Ok(()),
    })
}
