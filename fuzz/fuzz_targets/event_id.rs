//! Fuzz target: `log_store::EventId` parse/format. Two properties: (1) any string that parses
//! re-formats to exactly itself (the parser accepts only the canonical form) and its
//! `encoded_len` is its length; (2) any (epoch, stream, seq) formats to a string that parses
//! back to the same value. Parsing never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use log_store::{Epoch, EventId, StreamId};
use sse_gateway_fuzz::Input;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(id) = s.parse::<EventId>()
    {
        assert_eq!(id.to_string(), s, "accepted a non-canonical id");
        assert_eq!(id.encoded_len(), s.len());
    }
    let mut inp = Input::new(data);
    let id = EventId {
        epoch: Epoch(inp.u64()),
        stream: StreamId(inp.u32()),
        seq: inp.u64(),
    };
    let s = id.to_string();
    assert_eq!(s.len(), id.encoded_len());
    assert_eq!(s.parse::<EventId>(), Ok(id), "round trip of {s}");
});
