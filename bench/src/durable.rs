//! The `durable` scenario: what a durable publish costs as a user sees it. In one run:
//! - the raw `fdatasync` on the filesystem of the server's data directory (p50 / p99), in two
//!   shapes: a 300-byte overwrite of a written block (the cheapest sync: data and a flush), and
//!   a 300-byte append into a fresh 4 KiB page of a preallocated file, as a log appends (its
//!   sync also converts the extent it wrote into, which writes the inode);
//! - for each publisher count (default 1 and 64), that many sequential publishers — each on its
//!   own keep-alive connection and stream, one POST in flight, the next sent when the 201
//!   arrives — for a fixed time: publish latency (request written → 201 read) p50 / p99 and
//!   acknowledged (durable) events per second, plus the server's CPU per event.
//!
//! Blocking sockets, one thread per publisher: a measurement of the server, not a load
//! generator's best case. Every answer must be a 201 with an ID; anything else is counted as
//! an error and fails the run.
#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::procstat;
use crate::progress::Progress;
use crate::target::{Bearer, UrlTemplate};

/// What to run.
#[derive(Debug, Clone)]
pub struct DurableConfig {
    pub publish: UrlTemplate,
    pub stream_prefix: String,
    /// Publisher counts, one run each.
    pub publishers: Vec<usize>,
    pub payload_bytes: usize,
    pub secs_per_run: f64,
    /// A directory on the server's data filesystem, for the raw `fdatasync` probe.
    pub fsync_probe_dir: Option<PathBuf>,
    pub fsync_probes: usize,
    /// CPUs to run the probe on, once each (empty: once, on the calling thread's CPUs).
    pub fsync_probe_cpus: Vec<usize>,
    pub target_pid: Option<u32>,
    /// `Authorization: Bearer <token>` on every publish (default: none).
    pub bearer: Bearer,
    /// A progress line on stderr every this many seconds of a publisher count's run (0 = none).
    pub progress_interval_secs: u64,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub samples: usize,
}

impl Percentiles {
    fn of(mut us: Vec<u64>) -> Percentiles {
        us.sort_unstable();
        let at = |q: f64| {
            us.get(((us.len() as f64 * q) as usize).min(us.len().saturating_sub(1)))
                .map_or(0.0, |&v| v as f64 / 1000.0)
        };
        Percentiles {
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            samples: us.len(),
        }
    }
}

/// One publisher count's run.
#[derive(Debug, Clone, Serialize)]
pub struct DurableRow {
    pub publishers: usize,
    pub events: u64,
    pub errors: u64,
    pub secs: f64,
    pub events_per_sec: f64,
    pub latency: Percentiles,
    /// Server CPU (user + system) per acknowledged event, when `--target-pid` was given.
    pub server_cpu_us_per_event: Option<f64>,
}

/// The whole scenario.
#[derive(Debug, Clone, Serialize)]
pub struct DurableReport {
    /// Per probe: the CPU it ran on (`None`: wherever the bench runs) and its latencies, for
    /// the overwrite of a written block.
    pub fdatasync: Vec<(Option<usize>, Percentiles)>,
    /// The same for an append into a fresh page of a preallocated file.
    pub fdatasync_append: Vec<(Option<usize>, Percentiles)>,
    pub rows: Vec<DurableRow>,
}

impl DurableReport {
    pub fn errors(&self) -> u64 {
        self.rows.iter().map(|r| r.errors).sum()
    }

    /// A plain-text table.
    pub fn table(&self) -> String {
        let mut out = String::from("== durable\n");
        let probes = (self.fdatasync.iter().map(|p| (Shape::Overwrite, p)))
            .chain(self.fdatasync_append.iter().map(|p| (Shape::Append, p)));
        for (shape, (cpu, f)) in probes {
            let on = cpu.map_or(String::new(), |c| format!(" on CPU {c}"));
            out.push_str(&format!(
                "  raw fdatasync ({}){on}: p50 {:.3} ms, p99 {:.3} ms ({} samples)\n",
                shape.label(),
                f.p50_ms,
                f.p99_ms,
                f.samples
            ));
        }
        out.push_str(
            "  publishers | durable ev/s | publish p50 ms | p99 ms | server CPU us/ev | errors\n",
        );
        for r in &self.rows {
            let cpu = r
                .server_cpu_us_per_event
                .map_or("-".to_string(), |c| format!("{c:.2}"));
            out.push_str(&format!(
                "  {:>10} | {:>12.0} | {:>14.3} | {:>6.3} | {:>16} | {}\n",
                r.publishers, r.events_per_sec, r.latency.p50_ms, r.latency.p99_ms, cpu, r.errors
            ));
        }
        out
    }
}

