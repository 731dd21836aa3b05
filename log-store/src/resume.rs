//! The pure resume planner: given a client's `Last-Event-ID` N, the stream's retained bounds,
//! the log's epoch and a description of the connection's retained send window, decide where the
//! events N+1.. come from — or which explicit error to return. No I/O, no clock, no allocation
//! while planning. [`ResumePlan::outcome`] then says what every front (the SSE API, MCP) does
//! with the plan — serve from a sequence, answer "gone" (truncated), or refuse with a named
//! client error — so the fronts do not each re-decide it.
//!
//! # Decision table
//! Notation: `E` = log epoch, `S` = stream being resumed, `f` = floor, `v` = visible tail,
//! `N` = requested sequence, `W` = window (`head..=last`, `contiguous`). "Own window" means
//! `W.epoch == E && W.stream == S`. Rows are mutually exclusive and cover every input (a test
//! enumerates a small domain and checks exactly one row matches each input).
//!
//! | # | Case | Condition | Plan | Why |
//! |---|------|-----------|------|-----|
//! | 1 | `WrongEpoch` | `id.epoch != E`, not a known epoch | `WrongEpoch` | The ID is from a log that no longer exists (recreated: same sequence numbers, other content). Serving "from N+1" would splice two histories. |
//! | 2 | `OtherLog` | `id.epoch != E`, in `known_epochs` | `OtherStream` | The ID belongs to another shard's log: a different stream by construction. |
//! | 3 | `OtherStream` | `id.epoch == E`, `id.stream != S` | `OtherStream` | Sequences are per stream; N of another stream says nothing about this one. This includes an ID of a removed stream whose name was recreated: the new incarnation has a new id. |
//! | 4 | `BeyondTail` | same stream, `N > v` | `BeyondTail` | The client claims an event readers never saw (or that a power loss under `fsync=never` took back). Serving would skip or reuse sequence numbers. |
//! | 5 | `Truncated` | same stream, `N <= v`, `N + 1 < f` | `Truncated` | N+1 was deleted by retention: any replay would start with a gap. Explicit error, never a partial success. |
//! | 6 | `UpToDate` | same stream, `N == v` (so `N + 1 >= f`) | `UpToDate { from: v + 1 }` | Nothing to replay (includes an empty stream and N = 0 on it); the window, if any, is irrelevant. Go live. |
//! | 7 | `Aligned` | same stream, `f <= N + 1 <= v`, own window, contiguous, `head == N + 1 <= last <= v` | `Aligned` | The seed's fast path, only when alignment is provable: window serves N+1..=last, the log the rest. |
//! | 8 | `ReplayNoWindow` | same stream, `f <= N + 1 <= v`, no window | `Replay { from: N + 1 }` | The log is the source of truth and covers N+1. |
//! | 9 | `ReplayForeignWindow` | as 8 but window of another epoch or stream | `Replay` | The window caches someone else's events. |
//! | 10 | `ReplayWindowNotContiguous` | own window, not contiguous | `Replay` | Something was evicted from its middle (the seed's observed failure mode). |
//! | 11 | `ReplayWindowEmpty` | own contiguous window, `last < head` | `Replay` | Nothing cached. |
//! | 12 | `ReplayWindowBeyondVisible` | own contiguous window, `last > v` | `Replay` | The window holds events the log does not (yet, or any more) vouch for — a cache that disagrees with the source is not used. |
//! | 13 | `ReplayWindowAhead` | own contiguous window, `head > N + 1` | `Replay` | The seed's silent gap: N+1..head-1 would be skipped. |
//! | 14 | `ReplayWindowBehind` | own contiguous window, `head < N + 1` | `Replay` | Duplicate risk: trimming the window needs byte bookkeeping the log already has. |
//!
//! Cases the seed does not name, and where they land: N = 0 on an untruncated stream →
//! row 8-14 (replay from 1) or row 6 if the stream is empty; N = 0 after retention → row 5;
//! N between the visible and the real tail (appended, not yet durable) → row 4; a window
//! lying wholly or partly below the floor can only be row 7 if `head == N + 1 >= f`, so a
//! served window never starts below the floor; a window of an earlier epoch (the log was
//! recreated) → row 9.
//!
//! # Outcome
//! | Plan | [`ResumeOutcome`] | what the fronts do |
//! |------|-------------------|--------------------|
//! | `Aligned` | `Serve { class: Aligned, from: last + 1, aligned: Some((N + 1, last)) }` | parked window first, then the log |
//! | `Replay`, `UpToDate` | `Serve { from: N + 1, aligned: None }` | the log from N+1 (or live) |
//! | `Truncated` | `Gone { requested, floor, tail }` | explicit truncation (SSE: 410 or a `truncated` event per `on_truncated`; MCP: its own error) |
//! | `BeyondTail`, `WrongEpoch`, `OtherStream` | `Refused(Refusal)` | client error: `code`, `message`, `details` |
//!
//! A `Replay` reads the log from N+1 (which is `>= f`, so the read cannot be truncated at plan
//! time; if retention runs between planning and reading, the read itself returns `Truncated`).
#![forbid(unsafe_code)]

