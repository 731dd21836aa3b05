//! Request framing over loopback: chunked publishes and batches are accepted and decoded,
//! pipelined requests after a chunked body parse as their own, and every framing two HTTP
//! parsers could read differently (request smuggling) is refused with 400 and a close:
//! `Content-Length` with `Transfer-Encoding`, a repeated `Transfer-Encoding`, a coding other
//! than `chunked`, obs-fold, chunk sizes beyond 64 bits, bare LF line ends. A chunked body
//! without its final chunk is never taken as complete: it gets 408 at the body deadline.

mod common;

use std::io::{BufReader, Read, Write};

use common::{Gateway, Sse, connect, json, read_response};

/// Sends `bytes` on a fresh connection; reads one answer and then to the end: its status,
/// JSON body and whether the gateway closed the connection after it (no more bytes, EOF).
fn exchange(g: &Gateway, bytes: &[u8]) -> (u16, serde_json::Value, bool) {
    let mut s = connect(g.addr);
    s.write_all(bytes).unwrap();
    let mut r = BufReader::new(s);
    let (st, _, body) = read_response(&mut r);
    let mut rest = Vec::new();
    // Bounded by the read timeout: a connection left open times out instead of reaching EOF.
    let closed = r.read_to_end(&mut rest).is_ok() && rest.is_empty();
    (st, json(&body), closed)
}

const CHUNKED: &str = "Transfer-Encoding: chunked\r\n";
/// For requests that succeed: the connection then closes after the answer.
const CHUNKED_CLOSE: &str = "Transfer-Encoding: chunked\r\nConnection: close\r\n";

/// A POST with `fields`; no `Connection: close` unless in `fields` (a refused request must
/// close the connection on its own).
fn post(path: &str, fields: &str, body: &str) -> Vec<u8> {
    format!("POST {path} HTTP/1.1\r\nHost: t\r\n{fields}\r\n{body}").into_bytes()
}

#[test]
fn chunked_publishes_and_batches_are_stored() {
    let g = Gateway::start(&["--cores", "1"]);
    // Extensions are ignored, trailers read and discarded.
    let body = "6;name=\"a;b\"\r\nhello \r\n5\r\nworld\r\n0\r\nX-Checksum: 1\r\n\r\n";
    let (st, b, _) = exchange(&g, &post("/v1/streams/c/events", CHUNKED_CLOSE, body));
    assert_eq!(st, 201, "{b}");
    let batch = "{\"data\":\"one\"}\n{\"da";
    let tail = "ta\":\"two\"}\n";
    let body = format!(
        "{:x}\r\n{batch}\r\n{:x}\r\n{tail}\r\n0\r\n\r\n",
        batch.len(),
        tail.len()
    );
    let (st, b, _) = exchange(
        &g,
        &post("/v1/streams/c/events:batch", CHUNKED_CLOSE, &body),
    );
    assert_eq!(st, 201, "{b}");
    let mut sse = Sse::open(g.addr, "/v1/streams/c?from=earliest", None);
    assert_eq!(sse.status, 200);
    let datas: Vec<String> = (0..3)
        .map(|_| sse.next_event().expect("an event").data)
        .collect();
    assert_eq!(datas, ["hello world", "one", "two"]);
}

