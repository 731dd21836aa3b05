//! Cluster mode's NATS connection events in the log: the server each one concerns is named
//! (its name and announced address), never the URL the node reached it by, which may carry
//! credentials. A kill of the server a node is connected to logs the disconnection from it
//! and the reconnection to another. The harness (and what it needs installed) is
//! `cluster_harness/`.

mod cluster_harness;
mod common;

use std::time::{Duration, Instant};

use cluster_harness::{Nats, gateway_args, tools};
use common::Gateway;

/// Waits (bounded) for a stderr line of `g` with every one of `parts`; returns it.
fn wait_line(g: &mut Gateway, parts: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lines = g.stderr_lines();
        if let Some(l) = lines.iter().find(|l| parts.iter().all(|p| l.contains(p))) {
            return l.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no line with {parts:?} in:\n{}",
            lines.join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The index of the NATS node a log line names (`server="n<i> at …"`).
fn node_in(line: &str) -> usize {
    let at = line.find("server=\"n").expect("a server named") + "server=\"n".len();
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

#[test]
fn connection_events_name_the_server_and_never_the_credentials() {
    let Some((nats_bin, _)) = tools() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut nats = Nats::start(&nats_bin, dir.path());
    // The servers require no authentication: they take the credentials and ignore them.
    let urls: Vec<String> = nats
        .client_ports
        .iter()
        .map(|p| format!("nats://gw:s3cret-pw@127.0.0.1:{p}"))
        .collect();
    let args = gateway_args(&urls, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut g = Gateway::spawn(&dir.path().join("g"), &args, true);
    let connected = wait_line(&mut g, &["NATS connected", "server=\"n", " at 127.0.0.1:"]);
    let first = node_in(&connected);
    nats.nodes[first] = None; // SIGKILL
    let gone = wait_line(&mut g, &["NATS disconnected", "server=\"n"]);
    assert_eq!(node_in(&gone), first, "{gone}");
    let back = wait_line(&mut g, &["NATS reconnected", "server=\"n"]);
    assert_ne!(node_in(&back), first, "{back}");
    for line in g.stderr_lines() {
        assert!(
            !line.contains("s3cret-pw"),
            "a credential in the log: {line}"
        );
    }
}