use crate::event_id::{Epoch, EventId, Seq, StreamId};
use crate::log::Bounds;

/// What the connection's retained send window holds: events `head..=last` of (`epoch`,
/// `stream`); `contiguous` is true when nothing inside was evicted and no eviction happened on
/// anything but confirmed delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowView {
    pub epoch: Epoch,
    pub stream: StreamId,
    pub head: Seq,
    pub last: Seq,
    pub contiguous: bool,
}

/// Everything the planner looks at.
#[derive(Debug, Clone, Copy)]
pub struct ResumeInput<'a> {
    pub log_epoch: Epoch,
    pub stream: StreamId,
    pub bounds: Bounds,
    pub requested: EventId,
    pub window: Option<WindowView>,
    /// Epochs of other logs (shards) of the same server: an ID from one is another stream.
    pub known_epochs: &'a [Epoch],
}

/// Where the events after N come from, or the explicit error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumePlan {
    /// Serve the window's `window_from..=window_to`, then the log from `then_log_from`.
    Aligned {
        window_from: Seq,
        window_to: Seq,
        then_log_from: Seq,
    },
    /// Discard the window; read the log from `from` (= N + 1).
    Replay {
        from: Seq,
    },
    /// N is the visible tail: nothing to replay; go live from `from` (= N + 1).
    UpToDate {
        from: Seq,
    },
    /// N + 1 is below the floor. `requested` is N (the client's Last-Event-ID sequence).
    Truncated {
        requested: Seq,
        floor: Seq,
        tail: Seq,
    },
    /// N is beyond the visible tail. `requested` is N; `tail` is the visible tail.
    BeyondTail {
        requested: Seq,
        tail: Seq,
    },
    WrongEpoch {
        got: Epoch,
        expected: Epoch,
    },
    OtherStream {
        got: StreamId,
        expected: StreamId,
    },
}

/// The labelled rows of the decision table (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    WrongEpoch,
    OtherLog,
    OtherStream,
    BeyondTail,
    Truncated,
    UpToDate,
    Aligned,
    ReplayNoWindow,
    ReplayForeignWindow,
    ReplayWindowNotContiguous,
    ReplayWindowEmpty,
    ReplayWindowBeyondVisible,
    ReplayWindowAhead,
    ReplayWindowBehind,
}

