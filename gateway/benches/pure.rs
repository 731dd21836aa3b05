//! Criterion micro-benchmarks of the gateway's pure cores (no sockets): request-head parsing
//! and one subscriber-window cycle (queue a batch of events, build the iovec list, account a
//! send completion and the ACK). The whole-system figures come from `bench` (BENCHMARKS.md).
#![forbid(unsafe_code)]
#![allow(dead_code, missing_debug_implementations)]

#[path = "../src/proto/http.rs"]
mod http;
#[path = "../src/streams/window.rs"]
mod window;

use std::hint::black_box;
use std::rc::Rc;

use criterion::{Criterion, criterion_group, criterion_main};

#[derive(Clone)]
struct Bytes(Rc<[u8]>);

impl window::Chunk for Bytes {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

fn parse(c: &mut Criterion) {
    let req = b"POST /v1/streams/orders/events HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: bench\r\nContent-Length: 256\r\nEvent-Type: order\r\n\r\n";
    let limits = http::HeadLimits {
        header_bytes_max: 8192,
        header_count_max: 64,
    };
    c.bench_function("parse_head publish", |b| {
        b.iter(|| http::parse_head(black_box(req), &limits).unwrap().unwrap())
    });
}

fn window_cycle(c: &mut Criterion) {
    // 64 framed events of ~300 bytes coalesced in one slice, as the log returns them.
    let lens = vec![300u32; 64];
    let chunk = Bytes(vec![b'x'; 300 * 64].into());
    c.bench_function("window 64 events: push, iovecs, sent, acked", |b| {
        b.iter(|| {
            let mut w: window::Window<Bytes> = window::Window::new();
            w.push_events(1, vec![chunk.clone()], &lens);
            let mut iov = 0usize;
            w.for_each_unsent_run(1024, 256 * 1024, |_, _, len| iov += len);
            w.on_sent(iov as u64);
            black_box(w.on_acked(iov as u64))
        })
    });
}

criterion_group!(benches, parse, window_cycle);
criterion_main!(benches);
