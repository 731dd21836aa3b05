//! The HTTP machine's next step on one of `Net`'s connections: the machine decides, with
//! which core owns a request's stream (or the MCP path) for a hand-off.

use super::Net;
use crate::core::conns::State;
use crate::proto::access::Gate;
use crate::proto::conn::{ConnLimits, Step, Target};
use crate::shards;

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
        let (id, cores, shards) = (self.id, self.shared.cores, self.shared.shards);
        let remote = |t: Target<'_>| {
            let owner = match t {
                Target::Stream(s) => shards::core_of_shard(shards::shard_of(s, shards), cores),
                Target::Mcp => mcp_core,
            };
            (owner != id).then_some(owner)
        };
        let now = self.now;
        let Some(crate::core::conns::Conn {
            state: State::Http(h),
            closing: false,
            ..
        }) = self.conns.get(slot)
        else {
            return None;
        };
        Some(h.poll(now, lim, &remote, gate))
    }
}
