//! The connection table of a core's connections part (`core::net::Net`): connections by slot
//! (a slot is the io_uring driver's; the driver's generation tells a slot's incarnations
//! apart), each with its socket, what it is doing (an HTTP connection machine or a subscriber)
//! and its transport. It holds them and nothing else: decisions come from `proto` and
//! `streams`, submissions go through the driver.

use std::net::IpAddr;
use std::os::fd::OwnedFd;

use crate::proto::conn::HttpConn;
use crate::streams::hub::SubRef;
use crate::streams::sub::Sub;

use super::net::transport::Transport;

/// What a connection is doing.
#[derive(Debug)]
pub(super) enum State {
    Http(Box<HttpConn>),
    Sub(Box<Sub>),
}

/// A connection: its socket, what it is doing, and whether it is closing (cancelled, waiting
/// for its memory-owning operations to complete before the fd is closed and the slot freed).
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) fd: OwnedFd,
    pub(super) closing: bool,
    pub(super) state: State,
    /// The peer's address, counted in `Shared::per_ip` until the connection closes.
    pub(super) peer: Option<IpAddr>,
    /// Plaintext or TLS (`--tls-cert-file`), chosen once.
    pub(super) transport: Transport,
    /// A subscription's access-log record, written when it ends.
    pub(super) record: Option<Box<crate::proto::request_log::Record>>,
    /// A subscriber: when its stream's visible tail last moved with none of it sent yet
    /// (`gateway_delivery_lag_seconds` at its next send carrying events).
    pub(super) woken: Option<std::time::Instant>,
}

/// The connections of a core, by slot.
#[derive(Debug, Default)]
pub(super) struct Conns {
    by_slot: Vec<Option<Conn>>,
}

impl Conns {
    /// Puts `conn` on `slot`, which must be free.
    pub(super) fn insert(&mut self, slot: u32, conn: Conn) {
        let i = slot as usize;
        if self.by_slot.len() <= i {
            self.by_slot.resize_with(i + 1, || None);
        }
        debug_assert!(self.by_slot[i].is_none(), "slot {slot} is free");
        self.by_slot[i] = Some(conn);
    }

    /// The connection on `slot`, if any (closing or not).
    pub(super) fn get(&mut self, slot: u32) -> Option<&mut Conn> {
        self.by_slot.get_mut(slot as usize)?.as_mut()
    }

    /// The connection on `slot`, which must be live.
    pub(super) fn live(&mut self, slot: u32) -> &mut Conn {
        self.get(slot).expect("live slot")
    }

    /// The connection on `slot` if the slot is still in `r`'s generation (`generation`: the
    /// driver's for the slot now).
    pub(super) fn at(&mut self, r: SubRef, generation: u32) -> Option<&mut Conn> {
        self.get(r.0).filter(|_| generation == r.1)
    }

    /// Takes the connection off `slot`, which must be live.
    pub(super) fn take(&mut self, slot: u32) -> Conn {
        self.by_slot
            .get_mut(slot as usize)
            .and_then(Option::take)
            .expect("live slot")
    }

    /// Every connection with its slot.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &Conn)> {
        (self.by_slot.iter().enumerate()).filter_map(|(i, c)| c.as_ref().map(|c| (i as u32, c)))
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut Conn)> {
        let slots = self.by_slot.iter_mut().enumerate();
        slots.filter_map(|(i, c)| Some((i as u32, c.as_mut()?)))
    }

    /// Slots up to the highest ever used (for walks that call back into the core).
    pub(super) fn slots(&self) -> std::ops::Range<u32> {
        0..self.by_slot.len() as u32
    }

    pub(super) fn len(&self) -> usize {
        self.by_slot.iter().filter(|c| c.is_some()).count()
    }
}