type Row = (Case, fn(&ResumeInput<'_>) -> bool);

fn same_log(i: &ResumeInput<'_>) -> bool {
    i.requested.epoch == i.log_epoch
}
fn same_stream(i: &ResumeInput<'_>) -> bool {
    same_log(i) && i.requested.stream == i.stream
}
/// Same stream and the log can serve N+1..=v with at least one event.
fn replayable(i: &ResumeInput<'_>) -> bool {
    let n = i.requested.seq;
    same_stream(i) && n < i.bounds.visible_tail && n + 1 >= i.bounds.floor
}
fn own_window(i: &ResumeInput<'_>) -> Option<WindowView> {
    i.window
        .filter(|w| w.epoch == i.log_epoch && w.stream == i.stream)
}
/// Own, contiguous, non-empty window within the visible tail.
fn sound_window(i: &ResumeInput<'_>) -> Option<WindowView> {
    own_window(i).filter(|w| w.contiguous && w.head <= w.last && w.last <= i.bounds.visible_tail)
}

/// The decision table, one predicate per row; exactly one holds for any input.
pub const TABLE: &[Row] = &[
    (Case::WrongEpoch, |i| {
        !same_log(i) && !i.known_epochs.contains(&i.requested.epoch)
    }),
    (Case::OtherLog, |i| {
        !same_log(i) && i.known_epochs.contains(&i.requested.epoch)
    }),
    (Case::OtherStream, |i| {
        same_log(i) && i.requested.stream != i.stream
    }),
    (Case::BeyondTail, |i| {
        same_stream(i) && i.requested.seq > i.bounds.visible_tail
    }),
    (Case::Truncated, |i| {
        same_stream(i)
            && i.requested.seq <= i.bounds.visible_tail
            && i.requested.seq + 1 < i.bounds.floor
    }),
    (Case::UpToDate, |i| {
        same_stream(i)
            && i.requested.seq == i.bounds.visible_tail
            && i.requested.seq + 1 >= i.bounds.floor
    }),
    (Case::Aligned, |i| {
        replayable(i) && sound_window(i).is_some_and(|w| w.head == i.requested.seq + 1)
    }),
    (Case::ReplayNoWindow, |i| {
        replayable(i) && i.window.is_none()
    }),
    (Case::ReplayForeignWindow, |i| {
        replayable(i) && i.window.is_some() && own_window(i).is_none()
    }),
    (Case::ReplayWindowNotContiguous, |i| {
        replayable(i) && own_window(i).is_some_and(|w| !w.contiguous)
    }),
    (Case::ReplayWindowEmpty, |i| {
        replayable(i) && own_window(i).is_some_and(|w| w.contiguous && w.last < w.head)
    }),
    (Case::ReplayWindowBeyondVisible, |i| {
        replayable(i)
            && own_window(i)
                .is_some_and(|w| w.contiguous && w.head <= w.last && w.last > i.bounds.visible_tail)
    }),
    (Case::ReplayWindowAhead, |i| {
        replayable(i) && sound_window(i).is_some_and(|w| w.head > i.requested.seq + 1)
    }),
    (Case::ReplayWindowBehind, |i| {
        replayable(i) && sound_window(i).is_some_and(|w| w.head < i.requested.seq + 1)
    }),
];

/// Which row of the table applies. Sequential for speed; the table test proves exclusivity.
pub fn classify(i: &ResumeInput<'_>) -> Case {
    let n = i.requested.seq;
    let b = i.bounds;
    if !same_log(i) {
        return if i.known_epochs.contains(&i.requested.epoch) {
            Case::OtherLog
        } else {
            Case::WrongEpoch
        };
    }
    if i.requested.stream != i.stream {
        return Case::OtherStream;
    }
    if n > b.visible_tail {
        return Case::BeyondTail;
    }
    if n + 1 < b.floor {
        return Case::Truncated;
    }
    if n == b.visible_tail {
        return Case::UpToDate;
    }
    let Some(w) = i.window else {
        return Case::ReplayNoWindow;
    };
    if w.epoch != i.log_epoch || w.stream != i.stream {
        return Case::ReplayForeignWindow;
    }
    if !w.contiguous {
        return Case::ReplayWindowNotContiguous;
    }
    if w.last < w.head {
        return Case::ReplayWindowEmpty;
    }
    if w.last > b.visible_tail {
        return Case::ReplayWindowBeyondVisible;
    }
    match w.head.cmp(&(n + 1)) {
        std::cmp::Ordering::Equal => Case::Aligned,
        std::cmp::Ordering::Greater => Case::ReplayWindowAhead,
        std::cmp::Ordering::Less => Case::ReplayWindowBehind,
    }
}

/// Plans a resume. Pure and total.
pub fn plan_resume(i: &ResumeInput<'_>) -> ResumePlan {
    let n = i.requested.seq;
    let b = i.bounds;
    match classify(i) {
        Case::WrongEpoch => ResumePlan::WrongEpoch {
            got: i.requested.epoch,
            expected: i.log_epoch,
        },
        Case::OtherLog | Case::OtherStream => ResumePlan::OtherStream {
            got: i.requested.stream,
            expected: i.stream,
        },
        Case::BeyondTail => ResumePlan::BeyondTail {
            requested: n,
            tail: b.visible_tail,
        },
        Case::Truncated => ResumePlan::Truncated {
            requested: n,
            floor: b.floor,
            tail: b.visible_tail,
        },
        Case::UpToDate => ResumePlan::UpToDate { from: n + 1 },
        Case::Aligned => {
            let w = i.window.expect("aligned has a window");
            ResumePlan::Aligned {
                window_from: n + 1,
                window_to: w.last,
                then_log_from: w.last + 1,
            }
        }
        Case::ReplayNoWindow
        | Case::ReplayForeignWindow
        | Case::ReplayWindowNotContiguous
        | Case::ReplayWindowEmpty
        | Case::ReplayWindowBeyondVisible
        | Case::ReplayWindowAhead
        | Case::ReplayWindowBehind => ResumePlan::Replay { from: n + 1 },
    }
}

/// The class of a resume, as counted and reported by every front.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResumeClass {
    Aligned,
    Replay,
    UpToDate,
    Truncated,
    BeyondTail,
    WrongEpoch,
    OtherStream,
}

impl ResumeClass {
    /// The name a front reports: the SSE `resumed` label for a served resume, the error
    /// code for a refused one.
    pub fn label(self) -> &'static str {
        match self {
            ResumeClass::Aligned => "aligned",
            ResumeClass::Replay => "replay",
            ResumeClass::UpToDate => "up-to-date",
            ResumeClass::Truncated => "truncated",
            ResumeClass::BeyondTail => "beyond_tail",
            ResumeClass::WrongEpoch => "wrong_epoch",
            ResumeClass::OtherStream => "other_stream",
        }
    }
}

