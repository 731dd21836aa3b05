//! Per-subscriber invariant checker: the events one subscriber receives on one stream must be
//! the contiguous, gap-free, duplicate-free sequence of what was published, except where the
//! server said explicitly that history was truncated.
//!
//! Pure state over numbers; it knows nothing of sockets or SSE bytes. Positions are the
//! payload's per-stream publish counters (0, 1, 2, ...), which work for any target. For targets
//! whose IDs carry a sequence (the gateway), the ID's sequence is checked too: it must move in
//! lock-step with the counter (`seq - counter` constant per stream), so a server that renumbers,
//! repeats or skips IDs is caught even when payloads look right.

/// Bounded list of skipped ranges kept to tell a late (reordered) event from a duplicate.
pub const MISSING_RANGES_MAX: usize = 64;

/// What one received event meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observation {
    /// The next expected event.
    InOrder,
    /// Events were skipped silently: `missing` events between the expected and this one.
    Gap { missing: u64 },
    /// Events were skipped after an explicit truncation notice: not a violation.
    SkippedExplicitly { skipped: u64 },
    /// An event already delivered was delivered again.
    Duplicate,
    /// An event that had been skipped arrived late.
    Reorder,
}

/// Counts for one subscriber (summed over subscribers for a report).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CheckCounts {
    pub events: u64,
    pub gaps: u64,
    pub missing_events: u64,
    pub duplicates: u64,
    pub reorders: u64,
    /// ID sequence out of step with the payload counter, or an unparsable ID.
    pub id_mismatches: u64,
    /// Payloads that are not ours (cannot be checked).
    pub malformed: u64,
    /// Explicit truncation notices (`event: truncated` or HTTP 410).
    pub explicit_truncations: u64,
    /// Events skipped right after an explicit truncation notice.
    pub skipped_explicitly: u64,
    /// Events published but never received by the end of the run (not counted for subscribers
    /// that are slow by design or were explicitly truncated).
    pub undelivered: u64,
}

impl CheckCounts {
    /// Number of invariant violations (anything that is not in-order or explicit).
    pub fn violations(&self) -> u64 {
        self.gaps
            + self.duplicates
            + self.reorders
            + self.id_mismatches
            + self.malformed
            + self.undelivered
    }

    /// Add another subscriber's counts.
    pub fn add(&mut self, o: &CheckCounts) {
        self.events += o.events;
        self.gaps += o.gaps;
        self.missing_events += o.missing_events;
        self.duplicates += o.duplicates;
        self.reorders += o.reorders;
        self.id_mismatches += o.id_mismatches;
        self.malformed += o.malformed;
        self.explicit_truncations += o.explicit_truncations;
        self.skipped_explicitly += o.skipped_explicitly;
        self.undelivered += o.undelivered;
    }
}

/// Checker state for one subscriber of one stream.
#[derive(Debug, Clone)]
pub struct Checker {
    expected: u64,
    seq_offset: Option<i128>,
    after_truncation: bool,
    missing: Vec<(u64, u64)>,
    counts: CheckCounts,
}

impl Checker {
    /// A checker expecting counter `first` next (0 for a subscriber that was listening before
    /// the first publish).
    pub fn new(first: u64) -> Self {
        Self {
            expected: first,
            seq_offset: None,
            after_truncation: false,
            missing: Vec::new(),
            counts: CheckCounts::default(),
        }
    }

    /// The counter of the next event expected.
    pub fn expected(&self) -> u64 {
        self.expected
    }

    /// Counts so far.
    pub fn counts(&self) -> &CheckCounts {
        &self.counts
    }

    /// The server said explicitly that history was truncated (in-band event or 410): the next
    /// event may start later without that being a gap.
    pub fn handle_truncation(&mut self) {
        self.counts.explicit_truncations += 1;
        self.after_truncation = true;
    }

    /// A payload could not be decoded.
    pub fn handle_malformed(&mut self) {
        self.counts.malformed += 1;
    }

    /// An event ID could not be parsed for its sequence.
    pub fn handle_bad_id(&mut self) {
        self.counts.id_mismatches += 1;
    }

