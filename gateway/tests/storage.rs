//! The gateway against failing storage, for real (root: these mount filesystems):
//! - an `fdatasync` that fails with EIO (an ext4 on a loop device whose backing file is cut
//!   short under it) is fail-stop: the publish waiting for it gets `500 log_failed`, later
//!   publishes too, nothing after the last durable event is ever shown, and the gateway keeps
//!   serving;
//! - a full disk (a small tmpfs) answers `507` with a JSON error, loses nothing acknowledged,
//!   keeps subscribers reading, and publishing resumes once retention frees space.
//!
//! Not root: each test fails, unless `GATEWAY_TESTS_WITHOUT_ROOT=1` says to skip them (they
//! then print why). CI runs as root.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Gateway, Sse, json, publish, request};

/// Whether the test may run (root), or panics saying how to skip it.
fn root_or_skip(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("GATEWAY_TESTS_WITHOUT_ROOT").is_some(),
        "{test} mounts filesystems and needs root (set GATEWAY_TESTS_WITHOUT_ROOT=1 to skip it)"
    );
    eprintln!("SKIPPED {test}: not root");
    false
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run a system tool");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A mounted filesystem, unmounted (and its loop device detached) when dropped.
struct Mount {
    dir: PathBuf,
    loop_dev: Option<String>,
}

impl Drop for Mount {
    fn drop(&mut self) {
        for _ in 0..50 {
            let ok = Command::new("umount")
                .arg(&self.dir)
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                break;
            }
            std::thread::sleep(Duration::from_millis(100)); // the gateway is still exiting
        }
        if let Some(dev) = &self.loop_dev {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

/// An ext4 filesystem on a loop device over `img` (64 MiB), mounted at `dir`.
fn ext4_on_loop(img: &Path, dir: &Path) -> Mount {
    std::fs::File::create(img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let dev = run(Command::new("losetup").args(["-f", "--show"]).arg(img));
    let mount = Mount {
        dir: dir.to_path_buf(),
        loop_dev: Some(dev.clone()),
    };
    run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]));
    std::fs::create_dir_all(dir).unwrap();
    run(Command::new("mount")
        .args(["-o", "errors=continue", &dev])
        .arg(dir));
    mount
}

/// The loop device under `mount` loses everything past its first MiB (its backing file `img`
/// cut short): writeback of the log's pages fails from now on.
fn cut_device(img: &Path, mount: &Mount) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(img)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    run(Command::new("losetup").args(["-c", mount.loop_dev.as_deref().unwrap()]));
}

/// Publishes one event; the status and the JSON body.
fn try_publish(g: &Gateway, stream: &str, data: &str) -> (u16, serde_json::Value) {
    let path = format!("/v1/streams/{stream}/events");
    let (st, _, body) = request(g.addr, "POST", &path, &[], data.as_bytes());
    (st, json(&body))
}

/// Every event a fresh subscriber from the earliest event sees before `quiet` of silence.
fn events_of(g: &Gateway, stream: &str, quiet: Duration) -> Vec<String> {
    let mut s = Sse::open(g.addr, &format!("/v1/streams/{stream}?from=earliest"), None);
    assert_eq!(s.status, 200);
    s.stream.set_read_timeout(Some(quiet)).unwrap();
    let mut out = Vec::new();
    loop {
        if let Some(e) = s.take_buffered() {
            out.push(e.data);
            continue;
        }
        let mut tmp = [0u8; 4096];
        match std::io::Read::read(&mut s.stream, &mut tmp) {
            Ok(0) | Err(_) => return out,
            Ok(k) => s.inject(&tmp[..k]),
        }
    }
}

#[test]
fn a_failed_fsync_is_fail_stop_and_shows_nothing_it_did_not_make_durable() {
    if !root_or_skip("a_failed_fsync_is_fail_stop") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fs.img");
    let mnt = tmp.path().join("mnt");
    let mount = ext4_on_loop(&img, &mnt);
    let mut g = Gateway::start_in(&mnt.join("data"), &["--cores", "1"]);
    for i in 1..=3 {
        publish(g.addr, "s", &format!("durable {i}"));
    }
    // The device loses everything past its first MiB: writeback of the log's pages fails.
    cut_device(&img, &mount);
    let (st, body) = try_publish(&g, "s", "lost");
    assert_eq!(
        (st, body["error"].as_str()),
        (500, Some("log_failed")),
        "{body}"
    );
    let (st, body) = try_publish(&g, "s", "refused");
    assert_eq!(
        (st, body["error"].as_str()),
        (500, Some("log_failed")),
        "{body}"
    );
    assert_eq!(g.metric("gateway_log_sync_failures_total", ""), 1);
    // Still serving: health, and every durable event, and nothing else.
    assert_eq!(request(g.addr, "GET", "/healthz", &[], b"").0, 200);
    let seen = events_of(&g, "s", Duration::from_millis(500));
    assert_eq!(seen, ["durable 1", "durable 2", "durable 3"]);
    g.stop();
    drop(mount);
}

