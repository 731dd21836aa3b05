//! The only module with `unsafe`: a shared, writable file mapping ([`SharedMap`]) split into a
//! *frozen* prefix that any number of readers may borrow and a private remainder that only the
//! holder of the map's unique [`WriteToken`] may read or write; plus two plain syscall wrappers
//! (`posix_fallocate`, the coarse realtime clock).
//!
//! Soundness rests on three rules, each enforced here by assertions, not by callers' care:
//! 1. Bytes `[0, frozen)` are never written again: every write asserts `off >= frozen`, and
//!    `frozen` only grows.
//! 2. Bytes `[frozen, len)` are only touched through the token: `read_private`/`private_mut`
//!    borrow the token (shared/exclusive), so a write (needing `&mut WriteToken`) cannot overlap
//!    a live private borrow; exactly one token exists per map (created with it, not `Clone`).
//! 3. The mapping lives as long as the `SharedMap` (dropped = unmapped), and every `&[u8]`
//!    handed out borrows the `SharedMap`.
//!
//! Assumed of the environment (documented in DESIGN.md): no other process truncates or writes
//! the segment files while they are mapped (the log directory is `flock`ed by its owner), and
//! the file is at least `len` bytes long with its blocks allocated (`posix_fallocate`), so no
//! access through the mapping raises SIGBUS.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use memmap2::{MmapOptions, MmapRaw};

static NEXT_MAP_ID: AtomicU64 = AtomicU64::new(1);

/// A writable shared mapping of a whole file with a frozen (immutable, shareable) prefix.
#[derive(Debug)]
pub(crate) struct SharedMap {
    raw: MmapRaw,
    len: usize,
    frozen: AtomicUsize,
    id: u64,
    /// The mapped file's inode, named to the simulator's hook at each flush.
    #[cfg(feature = "sim")]
    ino: u64,
}

/// The unique right to read and write the private (unfrozen) part of one [`SharedMap`].
#[derive(Debug)]
pub(crate) struct WriteToken {
    id: u64,
}

impl SharedMap {
    /// Maps the first `len` bytes of `file` (opened read-write, at least `len` long, blocks
    /// allocated), lazily, and returns the map with nothing frozen, and its unique token.
    pub(crate) fn map(file: &File, len: usize) -> io::Result<(SharedMap, WriteToken)> {
        let mut opts = MmapOptions::new();
        opts.len(len);
        let raw = opts.map_raw(file)?;
        let id = NEXT_MAP_ID.fetch_add(1, Ordering::Relaxed);
        Ok((
            SharedMap {
                raw,
                len,
                frozen: AtomicUsize::new(0),
                id,
                #[cfg(feature = "sim")]
                ino: std::os::unix::fs::MetadataExt::ino(&file.metadata()?),
            },
            WriteToken { id },
        ))
    }

    /// Borrows frozen bytes `[off, off + len)`. Panics if they are not all frozen.
    pub(crate) fn read_frozen(&self, off: usize, len: usize) -> &[u8] {
        let end = off.checked_add(len).expect("range overflow");
        assert!(
            end <= self.frozen.load(Ordering::Acquire),
            "read beyond frozen bytes"
        );
        // SAFETY: `[off, end)` lies inside the mapping (frozen <= self.len, asserted in
        // `freeze`; so `wrapping_add` yields the in-bounds pointer `base + off`), which stays
        // mapped while `self` is borrowed (rule 3). Those bytes are frozen,
        // so no write can happen to them any more (rule 1); the Acquire load pairs with the
        // Release store in `freeze`, so the writes that preceded freezing are visible here.
        unsafe { std::slice::from_raw_parts(self.raw.as_ptr().wrapping_add(off), len) }
    }

