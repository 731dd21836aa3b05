//! `--fsync-scope`: whether a round of group commits that names several files is one
//! `syncfs` of the data directory's filesystem, and the descriptors it is issued on (one per
//! core: `syncfs` reports a writeback error once per open file description, so cores must not
//! share one). log-store/DESIGN.md, "What a commit round costs with several shards".
#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::config::FsyncScope;

/// Whether rounds use `syncfs` (`filesystem`). Every shard directory must then be on the data
/// directory's filesystem (a `syncfs` of it would not cover the others), and the kernel must
/// have `IORING_OP_MSG_RING` (`msg_ring`, how its completion reaches the core): refused
/// otherwise.
pub fn decide(
    scope: FsyncScope,
    data_dir: &Path,
    shard_dirs: &[PathBuf],
    msg_ring: bool,
) -> Result<bool, String> {
    if scope == FsyncScope::File {
        return Ok(false);
    }
    if !msg_ring {
        return Err(
            "--fsync-scope filesystem: this kernel's io_uring has no MSG_RING \
                    operation (Linux 5.18), which brings a syncfs's completion to its core; \
                    use --fsync-scope file"
                .into(),
        );
    }
    let dev = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.dev())
            .map_err(|e| format!("--fsync-scope filesystem: {}: {e}", p.display()))
    };
    let home = dev(data_dir)?;
    for d in shard_dirs {
        if dev(d)? != home {
            return Err(format!(
                "--fsync-scope filesystem: shard directory {} is not on the filesystem of \
                 --data-dir {} (one syncfs would not cover it); use --fsync-scope file",
                d.display(),
                data_dir.display()
            ));
        }
    }
    Ok(true)
}

/// `cores` descriptors of `data_dir`, each its own open file description.
pub fn open_dirs(data_dir: &Path, cores: usize) -> Result<Vec<OwnedFd>, String> {
    (0..cores)
        .map(|_| {
            std::fs::File::open(data_dir)
                .map(OwnedFd::from)
                .map_err(|e| format!("--data-dir {}: {e}", data_dir.display()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_never_syncs_the_filesystem_and_filesystem_does() {
        let d = tempfile::tempdir().unwrap();
        let shard = d.path().join("shard-0");
        std::fs::create_dir_all(&shard).unwrap();
        let shards = [shard];
        assert_eq!(decide(FsyncScope::File, d.path(), &shards, true), Ok(false));
        assert_eq!(
            decide(FsyncScope::Filesystem, d.path(), &shards, true),
            Ok(true)
        );
        // A missing directory is named.
        let e = decide(
            FsyncScope::Filesystem,
            &d.path().join("nope"),
            &shards,
            true,
        )
        .unwrap_err();
        assert!(e.contains("nope"), "{e}");
        // Without MSG_RING the completion could not reach the core: refused, and said why.
        let e = decide(FsyncScope::Filesystem, d.path(), &shards, false).unwrap_err();
        assert!(e.contains("MSG_RING"), "{e}");
        assert_eq!(
            decide(FsyncScope::File, d.path(), &shards, false),
            Ok(false)
        );
    }

    #[test]
    fn a_shard_on_another_filesystem_is_refused() {
        // /proc is another filesystem than the temporary directory.
        let d = tempfile::tempdir().unwrap();
        let shards = [PathBuf::from("/proc")];
        let e = decide(FsyncScope::Filesystem, d.path(), &shards, true).unwrap_err();
        assert!(
            e.contains("not on the filesystem") && e.contains("/proc"),
            "{e}"
        );
        assert_eq!(decide(FsyncScope::File, d.path(), &shards, true), Ok(false));
    }

    #[test]
    fn each_core_gets_its_own_open_file_description() {
        let d = tempfile::tempdir().unwrap();
        let fds = open_dirs(d.path(), 2).unwrap();
        assert_eq!(fds.len(), 2);
        // A status flag set on one does not show on the other: two descriptions, so each
        // core's syncfs sees every writeback error once.
        let flags = |fd: &OwnedFd| rustix::fs::fcntl_getfl(fd).unwrap();
        rustix::fs::fcntl_setfl(&fds[0], flags(&fds[0]) | rustix::fs::OFlags::NONBLOCK).unwrap();
        assert!(flags(&fds[0]).contains(rustix::fs::OFlags::NONBLOCK));
        assert!(!flags(&fds[1]).contains(rustix::fs::OFlags::NONBLOCK));
        assert!(open_dirs(&d.path().join("missing"), 1).is_err());
    }
}
