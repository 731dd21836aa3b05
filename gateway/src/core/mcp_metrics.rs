//! The MCP part's figures for the `gateway_mcp_*` lines of `/metrics` (rendered, summed over
//! the cores, by `metrics::mcp`).

use super::mcp::Mcp;
use crate::metrics::mcp::McpFigures;

/// The figures of MCP part `m` now.
pub(super) fn figures(m: &Mcp) -> McpFigures {
    let st = m.core.stats();
    McpFigures {
        plain: plain_values(m),
        dropped: [st.upstream_garbage_lines, st.orphan_messages],
        resumes: [st.resumes_ok, st.resumes_truncated, st.resumes_rejected],
        http: m.ups.http_stats().map(|p| {
            [
                p.connections_opened,
                p.connections_open,
                p.requests_reused,
                p.requests_retried,
            ]
        }),
    }
}

fn plain_values(m: &Mcp) -> [u64; 12] {
    let st = m.core.stats();
    [
        m.core.sessions_live() as u64,
        st.sessions_minted,
        st.sessions_terminated,
        m.core.streams_live() as u64,
        m.core.connections_live() as u64,
        m.ups.children() as u64,
        st.upstream_deaths,
        m.messages_up,
        st.upstream_lines,
        st.modern_cancels,
        m.records_refused,
        m.broken.len() as u64,
    ]
}
