//! `mcp_front`: the MCP front — MCP streamable HTTP (legacy 2025-03-26..2025-11-25 with
//! sessions and durable resumption; modern 2026-07-28 stateless) in front of upstream MCP
//! servers. The protocol core is pure: it never touches sockets, io_uring, processes or a
//! clock. The gateway's reactor drives [`core::McpCore`] and carries out its
//! [`core::Action`]s (log appends go through the log-store, SSE responses through the
//! gateway's send path). The upstream drivers use blocking std threads, never io_uring.
//!
//! This crate depends on `log-store` (stream bounds, the resume planner) and never on the
//! gateway; the gateway's `mcp` module re-exports these modules under their old paths and
//! keeps only the clap flags (`mcp/config.rs`) and the reactor glue (`mcp/glue.rs`).
//!
//! # Layout
//! - `SPEC-NOTES.md`: every MUST/SHOULD of the spec we follow, per era, and the test for each.
//! - [`jsonrpc`]: classify bodies and upstream lines (request / notification / response /
//!   batch); error bodies.
//! - [`era`]: protocol versions and eras; the version a request speaks.
//! - [`headers`]: header lookup, `Origin`/`Host` allow-list, 2026-07-28 mirror checks.
//! - [`core`]: sessions, stream routing (each message on exactly one stream), resume
//!   decisions via `log_store::ResumePlan::outcome`, timers (hold, idle).
//! - [`upstream_event`]: the events and limits both upstream drivers share.
//! - [`upstream`], [`http_upstream`] (drivers, threads): stdio children (`--upstream-cmd`) or
//!   streamable-HTTP clients (`--upstream-url`, over ureq) behind one interface.
//! - [`credential`]: a client's `Authorization` value on its way to an HTTP upstream
//!   (`--mcp-forward-authorization`); never printable.
#![forbid(unsafe_code)]

pub mod core;
pub mod credential;
pub mod era;
pub mod headers;
pub mod http_upstream;
pub mod jsonrpc;
pub mod upstream;
pub mod upstream_event;
