//! The simulated disk: a directory under `/dev/shm` (the log's real files, mapped as usual)
//! plus, per file, the image that is durable. The durable image moves at a group commit the
//! simulator carries out (the bytes when it began, once it succeeds) and at every flush the
//! log makes on its own (the `log_store::sim` hook). A crash rewrites every segment file page
//! by page (4 KiB or 512 bytes): a page changed since its durable image comes, by the seed,
//! from the current bytes or the durable ones (a torn write); the log is then reopened from
//! what remains. The hook also injects `EIO` into flushes and `ENOSPC` into preallocations.
//!
//! Not modelled: directory entries (create, rename, unlink) are durable at once, and files the
//! log writes with `write` + `fsync` before renaming them (the checkpoint) are kept as they are.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use log_store::sim::{self as hook, Point};

use crate::rng::Rng;

/// Fault rates of the disk, per mille of calls.
#[derive(Debug, Clone, Copy)]
pub struct DiskFaults {
    pub flush_eio_per_mille: u32,
    pub enospc_per_mille: u32,
}

/// What the hook saw, for the trace (drained by the world after each call into the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskNote {
    Flushed { whole: bool },
    FlushFailed,
    DiskFull,
}

#[derive(Debug)]
struct State {
    dir: PathBuf,
    durable: BTreeMap<u64, Vec<u8>>,
    /// Flushes per inode so far: a group commit that began before one does not move the
    /// durable image back.
    flushes: BTreeMap<u64, u64>,
    faults: DiskFaults,
    /// No faults while set (setup, reopening after a crash).
    paused: bool,
    /// Preallocations left to fail in the current full-disk period.
    full_left: u32,
    rng: Rng,
    notes: Vec<DiskNote>,
}

/// One file's bytes when a group commit began.
#[derive(Debug)]
pub struct Snapshot {
    ino: u64,
    flushes: u64,
    bytes: Vec<u8>,
}

/// The simulated disk of one seed. Dropping it removes the directory and the hook.
#[derive(Debug)]
pub struct Disk {
    dir: PathBuf,
    page_bytes: usize,
    state: Rc<RefCell<State>>,
}

