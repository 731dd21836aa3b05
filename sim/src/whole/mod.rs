//! The whole node under simulation (`--whole`): the gateway's real per-core loop
//! (`gateway::core::SteppedCore`: the connection machine, HTTP parsing, publishing, the
//! streams, send windows, parked windows, the group commit, the tick) and the real log, over
//! the simulated kernel ([`ring`]) and disk ([`crate::disk`]), against HTTP clients
//! ([`client`]). One seed, one thread.
//!
//! Each step: the clients act (write a piece of a request, read a few bytes or many, cut),
//! the kernel visits what is in flight, the core takes a turn, the clock moves 1 ms. By the
//! seed, the node crashes: every segment page torn between its current and durable bytes, the
//! log reopened from what remains and a new core started; a failed `fdatasync` (the log is
//! poisoned) is followed by a crash too. The last 400 steps are quiet (no faults, no cuts,
//! every reader fast; publishers go on calmly for the first 200): an event acknowledged while
//! a subscriber was caught up must reach it within 20 steps, and at the end every publish has
//! its answer and every subscriber has caught up or is still making progress. 1 or 2 cores,
//! each with its ring, listener and shard: requests for the other core's streams are handed
//! over as in the gateway.
//!
//! Checked at every step: each subscriber observes exactly the suffix after its
//! `Last-Event-ID` (or from the start), every event byte-for-byte what was published and
//! never twice; each refused ID gets 400; a `201` names IDs whose events are the ones sent.
//! After every crash: every event acknowledged or shown is in the recovered log, unchanged.
//! Operations in flight stay within a few per connection.

mod checks;
pub mod client;
mod config;
mod mcp;
pub mod mcp_client;
mod node;
pub mod ring;
pub mod tls;
pub mod upstream;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway::core::{CoreSetup, Shared, SteppedCore};
use log_store::{Epoch, Log, LogOptions};

use crate::disk::Disk;
use crate::rng::Rng;
use client::{Check, ClientConn, PubOutcome, Publisher, StreamTruth, Subscriber};
use config::{WholeConfig, gateway_config};
use mcp_client::McpClient;
use node::Node;
use ring::{Kernel, SimRing};

const SEGMENT_BYTES: u64 = 64 * 1024;
/// Steps at the end without faults, for the subscribers to catch up.
const QUIET_STEPS: u64 = 400;
/// The first of the quiet steps still publish (calmly): an event acknowledged while a
/// subscriber was caught up must reach it within [`WAKE_STEPS_MAX`] steps (the tick, which
/// would mask a lost wake-up, is 100).
const CALM_STEPS: u64 = 200;
const WAKE_STEPS_MAX: u64 = 20;

/// One seed's whole node and its clients.
pub struct World {
    pub seed: u64,
    rng: Rng,
    cfg: WholeConfig,
    disk: Rc<Disk>,
    kernel: Rc<RefCell<Kernel>>,
    cores: Vec<SteppedCore>,
    /// What the running node's cores share (its metrics are read for the trace).
    shared: Option<Arc<Shared>>,
    /// The node's certificate and the clients' TLS configuration (TLS seeds).
    tls: Option<tls::TlsSetup>,
    gw: gateway::config::Config,
    opts: LogOptions,
    pubs: Vec<Publisher>,
    subs: Vec<Subscriber>,
    truths: Vec<StreamTruth>,
    /// The MCP front: what the seed drew for it (from `mrng`), its upstreams, its clients and
    /// the last step each made progress.
    mcp_cfg: mcp::McpConfig,
    mrng: Rng,
    upstreams: upstream::SimUpstreams,
    mcps: Vec<McpClient>,
    mcp_progress: Vec<u64>,
    pub step: u64,
    /// Payloads published so far (each unique).
    published: u64,
    /// A crash due at this step (after a failed sync).
    crash_at: Option<u64>,
    /// Crashes so far.
    crashes: u64,
    /// Failed syncs (`fdatasync` or a page flush) so far: the log is poisoned by each, and
    /// the node crashes soon after.
    sync_failures: u64,
    /// A sync failed since the last step (a crash is to be scheduled).
    sync_failed: bool,
    /// Times the disk was full (a segment could not be preallocated): appends refused; the
    /// last step it was.
    disk_full: u64,
    disk_full_step: u64,
    /// Per subscriber, in the calm steps: an event it must have by a step (it was caught up
    /// when the event was acknowledged).
    due: Vec<Option<(u64, u64)>>,
    /// Per subscriber, the last step it observed an event.
    progress: Vec<u64>,
    /// Bytes each client connection read, by the connection's serial.
    reads: std::collections::BTreeMap<u64, Rc<std::cell::Cell<(u64, bool)>>>,
    /// An ID of this epoch seen (for odd IDs with the right prefix).
    some_id: Option<String>,
    pub events: u64,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("seed", &self.seed)
            .field("step", &self.step)
            .finish()
    }
}

