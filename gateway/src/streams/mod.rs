//! The pub/sub layer, with no I/O: the catalog's rules (stream kinds, `--streams-max`:
//! [`catalog`]; `--streams-per-subject-max`: [`subjects`]), the streams a core owns and their
//! logs ([`hub`]), publishing ([`publish`]) and its `Idempotency-Key`s ([`idempotency`]),
//! cluster mode's quarantine of messages it cannot apply ([`quarantine`]), subscribers and
//! their send windows ([`sub`], [`window`]), parked windows ([`parked`]), subscribers of
//! streams not created yet ([`unborn`]) and where a subscription or resume starts
//! ([`resume`]). The core drives it and carries out its decisions with the io_uring driver.
#![forbid(unsafe_code)]

pub mod catalog;
pub mod hub;
pub mod idempotency;
pub mod pace;
pub mod parked;
pub mod publish;
pub mod quarantine;
pub mod resume;
pub mod sub;
pub mod subjects;
pub mod unborn;
pub mod window;

use log_store::StreamId;

/// A stream of a core: (shard, stream id in the shard's log).
pub type StreamKey = (u32, StreamId);

/// A subscriber connection: (slot, generation).
pub type SubRef = (u32, u32);

impl window::Chunk for crate::uring::Bytes {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}
