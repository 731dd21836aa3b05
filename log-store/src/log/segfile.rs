//! Segment files: creating one (a fresh preallocated file, or the adopted spare), making it
//! durable, mapping it, and stamping its header — the roll does this inline, or takes a file
//! the background thread prepared the same way (`background.rs`) — and, at open, which files
//! of a directory are the log's segments.
#![forbid(unsafe_code)]

use std::os::unix::fs::FileExt;

use super::*;

/// A segment file created (or adopted from the spare), sized, mapped, and with its header
/// still all zero on disk: while it is the last file, recovery deletes it (DESIGN.md,
/// recovery step 3), so it is never mistaken for data.
#[derive(Debug)]
pub(crate) struct SegFile {
    pub(crate) number: u64,
    pub(crate) path: PathBuf,
    pub(crate) file: File,
    pub(crate) map: SharedMap,
    pub(crate) tok: WriteToken,
    /// The first `POPULATE_AHEAD_BYTES` past the header and below the end are faulted in
    /// writable (a prepared segment).
    pub(crate) populated: bool,
}

/// How the roll stamps the new segment's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// Written now; with `flush`, flushed before the first record goes in.
    Now { flush: bool },
    /// Written now into the mapping, made durable by the next group commit (the previous
    /// segment's seal is already durable).
    Written,
    /// Left zero until the previous segment's seal is known durable (background mode).
    Deferred,
}

/// Creates segment `number`'s file (adopting the spare when `spare`), preallocated to `bytes`
/// (`posix_fallocate`); when `durable`, makes its directory entry durable (`fsync(dir)`), and
/// with `sync_data` its size and blocks too (`fdatasync`); then maps it. Its header stays zero.
/// On failure nothing is left under the segment's name.
pub(crate) fn create_file(
    dir: &Path,
    number: u64,
    bytes: u64,
    spare: bool,
    durable: bool,
    sync_data: bool,
) -> Result<SegFile, AppendError> {
    let path = segment_path(dir, number);
    let recycled = if spare {
        adopt_spare(dir, number, bytes, durable).map_err(AppendError::Io)?
    } else {
        None
    };
    let file = match recycled {
        Some(f) => f,
        None => {
            let file = File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(AppendError::Io)?;
            if let Err(e) = mmap::fallocate(&file, bytes) {
                let _ = fs::remove_file(&path);
                return Err(if e.raw_os_error() == Some(libc::ENOSPC) {
                    AppendError::DiskFull
                } else {
                    AppendError::Io(e)
                });
            }
            file
        }
    };
    let mapped = (|| {
        if durable {
            if sync_data {
                file.sync_data()?;
            }
            sync_dir(dir)?;
        }
        SharedMap::map(&file, bytes as usize)
    })();
    match mapped {
        Ok((map, tok)) => Ok(SegFile {
            number,
            path,
            file,
            map,
            tok,
            populated: false,
        }),
        Err(e) => {
            let _ = fs::remove_file(&path);
            Err(AppendError::Io(e))
        }
    }
}

/// Turns the spare file into segment `number`'s file: zeroes its header and its last entry slot
/// (flushed first when `durable`), then renames it. The rest keeps the old bytes: stale data is
/// never read without a valid entry, the writer keeps the slot below its lowest entry zero (the
/// scan's end marker), and a stale entry could not validate (the CRC chain starts from the new
/// header). Crash right after the rename: the last segment has a zero header, or (under
/// `fsync=never`, zeroing not on disk) still carries the old header with a smaller number;
/// recovery deletes either (DESIGN.md, recovery step 3). `None` when the spare has another size.
fn adopt_spare(dir: &Path, number: u64, bytes: u64, durable: bool) -> io::Result<Option<File>> {
    let spare_path = dir.join(SPARE_FILE);
    let file = File::options().read(true).write(true).open(&spare_path)?;
    if file.metadata()?.len() != bytes {
        drop(file);
        fs::remove_file(&spare_path)?;
        return Ok(None);
    }
    {
        let len = bytes as usize;
        let (map, mut tok) = SharedMap::map(&file, len)?;
        map.private_mut(&mut tok, 0, HEADER_BYTES).fill(0);
        map.private_mut(&mut tok, len - ENTRY_BYTES, ENTRY_BYTES)
            .fill(0);
        if durable {
            map.flush_range(0, HEADER_BYTES)?;
            map.flush_range(len - ENTRY_BYTES, ENTRY_BYTES)?;
        }
    }
    fs::rename(&spare_path, segment_path(dir, number))?;
    Ok(Some(file))
}

