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
}

impl std::fmt::Display for ShardMapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShardMapError::Io(e) => write!(f, "shard map: {e}"),
            ShardMapError::Corrupt(s) => write!(f, "shard map shards.json is corrupt: {s}"),
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
}
