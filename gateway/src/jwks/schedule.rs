//! When each JWKS URL is fetched: a pure decision over milliseconds the caller passes in (no
//! clock, no I/O), so the bound on fetches is tested without waiting.
//!
//! Each URL is fetched `refresh_ms` after its last good fetch, `refetch_min_ms` after a failed
//! one (a retry), and — when a token named an unknown `kid` since its last fetch — as soon as
//! `refetch_min_ms` has passed since its last fetch. However many unknown kids arrive, a URL is
//! fetched at most once per `refetch_min_ms` (plus its periodic refresh).
#![forbid(unsafe_code)]

/// One URL's timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Url {
    /// When the last fetch was made.
    last_ms: u64,
    /// When the next periodic (or retry) fetch is due.
    next_ms: u64,
    /// An unknown kid was reported since the last fetch.
    kid_miss: bool,
}

/// The timers of every JWKS URL, in flag order.
#[derive(Clone, Debug)]
pub struct Schedule {
    refresh_ms: u64,
    refetch_min_ms: u64,
    urls: Vec<Url>,
}

/// Why a URL is fetched now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Its refresh (or retry) time came.
    Due,
    /// A token named a kid no set knows.
    UnknownKid,
}

impl Schedule {
    /// Timers after the first fetch of each URL, made at `now_ms`: `first_ok[i]` says whether
    /// URL `i`'s succeeded.
    pub fn new(refresh_ms: u64, refetch_min_ms: u64, first_ok: &[bool], now_ms: u64) -> Schedule {
        let mut s = Schedule {
            refresh_ms,
            refetch_min_ms,
            urls: Vec::with_capacity(first_ok.len()),
        };
        for &ok in first_ok {
            s.urls.push(Url {
                last_ms: now_ms,
                next_ms: 0,
                kid_miss: false,
            });
            let i = s.urls.len() - 1;
            s.fetched(i, now_ms, ok);
        }
        s
    }

    /// A token was refused for an unknown kid: every URL is fetched again once its last fetch
    /// is `refetch_min_ms` old.
    pub fn note_unknown_kid(&mut self) {
        for u in &mut self.urls {
            u.kid_miss = true;
        }
    }

    /// The URLs to fetch at `now_ms`, and why.
    pub fn due(&self, now_ms: u64) -> Vec<(usize, Why)> {
        let mut due = Vec::new();
        for (i, u) in self.urls.iter().enumerate() {
            if now_ms >= u.next_ms {
                due.push((i, Why::Due));
            } else if u.kid_miss && now_ms >= u.last_ms.saturating_add(self.refetch_min_ms) {
                due.push((i, Why::UnknownKid));
            }
        }
        due
    }

    /// URL `i` was fetched at `now_ms` (`ok`: a usable document).
    pub fn fetched(&mut self, i: usize, now_ms: u64, ok: bool) {
        let wait = if ok {
            self.refresh_ms
        } else {
            self.refetch_min_ms.min(self.refresh_ms)
        };
        self.urls[i] = Url {
            last_ms: now_ms,
            next_ms: now_ms.saturating_add(wait),
            kid_miss: false,
        };
    }

    /// Milliseconds from `now_ms` until some URL is due (0: one is due now).
    pub fn wait_ms(&self, now_ms: u64) -> u64 {
        let at = |u: &Url| {
            let kid = match u.kid_miss {
                true => u.last_ms.saturating_add(self.refetch_min_ms),
                false => u64::MAX,
            };
            u.next_ms.min(kid)
        };
        let next = self.urls.iter().map(at).min().unwrap_or(u64::MAX);
        next.saturating_sub(now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFRESH: u64 = 300_000;
    const MIN: u64 = 10_000;

    /// Drives `s` over `[0, end_ms)` in steps of `step_ms`, with an unknown kid reported at
    /// every step; returns the fetches made (each one succeeding).
    fn flood(s: &mut Schedule, end_ms: u64, step_ms: u64) -> Vec<(u64, usize, Why)> {
        let mut fetches = Vec::new();
        let mut now = 0;
        while now < end_ms {
            s.note_unknown_kid();
            for (i, why) in s.due(now) {
                fetches.push((now, i, why));
                s.fetched(i, now, true);
            }
            now += step_ms;
        }
        fetches
    }

    #[test]
    fn a_flood_of_unknown_kids_fetches_once_per_bound() {
        let mut s = Schedule::new(REFRESH, MIN, &[true, true], 0);
        assert!(s.due(0).is_empty());
        // 1,000 unknown kids a second for a minute.
        let fetches = flood(&mut s, 60_000, 1);
        for url in 0..2 {
            let times: Vec<u64> = fetches.iter().filter(|f| f.1 == url).map(|f| f.0).collect();
            assert_eq!(
                times,
                vec![10_000, 20_000, 30_000, 40_000, 50_000],
                "url {url}"
            );
        }
        assert!(fetches.iter().all(|f| f.2 == Why::UnknownKid));
    }

    #[test]
    fn periodic_refresh_and_retry() {
        let mut s = Schedule::new(REFRESH, MIN, &[true, false], 0);
        assert_eq!(s.wait_ms(0), MIN, "the failed URL is retried first");
        assert_eq!(s.due(MIN - 1), vec![]);
        assert_eq!(s.due(MIN), vec![(1, Why::Due)]);
        s.fetched(1, MIN, true);
        assert_eq!(s.wait_ms(MIN), REFRESH - MIN);
        assert_eq!(s.due(REFRESH), vec![(0, Why::Due)]);
        s.fetched(0, REFRESH, false);
        assert_eq!(s.due(REFRESH + MIN - 1), vec![]);
        let both = vec![(0, Why::Due), (1, Why::Due)];
        assert_eq!(s.due(REFRESH + MIN), both, "0's retry and 1's refresh");
    }

    #[test]
    fn an_unknown_kid_right_after_a_fetch_waits_for_the_bound() {
        let mut s = Schedule::new(REFRESH, MIN, &[true], 1_000);
        s.note_unknown_kid();
        assert_eq!(s.due(1_500), vec![]);
        assert_eq!(s.wait_ms(1_500), MIN - 500);
        assert_eq!(s.due(1_000 + MIN), vec![(0, Why::UnknownKid)]);
        s.fetched(0, 1_000 + MIN, true);
        assert_eq!(s.wait_ms(1_000 + MIN), REFRESH, "no miss pending");
    }

    #[test]
    fn a_refresh_shorter_than_the_bound_is_not_cut() {
        let s = Schedule::new(1_000, MIN, &[false], 0);
        assert_eq!(s.wait_ms(0), 1_000);
    }
}
