//! Stream → shard → core ownership. The shard count is fixed when the data directory is
//! created and persisted in `shards.json`, so a restart with another `--cores` maps every
//! stream to the same shard (and so the same log). Shard `s` lives in `shard-NNN/` and is owned
//! by core `s % cores`. Pure except for [`load_or_create`], which reads/writes the one file.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Stable 64-bit FNV-1a of a stream name (never changes across versions or platforms).
pub fn stream_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The shard of a stream.
pub fn shard_of(name: &str, shards: u32) -> u32 {
    assert!(shards > 0);
    // All MCP streams (`mcp/<session>/<n>`) live in one shard, so one core owns the MCP state.
    let name = if name.starts_with("mcp/") {
        "mcp/"
    } else {
        name
    };
    (stream_hash(name) % u64::from(shards)) as u32
}

/// The core owning a shard.
pub fn core_of_shard(shard: u32, cores: usize) -> usize {
    shard as usize % cores
}

/// Directory of one shard's log.
pub fn shard_dir(data_dir: &Path, shard: u32) -> PathBuf {
    data_dir.join(format!("shard-{shard:03}"))
}

/// Why the shard map could not be read or written.
#[derive(Debug)]
pub enum ShardMapError {
    Io(std::io::Error),
    /// `shards.json` exists but is not `{"shards": <n>}` with 1 <= n <= 4096.
    Corrupt(String),
    /// `shards.json` is missing but the directory already holds shard logs: recreating it with
    /// `--shards-on-create` could change the count and silently re-route every stream to a
    /// shard that does not hold its history.
    Missing {
        shard_dirs: usize,
    },
}

impl std::fmt::Display for ShardMapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShardMapError::Io(e) => write!(f, "shard map: {e}"),
            ShardMapError::Corrupt(s) => write!(f, "shard map shards.json is corrupt: {s}"),
            ShardMapError::Missing { shard_dirs } => write!(
                f,
                "shards.json is missing but {shard_dirs} shard directories exist; refusing to \
                 guess the shard count (restore shards.json as {{\"shards\": <original count>}})"
            ),
        }
    }
}

/// Reads `data_dir/shards.json`, or creates it with `on_create` shards (durably: written to a
/// temporary file, fsynced, renamed, directory fsynced).
pub fn load_or_create(data_dir: &Path, on_create: u32) -> Result<u32, ShardMapError> {
    let path = data_dir.join("shards.json");
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let v: serde_json::Value =
                serde_json::from_str(&s).map_err(|e| ShardMapError::Corrupt(e.to_string()))?;
            let n = v["shards"]
                .as_u64()
                .filter(|n| (1..=4096).contains(n))
                .ok_or_else(|| ShardMapError::Corrupt(s.trim().to_owned()))?;
            Ok(n as u32)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!((1..=4096).contains(&on_create));
            let shard_dirs = existing_shard_dirs(data_dir).map_err(ShardMapError::Io)?;
            if shard_dirs > 0 {
                return Err(ShardMapError::Missing { shard_dirs });
            }
            std::fs::create_dir_all(data_dir).map_err(ShardMapError::Io)?;
            let tmp = data_dir.join("shards.json.tmp");
            let mut f = std::fs::File::create(&tmp).map_err(ShardMapError::Io)?;
            writeln!(f, "{}", serde_json::json!({ "shards": on_create }))
                .map_err(ShardMapError::Io)?;
            f.sync_all().map_err(ShardMapError::Io)?;
            std::fs::rename(&tmp, &path).map_err(ShardMapError::Io)?;
            std::fs::File::open(data_dir)
                .and_then(|d| d.sync_all())
                .map_err(ShardMapError::Io)?;
            Ok(on_create)
        }
        Err(e) => Err(ShardMapError::Io(e)),
    }
}

/// Number of `shard-<digits>` directories in `data_dir` (0 if it does not exist).
fn existing_shard_dirs(data_dir: &Path) -> std::io::Result<usize> {
    let entries = match std::fs::read_dir(data_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut n = 0;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let is_shard = name
            .to_str()
            .and_then(|s| s.strip_prefix("shard-"))
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
        if is_shard && entry.file_type()?.is_dir() {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable() {
        // Pinned values: changing the hash would misroute every existing stream.
        assert_eq!(stream_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stream_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(shard_of("a", 8), (0xaf63_dc4c_8601_ec8cu64 % 8) as u32);
    }

    #[test]
    fn persisted_count_wins() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(load_or_create(d.path(), 8).unwrap(), 8);
        assert_eq!(load_or_create(d.path(), 3).unwrap(), 8);
        std::fs::write(d.path().join("shards.json"), "{\"shards\":0}").unwrap();
        assert!(matches!(
            load_or_create(d.path(), 3),
            Err(ShardMapError::Corrupt(_))
        ));
    }

    /// Regression (adversarial review): a lost shards.json next to existing shard logs used to
    /// be recreated from `--shards-on-create`, silently re-routing streams away from their
    /// history when the count differed. Now it is an explicit error and nothing is written.
    #[test]
    fn missing_map_beside_shard_logs_is_refused() {
        let d = tempfile::tempdir().unwrap();
        for s in 0..8 {
            std::fs::create_dir_all(shard_dir(d.path(), s)).unwrap();
        }
        std::fs::create_dir_all(d.path().join("shard-notes")).unwrap();
        match load_or_create(d.path(), 3) {
            Err(ShardMapError::Missing { shard_dirs }) => assert_eq!(shard_dirs, 8),
            other => panic!("expected Missing, got {other:?}"),
        }
        assert!(!d.path().join("shards.json").exists());
        // A fresh (or not yet existing) directory is still created.
        let fresh = d.path().join("new");
        assert_eq!(load_or_create(&fresh, 3).unwrap(), 3);
        assert_eq!(load_or_create(&fresh, 5).unwrap(), 3);
    }
}
