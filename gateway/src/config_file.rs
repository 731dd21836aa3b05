//! Where the flags' values come from: the command line, `GATEWAY_<FLAG>` environment variables,
//! a TOML file (`--config FILE`), the defaults — in that order of precedence. Every flag is a
//! key of the same name in its group's table (`[listener]`, `[storage]`, `[limits]`, `[auth]`,
//! `[tls]`, `[cluster]`, `[mcp]`, `[log]`), and `--help` shows the flags under the same groups.
//!
//! The file's values become the flags' defaults before the command line is parsed, so clap
//! applies the precedence and every value goes through the flag's own parser. A key that is
//! not a flag of its table, a value of the wrong type or one its flag refuses is an error naming
//! the file and the key. `gateway check-config` prints the effective configuration (with the
//! source of each value, secrets redacted) or the errors.
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory, FromArgMatches};

use crate::config::Config;

/// The groups: table name and `--help` heading, in order.
pub const GROUPS: [(&str, &str); 8] = [
    ("listener", "Listener"),
    ("storage", "Storage"),
    ("limits", "Limits"),
    ("auth", "Authentication"),
    ("tls", "TLS"),
    ("cluster", "Cluster (NATS JetStream)"),
    ("mcp", "MCP front"),
    ("log", "Logging"),
];

/// The table of a flag (its long name): by prefix, then by name; every other flag is a limit.
pub fn group_of(long: &str) -> &'static str {
    const LISTENER: &[&str] = &[
        "listen",
        "admin-listen",
        "admin-connections-max",
        "admin-timeout-secs",
        "cores",
        "listen-cores-max",
        "insecure-no-auth",
        "cors-allow-origin",
        "notsent-lowat-bytes",
        "no-tx-timestamps",
        "tx-ack-interval-ms",
        "keepalive-secs",
        "retry-ms",
        "metrics-per-stream",
        "metrics-per-stream-max",
    ];
    const STORAGE: &[&str] = &[
        "data-dir",
        "shards-on-create",
        "segment-bytes",
        "retain-bytes",
        "retain-secs",
        "fsync",
        "fsync-scope",
        "group-commit-hold-us-max",
        "stream-idle-expire-secs",
    ];
    let prefixed = |p: &[&str]| p.iter().any(|p| long.starts_with(p));
    match long {
        _ if prefixed(&["jwt-", "anonymous-"]) => "auth",
        _ if prefixed(&["tls-"]) => "tls",
        _ if prefixed(&["nats-", "cluster-"]) => "cluster",
        _ if prefixed(&["mcp-", "upstream-"]) => "mcp",
        _ if prefixed(&["log-", "access-log"]) => "log",
        _ if LISTENER.contains(&long) => "listener",
        _ if STORAGE.contains(&long) => "storage",
        _ => "limits",
    }
}

/// `--data-dir` → `GATEWAY_DATA_DIR`.
pub fn env_name(long: &str) -> String {
    format!("GATEWAY_{}", long.to_ascii_uppercase().replace('-', "_"))
}

/// Flags that take a value or are switches (not `--help` / `--version`).
fn is_flag(a: &Arg) -> bool {
    a.get_long().is_some() && !matches!(a.get_action(), ArgAction::Help | ArgAction::Version)
}

/// The gateway's command: the derived flags, each under its group's heading and with its
/// environment variable, plus `--config`.
pub fn command() -> Command {
    let heading = |long: &str| {
        let g = group_of(long);
        GROUPS.iter().find(|(t, _)| *t == g).map(|(_, h)| *h)
    };
    Config::command()
        .mut_args(move |a| {
            if !is_flag(&a) {
                return a;
            }
            let long = a.get_long().expect("is_flag").to_string();
            // hide_env_values: --help must not print a variable's value (a NATS URL may carry
            // a password).
            a.help_heading(heading(&long))
                .env(env_name(&long))
                .hide_env_values(true)
        })
        .arg(
            Arg::new("config")
                .long("config")
                .value_name("FILE")
                .env("GATEWAY_CONFIG")
                .hide_env_values(true)
                .value_parser(clap::value_parser!(PathBuf))
                .help(
                    "A TOML file of flags: each flag is a key of its group's table \
                     ([listener], [storage], [limits], [auth], [tls], [cluster], [mcp], [log]). \
                     A flag on the command line wins over its GATEWAY_<FLAG> variable, which \
                     wins over the file.",
                ),
        )
}

