//! Checks the systemd deployment files (`deploy/`): the unit keeps the hardening and operating
//! directives the gateway's README and `deploy/README.md` promise (and none that would break
//! io_uring or a Node upstream), `systemd-analyze verify` accepts it, the example
//! `gateway.toml` passes `gateway check-config`, and the metrics and alert rules pass `promtool`.
//! Starts no service.
#![forbid(unsafe_code)]

mod common;

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
        ("EnvironmentFile", "-/etc/gateway/gateway.env"),
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("WatchdogSec", "30s"),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("KillSignal", "SIGTERM"),
        ("AmbientCapabilities", ""),
        ("CapabilityBoundingSet", ""),
        ("SystemCallArchitectures", "native"),
        ("LockPersonality", "yes"),
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
    assert!(
        words
            .windows(2)
            .any(|w| w == ["--config", "/etc/gateway/gateway.toml"]),
        "ExecStart must read /etc/gateway/gateway.toml: {exec}"
    );
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

/// The example configuration is one `gateway check-config` accepts, and leaves `--data-dir` to
/// the unit.
#[test]
fn config_example_is_valid() {
    let file = deploy_dir().join("gateway.toml");
    let text = std::fs::read_to_string(&file).expect("read deploy/gateway.toml");
    assert!(
        !text.contains("\ndata-dir"),
        "the unit sets --data-dir, not gateway.toml"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("check-config")
        .arg("--config")
        .arg(&file)
        .output()
        .expect("run gateway check-config");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{shown}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        shown.contains("listen = \"0.0.0.0:8080\"  # file"),
        "{shown}"
    );
    assert!(shown.contains("log-format = \"json\"  # file"), "{shown}");
}

/// A tool the deployment tests run: `$VAR`, else `name` on PATH; panics naming the setup
/// script when it is missing.
fn tool(var: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found (${var} or PATH): run `bash scripts/setup-ops.sh`")
        })
}

/// `systemd-analyze verify` accepts the unit with no warning (it checks every directive's
/// value and that ExecStart= is executable, so the binary's path is swapped for the build's).
#[test]
fn systemd_analyze_verifies_the_unit() {
    let analyze = tool("SYSTEMD_ANALYZE", "systemd-analyze");
    let unit = std::fs::read_to_string(deploy_dir().join("gateway.service")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/gateway", env!("CARGO_BIN_EXE_gateway")),
    )
    .unwrap();
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    silent_success(&out, "systemd-analyze verify");
}

/// The tool exited 0 and printed nothing (no warning either).
fn silent_success(out: &std::process::Output, what: &str) {
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "{what}: {said}"
    );
}

/// Runs `node -e …` under what the unit applies to the gateway's process tree that this test
/// can reproduce without systemd: NoNewPrivileges (prctl PR_SET_NO_NEW_PRIVS) and, if set,
/// MemoryDenyWriteExecute (prctl PR_SET_MDWE, which the kernel keeps across fork and exec).
/// Returns whether Node printed its line.
fn node_runs_with(no_new_privs: bool, mdwe: bool) -> bool {
    let script = format!(
        "import ctypes, os\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         if {nnp}: assert libc.prctl(38, 1, 0, 0, 0) == 0, 'PR_SET_NO_NEW_PRIVS'\n\
         if {mdwe}: assert libc.prctl(65, 1, 0, 0, 0) == 0, 'PR_SET_MDWE'\n\
         os.execvp('node', ['node', '-e', 'console.log(\"node ran\")'])\n",
        nnp = if no_new_privs { "True" } else { "False" },
        mdwe = if mdwe { "True" } else { "False" },
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3");
    String::from_utf8_lossy(&out.stdout).contains("node ran")
}

/// A Node MCP upstream (`upstream-cmd = "npx …"`) starts under the unit's restrictions. Node's
/// JIT aborts under MemoryDenyWriteExecute, which is why the unit leaves it out.
#[test]
fn a_node_upstream_starts_under_the_units_restrictions() {
    assert!(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .any(|d| d.join("node").is_file()),
        "node not on PATH (Debian's nodejs, or scripts/setup-node.sh's .tools/node22/bin)"
    );
    let d = service_directives();
    let nnp = values(&d, "NoNewPrivileges") == ["yes"];
    let mdwe = values(&d, "MemoryDenyWriteExecute") == ["yes"];
    assert!(nnp, "the unit keeps NoNewPrivileges=yes");
    assert!(
        node_runs_with(nnp, mdwe),
        "node does not start under the unit's NoNewPrivileges={nnp} MemoryDenyWriteExecute={mdwe}"
    );
    // The check has teeth: MDWE does stop Node on this kernel.
    assert!(!node_runs_with(nnp, true), "node ran under PR_SET_MDWE");
}

/// The metric family an expression's `gateway_…` / `process_…` names belong to.
fn families_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find(|c: char| c.is_ascii_lowercase()) {
        rest = &rest[i..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let word = &rest[..end];
        if word.starts_with("gateway_") || word.starts_with("process_") {
            let base = word.trim_end_matches("_bucket");
            out.push(base.to_string());
        }
        rest = &rest[end..];
    }
    out
}

/// `promtool check metrics` finds nothing to say about a live gateway's `/metrics`, the alert
/// rules pass `promtool check rules`, and every family the rules and the dashboard read is one
/// the gateway exports.
#[test]
fn promtool_accepts_the_metrics_and_the_rules() {
    let promtool = tool("PROMTOOL", "promtool");
    let mut g = common::Gateway::start(&[]);
    common::publish(g.addr, "s", "x");
    let (_, _, body) = common::request(g.admin_addr, "GET", "/metrics", &[], b"");
    assert!(g.stop());
    let text = String::from_utf8(body).unwrap();
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    silent_success(&out, "promtool check metrics");
    let rules = deploy_dir().join("alerts.yml");
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let exported: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let dashboard = std::fs::read_to_string(deploy_dir().join("grafana-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard JSON");
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    let alerts = std::fs::read_to_string(&rules).unwrap();
    exprs.extend(
        alerts
            .lines()
            .filter_map(|l| l.trim().strip_prefix("expr: "))
            .map(String::from),
    );
    assert!(exprs.len() > 10);
    for e in &exprs {
        for f in families_in(e) {
            // Histograms are exported under their base name's `# TYPE`.
            let base = f.trim_end_matches("_sum").trim_end_matches("_count");
            assert!(exported.contains(&base), "{f} (in {e}) is not exported");
        }
    }
}
