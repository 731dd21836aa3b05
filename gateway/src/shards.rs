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

/// The shard of a stream. An MCP stream (`mcp/<owner>/<n>`) lives in its owner's shard
/// ([`mcp_owner_shard`]); any other stream in the shard of its name's hash.
pub fn shard_of(name: &str, shards: u32) -> u32 {
    assert!(shards > 0);
    match name.strip_prefix("mcp/") {
        Some(rest) => mcp_owner_shard(rest.split('/').next().unwrap_or(""), shards),
        None => (stream_hash(name) % u64::from(shards)) as u32,
    }
}

/// The shard every MCP stream lived in before the MCP front ran on every core, and where the
/// streams of an owner that names no shard still live: a session ID minted then (or in
/// cluster mode) is bare hex.
pub fn mcp_legacy_shard(shards: u32) -> u32 {
    (stream_hash("mcp/") % u64::from(shards)) as u32
}

/// The shard of an MCP stream owner: a session ID, or a modern-era boot prefix (`m` and the
/// rest). One minted on a core of the MCP front starts with its shard in decimal and `-`
/// (see [`mcp_id_prefix`]); a bare one (minted before, or in cluster mode), or one whose
/// shard is not below `shards`, is in [`mcp_legacy_shard`]. A client's made-up ID only
/// chooses which core answers "no such session".
pub fn mcp_owner_shard(owner: &str, shards: u32) -> u32 {
    let o = owner.strip_prefix('m').unwrap_or(owner);
    let named = o.split_once('-').and_then(|(d, _)| {
        let digits = !d.is_empty() && d.len() <= 4 && d.bytes().all(|b| b.is_ascii_digit());
        digits.then(|| d.parse::<u32>().ok()).flatten()
    });
    named
        .filter(|s| *s < shards)
        .unwrap_or_else(|| mcp_legacy_shard(shards))
}

/// What a core of the MCP front puts before every session ID and modern boot it mints, so
/// [`mcp_owner_shard`] finds `shard` again.
pub fn mcp_id_prefix(shard: u32) -> String {
    format!("{shard}-")
}

/// The MCP shard of `core` when the MCP front runs on every core: the first shard it owns in
/// the order of the legacy shard, the next one, and so on (so the legacy shard's owner keeps
/// it, and its sessions from before). `None` for a core that owns no shard (more cores than
/// shards).
pub fn mcp_shard_of_core(core: usize, cores: usize, shards: u32) -> Option<u32> {
    let first = mcp_legacy_shard(shards);
    (0..shards)
        .map(|i| (first + i) % shards)
        .find(|s| core_of_shard(*s, cores) == core)
}

/// The core owning a shard.
pub fn core_of_shard(shard: u32, cores: usize) -> usize {
    shard as usize % cores
}

/// Where the MCP front runs, and so which core serves a request on the MCP path.
///
/// On a single node it runs on every core that owns a shard: each such core mints its
/// sessions into its own MCP shard ([`mcp_shard_of_core`]) with that shard in their IDs, and
/// serves them — POSTs, GETs, resumes, DELETEs and their upstreams. In cluster mode it stays on
/// the legacy shard's owner: the nodes of a cluster may run different `--cores`, and a session
/// is resumed on whichever node a client reaches, so its streams stay where every node's
/// MCP part looks for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McpPlace {
    pub everywhere: bool,
    pub cores: usize,
    pub shards: u32,
}

impl McpPlace {
    pub fn new(clustered: bool, cores: usize, shards: u32) -> McpPlace {
        assert!(cores > 0 && shards > 0);
        McpPlace {
            everywhere: !clustered,
            cores,
            shards,
        }
    }

    /// The shard whose log holds the sessions of core `core`'s MCP part, if it runs one.
    pub fn shard_of_core(&self, core: usize) -> Option<u32> {
        if self.everywhere {
            return mcp_shard_of_core(core, self.cores, self.shards);
        }
        let legacy = mcp_legacy_shard(self.shards);
        (core_of_shard(legacy, self.cores) == core).then_some(legacy)
    }

    /// How many cores run an MCP part: cores `0..n` on a single node; in cluster mode one,
    /// the legacy shard's owner.
    pub fn serving_cores(&self) -> usize {
        match self.everywhere {
            true => self.cores.min(self.shards as usize),
            false => 1,
        }
    }

