//! The `bench` library: load generation and invariant checking for SSE pub/sub servers (the
//! gateway, and nginx + nchan for comparison), used by the `bench` binary and its tests.
//!
//! # Layout
//! - Pure cores (no sockets, no clock): [`sse`] (streaming SSE parser), [`chunked`] (chunked
//!   transfer decoding), [`payload`] (counter + timestamp payloads), [`checker`] (per-subscriber
//!   gap/duplicate/reorder checker), [`target`] (URL templates, ID styles), [`procstat`]
//!   parsing, [`report`] (table and JSON), [`scrape`] (Prometheus text sums),
//!   [`resume_class`] (the server's `X-Resume-Class` answer, per-class resume latency),
//!   [`tail`] (the last bytes of a connection, for protocol-error reports), [`progress`]
//!   (the progress lines of long runs, time passed in), [`meta`] (the `meta` object of JSON
//!   reports: commit, argv, CPUs, kernel, load average).
//! - Thin drivers: [`load`] (one mio/epoll loop for publishers and subscribers, in the clear or
//!   over TLS through [`tls::Conn`]), [`probe`]
//!   (a blocking too-old-ID probe) and [`mcp`] (MCP sessions with cut-and-resume tool calls).
//!
//! Invariant: bench talks to the server only over the wire (and reads its `/proc` figures);
//! it links nothing of the gateway. There is no `unsafe` code in this crate.
#![forbid(unsafe_code)]

pub mod checker;
pub mod chunked;
pub mod durable;
pub mod floor;
pub mod load;
pub mod mcp;
pub mod meta;
pub mod payload;
pub mod probe;
pub mod procstat;
pub mod progress;
pub mod report;
pub mod resume_class;
pub mod scrape;
pub mod sse;
pub mod tail;
pub mod target;
pub mod tls;
