//! The MCP front's upstreams in the whole node: one deterministic MCP server per session, in
//! the node's thread, with the behaviour of the stdio server of the gateway's end-to-end tests
//! (`gateway/tests/mcp_upstream.awk`):
//! - `initialize` → an `InitializeResult` (protocol 2025-11-25);
//! - `tools/call {count}` → `count` `notifications/progress` for the request's
//!   `progressToken`, then the result `{"sent": count}`;
//! - any other request → an empty result; notifications are read and dropped.
//!
//! What an upstream writes is not read by the node at once: the world releases a few lines
//! per step ([`UpstreamWorld::release`]) and wakes the owner core's eventfd, as the real reader
//! thread does, so progress arrives while clients read, are cut and resume. By the seed an
//! upstream dies ([`UpstreamWorld::kill_one`]): its stdout closes with lines unread. A crash
//! of the node takes every upstream with it ([`UpstreamWorld::crashed`]).
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use gateway::mcp::core::UpstreamId;
use gateway::mcp::upstream::{UpstreamEvent, Upstreams};
use serde_json::{Value, json};

use crate::rng::Rng;

/// An upstream: the core whose MCP part runs it, and its ID there (each core's MCP part
/// numbers its own).
type Up = (usize, UpstreamId);

/// Every upstream of the running node, of every core's MCP part.
#[derive(Debug, Default)]
pub struct UpstreamWorld {
    alive: BTreeSet<Up>,
    /// Lines the upstreams wrote, not yet read by the node.
    written: VecDeque<(Up, Vec<u8>)>,
    /// What each core reads next ([`Upstreams::try_recv`]).
    ready: BTreeMap<usize, VecDeque<UpstreamEvent>>,
    /// Upstreams killed by the node, to be reported ended by the next [`Upstreams::poll`].
    ended: Vec<Up>,
    /// Upstreams that died by the seed.
    pub deaths: u64,
    /// The session each upstream serves, and the sessions whose upstream died.
    sessions: BTreeMap<Up, String>,
    died: BTreeSet<String>,
}

impl UpstreamWorld {
    /// Moves up to `n` written lines to what the node reads; whether any moved (the owner
    /// core is then woken).
    pub fn release(&mut self, n: usize) -> bool {
        let mut moved = false;
        for _ in 0..n {
            let Some(((core, id), line)) = self.written.pop_front() else {
                break;
            };
            let ready = self.ready.entry(core).or_default();
            ready.push_back(UpstreamEvent::Line(id, line));
            moved = true;
        }
        moved
    }

    /// Lines written and not yet read by the node.
    pub fn backlog(&self) -> usize {
        self.written.len()
    }

    /// One running upstream dies (its unread lines are lost, its stdout closes); whether
    /// one was running.
    pub fn kill_one(&mut self, rng: &mut Rng) -> bool {
        if self.alive.is_empty() {
            return false;
        }
        let i = rng.below(self.alive.len() as u64) as usize;
        let id = *self.alive.iter().nth(i).expect("i < len");
        self.alive.remove(&id);
        self.written.retain(|(w, _)| *w != id);
        let ready = self.ready.entry(id.0).or_default();
        ready.push_back(UpstreamEvent::Closed(id.1));
        self.deaths += 1;
        if let Some(s) = self.sessions.get(&id) {
            self.died.insert(s.clone());
        }
        true
    }

    /// Whether the upstream of session `sid` died by the seed.
    pub fn died(&self, sid: &str) -> bool {
        self.died.contains(sid)
    }

    /// The node crashed: its upstreams are gone with it, and their lines.
    pub fn crashed(&mut self) {
        let (deaths, died) = (self.deaths, std::mem::take(&mut self.died));
        *self = UpstreamWorld {
            deaths,
            died,
            ..UpstreamWorld::default()
        };
    }

