//! Checks the systemd deployment files (`deploy/`): the unit keeps the hardening and operating
//! directives the gateway's README and `deploy/README.md` promise (and none that would break
//! io_uring), and every flag in the example `gateway.env` is one the built binary knows. Reads
//! files and runs `gateway --help`; starts no service.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::Command;

/// The `[Service]` section of `deploy/gateway.service` as `(key, value)` lines, in order
/// (comments and blank lines dropped; a key may repeat).
fn service_directives() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy_dir().join("gateway.service"))
        .expect("read deploy/gateway.service");
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not a directive: {line:?}"));
        if section == "[Service]" {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every value of `key` in `[Service]`.
fn values<'a>(d: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    d.iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The one value of `key` (panics if it is missing or set twice).
fn single<'a>(d: &'a [(String, String)], key: &str) -> &'a str {
    match values(d, key).as_slice() {
        [v] => v,
        [] => panic!("deploy/gateway.service: [Service] lacks {key}="),
        many => panic!("deploy/gateway.service: {key}= set {} times", many.len()),
    }
}

#[test]
fn unit_has_the_required_directives() {
    let d = service_directives();
    for (key, want) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("StateDirectory", "gateway"),
        ("LimitNOFILE", "1048576"),
        ("Restart", "on-failure"),
        ("EnvironmentFile", "/etc/gateway/gateway.env"),
        ("KillSignal", "SIGTERM"),
        ("AmbientCapabilities", ""),
        ("CapabilityBoundingSet", ""),
        ("SystemCallArchitectures", "native"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
    ] {
        assert_eq!(single(&d, key), want, "deploy/gateway.service: {key}=");
    }
    assert!(
        !single(&d, "RestartSec").is_empty(),
        "RestartSec= needs a value"
    );
    let families: Vec<&str> = single(&d, "RestrictAddressFamilies")
        .split_whitespace()
        .collect();
    assert_eq!(families, ["AF_INET", "AF_INET6", "AF_UNIX"]);
    // The data directory is the state directory, and it is writable under ProtectSystem=strict.
    assert!(
        values(&d, "ReadWritePaths")
            .iter()
            .any(|v| v.split_whitespace().any(|p| p == "/var/lib/gateway")),
        "ReadWritePaths= must include /var/lib/gateway"
    );
    let exec = single(&d, "ExecStart");
    let words: Vec<&str> = exec.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"/usr/local/bin/gateway"), "{exec}");
    assert!(
        words
            .windows(2)
            .any(|w| w == ["--data-dir", "/var/lib/gateway"]),
        "ExecStart must pass --data-dir /var/lib/gateway (the StateDirectory): {exec}"
    );
    assert!(words.contains(&"$GATEWAY_ARGS"), "{exec}");
}

/// io_uring is the gateway's whole I/O path: a system-call allow-list must name its three calls,
/// and no deny-list may take them (or their group, @aio) away.
#[test]
fn unit_keeps_io_uring_allowed() {
    let d = service_directives();
    let io_uring = ["io_uring_setup", "io_uring_enter", "io_uring_register"];
    for filter in values(&d, "SystemCallFilter") {
        let filter = filter.trim();
        if let Some(denied) = filter.strip_prefix('~') {
            for name in denied.split_whitespace() {
                assert!(
                    !io_uring.contains(&name) && name != "@aio",
                    "SystemCallFilter={filter} denies {name}, which io_uring needs"
                );
            }
        } else {
            let allowed: Vec<&str> = filter.split_whitespace().collect();
            for name in io_uring {
                assert!(
                    allowed.contains(&name),
                    "SystemCallFilter={filter} must allow {name} explicitly"
                );
            }
        }
    }
    // Blocked calls fail with EPERM (the start-up probe then names seccomp) instead of SIGSYS.
    if !values(&d, "SystemCallFilter").is_empty() {
        assert_eq!(single(&d, "SystemCallErrorNumber"), "EPERM");
    }
}

/// Every flag in the example environment file exists in the built binary, and `--data-dir`
/// stays with the unit.
#[test]
fn env_example_uses_known_flags() {
    let text =
        std::fs::read_to_string(deploy_dir().join("gateway.env")).expect("read deploy/gateway.env");
    let args = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("GATEWAY_ARGS="))
        .expect("deploy/gateway.env sets GATEWAY_ARGS=");
    assert!(
        !args.contains('"') && !args.contains('\''),
        "GATEWAY_ARGS is split at whitespace by systemd: no quotes ({args})"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--help")
        .output()
        .expect("run gateway --help");
    assert!(out.status.success(), "gateway --help failed");
    let help = String::from_utf8_lossy(&out.stdout);
    let known: Vec<&str> = help
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| w.trim_end_matches(','))
        .collect();
    let flags: Vec<&str> = args
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
        .collect();
    assert!(!flags.is_empty(), "GATEWAY_ARGS names no flag");
    for flag in flags {
        assert!(
            known.contains(&flag),
            "deploy/gateway.env uses {flag}, which `gateway --help` does not list"
        );
        assert_ne!(
            flag, "--data-dir",
            "the unit sets --data-dir, not gateway.env"
        );
    }
}
