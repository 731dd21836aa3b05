//! What one seed draws for the whole node, and the gateway's flags and log options for it.

use clap::Parser as _;
use log_store::{Epoch, FsyncPolicy, LogOptions};

use super::ring::KernelFaults;
use super::{SEGMENT_BYTES, tls};
use crate::disk::DiskFaults;
use crate::rng::Rng;

/// What one seed draws.
#[derive(Debug, Clone)]
pub(super) struct WholeConfig {
    /// Cores, each with its shard (a request for another core's stream is handed over).
    pub(super) cores: usize,
    pub(super) streams: usize,
    pub(super) publishers: usize,
    pub(super) subscribers: usize,
    pub(super) steps: u64,
    pub(super) page_bytes: usize,
    pub(super) sndbuf: i32,
    pub(super) send_bytes_max: usize,
    pub(super) kernel: KernelFaults,
    pub(super) disk: DiskFaults,
    pub(super) crash_per_mille: u32,
    pub(super) cut_per_mille: u32,
    pub(super) odd_id_per_mille: u32,
    pub(super) batch_per_mille: u32,
    /// Payloads are padded up to this many bytes (large ones roll segments often).
    pub(super) pad_bytes_max: u64,
    /// Retention by bytes (`--retain-bytes`), in segments: floors move, old resumes get 410.
    pub(super) retain_segments: Option<u64>,
    /// Every connection over TLS.
    pub(super) tls: bool,
    /// `--fsync-scope filesystem`: a round of group commits naming this many files or more is
    /// one `syncfs` (1: every round; 2: as the gateway does). `None`: `fdatasync` per file.
    pub(super) syncfs_files_min: Option<usize>,
    /// `--group-commit-hold-us-max`: 0 (never held), the default, or long enough that a hold
    /// lasts as long as the commit it follows (a slow one: up to 40 steps).
    pub(super) commit_hold_us: u64,
}

impl WholeConfig {
    pub(super) fn draw(rng: &mut Rng) -> WholeConfig {
        let faulty = rng.chance(700);
        let f = |rng: &mut Rng, hi: u64| if faulty { rng.range(0, hi) as u32 } else { 0 };
        WholeConfig {
            cores: rng.range(1, 2) as usize,
            streams: rng.range(1, 3) as usize,
            publishers: rng.range(1, 3) as usize,
            subscribers: rng.range(1, 4) as usize,
            steps: rng.range(400, 1200),
            page_bytes: if rng.chance(500) { 4096 } else { 512 },
            sndbuf: rng.range(2, 32) as i32 * 1024,
            send_bytes_max: rng.range(1, 16) as usize * 1024,
            kernel: KernelFaults {
                defer_per_mille: f(rng, 400),
                partial_per_mille: f(rng, 500),
                fsync_eio_per_mille: f(rng, 15),
                fsync_slow_per_mille: f(rng, 200),
            },
            disk: DiskFaults {
                flush_eio_per_mille: f(rng, 20),
                enospc_per_mille: f(rng, 200),
            },
            crash_per_mille: rng.range(0, 6) as u32,
            cut_per_mille: rng.range(0, 30) as u32,
            odd_id_per_mille: rng.range(0, 200) as u32,
            batch_per_mille: rng.range(0, 500) as u32,
            pad_bytes_max: if rng.chance(400) { 3000 } else { 200 },
            retain_segments: rng.chance(400).then(|| rng.range(2, 4)),
            tls: rng.chance(300),
            syncfs_files_min: rng.chance(400).then(|| rng.range(1, 2) as usize),
            commit_hold_us: [0, 1_000, 60_000][rng.range(0, 2) as usize],
        }
    }
}

/// The gateway's flags for a seed: its data directory, cores, send window, TLS files.
pub(super) fn gateway_config(
    cfg: &WholeConfig,
    dir: &std::path::Path,
    tls: Option<&tls::TlsSetup>,
    mcp: bool,
) -> Result<gateway::config::Config, String> {
    let dir = dir.display().to_string();
    let send = cfg.send_bytes_max.to_string();
    let cores = cfg.cores.to_string();
    let mut gw = gateway::config::Config::try_parse_from([
        "gateway",
        "--insecure-no-auth",
        "--data-dir",
        &dir,
        "--cores",
        &cores,
        "--fsync",
        "group",
        "--send-bytes-max",
        &send,
        "--keepalive-secs",
        "1",
    ])
    .map_err(|e| format!("gateway flags: {e}"))?;
    gw.group_commit_hold_us_max = cfg.commit_hold_us;
    if let Some(t) = tls {
        gw.tls_cert_file = Some(t.cert_file.clone());
        gw.tls_key_file = Some(t.key_file.clone());
    }
    if mcp {
        // Its upstreams are the simulator's (`CoreSetup::mcp_outside`): nothing is run.
        gw.mcp.upstream_cmd = Some("simulated".to_owned());
    }
    Ok(gw)
}

/// The log's options for a seed (each shard's epoch is set when it is opened).
pub(super) fn log_options(cfg: &WholeConfig, seed: u64) -> LogOptions {
    LogOptions {
        segment_bytes: SEGMENT_BYTES,
        record_bytes_max: 16 * 1024,
        retain_bytes: cfg.retain_segments.map(|n| n * SEGMENT_BYTES),
        retain_secs: None,
        fsync: FsyncPolicy::Group,
        epoch_on_create: Some(Epoch(seed | 1 << 63)),
    }
}
