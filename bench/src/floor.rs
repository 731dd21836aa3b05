//! The `floor` scenario: what the kernel alone charges to deliver one event to one subscriber
//! over loopback — one `send()` of `payload_bytes` per subscriber per event, from a writer
//! thread pinned to one core, with a reader thread pinned to another core draining every
//! socket. The writer thread's CPU time (user + system, from `/proc/thread-self/stat`) per send
//! is the floor a server's CPU per delivered event is compared with: a server cannot deliver an
//! event to a TCP subscriber for less than the `send()` that puts it in the socket.
#![forbid(unsafe_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::procstat;
use crate::progress::Progress;

/// What to measure.
#[derive(Debug, Clone)]
pub struct FloorConfig {
    pub subscribers: usize,
    pub payload_bytes: usize,
    pub secs: f64,
    pub writer_cpu: usize,
    pub reader_cpu: usize,
    /// How the reader waits for data.
    pub reader: ReaderMode,
    /// Events per second the writer paces itself to (one send per subscriber each); 0: as
    /// fast as it can.
    pub events_per_sec: f64,
    /// A progress line on stderr every this many seconds (0 = none).
    pub progress_interval_secs: u64,
}

/// How the reader thread drains the sockets. The writer's cost depends on it: a send to a
/// socket whose reader sleeps in `epoll_wait` also pays for the wake-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ReaderMode {
    /// Busy-polls every socket with non-blocking reads: it never sleeps, so the writer never
    /// wakes it (the cheapest floor).
    Spin,
    /// One edge-triggered epoll loop that sleeps when nothing is readable: how `bench
    /// fanout`'s subscribers read, so the floor a fan-out figure is compared with.
    Epoll,
}

/// The floor.
#[derive(Debug, Clone, Serialize)]
pub struct FloorReport {
    pub subscribers: usize,
    pub payload_bytes: usize,
    pub reader: ReaderMode,
    pub events_per_sec: f64,
    pub sends: u64,
    pub writer_cpu_secs: f64,
    /// Writer CPU per send: the kernel's cost of one delivery.
    pub us_per_send: f64,
}

impl FloorReport {
    pub fn table(&self) -> String {
        format!(
            "== floor ({:?} reader, {})\n  {} subscribers x {} B: {} sends, writer CPU {:.2} s: {:.2} us per send (delivery)\n",
            self.reader,
            if self.events_per_sec > 0.0 {
                format!("{} events/s", self.events_per_sec)
            } else {
                "unpaced".to_string()
            },
            self.subscribers,
            self.payload_bytes,
            self.sends,
            self.writer_cpu_secs,
            self.us_per_send
        )
    }
}

fn pin(cpu: usize) -> Result<(), String> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).map_err(|e| format!("pin to cpu {cpu}: {e}"))
}

/// This thread's CPU seconds (user + system).
fn thread_cpu_secs() -> Result<f64, String> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").map_err(|e| e.to_string())?;
    let (u, s) = procstat::parse_stat(&stat).ok_or("cannot parse /proc/thread-self/stat")?;
    Ok((u + s) as f64 / procstat::ticks_per_second() as f64)
}

/// Loopback pairs: (writer side, reader side).
fn pairs(n: usize) -> Result<Vec<(TcpStream, TcpStream)>, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    (0..n)
        .map(|_| {
            let w = TcpStream::connect(addr).map_err(|e| e.to_string())?;
            let (r, _) = l.accept().map_err(|e| e.to_string())?;
            w.set_nodelay(true).map_err(|e| e.to_string())?;
            r.set_nonblocking(true).map_err(|e| e.to_string())?;
            Ok((w, r))
        })
        .collect()
}

/// Runs the measurement.
pub fn run(cfg: &FloorConfig) -> Result<FloorReport, String> {
    let (writers, readers): (Vec<_>, Vec<_>) = pairs(cfg.subscribers)?.into_iter().unzip();
    let stop = Arc::new(AtomicBool::new(false));
    let reader_cpu = cfg.reader_cpu;
    let stop_r = Arc::clone(&stop);
    let mode = cfg.reader;
    let reader = std::thread::spawn(move || -> Result<(), String> {
        pin(reader_cpu)?;
        match mode {
            ReaderMode::Spin => spin_reader(readers, &stop_r),
            ReaderMode::Epoll => epoll_reader(readers, &stop_r),
        }
    });
    pin(cfg.writer_cpu)?;
    let payload = vec![b'e'; cfg.payload_bytes];
    let mut writers = writers;
    let cpu0 = thread_cpu_secs()?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(cfg.secs);
    let mut sends = 0u64;
    let tick =
        (cfg.events_per_sec > 0.0).then(|| Duration::from_secs_f64(1.0 / cfg.events_per_sec));
    let mut next = start;
    let mut progress = Progress::new(cfg.progress_interval_secs, start);
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        progress.tick(now, &[("sends", sends)]);
        for w in writers.iter_mut() {
            w.write_all(&payload).map_err(|e| e.to_string())?;
            sends += 1;
        }
        if let Some(tick) = tick {
            next += tick;
            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
    }
    let writer_cpu_secs = thread_cpu_secs()? - cpu0;
    stop.store(true, Ordering::Relaxed);
    drop(writers);
    reader.join().map_err(|_| "reader panicked")??;
    Ok(FloorReport {
        subscribers: cfg.subscribers,
        payload_bytes: cfg.payload_bytes,
        reader: cfg.reader,
        events_per_sec: cfg.events_per_sec,
        sends,
        writer_cpu_secs,
        us_per_send: writer_cpu_secs * 1e6 / sends.max(1) as f64,
    })
}

/// Drains every socket in turn with non-blocking reads, never sleeping.
fn spin_reader(mut readers: Vec<TcpStream>, stop: &AtomicBool) -> Result<(), String> {
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) {
        for r in readers.iter_mut() {
            if !drain(r, &mut buf)? {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Waits in `epoll_wait` (edge-triggered, like `bench fanout`'s subscribers) and drains the
/// sockets it reports.
fn epoll_reader(readers: Vec<TcpStream>, stop: &AtomicBool) -> Result<(), String> {
    let poll = mio::Poll::new().map_err(|e| e.to_string())?;
    let mut socks: Vec<mio::net::TcpStream> = readers
        .into_iter()
        .map(mio::net::TcpStream::from_std)
        .collect();
    for (i, s) in socks.iter_mut().enumerate() {
        poll.registry()
            .register(s, mio::Token(i), mio::Interest::READABLE)
            .map_err(|e| e.to_string())?;
    }
    let mut poll = poll;
    let mut events = mio::Events::with_capacity(1024);
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) {
        poll.poll(&mut events, Some(Duration::from_millis(50)))
            .map_err(|e| e.to_string())?;
        for ev in events.iter() {
            if !drain(&mut socks[ev.token().0], &mut buf)? {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Reads `r` until it would block; false at end of stream.
fn drain(r: &mut impl Read, buf: &mut [u8]) -> Result<bool, String> {
    loop {
        match r.read(buf) {
            Ok(0) => return Ok(false),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
            Err(e) => return Err(e.to_string()),
        }
    }
}
