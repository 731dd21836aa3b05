//! CLI flags of the MCP front (flattened into the gateway's `Config`): every limit with its
//! unit in the name and a default. Turning the front on takes one flag, `--upstream-cmd`.
//! No I/O here.
#![forbid(unsafe_code)]

use super::core::McpConfig;
use super::headers::OriginPolicy;
use super::http_upstream::{HttpEndpoint, HttpOptions, ProxyEnv};
use super::upstream::UpstreamLimits;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    /// Serve MCP streamable HTTP at --mcp-path in front of this stdio MCP server command (run
    /// with `sh -c`, one child per MCP session). Example: --upstream-cmd "npx -y
    /// @modelcontextprotocol/server-everything". Without it the MCP front is off.
    #[arg(long)]
    pub upstream_cmd: Option<String>,

    /// Serve MCP streamable HTTP at --mcp-path in front of this streamable-HTTP MCP server
    /// (`http://host:port/path`, or `https://` — verified against the system roots or
    /// --upstream-ca-file). One upstream HTTP session per MCP session; every message goes
    /// through the gateway's log, so the upstream needs no resumability of its own. Exclusive
    /// with --upstream-cmd.
    #[arg(long)]
    pub upstream_url: Option<String>,

    /// PEM file of the certificate authorities an https:// --upstream-url server's
    /// certificate must chain to (a bundle, or repeat the flag). When given, only these are
    /// trusted; without it, the system's root store. Needs an https:// --upstream-url.
    #[arg(long)]
    pub upstream_ca_file: Vec<PathBuf>,

    /// Idle keep-alive connections kept to the --upstream-url server for later requests, per
    /// upstream client (one per legacy session, one per core shared by 2026-07-28 clients). A request
    /// never waits for one: with none idle it opens a new connection. 0 = a new connection for
    /// every request.
    #[arg(long, default_value_t = 8)]
    pub upstream_pool_connections_max: usize,

    /// Seconds an idle pooled connection to the --upstream-url server is kept open.
    #[arg(long, default_value_t = 30)]
    pub upstream_pool_idle_secs: u64,

    /// Pass each client's `Authorization` header on to the --upstream-url server, on the
    /// upstream requests made on that client's behalf: a session's upstream requests carry the
    /// value of the session's latest request (a refreshed token replaces the old one at once);
    /// 2026-07-28 requests, which share one upstream client, each carry their own. Never sent
    /// on another client's behalf, never logged. Needs --upstream-url (refused with
    /// --upstream-cmd: a stdio server has no HTTP request to carry it).
    #[arg(long, default_value_t = false)]
    pub mcp_forward_authorization: bool,

    /// Path of the MCP endpoint.
    #[arg(long, default_value = "/mcp")]
    pub mcp_path: String,

    /// Extra allowed `Origin` (exact `scheme://host[:port]`), repeatable. Loopback origins are
    /// always allowed; any other present Origin gets 403.
    #[arg(long)]
    pub mcp_allow_origin: Vec<String>,

    /// Extra allowed `Host` name (without port), repeatable, for binding beyond loopback.
    #[arg(long)]
    pub mcp_allow_host: Vec<String>,

    /// Milliseconds in the `retry:` line of every MCP SSE response.
    #[arg(long, default_value_t = 1000)]
    pub mcp_retry_ms: u32,

    /// Close a POST's SSE connection (not its stream) if the response has not arrived within
    /// this many milliseconds; the client then polls with GET + Last-Event-ID. 0 = never.
    #[arg(long, default_value_t = 0)]
    pub mcp_post_hold_ms: u64,

    /// Seconds a session with no open connection and no traffic lives before it is ended.
    #[arg(long, default_value_t = 1800)]
    pub mcp_session_idle_secs: u64,

    /// MCP sessions (each with its own upstream child), over all cores; above it initialize
    /// gets 503 (a replay-only session recovered from the log is dropped first).
    #[arg(long, default_value_t = 256)]
    pub mcp_sessions_max: usize,

    /// Live MCP sessions of one subject (a token's issuer and `sub`); above it initialize
    /// gets 429.
    #[arg(long, default_value_t = 8)]
    pub mcp_sessions_per_subject_max: usize,

    /// Client requests awaiting a response per session (and per core, for 2026-07-28
    /// clients, which have none); above it: 429.
    #[arg(long, default_value_t = 256)]
    pub mcp_requests_inflight_max: usize,

    /// Messages in one JSON-RPC batch (protocol 2025-03-26 only).
    #[arg(long, default_value_t = 64)]
    pub mcp_batch_len_max: usize,

    /// Bytes of one MCP POST body; above it: 413.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub mcp_body_bytes_max: usize,

    /// Lines queued to an upstream's stdin (and upstream lines queued to the reactor) before
    /// the upstream counts as stuck (ended, with errors to its open requests).
    #[arg(long, default_value_t = 1024)]
    pub mcp_upstream_queue_lines_max: usize,

    /// Milliseconds between closing an upstream's stdin and SIGKILL.
    #[arg(long, default_value_t = 2000)]
    pub mcp_upstream_kill_grace_ms: u64,
}

