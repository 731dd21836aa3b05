//! Fuzz target: the gateway's chunked request-body decoder (`chunked::Decoder`). Properties:
//! no panic; the verdict (body and the bytes after it, an error, or incomplete) is the same
//! however the input is cut into receives (the reactor decodes as bytes arrive); the buffer
//! after an incomplete call holds the body so far plus at most one line of framing; a
//! decoded body is within `body_bytes_max`, and encoding it again as one chunk decodes back
//! to the same body and the same bytes after it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sse_gateway_fuzz::Input;
use sse_gateway_fuzz::chunked::{ChunkError, ChunkLimits, Decoder, Progress};

type Verdict = Result<Option<(Vec<u8>, Vec<u8>)>, ChunkError>;

/// Decodes `input` delivered in pieces ending at `cuts` (sorted, then the end).
fn decode(input: &[u8], cuts: &[usize], lim: &ChunkLimits) -> Verdict {
    let mut d = Decoder::new();
    let mut buf = Vec::new();
    let mut at = 0;
    for end in cuts.iter().copied().chain([input.len()]) {
        if end < at {
            continue;
        }
        buf.extend_from_slice(&input[at..end]);
        at = end;
        match d.decode(&mut buf, lim)? {
            Progress::More { len } => {
                assert!(len <= buf.len() && d.body_len() <= len);
                assert!(len - d.body_len() <= lim.line_bytes_max + 1, "one line at most");
                buf.truncate(len);
            }
            Progress::Done { body, rest } => {
                assert!(body + rest <= buf.len());
                let mut after = buf[body..body + rest].to_vec();
                after.extend_from_slice(&input[at..]);
                return Ok(Some((buf[..body].to_vec(), after)));
            }
        }
    }
    Ok(None)
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let lim = ChunkLimits {
        body_bytes_max: usize::from(inp.u16() % 4096),
        line_bytes_max: 2 + usize::from(inp.u8()),
    };
    let mut cuts: Vec<usize> = (0..inp.u8() % 8).map(|_| usize::from(inp.u16())).collect();
    let input = inp.rest();
    cuts.iter_mut().for_each(|c| *c = (*c).min(input.len()));
    cuts.sort_unstable();
    let whole = decode(input, &[], &lim);
    assert_eq!(decode(input, &cuts, &lim), whole, "cuts {cuts:?}");
    if let Ok(Some((body, after))) = whole {
        assert!(body.len() <= lim.body_bytes_max);
        let mut again = Vec::new();
        if !body.is_empty() {
            again.extend(format!("{:x}\r\n", body.len()).as_bytes());
            again.extend(&body);
            again.extend(b"\r\n");
        }
        again.extend(b"0\r\n\r\n");
        again.extend(&after);
        let lim = ChunkLimits { line_bytes_max: lim.line_bytes_max.max(20), ..lim };
        assert_eq!(decode(&again, &[], &lim), Ok(Some((body, after))));
    }
});
