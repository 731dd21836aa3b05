//! The HTTP machine's next step on one of `Net`'s connections: the machine decides, with
//! which core owns a request's stream (or serves it on the MCP path) for a hand-off.

use std::time::Instant;

use super::Net;
use crate::core::conns::{Conn, Conns, State};
use crate::proto::access::Gate;
use crate::proto::conn::{ConnLimits, Step, Target};
use crate::shards::{self, McpPlace};

/// The other core a request is for, if any: its stream's shard's owner, or the core that
/// serves it on the MCP path (`place`); `at`: this core, the core count, the shard count.
fn remote(
    t: Target<'_>,
    (id, cores, shards): (usize, usize, u32),
    place: &McpPlace,
) -> Option<usize> {
    let owner = match t {
        Target::Stream(s) => shards::core_of_shard(shards::shard_of(s, shards), cores),
        Target::Mcp(head, access) => {
            let caller = crate::proto::access::caller(access);
            place.core_for(id, head.mcp_session_id.as_deref(), caller.as_deref())
        }
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
    /// `place` tells which core serves a request on the MCP path, a stream's shard its owner.
    pub(in crate::core) fn poll_http(
        &mut self,
        slot: u32,
        lim: &ConnLimits,
        place: &McpPlace,
        gate: &mut Gate,
    ) -> Option<Step> {
        let at = (self.id, self.shared.cores, self.shared.shards);
        let owner = |t: Target<'_>| remote(t, at, place);
        self.conns.poll_http(slot, (self.now, lim), &owner, gate)
    }
}
