//! One seed's world: the node, its subscribers, the oracle, the disk and the seed's choices.
//! `run` takes steps chosen by the seed until the step budget is spent or a check fails.
#![forbid(unsafe_code)]

use std::time::Duration;

use gateway::proto::route::OnTruncated;
use gateway::streams::sub::{AckMode, SubLimits};
use log_store::{Epoch, FsyncPolicy, LogOptions};

use crate::clients::Subscriber;
use crate::conn::ConnLimits;
use crate::disk::{Disk, DiskFaults, DiskNote};
use crate::node::{Check, Node};
use crate::rng::Rng;
use crate::trace::Trace;
use crate::truth::{Rec, Truth};

/// What the seed chose for this world.
#[derive(Debug, Clone, Copy)]
pub struct SeedConfig {
    pub streams: usize,
    pub subs: usize,
    pub steps: u64,
    pub background: bool,
    pub page_bytes: usize,
    pub retain_segments: Option<u64>,
    pub limits: ConnLimits,
    pub data_bytes_max: u64,
    pub crash_weight: u32,
    pub sync_eio_per_mille: u32,
    pub odd_id_per_mille: u32,
    pub faults: DiskFaults,
}

const SEGMENT_BYTES: u64 = 64 * 1024;
const RECORD_BYTES_MAX: u32 = 8 * 1024;

impl SeedConfig {
    pub fn draw(rng: &mut Rng) -> SeedConfig {
        let faulty = rng.chance(700);
        SeedConfig {
            streams: rng.range(1, 3) as usize,
            subs: rng.range(1, 5) as usize,
            steps: rng.range(300, 1500),
            background: rng.chance(500),
            page_bytes: if rng.chance(500) { 4096 } else { 512 },
            retain_segments: rng.chance(600).then(|| rng.range(2, 4)),
            limits: ConnLimits {
                sub: SubLimits {
                    lag_events_max: rng.range(50, 2000),
                    send_bytes_max: rng.range(1, 16) as usize * 1024,
                    tx_ack_interval: Duration::from_millis(rng.range(0, 20)),
                    keepalive: Duration::from_millis(rng.range(50, 500)),
                },
                sndbuf_bytes: rng.range(1, 64) * 1024,
                record_bytes_max: u64::from(RECORD_BYTES_MAX),
            },
            data_bytes_max: if rng.chance(300) { 3000 } else { 300 },
            crash_weight: rng.range(0, 3) as u32,
            sync_eio_per_mille: if faulty { rng.range(0, 20) as u32 } else { 0 },
            odd_id_per_mille: rng.range(0, 400) as u32,
            faults: DiskFaults {
                flush_eio_per_mille: if faulty { rng.range(0, 40) as u32 } else { 0 },
                enospc_per_mille: if faulty { rng.range(0, 300) as u32 } else { 0 },
            },
        }
    }
}

/// The world of one seed.
#[derive(Debug)]
pub struct World {
    pub seed: u64,
    pub rng: Rng,
    pub trace: Trace,
    pub cfg: SeedConfig,
    pub disk: Disk,
    pub node: Node,
    pub subs: Vec<Subscriber>,
    pub truths: Vec<Truth>,
    pub step: u64,
    counter: u64,
}

