//! A subscriber's sends and confirmations added to its core's counters: the core's own block,
//! on its own thread (the only writer of these four). Used wherever a send completes or a
//! confirmation arrives: the plaintext and TLS send paths, the tick, a close.

use crate::metrics::{CoreMetrics, bump_own};
use crate::streams::sub::{Confirmed, Sent};

/// Adds what a send completion did to the core's counters (the core's own block, on its
/// thread: the only writer of these four).
pub(super) fn count_sent(m: &CoreMetrics, sent: Sent) {
    bump_own(&m.bytes_confirmed_total, sent.bytes_confirmed);
    bump_own(&m.bytes_sent_total, sent.bytes);
    bump_own(&m.events_sent_total, sent.events_sent as u64);
    bump_own(&m.events_confirmed_total, sent.events_confirmed as u64);
}

/// Adds a confirmation to the core's counters (as [`count_sent`]).
pub(super) fn count_confirmed(m: &CoreMetrics, c: Confirmed) {
    bump_own(&m.events_confirmed_total, c.events as u64);
    bump_own(&m.bytes_confirmed_total, c.bytes);
}