impl Disk {
    /// A fresh directory for `seed`, and the hook installed on this thread.
    pub fn new(seed: u64, page_bytes: usize, faults: DiskFaults, rng: Rng) -> io::Result<Disk> {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("sim-{}-{seed:016x}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir)?;
        let state = Rc::new(RefCell::new(State {
            dir: dir.clone(),
            durable: BTreeMap::new(),
            flushes: BTreeMap::new(),
            faults,
            paused: false,
            full_left: 0,
            rng,
            notes: Vec::new(),
        }));
        let s = Rc::clone(&state);
        hook::set_hook(Some(Box::new(move |p| s.borrow_mut().at(p))));
        Ok(Disk {
            dir,
            page_bytes,
            state,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops (or resumes) injecting faults.
    pub fn pause_faults(&self, paused: bool) {
        self.state.borrow_mut().paused = paused;
    }

    /// What the hook saw since the last call.
    pub fn take_notes(&self) -> Vec<DiskNote> {
        std::mem::take(&mut self.state.borrow_mut().notes)
    }

    /// The bytes of the files a group commit covers, as it begins.
    pub fn snapshot<'a>(&self, fds: impl Iterator<Item = BorrowedFd<'a>>) -> Vec<Snapshot> {
        let st = self.state.borrow();
        fds.map(|fd| {
            st.snapshot(&File::from(
                fd.try_clone_to_owned().expect("dup a segment fd"),
            ))
        })
        .collect()
    }

    /// The bytes of every segment file on the disk (each node's shard directories) now: what
    /// a `syncfs` that succeeds now makes durable.
    pub fn snapshot_all(&self) -> Vec<Snapshot> {
        let st = self.state.borrow();
        (names(&self.dir).into_iter())
            .filter(|(name, _)| name.ends_with(".seg"))
            .filter_map(|(name, _)| File::open(self.dir.join(name)).ok())
            .map(|f| st.snapshot(&f))
            .collect()
    }

    /// The group commit that took `snaps` succeeded: their bytes are durable.
    pub fn commit(&self, snaps: Vec<Snapshot>) {
        let mut st = self.state.borrow_mut();
        for s in snaps {
            if st.flushes.get(&s.ino).copied().unwrap_or(0) == s.flushes {
                st.durable.insert(s.ino, s.bytes);
            }
        }
    }

    /// Whether `bytes` at `off` of segment `number`'s file are in its durable image.
    pub fn is_durable(&self, number: u64, off: u64, bytes: &[u8]) -> bool {
        self.is_durable_in(&self.dir, number, off, bytes)
    }

    /// [`Disk::is_durable`] for a log in `dir` (a node's shard directory).
    pub fn is_durable_in(&self, dir: &Path, number: u64, off: u64, bytes: &[u8]) -> bool {
        let path = dir.join(format!("{number:020}.seg"));
        let Ok(meta) = fs::metadata(&path) else {
            return false;
        };
        let st = self.state.borrow();
        let Some(img) = st.durable.get(&meta.ino()) else {
            return false;
        };
        let off = off as usize;
        img.get(off..off + bytes.len()) == Some(bytes)
    }

    /// The directory as a crash leaves it, computed now (before the log is dropped): every
    /// segment file's pages torn between current and durable bytes; other files as they are.
    pub fn crash_image(&self, rng: &mut Rng) -> Vec<(String, Vec<u8>)> {
        let st = self.state.borrow();
        let mut out = Vec::new();
        for (name, ino, cur) in list_files(&self.dir) {
            if !(name.ends_with(".seg") || name == "spare" || name.ends_with("/spare")) {
                out.push((name, cur));
                continue;
            }
            let zeros;
            let durable = match st.durable.get(&ino) {
                Some(d) if d.len() == cur.len() => d,
                _ => {
                    zeros = vec![0u8; cur.len()];
                    &zeros
                }
            };
            let mut torn = cur.clone();
            for (i, page) in torn.chunks_mut(self.page_bytes).enumerate() {
                let keep_current = rng.chance(500);
                let at = i * self.page_bytes;
                if !keep_current {
                    page.copy_from_slice(&durable[at..at + page.len()]);
                }
            }
            out.push((name, torn));
        }
        out
    }

    /// Replaces the directory's files by `image` (after the crashed log was dropped); all of
    /// it is durable now.
    pub fn restore(&self, image: Vec<(String, Vec<u8>)>) {
        for (name, _) in names(&self.dir) {
            fs::remove_file(self.dir.join(name)).expect("remove a file");
        }
        let mut st = self.state.borrow_mut();
        st.durable.clear();
        st.flushes.clear();
        st.full_left = 0;
        for (name, bytes) in image {
            let p = self.dir.join(&name);
            if let Some(parent) = p.parent() {
                fs::create_dir_all(parent).expect("a shard directory");
            }
            fs::write(&p, &bytes).expect("write a file back");
            let ino = fs::metadata(&p).expect("stat").ino();
            st.durable.insert(ino, bytes);
        }
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        hook::set_hook(None);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl State {
    /// `f`'s bytes now, with its flush count.
    fn snapshot(&self, f: &File) -> Snapshot {
        let ino = f.metadata().expect("fstat").ino();
        Snapshot {
            ino,
            flushes: self.flushes.get(&ino).copied().unwrap_or(0),
            bytes: read_all(f),
        }
    }

    /// The hook: fail the call by the seed, else (a flush) make its bytes durable.
    fn at(&mut self, p: Point) -> io::Result<()> {
        match p {
            Point::Flush { ino, range } => {
                if !self.paused && self.rng.chance(self.faults.flush_eio_per_mille) {
                    self.notes.push(DiskNote::FlushFailed);
                    return Err(io::Error::from_raw_os_error(libc_eio()));
                }
                self.flushed(ino, range);
                self.notes.push(DiskNote::Flushed {
                    whole: range.is_none(),
                });
                Ok(())
            }
            Point::Allocate { .. } => {
                if self.paused {
                    return Ok(());
                }
                if self.full_left == 0 && self.rng.chance(self.faults.enospc_per_mille) {
                    self.full_left = self.rng.range(1, 4) as u32;
                }
                if self.full_left > 0 {
                    self.full_left -= 1;
                    self.notes.push(DiskNote::DiskFull);
                    return Err(io::Error::from_raw_os_error(libc_enospc()));
                }
                Ok(())
            }
        }
    }

    fn flushed(&mut self, ino: u64, range: Option<(usize, usize)>) {
        let Some(path) = names(&self.dir)
            .into_iter()
            .find(|(_, i)| *i == ino)
            .map(|(n, _)| self.dir.join(n))
        else {
            return; // unlinked already: nothing of it survives a crash
        };
        let cur = fs::read(path).expect("read a flushed file");
        *self.flushes.entry(ino).or_insert(0) += 1;
        let img = self
            .durable
            .entry(ino)
            .or_insert_with(|| vec![0u8; cur.len()]);
        img.resize(cur.len(), 0);
        let (from, to) = match range {
            None => (0, cur.len()),
            Some((off, len)) => {
                let page = 4096;
                let from = off / page * page;
                (from, (off + len).div_ceil(page) * page)
            }
        };
        let to = to.min(cur.len());
        img[from..to].copy_from_slice(&cur[from..to]);
    }
}

/// Every file of `dir` and of its subdirectories (a node's shard directories) by relative
/// name, with its inode.
fn names(dir: &Path) -> Vec<(String, u64)> {
    let mut v = Vec::new();
    let entries = fs::read_dir(dir).expect("read the log directory");
    for e in entries.filter_map(Result::ok) {
        let (Ok(name), Ok(meta)) = (e.file_name().into_string(), e.metadata()) else {
            continue;
        };
        if meta.is_file() {
            v.push((name, meta.ino()));
        } else if meta.is_dir() {
            let sub = names(&dir.join(&name));
            v.extend(sub.into_iter().map(|(n, ino)| (format!("{name}/{n}"), ino)));
        }
    }
    v.sort();
    v
}

/// Every file of `dir` by name: (name, inode, bytes).
fn list_files(dir: &Path) -> Vec<(String, u64, Vec<u8>)> {
    names(dir)
        .into_iter()
        .map(|(name, ino)| {
            let bytes = fs::read(dir.join(&name)).unwrap_or_default();
            (name, ino, bytes)
        })
        .collect()
}

fn read_all(f: &File) -> Vec<u8> {
    let len = f.metadata().expect("fstat").len() as usize;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0).expect("read a segment");
    buf
}

const fn libc_eio() -> i32 {
    5
}

const fn libc_enospc() -> i32 {
    28
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn faults() -> DiskFaults {
        DiskFaults {
            flush_eio_per_mille: 0,
            enospc_per_mille: 0,
        }
    }

    /// A crash keeps, page by page, the durable bytes or the current ones, never a mix inside
    /// a page; other files stay whole; the restored directory is what the crash left.
    #[test]
    fn a_crash_tears_segment_files_page_by_page() {
        let disk = Disk::new(u64::MAX - 1, 4096, faults(), Rng::new(1)).expect("disk");
        let seg = disk.dir().join(format!("{:020}.seg", 1));
        fs::write(&seg, vec![0xaa; 4 * 4096]).expect("write");
        fs::write(disk.dir().join("checkpoint"), b"whole").expect("write");
        let f = File::open(&seg).expect("open");
        disk.commit(disk.snapshot(std::iter::once(f.as_fd())));
        assert!(disk.is_durable(1, 4096, &[0xaa; 100]));
        fs::write(&seg, vec![0xbb; 4 * 4096]).expect("write");
        assert!(
            !disk.is_durable(1, 4096, &[0xbb; 100]),
            "written is not durable"
        );
        let mut rng = Rng::new(7);
        let (mut old, mut new) = (0, 0);
        for _ in 0..16 {
            for (name, bytes) in disk.crash_image(&mut rng) {
                if name == "checkpoint" {
                    assert_eq!(bytes, b"whole");
                    continue;
                }
                for page in bytes.chunks(4096) {
                    assert!(page.iter().all(|&b| b == page[0]), "a page is never mixed");
                    if page[0] == 0xaa { old += 1 } else { new += 1 }
                }
            }
        }
        assert!(old > 0 && new > 0, "both images show up: {old} {new}");
        let image = disk.crash_image(&mut rng);
        disk.restore(image.clone());
        for (name, bytes) in image {
            assert_eq!(fs::read(disk.dir().join(&name)).expect("read"), bytes);
        }
    }
}