    /// What the upstream `id` writes for one line it read.
    fn answer(&mut self, id: Up, line: &[u8]) {
        let Ok(msg) = serde_json::from_slice::<Value>(line) else {
            return;
        };
        let (Some(rpc), Some(method)) = (msg.get("id"), msg["method"].as_str()) else {
            return; // a notification or a response: nothing to say
        };
        let result = match method {
            "initialize" => json!({
                "protocolVersion": "2025-11-25",
                "capabilities": { "tools": {} },
                "serverInfo": { "name": "sim-upstream", "version": "1" },
            }),
            "tools/call" => {
                let count = msg["params"]["arguments"]["count"].as_u64().unwrap_or(0);
                let token = &msg["params"]["_meta"]["progressToken"];
                for i in 1..=count {
                    let note = json!({
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": { "progressToken": token, "progress": i, "total": count },
                    });
                    self.written.push_back((id, note.to_string().into_bytes()));
                }
                json!({ "content": [], "structuredContent": { "sent": count } })
            }
            _ => json!({}),
        };
        let answer = json!({ "jsonrpc": "2.0", "id": rpc, "result": result });
        self.written
            .push_back((id, answer.to_string().into_bytes()));
    }
}

/// A core's view of [`UpstreamWorld`] (each core with an MCP part runs its own upstreams).
#[derive(Debug, Clone, Default)]
pub struct SimUpstreams {
    world: Arc<Mutex<UpstreamWorld>>,
    core: usize,
}

impl SimUpstreams {
    pub fn world(&self) -> MutexGuard<'_, UpstreamWorld> {
        self.world.lock().expect("one thread")
    }

    /// The view of core `core`'s MCP part, over the same world.
    pub fn for_core(&self, core: usize) -> SimUpstreams {
        SimUpstreams {
            world: self.world.clone(),
            core,
        }
    }
}

impl Upstreams for SimUpstreams {
    fn children(&self) -> usize {
        let w = self.world();
        let mine = |u: &&Up| u.0 == self.core;
        w.alive.iter().filter(mine).count() + w.ended.iter().filter(mine).count()
    }

    fn http_stats(&self) -> Option<gateway::mcp::http_upstream::PoolStats> {
        None
    }

    fn spawn(&mut self, id: UpstreamId, session: Option<&str>) -> Result<(), String> {
        let mut w = self.world();
        w.alive.insert((self.core, id));
        if let Some(s) = session {
            w.sessions.insert((self.core, id), s.to_owned());
        }
        Ok(())
    }

    fn send(
        &mut self,
        id: UpstreamId,
        line: Vec<u8>,
        _authorization: Option<gateway::mcp::credential::Credential>,
    ) -> Result<(), String> {
        let mut w = self.world();
        let id = (self.core, id);
        if !w.alive.contains(&id) {
            return Err("upstream stdin closed".into());
        }
        w.answer(id, line.strip_suffix(b"\n").unwrap_or(&line));
        Ok(())
    }

    fn set_authorization(
        &mut self,
        _id: UpstreamId,
        _authorization: Option<gateway::mcp::credential::Credential>,
    ) {
    }

    fn kill(&mut self, id: UpstreamId, _now: Instant) {
        let mut w = self.world();
        let id = (self.core, id);
        if w.alive.remove(&id) {
            w.written.retain(|(u, _)| *u != id);
            w.ended.push(id);
        }
    }

    fn try_recv(&self) -> Option<UpstreamEvent> {
        self.world().ready.get_mut(&self.core)?.pop_front()
    }

    fn poll(&mut self, _now: Instant) -> Vec<(UpstreamId, String)> {
        let mut w = self.world();
        let (mine, others) = std::mem::take(&mut w.ended)
            .into_iter()
            .partition(|u| u.0 == self.core);
        w.ended = others;
        let mine: Vec<Up> = mine;
        mine.into_iter()
            .map(|(_, id)| (id, "exit status: 0".to_owned()))
            .collect()
    }

    fn stop_all(&mut self) {
        let mut w = self.world();
        let core = self.core;
        let (mine, others) = std::mem::take(&mut w.alive)
            .into_iter()
            .partition(|u| u.0 == core);
        w.alive = others;
        let mine: BTreeSet<Up> = mine;
        w.written.retain(|(u, _)| u.0 != core);
        w.ended.extend(mine);
    }
}