/// Runs the probe and every publisher count in turn.
pub fn run(cfg: &DurableConfig) -> Result<DurableReport, String> {
    let mut fdatasync = Vec::new();
    let mut fdatasync_append = Vec::new();
    if let Some(dir) = &cfg.fsync_probe_dir {
        let cpus: Vec<Option<usize>> = if cfg.fsync_probe_cpus.is_empty() {
            vec![None]
        } else {
            cfg.fsync_probe_cpus.iter().copied().map(Some).collect()
        };
        for cpu in cpus {
            let (dir, n) = (dir.clone(), cfg.fsync_probes);
            // A thread of its own, pinned: the calling thread keeps its CPUs.
            let p = std::thread::spawn(move || {
                if let Some(c) = cpu {
                    if c >= rustix::thread::CpuSet::MAX_CPU {
                        return Err(format!("--fsync-probe-cpus {c}: no such CPU"));
                    }
                    let mut set = rustix::thread::CpuSet::new();
                    set.set(c);
                    rustix::thread::sched_setaffinity(None, &set)
                        .map_err(|e| format!("--fsync-probe-cpus {c}: {e}"))?;
                }
                let overwrite = fdatasync_probe(&dir, n, Shape::Overwrite);
                let append = fdatasync_probe(&dir, n, Shape::Append);
                Ok::<_, String>((
                    overwrite.map_err(|e| e.to_string())?,
                    append.map_err(|e| e.to_string())?,
                ))
            })
            .join()
            .map_err(|_| "the fdatasync probe panicked".to_string())??;
            fdatasync.push((cpu, p.0));
            fdatasync_append.push((cpu, p.1));
        }
    }
    let mut rows = Vec::new();
    for &n in &cfg.publishers {
        rows.push(run_publishers(cfg, n)?);
    }
    Ok(DurableReport {
        fdatasync,
        fdatasync_append,
        rows,
    })
}

/// What the probe writes before each `fdatasync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// 300 bytes over the start of a written 4 KiB file: nothing but the data to sync.
    Overwrite,
    /// 300 bytes at the start of the next 4 KiB page of a file preallocated with
    /// `posix_fallocate` (as the log's segments are): the sync also records that the page's
    /// block now holds data (an unwritten extent converted), which writes the inode.
    Append,
}

impl Shape {
    fn label(self) -> &'static str {
        match self {
            Shape::Overwrite => "300 B overwrite",
            Shape::Append => "300 B append, preallocated",
        }
    }
}

/// `fdatasync` latency of `n` writes of `shape` to a file of its own in `dir`.
fn fdatasync_probe(dir: &std::path::Path, n: usize, shape: Shape) -> std::io::Result<Percentiles> {
    use std::os::unix::fs::FileExt;
    const PAGE: u64 = 4096;
    let path = dir.join(format!(".bench-fdatasync-probe-{}", std::process::id()));
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    match shape {
        Shape::Overwrite => f.write_all_at(&[0u8; PAGE as usize], 0)?,
        Shape::Append => {
            // At least a page: a zero length is EINVAL.
            let len = (n as u64).max(1) * PAGE;
            rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, len)?
        }
    }
    f.sync_all()?;
    let mut us = Vec::with_capacity(n);
    let data = [b'z'; 300];
    for i in 0..n as u64 {
        let at = if shape == Shape::Append { i * PAGE } else { 0 };
        f.write_all_at(&data, at)?;
        let t = Instant::now();
        f.sync_data()?;
        us.push(t.elapsed().as_micros() as u64);
    }
    drop(f);
    std::fs::remove_file(&path)?;
    Ok(Percentiles::of(us))
}

/// What one publisher thread measured.
struct Thread {
    us: Vec<u64>,
    errors: u64,
    /// When its last answer arrived.
    ended: Instant,
}

fn run_publishers(cfg: &DurableConfig, n: usize) -> Result<DurableRow, String> {
    let cpu_before = cpu_secs(cfg.target_pid)?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(cfg.secs_per_run);
    let acked = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (cfg, acked) = (cfg.clone(), Arc::clone(&acked));
            std::thread::spawn(move || publisher(&cfg, i, deadline, &acked))
        })
        .collect();
    let mut progress = Progress::new(cfg.progress_interval_secs, start);
    let what = format!("acknowledged by {n} publisher(s)");
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        let acked = acked.load(Ordering::Relaxed);
        progress.tick(Instant::now(), &[(what.as_str(), acked)]);
    }
    let mut us = Vec::new();
    let mut errors = 0;
    let mut end = start;
    for h in handles {
        let t = h.join().map_err(|_| "a publisher thread panicked")??;
        us.extend(t.us);
        errors += t.errors;
        end = end.max(t.ended);
    }
    // To the last publisher's last answer, not to when the polling above noticed it.
    let secs = end.duration_since(start).as_secs_f64();
    let cpu = cpu_secs(cfg.target_pid)?;
    let events = us.len() as u64;
    Ok(DurableRow {
        publishers: n,
        events,
        errors,
        secs,
        events_per_sec: events as f64 / secs,
        latency: Percentiles::of(us),
        server_cpu_us_per_event: match (cpu_before, cpu) {
            (Some(a), Some(b)) if events > 0 => Some((b - a) * 1e6 / events as f64),
            _ => None,
        },
    })
}