impl World {
    pub fn new(seed: u64) -> Result<World, String> {
        let mut rng = Rng::new(seed ^ 0x0057_484f_4c45);
        let cfg = WholeConfig::draw(&mut rng);
        let disk = Disk::new(seed, cfg.page_bytes, cfg.disk, Rng::new(rng.next_u64()))
            .map_err(|e| format!("disk: {e}"))?;
        let disk = Rc::new(disk);
        let t0 = Instant::now();
        let kernel = Kernel::new(
            Rng::new(rng.next_u64()),
            cfg.kernel,
            disk.clone(),
            (cfg.sndbuf, cfg.cores),
            t0,
        );
        let tls = cfg
            .tls
            .then(|| tls::TlsSetup::new(disk.dir()))
            .transpose()?;
        let (mcp_cfg, mrng, mcps) = mcp::draw(seed, cfg.retain_segments.is_some());
        let gw = gateway_config(&cfg, disk.dir(), tls.as_ref(), mcp_cfg.clients > 0)?;
        let opts = config::log_options(&cfg, seed);
        let truths = (0..cfg.streams)
            .map(|i| StreamTruth::new(format!("s{i}")))
            .collect();
        let subs = (0..cfg.subscribers)
            .map(|i| {
                let slow = rng.chance(400);
                Subscriber::new(i % cfg.streams, slow, cfg.retain_segments.is_some())
            })
            .collect();
        let mut w = World {
            seed,
            pubs: (0..cfg.publishers).map(|_| Publisher::default()).collect(),
            subs,
            truths,
            mcp_progress: vec![0; mcp_cfg.clients],
            mcp_cfg,
            mrng,
            upstreams: upstream::SimUpstreams::default(),
            mcps,
            rng,
            cfg,
            disk,
            kernel: Rc::new(RefCell::new(kernel)),
            cores: Vec::new(),
            shared: None,
            tls,
            gw,
            opts,
            step: 0,
            published: 0,
            crash_at: None,
            crashes: 0,
            sync_failures: 0,
            sync_failed: false,
            disk_full: 0,
            disk_full_step: 0,
            due: Vec::new(),
            progress: Vec::new(),
            reads: std::collections::BTreeMap::new(),
            some_id: None,
            events: 0,
        };
        w.announce()?;
        w.start_node()?;
        Ok(w)
    }

    /// Notes what the seed drew (`SIM_DEBUG=2`: and installs the node's log lines on stderr).
    fn announce(&self) -> Check {
        if std::env::var("SIM_DEBUG").as_deref() == Ok("2") {
            gateway::logging::init(&self.gw.log)?;
        }
        if self.tls.is_some() {
            self.note("tls", &[]);
        }
        if let Some(n) = self.cfg.syncfs_files_min {
            self.note("syncfs rounds", &[n as u64]);
        }
        if self.cfg.commit_hold_us > 0 {
            self.note("commit hold us", &[self.cfg.commit_hold_us]);
        }
        if !self.mcps.is_empty() {
            self.note("mcp clients", &[self.mcps.len() as u64]);
        }
        Ok(())
    }

    /// The trace's hash and its counts, faults.
    pub fn trace(&self) -> crate::trace::Trace {
        self.kernel.borrow().trace.clone()
    }

