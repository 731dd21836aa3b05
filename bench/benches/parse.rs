//! Micro-benchmark of the bench's per-event receive path: SSE parsing of a byte stream in
//! socket-sized reads, payload decoding and the gap/duplicate checker — what one delivered
//! event costs the load generator, without sockets. `cargo bench -p bench`.

use bench::checker::Checker;
use bench::chunked::Dechunker;
use bench::payload::{parse_payload, write_payload};
use bench::sse::SseParser;
use bench::target::gateway_seq;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const EVENTS: u64 = 4096;

fn stream(payload_bytes: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut p = Vec::new();
    for i in 0..EVENTS {
        p.clear();
        write_payload(&mut p, i, i * 1000, payload_bytes);
        out.extend_from_slice(format!("id: 00000000000000aa-0-{}\ndata: ", i + 1).as_bytes());
        out.extend_from_slice(&p);
        out.extend_from_slice(b"\n\n");
    }
    out
}

fn chunked(body: &[u8], chunk: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for c in body.chunks(chunk) {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn receive(c: &mut Criterion) {
    let body = stream(256);
    let chunked_body = chunked(&body, 1000);
    let mut g = c.benchmark_group("receive_256B_events");
    g.throughput(Throughput::Elements(EVENTS));
    g.bench_function("sse+payload+checker, 64 KiB reads", |b| {
        b.iter(|| {
            let mut p = SseParser::new();
            let mut ck = Checker::new(0);
            for read in body.chunks(64 * 1024) {
                p.feed(read, &mut |e| {
                    let (counter, _) = parse_payload(e.data_prefix).unwrap();
                    ck.handle_event(counter, gateway_seq(e.id).ok());
                });
            }
            assert_eq!(ck.counts().events, EVENTS);
        })
    });
    g.bench_function("same through a chunked body, 1500 B reads", |b| {
        b.iter(|| {
            let mut p = SseParser::new();
            let mut d = Dechunker::new();
            let mut ck = Checker::new(0);
            for read in chunked_body.chunks(1500) {
                let mut rest = read;
                while !rest.is_empty() {
                    let used = d
                        .feed(rest, &mut |data| {
                            p.feed(data, &mut |e| {
                                let (counter, _) = parse_payload(e.data_prefix).unwrap();
                                ck.handle_event(counter, gateway_seq(e.id).ok());
                            })
                        })
                        .unwrap();
                    rest = &rest[used..];
                }
            }
            assert_eq!(ck.counts().events, EVENTS);
        })
    });
    g.finish();
}

criterion_group!(benches, receive);
criterion_main!(benches);