    /// The core that serves a request on the MCP path which reached core `here`: a request
    /// with a session ID goes to its session's shard's owner; one without (an `initialize`, a
    /// modern-era request) to the core of its caller when the gateway knows who that is (so
    /// the per-caller session limit is one core's count), else it stays where it is.
    pub fn core_for(&self, here: usize, session: Option<&str>, caller: Option<&str>) -> usize {
        if !self.everywhere {
            return core_of_shard(mcp_legacy_shard(self.shards), self.cores);
        }
        let n = self.serving_cores();
        match (session, caller) {
            (Some(sid), _) => core_of_shard(mcp_owner_shard(sid, self.shards), self.cores),
            (None, Some(who)) => (stream_hash(who) % n as u64) as usize,
            (None, None) => here % n,
        }
    }
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
    fn mcp_streams_live_in_the_shard_their_owner_names() {
        let legacy = mcp_legacy_shard(8);
        assert_eq!(legacy, (stream_hash("mcp/") % 8) as u32);
        // Bare hex (sessions from before, cluster mode) and modern boots: the legacy shard.
        assert_eq!(shard_of("mcp/0123abcd/1", 8), legacy);
        assert_eq!(shard_of("mcp/0123abcd.ffee/0", 8), legacy);
        assert_eq!(shard_of("mcp/m0123abcd/7", 8), legacy);
        // Minted with a shard prefix: that shard, session or boot.
        for s in 0..8 {
            let p = mcp_id_prefix(s);
            assert_eq!(shard_of(&format!("mcp/{p}0123abcd/1"), 8), s);
            assert_eq!(shard_of(&format!("mcp/m{p}0123/3"), 8), s);
            assert_eq!(mcp_owner_shard(&format!("{p}beef.tag"), 8), s);
        }
        // A shard that does not exist, or junk before `-`: the legacy shard.
        assert_eq!(shard_of("mcp/8-0123/1", 8), legacy);
        assert_eq!(shard_of("mcp/99999-0123/1", 8), legacy);
        assert_eq!(shard_of("mcp/-0123/1", 8), legacy);
        assert_eq!(shard_of("mcp/a1-0123/1", 8), legacy);
        assert_eq!(mcp_owner_shard("", 8), legacy);
    }

    #[test]
    fn every_core_with_a_shard_gets_its_own_mcp_shard() {
        for shards in 1..=12u32 {
            for cores in 1..=6usize {
                let mine: Vec<_> = (0..cores)
                    .map(|c| mcp_shard_of_core(c, cores, shards))
                    .collect();
                for (c, s) in mine.iter().enumerate() {
                    assert_eq!(
                        s.is_some(),
                        c < shards as usize,
                        "{shards} shards, {cores} cores"
                    );
                    if let Some(s) = s {
                        assert_eq!(core_of_shard(*s, cores), c);
                    }
                }
                // The legacy shard's owner keeps the legacy shard.
                let legacy = mcp_legacy_shard(shards);
                let owner = core_of_shard(legacy, cores);
                assert_eq!(mine[owner], Some(legacy));
            }
        }
    }

    #[test]
    fn a_session_is_served_by_the_core_that_minted_it() {
        for (shards, cores) in [(8, 1), (8, 2), (8, 3), (2, 4), (1, 2), (16, 6)] {
            let place = McpPlace::new(false, cores, shards);
            assert_eq!(place.serving_cores(), cores.min(shards as usize));
            for c in 0..cores {
                let Some(shard) = place.shard_of_core(c) else {
                    assert!(c >= place.serving_cores());
                    // A core with no MCP part keeps nothing: an initialize goes elsewhere.
                    assert!(place.core_for(c, None, None) < place.serving_cores());
                    continue;
                };
                let sid = format!("{}00ff.tag", mcp_id_prefix(shard));
                for here in 0..cores {
                    assert_eq!(place.core_for(here, Some(&sid), None), c);
                    assert_eq!(place.core_for(here, Some(&sid), Some("who")), c);
                }
                assert_eq!(place.core_for(c, None, None), c);
            }
            // A caller's sessions are all minted on one core, whichever core it reaches.
            let who = place.core_for(0, None, Some("iss\0sub"));
            assert!((0..cores).all(|h| place.core_for(h, None, Some("iss\0sub")) == who));
            // Sessions from before (bare hex) stay with the legacy shard's owner.
            let legacy_owner = core_of_shard(mcp_legacy_shard(shards), cores);
            assert_eq!(place.core_for(0, Some("00ff"), None), legacy_owner);
        }
        // Cluster mode: everything on the legacy shard's owner, with bare IDs.
        let place = McpPlace::new(true, 2, 8);
        let owner = core_of_shard(mcp_legacy_shard(8), 2);
        assert_eq!(place.serving_cores(), 1);
        assert_eq!(place.shard_of_core(owner), Some(mcp_legacy_shard(8)));
        assert_eq!(place.shard_of_core(1 - owner), None);
        assert_eq!(place.core_for(1 - owner, Some("1-00"), Some("x")), owner);
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
