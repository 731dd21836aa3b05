//! The MCP front in the whole node: what the world does each step for its MCP session
//! clients ([`super::mcp_client`]) and the simulated upstreams ([`super::upstream`]), drawn
//! from a generator of their own so that a seed without MCP runs as it did before MCP was
//! simulated.

use std::os::fd::AsFd;

use gateway::core::McpOutside;

use super::client::Check;
use super::mcp_client::{Asked, Excuses, McpClient};
use super::{CALM_STEPS, World};
use crate::rng::Rng;

/// What a seed draws for the MCP front (from its own generator).
#[derive(Debug, Clone)]
pub(super) struct McpConfig {
    /// MCP session clients (0: the MCP front is off).
    pub(super) clients: usize,
    /// Chance per step that a running upstream dies.
    pub(super) death_per_mille: u32,
    /// Most upstream lines the node may read per step (at least one when any is written).
    pub(super) lines_per_step_max: u64,
}

impl McpConfig {
    pub(super) fn draw(rng: &mut Rng) -> McpConfig {
        McpConfig {
            clients: if rng.chance(500) {
                rng.range(1, 3) as usize
            } else {
                0
            },
            death_per_mille: if rng.chance(500) {
                rng.range(1, 10) as u32
            } else {
                0
            },
            lines_per_step_max: rng.range(1, 4),
        }
    }
}

/// What a seed draws for the MCP front, the generator it goes on with, and the clients.
pub(super) fn draw(seed: u64, retention: bool) -> (McpConfig, Rng, Vec<McpClient>) {
    let mut mrng = Rng::new(seed ^ 0x004d_4350_4d43_5000);
    let cfg = McpConfig::draw(&mut mrng);
    let clients = (0..cfg.clients)
        .map(|_| McpClient::new(mrng.chance(400), retention))
        .collect();
    (cfg, mrng, clients)
}

impl World {
    /// What core `core` of the node is given for the MCP front: its simulated upstreams and
    /// session IDs from the seed (`None` when the front is off).
    pub(super) fn mcp_outside(&mut self, core: usize) -> Option<McpOutside> {
        if self.mcp_cfg.clients == 0 {
            return None;
        }
        let mut ids = Rng::new(self.mrng.next_u64());
        Some(McpOutside {
            upstreams: Box::new(self.upstreams.for_core(core)),
            session_ids: Some(Box::new(move || {
                let mut b = [0u8; 16];
                b[..8].copy_from_slice(&ids.next_u64().to_le_bytes());
                b[8..].copy_from_slice(&ids.next_u64().to_le_bytes());
                b
            })),
        })
    }

    /// What excuses an MCP client's loss, for a session: crashes, failed syncs and full disks
    /// so far (a record the log refuses breaks its MCP stream), plus one if the upstream of
    /// the session died; and whether the node refuses records now. (With 2 cores a fault of
    /// either shard's disk counts.)
    fn excuses(&self) -> impl Fn(Option<&str>) -> Excuses + use<> {
        let poisoned = (self.cores.iter().enumerate())
            .any(|(s, c)| c.log(s as u32).is_some_and(log_store::Log::is_poisoned));
        let full = self.disk_full > 0 && self.step <= self.disk_full_step + 100;
        let count = self.crashes + self.sync_failures + self.disk_full;
        let up = self.upstreams.clone();
        move |sid| Excuses {
            count: count + u64::from(sid.is_some_and(|s| up.world().died(s))),
            failing: poisoned || full,
        }
    }

    /// The upstreams' step: by the seed one dies; a few written lines (all, when quiet) are
    /// released to the node, whose cores are then woken as the reader thread wakes them.
    pub(super) fn upstreams_step(&mut self, quiet: bool) {
        if self.mcp_cfg.clients == 0 {
            return;
        }
        let n = if quiet {
            usize::MAX
        } else {
            self.mrng.range(0, self.mcp_cfg.lines_per_step_max) as usize
        };
        let mut w = self.upstreams.world();
        let mut wake = w.release(n);
        if !quiet && self.mrng.chance(self.mcp_cfg.death_per_mille) && w.kill_one(&mut self.mrng) {
            wake = true;
            drop(w);
            self.fault("upstream death", &[]);
        } else {
            drop(w);
        }
        if wake && let Some(sh) = &self.shared {
            for fd in &sh.eventfds {
                gateway::sys::eventfd_wake(fd.as_fd());
            }
        }
    }