    /// Opens each core's shard log (faults paused), checks what it recovered, and starts the
    /// cores over the simulated kernel, each with a ring, a listener and a shard of its own.
    fn start_node(&mut self) -> Check {
        let n = self.cfg.cores;
        let mut logs = Vec::with_capacity(n);
        for s in 0..n as u32 {
            let dir = gateway::shards::shard_dir(self.disk.dir(), s);
            std::fs::create_dir_all(&dir).map_err(|e| format!("shard directory: {e}"))?;
            self.disk.pause_faults(true);
            let opts = LogOptions {
                epoch_on_create: Some(Epoch(self.seed | 1 << 63 | u64::from(s) << 48)),
                ..self.opts.clone()
            };
            let log = Log::open_with_manual_background(&dir, opts)
                .map_err(|e| format!("shard {s}'s log does not open: {e}"));
            self.disk.pause_faults(false);
            logs.push(log?);
        }
        self.check_recovered(&logs)?;
        let node = Node::new(&self.gw, &logs).map_err(|e| format!("node: {e}"))?;
        self.note_handoffs();
        let shared = Arc::new(node.shared);
        self.shared = Some(shared.clone());
        for (id, (log, rx)) in logs.into_iter().zip(node.rxs).enumerate() {
            let listener = gateway::sys::eventfd().map_err(|e| format!("eventfd: {e}"))?;
            let setup = CoreSetup {
                id,
                cpu: None,
                listener: Some(listener),
                rx,
                logs: vec![(id as u32, log)],
                sync_dir: self.sync_dir()?,
                inbox: None,
                mcp_outside: self.mcp_outside(id),
            };
            let ring = Box::new(SimRing {
                kernel: self.kernel.clone(),
                ring: id,
            });
            self.cores
                .push(SteppedCore::new(setup, shared.clone(), ring));
        }
        Ok(())
    }

    /// A core's sync directory when the seed drew `syncfs` rounds: its own descriptor of the
    /// node's data directory.
    fn sync_dir(&self) -> Result<Option<gateway::streams::hub::SyncDir>, String> {
        let Some(files_min) = self.cfg.syncfs_files_min else {
            return Ok(None);
        };
        let fd =
            std::fs::File::open(self.disk.dir()).map_err(|e| format!("sync directory: {e}"))?;
        Ok(Some(gateway::streams::hub::SyncDir {
            fd: fd.into(),
            files_min,
        }))
    }

    /// Connections the running node's cores handed to each other (noted at each crash and
    /// at the end).
    fn note_handoffs(&self) {
        if let Some(sh) = &self.shared {
            let n: u64 = (sh.metrics.iter())
                .map(|m| {
                    m.handoffs_in_total
                        .load(std::sync::atomic::Ordering::Relaxed)
                })
                .sum();
            if n > 0 {
                self.note("handoffs", &[n]);
            }
        }
    }

    pub fn run(&mut self) -> Check {
        let total = self.cfg.steps + QUIET_STEPS;
        while self.step < total {
            self.step += 1;
            let quiet = self.step > self.cfg.steps;
            if quiet && self.step == self.cfg.steps + 1 {
                self.quiet_down();
            }
            self.take_sync_failures();
            self.clients(quiet)?;
            self.woken()?;
            self.maybe_crash(quiet)?;
            self.upstreams_step(quiet);
            self.kernel.borrow_mut().step();
            for core in &mut self.cores {
                core.turn();
                if self.rng.chance(300) {
                    core.run_background_jobs();
                }
            }
            self.windows_confirmed()?;
            let conns = self.pubs.len() + self.subs.len() + self.mcps.len();
            let in_flight = self.kernel.borrow().in_flight();
            if in_flight > 8 * conns + 16 {
                return Err(format!(
                    "{in_flight} operations in flight for {conns} clients"
                ));
            }
            let mut k = self.kernel.borrow_mut();
            k.now += Duration::from_millis(1);
        }
        self.note_handoffs();
        self.caught_up()?;
        self.mcp_caught_up()
    }

    /// No more faults: the kernel executes everything at once, readers are fast.
    fn quiet_down(&mut self) {
        let mut k = self.kernel.borrow_mut();
        k.quiet();
        self.disk.pause_faults(true);
        self.crash_at = None;
    }

    fn clients(&mut self, quiet: bool) -> Check {
        for i in 0..self.pubs.len() {
            self.publisher(i, quiet)?;
        }
        for i in 0..self.subs.len() {
            self.subscriber(i, quiet)?;
        }
        for i in 0..self.mcps.len() {
            self.mcp_client(i, quiet)?;
        }
        Ok(())
    }

    fn connect(&mut self) -> ClientConn {
        let session = self.tls.as_ref().map(tls::TlsSetup::session);
        let (fd, serial) = self.kernel.borrow_mut().connect();
        let c = ClientConn::new(fd, session);
        self.reads.insert(serial, c.read_total.clone());
        c
    }

    fn note(&self, what: &'static str, nums: &[u64]) {
        if std::env::var_os("SIM_DEBUG").is_some() {
            eprintln!("step {}: {what} {nums:?}", self.step);
        }
        self.kernel.borrow_mut().trace.note(what, nums);
    }

