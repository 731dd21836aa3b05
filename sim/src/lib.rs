//! `sim`: a deterministic simulator of the log and of the clients of one gateway node. From
//! one seed, on one thread, with its own PRNG (no wall clock, no hash-map order in any
//! decision), it runs the real `log_store::Log` — appends, group commit, reads, the resume
//! planner, retention, recovery on reopen — over a simulated disk that keeps only what was
//! made durable, against publishers and subscribers that are cut at any byte and resume, and
//! checks the project's invariants at every step (see `README.md`).
//!
//! # Layout
//! - [`rng`]: the seeded PRNG, the only source of choices.
//! - [`trace`]: the hash of one seed's trace, and its counts.
//! - [`disk`]: the directory under `/dev/shm`, durable images, torn pages at a crash, and the
//!   `log_store::sim` hook (flushes seen; EIO and ENOSPC injected).
//! - [`truth`]: the oracle: every event appended, acknowledged and observed.
//! - [`node`]: the gateway's use of the log: publishes (`gateway::streams::publish`) and their
//!   answers, the group commit, retention, background jobs, where a subscription starts
//!   (`gateway::streams::resume::start` over `gateway::streams::parked`).
//! - [`conn`]: the node's side of a connection — the gateway's own `streams::sub::Sub` (send
//!   window, refill, sends, ACK confirmations, parking) over a simulated kernel and network.
//! - [`sse`]: the client's parser.
//! - [`clients`]: subscribers, what each must observe, and the checks of what it reads.
//! - [`world`], `drive`: one seed's world and its steps.
//! - [`whole`]: the whole node (`--whole`): the gateway's real per-core loop over a simulated
//!   kernel (the `uring::Ring` seam) and disk, against HTTP clients.
#![deny(unsafe_code)] // allowed only in `whole`'s kernel and clients (raw socket calls)

pub mod clients;
pub mod conn;
pub mod disk;
mod drive;
pub mod node;
pub mod rng;
pub mod sse;
pub mod trace;
pub mod truth;
pub mod whole;
pub mod world;

use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};

/// What one seed did.
#[derive(Debug, Clone)]
pub struct SeedReport {
    pub seed: u64,
    /// Hash of the trace (0 if the run panicked).
    pub hash: u64,
    pub events: u64,
    pub faults: u64,
    pub steps: u64,
    /// How often each kind of step, fault and observation happened.
    pub counts: std::collections::BTreeMap<&'static str, u64>,
    /// The first failed check (or panic), if any.
    pub violation: Option<String>,
}

thread_local! {
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Replaces the panic hook by one that keeps the message (with its location) for the report
/// instead of printing it: a panic inside a seed is a violation, reported once.
pub fn quiet_panics() {
    panic::set_hook(Box::new(|info| {
        let msg = match info.payload().downcast_ref::<&str>() {
            Some(s) => (*s).to_owned(),
            None => info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "panic".into()),
        };
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{at}")));
    }));
}

/// Runs one seed to its end or its first violation.
pub fn run_seed(seed: u64) -> SeedReport {
    report(seed, || {
        let mut w = world::World::new(seed)?;
        let r = w.run();
        let t = std::mem::take(&mut w.trace);
        let r = r.map_err(|v| format!("step {}: {v}", w.step));
        Ok((t.clone(), t.events, w.step, r))
    })
}

/// What one run gave: its trace, events, steps and its check.
type Ran = (trace::Trace, u64, u64, Result<(), String>);

/// Runs `f` (one seed) with panics caught as violations.
fn report(seed: u64, f: impl FnOnce() -> Result<Ran, String>) -> SeedReport {
    let mut report = SeedReport {
        seed,
        hash: 0,
        events: 0,
        faults: 0,
        steps: 0,
        counts: Default::default(),
        violation: None,
    };
    let r = panic::catch_unwind(AssertUnwindSafe(|| {
        let (t, events, steps, r) = f()?;
        report.hash = t.hash();
        report.events = events;
        report.faults = t.faults;
        report.steps = steps;
        report.counts = t.counts;
        r
    }));
    report.violation = match r {
        Ok(Ok(())) => None,
        Ok(Err(v)) => Some(v),
        Err(_) => {
            let msg = PANIC.with(|p| p.borrow_mut().take());
            Some(format!("panic: {}", msg.unwrap_or_default()))
        }
    };
    report
}