    /// MCP client `i`'s step: connect (a request, or the resume of a call), be cut, or read.
    pub(super) fn mcp_client(&mut self, i: usize, quiet: bool) -> Check {
        let calm = quiet && self.step <= self.cfg.steps + CALM_STEPS;
        if self.mcps[i].conn.is_none() {
            let go = if quiet {
                self.mcps[i].resuming() || calm && self.mrng.chance(50)
            } else {
                self.mrng.chance(100)
            };
            if go
                && !quiet
                && self.mcps[i].resuming()
                && self.mrng.chance(self.cfg.odd_id_per_mille)
            {
                let odd = self.odd_mcp_id(i);
                let c = self.connect();
                self.mcps[i].connect_odd(c, odd);
                self.fault("mcp odd ID", &[i as u64]);
            } else if go {
                let c = self.connect();
                let count = self.mrng.range(0, 12);
                let ex = self.excuses();
                let asked = self.mcps[i].connect(c, count, &ex);
                self.note("mcp", &[i as u64, asked as u64, count]);
                if asked == Asked::Call {
                    // Not at a resume: a loop of resumes without messages is a stall.
                    self.mcp_progress[i] = self.step;
                }
            }
            return Ok(());
        }
        if !quiet && self.mrng.chance(self.cfg.cut_per_mille) {
            self.mcps[i].cut();
            self.fault("mcp cut", &[i as u64]);
            return Ok(());
        }
        let n = super::read_bytes(&mut self.mrng, self.mcps[i].slow, quiet);
        let ex = self.excuses();
        let (results, errors) = (self.mcps[i].results, self.mcps[i].errors);
        let got = self.mcps[i].advance(n, &ex)?;
        for id in std::mem::take(&mut self.mcps[i].shown) {
            self.durable_mcp(self.mcps[i].session(), &id, "shown")?;
        }
        if got > 0 {
            self.mcp_progress[i] = self.step;
            self.events += got;
            self.note("mcp shown", &[i as u64, got]);
        }
        let c = &self.mcps[i];
        if (c.results, c.errors) != (results, errors) {
            self.note("mcp call ended", &[i as u64, c.results, c.errors]);
        }
        Ok(())
    }

    /// An ID client `i`'s session must have refused: another client's last event (another
    /// session's), its own last one pushed beyond the tail, or not an event ID.
    fn odd_mcp_id(&mut self, i: usize) -> String {
        let own = self.mcps[i].last_id().unwrap_or("0-0-0").to_owned();
        let others: Vec<String> = (self.mcps.iter().enumerate())
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, c)| c.last_id().map(str::to_owned))
            .collect();
        match self.mrng.below(3) {
            0 if !others.is_empty() => {
                others[self.mrng.below(others.len() as u64) as usize].clone()
            }
            0 | 1 => match own.rsplit_once('-') {
                Some((prefix, seq)) => {
                    format!("{prefix}-{}", seq.parse::<u64>().unwrap_or(0) + 1_000_000)
                }
                None => "not-an-id".to_owned(),
            },
            _ => "not-an-id".to_owned(),
        }
    }

    /// At the end: no MCP call is stalled on an open connection, and no upstream line is
    /// left unread.
    pub(super) fn mcp_caught_up(&self) -> Check {
        for (i, c) in self.mcps.iter().enumerate() {
            let idle = self.step - self.mcp_progress[i];
            if c.in_call() && idle > 100 {
                return Err(format!(
                    "MCP client {i}'s call stalled for {idle} quiet steps ({})",
                    if c.conn.is_some() {
                        "connected"
                    } else {
                        "not resumed"
                    }
                ));
            }
        }
        let backlog = self.upstreams.world().backlog();
        if backlog > 0 {
            return Err(format!("{backlog} upstream lines never read by the node"));
        }
        Ok(())
    }
}