#[test]
fn a_full_disk_answers_507_loses_nothing_and_publishing_resumes_after_retention() {
    if !root_or_skip("a_full_disk_answers_507") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mnt");
    std::fs::create_dir_all(&dir).unwrap();
    // Room for the shard files and a few 64 KiB segments, not many.
    run(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "tmpfs"])
        .arg(&dir));
    let mount = Mount {
        dir: dir.clone(),
        loop_dev: None,
    };
    let flags = [
        "--cores",
        "1",
        "--shards-on-create",
        "1",
        "--segment-bytes",
        "65536",
        "--retain-secs",
        "2",
    ];
    let mut g = Gateway::spawn(&dir.join("data"), &flags, true);
    let mut sub = Sse::open(g.addr, "/v1/streams/s?from=earliest", None);
    assert_eq!(sub.status, 200);
    let payload = "f".repeat(900);
    let mut acked = Vec::new();
    let full = loop {
        let (st, body) = try_publish(&g, "s", &format!("{} {payload}", acked.len()));
        if st != 201 {
            break (st, body);
        }
        acked.push(body["id"].as_str().unwrap().to_string());
        assert!(acked.len() < 10_000, "the tmpfs never filled");
    };
    assert_eq!(full.0, 507, "{}", full.1);
    assert_eq!(full.1["error"].as_str(), Some("insufficient_storage"));
    // The subscriber still gets every acknowledged event, in order, once.
    for (i, id) in acked.iter().enumerate() {
        let e = sub.next_event().expect("an acknowledged event");
        assert_eq!(e.id.as_deref(), Some(id.as_str()));
        assert!(e.data.starts_with(&format!("{i} ")));
    }
    // Retention (by age) frees sealed segments; then publishing works again, continuing the
    // same sequence.
    let deadline = Instant::now() + Duration::from_secs(20);
    let resumed = loop {
        let (st, body) = try_publish(&g, "s", "after retention");
        if st == 201 {
            break body["id"].as_str().unwrap().to_string();
        }
        assert_eq!(st, 507, "{body}");
        assert!(Instant::now() < deadline, "publishing never resumed");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        common::seq_of(&resumed),
        common::seq_of(acked.last().unwrap()) + 1
    );
    let e = sub.next_event().expect("the event after retention");
    assert_eq!(e.id.as_deref(), Some(resumed.as_str()));
    g.stop();
    // The operator is told, once however many publishes the full disk refused.
    let told = g.stderr_lines();
    let full_lines = told.iter().filter(|l| l.contains("disk is full")).count();
    assert_eq!(full_lines, 1, "{told:#?}");
    drop(mount);
}

/// Publishes `data` to each of `streams` over one connection, every request in one write (so
/// the gateway reads them together and their appends share group-commit rounds); each
/// answer's status and JSON body, in order.
fn publish_pipelined(g: &Gateway, streams: &[String], data: &str) -> Vec<(u16, serde_json::Value)> {
    use std::io::Write as _;
    let mut reqs = Vec::new();
    for s in streams {
        reqs.extend_from_slice(
            format!(
                "POST /v1/streams/{s}/events HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{data}",
                data.len()
            )
            .as_bytes(),
        );
    }
    let mut c = common::connect(g.addr);
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(&reqs).unwrap();
    let mut r = std::io::BufReader::new(c);
    (0..streams.len())
        .map(|_| {
            let (st, _, body) = common::read_response(&mut r);
            (st, json(&body))
        })
        .collect()
}

#[test]
fn syncfs_rounds_make_every_shard_durable_and_a_failed_one_stops_each_shard_it_covered() {
    if !root_or_skip("syncfs_rounds") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fs.img");
    let mnt = tmp.path().join("mnt");
    let mount = ext4_on_loop(&img, &mnt);
    let data = mnt.join("data");
    let flags = ["--cores", "1", "--fsync-scope", "filesystem"];
    let mut g = Gateway::start_in(&data, &flags);
    // Streams over most of the 8 shards: a round names several files.
    let streams: Vec<String> = (0..16).map(|i| format!("s{i}")).collect();
    let shards: std::collections::BTreeSet<u32> = (streams.iter())
        .map(|s| gateway::shards::shard_of(s, 8))
        .collect();
    assert!(shards.len() >= 4, "{shards:?}");
    for (st, body) in publish_pipelined(&g, &streams, "durable") {
        assert_eq!(st, 201, "{body}");
    }
    let rounds = g.metric("gateway_log_syncfs_total", "");
    assert!(rounds >= 1, "no syncfs round");
    // A killed process loses nothing acknowledged (and a restart recovers each shard).
    let _ = g.child.kill();
    let _ = g.child.wait();
    let mut g = Gateway::start_in(&data, &flags);
    for s in &streams {
        assert_eq!(
            events_of(&g, s, Duration::from_millis(200)),
            ["durable"],
            "{s}"
        );
    }
    // The device loses everything past its first MiB: the next round's syncfs fails. Every
    // publish gets 500 log_failed, each shard's log stops (counted once), nothing is shown.
    cut_device(&img, &mount);
    for (st, body) in publish_pipelined(&g, &streams, "lost") {
        assert_eq!(
            (st, body["error"].as_str()),
            (500, Some("log_failed")),
            "{body}"
        );
    }
    assert_eq!(
        g.metric("gateway_log_sync_failures_total", ""),
        shards.len() as u64
    );
    assert!(g.metric("gateway_log_syncfs_total", "") >= 1);
    assert_eq!(request(g.addr, "GET", "/healthz", &[], b"").0, 200);
    for s in &streams {
        assert_eq!(
            events_of(&g, s, Duration::from_millis(200)),
            ["durable"],
            "{s}"
        );
    }
    g.stop();
    drop(mount);
}