    /// Borrows private bytes `[off, off + len)` for the token holder.
    pub(crate) fn read_private<'a>(
        &'a self,
        tok: &'a WriteToken,
        off: usize,
        len: usize,
    ) -> &'a [u8] {
        self.check_private(tok, off, len);
        // SAFETY: inside the mapping (checked, so `wrapping_add` is the in-bounds `base + off`)
        // and mapped while `self` is borrowed (rule 3).
        // Only the token holder touches private bytes, and writes need `&mut WriteToken`, which
        // cannot coexist with the `&'a WriteToken` this borrow keeps (rule 2).
        unsafe { std::slice::from_raw_parts(self.raw.as_ptr().wrapping_add(off), len) }
    }

    /// Mutably borrows private bytes `[off, off + len)` for the token holder.
    pub(crate) fn private_mut<'a>(
        &'a self,
        tok: &'a mut WriteToken,
        off: usize,
        len: usize,
    ) -> &'a mut [u8] {
        self.check_private(tok, off, len);
        // SAFETY: inside the mapping (checked; `wrapping_add` is the in-bounds `base + off`) and
        // not frozen (checked), so no reader borrows these bytes
        // (readers only borrow frozen bytes, rule 1); the exclusive borrow of the unique token
        // excludes any other private borrow for `'a` (rule 2); mapped while `self` lives (rule 3).
        unsafe { std::slice::from_raw_parts_mut(self.raw.as_mut_ptr().wrapping_add(off), len) }
    }

    /// Freezes everything below `end`. `end` may not move backwards.
    pub(crate) fn freeze(&self, tok: &mut WriteToken, end: usize) {
        assert_eq!(tok.id, self.id, "write token of another map");
        assert!(end <= self.len, "freeze beyond the mapping");
        let old = self.frozen.load(Ordering::Relaxed);
        assert!(end >= old, "frozen end moved backwards");
        self.frozen.store(end, Ordering::Release);
    }

    /// Faults the pages covering `[off, off + len)` in, writable, without changing their
    /// contents (`MADV_POPULATE_WRITE`; `MADV_POPULATE_READ` on kernels without it; nothing if
    /// both fail), so the appends that follow take no page faults. Clamped to the mapping.
    pub(crate) fn populate(&self, off: usize, len: usize) {
        let off = off.min(self.len);
        let len = len.min(self.len - off);
        if len == 0 {
            return;
        }
        if self
            .raw
            .advise_range(memmap2::Advice::PopulateWrite, off, len)
            .is_err()
        {
            self.raw
                .advise_range(memmap2::Advice::PopulateRead, off, len)
                .ok();
        }
    }

    /// Faults the pages covering `[off, off + len)` in, read-only (`MADV_POPULATE_READ`;
    /// nothing on kernels without it), clamped to the mapping. For a fresh preallocated file
    /// this is where the kernel allocates and zeroes the page-cache pages, without dirtying
    /// them; a later [`SharedMap::populate`] or write only makes them writable.
    pub(crate) fn populate_read(&self, off: usize, len: usize) {
        let off = off.min(self.len);
        let len = len.min(self.len - off);
        if len > 0 {
            self.raw
                .advise_range(memmap2::Advice::PopulateRead, off, len)
                .ok();
        }
    }

    /// Writes dirty pages of the mapping to the file and waits (`msync(MS_SYNC)`).
    pub(crate) fn flush(&self) -> io::Result<()> {
        #[cfg(feature = "sim")]
        crate::sim::at(crate::sim::Point::Flush {
            ino: self.ino,
            range: None,
        })?;
        self.raw.flush()
    }

    /// Like [`SharedMap::flush`], for the pages covering `[off, off + len)` only.
    pub(crate) fn flush_range(&self, off: usize, len: usize) -> io::Result<()> {
        #[cfg(feature = "sim")]
        crate::sim::at(crate::sim::Point::Flush {
            ino: self.ino,
            range: Some((off, len)),
        })?;
        self.raw.flush_range(off, len)
    }

    fn check_private(&self, tok: &WriteToken, off: usize, len: usize) {
        assert_eq!(tok.id, self.id, "write token of another map");
        let end = off.checked_add(len).expect("range overflow");
        assert!(end <= self.len, "access beyond the mapping");
        assert!(
            off >= self.frozen.load(Ordering::Relaxed),
            "private access to frozen bytes"
        );
    }
}

/// Allocates blocks for `[0, len)` of `file` (extending it), so writes through a mapping never
/// hit ENOSPC as SIGBUS. Returns the OS error (`ENOSPC` on a full disk).
pub(crate) fn fallocate(file: &File, len: u64) -> io::Result<()> {
    #[cfg(feature = "sim")]
    crate::sim::at(crate::sim::Point::Allocate { bytes: len })?;
    let len =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: plain syscall wrapper on a valid, open descriptor borrowed from `file` for the
    // duration of the call; no memory is passed.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Wall-clock Unix milliseconds from `CLOCK_REALTIME_COARSE` (a few ms resolution, several
/// times cheaper than `SystemTime::now()`); record timestamps only feed age-based retention.
pub(crate) fn coarse_unix_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` through the pointer, which points to the
    // live, exclusively borrowed local `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    if rc != 0 || ts.tv_sec < 0 {
        return std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
    }
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_and_private_regions() {
        let f = tempfile::tempfile().unwrap();
        fallocate(&f, 8192).unwrap();
        let (m, mut tok) = SharedMap::map(&f, 8192).unwrap();
        m.private_mut(&mut tok, 0, 4).copy_from_slice(b"abcd");
        m.freeze(&mut tok, 4);
        assert_eq!(m.read_frozen(0, 4), b"abcd");
        assert_eq!(m.read_private(&tok, 4, 2), &[0, 0]);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.read_frozen(0, 5)));
        assert!(r.is_err());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            m.private_mut(&mut tok, 3, 1)[0] = 1;
        }));
        assert!(r.is_err());
        assert_eq!(m.read_frozen(0, 4), b"abcd");
    }

    #[test]
    fn coarse_clock_is_close_to_system_time() {
        let sys = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(coarse_unix_ms().abs_diff(sys) < 1000);
    }
}