    fn fault(&self, what: &'static str, nums: &[u64]) {
        if std::env::var_os("SIM_DEBUG").is_some() {
            eprintln!("step {}: {what} {nums:?}", self.step);
        }
        self.kernel.borrow_mut().trace.fault(what, nums);
    }

    fn publisher(&mut self, i: usize, quiet: bool) -> Check {
        if !quiet && self.pubs[i].busy() && self.rng.chance(self.cfg.cut_per_mille) {
            self.pubs[i].cut();
            self.fault("publisher cut", &[i as u64]);
            return Ok(());
        }
        let calm = quiet && self.step <= self.cfg.steps + CALM_STEPS;
        if !self.pubs[i].busy() && (!quiet && self.rng.chance(300) || calm && self.rng.chance(50)) {
            self.start_publish(i);
        }
        let (w, r) = (self.rng.range(1, 400) as usize, 4096);
        match self.pubs[i].advance(w, r)? {
            PubOutcome::Nothing => {}
            PubOutcome::Stored(stream, ids) => {
                for (seq, _) in &ids {
                    self.durable(stream, *seq, "answered 201")?;
                }
                let t = &mut self.truths[stream];
                for (seq, data) in &ids {
                    t.learn(*seq, data, "acknowledged")?;
                    t.acked_max = t.acked_max.max(*seq);
                }
                if quiet {
                    self.expect_wakeups(stream, &ids);
                }
                self.events += ids.len() as u64;
                self.note("stored", &[stream as u64, ids.len() as u64]);
            }
            PubOutcome::Refused(status, stream, stored) => {
                for (seq, _) in &stored {
                    self.durable(stream, *seq, "named stored by a refusal")?;
                }
                let t = &mut self.truths[stream];
                for (seq, data) in &stored {
                    t.learn(*seq, data, "named stored by a refusal")?;
                    t.acked_max = t.acked_max.max(*seq);
                }
                self.note("refused", &[u64::from(status), stored.len() as u64]);
            }
        }
        Ok(())
    }

