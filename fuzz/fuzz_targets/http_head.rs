//! Fuzz target: the gateway's request-head parser (`http::parse_head`) and router
//! (`route::route`). Properties: no panic; `Ok(None)` (incomplete) only while the buffer is
//! under `header_bytes_max`; a complete head fits the limits, is independent of the bytes
//! after it, and every proper prefix of it is incomplete (the reactor re-parses on each
//! read); a route names only a valid stream; a subscription's Last-Event-ID comes from the
//! header when there is one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sse_gateway_fuzz::http::{HeadLimits, HttpError, parse_head};
use sse_gateway_fuzz::route::{self, Route, STREAM_NAME_BYTES_MAX};
use sse_gateway_fuzz::{Input, http};

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let limits = HeadLimits {
        header_bytes_max: 16 + usize::from(inp.u16() % 2048),
        header_count_max: usize::from(inp.u8() % 40),
    };
    let buf = inp.rest();
    let r = parse_head(buf, &limits);
    match &r {
        Ok(None) => assert!(buf.len() < limits.header_bytes_max, "incomplete beyond the limit"),
        Ok(Some(h)) => {
            assert!(h.head_len <= buf.len() && h.head_len <= limits.header_bytes_max);
            assert!(h.has_content_length || h.content_length == 0);
            // Trailing bytes (a body, a pipelined request) do not change the head.
            assert_eq!(parse_head(&buf[..h.head_len], &limits), r);
            // Every proper prefix is incomplete, never an error or another head (sampled:
            // at most ~64 cuts keep an input's cost linear).
            for cut in (0..h.head_len).step_by((h.head_len / 64).max(1)) {
                assert_eq!(parse_head(&buf[..cut], &limits), Ok(None), "prefix {cut}");
            }
            let status = match route::route(h) {
                Ok(rt) => {
                    if let Some(s) = rt.stream() {
                        assert!(!s.is_empty() && s.len() <= STREAM_NAME_BYTES_MAX);
                        assert!(s.bytes().all(|b| b.is_ascii_alphanumeric() || b".-_~".contains(&b)));
                    }
                    if let Route::Subscribe { q, .. } = &rt
                        && h.last_event_id.is_some()
                    {
                        assert_eq!(q.last_event_id, h.last_event_id, "header wins");
                    }
                    200
                }
                Err(e) => e.status().0,
            };
            assert!((200..600).contains(&status));
        }
        Err(e) => {
            let (status, code, _) = e.status();
            assert!((400..600).contains(&status) && !code.is_empty());
            if matches!(e, HttpError::HeadTooLarge | HttpError::UriTooLong) {
                assert!(buf.len() >= limits.header_bytes_max);
            }
            // The error answer is a well-formed response.
            let resp = http::error_response(status, code, "x", true);
            assert!(resp.starts_with(b"HTTP/1.1 "));
        }
    }
});
