//! `gateway_mcp_upstream_call_seconds`: how long the upstream takes to answer a JSON-RPC
//! request, from its POST stream's creation (the request handed on) to the stream's
//! completion (the response stored). Bounded: past [`CALLS_TRACKED_MAX`] open calls new ones
//! are not timed.

use std::collections::HashMap;
use std::time::Instant;

use crate::mcp::core::parse_stream_name;
use crate::metrics::CoreMetrics;

/// Open calls timed at once (a call whose stream never completes is dropped when it breaks).
const CALLS_TRACKED_MAX: usize = 65_536;

/// The open calls' start times, by stream.
#[derive(Debug, Default)]
pub(super) struct Calls {
    started: HashMap<String, Instant>,
}

impl Calls {
    /// A stream was created: a request's stream starts a call. That is every stream of the
    /// modern era (`mcp/m<boot>/<n>`, one per request; session IDs are hex, never `m…`) and
    /// a session's POST streams (`mcp/<session>/<n>`, `n` > 0; its GET stream `0` is no call).
    pub(super) fn created(&mut self, stream: &str, now: Instant) {
        let post =
            parse_stream_name(stream).is_some_and(|(owner, n)| n > 0 || owner.starts_with('m'));
        if post && self.started.len() < CALLS_TRACKED_MAX {
            self.started.insert(stream.to_owned(), now);
        }
    }

    /// A stream completed: its call, if timed, is observed.
    pub(super) fn completed(&mut self, stream: &str, now: Instant, m: &CoreMetrics) {
        if let Some(t) = self.started.remove(stream) {
            m.mcp_upstream_call
                .observe(now.saturating_duration_since(t));
        }
    }

    /// A stream broke or went away: its call is not timed.
    pub(super) fn dropped(&mut self, stream: &str) {
        self.started.remove(stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn post_streams_are_timed_from_creation_to_completion() {
        let (m, mut c, t) = (CoreMetrics::default(), Calls::default(), Instant::now());
        c.created("mcp/abc/0", t); // a session's GET stream: no call
        c.created("mcp/m0123/0", t); // the modern era's first request: a call
        c.dropped("mcp/m0123/0");
        c.created("mcp/abc/1", t);
        c.created("mcp/abc/2", t);
        c.dropped("mcp/abc/2");
        c.completed("mcp/abc/0", t, &m);
        c.completed("mcp/abc/2", t + Duration::from_millis(5), &m);
        c.completed("mcp/abc/1", t + Duration::from_millis(3), &m);
        let text = crate::metrics::render(std::slice::from_ref(&m));
        assert!(
            text.contains("gateway_mcp_upstream_call_seconds_count 1\n"),
            "{text}"
        );
        assert!(text.contains("gateway_mcp_upstream_call_seconds_sum 0.003\n"));
        assert!(c.started.is_empty());
    }
}
