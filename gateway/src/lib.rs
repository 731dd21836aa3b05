//! The gateway's parts as a library: the `gateway` binary (`main.rs`) wires them to the real
//! io_uring driver, sockets and signals; the simulator (`sim/`) drives the same parts over
//! simulated time, I/O and faults.
//!
//! # Layout
//! - `config`: CLI flags (clap) and their validation.
//! - `probe`: the io_uring feature probe.
//! - `proto`: HTTP/1.1 parsing, routing, SSE framing and the sans-IO connection machine.
//! - `streams`: pub/sub with no I/O: logs by shard, subscribers and their send windows,
//!   parked windows, publishing, where a subscription or resume starts.
//! - `uring`: the io_uring driver (ring, op table, the memory of every operation in flight).
//! - `core`: the per-core loop that dispatches completions and carries out decisions.
//! - `mcp`: the MCP front's flags, over the `mcp-front` crate.
//! - `shards`: stream → shard → core ownership and the persisted shard count.
//! - `jwks`: the JWKS fetcher thread (`--jwt-jwks-url`) and when it fetches.
//! - `metrics`: per-core counters and the Prometheus rendering.
//! - `sync_scope`: `--fsync-scope`, one `syncfs` per round of group commits or not.
//! - `sys`: the few direct syscalls.

pub mod access_log;
pub mod admin;
pub mod clustering;
pub mod config;
pub mod config_file;
pub mod core;
pub mod jwks;
pub mod logging;
pub mod mcp;
pub mod metrics;
pub mod notify;
pub mod probe;
pub mod proto;
pub mod shards;
pub mod streams;
pub mod sync_scope;
pub mod sys;
pub mod tls;
pub mod uring;

/// The version and the commit the binary was built from (`build.rs`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = env!("GATEWAY_COMMIT");
/// `--version`: the version, the commit and what this build can serve.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GATEWAY_COMMIT"),
    "; io_uring, TLS (rustls; kernel TLS when the kernel has it), JWT, MCP front, NATS JetStream cluster)"
);