fn cpu_secs(pid: Option<u32>) -> Result<Option<f64>, String> {
    let Some(pid) = pid else { return Ok(None) };
    let s = procstat::sample(&[pid]).map_err(|e| e.to_string())?;
    Ok(Some(
        s.cpu_ticks as f64 / procstat::ticks_per_second() as f64,
    ))
}

/// One sequential publisher: POST, wait for the 201, repeat until the deadline.
fn publisher(
    cfg: &DurableConfig,
    i: usize,
    deadline: Instant,
    acked: &AtomicU64,
) -> Result<Thread, String> {
    let stream = format!("{}{i}", cfg.stream_prefix);
    let mut path = Vec::new();
    cfg.publish.render_path(&stream, &mut path);
    let path = String::from_utf8(path).map_err(|e| e.to_string())?;
    let sock = TcpStream::connect(cfg.publish.addr).map_err(|e| format!("connect: {e}"))?;
    sock.set_nodelay(true).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut w = sock.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(sock);
    let req = publish_request(cfg, &path);
    let mut t = Thread {
        us: Vec::new(),
        errors: 0,
        ended: Instant::now(),
    };
    while Instant::now() < deadline {
        let sent = Instant::now();
        w.write_all(&req).map_err(|e| format!("write: {e}"))?;
        let status = read_answer(&mut r)?;
        if status == 201 {
            t.us.push(sent.elapsed().as_micros() as u64);
            acked.fetch_add(1, Ordering::Relaxed);
        } else {
            t.errors += 1;
        }
    }
    t.ended = Instant::now();
    Ok(t)
}

/// One publish request, head and body (`--payload-bytes` of `d`), sent again and again.
fn publish_request(cfg: &DurableConfig, path: &str) -> Vec<u8> {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\n",
        cfg.publish.host_header
    )
    .into_bytes();
    cfg.bearer.append_header(&mut req);
    req.extend_from_slice(format!("Content-Length: {}\r\n\r\n", cfg.payload_bytes).as_bytes());
    req.resize(req.len() + cfg.payload_bytes, b'd');
    req
}

/// Reads one response (status line, headers, Content-Length body); returns the status.
fn read_answer(r: &mut impl BufRead) -> Result<u16, String> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| format!("read: {e}"))?;
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {line:?}"))?;
    let mut len = 0usize;
    loop {
        line.clear();
        r.read_line(&mut line).map_err(|e| format!("read: {e}"))?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().map_err(|_| format!("bad length {v:?}"))?;
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).map_err(|e| format!("body: {e}"))?;
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(bearer: Bearer) -> DurableConfig {
        DurableConfig {
            publish: UrlTemplate::parse("http://127.0.0.1:8080/v1/streams/{stream}/events")
                .unwrap(),
            stream_prefix: "d".into(),
            publishers: vec![1],
            payload_bytes: 4,
            secs_per_run: 1.0,
            fsync_probe_dir: None,
            fsync_probes: 0,
            fsync_probe_cpus: Vec::new(),
            progress_interval_secs: 0,
            target_pid: None,
            bearer,
        }
    }

    #[test]
    fn the_probe_runs_on_each_cpu_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = DurableConfig {
            publishers: Vec::new(),
            fsync_probe_dir: Some(dir.path().to_owned()),
            fsync_probes: 20,
            fsync_probe_cpus: vec![0, 0],
            ..config(Bearer::none())
        };
        let r = run(&cfg).unwrap();
        for probes in [&r.fdatasync, &r.fdatasync_append] {
            assert_eq!(probes.len(), 2);
            assert!(probes.iter().all(|(c, p)| *c == Some(0) && p.samples == 20));
        }
        let table = r.table();
        assert!(table.contains("raw fdatasync (300 B overwrite) on CPU 0: p50"));
        assert!(table.contains("raw fdatasync (300 B append, preallocated) on CPU 0: p50"));
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "the probes remove their files"
        );
        let none = run(&DurableConfig {
            fsync_probes: 0,
            ..cfg.clone()
        })
        .unwrap();
        assert!(none.fdatasync_append.iter().all(|(_, p)| p.samples == 0));
        let cfg = DurableConfig {
            fsync_probe_cpus: vec![1000],
            ..cfg
        };
        assert!(run(&cfg).unwrap_err().contains("--fsync-probe-cpus"));
    }

    #[test]
    fn publish_request_without_a_token() {
        assert_eq!(
            publish_request(&config(Bearer::none()), "/v1/streams/d0/events"),
            b"POST /v1/streams/d0/events HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
              Content-Type: text/plain\r\nContent-Length: 4\r\n\r\ndddd"
        );
    }

    #[test]
    fn publish_request_carries_the_bearer_token() {
        let bearer = Bearer::from_token_text("t0k.e.n\n").unwrap();
        assert_eq!(
            publish_request(&config(bearer), "/v1/streams/d0/events"),
            b"POST /v1/streams/d0/events HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
              Content-Type: text/plain\r\nAuthorization: Bearer t0k.e.n\r\n\
              Content-Length: 4\r\n\r\ndddd"
        );
    }
}