    /// One event with payload counter `counter` and, for sequence-carrying IDs, `seq`.
    pub fn handle_event(&mut self, counter: u64, seq: Option<u64>) -> Observation {
        self.counts.events += 1;
        if let Some(seq) = seq {
            let off = i128::from(seq) - i128::from(counter);
            match self.seq_offset {
                None => self.seq_offset = Some(off),
                Some(o) if o != off => self.counts.id_mismatches += 1,
                Some(_) => {}
            }
        }
        let obs = if counter == self.expected {
            Observation::InOrder
        } else if counter > self.expected {
            let missing = counter - self.expected;
            if self.after_truncation {
                self.counts.skipped_explicitly += missing;
                Observation::SkippedExplicitly { skipped: missing }
            } else {
                self.counts.gaps += 1;
                self.counts.missing_events += missing;
                if self.missing.len() < MISSING_RANGES_MAX {
                    self.missing.push((self.expected, counter));
                }
                Observation::Gap { missing }
            }
        } else if let Some(i) = self
            .missing
            .iter()
            .position(|&(a, b)| a <= counter && counter < b)
        {
            // A late event fills part of a recorded gap: split the range.
            let (a, b) = self.missing.swap_remove(i);
            if a < counter {
                self.missing.push((a, counter));
            }
            if counter + 1 < b {
                self.missing.push((counter + 1, b));
            }
            self.counts.reorders += 1;
            Observation::Reorder
        } else {
            self.counts.duplicates += 1;
            Observation::Duplicate
        };
        self.after_truncation = false;
        self.expected = self.expected.max(counter + 1);
        obs
    }

    /// End of the run: `published` events exist on the stream. Events not received count as
    /// undelivered unless `lenient` (a subscriber slow by design, or explicitly truncated).
    pub fn handle_end(&mut self, published: u64, lenient: bool) {
        if !lenient && published > self.expected {
            self.counts.undelivered += published - self.expected;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_is_clean() {
        let mut c = Checker::new(0);
        for i in 0..10 {
            assert_eq!(c.handle_event(i, Some(i + 1)), Observation::InOrder);
        }
        c.handle_end(10, false);
        assert_eq!(c.counts().violations(), 0);
        assert_eq!(c.counts().events, 10);
    }

    #[test]
    fn gap_is_caught_and_late_event_is_a_reorder() {
        let mut c = Checker::new(0);
        c.handle_event(0, None);
        assert_eq!(c.handle_event(3, None), Observation::Gap { missing: 2 });
        assert_eq!(c.handle_event(1, None), Observation::Reorder);
        assert_eq!(c.handle_event(2, None), Observation::Reorder);
        assert_eq!(c.handle_event(2, None), Observation::Duplicate);
        let k = c.counts();
        assert_eq!(
            (k.gaps, k.missing_events, k.reorders, k.duplicates),
            (1, 2, 2, 1)
        );
        assert_eq!(k.violations(), 4);
    }

    #[test]
    fn duplicate_is_caught() {
        let mut c = Checker::new(0);
        c.handle_event(0, None);
        c.handle_event(1, None);
        assert_eq!(c.handle_event(1, None), Observation::Duplicate);
        assert_eq!(c.counts().violations(), 1);
    }

    #[test]
    fn truncation_notice_makes_the_next_skip_explicit_only_once() {
        let mut c = Checker::new(0);
        c.handle_event(0, None);
        c.handle_truncation();
        assert_eq!(
            c.handle_event(50, None),
            Observation::SkippedExplicitly { skipped: 49 }
        );
        assert_eq!(c.handle_event(51, None), Observation::InOrder);
        assert_eq!(c.handle_event(60, None), Observation::Gap { missing: 8 });
        assert_eq!(c.counts().explicit_truncations, 1);
        assert_eq!(c.counts().violations(), 1);
    }

    #[test]
    fn sequence_out_of_step_with_counter_is_caught() {
        let mut c = Checker::new(0);
        c.handle_event(0, Some(100));
        c.handle_event(1, Some(101));
        c.handle_event(2, Some(103));
        assert_eq!(c.counts().id_mismatches, 1);
    }

    #[test]
    fn undelivered_tail_counts_unless_lenient() {
        let mut c = Checker::new(0);
        c.handle_event(0, None);
        let mut lenient = c.clone();
        c.handle_end(5, false);
        assert_eq!(c.counts().undelivered, 4);
        lenient.handle_end(5, true);
        assert_eq!(lenient.counts().violations(), 0);
    }
}
