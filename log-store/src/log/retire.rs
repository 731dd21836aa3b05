//! Where a segment goes when its last guard (the log's or a `LogSlice`'s) drops: its mapping
//! is unmapped, its file closed and — if retention removed it — unlinked. By default that
//! happens on the dropping thread. After [`retire_in_background`] it happens on one background
//! thread instead, so an event loop that drops the last slice of a retired segment pays
//! neither the `munmap` (with its TLB shootdown on every core that ran the process) nor the
//! `unlink`. Nothing is lost if the process stops with retirements queued: a file below the
//! checkpoint's first live segment is deleted by the next open.
#![forbid(unsafe_code)]

use std::fs::{self, File};
use std::path::PathBuf;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, OnceLock};

use crate::mmap::SharedMap;

/// What a dropped segment leaves to retire.
#[derive(Debug)]
pub(crate) struct Retired {
    /// Held to be dropped (unmapped) here.
    pub(crate) _map: SharedMap,
    /// Held to be dropped (closed) here.
    pub(crate) _file: File,
    /// Unlinked first (then the mapping and the file go, then the directory lock reference).
    pub(crate) unlink: Option<PathBuf>,
    /// Released last: no new `Log` opens the directory before the mapping is gone.
    pub(crate) _lock: Arc<File>,
}

impl Drop for Retired {
    fn drop(&mut self) {
        if let Some(path) = &self.unlink {
            // A failure leaves a file below the checkpoint's first live segment; the next open
            // deletes it. Nothing else can be done from a destructor.
            let _ = fs::remove_file(path);
        }
    }
}

static BACKGROUND: OnceLock<Sender<Retired>> = OnceLock::new();

/// From now on, retire dropped segments on a background thread (`log-retire`), for the whole
/// process. Idempotent. Fails only if the thread cannot be spawned (then retirement stays on
/// the dropping thread).
pub fn retire_in_background() -> std::io::Result<()> {
    if BACKGROUND.get().is_some() {
        return Ok(());
    }
    let (tx, rx) = channel::<Retired>();
    std::thread::Builder::new()
        .name("log-retire".into())
        .spawn(move || {
            for r in rx {
                drop(r);
            }
        })?;
    // A racing second caller's thread ends at once: its sender is dropped with it.
    let _ = BACKGROUND.set(tx);
    Ok(())
}

/// Retires a dropped segment: here, or on the background thread once it runs.
pub(crate) fn retire(r: Retired) {
    match BACKGROUND.get() {
        Some(tx) => {
            if let Err(e) = tx.send(r) {
                drop(e.0); // the thread is gone: retire here
            }
        }
        None => drop(r),
    }
}
