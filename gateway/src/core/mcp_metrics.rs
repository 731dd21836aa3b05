//! The `gateway_mcp_*` lines of `/metrics` (Prometheus text format, every family with
//! `# HELP` and `# TYPE`), rendered from the MCP part's counters into the core's snapshot.

use std::fmt::Write as _;

use super::mcp::Mcp;
use crate::metrics::family;

/// The unlabelled families: name (after `gateway_mcp_`), kind, help; in the order of
/// [`plain_values`].
const PLAIN: [(&str, &str, &str); 12] = [
    ("sessions_open", "gauge", "MCP sessions open."),
    ("sessions_created_total", "counter", "MCP sessions created."),
    (
        "sessions_terminated_total",
        "counter",
        "MCP sessions ended (deleted, expired, upstream gone, shutdown).",
    ),
    ("streams_open", "gauge", "MCP streams the MCP core holds."),
    (
        "sse_connections",
        "gauge",
        "Connections carrying an MCP SSE response.",
    ),
    ("upstreams", "gauge", "MCP upstreams running."),
    (
        "upstream_deaths_total",
        "counter",
        "MCP upstreams that ended while still in use.",
    ),
    (
        "messages_up_total",
        "counter",
        "Messages handed to MCP upstreams.",
    ),
    (
        "messages_down_total",
        "counter",
        "Messages MCP upstreams wrote.",
    ),
    (
        "modern_cancels_total",
        "counter",
        "MCP requests cancelled by the client.",
    ),
    (
        "records_refused_total",
        "counter",
        "MCP records the log refused (replaced by an error record, or breaking the stream).",
    ),
    (
        "streams_broken",
        "gauge",
        "MCP streams remembered as broken (their log refused a record).",
    ),
];

/// The families of the HTTP upstream's connections (after `gateway_mcp_upstream_`).
const HTTP_UPSTREAM: [(&str, &str, &str); 4] = [
    (
        "connections_opened_total",
        "counter",
        "Connections opened to the HTTP upstream.",
    ),
    (
        "connections_open",
        "gauge",
        "Connections to the HTTP upstream open now, idle or carrying a request.",
    ),
    (
        "requests_reused_total",
        "counter",
        "Upstream requests sent on a reused connection.",
    ),
    (
        "requests_retried_total",
        "counter",
        "Upstream requests retried on a fresh connection.",
    ),
];

/// A labelled family: name (after `gateway_mcp_`), label, help, series (label value, value).
type Labelled<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, u64)]);

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

/// The MCP front's metrics text.
impl Mcp {
    /// The MCP metrics text (families with `# HELP` and `# TYPE`).
    pub(super) fn render_metrics(&self) -> String {
        render(self)
    }
}

fn render(m: &Mcp) -> String {
    let mut out = String::with_capacity(4096);
    for ((name, kind, help), v) in PLAIN.into_iter().zip(plain_values(m)) {
        family(&mut out, &format!("gateway_mcp_{name}"), kind, help);
        let _ = writeln!(out, "gateway_mcp_{name} {v}");
    }
    let st = m.core.stats();
    let labelled: [Labelled<'_>; 2] = [
        (
            "messages_dropped_total",
            "reason",
            "Upstream messages dropped, by reason.",
            &[
                ("not_jsonrpc", st.upstream_garbage_lines),
                ("no_destination", st.orphan_messages),
            ],
        ),
        (
            "resumes_total",
            "class",
            "MCP stream resumes, by class.",
            &[
                ("ok", st.resumes_ok),
                ("truncated", st.resumes_truncated),
                ("rejected", st.resumes_rejected),
            ],
        ),
    ];
    for (name, label, help, series) in labelled {
        family(&mut out, &format!("gateway_mcp_{name}"), "counter", help);
        for (l, v) in series {
            let _ = writeln!(out, "gateway_mcp_{name}{{{label}=\"{l}\"}} {v}");
        }
    }
    if let Some(p) = m.ups.http_stats() {
        let values = [
            p.connections_opened,
            p.connections_open,
            p.requests_reused,
            p.requests_retried,
        ];
        for ((name, kind, help), v) in HTTP_UPSTREAM.into_iter().zip(values) {
            family(
                &mut out,
                &format!("gateway_mcp_upstream_{name}"),
                kind,
                help,
            );
            let _ = writeln!(out, "gateway_mcp_upstream_{name} {v}");
        }
    }
    out
}
