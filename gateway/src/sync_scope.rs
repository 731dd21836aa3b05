//! `--fsync-scope`: whether a round of group commits that names several files is one
//! `syncfs` of the data directory's filesystem, and the descriptors it is issued on (one per
//! core: `syncfs` reports a writeback error once per open file description, so cores must not
//! share one). log-store/DESIGN.md, "What a commit round costs with several shards".
#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::config::FsyncScope;

/// Whether rounds use `syncfs`: `filesystem` always, `file` never, `auto` when `data_dir` is a
/// mount point of its own. Every shard directory must be on the data directory's filesystem
/// (a `syncfs` of it would not cover the others): `filesystem` refuses to start otherwise,
/// `auto` falls back to `file`.
pub fn decide(scope: FsyncScope, data_dir: &Path, shard_dirs: &[PathBuf]) -> Result<bool, String> {
    if scope == FsyncScope::File {
        return Ok(false);
    }
    let dev = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.dev())
            .map_err(|e| format!("--fsync-scope: {}: {e}", p.display()))
    };
    let home = dev(data_dir)?;
    for d in shard_dirs {
        if dev(d)? != home {
            if scope == FsyncScope::Auto {
                return Ok(false);
            }
            return Err(format!(
                "--fsync-scope filesystem: shard directory {} is not on the filesystem of \
                 --data-dir {} (one syncfs would not cover it); use --fsync-scope file",
                d.display(),
                data_dir.display()
            ));
        }
    }
    Ok(scope == FsyncScope::Filesystem || is_mount_point(data_dir)?)
}

/// Whether `dir` is the root of a filesystem: its parent is on another device, or it is `/`.
pub fn is_mount_point(dir: &Path) -> Result<bool, String> {
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let Some(parent) = dir.parent() else {
        return Ok(true);
    };
    let (a, b) = (std::fs::metadata(&dir), std::fs::metadata(parent));
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(a.dev() != b.dev()),
        (Err(e), _) | (_, Err(e)) => Err(format!("{}: {e}", dir.display())),
    }
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
    fn file_never_syncs_the_filesystem_and_filesystem_always_does() {
        let d = tempfile_dir("scope");
        let shard = d.join("shard-0");
        std::fs::create_dir_all(&shard).unwrap();
        let shards = [shard];
        assert_eq!(decide(FsyncScope::File, &d, &shards), Ok(false));
        assert_eq!(decide(FsyncScope::Filesystem, &d, &shards), Ok(true));
        // A directory under /tmp is not a mount point of its own: auto keeps fdatasync.
        assert_eq!(decide(FsyncScope::Auto, &d, &shards), Ok(false));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_mount_point_is_told_from_a_plain_directory() {
        assert_eq!(is_mount_point(Path::new("/")), Ok(true));
        assert_eq!(is_mount_point(Path::new("/proc")), Ok(true));
        let d = tempfile_dir("mount");
        assert_eq!(is_mount_point(&d), Ok(false));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_shard_on_another_filesystem_is_refused_or_falls_back() {
        // /proc is another filesystem than the temporary directory.
        let d = tempfile_dir("other");
        let shards = [PathBuf::from("/proc")];
        let e = decide(FsyncScope::Filesystem, &d, &shards).unwrap_err();
        assert!(
            e.contains("not on the filesystem") && e.contains("/proc"),
            "{e}"
        );
        assert_eq!(decide(FsyncScope::Auto, &d, &shards), Ok(false));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn each_core_gets_its_own_open_file_description() {
        let d = tempfile_dir("dirs");
        let fds = open_dirs(&d, 2).unwrap();
        assert_eq!(fds.len(), 2);
        // Setting a status flag on one does not show on the other: two descriptions.
        let flags = |fd: &OwnedFd| rustix::fs::fcntl_getfl(fd).unwrap();
        rustix::fs::fcntl_setfl(&fds[0], flags(&fds[0]) | rustix::fs::OFlags::NONBLOCK).unwrap();
        assert!(flags(&fds[0]).contains(rustix::fs::OFlags::NONBLOCK));
        assert!(!flags(&fds[1]).contains(rustix::fs::OFlags::NONBLOCK));
        assert!(open_dirs(&d.join("missing"), 1).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn tempfile_dir(what: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "gateway-sync-scope-{what}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
