//! `gateway_build_info` and the standard `process_*` family, read from `/proc/self`.
#![forbid(unsafe_code)]

use std::fmt::Write as _;

use super::family;

/// `gateway_build_info` and the standard `process_*` family (from `/proc/self`).
pub(super) fn build_and_process(out: &mut String) {
    family(
        out,
        "gateway_build_info",
        "gauge",
        "The version and commit this binary was built from (always 1).",
    );
    let _ = writeln!(
        out,
        "gateway_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        crate::VERSION,
        crate::COMMIT
    );
    let p = process_figures();
    for (name, kind, help, v) in [
        (
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time spent in seconds.",
            p.cpu_seconds,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            p.resident_bytes,
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            p.virtual_bytes,
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            p.open_fds,
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            p.max_fds,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            p.start_time_seconds,
        ),
    ] {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    }
}

/// What `process_*` reports (0 where `/proc` could not say).
#[derive(Debug, Default, PartialEq)]
struct ProcessFigures {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    open_fds: f64,
    max_fds: f64,
    start_time_seconds: f64,
}

fn process_figures() -> ProcessFigures {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    let page = rustix::param::page_size() as f64;
    let btime = read("/proc/stat")
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    let mut p = parse_stat(&read("/proc/self/stat"), ticks, page, btime);
    p.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()) as f64;
    p.max_fds = read("/proc/self/limits")
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse::<f64>().ok())
        .unwrap_or(0.0);
    p
}

/// `/proc/self/stat`: fields after the command name's closing parenthesis (which may itself
/// hold spaces and parentheses). utime and stime are fields 14 and 15, starttime 22, vsize 23,
/// rss (pages) 24 — numbered from 1 as in proc(5).
fn parse_stat(stat: &str, ticks: f64, page: f64, btime: f64) -> ProcessFigures {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return ProcessFigures::default();
    };
    // `rest` starts with field 3 (state).
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let at = |n: usize| f.get(n - 3).copied().unwrap_or(0.0);
    ProcessFigures {
        cpu_seconds: (at(14) + at(15)) / ticks,
        start_time_seconds: btime + at(22) / ticks,
        virtual_bytes: at(23),
        resident_bytes: at(24) * page,
        ..ProcessFigures::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        // comm "a) (b" holds both parentheses and a space.
        let mut stat = String::from("42 (a) (b) S");
        for n in 4..=24 {
            stat.push_str(&format!(" {n}"));
        }
        let p = parse_stat(&stat, 100.0, 4096.0, 1000.0);
        assert_eq!(p.cpu_seconds, (14.0 + 15.0) / 100.0);
        assert_eq!(p.start_time_seconds, 1000.0 + 0.22);
        assert_eq!(p.virtual_bytes, 23.0);
        assert_eq!(p.resident_bytes, 24.0 * 4096.0);
        assert_eq!(
            parse_stat("garbage", 100.0, 4096.0, 0.0),
            ProcessFigures::default()
        );
    }
}