/// Makes `f` a segment of the log: its header (epoch, number, size, now) stamped as `how`
/// says, its metadata and its write state. The header's CRC seeds the entry chain whether or
/// not the header is written yet.
pub(crate) fn install(
    f: SegFile,
    epoch: Epoch,
    bytes: u64,
    how: Stamp,
    lock: &Arc<File>,
) -> Result<(SegMeta, Active), AppendError> {
    let SegFile {
        number,
        path,
        file,
        map,
        mut tok,
        populated,
    } = f;
    let header = Header {
        version: SEGMENT_VERSION,
        epoch,
        number,
        segment_bytes: bytes,
        created_unix_ms: now_unix_ms(SystemTime::now()),
    }
    .encode();
    let state = match how {
        Stamp::Deferred => HeaderState::Waiting(header),
        Stamp::Now { .. } | Stamp::Written => {
            map.private_mut(&mut tok, 0, HEADER_BYTES)
                .copy_from_slice(&header);
            map.freeze(&mut tok, HEADER_BYTES);
            if how == (Stamp::Now { flush: true })
                && let Err(e) = map.flush_range(0, HEADER_BYTES)
            {
                let _ = fs::remove_file(&path);
                return Err(AppendError::Io(e));
            }
            if how == Stamp::Written {
                HeaderState::Written
            } else {
                HeaderState::Durable
            }
        }
    };
    let seg = Arc::new(Segment::new(number, path, map, file, Arc::clone(lock)));
    let meta = SegMeta {
        seg,
        bytes,
        newest_ts_ms: 0,
        streams: Vec::new(),
    };
    let chain = Header::crc(&header);
    Ok((meta, Active::fresh(tok, bytes, chain, state, populated)))
}

/// The segment numbers recovery scans: files below the checkpoint's first live segment are
/// deleted (C8), and so are trailing files whose header never reached the disk (step 3).
pub(super) fn live_segments(
    dir: &Path,
    first_live: u64,
    report: &mut RecoveryReport,
) -> Result<Vec<u64>, OpenError> {
    let mut numbers = list_segments(dir)?;
    let mut live = Vec::with_capacity(numbers.len());
    for n in numbers.drain(..) {
        if n < first_live {
            // Retention checkpointed its deletion but the file outlived it (a reader still held
            // it, or the process stopped first).
            let p = segment_path(dir, n);
            fs::remove_file(&p).map_err(io_err(&p))?;
            report.stale_segments_deleted += 1;
        } else {
            live.push(n);
        }
    }
    let mut numbers = live;
    // A roll whose header never reached the disk leaves the last segment with a zero header:
    // created or prepared but never adopted (blank), or adopted with records that were never
    // made visible (visibility waits for the header: DESIGN.md C16-C17). A recycled spare whose
    // adoption was lost under `fsync=never` still carries the previous generation's header (a
    // smaller number). Nothing in such a file can be valid: remove it, and look again (a
    // prepared file may follow an adopted one whose header was not written yet).
    while let Some(&last) = numbers.last()
        && segment_never_began(&segment_path(dir, last), last)?
    {
        let p = segment_path(dir, last);
        fs::remove_file(&p).map_err(io_err(&p))?;
        sync_dir(dir).map_err(io_err(dir))?;
        numbers.pop();
    }
    Ok(numbers)
}

/// Segment numbers present in `dir`, ascending. Other files are ignored.
fn list_segments(dir: &Path) -> Result<Vec<u64>, OpenError> {
    let mut numbers = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) else {
            continue;
        };
        if stem.len() == 20
            && stem.bytes().all(|b| b.is_ascii_digit())
            && let Ok(n) = stem.parse::<u64>()
        {
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// True when the file's header is all zero (or the file is shorter than a header and all zero),
/// whatever its entries hold, or is a valid header of an older segment number (a recycled file
/// whose new header was lost).
fn segment_never_began(path: &Path, number: u64) -> Result<bool, OpenError> {
    let f = File::open(path).map_err(io_err(path))?;
    let mut head = [0u8; HEADER_BYTES];
    let n = f.read_at(&mut head, 0).map_err(io_err(path))?;
    if n == HEADER_BYTES
        && let Ok(h) = Header::decode(&head)
        && h.number < number
    {
        return Ok(true);
    }
    Ok(head[..n].iter().all(|&b| b == 0))
}
