//! A guard against a Linux 6.18 defect in 32-byte-CQE rings: when a 32-byte completion (a
//! TX-timestamp report, or an overflow flush) is due at the ring's last slot, the kernel
//! skips that slot by filling a 16-byte "nop" at the wrong stride and advances the tail past
//! it, so the slot is published still holding the completion it held one lap earlier
//! (`IORING_SETUP_CQE_MIXED` rework, first in v6.18). User space then reads that old
//! completion a second time. Measured here (a 64-entry CQ with the submission backlog forced):
//! 319 such completions in 5 runs, every one at index `entries - 1`, every one an exact
//! repeat of the completion read there one lap before, every one followed by a
//! TX-timestamp completion at index 0 (BENCHMARKS.md, "Stray completions: the root cause").
//!
//! The guard tracks the ring index of each completion read (the head advances by one per
//! completion) and drops a completion read at the last slot that is identical — user_data,
//! result and flags — to the one read there a lap earlier. A genuine completion cannot be
//! identical there: a single-shot operation's user_data carries a serial that differs across
//! the 2^20 operations of its slot, far more than a lap; only a multishot operation could
//! repeat its user_data, result and flags exactly one lap apart. Those are dropped as well:
//! losing one such wake-up (a watch's input, a duplicate ACK report) is recoverable, while
//! acting twice on a stale accept (an fd number that may by then belong to another file) is
//! not.
#![forbid(unsafe_code)]

use super::Cqe;

/// The index tracker of one completion ring.
#[derive(Debug)]
pub struct LapGuard {
    entries: u32,
    /// The ring index of the next completion to be read.
    index: u32,
    /// The completion read at the last index, one lap ago.
    last_slot: Option<Cqe>,
}

impl LapGuard {
    pub fn new(entries: u32) -> LapGuard {
        assert!(entries.is_power_of_two(), "ring sizes are powers of two");
        LapGuard {
            entries,
            index: 0,
            last_slot: None,
        }
    }

    /// Notes the next completion read; true if it is the stale repeat of the last slot.
    pub fn is_stale(&mut self, cqe: Cqe) -> bool {
        let at_last = self.index == self.entries - 1;
        self.index = (self.index + 1) & (self.entries - 1);
        if !at_last {
            return false;
        }
        let stale = self.last_slot == Some(cqe);
        self.last_slot = Some(cqe);
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_exact_repeat_at_the_last_slot_is_stale() {
        let mut g = LapGuard::new(4);
        let lap1 = [(1, 0, 0), (2, 0, 0), (3, 0, 0), (4, 5, 2)];
        assert!(lap1.iter().all(|&c| !g.is_stale(c)));
        // Next lap: the same completions at slots 0..2 are not judged (only the last slot is).
        assert!(!g.is_stale((1, 0, 0)));
        assert!(!g.is_stale((2, 0, 0)));
        assert!(!g.is_stale((3, 0, 0)));
        assert!(g.is_stale((4, 5, 2)), "the last slot repeated exactly");
        // A different completion at the last slot is genuine.
        for c in [(9, 0, 0), (9, 0, 0), (9, 0, 0)] {
            assert!(!g.is_stale(c));
        }
        assert!(!g.is_stale((4, 5, 3)), "flags differ: genuine");
    }

    #[test]
    fn the_index_follows_the_head_across_many_laps() {
        let mut g = LapGuard::new(8);
        let mut stale = 0;
        for i in 0..8 * 100u64 {
            // Every slot holds a fresh completion except the last, which repeats every lap.
            let c = if i % 8 == 7 { (7, 1, 0) } else { (i, 0, 0) };
            stale += usize::from(g.is_stale(c));
        }
        assert_eq!(stale, 99, "every lap but the first repeats the last slot");
    }
}
