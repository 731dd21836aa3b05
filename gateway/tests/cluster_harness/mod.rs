//! The cluster tests' harness (shared by `cluster*.rs` and `idempotency.rs`): a 3-node NATS
//! JetStream cluster (R=3, `sync_interval: always`), HAProxy in front of the gateways, and
//! the gateways' cluster flags, all on loopback with bounded waits.
//!
//! Needs `nats-server` >= 2.12 and `haproxy` ($NATS_SERVER / $HAPROXY or PATH; the test command
//! installs both with scripts/setup-cluster.sh). Without them the tests fail, unless
//! GATEWAY_TESTS_WITHOUT_CLUSTER=1 is set (then they print SKIPPED).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::Gateway;

pub fn tool(env: &str, name: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(env) {
        return Some(PathBuf::from(p));
    }
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .ok()?;
    let p = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!p.is_empty()).then(|| PathBuf::from(p))
}

/// The tools, or `None` when the run opted out (else a panic naming the setup script).
pub fn tools() -> Option<(PathBuf, PathBuf)> {
    match (
        tool("NATS_SERVER", "nats-server"),
        tool("HAPROXY", "haproxy"),
    ) {
        (Some(n), Some(h)) => Some((n, h)),
        _ if std::env::var_os("GATEWAY_TESTS_WITHOUT_CLUSTER").is_some() => {
            eprintln!("SKIPPED: cluster tests: nats-server or haproxy not found");
            None
        }
        _ => panic!(
            "nats-server and haproxy are needed ($NATS_SERVER / $HAPROXY or PATH): run \
             `bash scripts/setup-cluster.sh`, or set GATEWAY_TESTS_WITHOUT_CLUSTER=1 to skip"
        ),
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child killed (SIGKILL) when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Nats {
    pub nodes: Vec<Option<Proc>>,
    pub client_ports: Vec<u16>,
    pub monitor_ports: Vec<u16>,
}

impl Nats {
    /// A 3-server cluster that reports healthy. Ports are picked free and then released, so a
    /// parallel test can take one before a server binds it, and the cluster then never forms
    /// (seen: no meta leader for 90 s); such an attempt is ended and the cluster started
    /// again on fresh ports and a fresh directory, up to 3 times.
    pub fn start(bin: &Path, dir: &Path) -> Nats {
        let mut why = String::new();
        for attempt in 0..3 {
            let d = dir.join(format!("nats-{attempt}"));
            std::fs::create_dir_all(&d).unwrap();
            let nats = Nats::spawn(bin, &d);
            match nats.wait_healthy(&d, Duration::from_secs(40)) {
                Ok(()) => return nats,
                Err(e) => why = e,
            }
            eprintln!("NATS cluster attempt {attempt} did not form ({why}); starting again");
        }
        panic!("the NATS cluster did not form in 3 attempts; the last: {why}");
    }

    fn spawn(bin: &Path, dir: &Path) -> Nats {
        let client_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let route_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let monitor_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let routes: Vec<String> = route_ports
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect();
        let mut nodes = Vec::new();
        for i in 0..3 {
            let conf = dir.join(format!("n{i}.conf"));
            let text = format!(
                "server_name: n{i}\nlisten: 127.0.0.1:{}\nhttp: 127.0.0.1:{}\n\
                 jetstream {{ store_dir: {:?}, sync_interval: always }}\n\
                 cluster {{ name: gw, listen: 127.0.0.1:{}, routes: [{}] }}\n",
                client_ports[i],
                monitor_ports[i],
                dir.join(format!("js{i}")),
                route_ports[i],
                routes.join(", ")
            );
            std::fs::write(&conf, text).unwrap();
            let log = std::fs::File::create(dir.join(format!("n{i}.log"))).unwrap();
            let child = Command::new(bin)
                .arg("-c")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn nats-server");
            nodes.push(Some(Proc(child)));
        }
        Nats {
            nodes,
            client_ports,
            monitor_ports,
        }
    }

    /// Waits (bounded by `wait`) until every server's `/healthz` says ok — routes up and
    /// JetStream current — so a gateway started next does not spend its start-up wait on the
    /// NATS cluster forming. `Err`: which server was not, with the tail of its log.
    fn wait_healthy(&self, dir: &Path, wait: Duration) -> Result<(), String> {
        let deadline = Instant::now() + wait;
        for (i, p) in self.monitor_ports.iter().enumerate() {
            loop {
                let ok = http_get(([127, 0, 0, 1], *p).into(), "/healthz")
                    .is_ok_and(|b| String::from_utf8_lossy(&b).contains("\"ok\""));
                if ok {
                    break;
                }
                if Instant::now() >= deadline {
                    let log =
                        std::fs::read_to_string(dir.join(format!("n{i}.log"))).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(20).collect();
                    return Err(format!(
                        "server n{i} not healthy after {wait:?}; its log ends:\n{}",
                        tail.join("\n")
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    pub fn urls(&self) -> Vec<String> {
        self.client_ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect()
    }

    /// The server that leads JetStream stream `name` (from a live node's `/jsz`).
    pub fn leader_of(&self, name: &str) -> Option<usize> {
        for (i, p) in self.monitor_ports.iter().enumerate() {
            if self.nodes[i].is_none() {
                continue;
            }
            let Ok(body) = http_get(
                ([127, 0, 0, 1], *p).into(),
                "/jsz?accounts=true&streams=true",
            ) else {
                continue;
            };
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            for acc in v["account_details"].as_array().into_iter().flatten() {
                for s in acc["stream_detail"].as_array().into_iter().flatten() {
                    if s["name"] == name
                        && let Some(l) = s["cluster"]["leader"].as_str()
                    {
                        return l.strip_prefix('n').and_then(|n| n.parse().ok());
                    }
                }
            }
        }
        None
    }
}

pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    // HTTP/1.0: a plain body to the close, never chunked.
    write!(s, "GET {path} HTTP/1.0\r\nHost: t\r\n\r\n")?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let i = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0);
    Ok(out[i + 4..].to_vec())
}

pub struct Balancer {
    _proc: Proc,
    pub addr: SocketAddr,
}

impl Balancer {
    /// HAProxy round-robin with no affinity.
    pub fn start(bin: &Path, dir: &Path, backends: &[SocketAddr]) -> Balancer {
        Balancer::start_with(bin, dir, backends, "  balance roundrobin\n")
    }

    /// HAProxy with these backend rules (lines, each indented and ending in `\n`).
    pub fn start_with(bin: &Path, dir: &Path, backends: &[SocketAddr], rules: &str) -> Balancer {
        let port = free_port();
        let servers: String = backends
            .iter()
            .enumerate()
            .map(|(i, a)| format!("  server g{i} {a} check inter 200ms fall 1 rise 2\n"))
            .collect();
        let conf = format!(
            "global\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 1s\n  \
             timeout client 120s\n  timeout server 120s\n  option redispatch\n  retries 3\n\
             frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n\
             backend b\n{rules}{servers}"
        );
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new(bin)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn haproxy");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "haproxy did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Balancer {
            _proc: Proc(child),
            addr,
        }
    }
}

/// Flags of a cluster gateway.
pub fn gateway_args(urls: &[String], extra: &[&str]) -> Vec<String> {
    // A JetStream cluster on a loaded 2-core machine can take long to elect its leaders.
    let mut a: Vec<String> = [
        "--cores",
        "1",
        "--shards-on-create",
        "4",
        "--nats-connect-timeout-secs",
        "120",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for u in urls {
        a.push("--nats-url".into());
        a.push(u.clone());
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

pub fn start_gateway(dir: &Path, urls: &[String], extra: &[&str]) -> Gateway {
    let args = gateway_args(urls, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Gateway::start_in(dir, &args)
}

/// A new temporary directory, the NATS cluster in it and `n` gateways on it (`None`: the
/// tools are missing and the test is skipped).
pub fn nats_and_gateways(n: usize) -> Option<(tempfile::TempDir, Nats, Vec<Gateway>)> {
    let (nats_bin, _) = tools()?;
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(&nats_bin, dir.path());
    let urls = nats.urls();
    let gs = (0..n)
        .map(|i| start_gateway(&dir.path().join(format!("g{i}")), &urls, &[]))
        .collect();
    Some((dir, nats, gs))
}

/// The shard of a stream (the gateway's FNV-1a of the name, mod the shard count).
pub fn shard_of(name: &str, shards: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h % shards
}

/// Publishes one message straight to NATS (core protocol, `HPUB`, no JetStream ack) on
/// `subject` with these headers: what another writer of the shard would send. Waits for the
/// server's `PONG`, so the message was processed.
pub fn nats_publish_raw(port: u16, subject: &str, headers: &[(&str, &str)], payload: &[u8]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to NATS");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hdr = String::from("NATS/1.0\r\n");
    for (k, v) in headers {
        hdr.push_str(&format!("{k}: {v}\r\n"));
    }
    hdr.push_str("\r\n");
    let mut msg = format!(
        "CONNECT {{\"verbose\":false,\"headers\":true,\"protocol\":1}}\r\nHPUB {subject} {} {}\r\n{hdr}",
        hdr.len(),
        hdr.len() + payload.len()
    )
    .into_bytes();
    msg.extend_from_slice(payload);
    msg.extend_from_slice(b"\r\nPING\r\n");
    s.write_all(&msg).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("PONG") {
        let n = s.read(&mut buf).expect("NATS answers within 10 s");
        assert!(n > 0, "NATS closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
        assert!(
            !String::from_utf8_lossy(&got).contains("-ERR"),
            "{}",
            String::from_utf8_lossy(&got)
        );
    }
}

/// The first `n` events of `stream` on `addr`, from its first, as the raw bytes of their
/// lines (`id:`, `event:`, `data:`), and their IDs. Retried (bounded) while the node has not
/// applied them all.
pub fn events_on(addr: SocketAddr, stream: &str, n: usize) -> (Vec<u8>, Vec<String>) {
    // Up to a minute: after a kill of a stream's JetStream leader a node's follower recreates
    // its consumer once it missed its heartbeats, on a loaded machine in tens of seconds.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "{addr} never served {n} events");
        if let Some(got) = try_events(addr, stream, n, None) {
            return got;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One subscribe (`last`: as a resume with that `Last-Event-ID`); `None` if it ended or
/// stalled before `n` events.
pub fn try_events(
    addr: SocketAddr,
    stream: &str,
    n: usize,
    last: Option<&str>,
) -> Option<(Vec<u8>, Vec<String>)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let resume = last.map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
    write!(
        s,
        "GET /v1/streams/{stream}?from=earliest HTTP/1.1\r\nHost: t\r\n{resume}\r\n"
    )
    .ok()?;
    let mut r = BufReader::new(s);
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line).ok()?;
    if !line.starts_with(b"HTTP/1.1 200") {
        return None;
    }
    loop {
        line.clear();
        r.read_until(b'\n', &mut line).ok()?;
        if line == b"\r\n" || line.is_empty() {
            break;
        }
    }
    let (mut bytes, mut ids) = (Vec::new(), Vec::new());
    while ids.len() < n {
        line.clear();
        if r.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        if let Some(id) = line.strip_prefix(b"id: ") {
            ids.push(String::from_utf8_lossy(id).trim().to_owned());
        }
        if line.starts_with(b"id:") || line.starts_with(b"event:") || line.starts_with(b"data:") {
            bytes.extend_from_slice(&line);
        }
    }
    Some((bytes, ids))
}
