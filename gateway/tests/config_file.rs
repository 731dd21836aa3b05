//! `--config FILE`, `GATEWAY_<FLAG>` variables and `gateway check-config`, as an operator runs
//! them: precedence flag > environment > file > default, errors that name the file and key.
#![forbid(unsafe_code)]

use std::process::{Command, Output};

fn check(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gateway"));
    c.arg("check-config").args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn toml(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(f.path(), text).unwrap();
    f
}

#[test]
fn a_flag_beats_its_variable_which_beats_the_file() {
    let f = toml(
        "[listener]\ncores = 3\nretry-ms = 700\n[storage]\nfsync = \"never\"\nsegment-bytes = 2097152\n",
    );
    let path = f.path().to_str().unwrap();
    let out = check(
        &["--config", path, "--cores", "1"],
        &[("GATEWAY_CORES", "2"), ("GATEWAY_FSYNC", "always")],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "cores = 1  # command line",
        "fsync = \"always\"  # environment",
        "retry-ms = 700  # file",
        "segment-bytes = 2097152  # file",
        "listen = \"127.0.0.1:8080\"  # default",
        "[mcp]",
    ] {
        assert!(text.contains(want), "{want} in\n{text}");
    }
    // The file can also be named by GATEWAY_CONFIG.
    let out = check(&[], &[("GATEWAY_CONFIG", path)]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("retry-ms = 700  # file"));
}

#[test]
fn a_bad_file_or_combination_exits_2_with_the_errors() {
    let f = toml("[limits]\nevent-bytes-max = \"big\"\nno-such-flag = 1\n");
    let out = check(&["--config", f.path().to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[limits] event-bytes-max"), "{err}");
    assert!(err.contains("[limits] no-such-flag: not a flag"), "{err}");
    assert!(err.contains(f.path().to_str().unwrap()), "{err}");
    // A value each flag accepts alone, but not together (validate()).
    let f = toml("[limits]\nsend-bytes-max = 10\n");
    let out = check(&["--config", f.path().to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--send-bytes-max"));
    // A missing file.
    let out = check(&["--config", "/nonexistent/gateway.toml"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/gateway.toml"));
}

#[test]
fn help_is_grouped_and_version_names_the_commit() {
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    // clap orders the headings by their first flag's place in the code.
    for heading in [
        "Listener:",
        "Storage:",
        "Limits:",
        "Authentication:",
        "TLS:",
        "Cluster (NATS JetStream):",
        "MCP front:",
        "Logging:",
    ] {
        assert!(
            help.contains(&format!("\n{heading}\n")),
            "{heading} in\n{help}"
        );
    }
    assert!(help.contains("[env: GATEWAY_DATA_DIR]"), "{help}");
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(
        v.contains("commit ") && v.contains(env!("CARGO_PKG_VERSION")),
        "{v}"
    );
}
