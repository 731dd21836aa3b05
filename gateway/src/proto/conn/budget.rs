//! The body budget (`--request-buffer-bytes-max`) and how a connection takes from it:
//! a body reserves its whole size before its buffer grows, and gives it back when the
//! buffer shrinks or the connection ends.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{HttpConn, RECV_BYTES_KEEP_MAX};

/// The process-wide bytes of request buffers beyond each connection's head buffer
/// (`--request-buffer-bytes-max`), shared by every connection of every core. A connection
/// takes bytes before its buffer grows for a body and gives them back when it shrinks or ends;
/// when none are left it waits (no receive armed: TCP pushes back on the client).
#[derive(Debug)]
pub struct BodyBudget {
    used: AtomicU64,
    max: u64,
    /// Counts every give-back: a starved connection is retried only after one.
    gives: AtomicU64,
}

impl BodyBudget {
    pub fn new(max: u64) -> BodyBudget {
        BodyBudget {
            used: AtomicU64::new(0),
            max,
            gives: AtomicU64::new(0),
        }
    }

    fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Relaxed, Relaxed, |u| (u + n <= self.max).then_some(u + n))
            .is_ok()
    }

    fn give(&self, n: u64) {
        if n > 0 {
            self.used.fetch_sub(n, Relaxed);
            self.gives.fetch_add(1, Relaxed);
        }
    }

    /// How many give-backs happened so far (changes whenever budget is freed).
    pub fn gives(&self) -> u64 {
        self.gives.load(Relaxed)
    }
}

impl Drop for HttpConn {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.give(self.counted);
        }
    }
}

impl HttpConn {
    /// Bounds this connection's body buffering by the shared `budget`.
    pub fn set_budget(&mut self, budget: Arc<BodyBudget>) {
        self.budget = Some(budget);
    }

    /// The last poll waited because the body budget was spent: poll again once some is
    /// given back (the core retries such connections).
    pub fn starved(&self) -> bool {
        self.starved
    }

    /// Reserves the budget for a buffer of `len` bytes (those beyond the head buffer); false
    /// if the budget cannot cover it. A body's whole size is reserved before its buffer first
    /// grows, so a connection that got its reservation can always finish: connections never
    /// hold part of the budget each while all wait for more (a deadlock until their timeouts).
    pub(super) fn reserve(&mut self, len: usize) -> bool {
        let want = len.saturating_sub(RECV_BYTES_KEEP_MAX) as u64;
        if want <= self.counted {
            return true;
        }
        if let Some(b) = &self.budget
            && !b.take(want - self.counted)
        {
            return false;
        }
        self.counted = want;
        true
    }

    /// Shrinks the request buffer to `len` bytes, giving back the budget beyond it.
    pub(super) fn shrink_buffer(&mut self, len: usize) {
        let keep = len.saturating_sub(RECV_BYTES_KEEP_MAX) as u64;
        if keep < self.counted {
            if let Some(b) = &self.budget {
                b.give(self.counted - keep);
            }
            self.counted = keep;
        }
        let rbuf = self.rbuf.as_mut().expect("held");
        rbuf.truncate(len);
        rbuf.shrink_to_fit();
    }
}
