//! The MCP front: MCP streamable HTTP (legacy 2025-03-26..2025-11-25 with sessions and
//! durable resumption; modern 2026-07-28 stateless) in front of upstream MCP servers. This
//! module is the pure protocol core; it never touches sockets, io_uring, processes or a clock.
//! The reactor drives [`core::McpCore`] and carries out its [`core::Action`]s (log appends go
//! through the log-store, SSE responses through the gateway's send path).
//!
//! # Layout
//! - `SPEC-NOTES.md`: every MUST/SHOULD of the spec we follow, per era, and the test for each.
//! - [`jsonrpc`]: classify bodies and upstream lines (request / notification / response /
//!   batch); error bodies.
//! - [`era`]: protocol versions and eras; the version a request speaks.
//! - [`headers`]: header lookup, `Origin`/`Host` allow-list, 2026-07-28 mirror checks.
//! - [`core`]: sessions, stream routing (each message on exactly one stream), resume
//!   decisions via `log_store::resume::plan_resume`, timers (hold, idle).
//! - [`upstream`], [`http_upstream`] (drivers, threads): stdio children (`--upstream-cmd`) or
//!   streamable-HTTP clients (`--upstream-url`) behind one interface.
#![forbid(unsafe_code)]

pub mod config;
pub mod core;
pub mod era;
pub mod headers;
pub mod http_upstream;
pub mod jsonrpc;
pub mod upstream;
