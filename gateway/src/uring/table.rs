//! The op table: which operations are in flight on each connection slot, under which serial,
//! and which slots are free. Every completion is matched here to exactly one submission
//! ([`Match`]); nothing else decides whether a completion is acted on. Pure bookkeeping (no
//! ring, no memory): the driver keeps each in-flight operation's memory beside it.
#![forbid(unsafe_code)]

use super::op::{GEN_MASK, Op, UserData, next_serial};

/// How a completion relates to what is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// The completion of the operation in flight: act on it. `ended`: it left flight (a
    /// single-shot operation, or a multishot one without `IORING_CQE_F_MORE`).
    Genuine { ended: bool },
    /// For an earlier connection of the slot, or a free slot: a late completion of an
    /// operation that owns no memory (the slot was freed only once its owning operations had
    /// all completed).
    Stale,
    /// Names the live connection's operation kind, but not the one in flight.
    Unmatched(Unmatched),
}

/// What an unmatched completion is (counted per kind in `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmatched {
    /// Carries the serial of that kind's last completed operation: a second completion of an
    /// operation whose completion was already taken.
    Repeat,
    /// Any other serial (an operation never issued on this slot, or long gone).
    Unknown,
}

#[derive(Debug, Clone, Copy, Default)]
struct OpState {
    in_flight: bool,
    serial: u32,
    /// The serial of this kind's last completion that ended an operation.
    last_ended: Option<u32>,
}

#[derive(Debug)]
struct SlotOps {
    generation: u32,
    /// The serial counter: continued by the slot's next connection.
    serial: u32,
    live: bool,
    ops: [OpState; Op::CONN.len()],
}

/// The op table of one core.
#[derive(Debug, Default)]
pub struct OpTable {
    slots: Vec<SlotOps>,
    free: Vec<u32>,
}

fn index(op: Op) -> usize {
    op.conn_index()
        .expect("the op table tracks per-connection operations only")
}

impl OpTable {
    /// Takes a free slot (or a new one) for a connection; returns it and its generation.
    pub fn alloc(&mut self) -> (u32, u32) {
        if let Some(slot) = self.free.pop() {
            let s = &mut self.slots[slot as usize];
            s.generation = s.generation.wrapping_add(1) & GEN_MASK;
            s.live = true;
            s.ops = Default::default();
            return (slot, s.generation);
        }
        self.slots.push(SlotOps {
            generation: 0,
            serial: 0,
            live: true,
            ops: Default::default(),
        });
        ((self.slots.len() - 1) as u32, 0)
    }

    /// Frees a slot. Its owning operations must all have completed; a TX-timestamp command
    /// still in flight becomes stale (its completions name the old generation).
    pub fn release(&mut self, slot: u32) {
        assert!(
            !self.owning_in_flight(slot),
            "slot {slot} freed with memory-owning operations in flight"
        );
        let s = &mut self.slots[slot as usize];
        assert!(s.live, "slot {slot} freed twice");
        s.live = false;
        self.free.push(slot);
    }

    /// Live slots.
    pub fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The generation of a live slot.
    pub fn generation(&self, slot: u32) -> u32 {
        self.slots[slot as usize].generation
    }

    /// Records a submission of `op` on `slot`; returns its user_data.
    pub fn begin(&mut self, slot: u32, op: Op) -> UserData {
        let s = &mut self.slots[slot as usize];
        assert!(s.live, "operation on a free slot {slot}");
        let st = &mut s.ops[index(op)];
        assert!(!st.in_flight, "{op:?} already in flight on slot {slot}");
        st.in_flight = true;
        st.serial = next_serial(&mut s.serial);
        UserData {
            slot,
            generation: s.generation,
            serial: st.serial,
            op,
        }
    }

    /// Matches a completion; a genuine one that ends its operation takes it out of flight.
    pub fn complete(&mut self, ud: UserData, more: bool) -> Match {
        let Some(s) = self.slots.get_mut(ud.slot as usize) else {
            return Match::Unmatched(Unmatched::Unknown);
        };
        if !s.live || s.generation != ud.generation {
            return Match::Stale;
        }
        let st = &mut s.ops[index(ud.op)];
        if !st.in_flight || st.serial != ud.serial {
            return Match::Unmatched(if st.last_ended == Some(ud.serial) {
                Unmatched::Repeat
            } else {
                Unmatched::Unknown
            });
        }
        let ended = !(ud.op.multishot() && more);
        if ended {
            st.in_flight = false;
            st.last_ended = Some(ud.serial);
        }
        Match::Genuine { ended }
    }

    /// Whether `op` is in flight on `slot`.
    pub fn in_flight(&self, slot: u32, op: Op) -> bool {
        self.slots[slot as usize].ops[index(op)].in_flight
    }

    /// Whether any operation that owns connection memory is in flight on `slot`.
    pub fn owning_in_flight(&self, slot: u32) -> bool {
        Op::CONN
            .iter()
            .any(|&op| op.owns_memory() && self.in_flight(slot, op))
    }

