//! The HTTP machine's next step on one of `Net`'s connections: the machine decides, with
//! which core owns a request's stream (or the MCP path) for a hand-off.

use std::time::Instant;

use super::Net;
use crate::core::conns::{Conn, Conns, State};
use crate::proto::access::Gate;
use crate::proto::conn::{ConnLimits, Step, Target};
use crate::shards;

/// The other core a request is for, if any: its stream's shard's owner, or the MCP owner
/// core; `at`: this core, the core count, the shard count, the MCP owner core.
fn remote(
    t: Target<'_>,
    (id, cores, shards, mcp_core): (usize, usize, u32, usize),
) -> Option<usize> {
    let owner = match t {
        Target::Stream(s) => shards::core_of_shard(shards::shard_of(s, shards), cores),
        Target::Mcp => mcp_core,
    };
    (owner != id).then_some(owner)
}

impl Conns {
    /// The machine's next step on `slot` (`None`: the connection is not in HTTP or closing).
    fn poll_http(
        &mut self,
        slot: u32,
        (now, lim): (Instant, &ConnLimits),
        remote: &dyn Fn(Target<'_>) -> Option<usize>,
        gate: &mut Gate,
    ) -> Option<Step> {
        let Some(Conn {
            state: State::Http(h),
            closing: false,
            ..
        }) = self.get(slot)
        else {
            return None;
        };
        Some(h.poll(now, lim, remote, gate))
    }
}

impl Net {
    /// The connection machine's next step (`None`: the connection is not in HTTP or closing);
    /// `mcp_core` owns the MCP path, a stream's shard tells its owner core.
    pub(in crate::core) fn poll_http(
        &mut self,
        slot: u32,
        lim: &ConnLimits,
        mcp_core: usize,
        gate: &mut Gate,
    ) -> Option<Step> {
        let at = (self.id, self.shared.cores, self.shared.shards, mcp_core);
        let owner = |t: Target<'_>| remote(t, at);
        self.conns.poll_http(slot, (self.now, lim), &owner, gate)
    }
}