/// A value in a refusal's details: a number or a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detail {
    Num(u64),
    Text(String),
}

/// A resume the fronts cannot serve: a client error naming why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub class: ResumeClass,
    /// Machine-readable error code (`beyond_tail`, `wrong_epoch`, `other_stream`).
    pub code: &'static str,
    /// One sentence for a human.
    pub message: &'static str,
    /// Named values, in the order the SSE API's error body lists them.
    pub details: Vec<(&'static str, Detail)>,
}

/// What a front does with a plan: decided here once for the SSE API and MCP alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeOutcome {
    /// Serve from `from`; with `aligned = Some((head, last))` the parked window head..=last
    /// goes first and the log follows (from == last + 1).
    Serve {
        class: ResumeClass,
        from: Seq,
        aligned: Option<(Seq, Seq)>,
    },
    /// The events after the requested one are no longer retained: an explicit truncation,
    /// never a silent restart.
    Gone {
        requested: Seq,
        floor: Seq,
        tail: Seq,
    },
    Refused(Refusal),
}

impl ResumeOutcome {
    /// The class a front counts this outcome under.
    pub fn class(&self) -> ResumeClass {
        match self {
            ResumeOutcome::Serve { class, .. } => *class,
            ResumeOutcome::Gone { .. } => ResumeClass::Truncated,
            ResumeOutcome::Refused(r) => r.class,
        }
    }
}

/// An epoch as the SSE API writes it in a refusal (the event ID's first field).
fn epoch_hex(e: Epoch) -> Detail {
    Detail::Text(format!("{:016x}", e.0))
}

