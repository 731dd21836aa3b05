//! Progress lines for long runs, on stderr (stdout stays the report: a table or `--json`):
//! every `--progress-interval-secs` the elapsed time and, per counter, the events so far and
//! their rate since the previous line. A run shorter than one interval prints none.
//!
//! [`Progress::poll`] is pure (the time is passed in, the line returned); [`Progress::tick`]
//! writes the line to stderr.

use std::time::{Duration, Instant};

/// The default of `--progress-interval-secs`.
pub const INTERVAL_SECS_DEFAULT: u64 = 2;

/// One run's progress clock.
#[derive(Debug, Clone)]
pub struct Progress {
    /// `None`: progress is off (`--progress-interval-secs 0`).
    interval: Option<Duration>,
    start: Instant,
    /// When the next line is due.
    due: Instant,
    /// The previous line's time and counts (the start and zeros before the first).
    last_at: Instant,
    last: Vec<u64>,
}

impl Progress {
    /// A clock started at `start` printing every `interval_secs` (0 = never).
    pub fn new(interval_secs: u64, start: Instant) -> Progress {
        let interval = (interval_secs > 0).then(|| Duration::from_secs(interval_secs));
        Progress {
            interval,
            start,
            due: start + interval.unwrap_or_default(),
            last_at: start,
            last: Vec::new(),
        }
    }

    /// A clock that never prints.
    pub fn off() -> Progress {
        Progress::new(0, Instant::now())
    }

    /// Whether a line is due at `now` (to skip counting what no line will show).
    pub fn due(&self, now: Instant) -> bool {
        self.interval.is_some() && now >= self.due
    }

    /// The line due at `now`, if one is: `counts` are (what, how many so far) pairs, always
    /// in the same order. The next line is due one interval after `now`.
    pub fn poll(&mut self, now: Instant, counts: &[(&str, u64)]) -> Option<String> {
        let interval = self.interval?;
        if !self.due(now) {
            return None;
        }
        let secs = now.duration_since(self.last_at).as_secs_f64();
        let mut line = format!(
            "progress: {:.1} s",
            now.duration_since(self.start).as_secs_f64()
        );
        self.last.resize(counts.len(), 0);
        for ((what, n), last) in counts.iter().zip(self.last.iter_mut()) {
            let rate = if secs > 0.0 {
                n.saturating_sub(*last) as f64 / secs
            } else {
                0.0
            };
            line.push_str(&format!("; {what} {n} ({rate:.0}/s)"));
            *last = *n;
        }
        self.last_at = now;
        self.due = now + interval;
        Some(line)
    }

    /// [`Progress::poll`], the line (if any) written to stderr.
    pub fn tick(&mut self, now: Instant, counts: &[(&str, u64)]) {
        if let Some(line) = self.poll(now, counts) {
            eprintln!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_before_the_first_interval() {
        let t0 = Instant::now();
        let mut p = Progress::new(2, t0);
        assert_eq!(p.poll(t0, &[("delivered", 5)]), None);
        assert_eq!(
            p.poll(t0 + Duration::from_millis(1999), &[("delivered", 5)]),
            None
        );
        assert!(!p.due(t0 + Duration::from_millis(1999)));
        assert!(p.due(t0 + Duration::from_secs(2)));
    }

    #[test]
    fn each_line_has_elapsed_time_counts_and_the_rate_since_the_last_line() {
        let t0 = Instant::now();
        let mut p = Progress::new(2, t0);
        let line = p.poll(
            t0 + Duration::from_secs(2),
            &[("published", 1000), ("delivered", 100_000)],
        );
        assert_eq!(
            line.as_deref(),
            Some("progress: 2.0 s; published 1000 (500/s); delivered 100000 (50000/s)")
        );
        // Not due again until one interval after that line.
        let at = t0 + Duration::from_millis(3500);
        assert_eq!(p.poll(at, &[("published", 1200), ("delivered", 1)]), None);
        let line = p.poll(
            t0 + Duration::from_secs(5),
            &[("published", 4000), ("delivered", 130_000)],
        );
        assert_eq!(
            line.as_deref(),
            Some("progress: 5.0 s; published 4000 (1000/s); delivered 130000 (10000/s)")
        );
    }

    #[test]
    fn interval_zero_is_off() {
        let t0 = Instant::now();
        let mut p = Progress::new(0, t0);
        assert_eq!(p.poll(t0 + Duration::from_secs(3600), &[("x", 1)]), None);
        assert!(!p.due(t0 + Duration::from_secs(3600)));
        let mut p = Progress::off();
        assert_eq!(p.poll(Instant::now() + Duration::from_secs(60), &[]), None);
    }

    #[test]
    fn a_counter_that_goes_back_has_rate_zero() {
        let t0 = Instant::now();
        let mut p = Progress::new(1, t0);
        p.poll(t0 + Duration::from_secs(1), &[("events", 10)]);
        let line = p.poll(t0 + Duration::from_secs(2), &[("events", 3)]);
        assert_eq!(line.as_deref(), Some("progress: 2.0 s; events 3 (0/s)"));
    }
}