/// A loaded configuration and where its values came from.
#[derive(Debug)]
pub struct Loaded {
    pub cfg: Config,
    matches: ArgMatches,
    /// The flags (long names) the file set.
    file_keys: Vec<String>,
}

/// Parses the command line, the environment and the `--config` file.
pub fn load(args: Vec<OsString>) -> Result<Loaded, Failure> {
    let cmd = command();
    let first = cmd
        .clone()
        .try_get_matches_from(&args)
        .map_err(Failure::Clap)?;
    let (cmd, file_keys) = match first.get_one::<PathBuf>("config") {
        None => (cmd, Vec::new()),
        Some(file) => with_file(cmd, file).map_err(Failure::File)?,
    };
    let matches = cmd.try_get_matches_from(&args).map_err(Failure::Clap)?;
    let cfg = Config::from_arg_matches(&matches).map_err(Failure::Clap)?;
    Ok(Loaded {
        cfg,
        matches,
        file_keys,
    })
}

/// Why the configuration could not be loaded.
#[derive(Debug)]
pub enum Failure {
    /// The command line or an environment variable (clap says which, with usage).
    Clap(clap::Error),
    /// The file: every error found, each naming the file and the key.
    File(Vec<String>),
}

/// The command with the file's values as the flags' defaults, and the keys the file set.
fn with_file(mut cmd: Command, file: &Path) -> Result<(Command, Vec<String>), Vec<String>> {
    let shown = file.display();
    let text = std::fs::read_to_string(file).map_err(|e| vec![format!("{shown}: {e}")])?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| vec![format!("{shown}: {e}")])?;
    let mut errors = Vec::new();
    let mut values = Vec::new();
    for (group, v) in &table {
        let Some(keys) = v.as_table() else {
            errors.push(format!(
                "{shown}: `{group}` is not a table: every key belongs to one of [{}]",
                tables()
            ));
            continue;
        };
        if !GROUPS.iter().any(|(t, _)| t == group) {
            errors.push(format!(
                "{shown}: unknown table [{group}]; the tables are [{}]",
                tables()
            ));
            continue;
        }
        for (key, v) in keys {
            match file_value(&cmd, group, key, v) {
                Ok(vals) => values.push((key.clone(), vals)),
                Err(e) => errors.push(format!("{shown}: [{group}] {key}: {e}")),
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut keys = Vec::new();
    for (key, vals) in values {
        let id = flag_id(&cmd, &key).expect("checked by file_value");
        cmd = cmd.mut_arg(id, |a| a.default_values(vals));
        keys.push(key);
    }
    Ok((cmd, keys))
}

fn tables() -> String {
    GROUPS.map(|(t, _)| t).join("], [")
}

/// The id of the flag whose long name is `long`.
fn flag_id(cmd: &Command, long: &str) -> Option<String> {
    cmd.get_arguments()
        .find(|a| is_flag(a) && a.get_long() == Some(long))
        .map(|a| a.get_id().to_string())
}

/// One key's value as the flag's value strings, checked by the flag's own parser.
fn file_value(
    cmd: &Command,
    group: &str,
    key: &str,
    v: &toml::Value,
) -> Result<Vec<String>, String> {
    let arg = cmd
        .get_arguments()
        .find(|a| is_flag(a) && a.get_long() == Some(key) && a.get_id() != "config")
        .ok_or_else(|| "not a flag (keys are the flags' names, e.g. data-dir)".to_string())?;
    let want = group_of(key);
    if want != group {
        return Err(format!("belongs in [{want}]"));
    }
    let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    let repeatable = matches!(arg.get_action(), ArgAction::Append);
    let scalar = |v: &toml::Value| match v {
        toml::Value::String(s) if !switch => Ok(s.clone()),
        toml::Value::Integer(i) if !switch => Ok(i.to_string()),
        toml::Value::Boolean(b) if switch => Ok(b.to_string()),
        _ if switch => Err("expected true or false".to_string()),
        _ => Err("expected a string or an integer".to_string()),
    };
    let vals = match v {
        toml::Value::Array(items) if repeatable => {
            items.iter().map(scalar).collect::<Result<_, _>>()?
        }
        toml::Value::Array(_) => return Err("takes one value, not a list".into()),
        one => vec![scalar(one)?],
    };
    if !switch {
        // The flag's own parser, alone (its relations to other flags are checked at start).
        let alone = Arg::new("v")
            .long(key.to_string())
            .value_parser(arg.get_value_parser().clone());
        let check = Command::new("gateway").no_binary_name(true).arg(alone);
        for s in &vals {
            check
                .clone()
                .try_get_matches_from([format!("--{key}"), s.clone()])
                .map_err(|e| {
                    let e = e.to_string();
                    let first = e.lines().next().unwrap_or_default();
                    first.trim_start_matches("error: ").to_string()
                })?;
        }
    }
    Ok(vals)
}

/// The effective configuration as a TOML document: every flag in its table, with where its
/// value came from. Values that may hold credentials are redacted: the user information of
/// URLs, and every word of `--upstream-cmd` after the program.
pub fn describe(loaded: &Loaded) -> String {
    let (m, cmd) = (&loaded.matches, command());
    let mut out = String::new();
    for (table, _) in GROUPS {
        let _ = writeln!(out, "[{table}]");
        for a in cmd
            .get_arguments()
            .filter(|a| is_flag(a) && a.get_id() != "config")
        {
            let long = a.get_long().expect("is_flag");
            if group_of(long) != table || a.is_hide_set() {
                continue;
            }
            let id = a.get_id().as_str();
            let vals: Vec<String> = m
                .get_raw(id)
                .map(|r| r.map(|v| redact(long, &v.to_string_lossy())).collect())
                .unwrap_or_default();
            let source = match m.value_source(id) {
                Some(ValueSource::CommandLine) => "command line",
                Some(ValueSource::EnvVariable) => "environment",
                Some(ValueSource::DefaultValue) if loaded.file_keys.iter().any(|k| k == long) => {
                    "file"
                }
                Some(ValueSource::DefaultValue) => "default",
                _ => "unset",
            };
            let value = match (vals.len(), matches!(a.get_action(), ArgAction::Append)) {
                (0, _) => continue,
                (_, true) => format!(
                    "[{}]",
                    vals.iter()
                        .map(|v| quoted(v))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => quoted(&vals[0]),
            };
            let _ = writeln!(out, "{long} = {value}  # {source}");
        }
        out.push('\n');
    }
    out
}

/// A value as TOML: integers and booleans bare, anything else a basic string (JSON's string
/// escapes are a subset of TOML's).
fn quoted(v: &str) -> String {
    if v.parse::<i64>().is_ok() || v == "true" || v == "false" {
        v.to_string()
    } else {
        serde_json::to_string(v).expect("a string serializes")
    }
}

fn redact(long: &str, v: &str) -> String {
    match long {
        "nats-url" | "upstream-url" => cluster::names::redact_url(v),
        "upstream-cmd" => {
            let mut words = v.split_whitespace();
            let program = words.next().unwrap_or_default();
            match words.count() {
                0 => program.to_string(),
                n => format!("{program} <{n} more words redacted>"),
            }
        }
        _ => v.to_string(),
    }
}

#[cfg(test)]
mod tests;
