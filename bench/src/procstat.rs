//! Server resource figures read from `/proc/<pid>`: CPU time (utime + stime from `stat`) and
//! memory (`VmRSS`, `VmHWM` from `status`), summed over a set of processes (nginx's master and
//! workers). Parsing is pure; only [`sample`] and [`children_of`] touch the file system.
//!
//! It does not see kernel memory (socket buffers): RSS is the process's user-space memory.

/// Why a process could not be sampled.
#[derive(Debug)]
pub enum ProcError {
    /// `/proc/<pid>/...` could not be read (the process is gone?).
    Read {
        pid: u32,
        file: &'static str,
        err: std::io::Error,
    },
    /// The file did not have the expected shape.
    Parse { pid: u32, file: &'static str },
}

impl std::fmt::Display for ProcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProcError::Read { pid, file, err } => {
                write!(f, "cannot read /proc/{pid}/{file}: {err}")
            }
            ProcError::Parse { pid, file } => write!(f, "unexpected format in /proc/{pid}/{file}"),
        }
    }
}

/// Summed figures of a set of processes at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// utime + stime in clock ticks.
    pub cpu_ticks: u64,
    /// Current resident set, KiB.
    pub rss_kib: u64,
    /// Peak resident set (high-water mark), KiB.
    pub hwm_kib: u64,
    /// Time the processes' threads were runnable but waiting for a CPU, ns (summed over
    /// `/proc/<pid>/task/*/schedstat`): how much a shared, busy core held the server back.
    pub runqueue_wait_ns: u64,
}

/// (utime, stime) from the text of `/proc/<pid>/stat`. The command name may contain spaces
/// and parentheses, so fields are counted after the last `)`.
pub fn parse_stat(text: &str) -> Option<(u64, u64)> {
    let after = &text[text.rfind(')')? + 1..];
    let mut f = after.split_ascii_whitespace();
    // After ")": state(3) ppid(4) ... utime is field 14, stime 15 (1-based over the whole line).
    let utime = f.nth(11)?.parse().ok()?;
    let stime = f.next()?.parse().ok()?;
    Some((utime, stime))
}

/// The parent pid from `/proc/<pid>/stat` text.
pub fn parse_ppid(text: &str) -> Option<u32> {
    let after = &text[text.rfind(')')? + 1..];
    after.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// (VmRSS, VmHWM) in KiB from the text of `/proc/<pid>/status`.
pub fn parse_status(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// The run-queue wait (second field, ns) of a `schedstat` line.
pub fn parse_schedstat_wait(text: &str) -> Option<u64> {
    text.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// Run-queue wait of every thread of `pid`, summed (0 when unreadable: threads come and go).
fn runqueue_wait_ns(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|t| parse_schedstat_wait(&t))
        .sum()
}

/// Sample and sum `pids`.
pub fn sample(pids: &[u32]) -> Result<ProcSample, ProcError> {
    let mut s = ProcSample::default();
    for &pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|err| {
            ProcError::Read {
                pid,
                file: "stat",
                err,
            }
        })?;
        let (u, st) = parse_stat(&stat).ok_or(ProcError::Parse { pid, file: "stat" })?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|err| {
            ProcError::Read {
                pid,
                file: "status",
                err,
            }
        })?;
        let (rss, hwm) = parse_status(&status).ok_or(ProcError::Parse {
            pid,
            file: "status",
        })?;
        s.cpu_ticks += u + st;
        s.rss_kib += rss;
        s.hwm_kib += hwm;
        s.runqueue_wait_ns += runqueue_wait_ns(pid);
    }
    Ok(s)
}

/// Direct children of `pid` (nginx workers of the master), by scanning `/proc/*/stat`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat"))
            && parse_ppid(&stat) == Some(pid)
        {
            out.push(child);
        }
    }
    out.sort_unstable();
    out
}

/// Clock ticks per second for converting `cpu_ticks`.
pub fn ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_awkward_comm() {
        let t = "1234 (nginx: worker (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 57 31 0 0 20 0 1 0 5 100 10 0";
        assert_eq!(parse_stat(t), Some((57, 31)));
        assert_eq!(parse_ppid(t), Some(1));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn status_fields() {
        let t = "Name:\tx\nVmHWM:\t   2048 kB\nVmRSS:\t    1024 kB\n";
        assert_eq!(parse_status(t), Some((1024, 2048)));
        assert_eq!(parse_status("Name: x\n"), None);
    }

    #[test]
    fn schedstat_wait_field() {
        assert_eq!(parse_schedstat_wait("123 456 7\n"), Some(456));
        assert_eq!(parse_schedstat_wait("123"), None);
    }

    #[test]
    fn samples_this_process() {
        let me = std::process::id();
        let s = sample(&[me]).unwrap();
        assert!(s.rss_kib > 0 && s.hwm_kib >= s.rss_kib);
        assert!(matches!(sample(&[u32::MAX]), Err(ProcError::Read { .. })));
    }
}
