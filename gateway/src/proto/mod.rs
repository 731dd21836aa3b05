//! The protocol layer: HTTP/1.1 parsing and answers, routing, SSE framing and the sans-IO
//! connection machine. Bytes and numbers in, decisions out: no I/O, no clock of its own (time
//! is passed in), no io_uring.
#![forbid(unsafe_code)]

pub mod access;
pub mod chunked;
pub mod conn;
pub mod http;
pub mod request_log;
pub mod route;
pub mod sse;