    /// A new publish on publisher `i` (every other one with an `Idempotency-Key`), or by the
    /// seed the last one whose answer was lost, sent again with its key.
    fn start_publish(&mut self, i: usize) {
        if self.pubs[i].conn.is_none() {
            let c = self.connect();
            self.pubs[i].conn = Some(c);
        }
        let (answered, unsure) = (self.rng.chance(100), self.rng.chance(500));
        let retry = if answered {
            self.pubs[i].answered_keyed.take().map(|u| (u, true))
        } else {
            (self.pubs[i].unsure.take())
                .filter(|u| u.key.is_some() && unsure)
                .map(|u| (u, false))
        };
        let (stream, payloads, key) = match retry {
            Some((u, was_answered)) => {
                if let Some((_, crashes)) = &u.key
                    && *crashes != self.crashes
                    && !was_answered
                {
                    for p in &u.payloads {
                        self.truths[u.stream].may_repeat(p);
                    }
                }
                self.note("retry", &[i as u64, u.payloads.len() as u64]);
                (u.stream, u.payloads, u.key)
            }
            None => self.new_payloads(),
        };
        for p in &payloads {
            self.truths[stream].sent_payload(p);
        }
        let name = self.truths[stream].name.clone();
        let first: u64 = String::from_utf8_lossy(&payloads[0][1..])
            .split('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let keyed = u64::from(key.is_some());
        self.note(
            "publish",
            &[i as u64, stream as u64, payloads.len() as u64, first, keyed],
        );
        self.pubs[i].start(stream, &name, payloads, key);
    }

    /// A stream, 1 payload or a batch's, and maybe a key.
    fn new_payloads(&mut self) -> (usize, Vec<Vec<u8>>, Option<(String, u64)>) {
        let stream = self.rng.below(self.truths.len() as u64) as usize;
        let n = if self.rng.chance(self.cfg.batch_per_mille) {
            self.rng.range(2, 6)
        } else {
            1
        };
        let payloads: Vec<Vec<u8>> = (0..n)
            .map(|_| {
                self.published += 1;
                let pad = "x".repeat(self.rng.below(self.cfg.pad_bytes_max) as usize);
                format!("p{}-{pad}", self.published).into_bytes()
            })
            .collect();
        let key = self
            .rng
            .chance(500)
            .then(|| (format!("k{}", self.published), self.crashes));
        (stream, payloads, key)
    }

    fn subscriber(&mut self, i: usize, quiet: bool) -> Check {
        if self.subs[i].conn.is_none() {
            if !quiet && !self.rng.chance(100) {
                return Ok(());
            }
            let c = self.connect();
            let stream = self.subs[i].stream;
            let odd = (!quiet && self.rng.chance(self.cfg.odd_id_per_mille)).then(|| {
                let tail = self.truths[stream].known_max();
                Subscriber::odd_id(&mut self.rng, self.some_id.as_deref(), tail)
            });
            if odd.is_some() {
                self.fault("odd ID", &[i as u64]);
            }
            let name = self.truths[stream].name.clone();
            let resume = self.subs[i].last.as_ref().map_or(0, |l| l.1);
            self.subs[i].connect(c, &name, odd);
            self.note("subscribe", &[i as u64, resume]);
            return Ok(());
        }
        if !quiet && self.rng.chance(self.cfg.cut_per_mille) {
            self.subs[i].cut();
            self.fault("subscriber cut", &[i as u64]);
            return Ok(());
        }
        let n = read_bytes(&mut self.rng, self.subs[i].slow, quiet);
        let stream = self.subs[i].stream;
        let got = self.subs[i].advance(n, &mut self.truths[stream])?;
        if std::mem::take(&mut self.subs[i].gone) {
            self.check_gone(i)?;
        }
        let after = self.subs[i].last.as_ref().map_or(0, |l| l.1);
        // The events shown are contiguous (checked), ending at `after`.
        for seq in (after + 1).saturating_sub(got).max(1)..=after {
            self.durable(stream, seq, "shown")?;
        }
        if got > 0 {
            self.progress.resize(self.subs.len(), 0);
            self.progress[i] = self.step;
            if self.some_id.is_none() {
                self.some_id = self.subs[i].last.as_ref().map(|l| l.0.clone());
            }
            self.note("shown", &[i as u64, got]);
        }
        Ok(())
    }

    /// Counts the syncs that failed and the times the disk was full since the last step.
    fn take_sync_failures(&mut self) {
        let notes = self.disk.take_notes();
        let full = notes
            .iter()
            .filter(|n| **n == crate::disk::DiskNote::DiskFull);
        let full = full.count() as u64;
        self.disk_full += full;
        if full > 0 {
            self.disk_full_step = self.step;
        }
        let failed = self.kernel.borrow_mut().take_failed_syncs() > 0
            || (notes.iter()).any(|n| matches!(n, crate::disk::DiskNote::FlushFailed));
        self.sync_failures += u64::from(failed);
        self.sync_failed |= failed;
    }

    /// A crash by the seed, or after a failed sync: the disk torn, the node restarted.
    fn maybe_crash(&mut self, quiet: bool) -> Check {
        let failed = std::mem::take(&mut self.sync_failed);
        if failed && self.crash_at.is_none() && !quiet {
            self.crash_at = Some(self.step + self.rng.range(1, 20));
        }
        let due = self.crash_at.is_some_and(|t| self.step >= t);
        if quiet || !(due || self.rng.chance(self.cfg.crash_per_mille)) {
            return Ok(());
        }
        self.crash_at = None;
        self.crashes += 1;
        self.fault("crash", &[self.step]);
        let image = self.disk.crash_image(&mut self.rng);
        for core in self.cores.drain(..) {
            core.crash();
        }
        self.kernel.borrow_mut().crashed();
        for p in &mut self.pubs {
            p.cut();
        }
        for s in &mut self.subs {
            s.cut();
        }
        for m in &mut self.mcps {
            m.cut();
        }
        self.upstreams.world().crashed();
        self.disk.restore(image);
        self.start_node()
    }
}

/// How many bytes a client reads in a step: a slow reader 1-64 (but fast in the quiet end),
/// another up to 64 KiB.
fn read_bytes(rng: &mut Rng, slow: bool, quiet: bool) -> usize {
    if slow && !quiet {
        rng.range(1, 64) as usize
    } else {
        rng.range(1, 64 * 1024) as usize
    }
}

/// Runs one seed of the whole node.
pub fn run_seed(seed: u64) -> crate::SeedReport {
    crate::report(seed, || {
        let mut w = World::new(seed)?;
        let r = w.run();
        let t = w.trace();
        let r = r.map_err(|v| format!("step {}: {v}", w.step));
        Ok((t, w.events, w.step, r))
    })
}
