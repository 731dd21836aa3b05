//! Which threads run at `SCHED_IDLE`: the access log's writer (it may lag or drop lines, and
//! must never delay a reactor). The reactors and the log's helper threads keep the normal
//! policy: a starved `log-prepare` leaves its pre-faulting to the writer (tried and measured
//! in session 17, BENCHMARKS.md).
#![forbid(unsafe_code)]

mod common;

use common::Gateway;

/// `SCHED_IDLE` and `SCHED_OTHER` (sched(7)).
const SCHED_IDLE: u32 = 5;
const SCHED_OTHER: u32 = 0;

/// Each thread of `pid`: its name and scheduling policy (proc_pid_stat(5), field 41).
fn threads(pid: u32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(stat) = std::fs::read_to_string(task.unwrap().path().join("stat")) else {
            continue; // a thread that ended meanwhile
        };
        let (open, close) = (stat.find('(').unwrap(), stat.rfind(')').unwrap());
        let name = stat[open + 1..close].to_owned();
        // Fields after the name start with field 3 (state): field 41 is the 39th of them.
        let policy = stat[close + 1..].split_whitespace().nth(38).unwrap();
        out.push((name, policy.parse().unwrap()));
    }
    out
}

/// The writer sets its own policy when it starts, which may come a moment after the gateway
/// listens on a loaded machine: the check is retried (bounded) before it fails.
#[test]
fn only_the_access_log_writer_runs_at_sched_idle() {
    let g = Gateway::start(&["--cores", "2"]);
    let want = [
        ("log-prepare", SCHED_OTHER),
        ("log-retire", SCHED_OTHER),
        ("access-log", SCHED_IDLE),
        ("core-0", SCHED_OTHER),
        ("core-1", SCHED_OTHER),
    ];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let all = threads(g.child.id());
        let got: Vec<(&str, Vec<u32>)> = (want.iter())
            .map(|(name, _)| {
                let p = all.iter().filter(|(n, _)| n == name).map(|(_, p)| *p);
                (*name, p.collect())
            })
            .collect();
        let ok = (got.iter().zip(&want)).all(|((_, p), (_, w))| p.as_slice() == [*w]);
        if ok {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{got:?} in {all:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