impl World {
    pub fn new(seed: u64) -> Result<World, String> {
        let mut rng = Rng::new(seed);
        let cfg = SeedConfig::draw(&mut rng);
        let disk_rng = Rng::new(rng.next_u64());
        let disk = Disk::new(seed, cfg.page_bytes, cfg.faults, disk_rng)
            .map_err(|e| format!("cannot make the disk: {e}"))?;
        let opts = LogOptions {
            segment_bytes: SEGMENT_BYTES,
            record_bytes_max: RECORD_BYTES_MAX,
            retain_bytes: cfg.retain_segments.map(|n| n * SEGMENT_BYTES),
            fsync: FsyncPolicy::Group,
            epoch_on_create: Some(Epoch(seed | 1 << 63)),
            ..LogOptions::default()
        };
        disk.pause_faults(true);
        let mut log = Node::open(disk.dir(), opts.clone(), cfg.background)?;
        let mut ids = Vec::new();
        for i in 0..cfg.streams {
            let id = log
                .create_stream(&format!("s{i}"))
                .map_err(|e| format!("create_stream: {e}"))?;
            ids.push(id);
        }
        log.sync_now().map_err(|e| format!("sync_now: {e}"))?;
        disk.pause_faults(false);
        let subs = (0..cfg.subs)
            .map(|k| Subscriber {
                stream: k % cfg.streams,
                last_id: None,
                slow: rng.chance(300),
                ack: if rng.chance(500) {
                    AckMode::TxTimestamps
                } else {
                    AckMode::Outq
                },
                on_truncated: match rng.below(3) {
                    0 => OnTruncated::Error,
                    1 => OnTruncated::Earliest,
                    _ => OnTruncated::Latest,
                },
                away_until: rng.range(0, 20),
                conn: None,
            })
            .collect();
        Ok(World {
            seed,
            truths: ids.iter().map(|&id| Truth::new(id)).collect(),
            node: Node::new(log, opts, cfg.background, ids),
            rng,
            trace: Trace::default(),
            cfg,
            disk,
            subs,
            step: 0,
            counter: 0,
        })
    }

    /// Takes the seed's steps; the first failed check ends the run.
    pub fn run(&mut self) -> Check {
        while self.step < self.cfg.steps {
            self.step += 1;
            self.one_step()?;
            self.disk_notes();
        }
        Ok(())
    }

    fn one_step(&mut self) -> Check {
        let c = self.cfg.crash_weight + if self.node.poisoned { 40 } else { 0 };
        let weights = [20, 6, 18, 25, 20, 10, 3, 6, 2, 3, 8, c];
        match self.rng.weighted(&weights) {
            0 => self.publish(1),
            1 => {
                let n = self.rng.range(2, 8) as usize;
                self.publish(n)
            }
            2 => self.sync(),
            3 => self.pump(),
            4 => self.receive(),
            5 => self.acks(),
            6 => self.cut(),
            7 => self.reconnect(),
            8 => {
                self.node.retention(&mut self.trace);
                self.node
                    .answer(&self.disk, &mut self.truths, &mut self.trace)
            }
            9 => {
                self.node.background_jobs(&mut self.trace);
                Ok(())
            }
            10 => self.tick(),
            _ => self.crash(),
        }
    }

    /// Faults the disk injected during the last step, counted.
    fn disk_notes(&mut self) {
        for n in self.disk.take_notes() {
            match n {
                DiskNote::Flushed { whole } => self.trace.note("flushed", &[u64::from(whole)]),
                DiskNote::FlushFailed => self.trace.fault("flush_eio", &[]),
                DiskNote::DiskFull => self.trace.fault("enospc", &[]),
            }
        }
    }

    fn publish(&mut self, n: usize) -> Check {
        if self.node.poisoned {
            return Ok(());
        }
        let i = self.rng.below(self.cfg.streams as u64) as usize;
        let events = (0..n).map(|_| self.event()).collect();
        self.node
            .publish(i, events, &mut self.truths[i], &self.disk, &mut self.trace)
    }

    fn event(&mut self) -> Rec {
        self.counter += 1;
        let len = self.rng.below(self.cfg.data_bytes_max + 1) as usize;
        let mut data = format!("{}:", self.counter).into_bytes();
        for _ in 0..len {
            let c = match self.rng.below(40) {
                0 => b'\n',
                1 => b' ',
                k => b'a' + (k % 26) as u8,
            };
            data.push(c);
        }
        let event = match self.rng.below(4) {
            0 => Some(format!("t{}", self.rng.below(3))),
            _ => None,
        };
        Rec { event, data }
    }

    fn sync(&mut self) -> Check {
        let eio = self.cfg.sync_eio_per_mille;
        let r = self.node.sync_step(
            &mut self.rng,
            eio,
            &self.disk,
            &mut self.truths,
            &mut self.trace,
        );
        if self.node.log().sync_in_flight() || r.is_err() {
            return r;
        }
        self.node
            .answer(&self.disk, &mut self.truths, &mut self.trace)
    }
}