impl McpArgs {
    /// The front is on (one of the upstream flags is given).
    pub fn enabled(&self) -> bool {
        self.upstream_cmd.is_some() || self.upstream_url.is_some()
    }

    /// The core's configuration.
    pub fn core_config(&self) -> McpConfig {
        McpConfig {
            origin_policy: OriginPolicy {
                origins: self.mcp_allow_origin.clone(),
                hosts: self.mcp_allow_host.clone(),
                allow_loopback: true,
            },
            retry_ms: self.mcp_retry_ms,
            post_hold_ms: (self.mcp_post_hold_ms > 0).then_some(self.mcp_post_hold_ms),
            session_idle_ms: self.mcp_session_idle_secs.saturating_mul(1000),
            sessions_max: self.mcp_sessions_max,
            sessions: Default::default(),
            sessions_per_subject_max: self.mcp_sessions_per_subject_max,
            requests_inflight_max: self.mcp_requests_inflight_max,
            batch_len_max: self.mcp_batch_len_max,
            forward_authorization: self.mcp_forward_authorization,
            session_id_prefix: String::new(),
        }
    }

    /// Upstream process limits; `line_bytes_max` is the gateway's `--event-bytes-max` so every
    /// accepted upstream message fits one log record.
    pub fn upstream_limits(&self, line_bytes_max: usize) -> UpstreamLimits {
        UpstreamLimits {
            line_bytes_max,
            queue_lines_max: self.mcp_upstream_queue_lines_max,
            kill_grace_ms: self.mcp_upstream_kill_grace_ms,
        }
    }

    /// The --upstream-url server (URL, trust, proxy from HTTPS_PROXY/HTTP_PROXY/NO_PROXY), if
    /// one is given; an error names what cannot work (bad URL, unreadable CA file, no system
    /// roots, an unusable proxy variable, …).
    pub fn http_endpoint(&self) -> Result<Option<Arc<HttpEndpoint>>, String> {
        let Some(url) = &self.upstream_url else {
            if let Some(f) = self.upstream_ca_file.first() {
                return Err(format!(
                    "--upstream-ca-file {} needs an https:// --upstream-url",
                    f.display()
                ));
            }
            return Ok(None);
        };
        let opts = HttpOptions {
            ca_files: self.upstream_ca_file.clone(),
            pool_connections_max: self.upstream_pool_connections_max,
            pool_idle: Duration::from_secs(self.upstream_pool_idle_secs),
            proxy_env: ProxyEnv::from_process(),
        };
        HttpEndpoint::new(url, &opts)
            .map(Some)
            .map_err(|e| format!("--upstream-url {url:?}: {e}"))
    }

