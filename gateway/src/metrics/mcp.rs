//! The `gateway_mcp_*` lines of `/metrics` (Prometheus text format, every family with
//! `# HELP` and `# TYPE` once): each core with an MCP part stores its figures, and the export
//! sums them over the cores.

use std::fmt::Write as _;

use super::family;

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

/// A labelled family: name (after `gateway_mcp_`), label, help, series labels.
type Labelled = (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
);

const LABELLED: [Labelled; 2] = [
    (
        "messages_dropped_total",
        "reason",
        "Upstream messages dropped, by reason.",
        &["not_jsonrpc", "no_destination"],
    ),
    (
        "resumes_total",
        "class",
        "MCP stream resumes, by class.",
        &["ok", "truncated", "rejected"],
    ),
];

/// One MCP part's figures, in the order of the families above.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpFigures {
    pub plain: [u64; 12],
    /// `messages_dropped_total` by reason, then `resumes_total` by class.
    pub dropped: [u64; 2],
    pub resumes: [u64; 3],
    /// The HTTP upstream's connections, when the upstream is HTTP.
    pub http: Option<[u64; 4]>,
}

impl McpFigures {
    /// Adds `o`'s figures to these.
    pub fn add(&mut self, o: &McpFigures) {
        let sum = |a: &mut [u64], b: &[u64]| a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        sum(&mut self.plain, &o.plain);
        sum(&mut self.dropped, &o.dropped);
        sum(&mut self.resumes, &o.resumes);
        if let Some(h) = &o.http {
            sum(self.http.get_or_insert([0; 4]), h);
        }
    }
}

/// The `gateway_mcp_*` families, summed over the cores' figures (nothing when no core has an
/// MCP part).
pub(crate) fn render<'a>(out: &mut String, cores: impl Iterator<Item = &'a McpFigures>) {
    let mut total: Option<McpFigures> = None;
    for f in cores {
        total.get_or_insert_with(McpFigures::default).add(f);
    }
    let Some(t) = total else { return };
    for ((name, kind, help), v) in PLAIN.into_iter().zip(t.plain) {
        family(out, &format!("gateway_mcp_{name}"), kind, help);
        let _ = writeln!(out, "gateway_mcp_{name} {v}");
    }
    let series: [&[u64]; 2] = [&t.dropped, &t.resumes];
    for ((name, label, help, labels), values) in LABELLED.into_iter().zip(series) {
        family(out, &format!("gateway_mcp_{name}"), "counter", help);
        for (l, v) in labels.iter().zip(values) {
            let _ = writeln!(out, "gateway_mcp_{name}{{{label}=\"{l}\"}} {v}");
        }
    }
    if let Some(values) = t.http {
        for ((name, kind, help), v) in HTTP_UPSTREAM.into_iter().zip(values) {
            let full = format!("gateway_mcp_upstream_{name}");
            family(out, &full, kind, help);
            let _ = writeln!(out, "{full} {v}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_cores_figures_are_summed_into_one_family_each() {
        let a = McpFigures {
            plain: [1; 12],
            dropped: [2, 0],
            resumes: [3, 0, 1],
            http: None,
        };
        let b = McpFigures {
            plain: [2; 12],
            dropped: [0, 5],
            resumes: [1, 1, 0],
            http: Some([1, 2, 3, 4]),
        };
        let mut out = String::new();
        render(&mut out, [&a, &b].into_iter());
        assert_eq!(
            out.matches("# TYPE gateway_mcp_sessions_open gauge")
                .count(),
            1
        );
        assert!(out.contains("\ngateway_mcp_sessions_open 3\n"));
        assert!(out.contains("gateway_mcp_messages_dropped_total{reason=\"no_destination\"} 5\n"));
        assert!(out.contains("gateway_mcp_resumes_total{class=\"ok\"} 4\n"));
        assert!(out.contains("gateway_mcp_upstream_requests_retried_total 4\n"));
        let mut none = String::new();
        render(&mut none, std::iter::empty());
        assert!(none.is_empty());
    }
}