impl ResumePlan {
    /// What a front does with this plan. The refusals' codes, messages and details are the
    /// SSE API's error bodies (`{"error": code, "message": message, details...}`).
    pub fn outcome(&self) -> ResumeOutcome {
        match *self {
            ResumePlan::Aligned {
                window_from,
                window_to,
                then_log_from,
            } => ResumeOutcome::Serve {
                class: ResumeClass::Aligned,
                from: then_log_from,
                aligned: Some((window_from, window_to)),
            },
            ResumePlan::Replay { from } => ResumeOutcome::Serve {
                class: ResumeClass::Replay,
                from,
                aligned: None,
            },
            ResumePlan::UpToDate { from } => ResumeOutcome::Serve {
                class: ResumeClass::UpToDate,
                from,
                aligned: None,
            },
            ResumePlan::Truncated {
                requested,
                floor,
                tail,
            } => ResumeOutcome::Gone {
                requested,
                floor,
                tail,
            },
            ResumePlan::BeyondTail { requested, tail } => ResumeOutcome::Refused(Refusal {
                class: ResumeClass::BeyondTail,
                code: "beyond_tail",
                message: "Last-Event-ID is beyond the stream's tail",
                details: vec![
                    ("requested", Detail::Num(requested)),
                    ("tail", Detail::Num(tail)),
                ],
            }),
            ResumePlan::WrongEpoch { got, expected } => ResumeOutcome::Refused(Refusal {
                class: ResumeClass::WrongEpoch,
                code: "wrong_epoch",
                message: "Last-Event-ID belongs to another incarnation of this log",
                details: vec![("got", epoch_hex(got)), ("expected", epoch_hex(expected))],
            }),
            ResumePlan::OtherStream { got, expected } => ResumeOutcome::Refused(Refusal {
                class: ResumeClass::OtherStream,
                code: "other_stream",
                message: "Last-Event-ID belongs to another stream",
                details: vec![
                    ("got", Detail::Num(u64::from(got.0))),
                    ("expected", Detail::Num(u64::from(expected.0))),
                ],
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: Epoch = Epoch(0xe0);
    const E_SHARD: Epoch = Epoch(0xe1);
    const E_GONE: Epoch = Epoch(0xe2);
    const S: StreamId = StreamId(0);
    const S_OTHER: StreamId = StreamId(1);
    const SEQ_MAX: Seq = 6;

    /// An event's identity stands for its content.
    type Ev = (Epoch, StreamId, Seq);

    /// The authoritative log of stream S: retains `floor..=tail`, readers see `..=visible`.
    struct ModelLog {
        floor: Seq,
        visible: Seq,
    }

    impl ModelLog {
        fn read(&self, from: Seq) -> Result<Vec<Ev>, &'static str> {
            if from < self.floor {
                return Err("truncated");
            }
            if from > self.visible + 1 {
                return Err("beyond tail");
            }
            Ok((from..=self.visible).map(|k| (E, S, k)).collect())
        }
    }

    /// What a window physically holds: its stream's events head..=last, with one missing
    /// (evicted) when it is not contiguous.
    fn window_content(w: &WindowView) -> Vec<Ev> {
        let mut v: Vec<Ev> = (w.head..=w.last).map(|k| (w.epoch, w.stream, k)).collect();
        if !w.contiguous && !v.is_empty() {
            v.remove(v.len() / 2);
        }
        v
    }

    fn windows() -> Vec<Option<WindowView>> {
        let mut out = vec![None];
        for epoch in [E, E_GONE] {
            for stream in [S, S_OTHER] {
                for head in 0..=SEQ_MAX {
                    for last in head.saturating_sub(1)..=SEQ_MAX {
                        for contiguous in [true, false] {
                            out.push(Some(WindowView {
                                epoch,
                                stream,
                                head,
                                last,
                                contiguous,
                            }));
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn every_input_matches_exactly_one_row_and_yields_the_suffix_or_an_error() {
        let windows = windows();
        let known = [E_SHARD];
        let mut seen_cases = std::collections::HashSet::new();
        let mut checked = 0u64;
        for floor in 1..=4 {
            for visible in floor - 1..=4 {
                for tail in [visible, visible + 1] {
                    let bounds = Bounds {
                        floor,
                        tail,
                        visible_tail: visible,
                    };
                    let log = ModelLog { floor, visible };
                    for epoch in [E, E_SHARD, E_GONE] {
                        for stream in [S, S_OTHER] {
                            for n in 0..=SEQ_MAX {
                                for &window in &windows {
                                    let input = ResumeInput {
                                        log_epoch: E,
                                        stream: S,
                                        bounds,
                                        requested: EventId {
                                            epoch,
                                            stream,
                                            seq: n,
                                        },
                                        window,
                                        known_epochs: &known,
                                    };
                                    check(&input, &log);
                                    seen_cases.insert(classify(&input) as u8);
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(
            seen_cases.len(),
            TABLE.len(),
            "every row is reachable in the domain"
        );
        assert!(checked > 100_000);
    }

    fn check(input: &ResumeInput<'_>, log: &ModelLog) {
        let matching: Vec<Case> = TABLE
            .iter()
            .filter(|(_, pred)| pred(input))
            .map(|(c, _)| *c)
            .collect();
        assert_eq!(matching.len(), 1, "rows {matching:?} match {input:?}");
        assert_eq!(matching[0], classify(input), "{input:?}");

        let n = input.requested.seq;
        let identity_ok = input.requested.epoch == E && input.requested.stream == S;
        let servable = identity_ok && n + 1 >= log.floor && n <= log.visible;
        let expected: Vec<Ev> = if servable {
            log.read(n + 1).expect("servable")
        } else {
            vec![]
        };
        let plan = plan_resume(input);
        check_outcome(input, log, &plan, &expected, servable);
        let got: Result<Vec<Ev>, ResumePlan> = match plan {
            ResumePlan::Aligned {
                window_from,
                window_to,
                then_log_from,
            } => {
                let w = input.window.expect("window");
                let mut out: Vec<Ev> = window_content(&w)
                    .into_iter()
                    .filter(|e| (window_from..=window_to).contains(&e.2))
                    .collect();
                out.extend(log.read(then_log_from).expect("log part of aligned plan"));
                Ok(out)
            }
            ResumePlan::Replay { from } => {
                assert_eq!(from, n + 1);
                Ok(log.read(from).expect("replay plan reads the log"))
            }
            ResumePlan::UpToDate { from } => {
                assert_eq!(from, n + 1);
                assert!(log.read(from).expect("up to date").is_empty());
                Ok(vec![])
            }
            err => Err(err),
        };
        match got {
            Ok(events) => {
                assert!(
                    servable,
                    "served a resume the log cannot honour: {input:?} {plan:?}"
                );
                assert_eq!(
                    events, expected,
                    "not the suffix from N+1: {input:?} {plan:?}"
                );
            }
            Err(err) => {
                assert!(
                    !servable,
                    "explicit error for a servable resume: {input:?} {err:?}"
                );
                match err {
                    ResumePlan::Truncated {
                        requested, floor, ..
                    } => {
                        assert_eq!(requested, n);
                        assert!(n + 1 < floor);
                    }
                    ResumePlan::BeyondTail { requested, tail } => {
                        assert_eq!(requested, n);
                        assert!(n > tail);
                    }
                    ResumePlan::WrongEpoch { got, expected } => {
                        assert_ne!(got, expected);
                        assert!(!input.known_epochs.contains(&got));
                    }
                    ResumePlan::OtherStream { .. } => {
                        assert!(
                            input.requested.stream != S
                                || input.known_epochs.contains(&input.requested.epoch)
                        );
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }

    /// What a front sends for an outcome: the parked window's part (its content, the cache),
    /// then the log from `from`; `None` when the outcome does not serve.
    fn served_by(
        outcome: &ResumeOutcome,
        input: &ResumeInput<'_>,
        log: &ModelLog,
    ) -> Option<Vec<Ev>> {
        let ResumeOutcome::Serve { from, aligned, .. } = *outcome else {
            return None;
        };
        let mut out = Vec::new();
        if let Some((head, last)) = aligned {
            assert_eq!(from, last + 1, "the log follows the window: {outcome:?}");
            let w = input.window.expect("an aligned outcome has a window");
            out.extend(
                window_content(&w)
                    .into_iter()
                    .filter(|e| (head..=last).contains(&e.2)),
            );
        }
        out.extend(log.read(from).expect("a served outcome reads the log"));
        Some(out)
    }

    /// The outcome of a real plan: served iff the log can honour the resume, and then exactly
    /// the suffix from N+1 (its first event is N+1: no gap, no duplicate); Gone and Refused
    /// never serve.
    fn check_outcome(
        input: &ResumeInput<'_>,
        log: &ModelLog,
        plan: &ResumePlan,
        expected: &[Ev],
        servable: bool,
    ) {
        let outcome = plan.outcome();
        match served_by(&outcome, input, log) {
            Some(events) => {
                assert!(
                    servable,
                    "outcome serves what the log cannot honour: {input:?} {outcome:?}"
                );
                assert_eq!(
                    events, expected,
                    "outcome is not the suffix from N+1: {input:?} {outcome:?}"
                );
                if let Some(first) = events.first() {
                    assert_eq!(first.2, input.requested.seq + 1, "{input:?} {outcome:?}");
                }
            }
            None => {
                assert!(
                    !servable,
                    "servable resume not served: {input:?} {outcome:?}"
                );
                assert!(matches!(
                    outcome,
                    ResumeOutcome::Gone { .. } | ResumeOutcome::Refused(_)
                ));
            }
        }
    }

    /// Every plan variant over a small domain of values maps to exactly the outcome the fronts
    /// rely on; the refusals are the SSE API's error bodies, field for field.
    #[test]
    fn every_plan_maps_to_its_outcome() {
        let seqs: [Seq; 4] = [0, 1, 7, u64::MAX - 1];
        let epochs = [Epoch(0), Epoch(0xab), Epoch(u64::MAX)];
        let streams = [StreamId(0), StreamId(1), StreamId(u32::MAX)];
        let mut plans = Vec::new();
        for &a in &seqs {
            plans.push(ResumePlan::Replay { from: a });
            plans.push(ResumePlan::UpToDate { from: a });
            for &b in &seqs {
                plans.push(ResumePlan::BeyondTail {
                    requested: a,
                    tail: b,
                });
                for &c in &seqs {
                    plans.push(ResumePlan::Truncated {
                        requested: a,
                        floor: b,
                        tail: c,
                    });
                    plans.push(ResumePlan::Aligned {
                        window_from: a,
                        window_to: b,
                        then_log_from: c,
                    });
                }
            }
        }
        for &got in &epochs {
            for &expected in &epochs {
                plans.push(ResumePlan::WrongEpoch { got, expected });
            }
        }
        for &got in &streams {
            for &expected in &streams {
                plans.push(ResumePlan::OtherStream { got, expected });
            }
        }
        let mut classes = std::collections::HashSet::new();
        for plan in &plans {
            let outcome = plan.outcome();
            assert_eq!(outcome, expected_outcome(plan), "{plan:?}");
            if let ResumeOutcome::Refused(r) = &outcome {
                assert_eq!(r.code, r.class.label(), "{plan:?}");
            }
            classes.insert(outcome.class());
        }
        assert_eq!(classes.len(), 7, "every class is reached: {classes:?}");
        let labels: std::collections::HashSet<_> = classes.iter().map(|c| c.label()).collect();
        assert_eq!(labels.len(), 7, "labels are distinct");
    }

    /// The mapping written out per variant (no wildcard: a new variant must be added here).
    fn expected_outcome(plan: &ResumePlan) -> ResumeOutcome {
        let serve = |class, from, aligned| ResumeOutcome::Serve {
            class,
            from,
            aligned,
        };
        let refuse = |class, code, message, details| {
            ResumeOutcome::Refused(Refusal {
                class,
                code,
                message,
                details,
            })
        };
        match *plan {
            ResumePlan::Aligned {
                window_from,
                window_to,
                then_log_from,
            } => serve(
                ResumeClass::Aligned,
                then_log_from,
                Some((window_from, window_to)),
            ),
            ResumePlan::Replay { from } => serve(ResumeClass::Replay, from, None),
            ResumePlan::UpToDate { from } => serve(ResumeClass::UpToDate, from, None),
            ResumePlan::Truncated {
                requested,
                floor,
                tail,
            } => ResumeOutcome::Gone {
                requested,
                floor,
                tail,
            },
            ResumePlan::BeyondTail { requested, tail } => refuse(
                ResumeClass::BeyondTail,
                "beyond_tail",
                "Last-Event-ID is beyond the stream's tail",
                vec![
                    ("requested", Detail::Num(requested)),
                    ("tail", Detail::Num(tail)),
                ],
            ),
            ResumePlan::WrongEpoch { got, expected } => refuse(
                ResumeClass::WrongEpoch,
                "wrong_epoch",
                "Last-Event-ID belongs to another incarnation of this log",
                vec![
                    ("got", Detail::Text(format!("{:016x}", got.0))),
                    ("expected", Detail::Text(format!("{:016x}", expected.0))),
                ],
            ),
            ResumePlan::OtherStream { got, expected } => refuse(
                ResumeClass::OtherStream,
                "other_stream",
                "Last-Event-ID belongs to another stream",
                vec![
                    ("got", Detail::Num(u64::from(got.0))),
                    ("expected", Detail::Num(u64::from(expected.0))),
                ],
            ),
        }
    }

    #[test]
    fn epochs_are_written_as_sixteen_hex_digits() {
        let plan = ResumePlan::WrongEpoch {
            got: Epoch(0xab),
            expected: Epoch(u64::MAX),
        };
        let ResumeOutcome::Refused(r) = plan.outcome() else {
            panic!("wrong epoch is refused");
        };
        assert_eq!(
            r.details,
            vec![
                ("got", Detail::Text("00000000000000ab".into())),
                ("expected", Detail::Text("ffffffffffffffff".into())),
            ]
        );
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let bounds = Bounds {
            floor: 1,
            tail: 10,
            visible_tail: 10,
        };
        let input = |seq, window| ResumeInput {
            log_epoch: E,
            stream: S,
            bounds,
            requested: EventId {
                epoch: E,
                stream: S,
                seq,
            },
            window,
            known_epochs: &[],
        };
        assert_eq!(
            plan_resume(&input(u64::MAX, None)),
            ResumePlan::BeyondTail {
                requested: u64::MAX,
                tail: 10
            }
        );
        let w = WindowView {
            epoch: E,
            stream: S,
            head: 4,
            last: u64::MAX,
            contiguous: true,
        };
        assert_eq!(
            classify(&input(3, Some(w))),
            Case::ReplayWindowBeyondVisible
        );
        for (_, pred) in TABLE {
            let _ = pred(&input(u64::MAX, Some(w)));
        }
    }

    #[test]
    fn seed_scenario_is_a_replay_not_a_gap() {
        // The seed: client saw 118, window head advanced to 124 (119..123 evicted unconfirmed).
        let input = ResumeInput {
            log_epoch: E,
            stream: S,
            bounds: Bounds {
                floor: 100,
                tail: 140,
                visible_tail: 140,
            },
            requested: EventId {
                epoch: E,
                stream: S,
                seq: 118,
            },
            window: Some(WindowView {
                epoch: E,
                stream: S,
                head: 124,
                last: 140,
                contiguous: true,
            }),
            known_epochs: &[],
        };
        assert_eq!(classify(&input), Case::ReplayWindowAhead);
        assert_eq!(plan_resume(&input), ResumePlan::Replay { from: 119 });
    }
}