    /// Flag combinations that cannot work.
    pub fn validate(&self) -> Result<(), String> {
        if !self.mcp_path.starts_with('/') || self.mcp_path.contains(['?', '#', ' ']) {
            return Err(format!(
                "--mcp-path {:?} must be an absolute path without query",
                self.mcp_path
            ));
        }
        if self.mcp_path.starts_with("/v1/")
            || self.mcp_path == "/metrics"
            || self.mcp_path == "/healthz"
        {
            return Err(format!(
                "--mcp-path {:?} collides with the gateway's own API",
                self.mcp_path
            ));
        }
        for (v, name) in [
            (self.mcp_sessions_max as u64, "--mcp-sessions-max"),
            (
                self.mcp_sessions_per_subject_max as u64,
                "--mcp-sessions-per-subject-max",
            ),
            (
                self.mcp_requests_inflight_max as u64,
                "--mcp-requests-inflight-max",
            ),
            (self.mcp_batch_len_max as u64, "--mcp-batch-len-max"),
            (self.mcp_body_bytes_max as u64, "--mcp-body-bytes-max"),
            (
                self.mcp_upstream_queue_lines_max as u64,
                "--mcp-upstream-queue-lines-max",
            ),
            (self.mcp_session_idle_secs, "--mcp-session-idle-secs"),
            (self.upstream_pool_idle_secs, "--upstream-pool-idle-secs"),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if self
            .upstream_cmd
            .as_deref()
            .is_some_and(|c| c.trim().is_empty())
        {
            return Err("--upstream-cmd is empty".into());
        }
        if self.mcp_forward_authorization && self.upstream_url.is_none() {
            return Err(if self.upstream_cmd.is_some() {
                "--mcp-forward-authorization needs --upstream-url: a stdio upstream \
                 (--upstream-cmd) has no HTTP request to carry the Authorization header"
            } else {
                "--mcp-forward-authorization needs --upstream-url (there is no upstream to \
                 forward to)"
            }
            .into());
        }
        if self.upstream_url.is_some() && self.upstream_cmd.is_some() {
            return Err("--upstream-cmd and --upstream-url are exclusive".into());
        }
        self.http_endpoint().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::McpArgs;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mcp: McpArgs,
    }

    fn parse(args: &[&str]) -> McpArgs {
        Cli::try_parse_from(std::iter::once("gateway").chain(args.iter().copied()))
            .unwrap()
            .mcp
    }

    #[test]
    fn forward_authorization_is_off_by_default_and_needs_an_http_upstream() {
        let off = parse(&["--upstream-url", "http://127.0.0.1:9/mcp"]);
        assert!(!off.core_config().forward_authorization);
        let on = parse(&[
            "--upstream-url",
            "http://127.0.0.1:9/mcp",
            "--mcp-forward-authorization",
        ]);
        assert_eq!(on.validate(), Ok(()));
        assert!(on.core_config().forward_authorization);
        for args in [
            &["--upstream-cmd", "cat", "--mcp-forward-authorization"][..],
            &["--mcp-forward-authorization"][..],
        ] {
            let e = parse(args).validate().unwrap_err();
            assert!(e.contains("needs --upstream-url"), "{args:?}: {e}");
        }
    }

    #[test]
    fn https_upstream_flags() {
        let on = parse(&["--upstream-url", "https://127.0.0.1:9/mcp"]);
        assert_eq!(on.upstream_pool_connections_max, 8);
        assert_eq!(on.upstream_pool_idle_secs, 30);
        for (args, want) in [
            (
                &[
                    "--upstream-url",
                    "http://127.0.0.1:9/mcp",
                    "--upstream-ca-file",
                    "/x.pem",
                ][..],
                "needs an https://",
            ),
            (&["--upstream-ca-file", "/x.pem"][..], "needs an https://"),
            (
                &[
                    "--upstream-url",
                    "https://127.0.0.1:9/",
                    "--upstream-ca-file",
                    "/x.pem",
                ][..],
                "/x.pem",
            ),
            (
                &[
                    "--upstream-url",
                    "http://127.0.0.1:9/",
                    "--upstream-pool-idle-secs",
                    "0",
                ][..],
                "--upstream-pool-idle-secs must be at least 1",
            ),
        ] {
            let e = parse(args).validate().unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}
