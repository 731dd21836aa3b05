//! Fuzz target: the gateway's batch publish body parser (`route::parse_batch`). Properties:
//! no panic; an accepted batch is non-empty, every event's data is within `event_bytes_max`
//! and no event type has CR/LF (so the log's append cannot refuse it half-way); re-encoding
//! an accepted batch as NDJSON and as a JSON array parses back to the same events.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sse_gateway_fuzz::Input;
use sse_gateway_fuzz::route::{BatchError, parse_batch};

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let event_bytes_max = usize::from(inp.u8()) * 4;
    let body = inp.rest();
    match parse_batch(body, event_bytes_max) {
        Ok(events) => {
            assert!(!events.is_empty());
            let mut nd = String::new();
            let mut arr = Vec::new();
            for e in &events {
                assert!(e.data.len() <= event_bytes_max);
                if let Some(t) = &e.event {
                    assert!(!t.contains(['\r', '\n']));
                }
                let v = serde_json::json!({ "event": e.event, "data": e.data });
                nd.push_str(&v.to_string());
                nd.push('\n');
                arr.push(v);
            }
            assert_eq!(parse_batch(nd.as_bytes(), event_bytes_max).as_ref(), Ok(&events));
            let arr = serde_json::Value::Array(arr).to_string();
            assert_eq!(parse_batch(arr.as_bytes(), event_bytes_max), Ok(events));
        }
        Err(e) => {
            let (status, code, msg) = e.status();
            assert!(status == 400 || status == 413, "{e:?}");
            assert!(!code.is_empty() && !msg.is_empty());
            if let BatchError::EventTooLarge { .. } = e {
                assert_eq!(status, 413);
            }
        }
    }
});
