//! The gateway's side of the MCP front. The protocol core and the upstream drivers live in the
//! `mcp-front` crate (pure, no io_uring, no `unsafe`); they are re-exported here so that
//! `crate::mcp::core::McpCore` and the other old paths keep working. What stays in the gateway:
//!
//! # Layout
//! - [`config`]: the `--upstream-cmd` / `--upstream-url` / `--mcp-*` clap flags.
//! - [`identity`]: who a session belongs to: HMAC-SHA256 of a token's issuer and subject,
//!   keyed by `mcp-session.key` in the data directory.
//! - `glue.rs`: the reactor driver (a child module of `reactor`, included there by `#[path]`):
//!   carries out the core's `Action`s on the MCP shard's log and send path.
//! - re-exported from `mcp_front`: [`core`], [`credential`], [`era`], [`headers`],
//!   [`http_upstream`], [`jsonrpc`], [`upstream`].
#![forbid(unsafe_code)]

pub mod config;
pub mod identity;
pub use mcp_front::{core, credential, headers, http_upstream, jsonrpc, upstream};
// No gateway code names `mcp::era` today; the path is kept so code that did (or will, in
// the glue being rewritten) still compiles. A binary crate warns on an unused re-export.
#[allow(unused_imports)]
pub use mcp_front::era;