/// Pipelined after a chunked body (in one write): each request is read as its own, in order.
#[test]
fn requests_pipelined_after_a_chunked_body_parse_on_their_own() {
    let g = Gateway::start(&["--cores", "1"]);
    let mut bytes = Vec::new();
    let head =
        "POST /v1/streams/p/events HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    bytes.extend(format!("{head}1\r\na\r\n0\r\n\r\n").as_bytes());
    // A body that looks like a request: it is data, never a request of its own.
    let smuggled = "GET /v1/streams/x HTTP/1.1\r\n\r\n";
    bytes.extend(format!("{head}{:x}\r\n{smuggled}\r\n0\r\n\r\n", smuggled.len()).as_bytes());
    bytes.extend(b"POST /v1/streams/p/events HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nc");
    bytes.extend(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let mut s = connect(g.addr);
    s.write_all(&bytes).unwrap();
    let mut r = BufReader::new(s);
    let statuses: Vec<u16> = (0..4).map(|_| read_response(&mut r).0).collect();
    assert_eq!(statuses, [201, 201, 201, 200]);
    let mut sse = Sse::open(g.addr, "/v1/streams/p?from=earliest", None);
    let datas: Vec<String> = (0..3)
        .map(|_| sse.next_event().expect("an event").data)
        .collect();
    // (SSE carries the data's line breaks as `\n`.)
    assert_eq!(datas, ["a", &smuggled.replace("\r\n", "\n"), "c"]);
}

#[test]
fn ambiguous_framing_is_refused_and_the_connection_closes() {
    let g = Gateway::start(&["--cores", "1"]);
    let chunk = "1\r\na\r\n0\r\n\r\n";
    let cases = [
        (
            "Content-Length: 13\r\nTransfer-Encoding: chunked\r\n",
            "bad_transfer_encoding",
        ),
        (
            "Transfer-Encoding: chunked\r\nContent-Length: 13\r\n",
            "bad_transfer_encoding",
        ),
        (
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            "bad_transfer_encoding",
        ),
        (
            "Transfer-Encoding: gzip, chunked\r\n",
            "bad_transfer_encoding",
        ),
        (
            "Transfer-Encoding: chunked, identity\r\n",
            "bad_transfer_encoding",
        ),
        ("Transfer-Encoding: x-custom\r\n", "bad_transfer_encoding"),
        ("Transfer-Encoding:\r\n chunked\r\n", "malformed_request"),
        (
            "X-Pad: a\r\n\tTransfer-Encoding: chunked\r\n",
            "malformed_request",
        ),
    ];
    for (fields, code) in cases {
        let (st, b, closed) = exchange(&g, &post("/v1/streams/s/events", fields, chunk));
        assert_eq!((st, b["error"].as_str()), (400, Some(code)), "{fields:?}");
        assert!(closed, "{fields:?}: the connection closes");
    }
    let old = b"POST /v1/streams/s/events HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n";
    let (st, b, closed) = exchange(&g, old);
    assert_eq!(
        (st, b["error"].as_str(), closed),
        (400, Some("bad_transfer_encoding"), true)
    );
    // Nothing was stored: the first event stored on the stream is its first.
    let id = common::publish(g.addr, "s", "after");
    assert_eq!(
        common::seq_of(&id),
        1,
        "no refused request appended anything"
    );
}

#[test]
fn malformed_chunks_are_refused_and_the_connection_closes() {
    let g = Gateway::start(&["--cores", "1", "--event-bytes-max", "1024"]);
    let cases = [
        // 2^64: one hex digit too many.
        (
            "10000000000000000\r\na\r\n0\r\n\r\n",
            400,
            "bad_chunked_body",
        ),
        // Fits in 64 bits, not in --event-bytes-max.
        ("ffffffffffffffff\r\na\r\n0\r\n\r\n", 413, "body_too_large"),
        ("401\r\n", 413, "body_too_large"),
        ("1\na\r\n0\r\n\r\n", 400, "bad_chunked_body"),
        ("-1\r\na\r\n0\r\n\r\n", 400, "bad_chunked_body"),
        ("0x1\r\na\r\n0\r\n\r\n", 400, "bad_chunked_body"),
        ("1\r\nab\r\n0\r\n\r\n", 400, "bad_chunked_body"),
        (
            "1\r\na\r\n0\r\n folded: trailer\r\n\r\n",
            400,
            "bad_chunked_body",
        ),
    ];
    for (body, status, code) in cases {
        let (st, b, closed) = exchange(&g, &post("/v1/streams/m/events", CHUNKED, body));
        assert_eq!((st, b["error"].as_str()), (status, Some(code)), "{body:?}");
        assert!(closed, "{body:?}: the connection closes");
    }
    // Trailers beyond the head limit (--header-bytes-max, 8 KiB).
    let big = format!("1\r\na\r\n0\r\nX-Big: {}\r\n\r\n", "b".repeat(9000));
    let (st, b, closed) = exchange(&g, &post("/v1/streams/m/events", CHUNKED, &big));
    assert_eq!(
        (st, b["error"].as_str(), closed),
        (431, Some("headers_too_large"), true)
    );
}

/// The last chunk never comes: the body is not complete, whatever else arrived; it gets 408
/// at `--body-timeout-secs` and the connection closes.
#[test]
fn a_chunked_body_without_its_final_chunk_times_out() {
    let g = Gateway::start(&["--cores", "1", "--body-timeout-secs", "1"]);
    let body = "5\r\nhello\r\n";
    let (st, b, closed) = exchange(&g, &post("/v1/streams/f/events", CHUNKED, body));
    assert_eq!(
        (st, b["error"].as_str(), closed),
        (408, Some("request_timeout"), true)
    );
    assert_eq!(
        g.metric("gateway_request_timeouts_total", "phase=\"body\""),
        1
    );
}

/// A chunked publish for a stream of another core, read in pieces (the head, then part of a
/// chunk), with a publish of the accepting core and a `/healthz` pipelined behind it: the
/// connection moves with the raw bytes before any is decoded, the owner decodes the body as
/// the rest arrives, and every answer comes back in order.
#[test]
fn a_chunked_publish_handed_to_its_owner_core_in_pieces() {
    let g = Gateway::start(&["--cores", "2", "--listen-cores-max", "1"]);
    let remote = common::stream_on_core(1, "remote");
    let local = common::stream_on_core(0, "local");
    let head = format!("POST /v1/streams/{remote}/events HTTP/1.1\r\nHost: t\r\n{CHUNKED}\r\n");
    let tail = format!(
        "lo\r\n0\r\n\r\nPOST /v1/streams/{local}/events HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nlocalGET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    );
    let mut s = connect(g.addr);
    s.set_nodelay(true).unwrap();
    for piece in [head.as_str(), "5\r\nhel", tail.as_str()] {
        s.write_all(piece.as_bytes()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30)); // separate receives
    }
    let mut r = BufReader::new(s);
    let statuses: Vec<u16> = (0..3).map(|_| read_response(&mut r).0).collect();
    assert_eq!(statuses, [201, 201, 200]);
    let mut sse = Sse::open(g.addr, &format!("/v1/streams/{remote}?from=earliest"), None);
    assert_eq!(sse.next_event().expect("the event").data, "hello");
    assert!(g.metric("gateway_handoffs_total", "direction=\"in\"") >= 1);
}