    /// The user_data of every operation in flight on `slot` (for cancelling them).
    pub fn in_flight_ops(&self, slot: u32) -> Vec<UserData> {
        let s = &self.slots[slot as usize];
        Op::CONN
            .iter()
            .zip(s.ops.iter())
            .filter(|(_, st)| st.in_flight)
            .map(|(&op, st)| UserData {
                slot,
                generation: s.generation,
                serial: st.serial,
                op,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_second_completion_of_a_finished_send_is_a_repeat() {
        let mut t = OpTable::default();
        let (slot, _) = t.alloc();
        let first = t.begin(slot, Op::Send);
        assert_eq!(t.complete(first, false), Match::Genuine { ended: true });
        let second = t.begin(slot, Op::Send);
        assert_eq!(
            t.complete(first, false),
            Match::Unmatched(Unmatched::Repeat)
        );
        assert!(
            t.in_flight(slot, Op::Send),
            "the real send is still in flight"
        );
        assert_eq!(t.complete(second, false), Match::Genuine { ended: true });
    }

    #[test]
    fn late_timestamp_completions_of_a_freed_slot_are_stale() {
        let mut t = OpTable::default();
        let (slot, _) = t.alloc();
        let ts = t.begin(slot, Op::TxTimestamps);
        t.release(slot);
        let (again, _) = t.alloc();
        assert_eq!(again, slot);
        assert_eq!(t.complete(ts, false), Match::Stale);
        assert!(!t.in_flight(slot, Op::TxTimestamps));
    }

    #[test]
    #[should_panic(expected = "memory-owning operations in flight")]
    fn a_slot_with_a_recv_in_flight_cannot_be_freed() {
        let mut t = OpTable::default();
        let (slot, _) = t.alloc();
        t.begin(slot, Op::Recv);
        t.release(slot);
    }

    #[test]
    fn multishot_stays_in_flight_while_more_follows() {
        let mut t = OpTable::default();
        let (slot, _) = t.alloc();
        let w = t.begin(slot, Op::Watch);
        assert_eq!(t.complete(w, true), Match::Genuine { ended: false });
        assert!(t.in_flight(slot, Op::Watch));
        assert_eq!(t.complete(w, false), Match::Genuine { ended: true });
        assert!(!t.in_flight(slot, Op::Watch));
    }

    /// A model of the kernel: every submission completes exactly once (multishot ones after
    /// some `more` completions), in any order across operations, while connections close,
    /// slots are reused and stray repeats are injected. Every genuine completion must be
    /// matched as genuine (never dropped), every injected stray must not be, and a slot is
    /// never freed while the kernel still owes a completion of a memory-owning operation.
    #[derive(Debug, Clone)]
    enum Step {
        Submit(usize, usize),
        Complete(usize, bool),
        Repeat(usize),
        Close(usize),
        Open,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0usize..8, 0usize..6).prop_map(|(c, o)| Step::Submit(c, o)),
            5 => (0usize..64, any::<bool>()).prop_map(|(i, m)| Step::Complete(i, m)),
            1 => (0usize..64).prop_map(Step::Repeat),
            1 => (0usize..8).prop_map(Step::Close),
            1 => Just(Step::Open),
        ]
    }

    proptest! {
        #[test]
        fn genuine_completions_are_never_dropped(steps in prop::collection::vec(step(), 1..300)) {
            let mut t = OpTable::default();
            // Live connections: (slot, closing).
            let mut conns: Vec<(u32, bool)> = Vec::new();
            // Submissions the kernel still owes a final completion for.
            let mut owed: Vec<UserData> = Vec::new();
            let mut done: Vec<UserData> = Vec::new();
            for s in steps {
                match s {
                    Step::Open => conns.push((t.alloc().0, false)),
                    Step::Submit(c, o) => {
                        let Some(&(slot, false)) = conns.get(c % conns.len().max(1)) else { continue };
                        let op = Op::CONN[o];
                        if !t.in_flight(slot, op) {
                            owed.push(t.begin(slot, op));
                        }
                    }
                    Step::Complete(i, more) => {
                        if owed.is_empty() { continue }
                        let ud = owed[i % owed.len()];
                        let more = more && ud.op.multishot();
                        let live = conns.iter().any(|&(sl, _)| sl == ud.slot)
                            && t.generation(ud.slot) == ud.generation;
                        let m = t.complete(ud, more);
                        if live {
                            prop_assert_eq!(m, Match::Genuine { ended: !more });
                        } else {
                            prop_assert_eq!(m, Match::Stale);
                            prop_assert!(!ud.op.owns_memory(), "a freed slot had a memory-owning op owed");
                        }
                        if !more {
                            owed.retain(|u| *u != ud);
                            done.push(ud);
                        }
                    }
                    Step::Repeat(i) => {
                        if done.is_empty() { continue }
                        let ud = done[i % done.len()];
                        let m = t.complete(ud, false);
                        prop_assert!(!matches!(m, Match::Genuine { .. }), "a repeat was taken as genuine");
                    }
                    Step::Close(c) => {
                        let n = conns.len().max(1);
                        if let Some(e) = conns.get_mut(c % n) { e.1 = true }
                    }
                }
                // Closing connections are freed once nothing owning is owed (as the core does).
                let mut i = 0;
                while i < conns.len() {
                    let (slot, closing) = conns[i];
                    if closing && !t.owning_in_flight(slot) {
                        t.release(slot);
                        conns.remove(i);
                    } else {
                        i += 1;
                    }
                }
            }
        }
    }
}
