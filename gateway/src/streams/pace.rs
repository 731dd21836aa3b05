//! When a shard's next group commit starts: the hold after a commit that answered several
//! publishes.
//!
//! Under `--fsync group` a commit starts as soon as records are unsynced and none is in
//! flight. With many sequential publishers on one shard that splits them in two halves that
//! take turns: when a commit ends, the publishes that arrived during it start the next one at
//! once, and the publishers it just answered come back a round trip later, to wait for the
//! commit after. Each publisher then waits for two commits per publish, and each commit
//! covers half of them (measured: 3.8 events per `fdatasync` with 8 publishers per shard).
//!
//! So a commit that answered `n` publishes holds the shard's next one until `n` new
//! publishes have arrived (those publishers are back) or `--group-commit-hold-us` has passed
//! since it ended (and never longer than the commit took), whichever comes first. One sequential publisher is never held: its commit
//! answered one publish, and its next publish is the one the hold waits for. A publisher that
//! does not come back costs the others at most the hold.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

/// Each shard's publish count and hold.
#[derive(Debug, Default)]
pub struct Pace {
    hold_max: Duration,
    shards: FxHashMap<u32, Shard>,
}

#[derive(Debug, Default)]
struct Shard {
    /// Publishes appended to the shard so far.
    publishes: u64,
    /// `publishes` when its last commit began.
    at_begin: u64,
    /// The commit in flight covers this many publishes.
    covered: u64,
    hold: Option<Hold>,
}

#[derive(Debug, Clone, Copy)]
struct Hold {
    /// Publishes needed after `from` to end the hold.
    need: u64,
    from: u64,
    until: Instant,
}

impl Pace {
    /// `hold_max` zero: never hold (a commit starts as soon as one is due).
    pub fn new(hold_max: Duration) -> Pace {
        Pace {
            hold_max,
            shards: FxHashMap::default(),
        }
    }

    /// A publish appended records to `shard`.
    pub fn published(&mut self, shard: u32) {
        self.shards.entry(shard).or_default().publishes += 1;
    }

    /// Whether `shard`'s next commit waits at `now` (a hold that ended is dropped).
    pub fn held(&mut self, shard: u32, now: Instant) -> bool {
        let Some(s) = self.shards.get_mut(&shard) else {
            return false;
        };
        let Some(h) = s.hold else {
            return false;
        };
        if s.publishes - h.from < h.need && now < h.until {
            return true;
        }
        s.hold = None;
        false
    }

    /// `shard`'s commit begins: it covers the publishes since the last one began.
    pub fn began(&mut self, shard: u32) {
        let s = self.shards.entry(shard).or_default();
        s.covered = s.publishes - s.at_begin;
        s.at_begin = s.publishes;
        s.hold = None;
    }

    /// `shard`'s commit ended at `now` after `took` (its publishes are answered): the next
    /// one is held when it answered more than one publish, for at most `took` (waiting
    /// longer than a commit costs more than the commit after it would).
    pub fn ended(&mut self, shard: u32, now: Instant, took: Duration) {
        let hold_max = self.hold_max.min(took);
        let Some(s) = self.shards.get_mut(&shard) else {
            return;
        };
        if hold_max.is_zero() || s.covered < 2 {
            return;
        }
        s.hold = Some(Hold {
            need: s.covered,
            from: s.publishes,
            until: now + hold_max,
        });
    }

    /// When `shard`'s hold ends at the latest, while it has one.
    pub fn until(&self, shard: u32) -> Option<Instant> {
        let s = self.shards.get(&shard)?;
        let h = s.hold?;
        (s.publishes - h.from < h.need).then_some(h.until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A commit of `publishes` publishes on shard 0, ended at `t` after `took`.
    fn commit(p: &mut Pace, publishes: u64, t: Instant, took: Duration) {
        for _ in 0..publishes {
            p.published(0);
        }
        p.began(0);
        p.ended(0, t, took);
    }

    #[test]
    fn one_sequential_publisher_is_never_held() {
        let mut p = Pace::new(MS);
        let t = Instant::now();
        for _ in 0..5 {
            p.published(0);
            assert!(!p.held(0, t));
            assert_eq!(p.until(0), None);
            p.began(0);
            p.ended(0, t, MS);
        }
    }

    #[test]
    fn a_commit_of_n_publishes_holds_the_next_until_n_more_arrive() {
        let mut p = Pace::new(MS);
        let t = Instant::now();
        commit(&mut p, 3, t, MS);
        for _ in 0..2 {
            p.published(0);
            assert!(p.held(0, t));
            assert_eq!(p.until(0), Some(t + MS));
        }
        p.published(0);
        assert_eq!(p.until(0), None);
        assert!(!p.held(0, t));
        // The hold is over for good: the next commit begins, and covers the 3 publishers.
        p.began(0);
        p.ended(0, t, MS);
        assert!(p.held(0, t), "3 publishes answered: held again");
    }

    #[test]
    fn a_hold_ends_at_its_maximum_or_at_the_commits_duration_whichever_is_shorter() {
        let t = Instant::now();
        let mut p = Pace::new(MS);
        commit(&mut p, 4, t, 5 * MS);
        assert_eq!(p.until(0), Some(t + MS), "capped by the flag");
        assert!(p.held(0, t + MS / 2));
        assert!(!p.held(0, t + MS));
        assert!(!p.held(0, t), "a hold that ended is dropped");
        let mut p = Pace::new(MS);
        let quick = Duration::from_micros(200);
        commit(&mut p, 4, t, quick);
        assert_eq!(p.until(0), Some(t + quick), "capped by the commit");
        assert!(!p.held(0, t + quick));
    }

    #[test]
    fn zero_never_holds_and_shards_are_apart() {
        let t = Instant::now();
        let mut p = Pace::new(Duration::ZERO);
        commit(&mut p, 9, t, MS);
        assert!(!p.held(0, t));
        let mut p = Pace::new(MS);
        commit(&mut p, 9, t, MS);
        assert!(p.held(0, t));
        p.published(1);
        assert!(
            !p.held(1, t),
            "another shard's commits are not held by shard 0's"
        );
        assert_eq!(p.until(1), None);
    }
}
